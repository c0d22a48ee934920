"""TVM's ``runtime.disco.*`` built-ins and ``relax.distributed`` modules on the collectives runtime.

Two launches (CI has 2 cores and MPICH busy-polls): ``progs/disco_prog.py runtime`` calls every disco
function on 4 ranks in 2 disco groups, ``distributed`` runs every kind of module TVM's relax.distributed
tests use, lowered by ``distributed_pipeline``, on 2 ranks; each rank saves what it got and the expected
values are recomputed here with numpy (and the unsharded modules, compiled here while the ranks run).
Every launch has its own timeout.  What needs no ranks (what each rank computes, what TVM's passes cannot
lower, the pass that refuses a dropped allreduce, launch's option) runs in this process.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")
pytest.importorskip("mpi4py")

from tvm import relax  # noqa: E402
from tvm.relax.distributed import DeviceMesh, Placement  # noqa: E402
from tvm.relax.distributed import transform as dist  # noqa: E402
from tvm.script.parser import ir as I  # noqa: E402, N812 - TVMScript's names
from tvm.script.parser import relax as R  # noqa: E402, N812
from tvm.target import Target  # noqa: E402

from tvm_combiners.collectives.relax.distributed import (  # noqa: E402
    CheckShardedOps,
    ShardingError,
    check_sharded_ops,
    distributed_passes,
    distributed_pipeline,
)
from tvm_combiners.collectives.runtime import comm  # noqa: E402
from tvm_combiners.compile.pipelines import default_pipeline  # noqa: E402

PROG = Path(__file__).parent / "progs" / "disco_prog.py"
_spec = importlib.util.spec_from_file_location("disco_prog", PROG)
prog = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = prog  # TVMScript reads its modules' source through sys.modules
_spec.loader.exec_module(prog)
data = prog.data


def _launch(n: int, mode: str, out: Path, timeout: float, *options: str,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The CLI's launcher in a subprocess, with a hard limit of its own above the job's timeout."""
    cmd = [sys.executable, "-m", "tvm_combiners.collectives.runtime.launcher", "-n", str(n), "--timeout",
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


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _layer_norm(x: np.ndarray, g: np.ndarray, b: np.ndarray) -> np.ndarray:
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-5) * g + b


def _attention(x: np.ndarray, wq: np.ndarray, wk: np.ndarray, wv: np.ndarray, wo: np.ndarray) -> np.ndarray:
    b, s, h, heads = prog.B, prog.S, prog.H, prog.NH
    q, k, v = ((x @ w).reshape(b, s, heads, h // heads).transpose(0, 2, 1, 3) for w in (wq, wk, wv))
    probs = _softmax(q @ k.transpose(0, 1, 3, 2) / math.sqrt(h // heads))
    return (probs @ v).transpose(0, 2, 1, 3).reshape(b, s, h) @ wo


def expected_distributed() -> dict[str, np.ndarray]:
    """What every kind of ``distributed`` computes, in float64 numpy (``to_shard``: the whole tensor)."""
    cases = {k: [[a.astype(np.float64) for a in v] if isinstance(v, list) else v.astype(np.float64) for v in vs]
             for k, vs in prog.case_inputs().items()}
    x, w1, w2 = cases["mlp"]
    x_, wq, wk, wv, wo, g1, b1, f1, fb1, f2, fb2, g2, b2 = cases["decoder"]
    h = _layer_norm(_attention(x_, wq, wk, wv, wo) + x_, g1, b1)
    return {"mlp": _gelu(x @ w1) @ w2, "mlp_tuple": _gelu(x @ w1)[:4] @ w2,
            "const": (_gelu(x @ prog.const_weight().astype(np.float64) @ w1) + 2) @ w2,
            "attention": _attention(*cases["attention"]),
            "decoder": _layer_norm(_gelu(h @ f1 + fb1) @ f2 + fb2 + h, g2, b2),
            "to_shard": sum(cases["to_shard"])}


def test_relax_distributed_modules_on_2_ranks(tmp_path: Path) -> None:
    """The kinds of module TVM's relax.distributed tests use (an MLP, an MLP with a tuple parameter, one
    with constants, attention with its heads split, a decoder layer, a replicated-to-sharded
    redistribution), each through ``distributed_pipeline`` on 2 ranks (one launch for all), equal the
    unsharded module (the package's default pipeline, compiled here) and numpy on every rank. TVM's own
    order (PropagateSharding on high-level ops) compiles and runs the MLP, and is wrong."""
    with ThreadPoolExecutor(1) as pool:  # the ranks run while this process compiles the unsharded modules
        job = pool.submit(_launch, 2, "distributed", tmp_path, 240)
        pipeline, inputs = default_pipeline(Target("llvm")), prog.case_inputs()
        single = {kind: prog.run(tvm.compile(prog.unsharded(mod), "llvm", relax_pipeline=pipeline), inputs[kind])
                  for kind, mod in prog.modules().items() if kind != "to_shard"}  # typed with DTensors: no such form
        proc = job.result()
    assert proc.returncode == 0, proc.stderr[-4000:]
    want = expected_distributed()
    got = [np.load(tmp_path / f"rank{r}.npz") for r in range(2)]
    for rank, g in enumerate(got):
        assert set(g.files) == {*want, "trap"}, rank
        np.testing.assert_array_equal(g["to_shard"], want["to_shard"][:, rank * 8:(rank + 1) * 8])  # its half
        for kind, value in single.items():
            assert g[kind].shape == value.shape, (kind, rank)
            error = np.abs(g[kind] - value).max()
            assert error < 1e-4, f"{kind} on rank {rank}: the sharded module's result is {error} off the unsharded"
            np.testing.assert_allclose(g[kind], want[kind], atol=1e-4, rtol=1e-4, err_msg=f"{kind} on rank {rank}")
        # the trap: each rank returns its partial product (measured: errors of 30-37 here)
        assert np.abs(g["trap"] - single["mlp"]).max() > 1, f"rank {rank}: the allreduce was not dropped"
    for kind, value in single.items():
        np.testing.assert_allclose(value, want[kind], atol=1e-4, rtol=1e-4, err_msg=f"{kind} unsharded")
        np.testing.assert_array_equal(got[0][kind], got[1][kind], err_msg=kind)  # replicated: one result
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


def _lowered_ops(mod: tvm.IRModule) -> tuple[list[str], list[tuple[int, ...]]]:
    """The ops ``main`` calls after ``distributed_passes``, and the shapes of its call_tir results."""
    lowered = tvm.transform.Sequential(distributed_passes("llvm"))(mod)
    ops: list[str] = []
    shapes: list[tuple[int, ...]] = []

    def visit(e: relax.Expr) -> None:
        if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op):
            ops.append(e.op.name.removeprefix("relax."))
            if e.op.name == "relax.call_tir" and isinstance(e.ty, relax.TensorType):
                shapes.append(tuple(int(d) for d in e.ty.shape.values))

    relax.analysis.post_order_visit(lowered["main"], visit)
    return ops, shapes


def test_what_each_rank_computes_of_the_distributed_modules() -> None:
    """Lowered for 2 ranks: the attention computes 2 of its 4 heads per rank and ends in one allreduce, the
    decoder layer in two (attention, FFN); the constant MLP keeps its replicated constant, a plain tensor."""
    mods = prog.modules()
    ops, shapes = _lowered_ops(mods["attention"])
    heads = (prog.B, prog.NH // 2, prog.S, prog.S)  # the scores: this rank's heads
    assert ops.count("ccl.allreduce") == 1 and ops.count("ccl.scatter_from_worker0") == 4
    assert heads in shapes and (prog.B, prog.NH, prog.S, prog.S) not in shapes
    ops, shapes = _lowered_ops(mods["decoder"])
    assert ops.count("ccl.allreduce") == 2 and heads in shapes and (prog.B * prog.S, prog.FFN) not in shapes
    assert (prog.B, prog.S, prog.FFN // 2) in shapes  # the FFN's hidden layer: this rank's half
    lowered = tvm.transform.Sequential(distributed_passes("llvm"))(mods["const"])
    consts: list[relax.Expr] = []
    relax.analysis.post_order_visit(lowered["main"], lambda e: consts.append(e) if isinstance(
        e, tvm.ir.expr.GenericConst) else None)
    assert [tuple(int(d) for d in c.ty.shape.values) for c in consts] == [(16, 16)]
    assert isinstance(consts[0].ty, relax.TensorType)  # LowerDistIR leaves it a DTensor: LocalConstants


@I.ir_module
class _ShardedToReplicated:
    I.module_attrs({"device_num": 2})
    I.module_global_infos({"mesh": [R.device_mesh((2,), I.Range(0, 2))]})

    @R.function
    def main(x: R.DTensor((8, 16), "float32", "mesh[0]", "S[1]")) -> R.DTensor((8, 16), "float32", "mesh[0]", "R"):
        y = R.dist.redistribute(x, "mesh[0]", "R")
        return y


def _sharded_constant(annotated: bool) -> tvm.IRModule:
    """The MLP with its second weight a constant, sharded ``S[0]`` by its annotation or by propagation."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((8, 16), "float32"))
    w1 = relax.Var("w1", relax.TensorType((16, 32), "float32"))
    with bb.function("main", [x, w1]):
        with bb.dataflow():
            h = bb.emit(_shard(bb.emit(relax.op.matmul(x, w1)), "S[1]"))
            w2 = bb.emit(relax.const(np.ones((32, 16), "float32")))  # bound to a var, as the BlockBuilder does
            out = bb.emit_output(bb.emit(relax.op.matmul(h, bb.emit(_shard(w2, "S[0]")) if annotated else w2)))
        bb.emit_func_output(out)
    return bb.get()


def test_what_tvm_cannot_lower_is_refused_at_compile_time() -> None:
    """What TVM's passes do not lower is refused at compile time, not run wrong: a sharded-to-replicated
    redistribution (LegalizeRedistribute has no allgather) and a sharded constant (PropagateSharding's own
    line where propagation shards it; ours where an annotation does, on which TVM fails an internal check)."""
    with pytest.raises(tvm.error.InternalError) as err:
        tvm.compile(_ShardedToReplicated, "llvm", relax_pipeline=distributed_pipeline("llvm"))
    assert str(err.value).strip().splitlines()[-1] == "Allgather not implemented yet"
    with pytest.raises(tvm.error.InternalError) as err:
        tvm.compile(_sharded_constant(False), "llvm", relax_pipeline=distributed_pipeline("llvm"))
    assert str(err.value).strip().splitlines()[-1].endswith(
        "GenericConst is not allowed to be sharded. Please convert it into an input param.")
    with pytest.raises(ShardingError) as err:
        tvm.compile(_sharded_constant(True), "llvm", relax_pipeline=distributed_pipeline("llvm"))
    assert str(err.value) == (
        "tvm_combiners.ConstantOperands: R.dist.annotate_sharding in function 'main' shards a constant of "
        "shape (32, 16) (S[0]): TVM's PropagateSharding cannot shard a constant; pass it as a parameter")


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
    proc = subprocess.run([sys.executable, "-m", "tvm_combiners.collectives.runtime.launcher", "-n", "4",
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
    assert str(err.value) == ("runtime.disco.allreduce: TVM_COMBINERS_DISCO_GROUPS=3 does not divide the 4 "
                              "ranks: disco's groups are equal runs of consecutive ranks")
    with pytest.raises(ValueError, match="TVM_COMBINERS_DISCO_GROUPS='two' is not a positive whole number"):
        comm.disco_group_size("two", 4, "op")
