"""Relax collective ops in one process: types, printing, structure, validation, side effects, ordering, compile."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import ir, relax

from tvm_combiners.collectives import relax as C
from tvm_combiners.collectives import spec as S
from tvm_combiners.collectives.ordering import SendRecvOrderError
from tvm_combiners.collectives.runtime import native

RUNTIME_NAMES = ["allreduce", "allgather", "reduce_scatter", "send", "recv"]


def tensor(shape, dtype="float32", name="x"):
    return relax.Var(name, relax.TensorType(shape, dtype))


def ty_of(call):
    return relax.BlockBuilder().normalize(call).ty


def raises(msg):
    return pytest.raises(S.CollectiveError, match="^" + re.escape(msg) + "$")


@pytest.fixture
def mock_runtime(monkeypatch):
    """Counting stand-ins for the runtime functions: a log of (name, non-tensor args)."""
    monkeypatch.setattr(native, "ENABLED", False)  # every allreduce through the mocked generic function
    log: list[tuple[str, tuple]] = []
    saved = {k: tvm.get_global_func("tvm_combiners." + k, allow_missing=True) for k in RUNTIME_NAMES}

    def make(name):
        def f(*args):
            log.append((name, tuple(a for a in args if isinstance(a, (str, int)))))
            out = args[-1]
            out.copyfrom(np.zeros(tuple(out.shape), str(out.dtype)))

        return f

    for k in RUNTIME_NAMES:
        tvm_ffi.register_global_func("tvm_combiners." + k, make(k), override=True)
    saved["agree_shapes"] = tvm.get_global_func("tvm_combiners.agree_shapes", allow_missing=True)
    tvm_ffi.register_global_func("tvm_combiners.agree_shapes", lambda x, kind, groups: log.append(("agree_shapes", (kind, groups))),
                                 override=True)
    yield log
    for k, f in saved.items():
        if f is not None:
            tvm_ffi.register_global_func("tvm_combiners." + k, f, override=True)


def build(body, params, pure=False):
    """A module whose main emits ``body(bb, *params)`` (a list of outputs) outside dataflow."""
    bb = relax.BlockBuilder()
    with bb.function("main", params, pure=pure):
        outs = body(bb, *params)
        bb.emit_func_output(relax.Tuple(outs) if isinstance(outs, list) else outs)
    return bb.get()


def run(mod, *arrays, target="llvm"):
    tgt = tvm.target.Target({"kind": "llvm"}) if target == "llvm" else target
    ex = tvm.compile(mod, target=tgt, relax_pipeline=C.pipeline(tgt))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm["main"](*(tvm.runtime.tensor(a) for a in arrays))


def count_ops(mod, kind):
    n = [0]

    def visit(e):
        if C.is_collective(e, [kind]):
            n[0] += 1

    relax.analysis.post_order_visit(mod["main"], visit)
    return n[0]


# --------------------------------------------------------------------------- types


@pytest.mark.parametrize(
    "make, shape, dtype",
    [
        (lambda x: C.allreduce(x, "max"), (4, 6), "float32"),
        (lambda x: C.allgather(x, axis=1, group=[[0, 1, 2]]), (4, 18), "float32"),
        (lambda x: C.allgather(x, axis=-2, world_size=2), (8, 6), "float32"),
        (lambda x: C.reduce_scatter(x, "sum", axis=0, group=[[0, 1], [2, 3]]), (2, 6), "float32"),
        (lambda x: C.reduce_scatter(x, "avg", axis=1, world_size=3), (4, 2), "float32"),
        (lambda x: C.send(x, [[0, 1]]), (), "int32"),
        (lambda x: C.recv((3, 5), "int64", [[1, 0]], channel_id=7), (3, 5), "int64"),
        (lambda x: C.after_all(C.token(), C.token()), (), "int32"),
        (lambda x: C.after_all(), (), "int32"),
    ],
)
def test_result_types(make, shape, dtype):
    ty = ty_of(make(tensor((4, 6))))
    assert isinstance(ty, relax.TensorType)
    assert [int(d) for d in ty.shape.values] == list(shape)
    assert str(ty.dtype) == dtype


def test_symbolic_dims_off_the_axis_are_kept():
    n = tvm.tirx.Var("n", "int64")
    x = tensor((n, 8))
    ty = ty_of(C.allgather(x, axis=1, group=[[0, 1]]))
    assert ty.shape.values[0].same_as(n) and int(ty.shape.values[1]) == 16
    assert ty_of(C.allreduce(x)).shape.values[0].same_as(n)


def test_info_reads_back_every_attribute():
    x = tensor((4, 6))
    spec = C.info(C.reduce_scatter(x, "min", axis=-1, group=[[3, 1], [0, 2]]))
    assert spec == S.CollectiveSpec("reduce_scatter", op="min", axis=1, groups=((0, 2), (3, 1)))
    assert spec.group_size == 2 and spec.impure
    r = C.info(C.recv((2,), "int8", [[0, 1], [1, 0]], channel_id=3, is_host_transfer=True))
    assert (r.kind, r.pairs, r.channel_id, r.is_host_transfer, r.shape, r.dtype) == (
        "recv", ((0, 1), (1, 0)), 3, True, (2,), "int8")
    assert C.info(C.allreduce(x)).groups is None and C.info(C.allreduce(x)).group_size is None
    assert C.info(C.allreduce(x, world_size=3)).groups == ((0, 1, 2),)
    assert C.info(relax.op.add(x, x)) is None
    assert not C.is_collective(C.token())


# --------------------------------------------------------------------------- printing and structure


def test_prints_as_named_ops_with_attributes():
    x = tensor((4, 6))

    def body(bb, x):
        t = bb.emit(C.send(x, [[0, 1], [1, 0]], channel_id=2))
        y = bb.emit(C.recv((4, 6), "float32", [[0, 1], [1, 0]], channel_id=2, token=t))
        return [bb.emit(C.allreduce(y, "avg", group=[[1, 0]])), bb.emit(C.after_all(t))]

    text = build(body, [x]).script()
    assert 'R.collectives.allreduce(gv1, groups="1,0", op="avg")' in text
    assert 'R.collectives.send(x, R.const(0, "int32"), channel_id=2, is_host_transfer=False, source_target_pairs="0,1;1,0")' in text
    assert 'R.collectives.recv(gv, channel_id=2, dtype="float32", is_host_transfer=False, shape=[4, 6], ' in text
    assert "R.collectives.after_all((gv,))" in text


def test_structural_equality_and_hash():
    x = tensor((4, 6))
    a, b = C.allreduce(x, "sum", group=[[0, 1]]), C.allreduce(x, "sum", group=[[0, 1]])
    assert tvm_ffi.structural_equal(a, b) and tvm_ffi.structural_hash(a) == tvm_ffi.structural_hash(b)
    for other in (C.allreduce(x, "max", group=[[0, 1]]), C.allreduce(x, "sum", group=[[1, 0]]), C.allreduce(x, "sum")):
        assert not tvm_ffi.structural_equal(a, other)
        assert tvm_ffi.structural_hash(a) != tvm_ffi.structural_hash(other)
    s1, s2 = C.send(x, [[0, 1]], channel_id=1), C.send(x, [[0, 1]], channel_id=2)
    assert not tvm_ffi.structural_equal(s1, s2)
    assert tvm_ffi.structural_equal(C.send(x, [[0, 1]], channel_id=1), s1)
    # the order of groups is canonical (by smallest rank), the order inside a group is kept
    assert tvm_ffi.structural_equal(C.allgather(x, group=[[1, 3], [0, 2]]), C.allgather(x, group=[[0, 2], [1, 3]]))


def test_registration_is_idempotent():
    # what a second import runs (reloading the module itself replaced its classes for every later test:
    # OrderSendRecv then left a module unordered in test_dependences_relax)
    from tvm_combiners.collectives.relax import ops

    ops._register()
    ops._register()
    ty = ty_of(C.allreduce(tensor((2,))))
    assert [int(d) for d in ty.shape.values] == [2]
    for kind in S.KINDS:
        op = ir.Op.get(S.relax_op_name(kind))
        assert op.get_attr("FPurity") == (kind not in S.IMPURE_KINDS)


# --------------------------------------------------------------------------- validation

X = tensor((4, 6), name="x")
XI = tensor((4, 6), "int32", name="xi")
TOK = tensor((), "int32", name="tok")
NOT_TOKEN = tensor((2,), "int32", name="nt")

VALIDATION = [
    (lambda: C.allreduce(X, "mean"), "allreduce: op 'mean' is not a reduction; expected one of sum, prod, min, max, avg"),
    (lambda: C.allreduce(XI, "avg"), "allreduce: op 'avg' needs a floating-point dtype, got int32 (an integer mean would truncate)"),
    (lambda: C.reduce_scatter(XI, "avg", group=[[0, 1]]),
     "reduce_scatter: op 'avg' needs a floating-point dtype, got int32 (an integer mean would truncate)"),
    (lambda: C.allreduce(tensor((2,), "bool")),
     "allreduce: x has dtype bool, which is not supported; expected one of "
     "int8, int16, int32, int64, uint8, uint16, uint32, uint64, float16, bfloat16, float32, float64"),
    (lambda: C.allgather(X, axis=2, group=[[0, 1]]), "allgather: axis 2 is out of range for a 2-d operand; expected -2 <= axis < 2"),
    (lambda: C.reduce_scatter(X, axis=-3, group=[[0, 1]]),
     "reduce_scatter: axis -3 is out of range for a 2-d operand; expected -2 <= axis < 2"),
    (lambda: C.allgather(X, axis=1.0, group=[[0]]), "allgather: axis must be an integer, got 1.0"),
    (lambda: C.reduce_scatter(X, axis=0, group=[[0, 1, 2]]),
     "reduce_scatter: axis 0 has extent 4, which is not divisible by the group size 3"),
    (lambda: C.allgather(X), "allgather: group=None leaves the group size unknown at compile time; pass group=[[...]] or world_size=N"),
    (lambda: C.reduce_scatter(X),
     "reduce_scatter: group=None leaves the group size unknown at compile time; pass group=[[...]] or world_size=N"),
    (lambda: C.allgather(tensor((tvm.tirx.Var("n", "int64"), 2)), group=[[0, 1]]),
     "allgather: axis 0 has the symbolic extent n; the gathered axis must be static"),
    (lambda: C.allreduce(X, world_size=0), "allreduce: world_size must be a positive integer, got 0"),
    (lambda: C.allreduce(X, group=[[0, 1]], world_size=4), "allreduce: world_size 4 disagrees with group, which covers 2 ranks"),
    (lambda: C.allreduce(X, group=[0, 1]), "allreduce: group 0 must be a list of ranks, got 0"),
    (lambda: C.allreduce(X, group="0,1"), "allreduce: group must be a list of lists of ranks, got '0,1'"),
    (lambda: C.allreduce(X, group=[]), "allreduce: group must hold at least one group of ranks, got []"),
    (lambda: C.allreduce(X, group=[[0], []]), "allreduce: group 1 is empty; every group needs at least one rank"),
    (lambda: C.allreduce(X, group=[[0, -1]]), "allreduce: group 0 holds -1; ranks must be integers >= 0"),
    (lambda: C.allreduce(X, group=[[0, 1], [1, 2]]),
     "allreduce: group rank 1 appears in groups 0 and 1; every rank must be in exactly one group"),
    (lambda: C.allreduce(X, group=[[0, 0]]), "allreduce: group rank 0 appears twice in group 0; every rank must be in exactly one group"),
    (lambda: C.allgather(X, group=[[0, 1], [2]]),
     "allgather: group sizes differ (2 ranks in group 0, 1 in group 1); every group must have the same number of ranks"),
    (lambda: C.allreduce(X, group=[[0, 3], [1, 4]]),
     "allreduce: group does not cover ranks 0..3 (missing 2); every rank must be in exactly one group"),
    (lambda: C.send(X, [[0, 1, 2]]), "send: source_target_pairs entry 0 is [0, 1, 2]; each entry must be a [source, target] pair (C1)"),
    (lambda: C.recv((2,), "float32", [[0, 1], 3]), "recv: source_target_pairs entry 1 is 3; each entry must be a [source, target] pair (C1)"),
    (lambda: C.send(X, [[0, 1], [0, 2]]), "send: source_target_pairs source 0 appears more than once; sources must be unique (C2)"),
    (lambda: C.recv((2,), "float32", [[0, 2], [1, 2]]),
     "recv: source_target_pairs target 2 appears more than once; targets must be unique (C3)"),
    (lambda: C.send(X, [[0, -1]]),
     "send: source_target_pairs entry 0 holds -1; ranks must be integers >= 0 "
     "(C4: the upper bound, the number of ranks, is checked at run time)"),
    (lambda: C.send(X, "0,1"), "send: source_target_pairs must be a list of [source, target] pairs, got '0,1'"),
    (lambda: C.send(X, [[0, 1]], is_host_transfer=1),
     "send: is_host_transfer must be a bool, got 1 (C5: it selects the channel type, DEVICE_TO_HOST when true, "
     "DEVICE_TO_DEVICE otherwise)"),
    (lambda: C.recv((2,), "float32", [[0, 1]], channel_id=-1),
     "recv: channel_id must be an integer in [0, 32767] (MPI's guaranteed tag range), got -1"),
    (lambda: C.send(X, [[0, 1]], channel_id=40000),
     "send: channel_id must be an integer in [0, 32767] (MPI's guaranteed tag range), got 40000"),
    (lambda: C.recv((2, -1), "float32", [[0, 1]]), "recv: shape must be a list of integers >= 0, got (2, -1)"),
    (lambda: C.recv((2,), "complex64", [[0, 1]]),
     "recv: dtype complex64 is not supported; expected one of "
     "int8, int16, int32, int64, uint8, uint16, uint32, uint64, float16, bfloat16, float32, float64"),
    (lambda: C.recv((2,), None, [[0, 1]]), "recv: dtype must be a string such as 'float32', got None"),
    (lambda: C.send(X, [[0, 1]], token=NOT_TOKEN),
     "send: token must be a token (a 0-d int32 tensor), got a tensor of shape (2,) and dtype int32"),
    (lambda: C.recv((2,), "float32", [[0, 1]], token=X),
     "recv: token must be a token (a 0-d int32 tensor), got a tensor of shape (4, 6) and dtype float32"),
    (lambda: C.recv((2,), "float32", [[0, 1]], token=3), "recv: token must be a token (a 0-d int32 tensor), got 3"),
    (lambda: C.after_all(TOK, X), "after_all: argument 1 must be a token (a 0-d int32 tensor), got a tensor of shape (4, 6) and dtype float32"),
    (lambda: C.allreduce(relax.Var("o", relax.ObjectType())), "allreduce: x must be a tensor of known rank, got R.Any"),
    (lambda: C.allreduce(np.zeros(3)), "allreduce: x must be a Relax expression holding a tensor, got array([0., 0., 0.])"),
]


@pytest.mark.parametrize("make, msg", VALIDATION, ids=[m[:60] for _, m in VALIDATION])
def test_validation_messages(make, msg):
    with raises(msg):
        make()


def test_nothing_is_half_built():
    x = tensor((4, 6))

    def body(bb, x):
        y = bb.emit(C.allreduce(x))
        with raises("allgather: axis 5 is out of range for a 2-d operand; expected -2 <= axis < 2"):
            bb.emit(C.allgather(y, axis=5, group=[[0, 1]]))
        return [y]

    mod = build(body, [x])
    assert count_ops(mod, "allreduce") == 1 and count_ops(mod, "allgather") == 0
    assert len(mod["main"].body.blocks[0].bindings) == 1


def test_impure_ops_stay_out_of_dataflow_blocks():
    bb = relax.BlockBuilder()
    x = tensor((4,))
    with pytest.raises(Exception, match="impure"):
        with bb.function("main", [x]):
            with bb.dataflow():
                y = bb.emit(C.allreduce(x))
                gv = bb.emit_output(y)
            bb.emit_func_output(gv)
        relax.analysis.well_formed(bb.get())


# --------------------------------------------------------------------------- side effects survive TVM's passes


def test_unused_and_identical_allreduces_survive_dce_cse_and_run(mock_runtime):
    x = tensor((4,))

    def body(bb, x):
        bb.emit(C.allreduce(x, "sum"))  # unused
        a = bb.emit(C.allreduce(x, "max"))
        b = bb.emit(C.allreduce(x, "max"))  # identical to a
        bb.emit(C.send(x, [[0, 1]]))  # token unused
        return [a, b, bb.emit(C.recv((4,), "float32", [[0, 1]]))]

    mod = build(body, [x])
    opt = tvm.transform.Sequential(
        [relax.transform.DeadCodeElimination(), relax.transform.EliminateCommonSubexpr(), relax.transform.FuseOps()]
    )(mod)
    assert count_ops(opt, "allreduce") == 3 and count_ops(opt, "send") == 1
    run(opt, np.ones(4, "float32"))
    assert [name for name, _ in mock_runtime] == ["allreduce", "allreduce", "allreduce", "send", "recv"]
    assert mock_runtime[0][1] == ("sum", "") and mock_runtime[1][1] == ("max", "")
    assert mock_runtime[3][1] == ("0,1", 0, 0)


def test_lowering_passes_the_contract_arguments(mock_runtime):
    x = tensor((4, 6))

    def body(bb, x):
        return [
            bb.emit(C.allgather(x, axis=-1, group=[[1, 0]])),
            bb.emit(C.reduce_scatter(x, "min", axis=0, group=[[0, 1], [2, 3]])),
            bb.emit(C.recv((3,), "int32", [[0, 1]], channel_id=4, is_host_transfer=True)),
            bb.emit(C.send(relax.const(np.zeros(3, "int32")), [[0, 1]], channel_id=4, is_host_transfer=True)),
        ]

    outs = run(build(body, [x]), np.ones((4, 6), "float32"))
    assert mock_runtime == [
        ("allgather", (1, "1,0")),
        ("reduce_scatter", ("min", 0, "0,1;2,3")),
        ("send", ("0,1", 4, 1)),
        ("recv", ("0,1", 4, 1)),
    ]
    assert outs[0].numpy().shape == (4, 12) and outs[1].numpy().shape == (2, 6) and outs[2].numpy().dtype == np.int32


def test_symbolic_shapes_compile_and_run(mock_runtime):
    n = tvm.tirx.Var("n", "int64")
    x = tensor((n, 3))

    def body(bb, x):
        return [bb.emit(C.allreduce(x, "min")), bb.emit(C.allgather(x, axis=1, world_size=2))]

    outs = run(build(body, [x]), np.ones((5, 3), "float32"))
    assert outs[0].numpy().shape == (5, 3) and outs[1].numpy().shape == (5, 6)
    # a run-time shape is compared across the group first: MPI would not notice ranks that disagree
    assert mock_runtime == [("agree_shapes", ("allreduce", "")), ("allreduce", ("min", "")),
                            ("agree_shapes", ("allgather", "0,1")), ("allgather", (1, "0,1"))]
    static = run(build(body, [tensor((5, 3))]), np.ones((5, 3), "float32"))
    assert static[1].numpy().shape == (5, 6) and [name for name, _ in mock_runtime[4:]] == ["allreduce", "allgather"]


def test_a_send_of_symbolic_shape_compares_no_shapes(mock_runtime):
    """Only a send's source gives a payload, so the ranks' send operands may differ in shape."""
    k = tvm.tirx.Var("k", "int64")

    def body(bb, x):
        token = bb.emit(C.send(x, [[0, 0]]))
        return [bb.emit(C.recv((4,), "float32", [[0, 0]], token=token))]

    run(build(body, [tensor((k,))]), np.ones(4, "float32"))
    assert [name for name, _ in mock_runtime] == ["send", "recv"]


def test_unknown_extents(mock_runtime):
    x = relax.Var("x", relax.TensorType(None, "float32", ndim=2))
    ty = ty_of(C.allreduce(x))
    assert ty.ndim == 2 and ty.shape is None
    with raises("allgather: axis 0 has the symbolic extent ?; the gathered axis must be static"):
        C.allgather(x, world_size=2)
    outs = run(build(lambda bb, x: [bb.emit(C.allreduce(x, "prod"))], [x]), np.ones((2, 7), "float32"))
    assert outs[0].numpy().shape == (2, 7) and [n for n, _ in mock_runtime] == ["agree_shapes", "allreduce"]


# --------------------------------------------------------------------------- OrderSendRecv


def names_in_order(mod):
    out = []
    for block in mod["main"].body.blocks:
        for b in block.bindings:
            spec = C.info(b.value)
            if spec is not None and spec.kind != "after_all":
                out.append(f"{spec.kind}{spec.channel_id if spec.channel_id is not None else ''}")
    return out


def test_sends_move_before_their_recvs(mock_runtime):
    x = tensor((4,))
    pairs = [[0, 1], [1, 0]]

    def body(bb, x):
        y0 = bb.emit(C.recv((4,), "float32", pairs, channel_id=0))
        y1 = bb.emit(C.recv((4,), "float32", pairs, channel_id=1))
        a = bb.emit(C.allreduce(y0))
        t1 = bb.emit(C.send(x, pairs, channel_id=1))
        t0 = bb.emit(C.send(relax.op.add(x, x), pairs, channel_id=0))
        return [a, y1, bb.emit(C.after_all(t0, t1))]

    mod = build(body, [x])
    assert names_in_order(mod) == ["recv0", "recv1", "allreduce", "send1", "send0"]
    ordered = C.OrderSendRecv()(mod)
    assert names_in_order(ordered) == ["send0", "recv0", "send1", "recv1", "allreduce"]
    assert C.OrderSendRecv()(ordered).same_as(ordered)  # already ordered: unchanged
    with pytest.raises(SendRecvOrderError, match=re.escape("OrderSendRecv: function 'main' runs a recv before the send")):
        tvm.compile(mod, target="llvm")  # legalization refuses the unordered module
    run(mod, np.ones(4, "float32"))  # the pipeline orders it
    assert [n for n, _ in mock_runtime] == ["send", "recv", "send", "recv", "allreduce"]
    assert [args[1] for _, args in mock_runtime[:4]] == [0, 0, 1, 1]


def test_dataflow_blocks_move_as_a_unit():
    x = tensor((4,))
    pairs = [[0, 1]]
    bb = relax.BlockBuilder()
    with bb.function("main", [x], pure=False):
        y = bb.emit(C.recv((4,), "float32", pairs))
        with bb.dataflow():
            z = bb.emit(relax.op.multiply(x, x))
            w = bb.emit_output(relax.op.add(z, x))
        t = bb.emit(C.send(w, pairs))
        bb.emit_func_output(relax.Tuple([y, t]))
    ordered = C.OrderSendRecv()(bb.get())
    blocks = ordered["main"].body.blocks
    assert isinstance(blocks[0], relax.DataflowBlock) and len(blocks[0].bindings) == 2
    assert names_in_order(ordered) == ["send0", "recv0"]
    relax.analysis.well_formed(ordered)


@pytest.mark.parametrize("kind", ["recv", "allreduce"])
def test_collectives_in_a_dataflow_block_are_refused(kind):
    """Review: a recv before its send inside a dataflow block (ill-formed, yet TVM compiles it) escaped
    both ordering checks, and every rank waited out the recv timeout."""
    x = tensor((4,))
    pairs = [[0, 1], [1, 0]]
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(C.recv((4,), "float32", pairs) if kind == "recv" else C.allreduce(x))
            t = bb.emit(C.send(x, pairs))
            out = bb.emit_output(relax.Tuple([y, t]))
        bb.emit_func_output(out)
    _assert_refused_in_dataflow(bb.get(), kind, "function 'main'")


def _assert_refused_in_dataflow(mod, kind, where):
    """OrderSendRecv refuses the module, and so does legalization without it; returns the message."""
    msg = (f"{kind} in a dataflow block of {where}: collectives are impure and must run once, in program "
           "order, on every rank; emit them outside dataflow blocks, in a function built with pure=False")
    with raises(msg):
        C.OrderSendRecv()(mod)
    with pytest.raises(Exception, match=re.escape(msg)):
        tvm.compile(mod, target="llvm")  # legalization's check, without the ordering pass
    return msg


@pytest.mark.parametrize("place", ["if", "closure"])
def test_collectives_in_a_nested_dataflow_block_are_refused(place):
    """An allreduce in a dataflow block of an if/else branch (or a local function) compiled."""
    x = tensor((4,))
    z = tensor((4,), name="z")
    inner = relax.SeqExpr([relax.DataflowBlock([relax.VarBinding(z, C.allreduce(x))])], z)
    bb = relax.BlockBuilder()
    if place == "if":
        c = relax.Var("c", relax.TensorType((), "bool"))
        with bb.function("main", [x, c], pure=False):
            bb.emit_func_output(bb.emit(relax.If(c, inner, relax.SeqExpr([], x))))
        where = "an if/else branch in function 'main'"
    else:
        with bb.function("main", [x], pure=False):
            f = bb.emit(relax.Function([], inner, relax.TensorType((4,), "float32"), is_pure=False))
            bb.emit_func_output(bb.emit(relax.Call(f, [])))
        where = "a local function in function 'main'"
    msg = _assert_refused_in_dataflow(bb.get(), "allreduce", where)
    if place == "if":  # the If as the body's result, before normalization (review: OrderSendRecv took it)
        raw = tvm.IRModule({"main": relax.Function([x, c], relax.SeqExpr([], relax.If(c, inner, relax.SeqExpr([], x))),
                                                   relax.TensorType((4,), "float32"), is_pure=False)})
        with raises(msg):
            C.OrderSendRecv()(raw)


def test_channel_reused_in_order_is_accepted():
    x = tensor((4,))
    ring = [[0, 1], [1, 0]]

    def body(bb, x):
        y1 = bb.emit(C.recv((4,), "float32", ring))
        bb.emit(C.send(x, ring))
        t2 = bb.emit(C.send(y1, ring))
        return [bb.emit(C.recv((4,), "float32", ring, token=t2))]

    ordered = C.OrderSendRecv()(build(body, [x]))
    assert names_in_order(ordered) == ["send0", "recv0", "send0", "recv0"]


def test_pairs_listed_in_another_order_are_the_same_pairs():
    """Review: a send on [[0, 1], [1, 0]] and its recv on [[1, 0], [0, 1]] were refused as naming
    different source_target_pairs; pairs are a set (C2/C3 make each source and target unique)."""
    x = tensor((4,))

    def body(bb, x):
        t = bb.emit(C.send(x, [[1, 0], [0, 1]]))
        return [bb.emit(C.recv((4,), "float32", [[0, 1], [1, 0]], token=t))]

    mod = build(body, [x])
    specs = [C.info(b.value) for b in mod["main"].body.blocks[0].bindings]
    assert [s.pairs for s in specs] == [((0, 1), (1, 0))] * 2
    assert names_in_order(C.OrderSendRecv()(mod)) == ["send0", "recv0"]


@pytest.mark.parametrize(
    "case, msg",
    [
        ("self", "OrderSendRecv: in function 'main', the payload of send #0 on channel_id 0 depends on recv #0 of the same "
                 "channel, which cannot complete before that send: every rank would wait forever"),
        ("cross", "OrderSendRecv: in function 'main', sends and recvs on channel_id(s) 0, 1 form a cycle (a send's payload "
                  "needs a recv whose own send needs it): every rank would wait forever"),
        ("count", "OrderSendRecv: channel_id 0 in function 'main' has 1 send(s) and 2 recv(s); every send needs one recv of "
                  "the same channel in the same function (the k-th send of a channel is matched with its k-th recv)"),
        ("pairs", "OrderSendRecv: send #0 and recv #0 of channel_id 0 in function 'main' name different source_target_pairs "
                  "('0,1' vs '1,0'); a send and its recv must name the same pairs"),
        ("payload", "OrderSendRecv: send #0 of channel_id 0 in function 'main' moves shape (4,) float32 but its recv expects "
                    "shape (5,) float32"),
    ],
)
def test_ordering_errors(case, msg):
    x = tensor((4,))
    p = [[0, 1]]

    def body(bb, x):
        if case == "self":
            y = bb.emit(C.recv((4,), "float32", p))
            return [bb.emit(C.send(y, p))]
        if case == "cross":
            a = bb.emit(C.recv((4,), "float32", p, channel_id=0))
            b = bb.emit(C.recv((4,), "float32", p, channel_id=1))
            return [bb.emit(C.send(a, p, channel_id=1)), bb.emit(C.send(b, p, channel_id=0))]
        if case == "count":
            return [bb.emit(C.send(x, p)), bb.emit(C.recv((4,), "float32", p)), bb.emit(C.recv((4,), "float32", p))]
        if case == "pairs":
            return [bb.emit(C.send(x, p)), bb.emit(C.recv((4,), "float32", [[1, 0]]))]
        return [bb.emit(C.send(x, p)), bb.emit(C.recv((5,), "float32", p))]

    mod = build(body, [x])
    with pytest.raises(SendRecvOrderError, match="^" + re.escape(msg) + "$"):
        C.OrderSendRecv()(mod)


@pytest.mark.parametrize("recv_shape, recv_dtype, msg", [
    ((4,), "int32", "moves shape (?,) float32 but its recv expects shape (4,) int32"),
    ((8,), "float16", "moves shape (?,) float32 but its recv expects shape (8,) float16"),
    ((2, 2), "float32", "moves shape (?,) float32 but its recv expects shape (2, 2) float32"),
])
def test_a_send_of_symbolic_shape_is_still_checked_against_its_recv(recv_shape, recv_dtype, msg):
    """A symbolic extent dropped the whole check, dtype and rank with it: 1.5 sent as float32 came out
    as the int 1069547520 (review). Only the extent itself waits for the run (the recv's byte count)."""
    n = tvm.tirx.Var("n", "int64")
    x = tensor((n,))
    p = [[0, 1]]
    mod = build(lambda bb, x: [bb.emit(C.send(x, p)), bb.emit(C.recv(recv_shape, recv_dtype, p))], [x])
    with pytest.raises(SendRecvOrderError, match=re.escape(msg)):
        C.OrderSendRecv()(mod)
    fits = build(lambda bb, x: [bb.emit(C.send(x, p)), bb.emit(C.recv((4,), "float32", p))], [x])
    C.OrderSendRecv()(fits)  # the extent may be 4 at run time: accepted


# --------------------------------------------------------------------------- compile


def every_op_module():
    x = tensor((4, 6))

    def body(bb, x):
        p = [[0, 1], [1, 0]]
        y = bb.emit(C.recv((4, 6), "float32", p))
        outs = [bb.emit(C.allreduce(x, op)) for op in S.REDUCTIONS]
        outs.append(bb.emit(C.allgather(x, axis=1, world_size=2)))
        outs.append(bb.emit(C.reduce_scatter(relax.op.add(x, x), "sum", axis=0, group=[[0, 1]])))
        t = bb.emit(C.send(x, p))
        return [y, *outs, bb.emit(C.after_all(t))]

    return build(body, [x])


@pytest.mark.parametrize("kind", ["llvm", "cuda"])
def test_compiles_with_the_default_pipeline(kind):
    if kind == "llvm":
        target = tvm.target.Target({"kind": "llvm"})
    else:
        target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"}, host="llvm")
    mod = C.OrderSendRecv()(every_op_module())
    ex = tvm.compile(mod, target=target)  # TVM's own default pipeline
    assert isinstance(ex, relax.VMExecutable)
    with target:
        lowered = relax.get_default_pipeline(target)(mod)
    text = lowered["main"].script()
    for name in RUNTIME_NAMES:  # llvm: host collectives call the native kernels
        runtime = "tvm_combiners.native" if kind == "llvm" else "tvm_combiners"
        assert f'R.call_packed("{runtime}.{name}"' in text or name == "allreduce"
    generic, fast = (text.count(f'R.call_packed("{name}"') for name in ("tvm_combiners.allreduce", native.NAME))
    assert generic + fast == len(S.REDUCTIONS)
    # every allreduce is over all ranks here; float min and max stay generic (MPI's may drop a NaN)
    assert fast == (0 if kind == "cuda" else len(set(S.REDUCTIONS) - {"min", "max"}))


def test_allreduces_over_all_ranks_on_cpu_call_the_native_kernel(monkeypatch):
    x = tensor((2, 3))
    mod = build(lambda bb, x: [bb.emit(C.allreduce(x, "avg")), bb.emit(C.allreduce(x, "sum", group=[[0]])),
                               bb.emit(C.allreduce(bb.emit(relax.op.astype(x, "float16")), "max"))], [x])
    with tvm.target.Target("llvm"):
        text = relax.transform.LegalizeOps()(mod)["main"].script()
    # float32: native, with (count, dtype code, op code), and a group's key and text; float16: the generic function
    assert re.search(rf'R.call_packed\("{native.NAME}", x, \w+, 6, 8, 4, ', text)
    assert re.search(rf'R.call_packed\("{native.NAMES["allreduce_group"]}", x, \w+, 6, 8, 0, {native.group_key("0")}, ',
                     text)
    assert text.count('R.call_packed("tvm_combiners.allreduce"') == 1
    monkeypatch.setattr(native, "ENABLED", False)
    with tvm.target.Target("llvm"):
        text = relax.transform.LegalizeOps()(mod)["main"].script()
    assert native.NAME not in text and text.count('R.call_packed("tvm_combiners.allreduce"') == 3


def test_numpy_integers_are_ranks():
    x = tensor((4, 6))
    spec = C.info(C.allgather(x, np.int64(1), group=np.array([[1, 0]])))
    assert spec.axis == 1 and spec.groups == ((1, 0),)
    assert C.info(C.send(x, np.array([[0, 1]]), channel_id=np.int32(3))).channel_id == 3


def test_sends_inside_branches_are_refused():
    x = tensor((4,))
    cond = relax.Var("c", relax.TensorType((), "bool"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, cond], pure=False):
        t = relax.Var("t", relax.TensorType((), "int32"))
        branch = relax.SeqExpr([relax.BindingBlock([relax.VarBinding(t, C.send(x, [[0, 1]]))])], t)
        y = bb.emit(relax.If(cond, branch, C.token()))
        r = bb.emit(C.recv((4,), "float32", [[0, 1]]))
        bb.emit_func_output(relax.Tuple([y, r]))
    with pytest.raises(SendRecvOrderError, match=re.escape("function 'main' has a send or recv inside an if/else branch")):
        C.OrderSendRecv()(bb.get())


def test_sends_inside_closures_are_refused_as_closures():
    """Review: a local function that sends and receives was refused as 'an if/else branch'."""
    z, x = tensor((4,), name="z"), tensor((4,))
    inner = relax.BlockBuilder()
    with inner.function("g", [z], pure=False):
        t = inner.emit(C.send(z, [[0, 0]]))
        inner.emit_func_output(inner.emit(C.recv((4,), "float32", [[0, 0]], token=t)))
    closure = inner.get()["g"].without_attr("global_symbol")

    def body(bb, x):
        t0 = bb.emit(C.send(x, [[0, 0]]))
        g = bb.emit(closure)
        return [bb.emit(relax.Call(g, [x])), bb.emit(C.recv((4,), "float32", [[0, 0]], token=t0))]

    with pytest.raises(SendRecvOrderError, match=re.escape("function 'main' has a send or recv inside a local "
                                                           "function (a closure); sends and recvs must be top-level")):
        C.OrderSendRecv()(build(body, [x]))


def test_ordering_core_moves_sends_up_and_keeps_effects_in_order():
    from tvm_combiners.collectives.ordering import OrderNode, plan_send_recv_order

    p = ((0, 1),)
    nodes = [
        OrderNode("effect"),  # 0
        OrderNode("recv", (), 0, p),  # 1
        OrderNode("other", (1,)),  # 2 reads the recv
        OrderNode("effect", ()),  # 3
        OrderNode("other"),  # 4
        OrderNode("send", (4,), 0, p),  # 5 needs 4 only
    ]
    plan = plan_send_recv_order(nodes, "test")
    assert plan.order == [0, 4, 5, 1, 2, 3] and plan.matches == [(5, 1)] and plan.changed
    # Relay-style: sends matched in `seq` order, not index order
    nodes = [
        OrderNode("recv", (), 0, p, seq=(0, 0)),  # 0
        OrderNode("send", (0,), 0, p, seq=(1, 1)),  # 1 forwards recv 0
        OrderNode("recv", (1,), 0, p, seq=(1, 2)),  # 2
        OrderNode("send", (), 0, p, seq=(0, 3)),  # 3 first transfer
    ]
    plan = plan_send_recv_order(nodes, "test")
    assert plan.matches == [(3, 0), (1, 2)] and plan.chains == [(3, 1), (0, 2)]
    assert plan.order == [3, 0, 1, 2]


def test_a_natively_compiled_module_runs_before_the_kernel_exists_in_this_process(monkeypatch):
    # a module compiled elsewhere: the name is first served by the generic path, which builds the kernel
    x = tensor((2, 3), "int32")
    mod = build(lambda bb, x: bb.emit(C.allreduce(x, "max")), [x])
    ex = tvm.compile(mod, target="llvm", relax_pipeline=C.pipeline("llvm"))
    assert native.prepare()
    monkeypatch.setattr(native, "_kernel", None)
    native.register_fallback()
    data = np.arange(6, dtype="int32").reshape(2, 3)
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(data))
    np.testing.assert_array_equal(out.numpy(), data)  # one rank: the maximum over ranks is x
    assert native._kernel is not None  # built on that first call, registered for VMs created later
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(data + 1))
    np.testing.assert_array_equal(out.numpy(), data + 1)


@pytest.mark.parametrize("kind, attrs, msg", [
    ("allreduce", {"op": "foo", "groups": ""}, "allreduce: op 'foo' is not a reduction"),
    ("allreduce", {"op": "sum", "groups": "0;1,2"}, "allreduce: group sizes differ"),
    ("allreduce", {"op": "sum", "groups": "a"}, "allreduce: attribute groups 'a' is not in its encoding"),
    ("allreduce", {"op": "sum"}, "allreduce: attribute 'groups' is missing"),
    ("allgather", {"axis": 0, "groups": ""}, "allgather: groups is empty (all ranks), and the group size is needed"),
    ("send", {"source_target_pairs": "0,1;0,1", "channel_id": 0, "is_host_transfer": False},
     "send: source_target_pairs source 0 appears more than once"),
    ("send", {"source_target_pairs": "0,1", "channel_id": -5, "is_host_transfer": False}, "send: channel_id must be"),
    ("recv", {"source_target_pairs": "0,1", "channel_id": 0, "is_host_transfer": False, "shape": [4], "dtype": "bool"},
     "recv: dtype bool is not supported"),
    ("recv", {"source_target_pairs": "0,1", "channel_id": 0, "is_host_transfer": False, "shape": 4, "dtype": "int8"},
     "recv: attribute shape 4 is not a list of integers"),
    ("allgather", {"axis": "x", "groups": "0,1"}, "allgather: attribute axis 'x' is not an integer"),
])
def test_attributes_written_by_hand_are_checked_as_the_builders_check_them(kind, attrs, msg):
    """A call built without our builders (a pass, a parsed module) reached the runtime with ``op="foo"``
    or unequal groups, or failed with KeyError / a bare assert (review)."""
    x = tensor((4,))
    args = [x] if kind in ("allreduce", "allgather") else [x, relax.const(0, "int32")] if kind == "send" \
        else [relax.const(0, "int32")]
    call = relax.Call(ir.Op.get(S.relax_op_name(kind)), args, ir.make_node("ir.DictAttrs", **attrs))
    with pytest.raises(Exception, match=re.escape(msg)):
        ty_of(call)


# --------------------------------------------------------------------------- bfloat16


@pytest.mark.parametrize("make, shape", [
    (lambda x: C.allreduce(x, "avg"), (4, 6)),
    (lambda x: C.allgather(x, axis=1, world_size=2), (4, 12)),
    (lambda x: C.reduce_scatter(x, "prod", axis=0, world_size=2), (2, 6)),
    (lambda x: C.recv((4, 6), "bfloat16", [[0, 1]]), (4, 6)),
])
def test_bfloat16_every_op_types(make, shape):
    ty = ty_of(make(tensor((4, 6), "bfloat16")))
    assert [int(d) for d in ty.shape.values] == list(shape) and str(ty.dtype) == "bfloat16"
    assert str(ty_of(C.send(tensor((4, 6), "bfloat16"), [[0, 1]])).dtype) == "int32"


def test_bfloat16_reductions_stay_off_the_native_kernels():
    """MPI has no bfloat16: MPI_SUM on its words would add integers. Reductions go to the generic
    function (float32 in Python); gathers and transfers move the 2-byte words natively."""
    assert native.codes("sum", "bfloat16") is None and native.codes("max", "bfloat16") is None
    if not native.prepare():
        pytest.skip("no native kernels here")
    x = tensor((2, 3), "bfloat16")
    mod = build(lambda bb, x: [bb.emit(C.allreduce(x, "sum")), bb.emit(C.reduce_scatter(x, "avg", 0, world_size=2)),
                               bb.emit(C.allgather(x, 0, world_size=2))], [x])
    target = tvm.target.Target({"kind": "llvm"})
    with target:
        lowered = relax.transform.LegalizeOps()(mod)
    text = lowered.script()
    assert '"tvm_combiners.allreduce"' in text and '"tvm_combiners.reduce_scatter"' in text
    assert "native.allgather" in text and "native.allreduce" not in text and "native.reduce_scatter" not in text


def test_bfloat16_host_reduction_against_numpy(monkeypatch):
    """The host path's reduction of bfloat16: float32, rounded once to bfloat16 (ml_dtypes, to nearest even)."""
    import ml_dtypes

    from tvm_combiners.collectives.runtime import host_collectives as H

    bf16 = np.dtype(ml_dtypes.bfloat16)
    xs = [np.array([1.0078125, 3.03125, np.nan, -2.0], "float32").astype(bf16),
          np.array([256.0, 3.0625, 1.0, np.inf], "float32").astype(bf16)]

    class Comm:  # the reduction MPI would run over the two ranks, on the float32 copies it is given
        def Allreduce(self, send, recv, op):  # noqa: N802 - mpi4py's name
            assert send.dtype == np.float32 and recv.dtype == np.float32  # never the 16-bit words
            recv[...] = send + xs[1].astype("float32") if op is H.mpi_op("sum", "t") else np.maximum(send, xs[1].astype("float32"))

    for op, ref in (("sum", xs[0].astype("float32") + xs[1].astype("float32")),
                    ("avg", (xs[0].astype("float32") + xs[1].astype("float32")) / 2)):
        out = np.empty(4, bf16)
        H._reduce("t", Comm(), op, xs[0], out, 2, block=False)
        np.testing.assert_array_equal(out.astype("float32"), ref.astype(bf16).astype("float32"))
    assert float(out[0]) == 129.0  # (1.0078125 + 256) / 2 = 128.50390625; bfloat16 holds 128 and 129 there
