"""Every script of ``make bench`` runs at its smallest size and prints its table, so none rots unseen
(bench_combiners failed on every row for weeks: its measure.py called combine with too few arguments)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"

# script -> the smallest run that still prints every column (tens of seconds at most on 2 cores)
SMOKE = {
    "bench_collectives.py": ["--quick"],
    "bench_collective_combiners.py": ["--quick"],
    "bench_collective_pass_scaling.py": ["--sizes", "10", "--ir", "both"],
    "bench_pass_scaling.py": ["--sizes", "10", "--bert-layers", "", "--ir", "both"],
    "bench_cpu_schedules.py": ["--models", "minilm", "--rounds", "1", "--repeat", "1"],
    "bench_tuned.py": ["--trials", "0", "--models", "minilm", "--repeat", "1", "--combine-as", "stack"],
    "bench_combiners.py": ["--quick"],
}


def test_every_benchmark_script_has_a_smoke_run():
    assert sorted(SMOKE) == sorted(p.name for p in BENCHMARKS.glob("bench_*.py"))


@pytest.mark.slow
@pytest.mark.parametrize("script", SMOKE)
def test_benchmark_runs_and_prints_its_table(script):
    proc = subprocess.run([sys.executable, str(BENCHMARKS / script), *SMOKE[script]], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # a table: a header and at least one row, of three or more columns two spaces apart
    rows = [line for line in proc.stdout.splitlines() if len(re.split(r"\s{2,}", line.strip())) >= 3]
    assert len(rows) >= 2, proc.stdout[-3000:]
