"""Relay collective ops: types, printing, structure, validation, stateful lowering, OrderSendRecv, and N ranks."""

from __future__ import annotations

import importlib
import importlib.util
import re
import subprocess
import sys

import numpy as np
import pytest
import tvm
from tvm import relay
from tvm.contrib import graph_executor
from tvm.relay.loops import while_loop

from tvm_combiners.collectives import relay as C
from tvm_combiners.collectives import selfcheck
from tvm_combiners.collectives import spec as S
from tvm_combiners.collectives.ordering import SendRecvOrderError

# the bfloat16 spot checks of the Relax multi-rank test, for the same selfcheck results
_multirank = importlib.util.spec_from_file_location(
    "test_ops_multirank", __import__("pathlib").Path(__file__).parents[1] / "collectives" / "test_ops_multirank.py")
check_bfloat16 = importlib.util.module_from_spec(_multirank)
_multirank.loader.exec_module(check_bfloat16)
check_bfloat16 = check_bfloat16.check_bfloat16

TARGET = tvm.target.Target("llvm -mtriple=x86_64-linux-gnu")
RUNTIME_NAMES = ["allreduce", "allgather", "reduce_scatter", "send", "recv"]
TIMEOUT_S = 150


def var(shape, dtype="float32", name="x"):
    return relay.var(name, shape=shape, dtype=dtype)


def infer(expr):
    return relay.transform.InferTypeLocal(expr)


def module(out, params):
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function(params, out)))


def raises(msg):
    return pytest.raises(S.CollectiveError, match="^" + re.escape(msg) + "$")


@pytest.fixture
def mock_runtime():
    log: list[tuple[str, tuple]] = []
    saved = {k: tvm.get_global_func("tvm_combiners." + k, allow_missing=True) for k in RUNTIME_NAMES}

    def make(name):
        def f(*args):
            log.append((name, tuple(a for a in args if isinstance(a, (str, int)))))
            out = args[-1]
            out.copyfrom(np.full(tuple(out.shape), len(log), str(out.dtype)))

        return f

    for k in RUNTIME_NAMES:
        tvm.register_func("tvm_combiners." + k, make(k), override=True)
    yield log
    for k, f in saved.items():
        if f is not None:
            tvm.register_func("tvm_combiners." + k, f, override=True)


def run_both(mod, **inputs):
    """Outputs of the graph executor and of the VM (opt_level 3: CSE, FoldConstant, fusion all on)."""
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(mod, target=TARGET)
    g = graph_executor.GraphModule(lib["default"](tvm.cpu()))
    for k, v in inputs.items():
        g.set_input(k, v)
    g.run()
    graph = [g.get_output(i).numpy() for i in range(g.get_num_outputs())]
    with tvm.transform.PassContext(opt_level=3):
        vm = relay.create_executor("vm", mod=mod, target=TARGET, device=tvm.cpu()).evaluate()
    return graph, vm(**inputs)


# --------------------------------------------------------------------------- types, printing, structure


@pytest.mark.parametrize(
    "make, shape, dtype",
    [
        (lambda x: C.allreduce(x, "min"), (4, 6), "float32"),
        (lambda x: C.allgather(x, axis=-1, group=[[1, 0]]), (4, 12), "float32"),
        (lambda x: C.reduce_scatter(x, "sum", axis=0, world_size=4), (1, 6), "float32"),
        (lambda x: C.send(x, [[0, 1]]), (), "int32"),
        (lambda x: C.recv((2, 3), "uint8", [[0, 1]]), (2, 3), "uint8"),
        (lambda x: C.after_all(C.send(x, [[0, 1]]), C.token()), (), "int32"),
    ],
)
def test_result_types(make, shape, dtype):
    ty = infer(make(var((4, 6))))
    assert [int(d) for d in ty.shape] == list(shape) and ty.dtype == dtype


def test_prints_and_reads_back():
    x = var((4, 6))
    t = C.send(x, [[0, 1], [1, 0]], channel_id=3)
    y = C.recv((4, 6), "float32", [[0, 1], [1, 0]], channel_id=3, token=t)
    text = str(module(relay.Tuple([C.allreduce(y, "avg", group=[[1, 0]]), C.after_all(t)]), [x])["main"])
    assert 'collectives.allreduce(%1, __dict__={"op"="avg", "groups"="1,0"})' in text
    assert 'collectives.send(%x, 0 /* ty=int32 */, __dict__={"source_target_pairs"="0,1;1,0", "channel_id"=3' in text
    assert '"dtype"="float32", "shape"=[4, 6]' in text
    assert C.info(y) == S.CollectiveSpec(
        "recv", pairs=((0, 1), (1, 0)), channel_id=3, is_host_transfer=False, shape=(4, 6), dtype="float32"
    )
    assert C.info(C.reduce_scatter(x, "max", 1, group=[[2, 0], [1, 3]])).key() == (
        "reduce_scatter", "max", 1, ((2, 0), (1, 3)), None, None, False)  # groups ordered by their smallest rank
    assert C.info(relay.add(x, x)) is None


def test_structural_equality_and_hash():
    x = var((4, 6))
    a, b = C.allgather(x, 1, group=[[0, 1]]), C.allgather(x, 1, group=[[0, 1]])
    assert tvm.ir.structural_equal(a, b) and tvm.ir.structural_hash(a) == tvm.ir.structural_hash(b)
    c = C.allgather(x, 0, group=[[0, 1]])
    assert not tvm.ir.structural_equal(a, c) and tvm.ir.structural_hash(a) != tvm.ir.structural_hash(c)


def test_registration_is_idempotent():
    importlib.reload(C)
    assert [int(d) for d in infer(C.allreduce(var((3,)))).shape] == [3]


# --------------------------------------------------------------------------- validation

X = var((4, 6))
XI = var((4, 6), "int32", name="xi")
TOK = var((), "int32", name="tok")
NT = var((2,), "int32", name="nt")


@pytest.mark.parametrize(
    "make, msg",
    [
        (lambda: C.allreduce(X, "mean"), "allreduce: op 'mean' is not a reduction; expected one of sum, prod, min, max, avg"),
        (lambda: C.allreduce(XI, "avg"),
         "allreduce: op 'avg' needs a floating-point dtype, got int32 (an integer mean would truncate)"),
        (lambda: C.allgather(X, axis=2, group=[[0]]), "allgather: axis 2 is out of range for a 2-d operand; expected -2 <= axis < 2"),
        (lambda: C.reduce_scatter(X, axis=1, world_size=4),
         "reduce_scatter: axis 1 has extent 6, which is not divisible by the group size 4"),
        (lambda: C.allgather(X),
         "allgather: group=None leaves the group size unknown at compile time; pass group=[[...]] or world_size=N"),
        (lambda: C.allreduce(X, group=[[0, 1], [1]]),
         "allreduce: group rank 1 appears in groups 0 and 1; every rank must be in exactly one group"),
        (lambda: C.allreduce(X, group=[[1, 2]]),
         "allreduce: group does not cover ranks 0..1 (missing 0); every rank must be in exactly one group"),
        (lambda: C.send(X, [[0]]), "send: source_target_pairs entry 0 is [0]; each entry must be a [source, target] pair (C1)"),
        (lambda: C.send(X, [[1, 0], [1, 2]]), "send: source_target_pairs source 1 appears more than once; sources must be unique (C2)"),
        (lambda: C.recv((1,), "float32", [[0, 1], [2, 1]]),
         "recv: source_target_pairs target 1 appears more than once; targets must be unique (C3)"),
        (lambda: C.recv((1,), "float32", [[0, 1]], is_host_transfer="yes"),
         "recv: is_host_transfer must be a bool, got 'yes' (C5: it selects the channel type, DEVICE_TO_HOST when true, "
         "DEVICE_TO_DEVICE otherwise)"),
        (lambda: C.send(X, [[0, 1]], token=NT),
         "send: token must be a token (a 0-d int32 tensor), got a tensor of shape (2,) and dtype int32"),
        (lambda: C.recv((1,), "float32", [[0, 1]], token=relay.Tuple([TOK])),
         "recv: token must be a token (a 0-d int32 tensor), got a non-tensor"),
        (lambda: C.after_all(TOK, XI),
         "after_all: argument 1 must be a token (a 0-d int32 tensor), got a tensor of shape (4, 6) and dtype int32"),
        (lambda: C.allreduce([1, 2]), "allreduce: x must be a Relay expression holding a tensor, got [1, 2]"),
        (lambda: C.allgather(relay.var("d", shape=(2, relay.Any())), axis=0, group=[[0]]),
         "allgather: x has the dynamic extent ? on axis 1; Relay collectives need static shapes (Relax's take symbolic ones)"),
        (lambda: C.send(relay.var("d", shape=(tvm.tir.Var("n", "int64"),)), [[0, 0]]),
         "send: x has the dynamic extent n on axis 0; Relay collectives need static shapes (Relax's take symbolic ones)"),
    ],
)
def test_validation_messages(make, msg):
    with raises(msg):
        make()


def test_type_relation_validates_calls_built_by_hand():
    x = var((4, 6))
    bad = relay.Call(relay.op.get("collectives.allgather"), [x], tvm.ir.make_node("DictAttrs", axis=5, groups="0,1"))
    with pytest.raises(Exception, match=re.escape("allgather: axis 5 is out of range for a 2-d operand")):
        module(bad, [x])
    missing = relay.Call(relay.op.get("collectives.allreduce"), [x], tvm.ir.make_node("DictAttrs", op="sum"))
    with pytest.raises(S.CollectiveError, match=re.escape("allreduce: attribute 'groups' is missing")):
        module(missing, [x])  # was TVM's InternalError: "cannot find the corresponding key in the Map"


def test_an_unannotated_let_variable_is_named_as_such():
    v = relay.var("v")  # typed by its let value: valid Relay, but the builders check types when called
    with raises("allreduce: x is a variable without a type annotation, and the op checks its operands' types when "
                "built: annotate it (relay.var(name, shape=..., dtype=...)) or build the call on the variable's value"):
        C.allreduce(v)
    with pytest.raises(S.CollectiveError, match="^recv: token is a variable without a type annotation"):
        C.recv((4,), "float32", [[0, 1]], token=v)


# --------------------------------------------------------------------------- stateful: never merged, folded or dropped


def test_identical_collectives_and_constant_token_recvs_all_run(mock_runtime):
    x = var((4,))
    a, b = C.allreduce(x, "sum"), C.allreduce(x, "sum")
    t = C.send(relay.const(np.ones(4, "float32")), [[0, 1]])  # constant payload: FoldConstant must not run it
    r = C.recv((4,), "float32", [[0, 1]], token=t)
    unused = C.allreduce(x, "prod")  # returned, read by nobody
    mod = C.OrderSendRecv()(module(relay.Tuple([a, b, r, unused]), [x]))
    cse = relay.transform.EliminateCommonSubexpr()(mod)
    assert cse.astext().count("collectives.allreduce(") == 3
    graph, vm_outs = run_both(mod, x=np.ones(4, "float32"))
    names = [n for n, _ in mock_runtime]
    assert names == ["allreduce", "allreduce", "send", "recv", "allreduce"] * 2  # graph executor, then VM
    assert not np.array_equal(graph[0], graph[1])  # two calls, two results (the mock writes its call count)


# --------------------------------------------------------------------------- OrderSendRecv


def p2p_program():
    x = var((4,))
    pairs = [[0, 1], [1, 0]]
    y = C.recv((4,), "float32", pairs, channel_id=0)  # reached first by the executors' post-order
    t = C.send(x, pairs, channel_id=0)
    return module(relay.Tuple([y, C.after_all(t)]), [x])


def test_zero_size_transfers_move_nothing_in_either_executor(mock_runtime):
    """Review: the Relay VM ran a (0, 3) send but never its recv; the queued empty message then met the
    channel's next recv ("brought 0 bytes, expected 8"). Both sides now skip a zero-size payload."""
    x0, x1 = var((0, 3), name="x0"), var((2, 3), name="x1")
    p = [[0, 0]]
    t = C.send(x0, p)
    y0 = C.recv((0, 3), "float32", p, token=t)
    t1 = C.send(x1, p, token=t)
    y1 = C.recv((2, 3), "float32", p, token=t1)
    graph, vm = run_both(module(relay.Tuple([y0, y1]), [x0, x1]), x0=np.zeros((0, 3), "float32"),
                         x1=np.ones((2, 3), "float32"))
    assert [n for n, _ in mock_runtime] == ["send", "recv"] * 2  # only the (2, 3) transfer, in each executor
    assert graph[0].shape == vm[0].numpy().shape == (0, 3)


def test_recv_runs_first_without_the_pass_and_after_its_send_with_it(mock_runtime):
    mod = p2p_program()
    run_both(mod, x=np.ones(4, "float32"))
    assert [n for n, _ in mock_runtime] == ["recv", "send"] * 2  # would block every rank
    mock_runtime.clear()
    ordered = C.OrderSendRecv()(mod)
    assert "collectives.after_all" in ordered.astext()
    run_both(ordered, x=np.ones(4, "float32"))
    assert [n for n, _ in mock_runtime] == ["send", "recv"] * 2
    again = C.OrderSendRecv()(ordered)
    assert tvm.ir.structural_equal(again, ordered)


def _let_chain(*bindings, result):
    body = result
    for v, value in reversed(bindings):
        body = relay.Let(v, value, body)
    return body


def test_let_form_recv_reads_its_sends_variable_where_in_scope(mock_runtime):
    """In a let chain the added token reads the send's variable, not its call: the chain keeps one
    binding per op (the combiners reorder only such chains). A recv bound before its send cannot
    see the variable, so there the token reads the call."""
    x, p = var((4,)), [[0, 0]]
    t, y, r = var((), "int32", "t"), var((4,), name="y"), var((4,), name="r")
    sent_first = _let_chain((t, C.send(x, p)), (y, relay.add(x, x)), (r, C.recv((4,), "float32", p)), result=relay.Tuple([r, y, t]))
    ordered = C.OrderSendRecv()(module(sent_first, [x]))
    body = ordered["main"].body
    recv_token = body.body.body.value.args[0]  # after_all((token, t)) of the third binding
    assert isinstance(recv_token.args[0].fields[1], relay.Var) and recv_token.args[0].fields[1].name_hint == "t"
    assert ordered.astext().count("collectives.send(") == 1
    run_both(ordered, x=np.ones(4, "float32"))
    assert [n for n, _ in mock_runtime] == ["send", "recv"] * 2
    mock_runtime.clear()
    recv_first = _let_chain((r, C.recv((4,), "float32", p)), (t, C.send(x, p)), result=relay.Tuple([r, t]))
    ordered = C.OrderSendRecv()(module(recv_first, [x]))
    recv_token = ordered["main"].body.value.args[0]
    assert C.info(recv_token.args[0].fields[1]).kind == "send"  # the call: its variable is bound later
    run_both(ordered, x=np.ones(4, "float32"))
    assert [n for n, _ in mock_runtime] == ["send", "recv"] * 2  # the shared send still runs once


def test_let_form_send_moved_to_an_earlier_recv_takes_no_later_variable(mock_runtime):
    """r2 is bound before the send it waits for, so its token reads that send's call, which then runs
    at r2; the call must not carry the variable of the channel's first send, bound after r2 (TVM then
    stopped with an InternalError: not well formed). Such a chain gets calls for tokens, as before;
    one that no tokens can order is refused in one line."""
    x, x2, p = var((4,)), var((4,), name="x2"), [[0, 0]]
    r1, r2, t1, t2 = var((4,), name="r1"), var((4,), name="r2"), var((), "int32", "t1"), var((), "int32", "t2")
    body = _let_chain((r1, C.recv((4,), "float32", p)), (r2, C.recv((4,), "float32", p, token=relay.cast(relay.max(r1), "int32"))),
                      (t1, C.send(x, p)), (t2, C.send(x2, p)), result=relay.Tuple([r1, r2, t1, t2]))
    ordered = C.OrderSendRecv()(module(body, [x, x2]))
    assert relay.analysis.well_formed(ordered["main"])
    run_both(ordered, x=np.ones(4, "float32"), x2=np.ones(4, "float32"))
    assert [n for n, _ in mock_runtime] == ["send", "recv", "send", "recv"] * 2
    w, r0, t, ta = var((4,), name="w"), var((4,), name="r0"), var((), "int32", "t"), var((), "int32", "ta")
    late = _let_chain((r0, C.recv((4,), "float32", p, channel_id=1)), (w, relay.add(x, x)), (t, C.send(w, p)),
                      (ta, C.send(relay.add(C.recv((4,), "float32", p), x2), p, channel_id=1)), result=relay.Tuple([r0, t, ta]))
    with pytest.raises(SendRecvOrderError, match="^" + re.escape(
            "OrderSendRecv: in function 'main', a send must run before a recv or send bound ahead of it, and the "
            "tokens that order it read let variables bound after that; bind the sends of each channel before its "
            "recvs") + "$"):
        C.OrderSendRecv()(module(late, [x, x2]))


def test_ordering_errors():
    x = var((4,))
    p = [[0, 1]]
    y = C.recv((4,), "float32", p)
    self_cycle = module(C.send(y, p), [x])
    with pytest.raises(SendRecvOrderError, match=re.escape("the payload of send #0 on channel_id 0 depends on recv #0")):
        C.OrderSendRecv()(self_cycle)
    r1, r2 = C.recv((4,), "float32", p, channel_id=1), C.recv((4,), "float32", p, channel_id=1)
    s1, s2 = C.send(x, p, channel_id=1), C.send(x, p, channel_id=1)
    unordered = module(relay.Tuple([r1, r2, C.after_all(s1, s2)]), [x])
    with pytest.raises(SendRecvOrderError, match=re.escape("two recvs of channel_id 1 in function 'main' are not ordered")):
        C.OrderSendRecv()(unordered)
    mismatch = module(relay.Tuple([C.recv((4,), "int32", p), C.send(x, p)]), [x])
    with pytest.raises(SendRecvOrderError, match=re.escape("moves shape (4,) float32 but its recv expects shape (4,) int32")):
        C.OrderSendRecv()(mismatch)


def test_pairs_listed_in_another_order_are_the_same_pairs():
    x = var((4,))
    t = C.send(x, [[1, 0], [0, 1]])
    r = C.recv((4,), "float32", [[0, 1], [1, 0]], token=t)
    assert C.info(t).pairs == C.info(r).pairs == ((0, 1), (1, 0))
    C.OrderSendRecv()(module(relay.Tuple([r, t]), [x]))  # was: "name different source_target_pairs"


def _loop(step):
    i, acc = var((), "int32", "i"), var((4,), name="acc")
    return while_loop(lambda i, acc: relay.less(i, relay.const(2)), [i, acc], lambda i, acc: [relay.add(i, relay.const(1)), step(acc)])


def test_order_send_recv_beside_a_while_loop(mock_runtime):
    x = var((4,))
    plain = module(relay.TupleGetItem(_loop(lambda a: relay.add(a, a))(relay.const(0), x), 1), [x])
    assert C.OrderSendRecv()(plain).same_as(plain)
    p = [[0, 0]]
    y = C.recv((4,), "float32", p, channel_id=0)  # reached first by the post-order
    t = C.send(x, p, channel_id=0)
    mod = module(relay.Tuple([relay.TupleGetItem(_loop(lambda a: relay.add(a, a))(relay.const(0), x), 1), y, t]), [x])
    ordered = C.OrderSendRecv()(mod)
    assert ordered.astext().count("collectives.after_all(") == 1
    with tvm.transform.PassContext(opt_level=3):
        vm = relay.create_executor("vm", mod=ordered, target=TARGET, device=tvm.cpu()).evaluate()
    vm(x=np.ones(4, "float32"))
    assert [n for n, _ in mock_runtime] == ["send", "recv"]


def test_order_send_recv_refuses_transfers_it_cannot_order():
    x, c, q = var((4,)), var((), "bool", "c"), var((4,), name="q")
    p = [[0, 0]]

    def transfer(v, channel=0):
        return C.recv((4,), "float32", p, channel_id=channel, token=C.send(v, p, channel_id=channel))

    where = {
        "an if/else branch": relay.If(c, transfer(x), x),
        "a local function (a closure or a relay.loops.while_loop body)": relay.Call(relay.Function([q], transfer(q)), [x]),
    }
    loop = relay.TupleGetItem(_loop(transfer)(relay.const(0), x), 1)
    for what, body in [*where.items(), ("a local function (a closure or a relay.loops.while_loop body)", loop)]:
        mod = module(relay.Tuple([body, transfer(x, 1)]), [c, x])
        with pytest.raises(SendRecvOrderError, match="^" + re.escape(
                f"OrderSendRecv: function 'main' has a send or recv inside {what}, where it cannot be ordered; sends and "
                "recvs must be evaluated unconditionally in the function itself (move the transfer out, or the code "
                "into its own global function)") + "$"):
            C.OrderSendRecv()(mod)
    # let form: the send reads y, bound after the recv it must run before
    r, y, t = var((4,), name="r"), var((4,), name="y"), var((), "int32", "t")
    body = relay.Let(r, C.recv((4,), "float32", p), relay.Let(y, relay.add(x, x), relay.Let(t, C.send(y, p), relay.Tuple([r, t]))))
    with pytest.raises(SendRecvOrderError, match="^" + re.escape(
            "OrderSendRecv: in function 'main', a send on channel_id 0 reads let variable(s) y, bound where the recv "
            "it must run before cannot see them; bind the send first") + "$"):
        C.OrderSendRecv()(module(body, [x]))


# --------------------------------------------------------------------------- N ranks


@pytest.mark.parametrize("n", [2, 3, 4])
def test_every_op_on_n_ranks_relay(n, tmp_path):
    cmd = [
        sys.executable, "-m", "tvm_combiners.collectives.runtime.launcher", "-n", str(n), "--timeout", str(TIMEOUT_S),
        "--", sys.executable, "-m", "tvm_combiners.collectives.selfcheck", "--ir", "relay", "--out", str(tmp_path),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S + 30)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    check_relay_ranks(n, tmp_path)


def check_relay_ranks(n: int, tmp_path) -> None:
    """Every rank's selfcheck results (graph executor and VM) against numpy."""
    ins = [selfcheck.inputs(r) for r in range(n)]
    n_allreduce = sum(c.name.startswith("allreduce") for c in selfcheck.cases(n)) + 1
    for rank in range(n):
        got = np.load(tmp_path / f"rank{rank}.npz")
        assert int(got["_allreduce_calls"]) == 2 * n_allreduce  # graph executor and VM, the unused one included
        for name, ref in selfcheck.expected(n, rank).items():
            for suffix in ("", "@vm"):
                value = got[name + suffix]
                assert value.dtype == ref.dtype and value.shape == ref.shape, (rank, name + suffix)
                np.testing.assert_allclose(value, ref, rtol=1e-6, atol=1e-6, err_msg=f"rank {rank} {name}{suffix}")
        # independent spot checks
        np.testing.assert_allclose(got["allreduce_avg"], sum(x["f"] for x in ins) / n, rtol=1e-6)
        np.testing.assert_array_equal(got["ring_fwd@vm"], ins[(rank - 1) % n]["i"])
        partner = rank ^ 1
        np.testing.assert_array_equal(got["swap"], ins[partner]["f"] if partner < n else np.zeros((4, 6), "float32"))
        np.testing.assert_array_equal(got["two_hops@vm"], ins[(rank - 2) % n]["t"])
        for suffix in ("", "@vm"):
            check_bfloat16(got, ins, n, rank, suffix)


def test_order_send_recv_on_a_deep_graph():
    """6000 ops between the recv and the result: TVM's recursive Python ExprMutator stopped near 2500."""
    x, z = var((4,)), var((4,), name="z")
    p = [[0, 0]]

    def program(depth):
        e = C.recv((4,), "float32", p, channel_id=0)  # reached first by the post-order
        for _ in range(depth):
            e = relay.add(e, z)
        return module(relay.Tuple([e, C.send(x, p, channel_id=0)]), [x, z])

    shallow = C.OrderSendRecv()(program(0))["main"]
    recv, send = shallow.body.fields
    for _ in range(6000):
        recv = relay.add(recv, z)
    assert tvm.ir.structural_equal(C.OrderSendRecv()(program(6000))["main"].body, relay.Tuple([recv, send]))


# --------------------------------------------------------------------------- bfloat16


def test_bfloat16_reaches_the_runtime_as_uint16_words_in_both_executors():
    """TVM 0.16 labels a bfloat16 buffer float32 in call_packed (the runtime read past its end): every op
    hands the runtime uint16 words, reductions through the ``*_bfloat16_words`` functions."""
    import ml_dtypes

    names = ["allreduce_bfloat16_words", "reduce_scatter_bfloat16_words", "allgather", "send", "recv"]
    saved = {k: tvm.get_global_func("tvm_combiners." + k, allow_missing=True) for k in names}
    log: list[tuple[str, str]] = []

    def make(name):
        def f(*args):
            tensors = [a for a in args if isinstance(a, tvm.nd.NDArray)]
            log.append((name, ",".join(str(t.dtype) for t in tensors)))
            out = tensors[-1]
            if name != "send":  # the words of x, repeated: a result that shows the words came back as bfloat16
                src = tensors[0].numpy() if len(tensors) > 1 else np.full(out.shape, 0x3F80, "uint16")  # 1.0
                out.copyfrom(np.resize(src, tuple(out.shape)).astype(str(out.dtype)))

        return f

    for k in names:
        tvm.register_func("tvm_combiners." + k, make(k), override=True)
    try:
        x = var((2, 2), "bfloat16")
        tok = C.send(x, [[0, 0]], channel_id=1)
        outs = [C.allreduce(x, "avg"), C.reduce_scatter(x, "sum", 0, world_size=2), C.allgather(x, 1, world_size=1),
                C.recv((2, 2), "bfloat16", [[0, 0]], channel_id=1, token=tok)]
        mod = C.OrderSendRecv()(module(relay.Tuple(outs), [x]))
        data = np.array([[1.5, -2.0], [3.0, 0.25]], "float32").astype(ml_dtypes.bfloat16)
        graph, vm = run_both(mod, x=data)
    finally:
        for k, f in saved.items():
            if f is not None:
                tvm.register_func("tvm_combiners." + k, f, override=True)
    assert sorted(set(log)) == [("allgather", "uint16,uint16"), ("allreduce_bfloat16_words", "uint16,uint16"),
                                ("recv", "uint16"), ("reduce_scatter_bfloat16_words", "uint16,uint16"),
                                ("send", "uint16,int32")]
    words = data.view("uint16")
    for got in (graph, [v.numpy() for v in vm]):  # TVM 0.16's numpy(): a bfloat16 result's uint16 words
        np.testing.assert_array_equal(got[0], words)
        np.testing.assert_array_equal(got[1], words[:1])
        np.testing.assert_array_equal(got[2], words)
        np.testing.assert_array_equal(got[3], np.full((2, 2), 0x3F80, "uint16"))


def test_a_bfloat16_vector_dtype_is_refused_in_one_line():
    """bfloat16 with lanes (``bfloat16x4``) is no element MPI or NCCL can carry: refused when built."""
    with raises("allreduce: x has dtype bfloat16x4, which is not supported; expected one of "
                "int8, int16, int32, int64, uint8, uint16, uint32, uint64, float16, bfloat16, float32, float64"):
        C.allreduce(var((4,), "bfloat16x4"))
