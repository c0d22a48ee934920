"""MetaSchedule tuning for the main job: one persistent database per target, shared by every module.

Why one database for the baseline and the combined module: their common tasks (layer norms,
attention, the GEMMs that were not combined) are tuned once and reused, and only the combined
module's new GEMM shapes become tasks of their own, each with the same trial budget. A second run
on the same target tunes only the tasks the database has never seen, or saw with fewer trials.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import importlib
import inspect
import json
import linecache
import logging
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tvm

from ..host import usable_cores
from ..interrupts import keep_interrupts
from ..main_job import MAX_TRIALS, TUNE_TASKS, UserError
from ..models.loader import first_line
from .cpu_schedules import cpu_pipeline, fusion_passes
from .default_candidates import commit_defaults

#: Where tuning records live unless ``--tune-dir`` (or ``TVM_COMBINERS_TUNE_DIR``) says otherwise.
DEFAULT_DIR = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tvm_combiners" / "tune"


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


#: Words of a fused function's name (TVM names it after its ops) that make it a GEMM task.
_GEMM_WORDS = re.compile(r"(^|_)(matmul|dense)\d*(_|$)|(^|_)conv\d")


def is_gemm_task(name: str) -> bool:
    """Whether a task (``fused_matmul3_add4_gelu``, ``matmul2``, ``conv2d_nchw``) holds a GEMM or a
    convolution: the ops combining changes, and those the default schedules (dlight on cuda, ours on
    llvm) leave the most to gain on; layer norms, softmax and the elementwise rest are left to those."""
    return _GEMM_WORDS.search(name) is not None


def tuning_target(target: tvm.target.Target) -> tvm.target.Target:
    """``target`` with what MetaSchedule needs and the default targets leave out: the core count on
    CPUs (physical cores, as it expects, but no more than this process may use: a container's, not
    its host's), the thread and shared-memory limits on cuda (its thread-binding rules stop at the
    first task without them)."""
    if target.kind.name == "llvm":
        import psutil

        missing = {"num-cores": min(psutil.cpu_count(logical=False) or usable_cores(), usable_cores())}
    elif target.kind.name == "cuda":
        missing = _cuda_limits()
    else:
        return target
    missing = {k: v for k, v in missing.items() if k not in target.attrs}
    if not missing:
        return target
    return tvm.target.Target({**dict(target.export()), **missing})


def _cuda_limits() -> dict[str, int]:
    """This GPU's limits, or those every GPU since compute capability 2.0 has (tuning without a GPU
    fails later anyway, at measuring)."""
    dev = tvm.cuda(0)
    if dev.exist:
        return {"max_threads_per_block": dev.max_threads_per_block,
                "max_shared_memory_per_block": dev.max_shared_memory_per_block, "thread_warp_size": dev.warp_size}
    return {"max_threads_per_block": 1024, "max_shared_memory_per_block": 49152, "thread_warp_size": 32}


def tune_dir(root: str | os.PathLike | None, target: tvm.target.Target) -> Path:
    """The database folder for ``target`` under ``root``: records of one target never mix with another's."""
    base = Path(root or os.environ.get("TVM_COMBINERS_TUNE_DIR") or DEFAULT_DIR)
    keys = {k: str(v) for k, v in target.attrs.items() if k in ("mcpu", "mtriple", "arch", "num-cores")}
    name = target.kind.name + "".join(f"-{k}={v}" for k, v in sorted(keys.items()))
    return base / re.sub(r"[^A-Za-z0-9._=-]+", "_", name)


#: What MetaSchedule imports when it tunes (compiling needs none of them): module -> its PyPI package.
TUNING_MODULES = {"psutil": "psutil", "cloudpickle": "cloudpickle", "tornado": "tornado", "xgboost": "xgboost-cpu"}


def dependency_problem() -> str | None:
    """Which of :data:`TUNING_MODULES` this environment lacks, in one line naming what to install (None: none)."""
    missing = []
    for module, package in TUNING_MODULES.items():
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(package)
    if not missing:
        return None
    return (f"--tune needs the package{'s' * (len(missing) > 1)} {', '.join(missing)}, which MetaSchedule imports to "
            f"tune: pip install {' '.join(missing)}")


def folder_problem(root: str | os.PathLike | None, target: tvm.target.Target) -> str | None:
    """Why the records of ``target`` cannot live under ``root`` (None when they can): checked before
    the job loads, imports and compiles anything."""
    folder = tune_dir(root, tuning_target(target))
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        return f"--tune-dir {folder.parent}: cannot hold the tuning records ({type(err).__name__}: {err.strerror or err})"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"--tune-dir {folder.parent}: cannot hold the tuning records ({folder} is not writable)"
    return None


@contextlib.contextmanager
def _exclusive(folder: Path, say: Callable[[str], None]) -> Iterator[None]:
    """One tuning run per database at a time.

    MetaSchedule's JSON database appends records that name workloads by their index in the file
    as this process read it: two runs appending at once give records pointing at each other's
    workloads, or a file that no longer loads (a review reproduced both).
    """
    with open(folder / "lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"waiting for the other run that is tuning into {folder} (its lock: {folder / 'lock'})")
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


class UnreadableRecords(UserError):
    """A tuning folder's records do not load; ``why`` says what is wrong with them."""

    def __init__(self, folder: Path, why: str) -> None:
        self.why = why
        super().__init__(f"the tuning records in {folder} cannot be read ({why}): delete that folder, "
                         "or give another --tune-dir, to tune afresh")


def _open_database(folder: Path, named: Path | None = None) -> Any:
    """The records in ``folder`` (``named``, where they are a copy of another folder's, is the one
    an error names)."""
    def unreadable(why: str) -> UserError:
        return UnreadableRecords(named or folder, why)

    tensorized = False
    for name in ("database_workload.json", "database_tuning_record.json"):
        try:
            with open(folder / name, "rb") as f:
                lines = list(f)
        except FileNotFoundError:
            continue
        except OSError as err:
            raise unreadable(f"{type(err).__name__}: {err.strerror or err}") from err
        blank = next((n for n, line in enumerate(lines, 1) if not line.strip()), None)
        if blank is not None:  # MetaSchedule's reader segfaults on one (an editor's trailing newline)
            raise unreadable(f"line {blank} of {name} is blank")
        tensorized |= any(b'"Tensorize"' in line for line in lines)
    if tensorized:  # dlight's tensor-core schedules (float16 on cuda): the reader looks their intrinsics up
        _import_tensor_intrinsics()
    try:
        return _ms().database.JSONDatabase(work_dir=str(folder))
    except Exception as err:  # MetaSchedule reports a truncated file as a RuntimeError of its JSON parser
        raise unreadable(first_line(err)) from err


def _ms() -> Any:
    from tvm.s_tir import meta_schedule

    return meta_schedule


@functools.cache
def _builder(kind: str) -> Any:
    """MetaSchedule's builder, made once per process: its worker processes import TVM (seconds each),
    and the job tunes two modules."""
    return _ms().builder.LocalBuilder(f_build=build_candidate, timeout_sec=60 if kind == "llvm" else 120)


@functools.cache
def _runner() -> Any:
    """MetaSchedule's runner, made once per process (as :func:`_builder`)."""
    return _ms().runner.LocalRunner()


def _frames(context: int = 1) -> list[inspect.FrameInfo]:
    """What ``inspect.stack()`` gives TVMScript (each frame's file, line, function and source line),
    without resolving every frame's module: ``inspect.getmodule`` scans ``sys.modules`` each time."""
    frame = sys._getframe(1)
    frames = []
    while frame is not None:
        code = frame.f_code
        line = linecache.getline(code.co_filename, frame.f_lineno)
        frames.append(inspect.FrameInfo(frame, code.co_filename, frame.f_lineno, code.co_name,
                                        [line] if line else None, 0 if line else None))
        frame = frame.f_back
    return frames


def _import_tensor_intrinsics() -> None:
    """Import TVM's tensor intrinsics (MetaSchedule's first tuning context does), with :func:`_frames`
    for ``inspect.stack``: each of the module's ~500 TVMScript functions asks for its caller's
    stack, and that took 48 s of every first ``--tune`` on a 2-core machine (4.8 s this way; the
    124 intrinsics it registers were compared, structurally equal)."""
    if "tvm.s_tir.tensor_intrin" in sys.modules:
        return
    stack = inspect.stack
    inspect.stack = _frames
    try:
        import tvm.s_tir.tensor_intrin  # noqa: F401
    finally:
        inspect.stack = stack


def _fused(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule:
    """The module as :func:`compile_tuned` sees it before applying the database, so task keys match."""
    with target:
        return tvm.transform.Sequential(fusion_passes(target))(mod)


def build_candidate(mod: tvm.IRModule, target: tvm.target.Target, _params: Any) -> Any:
    """MetaSchedule's builder step without importing ``tvm.s_tir.tensor_intrin``.

    TVM's default build imports that module in every fresh builder process, and the import alone
    takes ~30 s here: longer than the builder's timeout, so every candidate "failed to build"; on
    an H100 machine it made each batch of cuda candidates take 40-80 s. A candidate reaches the
    builder already scheduled (any tensorize done), so the build looks nothing up in that registry.
    """
    from tvm.driver import build
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    return build(RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod), target=target)


LEDGER = "budgets.json"  # task hash -> the most trials it was ever tuned with, beside the records


def _task_key(task: Any) -> str:
    import tvm_ffi

    return str(tvm_ffi.structural_hash(task.dispatched[0]))


def _read_ledger(folder: Path) -> dict[str, int]:
    try:
        return {str(k): int(v) for k, v in json.loads((folder / LEDGER).read_text()).items()}
    except (OSError, ValueError, AttributeError, TypeError):
        return {}  # none yet, or unreadable: every task counts as untuned


def _recorded(db: Any) -> set[str]:
    """The task keys of the workloads the database holds a record for (a failed measurement too)."""
    import tvm_ffi

    workloads = {}
    for record in db.get_all_tuning_records():
        workloads.setdefault(hash(record.workload), record.workload)  # the records of a task share one object
    return {str(tvm_ffi.structural_hash(w.mod)) for w in workloads.values()}


def _needs_tuning(recorded: set[str], key: str, budget: int, trials: int) -> bool:
    """A task is tuned when the database holds no record of it, or it was tuned with a smaller budget.

    Records, not workloads: emptied records under the ledger's budgets were reported tuned, and
    compiled untuned, for good. A task tuned with this budget whose every candidate failed stays as
    it is (its failures are records): MetaSchedule measures with random inputs, and an embedding
    ``take`` given random indices crashes every time (here each attempt cost a 40 s runner timeout,
    on every run).
    """
    return budget < trials or key not in recorded


def _progress_callback(names: list[str], trials: int, say: Callable[[str], None]) -> Any:
    """A measure callback that reports each task's trials as batches finish (tuning takes minutes)."""
    from tvm.ir.utils import derived_object

    ms = _ms()
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
    more than the measurements (the main job on two small GEMMs with 2 trials, run one after the
    other on a busy 2-core machine: 234 s with 512, 160 s with 32).
    """
    population = max(32, min(512, 16 * trials))
    return _ms().search_strategy.EvolutionarySearch(population_size=population,
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
    with _exclusive(folder, say):
        staging = _staging_copy(folder)
        try:
            db = _open_database(staging, named=folder)  # a copy: an error names the folder copied
            try:
                summary, chosen = _tune_tasks(db, mod, target, trials, folder, say, start, tasks == "gemm", staging)
            except KeyboardInterrupt:  # what was measured so far warm-starts the next search, if it is whole
                with contextlib.suppress(UserError):
                    _publish(staging, folder, db)
                raise
            if summary.tuned:
                _publish(staging, folder, db)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return (db if tasks == "all" else _best_records(db, chosen)), summary


#: The files of a tuning folder that tuning rewrites: MetaSchedule's two databases, then the ledger.
RECORD_FILES = ("database_workload.json", "database_tuning_record.json", LEDGER)


def _write_failure(folder: Path, why: str) -> UserError:
    return UserError(f"the tuning records could not be written in full ({why}): the records in {folder} are "
                     "kept as they were; free some space (or raise the file size limit) and tune again")


def _staging_copy(folder: Path) -> Path:
    """A copy of the folder's records to tune into: MetaSchedule's database appends each record as it
    comes and says nothing when a write fails (a full disk, ``ulimit -f``): in place, that would
    leave a file cut mid-record, which the next run refuses, every record lost with it."""
    staging = folder / ".staging"
    shutil.rmtree(staging, ignore_errors=True)  # a run that died left it (the lock is ours now)
    try:
        staging.mkdir()
        for name in RECORD_FILES:
            if (folder / name).exists():
                shutil.copyfile(folder / name, staging / name)
    except OSError as err:
        shutil.rmtree(staging, ignore_errors=True)
        raise _write_failure(folder, f"{type(err).__name__}: {err.strerror or err}") from err
    return staging


def _publish(staging: Path, folder: Path, db: Any) -> None:
    """Move the staged records into ``folder`` once they read back whole (each file replaced at
    once: workloads first, as records name them by index); else leave ``folder`` as it was."""
    try:
        written = len(_open_database(staging))  # as the next run reads them
    except UnreadableRecords as err:
        raise _write_failure(folder, f"they do not read back: {err.why}") from err
    if written != len(db):
        raise _write_failure(folder, f"{written} of {len(db)} records read back")
    for name in RECORD_FILES:
        if (staging / name).exists():
            os.replace(staging / name, folder / name)


def _best_records(db: Any, tasks: list[Any]) -> Any:
    """An in-memory database of the best record ``db`` holds for each of ``tasks``, and nothing else."""
    ms = _ms()
    chosen = ms.database.MemoryDatabase()
    for task in tasks:
        mod = task.dispatched[0]
        if not db.has_workload(mod):
            continue
        for best in db.get_top_k(db.commit_workload(mod), 1):  # has_workload: commit only looks it up
            chosen.commit_tuning_record(ms.database.TuningRecord(
                best.trace, chosen.commit_workload(mod), best.run_secs, best.target, best.args_info))
    return chosen


def _tune_tasks(db: Any, mod: tvm.IRModule, target: tvm.target.Target, trials: int, folder: Path,
                say: Callable[[str], None], start: float, gemm_only: bool = False,
                records: Path | None = None) -> tuple[TuneSummary, list[Any]]:
    """Tune the chosen tasks the database lacks; returns the summary and the chosen tasks. ``records``:
    where the database and the ledger are written (``folder`` by default), the logs staying in ``folder``."""
    records = records or folder
    ms = _ms()
    every = ms.relax_integration.extract_tasks(_fused(mod, target), target)
    tasks = [t for t in every if is_gemm_task(t.task_name)] if gemm_only else list(every)
    ledger = _read_ledger(records)
    keys = [_task_key(t) for t in tasks]
    recorded = _recorded(db)
    new = [(t, k) for t, k in zip(tasks, keys) if _needs_tuning(recorded, k, ledger.get(k, 0), trials)]
    chosen = f" ({len(tasks)} of them GEMMs or convolutions, the rest left to the default schedules)" if gemm_only else ""
    say(f"{len(every)} MetaSchedule tasks{chosen}, {len(new)} to tune (new, or tuned with fewer than {trials} trials) "
        f"in {folder}")
    kept = 0
    if new:
        _import_tensor_intrinsics()
        todo = [t for t, _ in new]
        contexts, weights = ms.relax_integration.extracted_tasks_to_tune_contexts(
            todo, str(folder / "logs"), strategy=_search_strategy(trials))
        callbacks = [*ms.MeasureCallback.create("default"),
                     _progress_callback([t.task_name for t in todo], trials, say)]
        with keep_interrupts():
            ms.tune_tasks(tasks=contexts, task_weights=weights, work_dir=str(folder / "logs"),
                          max_trials_global=min(trials * len(new), 2**31 - 1), max_trials_per_task=trials,
                          num_trials_per_iter=min(64, trials), database=db, measure_callbacks=callbacks,
                          builder=_builder(target.kind.name), runner=_runner())
            kept = commit_defaults(db, todo, target, _runner(), build_candidate, say)
        ledger.update({k: trials for _, k in new})  # a task re-tuned after its records were lost got this budget only
        try:
            (records / LEDGER).write_text(json.dumps(ledger, indent=1, sort_keys=True))
        except OSError as err:
            raise _write_failure(folder, f"{type(err).__name__}: {err.strerror or err}") from err
        say(f"tuned {len(new)} tasks in {time.perf_counter() - start:.0f} s" +
            (f"; the default schedule stayed the fastest of {kept}" if kept else ""))
    most = max((ledger.get(k, trials) for k in keys), default=trials)
    return TuneSummary(len(every), len(new), trials, time.perf_counter() - start, str(folder), most,
                       len(tasks) if gemm_only else None, kept), tasks


def compile_tuned(mod: tvm.IRModule, target: tvm.target.Target, db: Any) -> Any:
    """Compile with the database's best schedules; the default schedules take the functions it lacks.

    TVM's ``compile_relax`` schedules those with dlight on cuda but leaves them as naive loops on
    llvm, where :func:`~.cpu_schedules.cpu_pipeline` gives them the defaults an untuned build gets.
    """
    target = tuning_target(target)
    if target.kind.name != "llvm":
        return _ms().relax_integration.compile_relax(db, mod, target, params=None)
    from tvm import relax

    with target, db, tvm.transform.PassContext(opt_level=3):
        return relax.build(mod, target=target, relax_pipeline=cpu_pipeline(target, database=db))
