"""Differential fuzzing of the Relax collective combiners on 2 ranks, where collectives are not identities.

The one-rank fuzzer (``test_fuzz_collectives_relax.py``) cannot see an allgather's blocks out of
order, a reduce_scatter's block given to the wrong rank, a ring's sends paired wrongly or a
reduction of the wrong ranks: on one rank all of them are the identity. Here one launch runs
``collective_world_prog.py`` on 2 ranks over programs of ``collective_spec`` (read for the world
by ``collective_world``, whose folds keep each value's type and every block's order visible), each
unoptimized and after every setting of ``PASS_SETTINGS``; a failing rank ends the job. This test
then requires every rank's report to be complete and alike (same programs, same number of checks,
same modules changed) and each rank's unoptimized outputs to be what the world reference, computed
here again, says for that rank.
Unset, ``FUZZ_EXAMPLES`` keeps a small slice (seed 0) for ``make test``; set, it is the number of
programs, drawn from ``FUZZ_SEED`` (else a random seed, printed), on ``FUZZ_RANKS`` ranks (default 2).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

from collective_spec import PASS_SETTINGS, resolve
from collective_world import Inexact, digest, draw_programs, rank_inputs, world_reference
from fuzz_spec import example_count, is_big_run

PROG = Path(__file__).with_name("collective_world_prog.py")
#: 2 ranks in CI; ``FUZZ_RANKS=3`` makes the ring a real ring (on 2 ranks it is a swap, so a pass that
#: reversed a ring's direction would not show).
RANKS = int(os.environ.get("FUZZ_RANKS", "2"))
#: Programs of the CI slice (each runs every pass setting): about 35 s on 2 busy cores.
CI_PROGRAMS = 8


def _seed() -> int:
    if not is_big_run():
        return 0
    return int(os.environ.get("FUZZ_SEED", random.randrange(2**31)))


def expected_digests(count: int, seed: int, n: int) -> tuple[list[list[str | None]], int]:
    """Per rank, per program: the digest of the world reference's outputs (None: refused as inexact);
    and in how many programs every rank's inputs differ (equal ones would hide a block's order)."""
    out: list[list[str | None]] = [[] for _ in range(n)]
    apart = 0
    for index, (program, _) in enumerate(draw_programs(count, seed)):
        resolved = resolve(program)
        inputs = [rank_inputs(resolved, r, seed=index) for r in range(n)]
        apart += len({digest(x) for x in inputs}) == n
        try:
            per_rank = world_reference(resolved, inputs)
        except Inexact:
            per_rank = [None] * n
        for r in range(n):
            out[r].append(None if per_rank[r] is None else digest(per_rank[r]))
    return out, apart


def test_fuzz_collective_combiners_on_n_ranks(tmp_path: Path) -> None:
    count, seed = example_count(CI_PROGRAMS), _seed()
    timeout = 120 + 10 * count  # a program takes 2-5 s on 2 busy cores
    cmd = [sys.executable, "-m", "tvm_combiners.collectives.runtime.launch", "-n", str(RANKS), "--timeout", str(timeout),
           "--", sys.executable, str(PROG), str(tmp_path), str(count), str(seed)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 60)
    what = f"{RANKS} ranks, {count} programs, seed {seed} (FUZZ_SEED={seed} reruns them)"
    assert proc.returncode == 0, f"{what}:\n{proc.stdout[-3000:]}{proc.stderr[-6000:]}"
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(RANKS)]
    sizes = [(r["rank"], r["world_size"]) for r in reports]
    assert sizes == [(r, RANKS) for r in range(RANKS)], f"{what}: (rank, world size) per report {sizes}"
    assert {r["programs"] for r in reports} == {count}, f"{what}: programs drawn per rank {[r['programs'] for r in reports]}"
    assert len({r["drawn"] for r in reports}) == 1, f"{what}: the ranks drew different programs"
    for key in ("checks", "runs", "skipped", "changed"):
        assert all(r[key] == reports[0][key] for r in reports), f"{what}: ranks differ in {key}: {[r[key] for r in reports]}"
    skipped = reports[0]["skipped"]
    assert skipped <= count // 4, f"{what}: the reference refused {skipped} programs as inexact"
    checked = count - skipped
    assert reports[0]["checks"] == checked * (1 + len(PASS_SETTINGS)), f"{what}: {reports[0]['checks']} checks"
    assert sum(reports[0]["changed"].values()) > 0, f"{what}: no setting changed any module, so nothing was compared"
    want, apart = expected_digests(count, seed, RANKS)
    for r, report in enumerate(reports):
        bad = [i for i, (g, w) in enumerate(zip(report["digests"], want[r], strict=True)) if g != w]
        assert not bad, f"{what}: rank {r}'s unoptimized outputs differ from the world reference on programs {bad}"
    assert 10 * apart >= 9 * count, f"{what}: the ranks' inputs differ in {apart} programs only: equal blocks hide their order"
    print(f"{what}: {checked} programs x {len(PASS_SETTINGS)} settings, "
          f"{reports[0]['runs']} optimized modules run, changed per setting {reports[0]['changed']}")

