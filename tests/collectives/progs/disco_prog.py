"""Run on N ranks by tests/collectives/test_disco.py: TVM's ``runtime.disco.*`` functions on this runtime.

Each rank saves what it got to ``<out>/rank<R>.npz`` and its error messages to ``<out>/rank<R>.json``;
the test recomputes every expected value with numpy from ``data()``.
Usage: ``prog.py OUT_DIR runtime`` (every function, called as TVM calls it, on 4 ranks in 2 disco groups:
a tensor-parallel pair per group, data-parallel across them), ``distributed`` (modules lowered by
``relax.distributed`` on 2 ranks: a tensor-parallel MLP through ``distributed_pipeline``, the same MLP
through TVM's passes in the order that drops its allreduce, and a replicated-to-sharded redistribution).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import tvm
from tvm.script.parser import ir as I  # noqa: N812 - TVMScript's names, looked up in this module's globals
from tvm.script.parser import relax as R  # noqa: N812

KINDS = ("sum", "prod", "min", "max", "avg")  # R.ccl's op_type, numbered as disco's ReduceKind


def data(rank: int, shape: tuple[int, ...], salt: int, dtype: str = "float32") -> np.ndarray:
    """Small integers (exact under every reduction) that differ per rank and per case."""
    rng = np.random.default_rng([rank, salt])
    return rng.integers(1, 4, size=shape).astype(dtype)


def mlp_inputs() -> list[np.ndarray]:
    """x, w1, w2 of the MLP (the same on every rank: only worker 0's are used)."""
    rng = np.random.default_rng(41)
    return [rng.standard_normal(s).astype("float32") for s in [(8, 16), (16, 32), (32, 16)]]


def _error(call: Any) -> str:
    try:
        call()
    except Exception as err:  # noqa: BLE001 - the message is what the test checks
        return str(err).strip().splitlines()[-1]
    return "no error"


def runtime(out_dir: Path) -> None:
    import tvm_ffi
    from tvm import relax

    from tvm_combiners.collectives.runtime import rank, world_size

    me, n = rank(), world_size()
    per = n // 2  # launched with --disco-groups 2
    fn = {name: tvm.get_global_func(f"runtime.disco.{name}") for name in (
        "worker_id", "worker_rank", "world_size", "allreduce", "allgather", "broadcast_from_worker0",
        "scatter_from_worker0", "gather_to_worker0", "recv_from_worker0", "send_to_worker", "recv_from_worker",
        "send_to_next_group", "recv_from_prev_group")}
    tensor, empty = tvm.runtime.tensor, tvm.runtime.empty
    got: dict[str, np.ndarray] = {
        "worker_id": np.array(list(fn["worker_id"]()), np.int64),
        "worker_rank": np.array(fn["worker_rank"](), np.int64),
        "world_size": np.array(fn["world_size"](), np.int64),
    }
    for grouped in (True, False):
        tag = "group" if grouped else "all"
        g = per if grouped else n
        for code, kind in enumerate(KINDS):
            out = empty((2, 3), "float32")
            fn["allreduce"](tensor(data(me, (2, 3), 1)), tvm_ffi.Shape([code]), grouped, out)
            got[f"allreduce|{kind}|{tag}"] = out.numpy()
        out = empty((g * 2 * 3,), "float32")  # flat: only element counts must agree, as in disco
        fn["allgather"](tensor(data(me, (2, 3), 2)), grouped, out)
        got[f"allgather|{tag}"] = out.numpy()
        root = me % per == 0 if grouped else me == 0
        out = empty((2, 3), "float32")  # the root's x alone is read; others give none
        fn["broadcast_from_worker0"](tensor(data(me, (3, 2), 3)) if root else None, grouped, out)
        got[f"broadcast|{tag}"] = out.numpy()
        out = empty((2, 3), "float32")
        fn["scatter_from_worker0"](tensor(data(me, (g * 6,), 4)) if root else None, grouped, out)
        got[f"scatter|{tag}"] = out.numpy()
        out = empty((g, 3, 2), "float32") if root else None
        fn["gather_to_worker0"](tensor(data(me, (2, 3), 5)), grouped, out)
        if root:
            got[f"gather|{tag}"] = out.numpy()

    # point to point: the next group, a ring of send_to_worker, and worker 0 to each of the others
    buf = empty((4,), "float32")
    if me < per:
        fn["send_to_next_group"](tensor(data(me, (4,), 6)))
    else:
        fn["recv_from_prev_group"](buf)
        got["prev_group"] = buf.numpy()
    fn["send_to_worker"](tensor(data(me, (5,), 7)), (me + 1) % n)
    buf = empty((5,), "float32")
    fn["recv_from_worker"](buf, (me - 1) % n)
    got["ring"] = buf.numpy()
    if me == 0:
        for r in range(1, n):
            fn["send_to_worker"](tensor(data(r, (3,), 8)), r)
    else:
        buf = empty((3,), "float32")
        fn["recv_from_worker0"](buf)
        got["from_worker0"] = buf.numpy()

    # tensor parallel within each group, data parallel across them: group d holds batch d, and its two
    # ranks hold the halves of the contraction axis of one weight
    d, t = divmod(me, per)
    x = data(d, (4, 8), 9)
    w = data(0, (8, 6), 10)
    half = 8 // per
    bb = relax.BlockBuilder()
    xv = relax.Var("x", relax.TensorType((4, half), "float32"))
    wv = relax.Var("w", relax.TensorType((half, 6), "float32"))
    with bb.function("main", [xv, wv]):
        with bb.dataflow():
            partial = bb.emit(relax.op.matmul(xv, wv))
            y = bb.emit(relax.op.ccl.allreduce(partial, "sum", in_group=True))  # the TP pair's sum
            mean = bb.emit(relax.op.ccl.allreduce(y, "avg", in_group=False))  # averaged over every rank
            gathered = bb.emit(relax.op.ccl.allgather(y, per, in_group=True))
            result = bb.emit_output(relax.Tuple([y, mean, gathered]))
        bb.emit_func_output(result)
    vm = relax.VirtualMachine(tvm.compile(bb.get(), "llvm"), tvm.cpu())
    y, mean, gathered = vm["main"](tensor(np.ascontiguousarray(x[:, t * half:(t + 1) * half])),
                                   tensor(w[t * half:(t + 1) * half]))
    got["tp_dp|y"], got["tp_dp|mean"], got["tp_dp|gathered"] = y.numpy(), mean.numpy(), gathered.numpy()

    # errors a rank raises alone, before it sends or receives anything
    errors = {
        "to_self": _error(lambda: fn["send_to_worker"](tensor(np.zeros(1, "float32")), me)),
        "to_nobody": _error(lambda: fn["recv_from_worker"](empty((1,), "float32"), n)),
    }
    if me == 0:
        errors["worker0_receives"] = _error(lambda: fn["recv_from_worker0"](empty((1,), "float32")))
        errors["no_prev_group"] = _error(lambda: fn["recv_from_prev_group"](empty((1,), "float32")))
    if me == n - 1:
        errors["no_next_group"] = _error(lambda: fn["send_to_next_group"](tensor(np.zeros(1, "float32"))))
    # a root whose buffer does not fit fails every member of its group, none waits
    errors["scatter_root"] = _error(lambda: fn["scatter_from_worker0"](
        tensor(np.zeros(5, "float32")) if me % per == 0 else None, True, empty((2,), "float32")))
    np.savez(out_dir / f"rank{me}.npz", **got)
    (out_dir / f"rank{me}.json").write_text(json.dumps(errors))


def distributed(out_dir: Path) -> None:
    from tvm import relax
    from tvm.relax.distributed import transform as dist

    from tvm_combiners.collectives.relax.distributed import distributed_pipeline
    from tvm_combiners.collectives.runtime import rank

    me = rank()

    @I.ir_module
    class MLP:  # tensor parallel: w1 by columns, w2 by rows; TVM's propagate-sharding test, in small
        I.module_attrs({"device_num": 2})
        I.module_global_infos({"mesh": [R.device_mesh((2,), I.Range(0, 2))]})

        @R.function
        def main(x: R.Tensor((8, 16), "float32"), w1: R.Tensor((16, 32), "float32"),
                 w2: R.Tensor((32, 16), "float32")) -> R.Tensor((8, 16), "float32"):
            lv0 = R.matmul(x, w1)
            lv1 = R.nn.gelu(lv0)
            lv2 = R.dist.annotate_sharding(lv1, device_mesh="mesh[0]", placement="S[1]")
            lv3 = R.matmul(lv2, w2)
            return lv3

    @I.ir_module
    class Plain:  # the same MLP, unsharded
        @R.function
        def main(x: R.Tensor((8, 16), "float32"), w1: R.Tensor((16, 32), "float32"),
                 w2: R.Tensor((32, 16), "float32")) -> R.Tensor((8, 16), "float32"):
            lv0 = R.matmul(x, w1)
            lv1 = R.nn.gelu(lv0)
            lv3 = R.matmul(lv1, w2)
            return lv3

    @I.ir_module
    class Redistribute:  # replicated to sharded: TVM legalizes it to a slice at runtime.disco.worker_id
        I.module_attrs({"device_num": 2})
        I.module_global_infos({"mesh": [R.device_mesh((2,), I.Range(0, 2))]})

        @R.function
        def main(x: R.DTensor((8, 16), "float32", "mesh[0]", "R"),
                 w: R.DTensor((8, 16), "float32", "mesh[0]", "S[1]")) -> R.DTensor((8, 16), "float32", "mesh[0]", "S[1]"):
            lv = R.dist.redistribute(x, "mesh[0]", "S[1]")
            y = R.add(lv, w)
            return y

    def run(mod: tvm.IRModule, inputs: list[np.ndarray], pipeline: Any = None) -> np.ndarray:
        ex = tvm.compile(mod, "llvm", relax_pipeline=pipeline) if pipeline is not None else tvm.compile(mod, "llvm")
        return relax.VirtualMachine(ex, tvm.cpu())["main"](*[tvm.runtime.tensor(a) for a in inputs]).numpy()

    inputs = mlp_inputs()
    mine = inputs if me == 0 else [np.zeros_like(a) for a in inputs]  # only worker 0's are read
    got = {"unsharded": run(Plain, inputs), "pipeline": run(MLP, mine, distributed_pipeline("llvm"))}
    trap = MLP  # TVM's tests' order: PropagateSharding on high-level ops, no LegalizeOps first
    for p in (dist.PropagateSharding(), dist.LowerGlobalViewToLocalView(), dist.LegalizeRedistribute(),
              dist.LowerDistIR()):
        trap = p(trap)
    got["trap"] = run(trap, mine)
    x, w = data(0, (8, 16), 11), data(0, (8, 16), 12)
    got["redistribute"] = run(Redistribute, [x, w] if me == 0 else [np.zeros_like(x), np.zeros_like(w)],
                              distributed_pipeline("llvm"))
    np.savez(out_dir / f"rank{me}.npz", **got)


def main() -> None:
    out_dir, mode = Path(sys.argv[1]), sys.argv[2]
    {"runtime": runtime, "distributed": distributed}[mode](out_dir)


if __name__ == "__main__":
    main()
