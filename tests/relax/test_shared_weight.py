"""Shared-weight combining: ``x1 @ W``, ``x2 @ W``, ... become one matmul over stacked rows (issue 12)."""

import numpy as np
import pytest
import tvm_ffi
from helpers import R, assert_same_outputs, make_module, ops, random_inputs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tvm import relax

from tvm_combiners.relax import CombineParallelMatmul, CombineParallelOps, CombineSharedWeightMatmul

F32 = "float32"


def _const(shape, seed):
    return relax.const(np.random.default_rng(seed).standard_normal(shape).astype(F32))


def test_inputs_of_different_rows_share_one_weight_with_followers():
    def body(bb, x1, x2, x3, w, b):
        return [bb.emit(R.nn.relu(bb.emit(R.add(bb.emit(R.matmul(x, w)), b)))) for x in (x1, x2, x3)]

    mod = make_module({"x1": ((3, 8), F32), "x2": ((5, 8), F32), "x3": ((2, 8), F32), "w": ((8, 6), F32),
                       "b": ((6,), F32)}, body)
    seen = []
    new = CombineSharedWeightMatmul(on_combine=seen.append)(mod)
    assert ops(mod, "matmul") == 3 and ops(new, "matmul") == 1
    assert ops(new, "add") == 1 and ops(new, "nn.relu") == 1  # followers combined, the bias used once
    assert seen[0].shares == "weight" and seen[0].widths == (3, 5, 2)
    assert seen[0].describe() == "3 x matmul -> add -> nn.relu: shared weight (8, 6), inputs of rows [3, 5, 2]"
    assert_same_outputs(mod, new, random_inputs(mod))
    assert tvm_ffi.structural_equal(CombineSharedWeightMatmul()(new), new)  # idempotent


def test_per_branch_biases_and_batched_inputs():
    def body(bb, x1, x2, w):
        return [bb.emit(R.add(bb.emit(R.matmul(x, w)), _const((6,), i))) for i, x in enumerate((x1, x2))]

    mod = make_module({"x1": ((2, 3, 8), F32), "x2": ((2, 4, 8), F32), "w": ((8, 6), F32)}, body)
    new = CombineSharedWeightMatmul()(mod)
    assert ops(new, "matmul") == 1 and ops(new, "add") == 1
    assert_same_outputs(mod, new, random_inputs(mod))


def test_constant_weight_and_unrolled_recurrence():
    """Input projections of an unrolled RNN combine; the recurrent matmuls depend on each other."""
    w_in, w_rec = _const((8, 8), 1), _const((8, 8), 2)

    def body(bb, x0, x1, x2, h):
        for x in (x0, x1, x2):
            h = bb.emit(R.tanh(bb.emit(R.add(bb.emit(R.matmul(x, w_in)), bb.emit(R.matmul(h, w_rec))))))
        return h

    mod = make_module({"x0": ((2, 8), F32), "x1": ((2, 8), F32), "x2": ((2, 8), F32), "h": ((2, 8), F32)}, body)
    new = CombineParallelOps()(mod)
    assert ops(mod, "matmul") == 6 and ops(new, "matmul") == 4  # 3 input projections -> 1; 3 recurrent stay
    assert_same_outputs(mod, new, random_inputs(mod))


def test_what_stays_apart():
    def body(bb, x1, x2, x3, w):
        y1 = bb.emit(R.matmul(x1, w))
        y2 = bb.emit(R.matmul(bb.emit(R.nn.relu(y1)), w))  # reads the first branch: dependent
        y3 = bb.emit(R.matmul(x3, w))  # batch 3 vs 2: rows cannot stack
        return [y1, y2, y3, bb.emit(R.matmul(x2, w))]

    mod = make_module({"x1": ((2, 4, 8), F32), "x2": ((2, 5, 8), F32), "x3": ((3, 4, 8), F32),
                       "w": ((8, 8), F32)}, body)
    new = CombineSharedWeightMatmul()(mod)
    assert ops(new, "matmul") == 3  # only x1 and x2 combine
    assert_same_outputs(mod, new, random_inputs(mod))
    assert tvm_ffi.structural_equal(CombineParallelMatmul()(mod), mod)  # not TVM's kind of group


def test_shared_input_groups_come_first():
    def body(bb, x, y, w1, w2):
        return [bb.emit(R.matmul(x, w1)), bb.emit(R.matmul(x, w2)), bb.emit(R.matmul(y, w1))]

    mod = make_module({"x": ((3, 8), F32), "y": ((4, 8), F32), "w1": ((8, 5), F32), "w2": ((8, 6), F32)}, body)
    seen = []
    new = CombineParallelOps(on_combine=seen.append)(mod)
    assert [c.shares for c in seen] == ["input"] and ops(new, "matmul") == 2
    assert_same_outputs(mod, new, random_inputs(mod))


@st.composite
def shared_weight_graphs(draw):
    """Branches reading one weight, some through another branch, some with per-branch biases."""
    n = draw(st.integers(2, 5))
    rows = draw(st.lists(st.integers(1, 4), min_size=n, max_size=n))
    chained = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    follower = draw(st.sampled_from(["none", "shared_bias", "own_bias", "relu"]))
    return rows, chained, follower


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shared_weight_graphs())
def test_property_shared_weight_graphs(graph):
    rows, chained, follower = graph
    params = {f"x{i}": ((r, 6), F32) for i, r in enumerate(rows)}
    params["w"] = ((6, 6), F32)

    def body(bb, *args):
        *xs, w = args
        outs = []
        for i, x in enumerate(xs):
            if chained[i] and outs and int(outs[-1].ty.shape[0]) == int(x.ty.shape[0]):
                x = bb.emit(R.add(x, outs[-1]))  # depends on the previous branch
            y = bb.emit(R.matmul(x, w))
            if follower == "shared_bias":
                y = bb.emit(R.add(y, _const((6,), 0)))
            elif follower == "own_bias":
                y = bb.emit(R.add(y, _const((6,), i)))
            elif follower == "relu":
                y = bb.emit(R.nn.relu(y))
            outs.append(y)
        return outs

    mod = make_module(params, body)
    new = CombineSharedWeightMatmul()(mod)
    assert ops(new, "matmul") <= ops(mod, "matmul")
    assert_same_outputs(mod, new, random_inputs(mod))
    assert tvm_ffi.structural_equal(CombineSharedWeightMatmul()(new), new)


@pytest.mark.parametrize("limit, expected", [(None, 1), (3 * 8 * 4 + 5 * 8 * 4, 2)])
def test_byte_limit_counts_the_concatenated_inputs(limit, expected):
    def body(bb, x1, x2, x3, w):
        return [bb.emit(R.matmul(x, w)) for x in (x1, x2, x3)]

    mod = make_module({"x1": ((3, 8), F32), "x2": ((5, 8), F32), "x3": ((2, 8), F32), "w": ((8, 6), F32)}, body)
    new = CombineSharedWeightMatmul(max_combined_bytes=limit)(mod)
    assert ops(new, "matmul") == expected
    assert_same_outputs(mod, new, random_inputs(mod))


@pytest.mark.parametrize("differ", [False, True], ids=["equal", "one element differs"])
def test_equal_constant_weights_built_once_per_use_are_one_weight(differ):
    """``x_i @ relax.const(W)`` with W built three times: three Constants of equal bytes (Relay too).
    Large constants compare by a sample, then a digest of their bytes; one different element keeps
    that weight apart."""
    w = np.random.default_rng(0).standard_normal((64, 32)).astype(F32)  # 2048 elements: every 2nd sampled
    weights = [w.copy() for _ in range(3)]
    if differ:
        weights[2][7, 5] += 1  # element 229, off the sample's stride: only the digest tells
    mod = make_module({f"x{i}": ((2 + i, 64), F32) for i in range(3)},
                      lambda bb, *xs: [bb.emit(R.matmul(x, relax.const(wi))) for x, wi in zip(xs, weights)])
    new = CombineSharedWeightMatmul()(mod)
    assert ops(new, "matmul") == (2 if differ else 1)
    assert_same_outputs(mod, new, random_inputs(mod))
