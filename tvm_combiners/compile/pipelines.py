"""What the package compiles Relax with: TVM's pipelines, with the default schedules on llvm."""

from __future__ import annotations

from typing import Any

import tvm
from tvm import relax
from tvm.relax.backend.cpu_generic import pipeline as cpu_generic  # its package exports two of the four lists
from tvm.target import Target

from .in_place import InPlaceCombinedBuffers
from .legalize import legalizations
from .schedules import default_schedules


def fusion_passes(target: Target) -> list[tvm.transform.Pass]:
    """Library dispatch, legalize and fuse, as TVM's pipelines do before scheduling (and MetaSchedule
    before extracting tasks: the tasks' keys are these functions), with :func:`~.legalize.legalizations`."""
    legalize = relax.transform.LegalizeOps(legalizations(target))
    return [*relax.pipeline.library_dispatch_passes(target), legalize,
            relax.transform.AnnotateTIROpPattern(), relax.transform.FoldConstant(), relax.transform.FuseOps(),
            relax.transform.FuseTIR()]


def cpu_pipeline(target: Target, database: Any = None, schedules: bool = True) -> tvm.transform.Pass:
    """TVM's llvm pipeline with, after fusion, a tuning database's schedules and then the defaults.

    ``database``: MetaSchedule's records applied first (the caller enters it as the current
    database); the default schedules take what it does not cover. ``schedules=False`` leaves them
    out: without a database, that is TVM's llvm pipeline as it is, but for
    :func:`~.in_place.InPlaceCombinedBuffers` (once the functions have no dataflow blocks), which
    lets kernels read and write combined collectives' buffers in place and changes nothing else.
    """

    @tvm.transform.module_pass(opt_level=0, name="tvm_combiners.CPUPipeline")
    def run(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        passes = fusion_passes(target)
        if database is not None:
            passes.append(relax.transform.MetaScheduleApplyDatabase())
        if schedules:
            passes.append(default_schedules())
        lower = cpu_generic.dataflow_lower_passes(target)
        at = next((i for i, p in enumerate(lower) if p.info.name == "CallTIRRewrite"), len(lower))
        passes += [*lower[:at], InPlaceCombinedBuffers(), *lower[at:], *cpu_generic.finalize_passes(target)]
        with target:
            return tvm.transform.Sequential(passes)(mod)

    return run


def default_pipeline(target: Target) -> tvm.transform.Pass:
    """What this package compiles with: TVM's default pipeline, scheduled on llvm too."""
    return cpu_pipeline(target) if target.kind.name == "llvm" else relax.get_default_pipeline(target)
