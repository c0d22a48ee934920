"""Failures the differential fuzzer (tests/fuzz) found, minimized into hand-written modules.

Each test names the fuzz finding it pins (see /work/notes/fuzz_findings.md for the log) and
asserts the correct behaviour: op counts and equal outputs against the unoptimized module.
"""

import numpy as np
import tvm
from helpers import R, assert_same_outputs, make_module, ops, random_inputs, run
from tvm import relax

from tvm_combiners.relax import CombineParallelMatmul, CombineParallelOps

F32 = "float32"


def _const(shape, seed):
    return relax.const(np.random.default_rng(seed).standard_normal(shape).astype(F32))


def test_layer_norm_inputs_over_the_same_operands_in_another_order_stay_apart():
    """Fuzz finding 1 (pre-fix code): ``layer_norm(a, a, b)`` beside ``layer_norm(a, b, a)``.

    Both have the operand set {a, b} in the same first-seen order, so a key built from the
    deduplicated operands made them one input and the second matmul read the first one's input.
    """

    def body(bb, base, a, b):
        first = bb.emit(R.add(base, bb.emit(R.nn.layer_norm(a, a, b, axes=[-1]))))
        second = bb.emit(R.add(base, bb.emit(R.nn.layer_norm(a, b, a, axes=[-1]))))
        again = bb.emit(R.add(base, bb.emit(R.nn.layer_norm(a, a, b, axes=[-1]))))  # equal to ``first``
        return [bb.emit(R.matmul(x, _const((6, n), n))) for x, n in ((first, 2), (second, 3), (again, 4))]

    mod = make_module({"base": ((3, 6), F32), "a": ((6,), F32), "b": ((6,), F32)}, body)
    new = CombineParallelMatmul()(mod)
    assert ops(mod, "matmul") == 3 and ops(new, "matmul") == 2  # only the two equal inputs combine
    assert_same_outputs(mod, new, random_inputs(mod), atol=1e-4)



def test_wide_constant_weights_keep_their_dtype():
    """Review (2026-11-24, ONNX models with float64 or int64 weights): the concatenated weight was
    built with ``relax.const(array)``, which makes float64 float32 and int64 int32 (a dtype error at
    compile time here; in Relay a silently wrong result). Weights chosen so that 32 bits change them."""
    for dtype, weights in (("float64", [np.full((6, n), 1 + 1e-12 * n, dtype="float64") for n in (2, 3, 4)]),
                           ("int64", [np.full((6, n), 2**40 + n, dtype="int64") for n in (2, 3, 4)])):
        def body(bb, x, weights=weights, dtype=dtype):
            return [bb.emit(R.add(bb.emit(R.matmul(x, relax.const(w, dtype))),
                                  relax.const(np.arange(w.shape[1]), dtype))) for w in weights]

        mod = make_module({"x": ((3, 6), dtype)}, body)
        new = CombineParallelMatmul()(mod)
        assert ops(mod, "matmul") == 3 and ops(new, "matmul") == 1, dtype
        x = (np.arange(18).reshape(3, 6) % 5).astype(dtype)
        want = [x @ w.astype(dtype) + np.arange(w.shape[1]).astype(dtype) for w in weights]
        for got, ref in zip(run(new, [x]), want):
            assert got.dtype == ref.dtype
            np.testing.assert_allclose(got, ref, rtol=1e-14, atol=0, err_msg=dtype)  # 32 bits: 1e-12 off


def test_zero_size_ops_are_left_alone():
    """An ONNX model with a fixed 0 dim crashed ``to_batch`` (2026-11-24): the stacked plan reshapes
    each branch's slice to the branch's shape, and Relax's reshape reads a 0 there as "keep this
    axis", so [1, 1, 0, 16] was asked to become [1, 1, 16]. Zero-size ops have nothing to combine."""
    from tvm_combiners.relax import CombineParallelOps

    for shape, k in (((1, 0, 16), 16), ((0, 16), 16), ((2, 3, 0), 0)):
        def body(bb, x, k=k):
            return [bb.emit(R.nn.relu(bb.emit(R.matmul(x, _const((k, 16), seed))))) for seed in (1, 2)]

        mod = make_module({"x": (shape, F32)}, body)
        for to_batch in (False, True):
            new = CombineParallelOps(to_batch=to_batch)(mod)
            assert ops(new, "matmul") == 2, (shape, to_batch)
            assert_same_outputs(mod, new, random_inputs(mod))


def test_symbolic_extents_of_one_name_are_told_apart():
    """Review (2026-11-24): dims compared by their printed name, so weights of extent ``b`` and of
    another variable also named ``b`` (Relax's ONNX importer names every dynamic Squeeze's extent
    alike) were concatenated, and TVM could not compile the result. One variable still combines."""
    import tvm

    from tvm_combiners.relax import CombineParallelOps

    b1, b2 = tvm.tirx.Var("b", "int64"), tvm.tirx.Var("b", "int64")
    for second, combines in ((b2, False), (b1, True)):
        def body(bb, x, w1, w2):
            return [bb.emit(R.matmul(x, w1)), bb.emit(R.matmul(x, w2))]

        mod = make_module({"x": ((1, 4, 8), F32), "w1": ((b1, 8, 3), F32), "w2": ((second, 8, 5), F32)}, body)
        new = CombineParallelOps()(mod)
        assert ops(new, "matmul") == (1 if combines else 2)
        rng = np.random.default_rng(0)
        args = [rng.standard_normal(s).astype(F32) for s in ((1, 4, 8), (2, 8, 3), (2 if combines else 3, 8, 5))]
        for got, want in zip(run(new, args), (args[0] @ args[1], args[0] @ args[2])):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_prim_argument_keeps_its_position():
    """Review finding (2026-11-25): ``subtract(y, 2.0)`` beside ``subtract(2.0, y)`` became one
    ``subtract(combined, 2.0)``: the follower key dropped where its non-tensor arguments stand, so
    the second branch computed ``y - 2`` (16.6 off). They are different ops and stay apart."""
    two = relax.prim_value(tvm.tirx.FloatImm(F32, 2.0))

    def body(bb, x):
        a, b = (bb.emit(R.matmul(x, _const((8, n), n))) for n in (4, 3))
        return [bb.emit(R.subtract(a, two)), bb.emit(R.subtract(two, b))]

    mod = make_module({"x": ((4, 8), F32)}, body)
    new = CombineParallelMatmul()(mod)
    assert ops(new, "matmul") == 1 and ops(new, "subtract") == 2  # the followers stay apart
    assert_same_outputs(mod, new, random_inputs(mod))


def test_maximum_operands_are_never_swapped_between_branches():
    """Review finding (2026-11-25): ``maximum(a, s1)`` beside ``maximum(s2, b)`` combined as if
    maximum were commutative. TVM's float maximum(p, q) returns q where p is NaN, so the second
    branch's NaNs moved. Only add and multiply swap operands (bit for bit, NaNs included)."""

    def body(bb, x, w1, w2, s1, s2):
        a, b, c, d = (bb.emit(R.matmul(v, w)) for v in (x, R.negative(x)) for w in (w1, w2))
        return [bb.emit(R.maximum(a, s1)), bb.emit(R.maximum(s2, b)), bb.emit(R.minimum(s1, c)), bb.emit(R.minimum(d, s2))]

    mod = make_module({"x": ((2, 3), F32), "w1": ((3, 4), F32), "w2": ((3, 4), F32), "s1": ((4,), F32),
                       "s2": ((4,), F32)}, body)
    new = CombineParallelMatmul()(mod)
    assert ops(new, "matmul") == 2 and ops(new, "maximum") == 2 and ops(new, "minimum") == 2
    inputs = random_inputs(mod)
    inputs[0][0, 0] = inputs[4][2] = np.nan  # row 0 of both matmuls, one element of s2
    for got, want in zip(run(new, inputs), run(mod, inputs)):
        np.testing.assert_array_equal(got, want)  # NaNs where the original has them, the rest equal


def test_a_binding_using_a_dim_stays_after_the_match_cast_naming_it():
    """Review finding (2026-11-25): ``r = reshape(z, (n, 8))`` reads no value of the match_cast
    that defines ``n``, so the schedule moved it, with the group's other inputs, ahead of the
    cast: a module that is not well formed and fails to compile. Uses of a dim are dependences."""
    n = tvm.tirx.Var("n", "int64")

    def body(bb, x, w1, w2, z):
        y1 = bb.emit(R.matmul(x, w1))
        cast = bb.match_cast(y1, relax.TensorType((n, 8), F32))
        reshaped = bb.emit(R.reshape(z, relax.ShapeExpr([n, 8])))
        y2 = bb.emit(R.matmul(x, bb.emit(R.exp(w2))))  # the group waits for exp: it sits after the cast
        return [cast, reshaped, y2]

    mod = make_module({"x": ((4, 8), F32), "w1": ((8, 8), F32), "w2": ((8, 8), F32), "z": ((4, 8), F32)}, body)
    new = CombineParallelMatmul()(mod)
    assert ops(new, "matmul") == 1
    assert_same_outputs(mod, new, random_inputs(mod))  # checks well-formedness first


def test_a_chain_of_dependent_roots_is_planned_once_per_root(monkeypatch):
    """Review finding (2026-11-25): an unrolled RNN's ``h_t @ U`` share ``U`` but each reads the
    last, so no root has a partner; every root then tried every later one with a full plan, T^2/2
    plans (32.9 s at T=800, 0.57 s now). The x_t @ W of the same steps still combine."""
    from tvm_combiners.core import branch_grouping

    steps, hidden = 60, 8
    plans = []
    original = branch_grouping._Planner._plan
    monkeypatch.setattr(branch_grouping._Planner, "_plan", lambda self, *a: plans.append(1) or original(self, *a))

    def body(bb, x, h):
        w, u = _const((hidden, hidden), 1), _const((hidden, hidden), 2)
        for t in range(steps):
            xt = bb.emit(R.reshape(bb.emit(R.strided_slice(x, [0], [t], [t + 1])), (1, hidden)))
            h = bb.emit(R.tanh(bb.emit(R.add(bb.emit(R.matmul(xt, w)), bb.emit(R.matmul(h, u))))))
        return h

    mod = make_module({"x": ((steps, 1, hidden), F32), "h": ((1, hidden), F32)}, body)
    new = CombineParallelOps()(mod)
    assert ops(new, "matmul") == steps + 1  # the x_t @ W as one, every h_t @ U on its own
    assert len(plans) <= 2 * steps, len(plans)
    assert_same_outputs(mod, new, random_inputs(mod), atol=1e-4)
