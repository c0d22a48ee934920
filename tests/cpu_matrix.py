"""The x86 CPUs the suite compiles for, in both environments, and which of them this machine runs.

Structure is checked for every CPU on any host (compiling needs no such CPU); numbers are checked
for the CPUs whose instruction-set extensions this machine has (read from /proc/cpuinfo), the
others skip with the extensions missing.
"""

from __future__ import annotations

import pytest

from tvm_combiners.host import known_cpus, missing_on_host

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
