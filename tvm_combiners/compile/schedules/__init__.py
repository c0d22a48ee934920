"""Default CPU schedules: TVM's llvm pipeline leaves every function as the naive loops LegalizeOps wrote.

On cuda TVM's default pipeline schedules each fused function with its dlight rules; on llvm it
schedules none, so an untuned model runs as scalar loops (a GEMM is a scalar triple loop). Each
rule here is a dlight ``ScheduleRule`` of its own module, applied where no database or earlier
rule has scheduled a function:

- :class:`~.matmul.CPUMatmul`: GEMMs, with the elementwise epilogue FuseOps put in the same
  function computed on each tile (or column block) while it is in cache.

Everything else keeps its loops: dlight's CPU reduction rule parallelizes a softmax or mean over
a non-last axis into every thread recomputing the whole reduction into one shared buffer (slower,
and a data race), so it is not applied. A rule only splits, reorders, caches and annotates loops
with TVM's schedule primitives, which check each step's dependences; a function it does not
recognise, or a primitive refuses, keeps its loops.
"""

from __future__ import annotations

import tvm
from tvm.s_tir import dlight

from .matmul import CPUMatmul


def cpu_rules() -> list[dlight.ScheduleRule]:
    """The rules an untuned llvm build schedules with (and tuning times as each task's default)."""
    return [CPUMatmul()]


def default_schedules() -> tvm.transform.Pass:
    """The CPU rules over every function no database or earlier rule has scheduled."""
    return dlight.ApplyDefaultSchedule(*cpu_rules())


__all__ = ["CPUMatmul", "cpu_rules", "default_schedules"]
