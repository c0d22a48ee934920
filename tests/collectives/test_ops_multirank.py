"""Every Relax collective op compiled for llvm and run on 2, 3 and 4 ranks; every rank checked against numpy.

One launch per rank count (CI has 2 cores): the selfcheck program builds one module with every op
and reduction, groups, allgather/reduce_scatter on several axes, send/recv patterns (pair swap,
partial pairs, two rings in flight, a channel used twice, recvs placed before their sends) and an
unused allreduce, then saves each rank's results. The launcher runs it as ``python -m mpi4py``, so
a failing rank ends the job; the timeout bounds a hung one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tvm_combiners.collectives import selfcheck

TIMEOUT_S = 150


def launch_prog(prog: Path, n: int, args: list[str], timeout: float, **env: str) -> subprocess.CompletedProcess:
    """``python prog ARGS`` on ``n`` ranks under the CLI's launcher, in a subprocess with a hard limit of its
    own above the job's timeout (room for a loaded machine: a 6 s job took 31 s to end beside other jobs)."""
    cmd = [sys.executable, "-m", "tvm_combiners.collectives.runtime.launcher", "-n", str(n), "--timeout",
           str(timeout), "--", "python", str(prog), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 60, env={**os.environ, **env})


def launch_selfcheck(n: int, ir: str, out) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable, "-m", "tvm_combiners.collectives.runtime.launcher", "-n", str(n), "--timeout", str(TIMEOUT_S),
        "--", sys.executable, "-m", "tvm_combiners.collectives.selfcheck", "--ir", ir, "--out", str(out),
    ]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S + 30)


def check_ranks(n: int, out, suffixes: tuple[str, ...], allreduce_runs: int) -> None:
    ins = [selfcheck.inputs(r) for r in range(n)]
    n_allreduce = sum(c.name.startswith("allreduce") for c in selfcheck.cases(n)) + 1
    for rank in range(n):
        got = np.load(out / f"rank{rank}.npz")
        want = selfcheck.expected(n, rank)
        assert int(got["_allreduce_calls"]) == n_allreduce * allreduce_runs  # the unused one ran too
        for suffix in suffixes:
            for name, ref in want.items():
                value = got[name + suffix]
                assert value.dtype == ref.dtype and value.shape == ref.shape, (rank, name + suffix)
                np.testing.assert_allclose(value, ref, rtol=1e-6, atol=1e-6, err_msg=f"rank {rank} {name}{suffix}")
            # independent spot checks, written out here rather than taken from the selfcheck's table
            np.testing.assert_allclose(got["allreduce_sum" + suffix], sum(x["f"] for x in ins), rtol=1e-6)
            np.testing.assert_array_equal(got["allreduce_int_min" + suffix], np.min([x["i"] for x in ins], axis=0))
            np.testing.assert_array_equal(got["allgather_axis0" + suffix], np.concatenate([x["f"] for x in ins]))
            chunk = sum(x["s"] for x in ins)[rank * 12 // n : (rank + 1) * 12 // n]
            np.testing.assert_allclose(got["reduce_scatter_sum" + suffix], chunk, rtol=1e-6)
            partner = rank ^ 1
            swap = ins[partner]["f"] if partner < n else np.zeros((4, 6), "float32")
            np.testing.assert_array_equal(got["swap" + suffix], swap)
            np.testing.assert_array_equal(got["ring_fwd" + suffix], ins[(rank - 1) % n]["i"])
            np.testing.assert_array_equal(got["ring_back" + suffix], ins[(rank + 1) % n]["s"])
            partial = ins[0]["f"] if rank == n - 1 else np.zeros((4, 6), "float32")
            np.testing.assert_array_equal(got["partial" + suffix], partial)
            np.testing.assert_array_equal(got["two_hops" + suffix], ins[(rank - 2) % n]["t"])
            check_bfloat16(got, ins, n, rank, suffix)


def check_bfloat16(got, ins, n: int, rank: int, suffix: str) -> None:
    """bfloat16 (saved widened to float32) against the float32 reduction rounded once via ml_dtypes."""
    import ml_dtypes

    wide = [x["bf"].astype("float32") for x in ins]
    total = np.sum(wide, axis=0)
    np.testing.assert_array_equal(got["allreduce_bf16_sum" + suffix],
                                  total.astype(ml_dtypes.bfloat16).astype("float32"))
    assert not np.array_equal(total.astype(ml_dtypes.bfloat16).astype("float32"), total)  # the rounding shows
    np.testing.assert_array_equal(got["reduce_scatter_bf16_avg" + suffix],
                                  np.split((total / n).astype(ml_dtypes.bfloat16).astype("float32"), n)[rank])
    np.testing.assert_array_equal(got["allgather_bf16_axis1" + suffix], np.concatenate(wide, axis=1))
    np.testing.assert_array_equal(got["ring_bf16" + suffix], wide[(rank - 1) % n])


@pytest.mark.parametrize("n", [2, 3, 4])
def test_every_op_on_n_ranks_relax(n, tmp_path):
    proc = launch_selfcheck(n, "relax", tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"rank{r}.npz" for r in range(n)]
    check_ranks(n, tmp_path, ("",), allreduce_runs=1)


def test_expected_values_are_not_trivial():
    """The reference itself: groups and pairs really differ between ranks (a test that cannot fail is no test)."""
    want = [selfcheck.expected(4, r) for r in range(4)]
    assert not np.array_equal(want[0]["allreduce_groups_sum"], want[1]["allreduce_groups_sum"])
    assert not np.array_equal(want[0]["reduce_scatter_sum"], want[1]["reduce_scatter_sum"])
    assert np.count_nonzero(want[0]["partial"]) == 0 and np.count_nonzero(want[3]["partial"]) > 0
    assert selfcheck.swap_pairs(3) == [[0, 1], [1, 0]]  # rank 2 takes no part
