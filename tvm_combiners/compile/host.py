"""The machine the code runs on: the CPU llvm code is compiled for, the cores this process may use."""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterable, Iterator
from typing import Any

#: The environment variable that names the CPU llvm code is compiled for, in LLVM's spelling.
MCPU_VAR = "TVM_COMBINERS_MCPU"

#: LLVM's names of the x86 instruction-set extensions code generation may use, and the flag
#: ``/proc/cpuinfo`` reports each as: a target runs here when the host has every one it enables.
CPUINFO_FLAGS = {
    "sse3": "pni", "ssse3": "ssse3", "sse4.1": "sse4_1", "sse4.2": "sse4_2", "sse4a": "sse4a", "popcnt": "popcnt",
    "lzcnt": "abm", "movbe": "movbe", "bmi": "bmi1", "bmi2": "bmi2", "adx": "adx", "aes": "aes",
    "pclmul": "pclmulqdq", "sha": "sha_ni", "avx": "avx", "avx2": "avx2", "fma": "fma", "f16c": "f16c",
    "vaes": "vaes", "vpclmulqdq": "vpclmulqdq", "gfni": "gfni", "avxvnni": "avx_vnni",
    "avx512f": "avx512f", "avx512bw": "avx512bw", "avx512dq": "avx512dq", "avx512cd": "avx512cd",
    "avx512vl": "avx512vl", "avx512ifma": "avx512ifma", "avx512vbmi": "avx512vbmi",
    "avx512vbmi2": "avx512_vbmi2", "avx512vnni": "avx512_vnni", "avx512bitalg": "avx512_bitalg",
    "avx512vpopcntdq": "avx512_vpopcntdq", "avx512bf16": "avx512_bf16", "avx512fp16": "avx512_fp16",
    "amx-tile": "amx_tile", "amx-int8": "amx_int8", "amx-bf16": "amx_bf16", "amx-fp16": "amx_fp16",
    "amx-complex": "amx_complex", "avxifma": "avx_ifma", "avxvnniint8": "avx_vnni_int8",
    "avxneconvert": "avx_ne_convert", "cmpccxadd": "cmpccxadd",
}
#: Extensions LLVM names this way are vector instructions: one the table does not know counts as
#: missing (its code might use it, and this machine cannot be asked).
UNKNOWN_VECTOR_PREFIXES = ("avx", "amx")


class HostTargetError(ValueError):
    """``TVM_COMBINERS_MCPU`` names no CPU LLVM knows, or one whose code this machine cannot run."""


def _llvm_query_target(cpu: str, mattr: tuple[str, ...] = ()) -> object:
    """A target that only asks LLVM about ``cpu``: the dict form and the x86-64 triple read the same
    in TVM 0.16 (whose default triple is riscv64) and 0.27 (which rejects option strings)."""
    import tvm

    config: dict[str, object] = {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": cpu}
    if mattr:
        config["mattr"] = list(mattr)
    return tvm.target.Target(config)


@functools.cache
def known_cpus() -> frozenset[str]:
    """The CPU names this TVM's LLVM accepts for ``-mcpu`` on x86-64."""
    import tvm

    return frozenset(str(c) for c in tvm.target.codegen.llvm_get_cpu_archlist(_llvm_query_target("generic")))


@functools.cache
def cpu_features(cpu: str, mattr: tuple[str, ...] = ()) -> frozenset[str]:
    """The features LLVM enables for ``cpu`` with ``mattr`` (``"-amx-int8"``, ...) applied."""
    import tvm

    return frozenset(str(f) for f in tvm.target.codegen.llvm_get_cpu_features(_llvm_query_target(cpu, mattr)))


@functools.cache
def host_flags() -> frozenset[str] | None:
    """The CPU flags ``/proc/cpuinfo`` reports (None where there is no such file)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


def missing_on_host(cpu: str, mattr: tuple[str, ...] = ()) -> list[str]:
    """The instruction-set extensions code for ``cpu`` may use that this machine lacks (LLVM's names;
    empty where ``/proc/cpuinfo`` cannot tell)."""
    flags = host_flags()
    if flags is None:
        return []
    return sorted(f for f in cpu_features(cpu, mattr) if CPUINFO_FLAGS.get(f, "") not in flags
                  and (f in CPUINFO_FLAGS or f.startswith(UNKNOWN_VECTOR_PREFIXES)))


def mcpu_problem() -> str | None:
    """Why ``TVM_COMBINERS_MCPU`` cannot be used on this machine, in one line (None when it can, or is unset)."""
    cpu = os.environ.get(MCPU_VAR)
    if not cpu:
        return None
    if cpu not in known_cpus():
        examples = ", ".join(c for c in ("generic", "haswell", "znver3", "skylake-avx512", "sapphirerapids")
                             if c in known_cpus())
        return f"{MCPU_VAR}={cpu!r} is not a CPU this TVM's LLVM knows (for example {examples})"
    missing = missing_on_host(cpu)
    if missing:
        return (f"{MCPU_VAR}={cpu!r}: this machine's CPU lacks {', '.join(missing)}, so code compiled for it "
                f"would stop with an illegal instruction here")
    return None


def host_cpu() -> str:
    """LLVM's name for this machine's CPU, or ``TVM_COMBINERS_MCPU`` where set.

    A bare ``llvm`` target means ``-mcpu=generic``: baseline x86-64, SSE2 without FMA, a quarter of
    an AVX2 core's arithmetic. TVM 0.27 rejects ``native`` under its wheel's conda triple, so the
    CPU is named explicitly. Set the variable to ``generic`` for code that must run on any x86-64;
    a name LLVM does not know, or a CPU with extensions this machine lacks, raises
    :class:`HostTargetError`.
    """
    import tvm

    problem = mcpu_problem()
    if problem is not None:
        raise HostTargetError(problem)
    return os.environ.get(MCPU_VAR) or str(tvm.target.codegen.llvm_get_system_cpu())


def llvm_options(cpu: str | None = None, leave_out: Iterable[str] = ()) -> dict[str, Any]:
    """llvm target options for ``cpu`` (this machine's, :func:`host_cpu`, by default):
    ``{"mcpu": ..., "mattr": ["-feature", ...]}``.

    ``leave_out``: extensions a TVM build mishandles, turned off where the CPU has them (``mattr``
    is absent when nothing is). For this machine's own CPU model, an extension LLVM expects of it
    that the machine does not report (a hypervisor may hide some) is turned off too. A ``cpu``
    given here is not checked against this machine: the code is for compiling, not for running here.
    """
    host = cpu is None
    cpu = host_cpu() if host else cpu
    off = [f for f in leave_out if f in cpu_features(cpu)]
    if host and not os.environ.get(MCPU_VAR):
        off += [f for f in missing_on_host(cpu) if f not in off]
    return {"mcpu": cpu, "mattr": [f"-{f}" for f in off]} if off else {"mcpu": cpu}


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
    GPU 0), so that ranks spread over the GPUs: NCCL refuses a group with two ranks on one GPU, and
    collectives on cuda tensors then go through host memory."""
    count = gpu_count()
    return local_rank() % count if count else 0
