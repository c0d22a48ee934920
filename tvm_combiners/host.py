"""The CPU that llvm code is compiled for, shared by the Relax and Relay runners."""

from __future__ import annotations

import os


def host_cpu() -> str:
    """LLVM's name for this machine's CPU, or ``TVM_COMBINERS_MCPU`` where set.

    A bare ``llvm`` target means ``-mcpu=generic``: baseline x86-64, SSE2 without FMA, a quarter of
    an AVX2 core's arithmetic. TVM 0.27 rejects ``native`` under its wheel's conda triple, so the
    CPU is named explicitly. Set the variable to ``generic`` for code that must run on any x86-64.
    """
    import tvm

    return os.environ.get("TVM_COMBINERS_MCPU") or str(tvm.target.codegen.llvm_get_system_cpu())
