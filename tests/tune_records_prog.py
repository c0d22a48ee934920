"""``python tune_records_prog.py ROOT KEY COUNT [LIMIT]``: "tune" one task KEY of the records in
ROOT, its search committing COUNT records (no search runs: MetaSchedule's is replaced by commits
of real records). LIMIT: the file size limit (``ulimit -f``) while they are written, in bytes over
the staged files' sizes. Exits 2 with the one line a run says when the records cannot be written."""

from __future__ import annotations

import resource
import sys
from pathlib import Path

import tvm
from tvm import te

from tvm_combiners.compile.relax_runner import make_target
from tvm_combiners.compile.tuning import measure, search, targets
from tvm_combiners.errors import UserError


def main() -> int:
    root, key, count = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    limit = int(sys.argv[4]) if len(sys.argv) > 4 else None
    ms = measure.meta_schedule()
    target = targets.tuning_target(make_target("llvm"))
    size = 8 * (1 + sum(map(ord, key)) % 16)  # a workload of its own per key
    a = te.placeholder((size, size), "float32", "a")
    workload = tvm.IRModule({"main": te.create_prim_func([a, te.compute((size, size), lambda i, j: a[i, j] * 2)])})

    class Task:
        task_name = f"task_{key}"
        dispatched = [workload]

    def fake_search(database, **_kw):
        staged = [p.stat().st_size for p in database_dir.glob("*.json")]
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (max(staged) + limit, hard))
        try:
            committed = database.commit_workload(workload)
            trace = tvm.s_tir.Schedule(workload).trace
            for i in range(count):
                database.commit_tuning_record(ms.database.TuningRecord(
                    trace, committed, [1e-3 * (i + 1)], target, ms.arg_info.ArgInfo.from_prim_func(workload["main"])))
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))

    database_dir = targets.tune_dir(root, target) / ".staging"
    search.fused = lambda mod, target: mod
    search.import_tensor_intrinsics = lambda: None
    search.task_key = lambda task: key
    search.commit_defaults = lambda *args: 0
    ms.relax_integration.extract_tasks = lambda mod, target: [Task()]
    ms.relax_integration.extracted_tasks_to_tune_contexts = lambda *args, **kw: ([], [])
    ms.tune_tasks = fake_search
    try:
        search.tune(None, make_target("llvm"), 2, root)
    except UserError as err:
        print(err, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
