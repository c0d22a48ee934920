"""What the n-rank collective fuzzers of both IRs share: the rank loop, the launch and the report checks.

An IR gives a :class:`WorldIR` (how it builds, optimizes, runs and prints a module); the rest is
here. Each rank draws the same programs (``collective_world.draw_programs``), runs each unoptimized
on its own inputs (its outputs must be the world reference's for this rank) and after every setting
of ``PASS_SETTINGS``: the optimized module must be the same text on every rank, compared before it
runs (a pass that is not deterministic would pair different transfers across ranks and hang), and
its outputs bitwise the unoptimized ones. A module text already run is not built again. Any failure
prints the program and raises, which (the launcher runs ranks under ``python -m mpi4py``) ends the
whole job. Each rank writes ``<out>/rank<R>.json``; the test checks that every report is complete
and alike and recomputes the reference's digests itself.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from collective_spec import PASS_SETTINGS, Program, Resolved, assert_outputs_equal, resolve
from collective_world import Inexact, digest, draw_programs, rank_inputs, world_reference
from fuzz_spec import example_count, is_big_run

#: From this many programs on, a random seed gives both forms but for a chance of 2 in 2**20.
BOTH_FORMS_FROM = 20


@dataclass(frozen=True)
class WorldIR:
    """One IR's side of the n-rank fuzzer."""

    forms: tuple[str, str]  #: the drawn boolean picks ``forms[flag]``
    build: Callable[[Resolved, str, int], Any]  #: (program, form, ranks) -> module
    optimize: Callable[[str, Any], Any]  #: (setting name, module) -> module
    run: Callable[[Any, str, list[np.ndarray]], list[np.ndarray]]  #: (module, form, inputs) -> outputs
    text: Callable[[Any], str]  #: the module's full text (equal on every rank for a deterministic pass)
    extra_outputs: int = 0  #: outputs past the program's the IR may add (Relay: the sends' joint token)


# --------------------------------------------------------------------------- on every rank


def rank_main(ir: WorldIR) -> None:
    """``prog.py OUT_DIR COUNT SEED``: check every drawn program on this rank, write the report."""
    from tvm_combiners.collectives.runtime.comm import mpi

    out, count, seed = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    comm = mpi().COMM_WORLD
    drawn = draw_programs(count, seed)
    drawn_key = hashlib.sha256(repr(drawn).encode()).hexdigest()[:16]
    assert len(set(comm.allgather(drawn_key))) == 1, "the ranks drew different programs"
    report = {"rank": comm.Get_rank(), "world_size": comm.Get_size(), "seed": seed, "programs": len(drawn),
              "drawn": drawn_key, "skipped": 0, "checks": 0, "runs": 0, "digests": [],
              "changed": dict.fromkeys(PASS_SETTINGS, 0), "forms": dict.fromkeys(ir.forms, 0)}
    for index, (program, flag) in enumerate(drawn):
        form = ir.forms[flag]
        try:
            _check_program(ir, comm, index, program, form, report)
        except BaseException:
            print(f"rank {report['rank']} failed on program {index} (form {form}, seed {seed}):\n{program!r}\n"
                  f"{traceback.format_exc()}", file=sys.stderr, flush=True)
            raise
    (out / f"rank{report['rank']}.json").write_text(json.dumps(report))


def _check_program(ir: WorldIR, comm: Any, index: int, program: Program, form: str, report: dict) -> None:
    """One program on this rank: unoptimized vs the world reference, every setting vs unoptimized."""
    n, rank = comm.Get_size(), comm.Get_rank()
    resolved = resolve(program)
    inputs = [rank_inputs(resolved, r, seed=index) for r in range(n)]
    try:
        want = world_reference(resolved, inputs)[rank]
    except Inexact:  # the same on every rank: all skip it
        report["skipped"] += 1
        report["digests"].append(None)
        return
    mod = ir.build(resolved, form, n)
    base = ir.run(mod, form, inputs[rank])
    assert 0 <= len(base) - len(want) <= ir.extra_outputs, f"rank {rank}: {len(base)} outputs for {len(want)} values"
    assert_outputs_equal(resolved, base[:len(want)], want, f"rank {rank}, {form}: the unoptimized module vs the world reference")
    report["digests"].append(digest(base[:len(want)]))
    report["forms"][form] += 1
    report["checks"] += 1
    unoptimized = _key(ir.text(mod))
    ran = {unoptimized: base}
    for name in PASS_SETTINGS:
        new = ir.optimize(name, mod)
        key = _key(ir.text(new))
        assert len(set(comm.allgather(key))) == 1, f"{name}: the optimized module differs across ranks (pass not deterministic)"
        if key not in ran:
            ran[key] = ir.run(new, form, inputs[rank])
            report["runs"] += 1
        report["changed"][name] += key != unoptimized
        assert_outputs_equal(resolved, ran[key], base, f"rank {rank}, {form}, setting {name}: optimized vs unoptimized")
        report["checks"] += 1


def _key(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


# --------------------------------------------------------------------------- in the test


def run_world_test(prog: Path, tmp_path: Path, label: str, ci_programs: int, seconds_per_program: int) -> None:
    """Launch ``prog`` on ``FUZZ_RANKS`` ranks (2 by default; 3 makes the ring a real ring, where a
    reversed direction shows), ``ci_programs`` programs of seed 0 unless ``FUZZ_EXAMPLES`` (and
    ``FUZZ_SEED``, else a random seed, printed) say otherwise, and check every rank's report."""
    ranks = int(os.environ.get("FUZZ_RANKS", "2"))
    count = example_count(ci_programs)
    seed = int(os.environ.get("FUZZ_SEED", random.randrange(2**31))) if is_big_run() else 0
    timeout = 120 + seconds_per_program * count
    cmd = [sys.executable, "-m", "tvm_combiners.collectives.runtime.launcher", "-n", str(ranks), "--timeout", str(timeout),
           "--", sys.executable, str(prog), str(tmp_path), str(count), str(seed)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 60)
    what = f"{label}, {ranks} ranks, {count} programs, seed {seed} (FUZZ_SEED={seed} reruns them)"
    assert proc.returncode == 0, f"{what}:\n{proc.stdout[-3000:]}{proc.stderr[-6000:]}"
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(ranks)]
    check_reports(reports, count, seed, what)
    first = reports[0]
    print(f"{what}: {count - first['skipped']} programs ({first['forms']}) x {len(PASS_SETTINGS)} settings, "
          f"{first['runs']} optimized modules run, changed per setting {first['changed']}")


def check_reports(reports: list[dict], count: int, seed: int, what: str) -> None:
    """Every rank's report complete and alike, and its unoptimized outputs the world reference's."""
    n = len(reports)
    sizes = [(r["rank"], r["world_size"]) for r in reports]
    assert sizes == [(r, n) for r in range(n)], f"{what}: (rank, world size) per report {sizes}"
    assert {r["programs"] for r in reports} == {count}, f"{what}: programs drawn per rank {[r['programs'] for r in reports]}"
    assert len({r["drawn"] for r in reports}) == 1, f"{what}: the ranks drew different programs"
    for key in ("checks", "runs", "skipped", "changed", "forms"):
        assert all(r[key] == reports[0][key] for r in reports), f"{what}: ranks differ in {key}: {[r[key] for r in reports]}"
    first = reports[0]
    skipped = first["skipped"]
    assert skipped <= count // 4, f"{what}: the reference refused {skipped} programs as inexact"
    checked = count - skipped
    assert first["checks"] == checked * (1 + len(PASS_SETTINGS)), f"{what}: {first['checks']} checks"
    assert sum(first["forms"].values()) == checked, f"{what}: forms {first['forms']} for {checked} programs"
    if not is_big_run() or count >= BOTH_FORMS_FROM:
        assert all(first["forms"].values()), f"{what}: one form only: {first['forms']}"
    assert sum(first["changed"].values()) > 0, f"{what}: no setting changed any module, so nothing was compared"
    want, apart = expected_digests(count, seed, n)
    for r, report in enumerate(reports):
        bad = [i for i, (g, w) in enumerate(zip(report["digests"], want[r], strict=True)) if g != w]
        assert not bad, f"{what}: rank {r}'s unoptimized outputs differ from the world reference on programs {bad}"
    assert 10 * apart >= 9 * count, f"{what}: the ranks' inputs differ in {apart} programs only: equal blocks hide their order"


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
