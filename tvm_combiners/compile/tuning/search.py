"""MetaSchedule tuning for the main job: one persistent database per target, shared by every module.

Why one database for the baseline and the combined module: their common tasks (layer norms,
attention, the GEMMs that were not combined) are tuned once and reused, and only the combined
module's new GEMM shapes become tasks of their own, each with the same trial budget. A second run
on the same target tunes only the tasks the database has never seen, or saw with fewer trials.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tvm

from ...errors import UserError
from ..interrupts import keep_interrupts
from ..pipelines import cpu_pipeline
from . import MAX_TRIALS, TUNE_TASKS
from .database import (
    LEDGER,
    best_records,
    exclusive,
    needs_tuning,
    open_database,
    publish,
    read_ledger,
    recorded_tasks,
    staging_copy,
    task_key,
    write_failure,
)
from .defaults import commit_defaults
from .intrinsics import import_tensor_intrinsics
from .measure import build_candidate, builder, fused, meta_schedule, runner
from .targets import is_gemm_task, tune_dir, tuning_target


@dataclass
class TuneSummary:
    """What tuning one module did: its task count, how many were new, the budget each got."""

    tasks: int
    tuned: int
    trials_per_task: int
    seconds: float
    database: str
    most_trials: int  # the largest budget its tasks' records were tuned with (reused, from earlier runs)
    selected: int | None = None  # the tasks ``--tune-tasks`` chose (None: every task)
    defaults_kept: int = 0  # tasks tuned now whose default schedule stayed faster than every searched one


def _progress_callback(names: list[str], trials: int, say: Callable[[str], None]) -> Any:
    """A measure callback that reports each task's trials as batches finish (tuning takes minutes)."""
    from tvm.ir.utils import derived_object

    ms = meta_schedule()
    done = [0] * len(names)

    @derived_object
    class Progress(ms.measure_callback.PyMeasureCallback):
        def apply(self, task_scheduler: Any, task_id: int, measure_candidates: Any, builder_results: Any,
                  runner_results: Any) -> None:
            if not len(measure_candidates):  # a task out of candidates: nothing measured, nothing to say
                return
            done[task_id] += len(measure_candidates)
            finished = sum(d >= trials for d in done)
            say(f"tuning task {task_id + 1}/{len(names)} {names[task_id]}: {min(done[task_id], trials)}/{trials} "
                f"trials ({finished}/{len(names)} tasks done)")

    return Progress()


def _search_strategy(trials: int) -> Any:
    """MetaSchedule's evolutionary search with a population sized to the budget.

    Its default population (512 schedules evolved per round) is right for budgets of 32 trials
    and more; with a handful of trials nearly all of it is never measured, and the search costs
    more than the measurements (at 2 trials a task, a population of 512 makes the job take about
    1.5x as long as one of 32).
    """
    population = max(32, min(512, 16 * trials))
    return meta_schedule().search_strategy.EvolutionarySearch(population_size=population,
                                                    init_min_unmeasured=min(50, population))


def tune(mod: tvm.IRModule, target: tvm.target.Target, trials: int, root: str | os.PathLike | None = None,
         say: Callable[[str], None] = lambda msg: None, tasks: str = "all") -> tuple[Any, TuneSummary]:
    """Tune the tasks of ``mod`` the database lacks (or got fewer trials), ``trials`` each.

    ``tasks="gemm"`` tunes only the GEMM and convolution tasks (:func:`is_gemm_task`); the others
    compile with the default schedules (dlight on cuda, ours on llvm): a fraction of the tuning time. Returns
    (the database to compile with, summary); with ``tasks="gemm"`` it holds only the chosen tasks'
    best records, so that records of the other tasks (an earlier all-tasks run's) are not applied.
    """
    if isinstance(trials, bool) or not isinstance(trials, int) or not 1 <= trials <= MAX_TRIALS:
        raise ValueError(f"tune: trials must be an int from 1 to {MAX_TRIALS}, got {trials!r}")
    if tasks not in TUNE_TASKS:
        raise ValueError(f"tune: tasks must be one of {', '.join(TUNE_TASKS)}, got {tasks!r}")
    start = time.perf_counter()
    # MetaSchedule's console log goes to stdout (it would break --json): keep it in the log files only
    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
    target = tuning_target(target)
    folder = tune_dir(root, target)
    folder.mkdir(parents=True, exist_ok=True)
    with exclusive(folder, say):
        staging = staging_copy(folder)
        try:
            db = open_database(staging, named=folder)  # a copy: an error names the folder copied
            try:
                summary, chosen = _tune_tasks(db, mod, target, trials, folder, say, start, tasks == "gemm", staging)
            except KeyboardInterrupt:  # what was measured so far warm-starts the next search, if it is whole
                with contextlib.suppress(UserError):
                    publish(staging, folder, db)
                raise
            if summary.tuned:
                publish(staging, folder, db)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return (db if tasks == "all" else best_records(db, chosen)), summary


def _tune_tasks(db: Any, mod: tvm.IRModule, target: tvm.target.Target, trials: int, folder: Path,
                say: Callable[[str], None], start: float, gemm_only: bool = False,
                records: Path | None = None) -> tuple[TuneSummary, list[Any]]:
    """Tune the chosen tasks the database lacks; returns the summary and the chosen tasks. ``records``:
    where the database and the ledger are written (``folder`` by default), the logs staying in ``folder``."""
    records = records or folder
    ms = meta_schedule()
    every = ms.relax_integration.extract_tasks(fused(mod, target), target)
    tasks = [t for t in every if is_gemm_task(t.task_name)] if gemm_only else list(every)
    ledger = read_ledger(records)
    keys = [task_key(t) for t in tasks]
    recorded = recorded_tasks(db)
    new = [(t, k) for t, k in zip(tasks, keys) if needs_tuning(recorded, k, ledger.get(k, 0), trials)]
    chosen = f" ({len(tasks)} of them GEMMs or convolutions, the rest left to the default schedules)" if gemm_only else ""
    say(f"{len(every)} MetaSchedule tasks{chosen}, {len(new)} to tune (new, or tuned with fewer than {trials} trials) "
        f"in {folder}")
    kept = 0
    if new:
        import_tensor_intrinsics()
        todo = [t for t, _ in new]
        contexts, weights = ms.relax_integration.extracted_tasks_to_tune_contexts(
            todo, str(folder / "logs"), strategy=_search_strategy(trials))
        callbacks = [*ms.MeasureCallback.create("default"),
                     _progress_callback([t.task_name for t in todo], trials, say)]
        with keep_interrupts():
            ms.tune_tasks(tasks=contexts, task_weights=weights, work_dir=str(folder / "logs"),
                          max_trials_global=min(trials * len(new), 2**31 - 1), max_trials_per_task=trials,
                          num_trials_per_iter=min(64, trials), database=db, measure_callbacks=callbacks,
                          builder=builder(target.kind.name), runner=runner())
            kept = commit_defaults(db, todo, target, runner(), build_candidate, say)
        ledger.update({k: trials for _, k in new})  # a task re-tuned after its records were lost got this budget only
        try:
            (records / LEDGER).write_text(json.dumps(ledger, indent=1, sort_keys=True))
        except OSError as err:
            raise write_failure(folder, f"{type(err).__name__}: {err.strerror or err}") from err
        say(f"tuned {len(new)} tasks in {time.perf_counter() - start:.0f} s" +
            (f"; the default schedule stayed the fastest of {kept}" if kept else ""))
    most = max((ledger.get(k, trials) for k in keys), default=trials)
    return TuneSummary(len(every), len(new), trials, time.perf_counter() - start, str(folder), most,
                       len(tasks) if gemm_only else None, kept), tasks


def compile_tuned(mod: tvm.IRModule, target: tvm.target.Target, db: Any) -> Any:
    """Compile with the database's best schedules; the default schedules take the functions it lacks.

    TVM's ``compile_relax`` schedules those with dlight on cuda but leaves them as naive loops on
    llvm, where :func:`~..pipelines.cpu_pipeline` gives them the defaults an untuned build gets.
    """
    target = tuning_target(target)
    if target.kind.name != "llvm":
        return meta_schedule().relax_integration.compile_relax(db, mod, target, params=None)
    from tvm import relax

    with target, db, tvm.transform.PassContext(opt_level=3):
        return relax.build(mod, target=target, relax_pipeline=cpu_pipeline(target, database=db))
