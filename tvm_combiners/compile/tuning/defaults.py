"""Each tuned task's default schedule, measured as one more candidate of its search.

A small budget can end a search above the schedule an untuned build gets (dlight on cuda, the
default CPU schedules on llvm), so a tuned model can run slower than an untuned one. Committed
beside MetaSchedule's records, timed by the same runner, the default schedule is the best record
of every task whose search did not beat it: such a task is no slower tuned than untuned (to the
runner's measurement), where a default rule schedules it (on llvm only GEMMs) and that schedule
builds and runs. Its trace replays like any record's: it is a schedule. One exception on llvm: a
task is a function alone, so its default reads a GEMM's weight as stored, where an untuned build
reads a constant weight packed at compile time (1.2-1.4x faster GEMMs); a tuned GEMM may then run
slower than the untuned build's.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import Any

import tvm
from tvm.s_tir import dlight

from ...errors import first_line
from ..schedules import cpu_rules


def default_rules(target: tvm.target.Target) -> list[dlight.ScheduleRule]:
    """The rules an untuned build schedules with: ours on llvm, TVM's cuda pipeline's dlight rules on cuda."""
    if target.kind.name == "llvm":
        return cpu_rules()
    if target.kind.name == "cuda":
        gpu = dlight.gpu
        return [gpu.Matmul(), gpu.GEMV(), gpu.Reduction(), gpu.GeneralReduction(), gpu.Fallback()]
    return []


def default_schedule(func: tvm.tirx.PrimFunc, target: tvm.target.Target) -> Any:
    """The first rule's schedule of ``func`` (a ``tir.Schedule`` with its trace), or None where every rule declines."""
    with target:
        for rule in default_rules(target):
            space = rule.apply(func, target, False)
            if space is not None:
                return space[0] if isinstance(space, list) else space
    return None


def commit_defaults(db: Any, tasks: list[Any], target: tvm.target.Target, runner: Any,
                    build: Callable[[tvm.IRModule, tvm.target.Target, Any], Any],
                    say: Callable[[str], None] = lambda msg: None) -> int:
    """Time each task's default schedule with ``runner`` and commit it to ``db`` as a record.

    Returns how many of ``tasks`` it is now the best record of. A task no rule schedules, or whose
    default does not build or run, gets no record (said once per task): its search's records stand.
    """
    from tvm.s_tir import meta_schedule as ms
    from tvm.support.tar import tar

    device = "cpu" if target.kind.name == "llvm" else target.kind.name
    measured = []
    with tempfile.TemporaryDirectory(prefix="tvm-combiners-defaults-") as folder:
        inputs = []
        for task in tasks:
            workload = task.dispatched[0]
            artifact = os.path.join(folder, f"{len(inputs)}.{tar.output_format}")  # as MetaSchedule's builder
            try:
                sch = default_schedule(workload["main"], target)  # dlight's rules assert, some of them
                if sch is None:
                    continue
                build(sch.mod, target, None).export_library(artifact, fcompile=tar)
            except Exception as err:  # noqa: BLE001 - TVM raises many kinds; the search's records stand
                say(f"the default schedule of {task.task_name} did not build ({first_line(err)}): not a candidate")
                continue
            args = ms.arg_info.ArgInfo.from_prim_func(workload["main"])
            inputs.append(ms.runner.RunnerInput(artifact, device, args))
            measured.append((task, workload, sch, args))
        results = [future.result() for future in runner.run(inputs)] if inputs else []
    best = 0
    for (task, workload, sch, args), result in zip(measured, results):
        if result.error_msg or not result.run_secs:
            say(f"the default schedule of {task.task_name} did not run ({_last_line(result.error_msg)}): "
                "not a candidate")
            continue
        key = db.commit_workload(workload)
        db.commit_tuning_record(ms.database.TuningRecord(sch.trace, key, result.run_secs, target, args))
        top = db.get_top_k(key, 1)  # the record the tuned build applies
        best += bool(top) and str(top[0].trace) == str(sch.trace)
    return best


def _last_line(message: str | None) -> str:
    """A runner's error ends with the exception (it begins "LocalRunner: An exception occurred")."""
    lines = [line.strip() for line in (message or "").splitlines() if line.strip()]
    return lines[-1] if lines else "no time measured"
