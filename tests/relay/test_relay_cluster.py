"""Relay's collectives and their combiners on a simulated cluster of 2 nodes x 2 ranks (TCP between
the nodes); skipped, naming what is missing, where the machine cannot make the cluster."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from test_relay_collectives import check_relay_ranks

from tvm_combiners.collectives.testing import SimulatedCluster

PROG = Path(__file__).parents[1] / "collectives" / "progs" / "combiners_relay_prog.py"
TIMEOUT_S = 300


def _run(cluster: SimulatedCluster, argv: list[str]) -> subprocess.CompletedProcess:
    return cluster.run(argv, 2, TIMEOUT_S)  # 2 nodes x 2 ranks


def test_every_collective_on_two_nodes_relay(cluster: SimulatedCluster, tmp_path: Path) -> None:
    proc = _run(cluster, [sys.executable, "-m", "tvm_combiners.collectives.selfcheck", "--ir", "relay",
                          "--out", str(tmp_path)])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    check_relay_ranks(4, tmp_path)


def test_combiners_keep_results_on_two_nodes_relay(cluster: SimulatedCluster, tmp_path: Path) -> None:
    proc = _run(cluster, [sys.executable, str(PROG), str(tmp_path)])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4)]
    assert len({r["checks"] for r in reports}) == 1 and reports[0]["checks"] > 100
