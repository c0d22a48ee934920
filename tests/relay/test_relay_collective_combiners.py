"""Relay collective combiners: structure, thresholds, keys, send/recv, options; results on 1-4 ranks."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tvm
from test_relay_collectives import _let_chain
from tvm import relay
from tvm.relay.loops import while_loop

import tvm_combiners.collectives.runtime  # noqa: F401 - registers the runtime functions
from tvm_combiners.collectives import relay as C
from tvm_combiners.collectives.relay import combiners as CB
from tvm_combiners.collectives.relay.chains import let_chain

PROG = Path(__file__).parents[1] / "collectives" / "progs" / "combiners_relay_prog.py"
_spec = importlib.util.spec_from_file_location("combiners_relay_prog", PROG)
P = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(P)
TIMEOUT_S = 300
ONE = [[0]]


def _mod(xs, outs) -> tvm.IRModule:
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function(xs, relay.Tuple(outs))))


def _count(mod, kind) -> int:
    found = [0]
    relay.analysis.post_order_visit(mod["main"].body, lambda e: found.__setitem__(0, found[0] + C.is_collective(e, (kind,))))
    return found[0]


def _reports(factory, mod, **kw):
    got = []
    return factory(on_combine=got.append, **kw)(mod), got


def _vars(*params):
    return [relay.var(f"x{i}", shape=s, dtype=d) for i, (s, d) in enumerate(params)]


def _same_results(before, after, params):
    args = [P.data(0, s, d, i) for i, (s, d) in enumerate(params)]
    for a, b in zip(P.run(before, args), P.run(after, args), strict=True):
        np.testing.assert_array_equal(b, a)


def test_chain_stays_two_and_skip_ahead_joins():
    params = [((4, 6), "float32"), ((3,), "float32")]
    xs = _vars(*params)
    a = C.allreduce(xs[0])
    c = C.allreduce(relay.add(a, relay.const(1.0)))
    d = C.allreduce(xs[1])
    mod = _mod(xs, [a, c, d])
    new, reports = _reports(CB.AllReduceCombiner, mod)
    assert _count(new, "allreduce") == 2 and [(r.num_ops, r.nbytes) for r in reports] == [(2, 108)]
    _same_results(mod, new, params)


def test_empty_collectives_are_left_alone():
    """Review (2026-11-24): an allreduce of a (2, 0) tensor packed with others failed to type:
    Relay's reshape reads the 0 in (2, 0) as "keep this axis". The non-empty ones still combine."""
    params = [((2, 0), "float32"), ((3, 4), "float32"), ((5,), "float32")]
    xs = _vars(*params)
    mod = _mod(xs, [C.allreduce(x) for x in xs])
    new, reports = _reports(CB.CombineCollectives, mod)
    assert _count(new, "allreduce") == 2 and [(r.num_ops, r.nbytes) for r in reports] == [(2, 68)]
    _same_results(mod, new, params)


def test_groups_are_reported_in_program_order():
    params = [((4,), "float32"), ((4,), "float32"), ((2,), "float16"), ((2,), "float16")]
    xs = _vars(*params)
    reports = _reports(CB.AllReduceCombiner, _mod(xs, [C.allreduce(x) for x in xs]))[1]
    assert [(r.num_ops, r.nbytes, r.key[-1]) for r in reports] == [(2, 32, "float32"), (2, 8, "float16")]


def test_thresholds_exact():
    params = [((48,), "float32"), ((1,), "float32"), ((1,), "float32")]
    xs = _vars(*params)
    mod = _mod(xs, [C.allreduce(x) for x in xs])
    assert [(r.num_ops, r.nbytes) for r in _reports(CB.AllReduceCombiner, mod, threshold_bytes=196)[1]] == [(2, 196)]
    assert [(r.num_ops, r.nbytes) for r in _reports(CB.AllReduceCombiner, mod, threshold_bytes=195)[1]] == [(2, 8)]
    assert [r.num_ops for r in _reports(CB.AllReduceCombiner, mod, threshold_count=2)[1]] == [2]
    assert [r.num_ops for r in _reports(CB.AllReduceCombiner, mod, threshold_count=3)[1]] == [3]
    assert CB.CombineCollectives(threshold_bytes=0)(mod).same_as(mod)
    big = _vars(((32 << 10,), "float32"), ((32 << 10,), "float32"))
    big_mod = _mod(big, [C.allreduce(x) for x in big])
    assert _reports(CB.AllReduceCombiner, big_mod)[1] == []  # 128 KiB each: over the CPU cap
    assert [r.num_ops for r in _reports(CB.AllReduceCombiner, big_mod, max_op_bytes=None)[1]] == [2]


def test_mixed_keys_stay_apart_and_by_dim():
    params = [((4, 2), "float32"), ((4, 2), "int32"), ((4, 2), "float32")]
    xs = _vars(*params)
    outs = [C.allreduce(xs[0], "sum"), C.allreduce(xs[2], "max"), C.allreduce(xs[1], "sum"),
            C.allgather(xs[0], 0, ONE), C.allgather(xs[1], 0, ONE),     # dtypes differ: apart in Relay
            C.allgather(xs[2], 1, ONE),                                   # axis differs: joins only by_dim=False
            C.reduce_scatter(xs[0], axis=0, group=ONE), C.reduce_scatter(xs[2], axis=1, group=ONE)]
    mod = _mod(xs, outs)
    assert _reports(CB.CombineCollectives, mod)[1] == []
    new, reports = _reports(CB.CombineCollectives, mod, combine_by_dim=False)
    assert sorted((r.kind, r.num_ops) for r in reports) == [("allgather", 2), ("reduce_scatter", 2)]
    _same_results(mod, new, params)


def test_send_recv_channels_and_pairs():
    params = [((4,), "float32"), ((4,), "float32"), ((4,), "float32")]
    xs = _vars(*params)
    p = [[0, 0]]
    r = [C.recv((4,), "float32", p, channel_id=c, token=C.send(x, p, channel_id=c, is_host_transfer=c == 2),
                is_host_transfer=c == 2) for c, x in enumerate(xs)]
    hop = C.recv((4,), "float32", p, channel_id=5, token=C.send(r[0], p, channel_id=5))  # reads a recv: apart
    mod = _mod(xs, [*r, hop])
    new, reports = _reports(CB.SendRecvCombiner, mod)
    assert [r.num_ops for r in reports] == [2] and _count(new, "send") == 3 and _count(new, "recv") == 3
    channels = []
    relay.analysis.post_order_visit(new["main"].body, lambda e: channels.append(C.info(e).channel_id) if C.is_collective(e, ("send",)) else None)
    assert sorted(channels) == [2, 3, 5]  # channels 0 and 1 travel as one on 3, the smallest id no op used
    _same_results(mod, new, params)


@pytest.mark.parametrize("anf", [False, True])
def test_a_group_does_not_reorder_a_channels_sends(anf):
    """Relay matches a channel's sends in the order their data gives them. Combining the two
    allreduces made the second send of channel 1 read the first recv of channel 1, so it came after
    the third send: recvs 2 and 3 swapped payloads (graph form; in let form the combined module was
    refused). The channel's sends are chained by OrderSendRecv's tokens before any group forms; in
    let form those tokens read the sends' variables, so the chain is reordered and combines too."""
    params = [((4,), "float32")] * 3
    xs, p, c = _vars(*params), [[0, 0]], lambda v: relay.const(float(v))
    a1 = C.allreduce(xs[1])
    s1, s2, s3 = (C.send(relay.add(v, c(100 * k)), p, channel_id=1) for k, v in enumerate((xs[0], a1, xs[2]), 1))
    r1 = C.recv((4,), "float32", p, channel_id=1, token=s1)
    t9 = C.send(relay.multiply(r1, c(0)), p, channel_id=9)  # orders the recvs, as OrderSendRecv asks
    r2 = C.recv((4,), "float32", p, channel_id=1, token=C.after_all(s2, t9))
    t10 = C.send(relay.multiply(r2, c(0)), p, channel_id=10)
    r3 = C.recv((4,), "float32", p, channel_id=1, token=C.after_all(s3, t10))
    r9, r10 = (C.recv((4,), "float32", p, channel_id=ch, token=t) for ch, t in ((9, t9), (10, t10)))
    mod = _mod(xs, [a1, C.allreduce(relay.multiply(r1, c(2))), r1, r2, r3, r9, r10])
    if anf:
        mod = relay.transform.InferType()(relay.transform.ToANormalForm()(mod))
    new = CB.AllReduceCombiner()(mod)
    assert _count_all(new, "allreduce") == 1
    _same_results(mod, new, params)


@pytest.mark.parametrize("f_channel", [0, 5])
def test_a_channel_two_functions_share_never_combines(f_channel):
    """main sends on channel 0, calls f, receives on 0, then sends and receives on 1: when f also
    sends and receives on channel 0, its recv gets main's payload (first in, first out across
    functions), which neither function's matching sees. Combining main's two transfers onto a fresh
    channel handed f its own payload; on a channel only main uses, they combine."""
    p = [[0, 0]]
    y = relay.var("y", shape=(4,))
    tf, rf = relay.var("tf", shape=(), dtype="int32"), relay.var("rf", shape=(4,))
    mod = tvm.IRModule()
    mod["f"] = relay.Function([y], relay.Let(tf, C.send(y, p, channel_id=f_channel), relay.Let(
        rf, C.recv((4,), "float32", p, channel_id=f_channel), relay.Tuple([rf, tf]))))
    mod = relay.transform.InferType()(mod)  # main's call to f is typed from f's type
    xs = _vars(*[((4,), "float32")] * 3)
    t0, t1 = relay.var("t0", shape=(), dtype="int32"), relay.var("t1", shape=(), dtype="int32")
    o, r0, r1 = (relay.var(name, shape=(4,)) for name in ("o", "r0", "r1"))
    bindings = [(t0, C.send(xs[2], p, channel_id=0)), (o, relay.TupleGetItem(relay.Call(mod.get_global_var("f"), [xs[1]]), 0)),
                (r0, C.recv((4,), "float32", p, channel_id=0)), (t1, C.send(o, p, channel_id=1)),
                (r1, C.recv((4,), "float32", p, channel_id=1))]
    mod["main"] = relay.Function(xs, _let_chain(*bindings, result=relay.Tuple([o, r0, r1, t0, t1])))
    mod = relay.transform.InferType()(mod)
    new, reports = _reports(CB.SendRecvCombiner, mod)
    assert [r.num_ops for r in reports] == ([] if f_channel == 0 else [2])
    _same_vm_results(mod, new, [P.data(0, (4,), "float32", i) for i in range(3)])


def test_no_collective_moves_across_a_call_to_a_function_that_runs_them():
    """Review (helper-46): main (let form) sends on channel 0, calls f, which sends and receives on
    channel 0, then receives on 0; f's recv takes main's payload (first in, first out). Combining
    main's allreduces {a, b} (b reads f's result) re-emitted the chain with f before main's send, so
    the recvs swapped payloads, silently. The call is a barrier now, as an if holding collectives is."""
    p = [[0, 0]]
    z = relay.var("z", shape=(4,))
    mod = tvm.IRModule()
    mod["f"] = relay.Function([z], C.recv((4,), "float32", p, channel_id=0, token=C.send(z, p, channel_id=0)))
    mod = relay.transform.InferType()(mod)
    xs = _vars(*[((4,), "float32")] * 3)
    a, y, b, r = (relay.var(name, shape=(4,)) for name in ("a", "y", "b", "r"))
    t = relay.var("t", shape=(), dtype="int32")
    bindings = [(a, C.allreduce(xs[2], group=ONE)), (t, C.send(relay.add(a, xs[0]), p, channel_id=0)),
                (y, relay.Call(mod.get_global_var("f"), [xs[1]])), (b, C.allreduce(y, group=ONE)),
                (r, C.recv((4,), "float32", p, channel_id=0, token=t))]
    mod["main"] = relay.Function(xs, _let_chain(*bindings, result=relay.Tuple([a, b, r, y])))
    mod = relay.transform.InferType()(mod)
    for factory in (CB.AllReduceCombiner, CB.CombineCollectives):
        new = factory()(mod)
        _same_vm_results(mod, new, [P.data(0, (4,), "float32", i) for i in range(3)])


def test_new_channels_follow_function_names():
    """A module's functions come out of its Map in an order that follows object addresses, which
    differs per process: ranks numbered the combined transfers of 8 functions differently, and each
    received another function's payload. Functions are visited by name now."""
    mod = tvm.IRModule()
    ring = [[0, 0]]
    for f in range(8):
        x, y = relay.var("x", shape=(4,), dtype="float32"), relay.var("y", shape=(4,), dtype="float32")
        outs = [C.recv((4,), "float32", ring, channel_id=c, token=C.send(v, ring, channel_id=c))
                for c, v in ((2 * f, x), (2 * f + 1, y))]
        mod[relay.GlobalVar(f"f{f}")] = relay.Function([x, y], relay.Tuple(outs))
    new = CB.SendRecvCombiner()(relay.transform.InferType()(mod))
    got: dict[str, set[int]] = {}
    for gv, func in new.functions.items():
        found = got.setdefault(gv.name_hint, set())
        relay.analysis.post_order_visit(func.body, lambda e, found=found: found.add(C.info(e).channel_id)
                                        if C.is_collective(e, ("send", "recv")) else None)
    assert got == {f"f{f}": {16 + f} for f in range(8)}  # the smallest ids no op used, in name order


def test_idempotent_names_and_options():
    xs, params, body = P.collectives(1)
    mod = _mod(xs, list(body.fields))
    once = CB.CombineCollectives(combine_by_dim=False)(mod)
    assert not once.same_as(mod)
    assert tvm.ir.structural_equal(once, CB.CombineCollectives(combine_by_dim=False)(once))
    for name in ("AllReduceCombiner", "AllGatherCombiner", "ReduceScatterCombiner", "SendRecvCombiner", "CombineCollectives"):
        p = getattr(CB, name)()
        assert p.info.name == name
        with tvm.transform.PassContext(disabled_pass=[name]):
            assert tvm.transform.Sequential([p])(mod).same_as(mod)
    with pytest.raises(TypeError, match=r"^ReduceScatterCombiner: threshold_count must be an int \(<= 0 disables the pass\), got str 'x'$"):
        CB.ReduceScatterCombiner(threshold_count="x")
    _same_results(mod, once, params)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_combiners_keep_results_on_n_ranks_relay(n, tmp_path):
    cmd = [sys.executable, "-m", "tvm_combiners.collectives.runtime.launcher", "-n", str(n), "--timeout", str(TIMEOUT_S),
           "--", sys.executable, str(PROG), str(tmp_path)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S + 60)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(n)]
    assert {r["checks"] for r in reports} == {reports[0]["checks"]} and reports[0]["checks"] > 100


@pytest.mark.parametrize("n", [2, 3])
def test_prog_cases_combine(n):
    for name, (build, _) in P.CASES.items():
        xs, _params, body = build(n)
        mod = _mod(xs, list(body.fields))
        _, reports = _reports(CB.CombineCollectives, mod, combine_by_dim=False)
        kinds = {r.kind for r in reports}
        assert kinds == ({"allreduce", "allgather", "reduce_scatter"} if name == "collectives" else {"send_recv"})


def _random_dag(seed):
    """Seeded random DAG of collectives, transfers and compute: (module, parameter specs)."""
    rng = np.random.default_rng(seed)
    params = [(((4,), (2, 3), (3, 2))[int(rng.integers(3))], str(rng.choice(["float32", "int32"]))) for _ in range(3)]
    xs = _vars(*params)
    values = list(xs)
    types = [x.type_annotation for x in xs]
    for channel in range(int(rng.integers(6, 16))):
        pick = int(rng.integers(len(values)))
        x, ty = values[pick], types[pick]
        shape, dtype = tuple(int(d) for d in ty.shape), str(ty.dtype)
        kind = int(rng.integers(5))
        if kind == 0:
            v = C.allreduce(x, str(rng.choice(["sum", "max"])))
        elif kind == 1:
            v = C.allgather(x, int(rng.integers(len(shape))), ONE)
        elif kind == 2:
            v = C.reduce_scatter(x, axis=int(rng.integers(len(shape))), group=ONE)
        elif kind == 3:  # compute on two values of one type: a dependency between collectives
            same = [w for w, t in zip(values, types) if tvm.ir.structural_equal(t, ty)]
            v = relay.add(x, same[int(rng.integers(len(same)))])
        else:
            v = C.recv(shape, dtype, [[0, 0]], channel_id=channel, token=C.send(x, [[0, 0]], channel_id=channel))
        values.append(v)
        types.append(relay.transform.InferTypeLocal(v))
    return _mod(xs, values[len(xs):]), params


_KINDS = ("allreduce", "allgather", "reduce_scatter", "send")


@pytest.mark.parametrize("seed", range(8))
def test_random_dags_keep_results_one_rank(seed):
    """Seeded random DAGs of collectives, transfers and compute (one rank): acyclic, equal results."""
    mod, params = _random_dag(seed)
    for kw in ({}, {"threshold_bytes": 40, "threshold_count": 2}):
        new = CB.CombineCollectives(combine_by_dim=False, **kw)(mod)
        assert all(_count(new, k) <= _count(mod, k) for k in _KINDS)
        _same_results(mod, new, params)


@pytest.mark.parametrize("seed", range(8))
def test_random_dags_in_let_form_combine_as_in_graph_form(seed):
    """After ToANormalForm every operand is bound just before its collective: the chain is reordered,
    so as many ops combine as in graph form (none did before), with the same results (VM)."""
    mod, params = _random_dag(seed)
    anf = relay.transform.InferType()(relay.transform.ToANormalForm()(mod))
    args = [P.data(0, s, d, i) for i, (s, d) in enumerate(params)]
    for kw in ({}, {"threshold_bytes": 40, "threshold_count": 2}):
        graph, let = (CB.CombineCollectives(combine_by_dim=False, **kw)(m) for m in (mod, anf))
        assert [_count_all(let, k) for k in _KINDS] == [_count_all(graph, k) for k in _KINDS]
        _same_vm_results(mod, let, args)


# --------------------------------------------------------------------------- scopes: branches, closures, lets, loops


def _vm(mod, args):
    """Outputs of the Relay VM (the graph executor has no control flow), after OrderSendRecv."""
    with tvm.transform.PassContext(opt_level=3):
        exe = relay.vm.compile(C.OrderSendRecv()(mod), target=P.TARGET)
    out = tvm.runtime.vm.VirtualMachine(exe, tvm.cpu()).invoke("main", *[tvm.nd.array(a) for a in args])
    flat = lambda v: [v.numpy()] if hasattr(v, "numpy") else [a for x in v for a in flat(x)]  # noqa: E731
    return flat(out)


def _same_vm_results(before, after, args):
    for a, b in zip(_vm(before, args), _vm(after, args), strict=True):
        np.testing.assert_array_equal(b, a)


def _count_all(mod, kind) -> int:
    """Collectives of ``kind`` anywhere in main, branches and closures included."""
    return mod.astext().count(f"collectives.{kind}(")


def test_if_branch_collectives_stay_in_their_branch():
    """An allreduce in a branch runs on the ranks that take it: merged with one outside, it would
    run (with other operands) on every rank. Only the two top-level ones combine."""
    mod, _ = P.branches_module()
    new, reports = _reports(CB.AllReduceCombiner, mod)
    assert [r.num_ops for r in reports] == [2] and _count_all(new, "allreduce") == 3
    branch = new["main"].body.fields[0]
    assert isinstance(branch, relay.If) and C.is_collective(branch.true_branch) and C.is_collective(branch.false_branch)
    for cond in (True, False):
        _same_vm_results(mod, new, P.branches_inputs(0, cond))


def test_closure_collective_not_combined_with_outside():
    x, z, w, p = (relay.var(n, shape=(3,), dtype="float32") for n in ("x", "z", "w", "p"))
    local = relay.Function([p], C.allreduce(p))
    mod = relay.transform.InferType()(tvm.IRModule.from_expr(
        relay.Function([x, z, w], relay.Tuple([relay.Call(local, [x]), C.allreduce(z), C.allreduce(w)]))))
    new, reports = _reports(CB.AllReduceCombiner, mod)
    assert [r.num_ops for r in reports] == [2] and _count_all(new, "allreduce") == 2  # z and w; the closure's stays
    assert len(relay.analysis.free_vars(new["main"])) == 0
    _same_vm_results(mod, new, [np.arange(3, dtype="float32") + k for k in range(3)])
    alone = _mod([x, z], [relay.Call(local, [x]), C.allreduce(z)])
    assert CB.CombineCollectives()(alone).same_as(alone)


def test_let_form_chain_is_reordered_so_that_late_operands_combine():
    """``z`` is bound after the first allreduce: the combined op goes after it, and so does ``a``."""
    x = relay.var("x", shape=(3,), dtype="float32")
    a, b, z = relay.var("a"), relay.var("b"), relay.var("z", shape=(3,), dtype="float32")
    late = relay.Let(a, C.allreduce(x), relay.Let(z, relay.multiply(x, relay.const(2.0)),
                                                  relay.Let(b, C.allreduce(z), relay.Tuple([a, b]))))
    mod = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], late)))
    new, reports = _reports(CB.CombineCollectives, mod)
    assert [r.num_ops for r in reports] == [2] and _count_all(new, "allreduce") == 1
    chain = let_chain(new["main"].body)
    names = [let.var.name_hint for let in chain.lets]
    assert names[:2] == ["z", "combined_allreduce"] and sorted(names[2:]) == ["a", "b"]
    by_name = {let.var.name_hint: let.var for let in chain.lets}
    assert [f.same_as(by_name[n]) for f, n in zip(chain.result.fields, "ab")] == [True, True]  # read as before
    _same_vm_results(mod, new, [np.arange(3, dtype="float32")])


def test_layered_step_in_let_form_combines_as_in_graph_form():
    """A data-parallel step's shape after ToANormalForm: each operand bound just before its collective,
    each result read by the next layer's code; nothing combined before the chain was reordered."""
    x, w = relay.var("x", shape=(4, 16)), relay.var("w", shape=(16, 16))
    h, outs = x, []
    for _ in range(4):
        h = relay.nn.relu(relay.nn.dense(h, w))
        outs += [C.allreduce(relay.multiply(h, relay.const(0.5))), C.allreduce(relay.sum(h, axis=[0]))]
        outs.append(relay.add(C.allgather(relay.strided_slice(h, [0], [1]), axis=0, group=ONE), relay.const(1.0)))
        h = relay.add(h, relay.sum(outs[-3]))  # the next layer reads this layer's allreduce
    graph = _mod([x, w], [h, *outs])
    let = relay.transform.InferType()(relay.transform.ToANormalForm()(graph))
    combined = [_reports(CB.CombineCollectives, m)[1] for m in (graph, let)]
    assert [[(r.kind, r.num_ops) for r in reps] for reps in combined] == [[("allreduce", 2)] * 4 + [("allgather", 4)]] * 2
    args = [np.linspace(-1, 1, 64, dtype="float32").reshape(4, 16), np.eye(16, dtype="float32") * 0.5]
    _same_vm_results(let, CB.CombineCollectives()(let), args)


def test_let_form_groups_inside_other_groups_stay_in_scope():
    """In a chain the combiners cannot reorder, a group is built where its first member sits, and one
    group's combined op can hold another's (a group of sends whose payload reads a collective): that
    inner op must not read a let variable bound later. A module it would read one in comes back
    unchanged (it stopped with TVM's InternalError); transfers whose recvs read the sends' calls
    combine, as before tokens read let variables."""
    x, x2, p = relay.var("x", shape=(4,)), relay.var("x2", shape=(4,)), [[0, 0]]
    args = [np.arange(4, dtype="float32"), np.ones(4, "float32")]

    def chain(*bindings, result):
        return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x, x2], _let_chain(*bindings, result=result))))

    t1, t2 = relay.var("t1", shape=(), dtype="int32"), relay.var("t2", shape=(), dtype="int32")
    w, a2, q1, q2, r1 = (relay.var(name, shape=(4,)) for name in ("w", "a2", "q1", "q2", "r1"))
    inner = chain((t1, C.send(x, p, channel_id=0)), (w, relay.add(x2, x2)), (a2, C.allreduce(w)),
                  (t2, C.send(relay.add(C.allreduce(x), x2), p, channel_id=1)),  # an allreduce in a send's payload
                  (q1, C.recv((4,), "float32", p, channel_id=0)), (q2, C.recv((4,), "float32", p, channel_id=1)),
                  result=relay.Tuple([q1, q2, a2, t1, t2]))
    assert CB.CombineCollectives()(inner).same_as(inner)
    r2 = C.recv((4,), "float32", p, channel_id=1)  # not a binding: the chain is not reordered
    loose = chain((t1, C.send(x, p, channel_id=0)), (r1, C.recv((4,), "float32", p, channel_id=0)),
                  (t2, C.send(x2, p, channel_id=1)), result=relay.Tuple([r1, r2, t1, t2]))
    new, reports = _reports(CB.SendRecvCombiner, loose)
    assert [(r.kind, r.num_ops) for r in reports] == [("send_recv", 2)]
    assert relay.analysis.well_formed(new["main"])
    _same_vm_results(loose, new, args)


def test_let_form_left_where_the_chain_cannot_carry_a_group():
    """A member inside a larger value cannot move on its own: its group is built only in scope."""
    x = relay.var("x", shape=(3,), dtype="float32")
    a, z = relay.var("a"), relay.var("z", shape=(3,), dtype="float32")
    inner = relay.Let(a, relay.add(C.allreduce(x), relay.const(1.0)), relay.Let(
        z, relay.multiply(x, relay.const(2.0)), relay.Tuple([a, C.allreduce(z)])))
    inner_mod = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], inner)))
    assert CB.CombineCollectives()(inner_mod).same_as(inner_mod)
    u, v = relay.var("u", shape=(3,), dtype="float32"), relay.var("v", shape=(3,), dtype="float32")
    early = relay.Let(u, relay.multiply(x, relay.const(2.0)), relay.Let(v, relay.add(x, relay.const(1.0)),
                                                                       relay.Tuple([C.allreduce(u), C.allreduce(v)])))
    early_mod = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], early)))
    new, reports = _reports(CB.AllReduceCombiner, early_mod)
    assert [r.num_ops for r in reports] == [2] and _count_all(new, "allreduce") == 1
    _same_vm_results(early_mod, new, [np.arange(3, dtype="float32")])
    # a member bound and also read inside a larger expression: the rewritten chain would run it twice
    shared = C.allreduce(x)
    b = relay.var("b")
    twice = relay.Let(a, shared, relay.Let(z, relay.multiply(x, relay.const(2.0)), relay.Let(
        b, C.allreduce(z), relay.Tuple([a, b, relay.add(shared, relay.const(1.0))]))))
    twice_mod = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], twice)))
    assert CB.CombineCollectives()(twice_mod).same_as(twice_mod)
    # a member bound and also the chain's result: reordered, the result would run it again
    y, t = relay.var("y", shape=(3,), dtype="float32"), relay.var("t")
    again = relay.Let(a, shared, relay.Let(b, C.allreduce(y), relay.Let(t, relay.add(a, b), shared)))
    again_mod = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x, y], again)))
    new = CB.CombineCollectives()(again_mod)  # combined where it sits (both operands are parameters)
    assert _count_all(again_mod, "allreduce") == 2 and _count_all(new, "allreduce") == 1
    _same_vm_results(again_mod, new, [np.arange(3, dtype="float32"), np.ones(3, "float32")])
    # a reference cell's reads and writes are ordered by no dependence: such a chain is not reordered
    cell = relay.var("cell")
    refs = relay.Let(cell, relay.RefCreate(relay.multiply(x, relay.const(0.0))), relay.Let(
        a, C.allreduce(x), relay.Let(z, relay.RefRead(cell), relay.Tuple([a, C.allreduce(z)]))))
    refs_mod = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], refs)))
    assert CB.CombineCollectives()(refs_mod).same_as(refs_mod)


def _loop_module(with_collectives: bool) -> tvm.IRModule:
    x, z, w = (relay.var(n, shape=(3,), dtype="float32") for n in ("x", "z", "w"))
    i, acc = relay.var("i", shape=(), dtype="int32"), relay.var("acc", shape=(3,), dtype="float32")
    step = (lambda a: C.allreduce(relay.add(a, relay.const(1.0)))) if with_collectives else (lambda a: relay.add(a, a))
    loop = while_loop(lambda i, acc: relay.less(i, relay.const(3)), [i, acc],
                      lambda i, acc: [relay.add(i, relay.const(1)), step(acc)])
    outs = [relay.TupleGetItem(loop(relay.const(0), x), 1)]
    if with_collectives:
        outs += [C.allreduce(z), C.allreduce(w)]
    return _mod([x, z, w], outs)


def test_while_loop_modules():
    plain = _loop_module(False)
    for name in ("AllReduceCombiner", "AllGatherCombiner", "ReduceScatterCombiner", "SendRecvCombiner", "CombineCollectives"):
        assert getattr(CB, name)()(plain).same_as(plain), name
    assert C.OrderSendRecv()(plain).same_as(plain)
    mod = _loop_module(True)
    new, reports = _reports(CB.AllReduceCombiner, mod)
    assert [r.num_ops for r in reports] == [2] and _count_all(new, "allreduce") == 2  # z and w; the loop's stays
    _same_vm_results(mod, new, [np.zeros(3, "float32"), np.ones(3, "float32"), np.full(3, 2.0, "float32")])


@pytest.mark.parametrize("factory", [CB.AllReduceCombiner, CB.CombineCollectives])
def test_match_edge_constrains_every_combiner(factory):
    """``b`` reads a recv that waits for the send of ``a``: one op for both would wait for itself."""
    x = relay.var("x", shape=(4,), dtype="float32")
    a = C.allreduce(x)
    t = C.send(a, [[0, 0]], channel_id=0)
    r = C.recv((4,), "float32", [[0, 0]], channel_id=0)  # matched by channel only, not by token
    mod = _mod([x], [a, C.allreduce(r), t])
    new, reports = _reports(factory, mod)
    assert reports == [] and new.same_as(mod)
    C.OrderSendRecv()(new)


def test_if_branch_collectives_on_2_ranks(tmp_path):
    """Rank-dependent condition: each rank allreduces x or y in its branch, then z and w (combined)."""
    cmd = [sys.executable, "-m", "tvm_combiners.collectives.runtime.launcher", "-n", "2", "--timeout", "120",
           "--", sys.executable, str(PROG), str(tmp_path), "branches"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert [json.loads((tmp_path / f"rank{r}.json").read_text())["checks"] for r in range(2)] == [8, 8]


def test_two_functions_combined_in_one_module():
    """``@g`` and ``main`` (which calls it) both combine; the module type-checks afterwards (it
    failed InferType while ``@g`` came back without its return type)."""
    p, q, x, y, z, w = (relay.var(n, shape=(3,), dtype="float32") for n in "pqxyzw")
    g = relay.GlobalVar("g")
    mod = relay.transform.InferType()(tvm.IRModule({g: relay.Function([p, q], relay.Tuple([C.allreduce(p), C.allreduce(q)]))}))
    mod["main"] = relay.Function([x, y, z, w], relay.Tuple([C.allreduce(z), relay.Call(g, [x, y]), C.allreduce(w)]))
    mod = relay.transform.InferType()(mod)
    new, reports = _reports(CB.AllReduceCombiner, mod)
    assert [r.num_ops for r in reports] == [2, 2] and _count_all(new, "allreduce") == 2
    _same_vm_results(mod, new, [np.full(3, k, "float32") for k in range(1, 5)])


DEEP = 6000  # ops on one path; TVM's recursive Python ExprMutator stopped near 2500


def _chain(e, z, n):
    for _ in range(n):
        e = relay.add(e, z)
    return e


def _deep_module(n, let_form):
    """``allreduce(x0)`` then ``n`` adds of ``x2``, beside ``allreduce(x1)``: graph or let form."""
    xs = _vars(((4,), "float32"), ((3,), "float32"), ((4,), "float32"))
    e = C.allreduce(xs[0])
    if not let_form:
        return _mod(xs, [_chain(e, xs[2], n), C.allreduce(xs[1])])
    bound = []
    for i in range(n):
        v = relay.var(f"v{i}")
        bound.append((v, e))
        e = relay.add(v, xs[2])
    body = relay.Tuple([e, C.allreduce(xs[1])])
    for v, value in reversed(bound):
        body = relay.Let(v, value, body)
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function(xs, body)))


@pytest.mark.parametrize("let_form", [False, True])
def test_deep_graphs_combine_without_hitting_the_recursion_limit(let_form):
    new, reports = _reports(CB.CombineCollectives, _deep_module(DEEP, let_form))
    assert [(r.kind, r.num_ops) for r in reports] == [("allreduce", 2)] and _count(new, "allreduce") == 1
    if let_form:
        return
    # exactly the shallow module's rewrite with the chain after the first result
    shallow = CB.CombineCollectives()(_deep_module(0, False))["main"]
    first, second = shallow.body.fields
    expected = relay.Function(shallow.params, relay.Tuple([_chain(first, shallow.params[2], DEEP), second]), shallow.ret_type)
    assert tvm.ir.structural_equal(new["main"], expected)
