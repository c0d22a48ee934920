"""A tuning folder's records: one run at a time, written through a staged copy, and the trial ledger."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ...errors import UserError, first_line
from .intrinsics import import_tensor_intrinsics
from .measure import meta_schedule


@contextlib.contextmanager
def exclusive(folder: Path, say: Callable[[str], None]) -> Iterator[None]:
    """One tuning run per database at a time.

    MetaSchedule's JSON database appends records that name workloads by their index in the file
    as this process read it: two runs appending at once give records pointing at each other's
    workloads, or a file that does not load.
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


def open_database(folder: Path, named: Path | None = None) -> Any:
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
        import_tensor_intrinsics()
    try:
        return meta_schedule().database.JSONDatabase(work_dir=str(folder))
    except Exception as err:  # MetaSchedule reports a truncated file as a RuntimeError of its JSON parser
        raise unreadable(first_line(err)) from err


LEDGER = "budgets.json"  # task hash -> the most trials it was ever tuned with, beside the records


def task_key(task: Any) -> str:
    import tvm_ffi

    return str(tvm_ffi.structural_hash(task.dispatched[0]))


def read_ledger(folder: Path) -> dict[str, int]:
    try:
        return {str(k): int(v) for k, v in json.loads((folder / LEDGER).read_text()).items()}
    except (OSError, ValueError, AttributeError, TypeError):
        return {}  # none yet, or unreadable: every task counts as untuned


def recorded_tasks(db: Any) -> set[str]:
    """The task keys of the workloads the database holds a record for (a failed measurement too)."""
    import tvm_ffi

    workloads = {}
    for record in db.get_all_tuning_records():
        workloads.setdefault(hash(record.workload), record.workload)  # the records of a task share one object
    return {str(tvm_ffi.structural_hash(w.mod)) for w in workloads.values()}


def needs_tuning(recorded: set[str], key: str, budget: int, trials: int) -> bool:
    """A task is tuned when the database holds no record of it, or it was tuned with a smaller budget.

    Records, not workloads: a task whose records were emptied keeps its workload and its ledger
    budget, and must still count as untuned. A task tuned with this budget whose every candidate
    failed stays as it is (its failures are records): MetaSchedule measures with random inputs, and an
    embedding ``take`` given random indices crashes every time, so tuning it again would cost a 40 s
    runner timeout per attempt on every run.
    """
    return budget < trials or key not in recorded


#: The files of a tuning folder that tuning rewrites: MetaSchedule's two databases, then the ledger.
RECORD_FILES = ("database_workload.json", "database_tuning_record.json", LEDGER)


def write_failure(folder: Path, why: str) -> UserError:
    return UserError(f"the tuning records could not be written in full ({why}): the records in {folder} are "
                     "kept as they were; free some space (or raise the file size limit) and tune again")


def staging_copy(folder: Path) -> Path:
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
        raise write_failure(folder, f"{type(err).__name__}: {err.strerror or err}") from err
    return staging


def publish(staging: Path, folder: Path, db: Any) -> None:
    """Move the staged records into ``folder`` once they read back whole (each file replaced at
    once: workloads first, as records name them by index); else leave ``folder`` as it was."""
    try:
        written = len(open_database(staging))  # as the next run reads them
    except UnreadableRecords as err:
        raise write_failure(folder, f"they do not read back: {err.why}") from err
    if written != len(db):
        raise write_failure(folder, f"{written} of {len(db)} records read back")
    for name in RECORD_FILES:
        if (staging / name).exists():
            os.replace(staging / name, folder / name)


def best_records(db: Any, tasks: list[Any]) -> Any:
    """An in-memory database of the best record ``db`` holds for each of ``tasks``, and nothing else."""
    ms = meta_schedule()
    chosen = ms.database.MemoryDatabase()
    for task in tasks:
        mod = task.dispatched[0]
        if not db.has_workload(mod):
            continue
        for best in db.get_top_k(db.commit_workload(mod), 1):  # has_workload: commit only looks it up
            chosen.commit_tuning_record(ms.database.TuningRecord(
                best.trace, chosen.commit_workload(mod), best.run_secs, best.target, best.args_info))
    return chosen
