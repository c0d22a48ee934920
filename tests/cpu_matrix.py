"""The x86 CPUs the suite compiles for, in both environments, and which of them this machine runs.

Structure is checked for every CPU on any host (compiling needs no such CPU); numbers are checked
for the CPUs whose instruction-set extensions this machine has (read from /proc/cpuinfo), the
others skip with the extensions missing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import pytest

from tvm_combiners.compile.host import known_cpus, missing_on_host

#: Baseline x86-64; AVX2 (Intel, AMD: znver3 also has AMD's SSE4a); AVX-512 without VNNI; with
#: VNNI; with AMX (the Emerald Rapids of this project's pool is a Sapphire Rapids to TVM 0.16).
CPUS = ("generic", "haswell", "znver3", "skylake-avx512", "cascadelake", "sapphirerapids", "emeraldrapids")


def cpus() -> list[str]:
    """The CPUs of :data:`CPUS` this TVM's LLVM knows."""
    return [cpu for cpu in CPUS if cpu in known_cpus()]


def runnable(cpu: str) -> pytest.param:
    """``cpu`` as a parameter that skips, naming what is missing, where this machine cannot run its code."""
    missing = missing_on_host(cpu)
    reason = f"this CPU lacks {', '.join(missing)}" if missing else ""
    return pytest.param(cpu, id=cpu, marks=pytest.mark.skipif(bool(missing), reason=reason))


def runnable_cpus() -> list[pytest.param]:
    return [runnable(cpu) for cpu in cpus()]


def conv2d_reference(a: np.ndarray, b: np.ndarray, pad: int) -> np.ndarray:
    """NCHW x OIHW, stride 1, ``pad`` on every side, in the operands' dtype (float64 for exact sums)."""
    padded = np.pad(a, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    h, w = a.shape[2:]
    return sum(np.einsum("nchw,oc->nohw", padded[:, :, i:i + h, j:j + w], b[:, :, i, j])
               for i in range(b.shape[2]) for j in range(b.shape[3]))


def operand(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Full-range integers (where 16-bit sums of two uint8 x int8 products saturate), normal floats."""
    if dtype in ("int8", "uint8"):
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max + 1, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def numpy_mismatches(ops: Mapping[str, tuple], dtypes: Mapping[tuple[str, str, str], float],
                     run: Callable[[str, tuple[str, str, str], np.ndarray, np.ndarray], np.ndarray]) -> list[str]:
    """Each op (``name -> (data shape, weight shape, ..., numpy of float64 operands)``) in each
    (data, weight, output) dtype, computed by ``run(op, dtypes, data, weight)``: those further from
    numpy than the dtype's tolerance (relative to the largest output; 0 for exact)."""
    rng = np.random.default_rng(0)
    failures = []
    for op, (data, weight, *_, reference) in ops.items():
        for types, tolerance in dtypes.items():
            a, b = operand(rng, data, types[0]), operand(rng, weight, types[1])
            got = run(op, types, a, b)
            want = reference(a.astype(np.float64), b.astype(np.float64))
            assert got.dtype == types[2] and got.shape == want.shape, (op, types)
            error = np.abs(got.astype(np.float64) - want).max() / np.abs(want).max()
            if error > tolerance:
                failures.append(f"{op} {'x'.join(types[:2])}: relative error {error:.2e}")
    return failures
