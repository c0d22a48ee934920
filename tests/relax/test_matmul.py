"""CombineParallelMatmul on hand-built Relax graphs: what combines, what must not, numerics."""

import numpy as np
import pytest
import tvm
from helpers import R, assert_same_outputs, make_module, ops, random_inputs, run
from tvm import relax

from tvm_combiners.relax import CombineParallelMatmul, CombineParallelOps

F32 = "float32"


def _const(shape, seed, dtype=F32):
    return relax.const(np.random.default_rng(seed).standard_normal(shape).astype(dtype))


def qkv(bias_first: bool = True, activation=None, const_weights: bool = False, widths=(16, 16, 16)):
    params = {"x": ((2, 5, 8), F32)}
    if not const_weights:
        params.update({f"w{i}": ((8, n), F32) for i, n in enumerate(widths)})
        params.update({f"b{i}": ((n,), F32) for i, n in enumerate(widths)})

    def body(bb, x, *rest):
        outs = []
        for i, n in enumerate(widths):
            w = _const((8, n), i) if const_weights else rest[i]
            b = _const((n,), 10 + i) if const_weights else rest[len(widths) + i]
            y = bb.emit(R.matmul(x, w))
            y = bb.emit(R.add(b, y) if bias_first else R.add(y, b))
            if activation is not None:
                y = bb.emit(activation(y))
            outs.append(bb.emit(R.reshape(y, (2, 5, n))))
        return outs

    return make_module(params, body)


@pytest.mark.parametrize("bias_first", [True, False])
@pytest.mark.parametrize("const_weights", [True, False])
def test_qkv_with_bias_in_either_position(bias_first, const_weights):
    mod = qkv(bias_first=bias_first, const_weights=const_weights, widths=(16, 8, 24))
    new = CombineParallelMatmul()(mod)
    assert ops(mod, "matmul") == 3 and ops(new, "matmul") == 1
    assert ops(new, "add") == 1  # the three bias adds became one
    assert_same_outputs(mod, new, random_inputs(mod))


@pytest.mark.parametrize(
    "activation", [R.nn.relu, R.nn.gelu, R.nn.gelu_tanh, R.nn.silu, R.sigmoid, R.tanh, lambda y: R.astype(y, "float16")]
)
def test_activations_follow(activation):
    mod = qkv(activation=activation)
    new = CombineParallelMatmul()(mod)
    assert ops(new, "matmul") == 1 and ops(new, "add") == 1
    assert_same_outputs(mod, new, random_inputs(mod), atol=1e-3)


def test_constant_weights_are_concatenated_at_compile_time():
    mod = qkv(const_weights=True)
    new = CombineParallelMatmul()(mod)
    assert ops(new, "concat") == 0  # numpy concatenated the constants already
    assert ops(new, "matmul") == 1
    # and nothing the VM executes concatenates per call
    lowered = relax.get_default_pipeline(tvm.target.Target({"kind": "llvm"}))(new)
    assert "concat" not in " ".join(str(gv) for gv in lowered.get_global_vars())


def test_parameter_weights_concat_is_liftable():
    mod = qkv(const_weights=False)
    mod["main"] = mod["main"].with_attr("num_input", 1)
    new = CombineParallelMatmul()(mod)
    assert ops(new, "concat") == 2  # weights and biases, once each
    lifted = relax.transform.LiftTransformParams()(new)
    assert ops(tvm.IRModule({"main": lifted["main"]}), "concat") == 0
    assert "main_transform_params" in [gv.name_hint for gv in lifted.get_global_vars()]


def test_scalar_scales_and_different_scalars_per_branch():
    def body(bb, x, w0, w1, w2):
        outs = []
        for i, w in enumerate((w0, w1, w2)):
            y = bb.emit(R.matmul(x, w))
            y = bb.emit(R.multiply(y, relax.const(0.5 * (i + 1), F32)))  # a different scalar per branch
            outs.append(bb.emit(R.divide(y, relax.const(3.0, F32))))  # the same scalar in all
        return outs

    mod = make_module({"x": ((3, 8), F32), "w0": ((8, 4), F32), "w1": ((8, 6), F32), "w2": ((8, 2), F32)}, body)
    new = CombineParallelMatmul()(mod)
    assert ops(new, "matmul") == 1 and ops(new, "multiply") == 1 and ops(new, "divide") == 1
    assert_same_outputs(mod, new, random_inputs(mod))


def test_permuted_weights_and_batched_lhs():
    def body(bb, x, w0, w1):
        a = bb.emit(R.matmul(x, bb.emit(R.permute_dims(w0))))
        b = bb.emit(R.matmul(x, bb.emit(R.permute_dims(w1))))
        return [a, b]

    mod = make_module({"x": ((2, 3, 4, 8), F32), "w0": ((5, 8), F32), "w1": ((7, 8), F32)}, body)
    new = CombineParallelMatmul()(mod)
    assert ops(new, "matmul") == 1
    assert_same_outputs(mod, new, random_inputs(mod))


def test_one_dimensional_lhs():
    mod = make_module({"x": ((8,), F32), "w0": ((8, 3), F32), "w1": ((8, 4), F32)},
                      lambda bb, x, w0, w1: [bb.emit(R.matmul(x, w0)), bb.emit(R.matmul(x, w1))])
    new = CombineParallelMatmul()(mod)
    assert ops(new, "matmul") == 1
    assert_same_outputs(mod, new, random_inputs(mod))


def test_one_dimensional_weights_are_left_alone():
    mod = make_module({"x": ((3, 8), F32), "w0": ((8,), F32), "w1": ((8,), F32)},
                      lambda bb, x, w0, w1: [bb.emit(R.matmul(x, w0)), bb.emit(R.matmul(x, w1))])
    assert tvm_ffi_equal(CombineParallelOps()(mod), mod)


def test_structurally_equal_inputs_group_together():
    def body(bb, x, w0, w1):
        x0 = bb.emit(R.reshape(x, (6, 8)))
        x1 = bb.emit(R.reshape(x, (6, 8)))  # a second, equal reshape: what ONNX importers emit
        return [bb.emit(R.matmul(x0, w0)), bb.emit(R.matmul(x1, w1))]

    mod = make_module({"x": ((2, 3, 8), F32), "w0": ((8, 3), F32), "w1": ((8, 4), F32)}, body)
    new = CombineParallelMatmul()(mod)
    assert ops(new, "matmul") == 1
    assert_same_outputs(mod, new, random_inputs(mod))


def _symbolic_batch_module(widths: tuple[int, int]):
    """``x (n, s, 8)`` read by two matmul + bias branches of ``widths`` (bias on either side)."""
    n, s = tvm.tirx.Var("n", "int64"), tvm.tirx.Var("s", "int64")

    def body(bb, x, w0, w1, b0, b1):
        return [bb.emit(R.add(bb.emit(R.matmul(x, w0)), b0)), bb.emit(R.add(b1, bb.emit(R.matmul(x, w1))))]

    (a, b) = widths
    return make_module(
        {"x": ((n, s, 8), F32), "w0": ((8, a), F32), "w1": ((8, b), F32), "b0": ((a,), F32), "b1": ((b,), F32)}, body
    )


def test_symbolic_batch_and_sequence():
    mod = _symbolic_batch_module((4, 6))
    new = CombineParallelMatmul()(mod)
    assert ops(new, "matmul") == 1 and ops(new, "add") == 1
    assert_same_outputs(mod, new, random_inputs(mod, sizes={"n": 3, "s": 7}))


def test_one_symbolic_width_combines_placed_last():
    """Like TVM's pass: one branch of symbolic width joins, split after the static ones (issue 12)."""
    m = tvm.tirx.Var("m", "int64")

    def body(bb, x, w0, w1, w2, b1):
        first = bb.emit(R.nn.relu(bb.emit(R.matmul(x, w0))))  # symbolic width, first in program order
        return [first, bb.emit(R.nn.relu(bb.emit(R.matmul(x, w1)))), bb.emit(R.nn.relu(bb.emit(R.matmul(x, w2))))]

    mod = make_module({"x": ((3, 8), F32), "w0": ((8, m), F32), "w1": ((8, 4), F32), "w2": ((8, 5), F32),
                       "b1": ((4,), F32)}, body)
    seen = []
    new = CombineParallelMatmul(on_combine=seen.append)(mod)
    assert ops(new, "matmul") == 1 and ops(new, "nn.relu") == 1
    assert [str(w) for w in seen[0].widths] == ["4", "5", "m"]
    for size in (2, 7):
        assert_same_outputs(mod, new, random_inputs(mod, sizes={"m": size}))


def test_two_symbolic_widths_do_not_share_a_group():
    m, n = tvm.tirx.Var("m", "int64"), tvm.tirx.Var("n", "int64")
    mod = make_module({"x": ((3, 8), F32), "w0": ((8, m), F32), "w1": ((8, n), F32), "w2": ((8, 4), F32)},
                      lambda bb, x, w0, w1, w2: [bb.emit(R.matmul(x, w)) for w in (w0, w1, w2)])
    new = CombineParallelMatmul()(mod)
    assert ops(new, "matmul") == 2  # w0 joins w2; w1's split point would be symbolic
    for sizes in ({"m": 2, "n": 3}, {"m": 5, "n": 1}):
        assert_same_outputs(mod, new, random_inputs(mod, sizes=sizes))


def test_batched_weights_with_a_2d_input():
    """``x (M, K) @ w (B, K, N)`` siblings of equal batch combine; other batches stay apart (issue 12)."""

    def body(bb, x, w0, w1, w2, w3):
        return [bb.emit(R.matmul(x, w)) for w in (w0, w1, w2, w3)]

    mod = make_module({"x": ((3, 8), F32), "w0": ((2, 8, 4), F32), "w1": ((2, 8, 5), F32),
                       "w2": ((4, 8, 5), F32), "w3": ((8, 6), F32)}, body)
    new = CombineParallelOps()(mod)
    assert ops(mod, "matmul") == 4 and ops(new, "matmul") == 3  # w0 + w1; w2 (batch 4) and w3 (2-D) alone
    assert_same_outputs(mod, new, random_inputs(mod))


def tvm_ffi_equal(a, b) -> bool:
    import tvm_ffi

    return bool(tvm_ffi.structural_equal(a, b))


# -- negative cases: the module must come back unchanged ---------------------------------------


def test_different_k_not_combined():
    mod = make_module({"x": ((3, 8), F32), "y": ((3, 6), F32), "w0": ((8, 4), F32), "w1": ((6, 4), F32)},
                      lambda bb, x, y, w0, w1: [bb.emit(R.matmul(x, w0)), bb.emit(R.matmul(y, w1))])
    assert tvm_ffi_equal(CombineParallelMatmul()(mod), mod)


def test_different_dtypes_not_combined():
    def body(bb, x, w0, w1):
        return [bb.emit(R.matmul(x, w0)), bb.emit(R.matmul(x, w1, out_dtype="float32"))]

    mod = make_module({"x": ((3, 8), "float16"), "w0": ((8, 4), "float16"), "w1": ((8, 4), "float16")}, body)
    assert tvm_ffi_equal(CombineParallelMatmul()(mod), mod)
    mod2 = make_module({"x": ((3, 8), F32), "w0": ((8, 4), F32), "w1": ((8, 4), "float16")},
                       lambda bb, x, w0, w1: [bb.emit(R.matmul(x, w0)), bb.emit(R.matmul(x, bb.emit(R.astype(w1, F32))))])
    # here both weights are float32 at the matmul: they may combine, and results stay equal
    new2 = CombineParallelMatmul()(mod2)
    assert ops(new2, "matmul") == 1
    assert_same_outputs(mod2, new2, random_inputs(mod2))


def test_dependent_branch_not_combined():
    def body(bb, x, w0, w1):
        a = bb.emit(R.matmul(x, w0))  # (3, 8)
        w1b = bb.emit(R.add(w1, bb.emit(R.sum(a))))  # the second weight depends on the first branch
        return [a, bb.emit(R.matmul(x, w1b))]

    mod = make_module({"x": ((3, 8), F32), "w0": ((8, 8), F32), "w1": ((8, 4), F32)}, body)
    new = CombineParallelMatmul()(mod)
    assert tvm_ffi_equal(new, mod)


def test_branch_consumed_by_later_branch_follower():
    def body(bb, x, w0, w1):
        a = bb.emit(R.matmul(x, w0))  # (3, 4)
        b = bb.emit(R.matmul(x, w1))
        c = bb.emit(R.add(b, a))  # the follower of branch 1 reads branch 0's result
        return [c]

    mod = make_module({"x": ((3, 8), F32), "w0": ((8, 4), F32), "w1": ((8, 4), F32)}, body)
    new = CombineParallelMatmul()(mod)
    # the roots still combine (independent), but the follower reading branch 0 stays outside
    assert ops(new, "matmul") == 1 and ops(new, "add") == 1
    assert_same_outputs(mod, new, random_inputs(mod))


def test_fewer_branches_than_minimum():
    mod = qkv(widths=(4, 4))
    assert tvm_ffi_equal(CombineParallelMatmul(min_num_branches=3)(mod), mod)
    assert ops(CombineParallelMatmul(min_num_branches=2)(mod), "matmul") == 1


def test_intermediate_with_second_user_ends_branch():
    def body(bb, x, w0, w1, b0, b1):
        a = bb.emit(R.matmul(x, w0))
        b = bb.emit(R.matmul(x, w1))
        return [bb.emit(R.add(a, b0)), bb.emit(R.add(b, b1)), a]  # a is also an output

    mod = make_module({"x": ((3, 8), F32), "w0": ((8, 4), F32), "w1": ((8, 4), F32), "b0": ((4,), F32),
                       "b1": ((4,), F32)}, body)
    new = CombineParallelMatmul()(mod)
    assert ops(new, "matmul") == 1 and ops(new, "add") == 2
    assert_same_outputs(mod, new, random_inputs(mod))


# -- options ----------------------------------------------------------------------------------


def test_max_branches_cuts_groups_and_stays_idempotent():
    mod = qkv(widths=(4, 4, 4, 4, 4))
    new = CombineParallelMatmul(max_branches=2)(mod)
    assert ops(new, "matmul") == 3  # 2 + 2 + 1
    again = CombineParallelMatmul(max_branches=2)(new)
    assert tvm_ffi_equal(again, new)
    assert_same_outputs(mod, new, random_inputs(mod))


def test_max_combined_bytes():
    mod = qkv(widths=(16, 16, 16))  # each weight 8*16*4 = 512 bytes
    assert ops(CombineParallelMatmul(max_combined_bytes=1024)(mod), "matmul") == 2
    assert ops(CombineParallelMatmul(max_combined_bytes=1536)(mod), "matmul") == 1
    assert tvm_ffi_equal(CombineParallelMatmul(max_combined_bytes=511)(mod), mod)


def test_check_callback_vetoes_and_sees_candidates():
    mod = qkv(widths=(4, 8, 12))
    seen = []
    vetoed = CombineParallelMatmul(check=lambda c: seen.append(c) or False)(mod)
    assert tvm_ffi_equal(vetoed, mod)
    assert seen and seen[0].widths == (4, 8, 12) and seen[0].family == "matmul"
    assert seen[0].follower_ops == ("add",)
    assert ops(CombineParallelMatmul(check=lambda c: True)(mod), "matmul") == 1


def test_bad_options_raise_clear_errors():
    with pytest.raises(ValueError, match="CombineParallelMatmul: min_num_branches must be >= 2, got 1"):
        CombineParallelMatmul(min_num_branches=1)
    with pytest.raises(ValueError, match=r"max_branches \(2\) must be >= min_num_branches \(3\)"):
        CombineParallelMatmul(min_num_branches=3, max_branches=2)
    with pytest.raises(ValueError, match="max_combined_bytes must be positive"):
        CombineParallelOps(max_combined_bytes=0)
    with pytest.raises(TypeError, match="CombineParallelMatmul: check must be callable or None, got int"):
        CombineParallelMatmul(check=3)
    with pytest.raises(TypeError, match="CombineParallelOps: max_branches must be an int or None, got str '4'"):
        CombineParallelOps(max_branches="4")
    with pytest.raises(TypeError, match="CombineParallelOps: to_batch must be a bool, got str 'False'"):
        CombineParallelOps(to_batch="False")
    with pytest.raises(TypeError, match="CombineParallelMatmul: to_batch must be a bool, got int 1"):
        CombineParallelMatmul(to_batch=1)


@pytest.mark.parametrize("dtype, bits", [("float8_e4m3fn", 8), ("float8_e5m2", 8), ("float16", 16), ("int8", 8)])
def test_max_combined_bytes_counts_every_dtype_by_its_bits(dtype, bits):
    """float8 weights are 1 byte each, not 4 or 43 (issue 8, item 4); the limit is exact."""
    params = {"x": ((2, 16), dtype), "w0": ((16, 8), dtype), "w1": ((16, 8), dtype)}
    mod = make_module(params, lambda bb, x, w0, w1: [bb.emit(R.matmul(x, w0)), bb.emit(R.matmul(x, w1))])
    total = 2 * 16 * 8 * bits // 8  # bytes of both weights
    assert ops(CombineParallelMatmul(max_combined_bytes=total)(mod), "matmul") == 1  # exactly at the limit
    assert ops(CombineParallelMatmul(max_combined_bytes=total - 1)(mod), "matmul") == 2  # one byte short


# -- pass infrastructure ----------------------------------------------------------------------


def test_idempotent_and_deterministic():
    mod = qkv(widths=(4, 8, 12), activation=R.nn.relu)
    once = CombineParallelOps()(mod)
    assert tvm_ffi_equal(CombineParallelOps()(once), once)
    assert tvm_ffi_equal(CombineParallelOps()(mod), once)


def test_usable_in_sequential_and_compile_pipeline():
    mod = qkv()
    seq = tvm.transform.Sequential([CombineParallelMatmul(), relax.transform.DeadCodeElimination()])
    assert ops(seq(mod), "matmul") == 1
    assert CombineParallelMatmul().info.name == "CombineParallelMatmul"
    target = tvm.target.Target({"kind": "llvm"})
    pipeline = tvm.transform.Sequential([CombineParallelOps(), relax.get_default_pipeline(target)])
    ex = tvm.compile(mod, target=target, relax_pipeline=pipeline)
    inputs = random_inputs(mod)
    from tvm_combiners.compile.relax_runner import run_vm

    for got, want in zip(run_vm(ex, inputs), run(mod, inputs)):
        np.testing.assert_allclose(got, want, atol=1e-5)


def test_disabled_pass_is_skipped():
    mod = qkv()
    with tvm.transform.PassContext(disabled_pass=["CombineParallelMatmul"]):
        out = tvm.transform.Sequential([CombineParallelMatmul()])(mod)
    assert ops(out, "matmul") == 3


def test_to_batch_stacks_equal_branches():
    mod2 = make_module({"x": ((5, 8), F32)}, lambda bb, x: [bb.emit(R.nn.relu(bb.emit(R.add(
        bb.emit(R.matmul(x, _const((8, 6), i))), _const((6,), 9 + i))))) for i in range(3)])
    new = CombineParallelMatmul(to_batch=True)(mod2)
    assert ops(new, "matmul") == 1 and ops(new, "add") == 1 and ops(new, "nn.relu") == 1
    assert ops(new, "expand_dims") == 0 and ops(new, "broadcast_to") == 0  # the matmul broadcasts the input
    assert_same_outputs(mod2, new, random_inputs(mod2))


def test_to_batch_stacks_branches_over_a_batched_input():
    """[2, 5, 8] x three [8, 8] weights: one [3, 1, 8, 8] weight, a [3, 2, 5, 8] result, the input read once."""
    mod = qkv(widths=(8, 8, 8), activation=R.nn.relu, const_weights=True)
    groups = []
    new = CombineParallelMatmul(to_batch=True, on_combine=groups.append)(mod)
    assert [g.stacked for g in groups] == [True]
    assert ops(new, "matmul") == 1 and ops(new, "add") == 1 and ops(new, "nn.relu") == 1
    assert ops(new, "expand_dims") == 0 and ops(new, "broadcast_to") == 0
    assert_same_outputs(mod, new, random_inputs(mod))
    assert ops(CombineParallelMatmul(to_batch=True)(new), "matmul") == 1  # idempotent


def test_to_batch_rank4_input_with_side_operands_of_every_rank():
    """[2, 3, 5, 8] x [8, 6]: per-branch [6], [5, 6] and [2, 3, 5, 6] operands stack, a shared one stays."""
    shared = _const((2, 3, 5, 6), 50)

    def body(bb, x):
        outs = []
        for i in range(3):
            y = bb.emit(R.add(bb.emit(R.matmul(x, _const((8, 6), i))), _const((6,), 10 + i)))
            y = bb.emit(R.multiply(y, _const((5, 6), 20 + i)))
            y = bb.emit(R.subtract(y, _const((2, 3, 5, 6), 30 + i)))
            outs.append(bb.emit(R.add(y, shared)))
        return outs

    mod = make_module({"x": ((2, 3, 5, 8), F32)}, body)
    groups = []
    new = CombineParallelMatmul(to_batch=True, on_combine=groups.append)(mod)
    assert [g.stacked for g in groups] == [True]
    assert [ops(new, op) for op in ("matmul", "add", "multiply", "subtract")] == [1, 2, 1, 1]
    assert_same_outputs(mod, new, random_inputs(mod))
    assert ops(CombineParallelMatmul(to_batch=True)(new), "matmul") == 1  # idempotent


@pytest.mark.parametrize("limit", [{"max_branches": 2}, {"max_combined_bytes": 2 * 8 * 6 * 4}])
def test_to_batch_over_a_batched_input_respects_limits(limit):
    mod = make_module({"x": ((2, 5, 8), F32)},
                      lambda bb, x: [bb.emit(R.matmul(x, _const((8, 6), i))) for i in range(3)])
    groups = []
    new = CombineParallelMatmul(to_batch=True, on_combine=groups.append, **limit)(mod)
    assert [(g.stacked, len(g.roots)) for g in groups] == [(True, 2)] and ops(new, "matmul") == 2
    assert_same_outputs(mod, new, random_inputs(mod))


def test_to_batch_concatenates_several_widths_with_a_symbolic_one():
    """Widths n, 4, 4, 6 on one input: one concatenated matmul (the symbolic width last), as
    without to_batch; stacking could take only the two 4s."""
    n = tvm.tirx.Var("n", "int64")
    mod = make_module({"x": ((5, 8), F32), "w0": ((8, n), F32), "w1": ((8, 4), F32), "w2": ((8, 4), F32),
                       "w3": ((8, 6), F32)},
                      lambda bb, x, *ws: [bb.emit(R.matmul(x, w)) for w in ws])
    groups = []
    new = CombineParallelOps(to_batch=True, on_combine=groups.append)(mod)
    assert [(g.stacked, [str(w) for w in g.widths]) for g in groups] == [(False, ["4", "4", "6", "n"])]
    assert ops(new, "matmul") == 1
    for size in (1, 7):
        assert_same_outputs(mod, new, random_inputs(mod, sizes={"n": size}))
    assert ops(CombineParallelOps(to_batch=True)(new), "matmul") == 1  # idempotent


def test_to_batch_with_a_symbolic_batch():
    mod = _symbolic_batch_module((6, 6))
    groups = []
    new = CombineParallelMatmul(to_batch=True, on_combine=groups.append)(mod)
    assert [g.stacked for g in groups] == [True] and ops(new, "matmul") == 1 and ops(new, "add") == 1
    assert_same_outputs(mod, new, random_inputs(mod, sizes={"n": 3, "s": 7}))


def _width(y):
    return y.ty.shape.values[-1].value


FOLLOWER_KINDS = {  # name: (build the follower of branch i, the op that must remain once)
    "exp": (lambda y, i: R.exp(y), "exp"),
    "abs": (lambda y, i: R.abs(y), "abs"),
    "negative": (lambda y, i: R.negative(y), "negative"),
    "erf": (lambda y, i: R.erf(y), "erf"),
    "square": (lambda y, i: R.square(y), "square"),
    "clip": (lambda y, i: R.clip(y, -0.5, 0.5), "clip"),
    "leakyrelu": (lambda y, i: R.nn.leakyrelu(y, alpha=0.1), "nn.leakyrelu"),
    "softplus": (lambda y, i: R.nn.softplus(y), "nn.softplus"),
    "maximum": (lambda y, i: R.maximum(y, relax.const(0.1 * i, F32)), "maximum"),
    "minimum": (lambda y, i: R.minimum(_const((1, _width(y)), 20 + i), y), "minimum"),
    "subtract": (lambda y, i: R.subtract(y, _const((_width(y),), 30 + i)), "subtract"),
    "divide": (lambda y, i: R.divide(y, relax.const(2.0 + i, F32)), "divide"),
    "power": (lambda y, i: R.power(y, relax.const(2.0, F32)), "power"),
    "where": (lambda y, i: R.where(relax.const(np.arange(_width(y)) % 2 == i % 2), y, relax.const(0.0, F32)), "where"),
}


@pytest.mark.parametrize("kind", sorted(FOLLOWER_KINDS))
def test_follower_kinds_numerically(kind):
    make, op = FOLLOWER_KINDS[kind]

    def body(bb, x, w0, w1, w2):
        return [bb.emit(make(bb.emit(R.matmul(x, w)), i)) for i, w in enumerate((w0, w1, w2))]

    mod = make_module({"x": ((2, 3, 8), F32), "w0": ((8, 4), F32), "w1": ((8, 6), F32), "w2": ((8, 2), F32)}, body)
    new = CombineParallelMatmul()(mod)
    assert ops(mod, op) == 3 and ops(new, "matmul") == 1 and ops(new, op) == 1
    assert_same_outputs(mod, new, random_inputs(mod), atol=1e-4)


def test_inputs_differing_only_in_repeated_operands_stay_apart():
    """``layer_norm(x, x, g)`` and ``layer_norm(x, g, g)`` are different inputs (issue 8, item 1)."""

    def body(bb, x, g):
        a = bb.emit(R.nn.layer_norm(x, x, g, axes=[0, 1]))
        b = bb.emit(R.nn.layer_norm(x, g, g, axes=[0, 1]))
        c = bb.emit(R.nn.layer_norm(x, x, g, axes=[0, 1]))  # equal to ``a``: may join it
        ws = [relax.const(np.random.default_rng(i).standard_normal((8, n)).astype("float32")) for i, n in enumerate((5, 6, 7))]
        return [bb.emit(R.matmul(v, w)) for v, w in zip((a, b, c), ws)]

    mod = make_module({"x": ((4, 8), "float32"), "g": ((4, 8), "float32")}, body)
    new = CombineParallelMatmul()(mod)
    assert ops(mod, "matmul") == 3 and ops(new, "matmul") == 2  # a and c combine, b stays alone
    assert_same_outputs(mod, new, random_inputs(mod))


# -- drop-in replacement for TVM's CombineParallelMatmul (issue 12) ----------------------------


def _tvm_style_module(bias_first=False):
    """Weights and biases as parameters, matmul then add then relu: the form TVM's pass matches."""

    def body(bb, x, w0, w1, w2, b0, b1, b2):
        outs = []
        for w, b in ((w0, b0), (w1, b1), (w2, b2)):
            y = bb.emit(R.matmul(x, w))
            outs.append(bb.emit(R.nn.relu(bb.emit(R.add(b, y) if bias_first else R.add(y, b)))))
        return outs

    params = {"x": ((3, 8), F32)}
    params.update({f"w{i}": ((8, n), F32) for i, n in enumerate((4, 5, 6))})
    params.update({f"b{i}": ((n,), F32) for i, n in enumerate((4, 5, 6))})
    return make_module(params, body)


def test_tvm_check_signature_positionally():
    mod = _tvm_style_module()
    seen = []

    def tvm_check(lhs, rhs, bias, bindings):
        seen.append((str(lhs), [str(r) for r in rhs], [str(b) for b in bias], len(bindings)))
        return True

    ours = CombineParallelMatmul(tvm_check)(mod)
    theirs = relax.transform.CombineParallelMatmul(tvm_check)(mod)
    assert seen[0] == seen[1] == ("x", ["w0", "w1", "w2"], ["b0", "b1", "b2"], 10)  # what TVM hands over
    assert ops(ours, "matmul") == ops(theirs, "matmul") == 1
    assert_same_outputs(mod, ours, random_inputs(mod))
    assert tvm_ffi_equal(CombineParallelMatmul(lambda lhs, rhs, bias, bindings: False)(mod), mod)  # a veto


def test_tvm_check_as_keyword_and_our_candidate_check():
    mod = _tvm_style_module()
    assert ops(CombineParallelMatmul(check=lambda lhs, rhs, bias, bindings: len(rhs) == 3)(mod), "matmul") == 1
    assert tvm_ffi_equal(CombineParallelMatmul(check=lambda lhs, rhs, bias, bindings: len(rhs) == 2)(mod), mod)
    assert ops(CombineParallelMatmul(check=lambda c: len(c.roots) == 3)(mod), "matmul") == 1
    with pytest.raises(TypeError, match="a positional check has TVM's signature check\\(lhs, rhs, bias, bindings\\)"):
        CombineParallelMatmul(lambda candidate: True)
    with pytest.raises(TypeError, match="CombineParallelMatmul: check given twice"):
        CombineParallelMatmul(lambda a, b, c, d: True, check=lambda c: True)
    with pytest.raises(TypeError, match="CombineParallelMatmul: check must be callable or None, got int"):
        CombineParallelMatmul(3)


@pytest.mark.parametrize("bias_first", [False, True])
def test_ours_combines_whatever_tvms_pass_does(bias_first):
    mod = _tvm_style_module(bias_first)
    ours, theirs = CombineParallelMatmul()(mod), relax.transform.CombineParallelMatmul()(mod)
    assert ops(ours, "matmul") <= ops(theirs, "matmul") and ops(ours, "matmul") == 1
    inputs = random_inputs(mod)
    assert_same_outputs(mod, ours, inputs)
    for got, want in zip(run(ours, inputs), run(theirs, inputs)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_to_batch_concatenates_several_widths_on_one_input():
    # widths 2, 3, 2, 1: one concatenated matmul rather than a stack of the 2s beside two more ops
    mod = make_module({"x": ((3, 6), F32)}, lambda bb, x: [bb.emit(R.matmul(x, _const((6, n), i)))
                                                           for i, n in enumerate((2, 3, 2, 1))])
    groups = []
    once = CombineParallelMatmul(to_batch=True, on_combine=groups.append)(mod)
    assert ops(once, "matmul") == 1 and [(g.stacked, list(g.widths)) for g in groups] == [(False, [2, 3, 2, 1])]
    assert tvm_ffi_equal(CombineParallelMatmul(to_batch=True)(once), once)
    assert_same_outputs(mod, once, random_inputs(mod))
