"""MetaSchedule tuning for the main job, split as MetaSchedule itself is.

- :mod:`.targets`: which target a database belongs to, where it lives, what tuning needs installed;
- :mod:`.database`: the records on disk: one run at a time, staged writes, the trial ledger;
- :mod:`.measure`: MetaSchedule's builder and runner as the job uses them;
- :mod:`.intrinsics`: importing TVM's tensor intrinsics without its slow stack walks;
- :mod:`.defaults`: each task's default schedule measured as one more candidate;
- :mod:`.search`: tuning a module's tasks and compiling with the records.

This package's own namespace imports nothing from TVM: the CLI checks ``--trials`` and
``--tune-tasks`` against it in either environment.
"""

#: The most trials per task ``--tune`` takes: MetaSchedule counts the trials of all tasks in 32 bits.
MAX_TRIALS = 100_000
#: What ``--tune-tasks`` may choose: every task, or only the GEMMs and convolutions.
TUNE_TASKS = ("all", "gemm")
