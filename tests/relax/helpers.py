"""Build small Relax modules, run them on llvm, compare before and after a pass."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import tvm
from tvm import relax

from tvm_combiners.compile.pipelines import cpu_pipeline
from tvm_combiners.compile.relax_runner import compile_module, count_ops, make_target, run_vm

R = relax.op


def make_module(params: dict[str, tuple[Sequence, str]], body: Callable[..., object]) -> tvm.IRModule:
    """``body(*param_vars)`` emits into an open dataflow block and returns the output(s)."""
    bb = relax.BlockBuilder()
    variables = [relax.Var(name, relax.TensorType(shape, dtype)) for name, (shape, dtype) in params.items()]
    with bb.function("main", variables):
        with bb.dataflow():
            out = body(bb, *variables)
            if isinstance(out, (list, tuple)):
                out = relax.Tuple(list(out))
            gv = bb.emit_output(out)
        bb.emit_func_output(gv)
    return bb.get()


def random_inputs(mod: tvm.IRModule, seed: int = 0, sizes: dict | None = None) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    arrays = []
    for p in mod["main"].params:
        shape = [int(d) if isinstance(d, tvm.tirx.IntImm) else sizes[str(d)] for d in p.ty.shape.values]
        arrays.append(rng.standard_normal(shape).astype(str(p.ty.dtype)))
    return arrays


def run(mod: tvm.IRModule, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    return run_vm(compile_module(mod, "llvm"), inputs)


def assert_same_outputs(before: tvm.IRModule, after: tvm.IRModule, inputs: Sequence[np.ndarray],
                        atol: float = 1e-5) -> None:
    assert relax.analysis.check_well_formed(after)
    expected, got = run(before, inputs), run(after, inputs)
    assert len(expected) == len(got)
    for e, g in zip(expected, got):
        assert e.shape == g.shape and e.dtype == g.dtype
        np.testing.assert_allclose(g, e, atol=atol, rtol=1e-5)


def ops(mod: tvm.IRModule, name: str) -> int:
    return count_ops(mod)[name]


def check_scheduled(mod: tvm.IRModule, want: np.ndarray, inputs: list[np.ndarray], cpu: str | None = None) -> None:
    """The build with the default CPU schedules and TVM's naive loops equal ``want`` (relative to its
    largest value) and each other."""
    scheduled = run_vm(compile_module(mod, "llvm", cpu=cpu), inputs)[0]
    naive = run_vm(compile_module(mod, "llvm", cpu_pipeline(make_target("llvm", cpu), schedules=False), cpu=cpu),
                   inputs)[0]
    scale = max(np.abs(want).max(), 1.0)
    assert scheduled.shape == want.shape
    assert np.abs(scheduled - want).max() / scale < 1e-5
    assert np.abs(scheduled - naive).max() / scale < 1e-5
