"""MetaSchedule's builder and runner as the job uses them, and the module as tuning sees it."""

from __future__ import annotations

import functools
from typing import Any

import tvm

from ..pipelines import fusion_passes


def meta_schedule() -> Any:
    from tvm.s_tir import meta_schedule

    return meta_schedule


@functools.cache
def builder(kind: str) -> Any:
    """MetaSchedule's builder, made once per process: its worker processes import TVM (seconds each),
    and the job tunes two modules."""
    return meta_schedule().builder.LocalBuilder(f_build=build_candidate, timeout_sec=60 if kind == "llvm" else 120)


@functools.cache
def runner() -> Any:
    """MetaSchedule's runner, made once per process (as :func:`builder`)."""
    return meta_schedule().runner.LocalRunner()


def fused(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule:
    """The module as :func:`compile_tuned` sees it before applying the database, so task keys match."""
    with target:
        return tvm.transform.Sequential(fusion_passes(target))(mod)


def build_candidate(mod: tvm.IRModule, target: tvm.target.Target, _params: Any) -> Any:
    """MetaSchedule's builder step without importing ``tvm.s_tir.tensor_intrin``.

    TVM's default build imports that module in every fresh builder process, and the import alone
    takes ~30 s on a 2-core machine: longer than the builder's timeout, so every candidate would fail
    to build. A candidate reaches the builder already scheduled (any tensorize done), so the build
    looks nothing up in that registry.
    """
    from tvm.driver import build
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    return build(RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod), target=target)
