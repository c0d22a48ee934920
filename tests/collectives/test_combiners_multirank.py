"""Every Relax collective combiner on 2, 3 and 4 ranks: results after combining equal those before.

One launch per rank count (CI has 2 cores): ``progs/combiners_relax_prog.py`` compiles each case of
``progs/combiners_cases.py`` before and after every pass and compares every output bitwise on every
rank (plus a few against numpy). Allgather and reduce_scatter run on non-leading axes, with groups
in reversed order, mixed dtypes and (4 ranks) split groups; sends and recvs on rings, partial pairs
and several channels; plus six seeded random DAGs of collectives, sends/recvs and compute. The launcher runs it as ``python -m mpi4py``, so a failing rank ends the job;
the timeout bounds a hung one.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

PROG = Path(__file__).parent / "progs" / "combiners_relax_prog.py"
TIMEOUT_S = 300


@pytest.mark.parametrize("n", [2, 3, 4])
def test_combiners_keep_results_on_n_ranks(n, tmp_path):
    cmd = [sys.executable, "-m", "tvm_combiners.collectives.runtime.launcher", "-n", str(n), "--timeout", str(TIMEOUT_S),
           "--", sys.executable, str(PROG), str(tmp_path)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S + 60)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(n)]
    assert [r["world_size"] for r in reports] == [n] * n
    checks = {r["checks"] for r in reports}
    assert len(checks) == 1 and checks.pop() > 150  # every rank ran every comparison
