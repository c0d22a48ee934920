"""Hypothesis: random parallel dense/conv branches in Relay keep their outputs."""

import numpy as np
from helpers import assert_same_outputs, make_module, ops, random_inputs, unchanged
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tvm import relay

from tvm_combiners.relay import CombineParallelOps

FOLLOWERS = ["bias_add", "add", "add_first", "scale", "scale_own", "relu", "sigmoid", "reshape_same"]


def follower(kind, y, n, const):
    if kind == "bias_add":
        return relay.nn.bias_add(y, const((n,)), axis=-1)
    if kind == "add":
        return relay.add(y, const((n,)))
    if kind == "add_first":
        return relay.add(const((1, n)), y)
    if kind == "scale":
        return relay.multiply(y, relay.const(0.25))
    if kind == "scale_own":
        return relay.multiply(const(()), y)
    if kind == "reshape_same":
        return relay.reshape(y, (3, n))
    return {"relu": relay.nn.relu, "sigmoid": relay.sigmoid}[kind](y)


@st.composite
def dense_graphs(draw):
    common = draw(st.lists(st.sampled_from(FOLLOWERS), max_size=3))
    branches = [{
        "n": draw(st.integers(1, 5)),
        "other_k": draw(st.integers(0, 9)) == 0,
        "followers": common if draw(st.integers(0, 4)) else draw(st.lists(st.sampled_from(FOLLOWERS), max_size=3)),
        "reshaped_input": draw(st.booleans()),
        "depends_on_previous": draw(st.integers(0, 9)) == 0,
    } for _ in range(draw(st.integers(1, 4)))]
    return branches, draw(st.booleans()), draw(st.integers(0, 2**16))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dense_graphs())
def test_random_dense_branches(graph):
    branches, to_batch, seed = graph
    rng = np.random.default_rng(seed)

    def const(shape):
        return relay.const(rng.standard_normal(shape).astype("float32"))

    x, x2 = relay.var("x", shape=(3, 6)), relay.var("x2", shape=(3, 7))
    outs, prev = [], None
    for br in branches:
        data, k = (x2, 7) if br["other_k"] else (x, 6)
        if br["reshaped_input"]:
            data = relay.reshape(data, (3, k))
        w = const((br["n"], k))
        if br["depends_on_previous"] and prev is not None:
            w = relay.add(w, relay.mean(prev))
        y = relay.nn.dense(data, w)
        for kind in br["followers"]:
            y = follower(kind, y, br["n"], const)
        outs.append(y)
        prev = y
    mod = make_module(outs, [x, x2])
    combine = CombineParallelOps(to_batch=to_batch)
    new = combine(mod)
    assert ops(new, "nn.dense") + ops(new, "nn.batch_matmul") <= ops(mod, "nn.dense")
    assert unchanged(combine(new), new)
    assert_same_outputs(mod, new, random_inputs(mod, seed), atol=1e-4)
