"""Failures the differential fuzzer (tests/relay/fuzz) found, minimized into hand-written modules.

Each test names the fuzz finding it pins (see /work/notes/fuzz_findings.md for the log) and
asserts the correct behaviour: op counts and equal outputs against the unoptimized module.
"""

import numpy as np
import tvm
from helpers import assert_same_outputs, const, make_module, ops, random_inputs, run, unchanged
from tvm import relay

from tvm_combiners.compile.relay_runner import make_target
from tvm_combiners.relay import CombineParallelDense, CombineParallelOps, CombineSharedWeightDense


def test_layer_norm_inputs_over_the_same_operands_in_another_order_stay_apart():
    """Fuzz finding 1 (pre-fix code): ``layer_norm(a, a, b)`` beside ``layer_norm(a, b, a)``.

    Both list the operands {a, b} in the same first-seen order; a key over the deduplicated
    operands made them one input and the second dense read the first one's input.
    """
    base, a, b = relay.var("base", shape=(3, 6)), relay.var("a", shape=(6,)), relay.var("b", shape=(6,))
    inputs = [relay.add(base, relay.nn.layer_norm(*args, axis=-1)) for args in ((a, a, b), (a, b, a), (a, a, b))]
    outs = [relay.nn.dense(x, const((n, 6), n)) for x, n in zip(inputs, (2, 3, 4))]
    mod = make_module(outs, [base, a, b])
    new = CombineParallelDense()(mod)
    assert ops(mod, "nn.dense") == 3 and ops(new, "nn.dense") == 2  # only the two equal inputs combine
    assert_same_outputs(mod, new, random_inputs(mod), atol=1e-4)


def test_main_with_siblings_calling_a_function_with_siblings():
    """Fuzz finding 2 (pre-fix code): a type-inference crash once both functions had groups.

    The fuzzer's shape: ``main`` calls ``g0`` (two sibling denses over its parameter) and has two
    sibling denses of its own over another parameter.
    """
    mod = tvm.IRModule()
    p = relay.var("p", shape=(3, 6))
    g0 = relay.GlobalVar("g0")
    mod[g0] = relay.Function([p], relay.Tuple([relay.nn.dense(p, const((n, 6), n)) for n in (2, 3)]))
    mod = relay.transform.InferType()(mod)
    x, y = relay.var("x", shape=(3, 6)), relay.var("y", shape=(3, 6))
    own = [relay.nn.dense(y, const((n, 6), 10 + n)) for n in (2, 3)]
    mod["main"] = relay.Function([x, y], relay.Tuple([relay.Call(g0, [x]), *own]))
    mod = relay.transform.InferType()(mod)
    new = CombineParallelOps()(mod)
    assert ops(mod, "nn.dense") == 4 and ops(new, "nn.dense") == 2  # one combined dense per function
    inputs = random_inputs(mod)

    def run_vm(m):  # the graph executor cannot call global functions; the VM can
        result = relay.create_executor("vm", mod=m, target=make_target("llvm")).evaluate()(**inputs)
        flat = []
        for item in result:
            flat.extend([r.numpy() for r in item] if isinstance(item, tvm.runtime.container.ADT) else [item.numpy()])
        return flat

    expected, got = run_vm(mod), run_vm(new)
    assert len(expected) == len(got) == 4
    for e, g in zip(expected, got):
        np.testing.assert_allclose(g, e, atol=1e-5, rtol=1e-5)


def test_llvm_target_names_the_host_cpu_and_triple(monkeypatch):
    """A bare llvm target means baseline x86-64 (SSE2, no FMA), and hhb-tvm's default triple is riscv64."""
    target = make_target("llvm")
    assert str(target.attrs["mcpu"]) == tvm.target.codegen.llvm_get_system_cpu()
    assert str(target.attrs["mtriple"]) == "x86_64-linux-gnu"
    monkeypatch.setenv("TVM_COMBINERS_MCPU", "generic")
    assert str(make_target("llvm").attrs["mcpu"]) == "generic"


def test_unknown_dims_stay_apart_when_vars_share_one_type_object():
    """The graph view reads each shared type object once; a ``?`` must still be a dim of its own.

    ``x`` and ``y`` are annotated with one ``TensorType`` object: their batches need not be equal
    at run time, so their shapes must not compare equal (a cached shape would make them equal).
    """
    from tvm_combiners.relay.graph_view import build_body_view

    ty = relay.TensorType((relay.Any(), 8), "float32")
    x, y = relay.var("x", ty), relay.var("y", ty)
    mod = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x, y], relay.Tuple([x, y]))))
    view = build_body_view(mod["main"].body)
    sx, sy = (view.graph[view.node_of(mod["main"].params[i])].shape for i in (0, 1))
    assert sx[1] == sy[1] == 8 and sx[0] != sy[0]


def test_params_as_inputs_on_a_deep_graph():
    """import_relay(params_as_inputs=True) lifts constants with a mutator that must not recurse per op."""
    from tvm_combiners.models.loader import _constants_to_params

    x = relay.var("x", shape=(4,), dtype="float32")
    e = x
    for i in range(6000):
        e = relay.add(e, relay.const(np.full((4,), i, "float32")))
    mod, params = _constants_to_params(relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], e))))
    assert len(mod["main"].params) == 6001 and len(params) == 6000
    assert list(params) == [f"param_{i}" for i in range(6000)]  # numbered in program order, as before
    assert [float(p.numpy()[0]) for p in params.values()] == list(range(6000))


# --------------------------------------------------------------------------- review findings (stop 23)


def test_bfloat16_constant_weights_and_biases_stay_bfloat16():
    """TVM 0.16 reads a bfloat16 constant into numpy as uint16: folded with numpy, the combined
    weight became a uint16 constant that ``nn.dense`` accepted (outputs ~1e4 off), and a
    concatenated bias failed type inference inside the pass."""
    rng = np.random.default_rng(0)
    x = relay.var("x", shape=(2, 4))
    xb = relay.cast(x, "bfloat16")
    outs = [relay.cast(relay.nn.bias_add(relay.nn.dense(xb, relay.cast(relay.const(rng.standard_normal((n, 4)).astype("float32")), "bfloat16")),
                                         relay.cast(relay.const(rng.standard_normal(n).astype("float32")), "bfloat16")), "float32")
            for n in (3, 5)]
    mod = relay.transform.InferType()(relay.transform.FoldConstant()(make_module(outs, [x])))
    new = CombineParallelOps()(mod)
    assert ops(new, "nn.dense") == 1
    dtypes = []
    relay.analysis.post_order_visit(new["main"], lambda e: dtypes.append(str(e.data.dtype)) if isinstance(e, relay.Constant) else None)
    assert set(dtypes) == {"bfloat16"}
    assert_same_outputs(mod, new, random_inputs(mod))


def test_eight_bit_matmuls_concatenate_instead_of_stacking():
    """``to_batch=True`` on uint8 x int8 denses: TVM 0.16's x86 batch_matmul of a broadcast batch
    of 1 computed every branch after the first wrong (K 64, widths 16)."""
    rng = np.random.default_rng(1)
    x = relay.var("x", shape=(3, 64), dtype="uint8")
    outs = [relay.nn.dense(x, relay.const(rng.integers(-128, 128, (16, 64)).astype("int8")), out_dtype="int32") for _ in range(2)]
    mod = make_module(outs, [x])
    new = CombineParallelOps(to_batch=True)(mod)
    assert ops(new, "nn.dense") == 1 and ops(new, "nn.batch_matmul") == 0
    inputs = {"x": rng.integers(0, 256, (3, 64)).astype("uint8")}
    assert_same_outputs(mod, new, inputs)
    w = [c.data.numpy().astype(np.int64) for c in (o.args[1] for o in outs)]
    for got, weight in zip(run(new, inputs), w):
        np.testing.assert_array_equal(got, inputs["x"].astype(np.int64) @ weight.T)


def test_symbolic_dims_left_where_relay_cannot_type_the_rewrite():
    """A ``tir.Var`` row count: joined with another input's rows it came back typed ``3 + n - 3``
    (no unifying with ``n``: a DiagnosticError inside the pass), and broadcasting a side operand
    to ``[n, w]`` raised in ``relay.broadcast_to`` (static ints only). Such groups are left alone
    (the denses over one ``x`` still combine, their ``[n, w]`` followers not); ``?`` dims combine."""
    n = tvm.tir.Var("n", "int64")
    a, b, w = relay.var("a", shape=(n, 6)), relay.var("b", shape=(3, 6)), relay.var("w", shape=(4, 6))
    shared = make_module([relay.nn.dense(a, w), relay.nn.dense(b, w)], [a, b, w])
    x, s1, s2 = relay.var("x", shape=(n, 6)), relay.var("s1", shape=(n, 1)), relay.var("s2", shape=(n, 1))
    sides = make_module([relay.multiply(relay.nn.dense(x, const((k, 6), k)), s) for k, s in ((3, s1), (5, s2))], [x, s1, s2])
    assert unchanged(shared, CombineParallelOps()(shared))
    new = CombineParallelOps()(sides)
    assert ops(new, "nn.dense") == 1 and ops(new, "multiply") == 2
    a_any = relay.var("a", shape=(relay.Any(), 6))
    dynamic = make_module([relay.nn.dense(a_any, w), relay.nn.dense(b, w)], [a_any, b, w])
    assert ops(CombineSharedWeightDense()(dynamic), "nn.dense") == 1


def test_wide_constant_weights_keep_their_dtype():
    """Review (2026-11-24, ONNX models with float64 or int64 weights): the concatenated weight was
    built with ``relay.const(array)``, which makes float64 float32 and int64 int32: the combined
    module returned 7.5e-12 for a float64 output of 1.8e-15, and int64 outputs 4.5e13 off, silently."""
    for dtype, weights in (("float64", [np.full((n, 6), 1 + 1e-12 * n, dtype="float64") for n in (2, 3, 4)]),
                           ("int64", [np.full((n, 6), 2**40 + n, dtype="int64") for n in (2, 3, 4)])):
        x = relay.var("x", shape=(3, 6), dtype=dtype)
        outs = [relay.add(relay.nn.dense(x, relay.const(w, dtype)), relay.const(np.arange(w.shape[0]), dtype))
                for w in weights]
        mod = make_module(outs, [x])
        new = CombineParallelDense()(mod)
        assert ops(mod, "nn.dense") == 3 and ops(new, "nn.dense") == 1, dtype
        data = (np.arange(18).reshape(3, 6) % 5).astype(dtype)
        for got, w in zip(run(new, {"x": data}), weights):
            assert got.dtype == np.dtype(dtype)
            np.testing.assert_allclose(got, data @ w.T + np.arange(w.shape[0]), rtol=1e-14, atol=0, err_msg=dtype)


def test_zero_size_ops_are_left_alone():
    """A fixed 0 dim (2026-11-24): a stacked plan reshapes each branch's slice to the branch's shape,
    and Relay's reshape reads a 0 there as "keep this axis". TVM 0.16 cannot compile a zero-size
    dense (divide by zero), so the graph is only typed: the pass must leave it as it is."""
    for shape, k in (((0, 16), 16), ((3, 0), 0)):
        x = relay.var("x", shape=shape)
        mod = make_module([relay.nn.relu(relay.nn.dense(x, const((16, k), seed))) for seed in (1, 2)], [x])
        for to_batch in (False, True):
            assert unchanged(mod, CombineParallelOps(to_batch=to_batch)(mod)), (shape, to_batch)


def test_maximum_operands_are_never_swapped_between_branches():
    """Review finding (2026-11-25, on Relax): ``maximum(a, s1)`` beside ``maximum(s2, b)`` combined
    as if maximum were commutative; TVM's float maximum(p, q) returns q where p is NaN, so NaNs
    moved. The rule lives in the IR-neutral op tables: Relay keeps both maximums too."""
    x, s1, s2 = relay.var("x", shape=(2, 3)), relay.var("s1", shape=(4,)), relay.var("s2", shape=(4,))
    a, b = (relay.nn.dense(x, const((4, 3), n)) for n in (1, 2))
    mod = make_module([relay.maximum(a, s1), relay.maximum(s2, b)], [x, s1, s2])
    new = CombineParallelDense()(mod)
    assert ops(new, "nn.dense") + ops(new, "nn.batch_matmul") == 1 and ops(new, "maximum") == 2
    inputs = random_inputs(mod)
    inputs["x"][0, 0] = inputs["s2"][2] = np.nan
    for got, want in zip(run(new, inputs), run(mod, inputs)):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)  # NaN where and only where the original has one
