"""Compile and run Relax modules, count ops: shared by the CLI, tests and benchmarks."""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any

import numpy as np
import tvm
from tvm import relax

from .host import llvm_options, rank_gpu
from .pipelines import default_pipeline


def make_target(kind: str, cpu: str | None = None) -> tvm.target.Target:
    """``llvm`` for this CPU (or the LLVM CPU ``cpu`` names), or ``cuda`` (sm_90 unless a GPU says
    otherwise) with that llvm host.

    TVM 0.27 computes right with every extension of the x86 CPUs measured (AVX2, AVX-512, VNNI,
    AMX: it emits no AMX or int8 dot-product kernels of its own), so none is left out.
    """
    if kind == "llvm":
        return tvm.target.Target({"kind": "llvm", **llvm_options(cpu)})
    if kind == "cuda":
        arch = "sm_90"
        dev = tvm.cuda(0)
        if dev.exist:
            arch = "sm_" + str(dev.compute_version).replace(".", "")
        return tvm.target.Target({"kind": "cuda", "arch": arch}, host={"kind": "llvm", **llvm_options(cpu)})
    raise ValueError(f"unknown target {kind!r}: expected 'llvm' or 'cuda'")


def device_for(kind: str) -> tvm.runtime.Device:
    """The CPU, or this rank's GPU (:func:`~tvm_combiners.compile.host.rank_gpu`)."""
    return tvm.cpu() if kind == "llvm" else tvm.cuda(rank_gpu())


def has_gpu() -> bool:
    try:
        return bool(tvm.cuda(0).exist)
    except Exception:  # noqa: BLE001 - no CUDA driver at all
        return False


def compile_module(mod: tvm.IRModule, target: str = "llvm", relax_pipeline: Any = None, cpu: str | None = None) -> Any:
    """``tvm.compile`` with TVM's default pipeline for ``target``, scheduled on llvm too (:mod:`.schedules`);
    ``cpu``: the LLVM CPU to compile for instead of this machine's."""
    tgt = make_target(target, cpu)
    if relax_pipeline is None:
        relax_pipeline = default_pipeline(tgt)
    return tvm.compile(mod, target=tgt, relax_pipeline=relax_pipeline)


def cuda_source(executable: Any) -> str:
    """The CUDA C of every kernel a cuda build produced (empty when there is none)."""
    sources, stack = [], [executable.mod]
    while stack:
        module = stack.pop()
        if module.kind == "cuda":
            sources.append(module.inspect_source())
        stack.extend(module.imports)
    return "\n".join(sources)


def _to_numpy(value: Any) -> list[np.ndarray]:
    if hasattr(value, "numpy"):
        return [value.numpy()]
    out: list[np.ndarray] = []
    for item in value:
        out.extend(_to_numpy(item))
    return out


def _vm_with_args(executable: Any, inputs: Sequence[np.ndarray], target: str,
                  params: Sequence[Any]) -> tuple[Any, list[Any], Any]:
    dev = device_for(target)
    vm = relax.VirtualMachine(executable, dev)
    args = [tvm.runtime.tensor(np.asarray(a), dev) for a in inputs]
    args += [tvm.runtime.tensor(p.numpy() if hasattr(p, "numpy") else np.asarray(p), dev) for p in params]
    return vm, args, dev


def run_vm(executable: Any, inputs: Sequence[np.ndarray], target: str = "llvm", params: Sequence[Any] = (),
           func: str = "main") -> list[np.ndarray]:
    """Run ``func`` once; outputs flattened to numpy arrays."""
    vm, args, _ = _vm_with_args(executable, inputs, target, params)
    return _to_numpy(vm[func](*args))


def time_vm(executable: Any, inputs: Sequence[np.ndarray], target: str = "llvm", params: Sequence[Any] = (),
            number: int = 5, func: str = "main") -> float:
    """Median seconds per call, measured with the VM's time evaluator (inputs on the device once)."""
    vm, args, dev = _vm_with_args(executable, inputs, target, params)
    timer = vm.time_evaluator(func, dev, number=1, repeat=number)
    return float(np.median(timer(*args).results))


def count_ops(mod: tvm.IRModule, names: Sequence[str] | None = None) -> collections.Counter:
    """How many calls of each op the Relax functions of ``mod`` make (``relax.`` prefix removed)."""
    counts: collections.Counter = collections.Counter()

    def visit(expr: Any) -> None:
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
            name = expr.op.name.removeprefix("relax.")
            if names is None or name in names:
                counts[name] += 1

    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return counts
