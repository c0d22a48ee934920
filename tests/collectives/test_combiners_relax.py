"""Relax collective combiners on one rank: structure, thresholds, keys, options, and results.

Multi-rank equality lives in test_combiners_multirank.py; here the passes run in this process
(world size 1, where the runtime starts lazily) so many modules can be compiled and compared.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import tvm
import tvm_ffi
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tvm import relax

import tvm_combiners.collectives.runtime  # noqa: F401 - registers the runtime functions
from tvm_combiners.collectives import relax as CR
from tvm_combiners.collectives.combiners import CombineReport
from tvm_combiners.collectives.combiners.keys import plan_pack
from tvm_combiners.collectives.relax import combiners as CB

_spec = importlib.util.spec_from_file_location("combiners_cases", Path(__file__).parent / "progs" / "combiners_cases.py")
C = importlib.util.module_from_spec(_spec)
sys.modules["combiners_cases"] = C
_spec.loader.exec_module(C)

ONE = [[0]]  # the group of a one-rank world


def _fn(params, body, pure=False) -> tvm.IRModule:
    xs = [relax.Var(f"x{i}", relax.TensorType(s, d)) for i, (s, d) in enumerate(params)]
    bb = relax.BlockBuilder()
    with bb.function("main", xs, pure=pure):
        bb.emit_func_output(relax.Tuple(body(bb, xs)))
    return bb.get()


def _count(mod, *names) -> int:
    return C.count_ops(mod, tuple("collectives." + n for n in names))


def _reports(pass_factory, mod, **kw) -> tuple[tvm.IRModule, list[CombineReport]]:
    got: list[CombineReport] = []
    return pass_factory(on_combine=got.append, **kw)(mod), got


def _same_results(before, after, args) -> None:
    for a, b in zip(C.compile_and_run(before, args), C.compile_and_run(after, args), strict=True):
        np.testing.assert_array_equal(b, a)


def _args(params, salt=0):
    return [C.data(0, s, d, salt + i) for i, (s, d) in enumerate(params)]


# --------------------------------------------------------------------------- grouping


def test_chain_stays_two_and_skip_ahead_joins():
    params = [((4, 6), "float32"), ((4, 6), "float32"), ((3,), "float32")]

    def body(bb, xs):
        a = bb.emit(CR.allreduce(xs[0]))
        b = bb.emit(relax.op.add(a, xs[1]))
        c = bb.emit(CR.allreduce(b))  # depends on a: never in a's group
        d = bb.emit(CR.allreduce(xs[2]))  # independent, after the dependent c: joins a
        return [a, c, d]

    mod = _fn(params, body)
    new, reports = _reports(CB.AllReduceCombiner, mod)
    assert _count(mod, "allreduce") == 3 and _count(new, "allreduce") == 2
    assert [(r.kind, r.num_ops, r.nbytes) for r in reports] == [("allreduce", 2, 96 + 12)]
    assert reports[0].key == ("allreduce", "sum", None, "float32")
    relax.analysis.well_formed(new)
    _same_results(mod, new, _args(params))


def test_groups_of_parameter_collectives_never_form_a_cycle():
    """allreduce {a, d} and allgather {b, e} would each be fine, together they are a cycle
    (b reads a, d reads e): only one of the two may combine, whichever the planner proves."""
    params = [((4,), "float32"), ((4,), "float32")]

    def body(bb, xs):
        a = bb.emit(CR.allreduce(xs[0]))
        b = bb.emit(CR.allgather(a, group=ONE))
        e = bb.emit(CR.allgather(xs[1], group=ONE))
        d = bb.emit(CR.allreduce(bb.emit(relax.op.add(e, e))))
        return [a, b, d, e]

    mod = _fn(params, body)
    new, reports = _reports(CB.CombineCollectives, mod)
    assert len(reports) == 1 and reports[0].num_ops == 2
    relax.analysis.well_formed(new)
    _same_results(mod, new, _args(params))


def _allreduces(sizes):
    params = [((s,), "float32") for s in sizes]
    return _fn(params, lambda bb, xs: [bb.emit(CR.allreduce(x)) for x in xs]), params


def test_byte_threshold_is_exact():
    mod, _ = _allreduces([48, 1, 1])  # 192, 4 and 4 bytes
    _, at = _reports(CB.AllReduceCombiner, mod, threshold_bytes=196)  # 192 + 4 fills it exactly
    assert [(r.num_ops, r.nbytes) for r in at] == [(2, 196)]
    _, over = _reports(CB.AllReduceCombiner, mod, threshold_bytes=195)  # one byte short: 192 stays alone
    assert [(r.num_ops, r.nbytes) for r in over] == [(2, 8)]
    _, alone = _reports(CB.AllReduceCombiner, mod, threshold_bytes=191)  # the 192-byte op is too large itself
    assert [(r.num_ops, r.nbytes) for r in alone] == [(2, 8)]
    new, exact = _reports(CB.AllReduceCombiner, _allreduces([48, 48])[0], threshold_bytes=384)
    assert [(r.num_ops, r.nbytes) for r in exact] == [(2, 384)] and _count(new, "allreduce") == 1


def test_large_ops_left_alone_unless_asked():
    mod, _ = _allreduces([32 << 10, 32 << 10, 24, 25])  # 128 KiB, 128 KiB, 96 B, 100 B
    assert [r.num_ops for r in _reports(CB.AllReduceCombiner, mod)[1]] == [2]  # auto on CPU: 64 KiB cap
    assert [r.num_ops for r in _reports(CB.AllReduceCombiner, mod, max_op_bytes=None)[1]] == [4]
    assert [(r.num_ops, r.nbytes) for r in _reports(CB.AllReduceCombiner, mod, max_op_bytes=100)[1]] == [(2, 196)]
    assert _reports(CB.AllReduceCombiner, mod, max_op_bytes=99)[1] == []  # 100 B is one byte over
    with tvm.target.Target({"kind": "cuda", "arch": "sm_90"}, host="llvm"):  # GPU copies are cheap: 8 MiB cap
        assert [r.num_ops for r in _reports(CB.AllReduceCombiner, mod)[1]] == [4]


def test_count_threshold_is_exact():
    mod, _ = _allreduces([2] * 5)
    assert [r.num_ops for r in _reports(CB.AllReduceCombiner, mod, threshold_count=2)[1]] == [2, 2]
    assert [r.num_ops for r in _reports(CB.AllReduceCombiner, mod, threshold_count=4)[1]] == [4]
    assert [r.num_ops for r in _reports(CB.AllReduceCombiner, mod, threshold_count=5)[1]] == [5]


@pytest.mark.parametrize("kw", [{"threshold_bytes": 0}, {"threshold_bytes": -1}, {"threshold_count": 0},
                                {"threshold_count": 1}])
def test_threshold_at_or_below_zero_disables(kw):
    mod, _ = _allreduces([4, 4, 4])
    assert CB.CombineCollectives(**kw)(mod).same_as(mod)


def test_tvms_allgather_of_bfloat16_is_keyed_apart_from_other_dtypes():
    """Other dtypes of an allgather share one byte buffer; bfloat16 stays bfloat16 (keys.py's rule)."""
    from tvm_combiners.collectives.combiners.keys import ccl_key

    attrs = {"num_workers": 2, "in_group": False}
    assert ccl_key("ccl.allgather", attrs, "bfloat16") != ccl_key("ccl.allgather", attrs, "float32")
    assert ccl_key("ccl.allgather", attrs, "float16") == ccl_key("ccl.allgather", attrs, "float32")


def test_mixed_keys_stay_apart():
    params = [((4,), "float32"), ((4,), "float32"), ((4,), "int32"), ((4,), "int32"), ((6,), "float32")]

    def body(bb, xs):
        return [
            bb.emit(CR.allreduce(xs[0], "sum")), bb.emit(CR.allreduce(xs[1], "max")),   # reductions differ
            bb.emit(CR.allreduce(xs[2], "sum")), bb.emit(CR.allreduce(xs[3], "sum")),   # int32 pair: one group
            bb.emit(CR.allreduce(xs[4], "sum", group=ONE)),                              # groups differ
            bb.emit(CR.allgather(xs[0], group=ONE)), bb.emit(CR.allgather(xs[2], group=ONE)),  # mixed dtypes: ok
            bb.emit(CR.reduce_scatter(xs[0], group=ONE)), bb.emit(CR.reduce_scatter(xs[2], group=ONE)),  # never
        ]

    mod = _fn(params, body)
    new, reports = _reports(CB.CombineCollectives, mod)
    assert sorted((r.kind, r.num_ops) for r in reports) == [("allgather", 2), ("allreduce", 2)]
    assert _count(new, "allreduce") == 4 and _count(new, "allgather") == 1 and _count(new, "reduce_scatter") == 2
    _same_results(mod, new, _args(params))


def test_combine_by_dim():
    params = [((2, 3), "float32"), ((2, 3), "float32")]
    body = lambda bb, xs: [bb.emit(CR.allgather(xs[0], axis=0, group=ONE)),  # noqa: E731
                           bb.emit(CR.allgather(xs[1], axis=1, group=ONE)),
                           bb.emit(CR.reduce_scatter(xs[0], axis=0, group=ONE)),
                           bb.emit(CR.reduce_scatter(xs[1], axis=1, group=ONE))]
    mod = _fn(params, body)
    assert _reports(CB.CombineCollectives, mod)[1] == []
    new, reports = _reports(CB.CombineCollectives, mod, combine_by_dim=False)
    assert sorted((r.kind, r.num_ops) for r in reports) == [("allgather", 2), ("reduce_scatter", 2)]
    _same_results(mod, new, _args(params))


def test_each_pass_combines_only_its_kind():
    mod, inputs = C.collectives(2)
    kinds = ("allreduce", "allgather", "reduce_scatter")
    before = [_count(mod, k) for k in kinds]
    for factory, kind in ((CB.AllReduceCombiner, "allreduce"), (CB.AllGatherCombiner, "allgather"),
                          (CB.ReduceScatterCombiner, "reduce_scatter")):
        new, reports = _reports(factory, mod)
        assert reports and {r.kind for r in reports} == {kind}
        after = [_count(new, k) for k in kinds]
        assert [a < b if k == kind else a == b for a, b, k in zip(after, before, kinds)] == [True, True, True]


def test_unknown_effect_is_a_barrier():
    params = [((4,), "float32"), ((4,), "float32"), ((4,), "float32")]

    def body(bb, xs):
        a = bb.emit(CR.allreduce(xs[0]))
        bb.emit(relax.Call(relax.ExternFunc("vm.builtin.null_value"), [], ty_args=[relax.ObjectType()]))
        return [a, bb.emit(CR.allreduce(xs[1])), bb.emit(CR.allreduce(xs[2]))]

    new, reports = _reports(CB.AllReduceCombiner, _fn(params, body))
    assert [r.num_ops for r in reports] == [2]  # the two after the effect, never across it
    calls = [b.value for blk in new["main"].body.blocks for b in blk.bindings]
    effect = next(i for i, c in enumerate(calls) if isinstance(c, relax.Call) and isinstance(c.op, relax.ExternFunc))
    assert any(CR.is_collective(c, ("allreduce",)) for c in calls[:effect])


# --------------------------------------------------------------------------- ccl, send/recv


def test_ccl_ops_combined_in_and_out_of_dataflow():
    mod, inputs = C.ccl(1)
    new, reports = _reports(CB.CombineCollectives, mod)
    assert sorted((r.kind, r.num_ops) for r in reports) == [("ccl.allgather", 2)] + [("ccl.allreduce", 2)] * 3
    assert C.count_ops(new, ("ccl.allreduce",)) == 4 and C.count_ops(new, ("ccl.allgather",)) == 1
    assert isinstance(new["main"].body.blocks[0], relax.DataflowBlock)  # the dataflow block stays one
    _same_results(mod, new, inputs(0))



@pytest.mark.parametrize("dtype", ["bool", "float8_e4m3fn"])
def test_ccl_ops_of_dtypes_we_cannot_pack_are_left_alone(dtype):
    """TVM's ``R.ccl`` ops take any dtype; packing covers the ones our own ops carry (this raised
    "dtype bool is not a whole number of bytes", and read float8_e4m3fn as 843 bits)."""
    ps = [relax.Var(f"p{i}", relax.TensorType(s, dtype)) for i, s in enumerate([(3, 2), (5,)])]
    bb = relax.BlockBuilder()
    with bb.function("main", ps):
        with bb.dataflow():
            outs = [bb.emit_output(op) for p in ps
                    for op in (relax.op.ccl.allgather(p, 1, True), relax.op.ccl.allreduce(p, "max", True))]
        bb.emit_func_output(relax.Tuple(outs))
    mod = bb.get()
    assert CB.CombineCollectives()(mod).same_as(mod)
    if dtype == "bool":
        _same_results(mod, CB.CombineCollectives()(mod), [np.array([[1, 0], [0, 1], [1, 1]], bool), np.array([1, 0, 1, 1, 0], bool)])
    with pytest.raises(ValueError, match=rf"^collective combiners: dtype {dtype} cannot be packed; expected one of int8, "):
        plan_pack("allgather", [((3, 2), dtype, 0)], 1)

def _channels(mod, kind):
    out = []
    relax.analysis.post_order_visit(mod["main"].body, lambda e: out.append(CR.info(e)) if CR.is_collective(e, (kind,)) else None)
    return sorted(s.channel_id for s in out)


@pytest.mark.parametrize("n", [2, 3])
def test_send_recv_pairs_and_channels(n):
    mod, _ = C.p2p(n)
    new, reports = _reports(CB.SendRecvCombiner, mod)
    # ring (+ the swap, which equals the 2-rank ring) and the partial pairs travel as one each;
    # the second ring hop reads the first hop's recv, so it stays apart.
    assert sorted(r.num_ops for r in reports) == ([2, 3] if n == 2 else [2, 2])
    assert _channels(new, "send") == _channels(new, "recv")  # every send still has its recv
    used = set(_channels(mod, "send"))
    fresh = sorted(set(_channels(new, "send")) - used)
    assert fresh == sorted(c for c in range(len(fresh) + len(used)) if c not in used)[: len(fresh)]
    CR.OrderSendRecv()(new)  # matches, in a deadlock-free order


def test_send_recv_different_pairs_or_host_stay_apart():
    params = [((4,), "float32"), ((4,), "float32"), ((4,), "float32")]

    def body(bb, xs):
        bb.emit(CR.send(xs[0], [[0, 0]], channel_id=0))
        bb.emit(CR.send(xs[1], [[0, 0]], channel_id=1, is_host_transfer=True))
        bb.emit(CR.send(xs[2], [[0, 0]], channel_id=2))
        return [bb.emit(CR.recv((4,), "float32", [[0, 0]], channel_id=c, is_host_transfer=c == 1)) for c in range(3)]

    mod = _fn(params, body)
    new, reports = _reports(CB.SendRecvCombiner, mod)
    assert [r.num_ops for r in reports] == [2] and _count(new, "send") == 2
    _same_results(mod, new, _args(params))


@pytest.mark.parametrize("f_channel", [0, 5])
def test_a_channel_two_functions_share_never_combines(f_channel):
    """main sends on channels 0 and 1, calls f, then receives: when f also sends and receives on
    channel 0, its recv gets main's payload (a channel is first in, first out across functions),
    which neither function's matching sees. Moving main's channel-0 transfer to a fresh channel
    handed f its own payload; on a channel only main uses, the two transfers combine."""
    p = [[0, 0]]
    bb = relax.BlockBuilder()
    y = relax.Var("y", relax.TensorType((4,), "float32"))
    with bb.function("f", [y], pure=False):
        bb.emit(CR.send(y, p, channel_id=f_channel))
        bb.emit_func_output(bb.emit(CR.recv((4,), "float32", p, channel_id=f_channel)))
    f = bb.get().get_global_var("f")
    xs = [relax.Var(f"x{i}", relax.TensorType((4,), "float32")) for i in range(3)]
    with bb.function("main", xs, pure=False):
        bb.emit(CR.send(xs[0], p, channel_id=0))
        bb.emit(CR.send(xs[2], p, channel_id=1))
        o = bb.emit(relax.Call(f, [xs[1]]))
        recvs = [bb.emit(CR.recv((4,), "float32", p, channel_id=c)) for c in (0, 1)]
        bb.emit_func_output(relax.Tuple([o, *recvs]))
    mod = bb.get()
    new, reports = _reports(CB.SendRecvCombiner, mod)
    assert [r.num_ops for r in reports] == ([] if f_channel == 0 else [2])
    _same_results(mod, new, _args([((4,), "float32")] * 3))


def test_self_dependent_transfers_stay_apart():
    params = [((4,), "float32")]

    def body(bb, xs):
        bb.emit(CR.send(xs[0], [[0, 0]], channel_id=0))
        r = bb.emit(CR.recv((4,), "float32", [[0, 0]], channel_id=0))
        bb.emit(CR.send(r, [[0, 0]], channel_id=1))  # its payload is the first recv
        return [r, bb.emit(CR.recv((4,), "float32", [[0, 0]], channel_id=1))]

    mod = _fn(params, body)
    assert CB.SendRecvCombiner()(mod).same_as(mod)


@pytest.mark.parametrize("host", [False, True])
def test_sends_of_one_channel_keep_their_order(host):
    """An allreduce group must wait for its last member's input, which comes after the second send
    of channel 1, and the first send reads the group's result: the combiner moved the first send
    after the second, so each recv of the channel got the other's payload. ``host``: the two
    transfers differ (one is a host transfer), so they cannot travel as one either."""
    params = [((4,), "float32")] * 3

    def body(bb, xs):
        a1 = bb.emit(CR.allreduce(xs[0]))
        bb.emit(CR.send(bb.emit(relax.op.add(a1, relax.const(100.0))), [[0, 0]], channel_id=1))
        bb.emit(CR.send(xs[1], [[0, 0]], channel_id=1, is_host_transfer=host))
        a2 = bb.emit(CR.allreduce(bb.emit(relax.op.multiply(xs[2], relax.const(2.0)))))
        recvs = [bb.emit(CR.recv((4,), "float32", [[0, 0]], channel_id=1, is_host_transfer=host and k == 1))
                 for k in range(2)]
        return [a1, a2, *recvs]

    mod = _fn(params, body)
    for factory, allreduces, sends in ((CB.AllReduceCombiner, 1, 2), (CB.SendRecvCombiner, 2, 2 if host else 1),
                                       (CB.CombineCollectives, 1, 2 if host else 1)):
        new = factory()(mod)
        assert (_count(new, "allreduce"), _count(new, "send")) == (allreduces, sends), factory.__name__
        _same_results(mod, new, _args(params))


def test_transfers_left_on_a_channel_must_pair_up_as_emitted():
    """The planner's check (IR-neutral): the k-th send emitted meets the k-th recv emitted. Two sends
    swapped along with their recvs still pair up (a review counted plans refused for that)."""
    from tvm_combiners.collectives.combiners.planning import RegionPlan, _keeps_channel_pairs

    channel = [[(0, 2), (1, 3)]]  # send 0 -> recv 2, then send 1 -> recv 3
    assert _keeps_channel_pairs(RegionPlan([], [], [0, 1, 2, 3]), channel)
    assert _keeps_channel_pairs(RegionPlan([], [], [1, 0, 3, 2]), channel)
    assert not _keeps_channel_pairs(RegionPlan([], [], [1, 0, 2, 3]), channel)
    assert _keeps_channel_pairs(RegionPlan([], [([0, 4], [2, 5])], [1, -1, 3, -2]), channel)  # one left


# --------------------------------------------------------------------------- passes


@pytest.mark.parametrize("case", sorted(C.CASES))
def test_idempotent_and_results_equal_one_rank(case):
    mod, inputs = C.CASES[case](1)
    once = CB.CombineCollectives(combine_by_dim=False)(mod)
    assert not once.same_as(mod)
    twice = CB.CombineCollectives(combine_by_dim=False)(once)
    assert tvm_ffi.structural_equal(once, twice)
    relax.analysis.well_formed(once)
    _same_results(mod, once, inputs(0))


def test_pass_names_sequential_disabled_and_compile():
    mod, inputs = C.collectives(1)
    for name in ("AllReduceCombiner", "AllGatherCombiner", "ReduceScatterCombiner", "SendRecvCombiner", "CombineCollectives"):
        p = getattr(CB, name)()
        assert p.info.name == name
        with tvm.transform.PassContext(disabled_pass=[name]):
            assert tvm.transform.Sequential([p])(mod).same_as(mod)
    seq = tvm.transform.Sequential([CB.AllReduceCombiner(), CB.AllGatherCombiner()])
    assert _count(seq(mod), "allreduce") < _count(mod, "allreduce")
    ex = tvm.compile(mod, target="llvm", relax_pipeline=CR.pipeline("llvm", before=[CB.CombineCollectives()]))
    got = C.flatten(relax.VirtualMachine(ex, tvm.cpu())["main"](*[tvm.runtime.tensor(a) for a in inputs(0)]))
    for a, b in zip(C.compile_and_run(mod, inputs(0)), got, strict=True):
        np.testing.assert_array_equal(b, a)


@pytest.mark.parametrize(("kw", "message"), [
    ({"threshold_bytes": "1"}, "AllGatherCombiner: threshold_bytes must be an int (<= 0 disables the pass), got str '1'"),
    ({"threshold_count": 2.0}, "AllGatherCombiner: threshold_count must be an int (<= 0 disables the pass), got float 2.0"),
    ({"threshold_bytes": True}, "AllGatherCombiner: threshold_bytes must be an int (<= 0 disables the pass), got bool True"),
    ({"combine_by_dim": 1}, "AllGatherCombiner: combine_by_dim must be a bool, got int 1"),
    ({"on_combine": 3}, "AllGatherCombiner: on_combine must be callable or None, got int"),
    ({"max_op_bytes": 0}, "AllGatherCombiner: max_op_bytes must be 'auto', None (no cap) or an int > 0, got 0"),
])
def test_option_validation(kw, message):
    with pytest.raises(TypeError) as err:
        CB.AllGatherCombiner(**kw)
    assert str(err.value) == message


# --------------------------------------------------------------------------- layouts


def test_pack_plans():
    rs = plan_pack("reduce_scatter", [((2, 6, 3), "float32", 1), ((4,), "float32", 0)], group_size=2)
    assert (rs.block, rs.blocks_in, rs.blocks_out) == (18 + 2, 2, 1)
    assert [(s.offset, s.chunk, s.result_shape) for s in rs.segments] == [(0, 18, (2, 3, 3)), (18, 2, (2,))]
    mixed = plan_pack("allgather", [((3,), "float16", 0), ((1,), "int32", 0)], group_size=3)
    assert mixed.flat_dtype == "uint8" and [s.offset for s in mixed.segments] == [0, 2]  # 8-byte aligned
    assert (mixed.block, mixed.out_len) == (16, 48)
    with pytest.raises(ValueError, match="reduce_scatter: combined ops must share one dtype"):
        plan_pack("reduce_scatter", [((2,), "float32", 0), ((2,), "int32", 0)], group_size=2)


# --------------------------------------------------------------------------- results read in place


def _addresses(tensors) -> list[int]:
    return [np.from_dlpack(t).__array_interface__["data"][0] for t in tensors]


_RUNS = [((16,), "float32"), ((3,), "float32"), ((16,), "float32"), ((13,), "float32"), ((16,), "float32")]
# byte offsets 0, 64, 76, 140, 192: runs 0, 1 and 4 start at multiples of 64 and are read in place


def _unpacked(mod) -> list[int]:
    """The output count of each unpack kernel in ``mod``."""
    return [len(f.params) - 1 for gv, f in mod.functions_items() if gv.name_hint.startswith("unpack")]


def test_aligned_results_are_views_of_the_combined_buffer():
    """Results at a multiple of 64 bytes alias the buffer (no copy, no allocation); the others are
    copied out by one unpack kernel."""
    mod = _fn(_RUNS, lambda bb, xs: [bb.emit(CR.allreduce(x)) for x in xs])
    new = CB.CombineCollectives()(mod)
    assert _count(new, "allreduce") == 1
    assert C.count_ops(new, ("memory.view",)) == 3
    assert _unpacked(new) == [2]
    _same_results(mod, new, _args(_RUNS))
    ex = tvm.compile(new, target="llvm", relax_pipeline=CR.pipeline("llvm"))
    got = list(relax.VirtualMachine(ex, tvm.cpu())["main"](*[tvm.runtime.tensor(a) for a in _args(_RUNS)]))
    at = _addresses(got)
    assert (at[1] - at[0], at[4] - at[0]) == (64, 192)


def test_views_keep_the_buffer_while_kernels_read_them():
    """Results only kernels read (so memory planning places the buffer): many intermediates of the
    buffer's size are made and freed while the views live; none may land in the buffer."""
    params = _RUNS + [((64,), "float32")]

    def body(bb, xs):
        rs = [bb.emit(CR.allreduce(x)) for x in xs[:-1]]
        t = xs[-1]
        for _ in range(6):
            t = bb.emit(relax.op.multiply(bb.emit(relax.op.add(t, relax.const(1.0, "float32"))), relax.const(2.0, "float32")))
        return [bb.emit(relax.op.sum(relax.op.add(r, r))) for r in rs] + [bb.emit(relax.op.sum(t))]

    mod = _fn(params, body)
    new = CB.CombineCollectives()(mod)
    assert C.count_ops(new, ("memory.view",)) == 3
    _same_results(mod, new, _args(params, salt=3))


def test_allgather_results_are_copied_out():
    """Over two ranks an allgather's results interleave the ranks' blocks: one unpack kernel copies
    them out (over one rank each is a run of the buffer, read in place)."""
    params = [((4,), "float32")] * 2
    for group, views, unpacked in (([[0, 1]], 0, [2]), (ONE, 1, [1])):  # one rank: offsets 0 and 16
        mod = _fn(params, lambda bb, xs, g=group: [bb.emit(CR.allgather(x, group=g)) for x in xs])
        new = CB.CombineCollectives()(mod)
        assert C.count_ops(new, ("memory.view",)) == views
        assert _unpacked(new) == unpacked
    _same_results(mod, new, _args(params))


# --------------------------------------------------------------------------- generated DAGs


@st.composite
def programs(draw):
    """Random collectives and compute with random dependencies (all at world size 1), and transfers
    left open across other steps on two shared channels (a review's swapped sends needed several
    transfers of one channel with collectives between them)."""
    shapes = [(4,), (2, 3), (3, 2), (16,), (2, 16)]  # the last two fill 64 bytes: kernels then work in place
    n_params = draw(st.integers(1, 3))
    params = [(shapes[draw(st.integers(0, len(shapes) - 1))], draw(st.sampled_from(["float32", "int32"]))) for _ in range(n_params)]
    steps = draw(st.lists(st.tuples(st.integers(0, 8), st.integers(0, 10**6), st.integers(0, 10**6)), min_size=2, max_size=14))
    return params, steps


def _build(params, steps):
    def body(bb, xs):
        values = list(xs)
        outs = []
        channel = 0
        open_sends: list[tuple[int, tuple[int, ...], str, bool]] = []  # (channel, shape, dtype, host), oldest first

        def close_oldest():
            ch, shape, dtype, host = open_sends.pop(0)
            return bb.emit(CR.recv(shape, dtype, [[0, 0]], channel_id=ch, is_host_transfer=host))

        for kind, i, j in steps:
            # half the time one of the latest values (a collective's result, a fresh sum): chains form
            x = values[-1 - (i // 2) % min(3, len(values))] if i % 2 else values[i % len(values)]
            ty = x.ty
            shape, dtype = tuple(int(d) for d in ty.shape), str(ty.dtype)
            if kind == 0:
                v = bb.emit(CR.allreduce(x, "sum" if j % 2 else "max"))
            elif kind == 1:
                v = bb.emit(CR.allgather(x, axis=j % len(shape), group=ONE))
            elif kind == 2:
                v = bb.emit(CR.reduce_scatter(x, axis=j % len(shape), group=ONE))
            elif kind == 3:  # compute on two values of one type: a dependency
                y = next((w for w in values[j % len(values):] + values if str(w.ty) == str(ty)), x)
                v = bb.emit(relax.op.add(x, y))
            elif kind == 4:
                tok = bb.emit(CR.send(x, [[0, 0]], channel_id=channel))
                v = bb.emit(CR.recv(shape, dtype, [[0, 0]], channel_id=channel, token=tok if j % 2 else None))
                channel += 1
            elif kind == 5:
                v = bb.emit(relax.op.ccl.allreduce(x, "sum", True))
            elif kind == 6:
                v = bb.emit(relax.op.ccl.allgather(x, 1, True)) if shape else x
            elif kind == 7:  # a send whose recv comes later, on channel 100 or 101
                host = j % 3 == 0
                open_sends.append((100 + j % 2, shape, dtype, host))
                v = bb.emit(CR.send(x, [[0, 0]], channel_id=100 + j % 2, is_host_transfer=host))
                continue  # a token: nothing to compute on
            else:
                v = close_oldest() if open_sends else x
            values.append(v)
            outs.append(v)
        while open_sends:
            outs.append(close_oldest())
        return outs

    return _fn(params, body)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(), st.sampled_from([(30 * 2**20 + 7, 256, True), (40, 2, False), (64, 3, True)]),
       st.sampled_from([CB.CombineCollectives, CB.AllReduceCombiner]))
def test_generated_programs_keep_results(program, limits, factory):
    """``AllReduceCombiner`` too: it moves allreduces among transfers it leaves on their channels."""
    params, steps = program
    mod = _build(params, steps)
    threshold_bytes, threshold_count, by_dim = limits
    by_dim_kw = {"combine_by_dim": by_dim} if factory is CB.CombineCollectives else {}
    new = factory(threshold_bytes=threshold_bytes, threshold_count=threshold_count, **by_dim_kw)(mod)
    relax.analysis.well_formed(new)  # every variable defined before use: no cycle was built
    names = ("allreduce", "allgather", "reduce_scatter", "send", "recv")
    assert all(_count(new, k) <= _count(mod, k) for k in names)
    _same_results(mod, new, _args(params, salt=len(steps)))


@pytest.mark.parametrize("case", sorted(C.CASES))
def test_combined_modules_compile_for_cuda(case):
    """The pack/unpack kernels are block-structured, so the GPU pipeline (dlight) binds them to threads."""
    mod, _ = C.CASES[case](2)
    new = CB.CombineCollectives(combine_by_dim=False)(mod)
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"}, host="llvm")
    ex = tvm.compile(new, target=target, relax_pipeline=CR.pipeline(target))
    assert ex is not None
