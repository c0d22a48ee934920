"""Run on 2 ranks by tests/collectives/test_disco_combine.py: combined parameter transfers and local shards.

Each rank saves what it got to ``<out>/rank<R>.npz``; the test recomputes the expected values with numpy.
Usage: ``prog.py OUT_DIR``. Keys: ``plain|i`` / ``combined|i`` (output i of :func:`transfers_module`
compiled without / with ``BroadcastScatterCombiner``), ``mlp|unsharded``, ``mlp|full`` (the MLP through
``distributed_pipeline``, full-size inputs, combined transfers), ``mlp|full_plain`` (combine=False) and
``mlp|local`` (``local_shards=True``, each rank passing its own shards).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import tvm
from tvm import relax

#: (name, shape, dtype, op, axis): what :func:`transfers_module` broadcasts or scatters, in this order.
TRANSFERS = (
    ("a", (4, 6), "float32", "broadcast", 0),
    ("b", (6, 4), "float32", "scatter", 1),
    ("c", (8,), "float32", "scatter", 0),
    ("d", (3, 4), "float64", "broadcast", 0),
    ("e", (4, 2), "int32", "scatter", 0),
    ("f", (2, 4, 6), "float32", "scatter", 2),
    ("g", (5,), "float32", "broadcast", 0),
)
WORKERS = 2


def transfer_inputs() -> list[np.ndarray]:
    """Worker 0's parameters: distinct values everywhere, so a misplaced element shows."""
    rng = np.random.default_rng(7)
    return [(rng.standard_normal(shape) * 100).astype(dtype) for _, shape, dtype, _, _ in TRANSFERS]


def transfers_module() -> tvm.IRModule:
    """What LowerDistIR emits for parameters, in small: a broadcast or scatter of each, results returned."""
    bb = relax.BlockBuilder()
    params = [relax.Var(name, relax.TensorType(shape, dtype)) for name, shape, dtype, _, _ in TRANSFERS]
    with bb.function("main", params):
        outs = []
        for p, (_, _, _, op, axis) in zip(params, TRANSFERS):
            call = (relax.op.ccl.broadcast_from_worker0(p) if op == "broadcast"
                    else relax.op.ccl.scatter_from_worker0(p, WORKERS, axis))
            outs.append(bb.emit(call))
        bb.emit_func_output(relax.Tuple(outs))
    return bb.get()


def mlp_module(hidden: int = 32, workers: int = WORKERS, batch: int = 8, width: int = 16) -> tvm.IRModule:
    """The tensor-parallel MLP of test_disco (gelu, hidden layer split by columns) on a mesh of ``workers``."""
    from tvm.relax.distributed import DeviceMesh, Placement

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((batch, width), "float32"))
    w1 = relax.Var("w1", relax.TensorType((width, hidden), "float32"))
    w2 = relax.Var("w2", relax.TensorType((hidden, width), "float32"))
    mesh = DeviceMesh((workers,), tvm.ir.Range(0, workers))
    with bb.function("main", [x, w1, w2]):
        h = bb.emit(relax.op.nn.gelu(bb.emit(relax.op.matmul(x, w1))))
        h = bb.emit(relax.op.distributed.annotate_sharding(h, mesh, Placement.from_text("S[1]")))
        bb.emit_func_output(bb.emit(relax.op.matmul(h, w2)))
    return bb.get()


def mlp_inputs(hidden: int = 32, batch: int = 8, width: int = 16) -> list[np.ndarray]:
    rng = np.random.default_rng(41)
    return [rng.standard_normal(s).astype("float32") for s in [(batch, width), (width, hidden), (hidden, width)]]


def _run(ex: tvm.runtime.Executable, inputs: list[np.ndarray]) -> list[np.ndarray]:
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](*[tvm.runtime.tensor(a) for a in inputs])
    return [o.numpy() for o in out] if not hasattr(out, "numpy") else [out.numpy()]


def main() -> None:
    from tvm_combiners.collectives.relax.dist_combiners import BroadcastScatterCombiner
    from tvm_combiners.collectives.relax.distributed import distributed_pipeline, shard_inputs
    from tvm_combiners.collectives.runtime import rank
    from tvm_combiners.compile.pipelines import default_pipeline

    out_dir, me = Path(sys.argv[1]), rank()
    target = tvm.target.Target({"kind": "llvm"})
    got: dict[str, np.ndarray] = {}
    inputs = transfer_inputs()
    mine = inputs if me == 0 else [np.zeros_like(a) for a in inputs]  # only worker 0's are read
    for tag, passes in (("plain", []), ("combined", [BroadcastScatterCombiner()])):
        ex = tvm.compile(transfers_module(), target,
                         relax_pipeline=tvm.transform.Sequential([*passes, default_pipeline(target)]))
        got.update({f"{tag}|{i}": a for i, a in enumerate(_run(ex, mine))})

    mod, xs = mlp_module(), mlp_inputs()
    zeros = xs if me == 0 else [np.zeros_like(a) for a in xs]
    got["mlp|unsharded"] = _run(tvm.compile(_plain_mlp(), target), xs)[0]
    got["mlp|full"] = _run(tvm.compile(mod, target, relax_pipeline=distributed_pipeline(target)), zeros)[0]
    got["mlp|full_plain"] = _run(tvm.compile(mod, target, relax_pipeline=distributed_pipeline(target, combine=False)),
                                 zeros)[0]
    local = shard_inputs(mod).local_inputs("main", xs, me)
    got["mlp|local"] = _run(tvm.compile(mod, target, relax_pipeline=distributed_pipeline(target, local_shards=True)),
                            local)[0]
    np.savez(out_dir / f"rank{me}.npz", **got)


def _plain_mlp() -> tvm.IRModule:
    """The MLP without its annotation: what every rank's result must equal."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((8, 16), "float32"))
    w1 = relax.Var("w1", relax.TensorType((16, 32), "float32"))
    w2 = relax.Var("w2", relax.TensorType((32, 16), "float32"))
    with bb.function("main", [x, w1, w2]):
        h = bb.emit(relax.op.nn.gelu(bb.emit(relax.op.matmul(x, w1))))
        bb.emit_func_output(bb.emit(relax.op.matmul(h, w2)))
    return bb.get()


if __name__ == "__main__":
    main()
