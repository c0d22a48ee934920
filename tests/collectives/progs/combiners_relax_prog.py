"""Run on N ranks by tests/collectives/test_combiners_multirank.py: every combiner, before == after.

For every case of ``combiners_cases`` and every pass (each combiner alone, all four, all four with
``combine_by_dim=False``, tiny thresholds that split groups), compile the module before and after
the pass, run both on this rank and require bitwise-equal results; a few results are also checked
against numpy. Each rank writes ``<out>/rank<R>.json`` with its number of checks; any failure
raises, which (under ``python -m mpi4py``) ends the whole job with a non-zero exit.
Usage: ``combiners_relax_prog.py OUT_DIR``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

import combiners_cases as C  # noqa: E402

import tvm_combiners.collectives.runtime as rt  # noqa: E402
from tvm_combiners.collectives.relax import combiners as CB  # noqa: E402

PASSES = {
    "allreduce": lambda: CB.AllReduceCombiner(),
    "allgather": lambda: CB.AllGatherCombiner(),
    "reduce_scatter": lambda: CB.ReduceScatterCombiner(),
    "send_recv": lambda: CB.SendRecvCombiner(),
    "all": lambda: CB.CombineCollectives(),
    "all_any_dim": lambda: CB.CombineCollectives(combine_by_dim=False),
    "small_groups": lambda: CB.CombineCollectives(threshold_bytes=200, threshold_count=2, combine_by_dim=False),
}
RANDOM_PROGRAMS = 6
CASE_PASSES = {
    "collectives": ("allreduce", "allgather", "reduce_scatter", "all", "all_any_dim", "small_groups"),
    "p2p": ("send_recv", "all", "small_groups"),
    "ccl": ("allreduce", "allgather", "all"),
}


def main(out: Path) -> None:
    n, rank = rt.world_size(), rt.rank()
    checks = 0
    for name, build in C.CASES.items():
        mod, inputs = build(n)
        args = inputs(rank)
        want = C.compile_and_run(mod, args)
        for pass_name in CASE_PASSES[name]:
            combined = PASSES[pass_name]()(mod)
            got = C.compile_and_run(combined, args)
            assert len(got) == len(want), (name, pass_name)
            for i, (a, b) in enumerate(zip(want, got)):
                assert a.dtype == b.dtype and a.shape == b.shape, (name, pass_name, i, a.shape, b.shape)
                np.testing.assert_array_equal(b, a, err_msg=f"rank {rank} case {name} pass {pass_name} output {i}")
                checks += 1
        everyone = [inputs(r) for r in range(n)]
        if name == "collectives":  # a few against numpy, independent of the uncombined module
            np.testing.assert_array_equal(want[0], sum(x[0] for x in everyone))
            np.testing.assert_array_equal(want[8], np.concatenate([x[0] for x in everyone], axis=1))
            np.testing.assert_array_equal(want[10], np.concatenate([x[2] for x in reversed(everyone)], axis=2))
            pos = rank
            chunk = sum(x[2] for x in everyone)[:, 3 * pos : 3 * (pos + 1), :]
            np.testing.assert_array_equal(want[14], chunk)
            checks += 4
        if name == "p2p":
            np.testing.assert_array_equal(want[0], everyone[(rank - 1) % n][0])
            partial = everyone[0][3] if rank == n - 1 else np.zeros(5, "float32")
            np.testing.assert_array_equal(want[3], partial)
            checks += 2
    for seed in range(RANDOM_PROGRAMS):  # generated DAGs: every pass setting, before == after
        mod, inputs = C.random_program(n, seed)
        args = inputs(rank)
        want = C.compile_and_run(mod, args)
        for pass_name in ("all_any_dim", "small_groups"):
            got = C.compile_and_run(PASSES[pass_name]()(mod), args)
            for i, (a, b) in enumerate(zip(want, got, strict=True)):
                np.testing.assert_array_equal(b, a, err_msg=f"rank {rank} random program {seed} pass {pass_name} output {i}")
                checks += 1
    (out / f"rank{rank}.json").write_text(json.dumps({"rank": rank, "world_size": n, "checks": checks}))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
