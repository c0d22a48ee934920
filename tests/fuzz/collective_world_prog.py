"""Run on n ranks by ``test_fuzz_collectives_world.py``: the collective fuzzer's programs, every pass setting.

Every rank draws the same programs (``collective_world.draw_programs``: count and seed from the
command line), builds each for the world (``build_collectives_relax``) and runs it unoptimized on
its own inputs: its outputs must equal the world reference for this rank. Then, for every setting
of ``PASS_SETTINGS``, the optimized module must be the same text on every rank (a pass that is not
deterministic pairs different transfers across ranks) and its outputs must equal the unoptimized
ones bitwise. A module text already run (a setting that changed nothing, or two that agree) is not
compiled again. Any failure prints the program and setting and raises, which (the launcher runs
this under ``python -m mpi4py``) ends the whole job. Each rank writes ``<out>/rank<R>.json``: its
counts, per program the digest of its unoptimized outputs (None for a program the reference
refuses), and per setting how many modules it changed.
Usage: ``collective_world_prog.py OUT_DIR COUNT SEED``.
"""

from __future__ import annotations

import hashlib
import json
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import numpy as np  # noqa: E402
import tvm  # noqa: E402
from build_collectives_relax import build_module  # noqa: E402
from collective_spec import PASS_SETTINGS, Program, assert_outputs_equal, resolve, setting_passes  # noqa: E402
from collective_world import Inexact, digest, draw_programs, rank_inputs, world_reference  # noqa: E402
from tvm import relax  # noqa: E402

import tvm_combiners.collectives.runtime as rt  # noqa: E402
from tvm_combiners.collectives import relax as CR  # noqa: E402
from tvm_combiners.collectives.combiners import relax as CB  # noqa: E402
from tvm_combiners.collectives.runtime.comm import mpi  # noqa: E402

TARGET = tvm.target.Target({"kind": "llvm", "opt-level": 0})  # tiny modules compile twice as fast


def run(mod: tvm.IRModule, args: list[np.ndarray]) -> list[np.ndarray]:
    ex = tvm.compile(mod, target=TARGET, relax_pipeline=CR.pipeline(TARGET))
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](*[tvm.runtime.tensor(a) for a in args])
    return [o.numpy() for o in out]


def text_key(mod: tvm.IRModule) -> str:
    return hashlib.sha256(mod.script().encode()).hexdigest()


def check_program(index: int, program: Program, dataflow: bool, report: dict) -> None:
    """One program on this rank: unoptimized vs the world reference, every setting vs unoptimized."""
    comm = mpi().COMM_WORLD
    n, rank = comm.Get_size(), comm.Get_rank()
    resolved = resolve(program)
    inputs = [rank_inputs(resolved, r, seed=index) for r in range(n)]
    try:
        want = world_reference(resolved, inputs)[rank]
    except Inexact:  # the same on every rank: all skip it
        report["skipped"] += 1
        report["digests"].append(None)
        return
    mod = build_module(resolved, dataflow, ranks=n)
    base = run(mod, inputs[rank])
    assert_outputs_equal(resolved, base, want, f"rank {rank}: the unoptimized module vs the world reference")
    report["digests"].append(digest(base))
    report["checks"] += 1
    unoptimized = text_key(mod)
    ran = {unoptimized: base}
    for name in PASS_SETTINGS:
        new = tvm.transform.Sequential(setting_passes(CB, name))(mod)
        key = text_key(new)
        keys = comm.allgather(key)  # before running it: ranks with different modules could hang
        assert len(set(keys)) == 1, f"{name}: the optimized module differs across ranks (pass not deterministic)"
        if key not in ran:
            ran[key] = run(new, inputs[rank])
            report["runs"] += 1
        report["changed"][name] += key != unoptimized
        assert_outputs_equal(resolved, ran[key], base, f"rank {rank}, setting {name}: optimized vs unoptimized")
        report["checks"] += 1


def main(out: Path, count: int, seed: int) -> None:
    n, rank = rt.world_size(), rt.rank()
    drawn = draw_programs(count, seed)
    drawn_key = hashlib.sha256(repr(drawn).encode()).hexdigest()[:16]
    assert len(set(mpi().COMM_WORLD.allgather(drawn_key))) == 1, "the ranks drew different programs"
    report = {"rank": rank, "world_size": n, "seed": seed, "programs": len(drawn), "drawn": drawn_key,
              "skipped": 0, "checks": 0, "runs": 0, "digests": [], "changed": dict.fromkeys(PASS_SETTINGS, 0)}
    for index, (program, dataflow) in enumerate(drawn):
        try:
            check_program(index, program, dataflow, report)
        except BaseException:
            print(f"rank {rank} failed on program {index} (dataflow={dataflow}, seed {seed}):\n{program!r}\n"
                  f"{traceback.format_exc()}", file=sys.stderr, flush=True)
            raise
    (out / f"rank{rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
