"""TVM's ``runtime.disco.*`` built-ins and ``relax.distributed`` modules on the collectives runtime.

Two launches (CI has 2 cores and MPICH busy-polls): ``progs/disco_prog.py runtime`` calls every disco
function on 4 ranks in 2 disco groups, ``distributed`` runs modules lowered by TVM's distributed passes
on 2 ranks; each rank saves what it got and the expected values are recomputed here with numpy.  Every
launch has its own timeout.  What needs no ranks (the pass that refuses a dropped allreduce, launch's
option) runs in this process.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")
pytest.importorskip("mpi4py")

from tvm import relax  # noqa: E402
from tvm.relax.distributed import DeviceMesh, Placement  # noqa: E402
from tvm.relax.distributed import transform as dist  # noqa: E402

from tvm_combiners.collectives.relax.distributed import (  # noqa: E402
    CheckShardedOps,
    ShardingError,
    check_sharded_ops,
    distributed_pipeline,
)
from tvm_combiners.collectives.runtime import comm  # noqa: E402

PROG = Path(__file__).parent / "progs" / "disco_prog.py"
_spec = importlib.util.spec_from_file_location("disco_prog", PROG)
prog = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(prog)
data = prog.data


def _launch(n: int, mode: str, out: Path, timeout: float, *options: str,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The CLI's launcher in a subprocess, with a hard limit of its own above the job's timeout."""
    cmd = [sys.executable, "-m", "tvm_combiners.collectives.runtime.launch", "-n", str(n), "--timeout",
           str(timeout), *options, "--", "python", str(PROG), str(out), mode]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 60, env={**os.environ, **(env or {})})


def _reduce(kind: str, arrays: list[np.ndarray]) -> np.ndarray:
    stack = np.stack(arrays)
    if kind == "avg":
        return stack.sum(0) / len(arrays)
    return {"sum": np.sum, "prod": np.prod, "min": np.min, "max": np.max}[kind](stack, axis=0)


def expected_runtime(rank: int, n: int, per: int) -> dict[str, np.ndarray]:
    """What every key of the ``runtime`` mode must hold on ``rank`` of ``n`` ranks in groups of ``per``."""
    want: dict[str, np.ndarray] = {"worker_id": np.array([rank]), "worker_rank": np.array(rank),
                                   "world_size": np.array(n)}
    for tag, g in (("group", per), ("all", n)):
        members = list(range(rank - rank % g, rank - rank % g + g))
        root, position = members[0], rank - members[0]
        for kind in prog.KINDS:
            want[f"allreduce|{kind}|{tag}"] = _reduce(kind, [data(m, (2, 3), 1) for m in members])
        want[f"allgather|{tag}"] = np.concatenate([data(m, (2, 3), 2).ravel() for m in members])
        want[f"broadcast|{tag}"] = data(root, (3, 2), 3).reshape(2, 3)
        want[f"scatter|{tag}"] = data(root, (g * 6,), 4)[position * 6:(position + 1) * 6].reshape(2, 3)
        if rank == root:
            want[f"gather|{tag}"] = np.stack([data(m, (2, 3), 5) for m in members]).reshape(g, 3, 2)
    if rank >= per:
        want["prev_group"] = data(rank - per, (4,), 6)
    want["ring"] = data((rank - 1) % n, (5,), 7)
    if rank:
        want["from_worker0"] = data(rank, (3,), 8)
    w = data(0, (8, 6), 10)
    ys = [data(d, (4, 8), 9) @ w for d in range(n // per)]
    want["tp_dp|y"] = ys[rank // per]
    want["tp_dp|mean"] = sum(ys) / len(ys)
    want["tp_dp|gathered"] = np.concatenate([ys[rank // per]] * per)
    return want


def expected_errors(rank: int, n: int) -> dict[str, str]:
    errors = {
        "to_self": f"runtime.disco.send_to_worker: receiver {rank} is this worker itself: a worker cannot send to "
                   "itself",
        "to_nobody": f"runtime.disco.recv_from_worker: sender {n} is not a worker: the job has {n} ranks "
                     f"(workers 0-{n - 1})",
        "scatter_root": "runtime.disco.scatter_from_worker0: worker 0 of the group gives x of 5 elements, expected "
                        "2 x 2 (one block of out's 2 per member)",
    }
    if rank == 0:
        errors["worker0_receives"] = (f"runtime.disco.recv_from_worker0: worker 0 called it: only workers 1-{n - 1} "
                                      "receive from worker 0")
        errors["no_prev_group"] = ("runtime.disco.recv_from_prev_group: worker 0 is in the first group: there is no "
                                   "previous group to receive from")
    if rank == n - 1:
        errors["no_next_group"] = (f"runtime.disco.send_to_next_group: worker {rank} is in the last of 2 groups: "
                                   "there is no next group to send to")
    return errors


def test_every_disco_function_on_4_ranks_in_2_groups(tmp_path: Path) -> None:
    """Tensor parallel 2 x data parallel 2: disco's groups {0, 1} and {2, 3} from ``--disco-groups 2``;
    every function as TVM calls it (None for the root-only buffers elsewhere), against numpy."""
    n, per = 4, 2
    proc = _launch(n, "runtime", tmp_path, 240, "--disco-groups", "2")
    assert proc.returncode == 0, proc.stderr[-4000:]
    for rank in range(n):
        got = np.load(tmp_path / f"rank{rank}.npz")
        want = expected_runtime(rank, n, per)
        assert set(got.files) == set(want), rank
        for key, value in want.items():
            assert got[key].shape == value.shape, (key, rank)
            np.testing.assert_array_equal(got[key], value, err_msg=f"{key} on rank {rank}")
        assert json.loads((tmp_path / f"rank{rank}.json").read_text()) == expected_errors(rank, n)


def _gelu(x: np.ndarray) -> np.ndarray:
    erf = np.vectorize(math.erf, otypes=[np.float64])
    return 0.5 * x * (1 + erf(x / math.sqrt(2)))


def test_relax_distributed_modules_on_2_ranks(tmp_path: Path) -> None:
    """A tensor-parallel MLP through ``distributed_pipeline`` equals the unsharded MLP on every rank;
    TVM's own order (PropagateSharding on high-level ops) compiles and runs, and is wrong; a
    replicated-to-sharded redistribution slices at ``runtime.disco.worker_id``."""
    proc = _launch(2, "distributed", tmp_path, 240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    x, w1, w2 = (a.astype(np.float64) for a in prog.mlp_inputs())
    reference = _gelu(x @ w1) @ w2
    got = [np.load(tmp_path / f"rank{r}.npz") for r in range(2)]
    for rank, g in enumerate(got):
        np.testing.assert_allclose(g["unsharded"], reference, atol=1e-4, rtol=1e-5)
        error = np.abs(g["pipeline"] - g["unsharded"]).max()
        assert error < 1e-4, f"rank {rank}: the pipeline's result is {error} off"
        # the trap: each rank returns its partial product (measured: errors of 30-37 here)
        assert np.abs(g["trap"] - g["unsharded"]).max() > 1, f"rank {rank}: the allreduce was not dropped"
        a, b = data(0, (8, 16), 11), data(0, (8, 16), 12)
        np.testing.assert_array_equal(g["redistribute"], (a + b)[:, rank * 8:(rank + 1) * 8])
    np.testing.assert_array_equal(got[0]["pipeline"], got[1]["pipeline"])  # replicated: one result
    assert not np.array_equal(got[0]["trap"], got[1]["trap"])  # each rank's own partial sum


def _shard(expr: relax.Expr, placement: str) -> relax.Call:
    """``R.dist.annotate_sharding`` on a mesh of 2 workers."""
    mesh = DeviceMesh((2,), tvm.ir.Range(0, 2))
    return relax.op.distributed.annotate_sharding(expr, mesh, Placement.from_text(placement))


def _annotated_mlp() -> tvm.IRModule:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((8, 16), "float32"))
    w1 = relax.Var("w1", relax.TensorType((16, 32), "float32"))
    w2 = relax.Var("w2", relax.TensorType((32, 16), "float32"))
    with bb.function("main", [x, w1, w2]):
        h = bb.emit(relax.op.nn.gelu(bb.emit(relax.op.matmul(x, w1))), name_hint="hidden")
        h = bb.emit(_shard(h, "S[1]"))
        bb.emit_func_output(bb.emit(relax.op.matmul(h, w2)))
    return bb.get()


def test_the_dropped_allreduce_is_refused() -> None:
    """TVM's passes in its tests' order lower the MLP with no error and no allreduce; the check names it."""
    mod = _annotated_mlp()
    for p in (dist.PropagateSharding(), dist.LowerGlobalViewToLocalView()):
        mod = p(mod)
    with pytest.raises(ShardingError) as err:
        CheckShardedOps()(mod)
    assert str(err.value) == (
        "tvm_combiners.CheckShardedOps: R.matmul in function 'main' takes hidden sharded on its axis 1 (S[1] on "
        "mesh axis 0) and gives a replicated (R) result: TVM lowers a high-level op as a local computation, so each "
        "rank would return its partial result with no collective (annotate plain tensors with R.dist.annotate_sharding "
        "and legalize the ops before PropagateSharding, as tvm_combiners.collectives.relax.distributed_pipeline "
        "does)")
    legalized = relax.transform.LegalizeOps()(_annotated_mlp())
    for p in (dist.PropagateSharding(), dist.LowerGlobalViewToLocalView()):
        legalized = p(legalized)
    check_sharded_ops(legalized)  # call_tir: its allreduce is there
    ops: list[str] = []
    relax.analysis.post_order_visit(legalized["main"], lambda e: ops.append(e.op.name) if isinstance(e, relax.Call)
                                    and isinstance(e.op, tvm.ir.Op) else None)
    assert ops.count("relax.ccl.allreduce") == 1


def test_the_pipeline_refuses_a_module_it_cannot_legalize() -> None:
    """A module already typed with DTensors keeps its high-level ops (LegalizeOps skips them): refused."""
    mod = dist.PropagateSharding()(_annotated_mlp())
    with pytest.raises(ShardingError, match=r"^tvm_combiners\.CheckShardedOps: R\.matmul in function 'main'"):
        tvm.compile(mod, "llvm", relax_pipeline=distributed_pipeline("llvm"))


def test_a_primfunc_copied_per_sharding_keeps_a_symbol_of_its_own() -> None:
    """LowerGlobalViewToLocalView copies a public PrimFunc called with two shardings, symbol and all:
    TVM's build then fails on a duplicate global symbol."""
    from tvm import te

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((8, 16), "float32"))
    y = relax.Var("y", relax.TensorType((8, 16), "float32"))
    a, b = te.placeholder((8, 16), name="a"), te.placeholder((8, 16), name="b")
    add = te.create_prim_func([a, b, te.compute((8, 16), lambda i, j: a[i, j] + b[i, j])])
    gv = bb.add_func(add.with_attr("global_symbol", "add"), "add")
    with bb.function("main", [x, y]):
        s = bb.emit(relax.call_tir(gv, [x, y], relax.TensorType((8, 16), "float32")))
        s = bb.emit(_shard(s, "S[1]"))
        bb.emit_func_output(bb.emit(relax.call_tir(gv, [s, s], relax.TensorType((8, 16), "float32"))))
    tvm.compile(bb.get(), "llvm", relax_pipeline=distributed_pipeline("llvm"))


def test_disco_groups_must_divide_the_ranks(tmp_path: Path) -> None:
    """``launch --disco-groups 3 -n 4``: one line, no rank started; the runtime says the same of its
    environment variable, on every rank, at the first collective."""
    proc = subprocess.run([sys.executable, "-m", "tvm_combiners.collectives.runtime.launch", "-n", "4",
                           "--disco-groups", "3", "--", "python", str(PROG), str(tmp_path), "runtime"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr == ("tvm-combiners: error: launch: --disco-groups 3 does not divide the 4 ranks: disco's "
                           "groups are equal runs of consecutive ranks\n")
    assert not list(tmp_path.iterdir())
    assert comm.disco_group_size("", 4, "op") == 4
    assert comm.disco_group_size("2", 4, "op") == 2
    with pytest.raises(ValueError) as err:
        comm.disco_group_size("3", 4, "runtime.disco.allreduce")
    assert str(err.value) == ("runtime.disco.allreduce: TVM_COMBINERS_DISCO_GROUPS=3 does not divide the job's 4 "
                              "ranks: disco's groups are equal runs of consecutive ranks")
    with pytest.raises(ValueError, match="TVM_COMBINERS_DISCO_GROUPS='two' is not a positive whole number"):
        comm.disco_group_size("two", 4, "op")
