"""Build small Relay modules, run them, compare before and after a pass."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tvm
from tvm import relay

from tvm_combiners.compile.relay_runner import build, count_ops, run_graph


def make_module(outputs, params: Sequence[relay.Var]) -> tvm.IRModule:
    body = relay.Tuple(list(outputs)) if isinstance(outputs, (list, tuple)) else outputs
    mod = tvm.IRModule.from_expr(relay.Function(list(params), body))
    return relay.transform.InferType()(mod)


def const(shape, seed, dtype="float32"):
    return relay.const(np.random.default_rng(seed).standard_normal(shape).astype(dtype))


def random_inputs(mod: tvm.IRModule, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {p.name_hint: rng.standard_normal([int(d) for d in p.checked_type.shape]).astype(p.checked_type.dtype)
            for p in mod["main"].params}


def run(mod: tvm.IRModule, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    return run_graph(build(mod), inputs)


def assert_same_outputs(before, after, inputs, atol=1e-5):
    relay.transform.InferType()(after)  # well typed
    expected, got = run(before, inputs), run(after, inputs)
    assert len(expected) == len(got)
    for e, g in zip(expected, got):
        assert e.shape == g.shape and e.dtype == g.dtype
        np.testing.assert_allclose(g, e, atol=atol, rtol=1e-5)


def ops(mod, name):
    return count_ops(mod)[name]


def unchanged(before, after) -> bool:
    return bool(tvm.ir.structural_equal(before, after))
