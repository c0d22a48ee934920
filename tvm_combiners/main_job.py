"""The main job: import an ONNX model, combine, compile, run, compare with onnxruntime, report."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any, Protocol, TextIO

import numpy as np

from .models import default_model_path, example_inputs, prepare_onnx, run_onnxruntime

COUNTED_OPS = ("matmul", "dense", "batch_matmul", "conv2d")


class Backend(Protocol):
    """What the job needs from an IR (Relax or Relay)."""

    name: str

    def import_model(self, model: Any) -> Any: ...
    def combine(self, mod: Any, on_combine: Any) -> Any: ...
    def count_ops(self, mod: Any) -> dict[str, int]: ...
    def compile(self, mod: Any, target: str) -> Any: ...
    def run(self, built: Any, inputs: dict[str, np.ndarray], target: str) -> list[np.ndarray]: ...
    def time(self, built: Any, inputs: dict[str, np.ndarray], target: str, repeat: int) -> float:
        """Median seconds per run, inputs already on the device (TVM's time evaluator)."""
    def has_gpu(self) -> bool: ...


@dataclass
class Variant:
    label: str
    ops: dict[str, int]
    compile_s: float
    latency_s: float | None = None
    max_abs_diff: float | None = None


@dataclass
class JobReport:
    model: str
    ir: str
    target: str
    batch: int
    seq: int
    variants: list[Variant] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)
    executed: bool = True
    note: str = ""

    def table(self) -> str:
        ops = sorted({k for v in self.variants for k, n in v.ops.items() if n} or {"matmul"})
        head = ["module"] + [f"#{k}" for k in ops] + ["compile s", "latency ms", "max |diff| vs ORT"]
        rows = [head]
        for v in self.variants:
            rows.append(
                [v.label] + [str(v.ops.get(k, 0)) for k in ops] + [f"{v.compile_s:.2f}"]
                + ["-" if v.latency_s is None else f"{v.latency_s * 1e3:.2f}"]
                + ["-" if v.max_abs_diff is None else f"{v.max_abs_diff:.2e}"]
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        if len(self.variants) == 2 and all(v.latency_s for v in self.variants):
            ratio = self.variants[0].latency_s / self.variants[1].latency_s
            lines.append(f"speedup of combined over baseline: {ratio:.2f}x")
        return "\n".join(lines)

    def render(self) -> str:
        out = [f"model {self.model}  ir {self.ir}  target {self.target}  batch {self.batch}  seq {self.seq}", self.table()]
        out.append(f"combined groups: {len(self.groups)}")
        out += [f"  {g}" for g in self.groups]
        if self.note:
            out.append(self.note)
        return "\n".join(out)


def max_abs_diff(outputs: list[np.ndarray], reference: list[np.ndarray]) -> float:
    """Largest absolute difference over all outputs, computed in float64."""
    if len(outputs) != len(reference):
        raise ValueError(f"{len(outputs)} outputs but {len(reference)} reference outputs")
    return max(float(np.max(np.abs(np.asarray(o, np.float64) - np.asarray(r, np.float64))))
               for o, r in zip(outputs, reference))


def _backend(ir: str) -> Backend:
    if ir == "relax":
        from .relax.job import RelaxBackend

        return RelaxBackend()
    if ir == "relay":
        from .relay.job import RelayBackend

        return RelayBackend()
    raise ValueError(f"unknown IR {ir!r}: expected 'relax' or 'relay'")


def run_job(model_path: str | None = None, target: str = "llvm", ir: str = "relax", batch: int = 1, seq: int = 128,
            combine: bool = True, repeat: int = 5, log: TextIO | None = None) -> JobReport:
    def progress(msg: str) -> None:
        print(f"[tvm-combiners] {msg}", file=log or sys.stderr, flush=True)

    path = model_path or default_model_path()
    backend = _backend(ir)
    if target not in ("llvm", "cuda"):
        raise ValueError(f"unknown target {target!r}: expected 'llvm' or 'cuda'")
    progress(f"preparing {path} (batch {batch}, seq {seq})")
    model = prepare_onnx(path, batch, seq)
    inputs = example_inputs(model, batch, seq)
    progress("running onnxruntime for reference outputs")
    reference = run_onnxruntime(model, inputs)
    progress(f"importing into {ir}")
    baseline = backend.import_model(model)
    report = JobReport(str(path), ir, target, batch, seq)
    modules = [("baseline", baseline)]
    if combine:
        progress("combining parallel ops")
        combined = backend.combine(baseline, lambda cand: report.groups.append(cand.describe()))
        modules.append(("combined", combined))
    executable = target == "llvm" or backend.has_gpu()
    if not executable:
        report.executed = False
        report.note = "no CUDA GPU here: compiled with nvcc, not executed"
    for label, mod in modules:
        progress(f"compiling {label} for {target}")
        start = time.perf_counter()
        built = backend.compile(mod, target)
        variant = Variant(label, backend.count_ops(mod), time.perf_counter() - start)
        if executable:
            progress(f"running {label} ({repeat} timed runs)")
            variant.max_abs_diff = max_abs_diff(backend.run(built, inputs, target), reference)
            variant.latency_s = backend.time(built, inputs, target, repeat)
        report.variants.append(variant)
    return report
