"""Combined parameter transfers (``BroadcastScatterCombiner``) and local shards (``shard_inputs``,
``LocalShards``) of modules lowered by ``relax.distributed``.

What needs no ranks (op counts, keys, thresholds, plans, errors) runs in this process; one launch of
``progs/disco_combine_prog.py`` on 2 ranks checks the combined transfers bitwise and the local-shard
MLP against numpy on every rank; the benchmark's smoke run is one more launch per rank count.
"""

from __future__ import annotations

import importlib.util
import math
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")
pytest.importorskip("mpi4py")

import tvm_ffi  # noqa: E402
from tvm import relax  # noqa: E402

from tvm_combiners.collectives.relax.dist_combiners import BroadcastScatterCombiner  # noqa: E402
from tvm_combiners.collectives.relax.distributed import (  # noqa: E402
    LocalShards,
    distributed_passes,
    local_shard,
    shard_inputs,
)

PROG = Path(__file__).parent / "progs" / "disco_combine_prog.py"
BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_distributed.py"
_spec = importlib.util.spec_from_file_location("disco_combine_prog", PROG)
prog = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(prog)

_KINDS = ("relax.ccl.broadcast_from_worker0", "relax.ccl.scatter_from_worker0")


def _counts(mod: tvm.IRModule) -> Counter:
    """(op, dtype of its operand) of every broadcast and scatter in ``main``."""
    found: Counter = Counter()

    def visit(e: object) -> None:
        if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) and e.op.name in _KINDS:
            found[(e.op.name.split(".")[-1], str(e.args[0].ty.dtype))] += 1

    relax.analysis.post_order_visit(mod["main"], visit)
    return found


def test_one_transfer_per_kind_and_dtype() -> None:
    """3 broadcasts (2 float32, 1 float64) and 4 scatters (3 float32 on axes 1, 0, 2, 1 int32):
    one per key after, dtypes apart, and the combined sizes are the members' sums."""
    reports = []
    mod = prog.transfers_module()
    assert _counts(mod) == {("broadcast_from_worker0", "float32"): 2, ("broadcast_from_worker0", "float64"): 1,
                            ("scatter_from_worker0", "float32"): 3, ("scatter_from_worker0", "int32"): 1}
    out = BroadcastScatterCombiner(on_combine=reports.append)(mod)
    assert _counts(out) == {("broadcast_from_worker0", "float32"): 1, ("broadcast_from_worker0", "float64"): 1,
                            ("scatter_from_worker0", "float32"): 1, ("scatter_from_worker0", "int32"): 1}
    assert sorted((r.kind, r.num_ops, r.nbytes, r.key) for r in reports) == [
        ("ccl.broadcast_from_worker0", 2, (24 + 5) * 4, ("ccl.broadcast_from_worker0", False, "float32")),
        ("ccl.scatter_from_worker0", 3, (24 + 8 + 48) * 4, ("ccl.scatter_from_worker0", 2, False, "float32")),
    ]
    relax.analysis.well_formed(out)
    assert tvm_ffi.structural_equal(BroadcastScatterCombiner()(out), out)  # nothing left to combine


def test_threshold_is_respected() -> None:
    """A byte threshold that fits b and c (the first two float32 scatters) exactly, and not f too."""
    reports = []
    BroadcastScatterCombiner(threshold_bytes=(24 + 8) * 4, on_combine=reports.append)(prog.transfers_module())
    assert sorted((r.kind, r.num_ops, r.nbytes) for r in reports) == [
        ("ccl.broadcast_from_worker0", 2, 29 * 4), ("ccl.scatter_from_worker0", 2, 32 * 4)]
    for disabled in (BroadcastScatterCombiner(threshold_count=1), BroadcastScatterCombiner(threshold_bytes=0)):
        assert _counts(disabled(prog.transfers_module())) == _counts(prog.transfers_module())
    with pytest.raises(TypeError, match=r"^BroadcastScatterCombiner: threshold_bytes must be an int"):
        BroadcastScatterCombiner(threshold_bytes="1")


def test_skip_ahead_over_a_dependent_op() -> None:
    """A broadcast of a value computed from an earlier broadcast's result does not join it, but a
    later independent broadcast does (skip-ahead); the scatter layout unpacks on any axis."""
    bb = relax.BlockBuilder()
    a, b = (relax.Var(n, relax.TensorType((4, 4), "float32")) for n in "ab")
    with bb.function("main", [a, b]):
        ra = bb.emit(relax.op.ccl.broadcast_from_worker0(a))
        twice = bb.emit(relax.op.add(ra, ra))
        rt = bb.emit(relax.op.ccl.broadcast_from_worker0(twice))
        rb = bb.emit(relax.op.ccl.broadcast_from_worker0(b))
        bb.emit_func_output(relax.Tuple([rt, rb]))
    reports = []
    out = BroadcastScatterCombiner(on_combine=reports.append)(bb.get())
    assert [(r.num_ops, r.nbytes) for r in reports] == [(2, 128)]
    assert _counts(out) == {("broadcast_from_worker0", "float32"): 2}


def test_the_pipeline_combines_the_mlp_transfers() -> None:
    """The MLP lowered by LowerDistIR: a broadcast of x and scatters of w1 (axis 1) and w2 (axis 0);
    the pipeline's combiner leaves one scatter."""
    lowered = tvm.transform.Sequential(distributed_passes("llvm"))(prog.mlp_module())
    assert _counts(lowered) == {("broadcast_from_worker0", "float32"): 1, ("scatter_from_worker0", "float32"): 2}
    assert _counts(BroadcastScatterCombiner()(lowered)) == {("broadcast_from_worker0", "float32"): 1,
                                                           ("scatter_from_worker0", "float32"): 1}


def test_shard_plan_and_local_shards() -> None:
    plan = shard_inputs(prog.mlp_module())
    assert [(s.name, s.placement, s.shape, s.local_shape) for s in plan.inputs["main"]] == [
        ("x", "R", (8, 16), (8, 16)), ("w1", "S[1]", (16, 32), (16, 16)), ("w2", "S[0]", (32, 16), (16, 16))]
    lowered = tvm.transform.Sequential(distributed_passes("llvm"))(prog.mlp_module())
    assert shard_inputs(lowered) == plan  # an annotated module is lowered first
    local = LocalShards()(lowered)
    assert not _counts(local)
    assert [tuple(int(d) for d in p.ty.shape) for p in local["main"].params] == [(8, 16), (16, 16), (16, 16)]
    only_w2 = LocalShards(["w2"])(lowered)
    assert _counts(only_w2) == {("broadcast_from_worker0", "float32"): 1, ("scatter_from_worker0", "float32"): 1}
    with pytest.raises(ValueError, match=r"^tvm_combiners\.LocalShards: parameter 'y' is not broadcast or scattered "
                                         r"from worker 0 alone in any function"):
        LocalShards(["y"])(lowered)


def test_local_shard_follows_the_placement() -> None:
    a = np.arange(24).reshape(2, 3, 4)
    np.testing.assert_array_equal(local_shard(a, "S[2]", 1, 2), a[:, :, 2:])
    np.testing.assert_array_equal(local_shard(a, "S[0]", 0, 2), a[:1])
    assert local_shard(a, "R", 1, 2) is a
    with pytest.raises(ValueError, match=r"^local_shard: placement S\[1\] of an array of shape \(2, 3, 4\)"):
        local_shard(a, "S[1]", 0, 2)
    with pytest.raises(ValueError, match=r"^local_shard: placement 'S\[0\]R' is not 'R' or 'S\[i\]'"):
        local_shard(a, "S[0]R", 0, 2)


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.vectorize(math.erf, otypes=[np.float64])(x / math.sqrt(2)))


def _expected_transfer(rank: int, i: int) -> np.ndarray:
    _, shape, _, op, axis = prog.TRANSFERS[i]
    full = prog.transfer_inputs()[i]
    return full if op == "broadcast" else local_shard(full, f"S[{axis}]", rank, prog.WORKERS)


def test_on_2_ranks(tmp_path: Path) -> None:
    """Combined transfers are bitwise the uncombined ones (and numpy's shards), mixed dtypes
    included; the MLP with local shards equals the unsharded one on every rank."""
    cmd = [sys.executable, "-m", "tvm_combiners.collectives.runtime.launcher", "-n", "2", "--timeout", "240", "--",
           "python", str(PROG), str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr[-4000:]
    x, w1, w2 = (a.astype(np.float64) for a in prog.mlp_inputs())
    reference = _gelu(x @ w1) @ w2
    for rank in range(2):
        got = np.load(tmp_path / f"rank{rank}.npz")
        for i in range(len(prog.TRANSFERS)):
            want = _expected_transfer(rank, i)
            assert got[f"combined|{i}"].dtype == want.dtype and got[f"combined|{i}"].shape == want.shape
            assert got[f"combined|{i}"].tobytes() == got[f"plain|{i}"].tobytes() == want.tobytes(), (rank, i)
        np.testing.assert_allclose(got["mlp|unsharded"], reference, atol=1e-4, rtol=1e-5)
        assert got["mlp|full"].tobytes() == got["mlp|full_plain"].tobytes(), rank
        for key in ("mlp|full", "mlp|local"):
            error = np.abs(got[key] - got["mlp|unsharded"]).max()
            assert error < 1e-4, f"rank {rank}: {key} is {error} off the unsharded MLP"


@pytest.mark.slow
def test_benchmark_smoke_run() -> None:
    """benchmarks/bench_distributed.py at a small size: parameter bytes per rank fall with local shards."""
    proc = subprocess.run([sys.executable, str(BENCH), "--hidden", "64", "--width", "16", "--ranks", "2",
                           "--repeat", "1"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r[1]: r for r in (re.split(r"\s{2,}", line.strip()) for line in proc.stdout.splitlines()) if len(r) >= 7}
    assert float(rows["local shards"][4]) < float(rows["full"][2])  # held with shards < passed in full
