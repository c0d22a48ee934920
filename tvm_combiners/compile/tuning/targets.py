"""Which target a tuning database belongs to, where its folder is, and what tuning needs installed."""

from __future__ import annotations

import importlib
import os
import re
from pathlib import Path

import tvm

from ...errors import install_line
from ..host import usable_cores

#: Where tuning records live unless ``--tune-dir`` (or ``TVM_COMBINERS_TUNE_DIR``) says otherwise.
DEFAULT_DIR = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tvm_combiners" / "tune"


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
            f"tune: {install_line('tune', missing)}")


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
