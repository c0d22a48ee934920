"""Hypothesis: random parallel-branch graphs keep their outputs and stay well formed."""

import numpy as np
import tvm_ffi
from helpers import R, assert_same_outputs, make_module, ops, random_inputs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tvm import relax

from tvm_combiners.relax import CombineParallelOps

F32 = "float32"
FOLLOWERS = ["bias", "bias_first", "row_bias", "scale_shared", "scale_own", "relu", "gelu", "sigmoid", "sub_scalar"]


@st.composite
def matmul_graphs(draw):
    batch = draw(st.sampled_from([(), (2,), (2, 3)]))
    k = draw(st.integers(2, 6))
    n_branches = draw(st.integers(1, 4))
    common = draw(st.lists(st.sampled_from(FOLLOWERS), max_size=3))  # most branches share a chain
    branches = []
    for _ in range(n_branches):
        branches.append({
            "n": draw(st.integers(1, 5)),
            "k": k if draw(st.integers(0, 9)) else k + 1,  # sometimes a different K (own input)
            "const": draw(st.booleans()),
            "followers": common if draw(st.integers(0, 4)) else draw(st.lists(st.sampled_from(FOLLOWERS), max_size=3)),
            "reshaped_input": draw(st.booleans()),
            "depends_on_previous": draw(st.integers(0, 9)) == 0,
            "also_output_root": draw(st.integers(0, 7)) == 0,
        })
    return batch, k, branches, draw(st.booleans()), draw(st.integers(0, 2**16))


def follower(kind, y, n, const):
    if kind == "bias":
        return R.add(y, const((n,)))
    if kind == "bias_first":
        return R.add(const((n,)), y)
    if kind == "row_bias":
        return R.add(y, const((3, 1)))
    if kind == "scale_shared":
        return R.multiply(y, relax.const(0.5, F32))
    if kind == "scale_own":
        return R.multiply(y, const(()))
    if kind == "sub_scalar":
        return R.subtract(relax.const(1.0, F32), y)
    return {"relu": R.nn.relu, "gelu": R.nn.gelu, "sigmoid": R.sigmoid}[kind](y)


def build(batch, k, branches, to_batch, seed):
    rng = np.random.default_rng(seed)

    def const(shape):
        return relax.const(rng.standard_normal(shape).astype(F32))

    params = {"x": ((*batch, 3, k), F32), "x2": ((*batch, 3, k + 1), F32)}
    for i, br in enumerate(branches):
        if not br["const"]:
            params[f"w{i}"] = ((br["k"], br["n"]), F32)

    def body(bb, x, x2, *weights):
        outs, prev, wi = [], None, 0
        for br in branches:
            data = x if br["k"] == k else x2
            if br["reshaped_input"]:
                data = bb.emit(R.reshape(data, data.ty.shape))  # an equal copy of the shared input
            if br["const"]:
                w = const((br["k"], br["n"]))
            else:
                w, wi = weights[wi], wi + 1
            if br["depends_on_previous"] and prev is not None:
                w = bb.emit(R.add(w, bb.emit(R.mean(prev))))
            y = bb.emit(R.matmul(data, w))
            if br["also_output_root"]:
                outs.append(y)
            for kind in br["followers"]:
                y = bb.emit(follower(kind, y, br["n"], const))
            outs.append(y)
            prev = y
        return outs

    return make_module(params, body)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(matmul_graphs())
def test_random_matmul_branches(graph):
    mod = build(*graph)
    combine = CombineParallelOps(to_batch=graph[3])
    new = combine(mod)
    assert relax.analysis.check_well_formed(new)
    assert ops(new, "matmul") <= ops(mod, "matmul")
    assert tvm_ffi.structural_equal(combine(new), new)  # idempotent
    assert_same_outputs(mod, new, random_inputs(mod, seed=graph[-1]), atol=1e-4)


@st.composite
def conv_graphs(draw):
    layout = draw(st.sampled_from(["NCHW", "NHWC"]))
    stride = draw(st.sampled_from([1, 2]))
    branches = [(draw(st.integers(1, 4)), draw(st.sampled_from([1, 3, 5])), draw(st.booleans()))
                for _ in range(draw(st.integers(2, 4)))]
    return layout, stride, branches, draw(st.integers(0, 2**16))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conv_graphs())
def test_random_conv_branches(graph):
    layout, stride, branches, seed = graph
    rng = np.random.default_rng(seed)
    kernel_layout = "OIHW" if layout == "NCHW" else "HWIO"

    def body(bb, x):
        outs = []
        for out_c, k, relu in branches:
            dims = {"O": out_c, "I": 3, "H": k, "W": k}
            w = relax.const(rng.standard_normal([dims[c] for c in kernel_layout]).astype(F32))
            y = bb.emit(R.nn.conv2d(x, w, strides=stride, padding=k // 2, data_layout=layout,
                                    kernel_layout=kernel_layout))
            outs.append(bb.emit(R.nn.relu(y)) if relu else y)
        return outs

    shape = (1, 3, 9, 9) if layout == "NCHW" else (1, 9, 9, 3)
    mod = make_module({"x": (shape, F32)}, body)
    new = CombineParallelOps()(mod)
    assert ops(new, "nn.conv2d") == 1
    assert_same_outputs(mod, new, random_inputs(mod, seed=seed), atol=1e-4)
