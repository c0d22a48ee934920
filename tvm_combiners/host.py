"""The machine the code runs on: the CPU llvm code is compiled for, the cores this process may use."""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator


def host_cpu() -> str:
    """LLVM's name for this machine's CPU, or ``TVM_COMBINERS_MCPU`` where set.

    A bare ``llvm`` target means ``-mcpu=generic``: baseline x86-64, SSE2 without FMA, a quarter of
    an AVX2 core's arithmetic. TVM 0.27 rejects ``native`` under its wheel's conda triple, so the
    CPU is named explicitly. Set the variable to ``generic`` for code that must run on any x86-64.
    """
    import tvm

    return os.environ.get("TVM_COMBINERS_MCPU") or str(tvm.target.codegen.llvm_get_system_cpu())


#: The cores the process started with, read when this module is first imported: TVM's thread pool
#: later pins the thread that starts it to one core ({0, 1} -> {0}), and threads started after that
#: (onnxruntime's) inherit the pin.
START_CORES: frozenset[int] | None = frozenset(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None


def usable_cores() -> int:
    """How many cores the process may run on (its starting affinity; the machine's count off Linux)."""
    return len(START_CORES) if START_CORES else os.cpu_count() or 1


@contextlib.contextmanager
def on_start_cores() -> Iterator[None]:
    """The calling thread back on :data:`START_CORES` while the block runs, TVM's pin restored after.

    For work that must not inherit the pin: onnxruntime's threads, and processes started here (MPI
    ranks and MetaSchedule's builders and runners), which keep the affinity of the thread that forks.
    """
    if START_CORES is None:
        yield
        return
    now = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, START_CORES)
    except OSError:  # the process was moved to other cores since: keep what it has
        yield
        return
    try:
        yield
    finally:
        os.sched_setaffinity(0, now)


#: Where MPI launchers tell a rank its index among the ranks on its machine (MPICH's hydra, Open MPI, Slurm).
LOCAL_RANK_VARS = ("MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID")


def local_rank() -> int:
    """This process's index among the ranks on its machine (0 outside a launcher)."""
    for var in LOCAL_RANK_VARS:
        value = os.environ.get(var, "")
        if value.isdigit():
            return int(value)
    return 0


@functools.cache
def gpu_count() -> int:
    """CUDA GPUs this process sees (0 without a driver)."""
    import tvm

    count = 0
    try:
        while count < 64 and tvm.cuda(count).exist:
            count += 1
    except Exception:  # noqa: BLE001 - no CUDA runtime in this TVM, or no driver
        pass
    return count


def rank_gpu() -> int:
    """The GPU this process runs cuda code on: its local rank modulo the GPUs it sees (one process:
    GPU 0). With every rank on GPU 0, NCCL refused every group (two ranks on one GPU) and all
    collectives on cuda tensors went through host memory, on a machine of 8 GPUs too."""
    count = gpu_count()
    return local_rank() % count if count else 0
