"""Run on N ranks by tests/collectives/test_disco.py: TVM's ``runtime.disco.*`` functions on this runtime.

Each rank saves what it got to ``<out>/rank<R>.npz`` and its error messages to ``<out>/rank<R>.json``;
the test recomputes every expected value with numpy from ``data()``.
Usage: ``prog.py OUT_DIR runtime`` (every function, called as TVM calls it, on 4 ranks in 2 disco groups:
a tensor-parallel pair per group, data-parallel across them), ``distributed`` (the kinds of module TVM's
relax.distributed tests use, ``modules()``, through ``distributed_pipeline`` on 2 ranks: an MLP, an MLP
with a tuple parameter, one with constants, attention, a decoder layer, a replicated-to-sharded
redistribution; and the MLP through TVM's passes in the order that drops its allreduce).
"""

from __future__ import annotations

import json
import sys
import time
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


# the attention and decoder layer: batch, sequence, hidden, heads, FFN width (TVM's tests, in small)
B, S, H, NH, FFN = 1, 8, 32, 4, 64


def case_inputs() -> dict[str, list[Any]]:
    """Per module kind of ``distributed``, its inputs (a tuple parameter as a list)."""
    rng = np.random.default_rng(42)

    def normal(*shape: int, scale: float = 1.0) -> np.ndarray:
        return (scale * rng.standard_normal(shape)).astype("float32")

    x, w1, w2 = mlp_inputs()
    attn = [normal(B, S, H), *(normal(H, H, scale=H ** -0.5) for _ in range(4))]
    decoder = [*attn, normal(H, scale=0.1) + 1, normal(H, scale=0.1), normal(H, FFN, scale=H ** -0.5), normal(FFN),
               normal(FFN, H, scale=FFN ** -0.5), normal(H), normal(H, scale=0.1) + 1, normal(H, scale=0.1)]
    return {"mlp": [x, w1, w2], "mlp_tuple": [x, [w1, w2]], "const": [x, w1, w2], "attention": attn,
            "decoder": decoder, "to_shard": [data(0, (8, 16), 11), data(0, (8, 16), 12)]}


def const_weight() -> np.ndarray:
    """The constant weight of the ``const`` MLP, annotated replicated: (16, 16)."""
    return (np.random.default_rng(43).standard_normal((16, 16)) / 4).astype("float32")


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


def _shard(expr: Any, placement: str) -> Any:
    """``R.dist.annotate_sharding`` on a mesh of 2 workers."""
    from tvm import relax
    from tvm.relax.distributed import DeviceMesh, Placement

    return relax.op.distributed.annotate_sharding(expr, DeviceMesh((2,), tvm.ir.Range(0, 2)),
                                                  Placement.from_text(placement))


def attention_block(bb: Any, x: Any, wq: Any, wk: Any, wv: Any, wo: Any) -> Any:
    """Multi-head self-attention, Megatron style: Q, K and V column-parallel (``S[1]``: each rank its heads),
    the output projection row-parallel (``S[0]``, one allreduce), as TVM's disco attention test."""
    from tvm import relax
    from tvm.relax import op

    heads = []
    for w in (wq, wk, wv):
        t = bb.emit(op.matmul(x, bb.emit(_shard(w, "S[1]"))))
        heads.append(bb.emit(op.permute_dims(op.reshape(t, (B, S, NH, H // NH)), [0, 2, 1, 3])))
    q, k, v = heads
    scores = op.multiply(op.matmul(q, op.permute_dims(k, [0, 1, 3, 2])), relax.const((H // NH) ** -0.5, "float32"))
    probs = bb.emit(op.nn.softmax(scores, axis=-1))
    context = bb.emit(op.reshape(op.permute_dims(bb.emit(op.matmul(probs, v)), [0, 2, 1, 3]), (B, S, H)))
    return bb.emit(op.matmul(context, bb.emit(_shard(wo, "S[0]"))))


def modules() -> dict[str, Any]:
    """Per kind, the module of ``distributed`` annotated for a mesh of 2 workers (``mlp``, ``mlp_tuple`` and
    ``to_shard`` in TVMScript, as TVM's tests write them; the others with the BlockBuilder)."""
    from tvm import relax
    from tvm.relax import op

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
    class MLPWithTuple:  # the weights in one tuple parameter, and the hidden rows split in two (TVM's test)
        I.module_attrs({"device_num": 2})
        I.module_global_infos({"mesh": [R.device_mesh((2,), I.Range(0, 2))]})

        @R.function
        def main(x: R.Tensor((8, 16), "float32"),
                 packed: R.Tuple(R.Tensor((16, 32), "float32"), R.Tensor((32, 16), "float32"))
                 ) -> R.Tensor((4, 16), "float32"):
            w1 = packed[0]
            lv0 = R.matmul(x, w1)
            lv1 = R.nn.gelu(lv0)
            halves = R.split(lv1, 2, axis=0)
            lv2 = halves[0]
            lv3 = R.dist.annotate_sharding(lv2, device_mesh="mesh[0]", placement="S[1]")
            w2 = packed[1]
            lv4 = R.matmul(lv3, w2)
            return lv4

    @I.ir_module
    class ToShard:  # replicated to sharded: TVM legalizes it to a slice at runtime.disco.worker_id
        I.module_attrs({"device_num": 2})
        I.module_global_infos({"mesh": [R.device_mesh((2,), I.Range(0, 2))]})

        @R.function
        def main(x: R.DTensor((8, 16), "float32", "mesh[0]", "R"),
                 w: R.DTensor((8, 16), "float32", "mesh[0]", "S[1]")) -> R.DTensor((8, 16), "float32", "mesh[0]", "S[1]"):
            lv = R.dist.redistribute(x, "mesh[0]", "S[1]")
            y = R.add(lv, w)
            return y

    def function(params: list[Any], body: Any) -> Any:
        bb = relax.BlockBuilder()
        with bb.function("main", params):
            with bb.dataflow():
                out = bb.emit_output(body(bb, *params))
            bb.emit_func_output(out)
        return bb.get()

    def tensor(name: str, *shape: int) -> Any:
        return relax.Var(name, relax.TensorType(shape, "float32"))

    c = const_weight()

    def const(bb: Any, x: Any, w1: Any, w2: Any) -> Any:  # TVM's MLP with a constant, and a constant weight
        h = bb.emit(op.matmul(bb.emit(op.matmul(x, bb.emit(_shard(relax.const(c), "R")))), w1))
        h = bb.emit(op.add(op.nn.gelu(h), relax.const(2.0, "float32")))  # TVM's test: a scalar constant
        h = bb.emit(_shard(h, "S[1]"))
        return bb.emit(op.matmul(h, w2))

    def decoder(bb: Any, x: Any, wq: Any, wk: Any, wv: Any, wo: Any, g1: Any, b1: Any, f1: Any, fb1: Any, f2: Any,
                fb2: Any, g2: Any, b2: Any) -> Any:  # post-norm: attention, LayerNorm, FFN, LayerNorm
        h = bb.emit(op.nn.layer_norm(op.add(attention_block(bb, x, wq, wk, wv, wo), x), g1, b1, axes=[-1]))
        up = bb.emit(op.nn.gelu(op.add(bb.emit(op.matmul(h, bb.emit(_shard(f1, "S[1]")))), fb1)))
        down = bb.emit(op.add(bb.emit(op.matmul(up, bb.emit(_shard(f2, "S[0]")))), fb2))
        return bb.emit(op.nn.layer_norm(op.add(down, h), g2, b2, axes=[-1]))

    weights = [tensor(n, H, H) for n in ("wq", "wk", "wv", "wo")]
    return {
        "mlp": MLP, "mlp_tuple": MLPWithTuple, "to_shard": ToShard,
        "const": function([tensor("x", 8, 16), tensor("w1", 16, 32), tensor("w2", 32, 16)], const),
        "attention": function([tensor("x", B, S, H), *weights], attention_block),
        "decoder": function([tensor("x", B, S, H), *weights, tensor("ln1_g", H), tensor("ln1_b", H),
                             tensor("ffn1", H, FFN), tensor("ffn1_b", FFN), tensor("ffn2", FFN, H),
                             tensor("ffn2_b", H), tensor("ln2_g", H), tensor("ln2_b", H)], decoder),
    }


def tensors(arrays: list[Any]) -> list[Any]:
    """numpy arrays as TVM tensors, a list (a tuple parameter) as a list."""
    return [tensors(a) if isinstance(a, list) else tvm.runtime.tensor(a) for a in arrays]


def zeros(arrays: list[Any]) -> list[Any]:
    return [zeros(a) if isinstance(a, list) else np.zeros_like(a) for a in arrays]


def run(ex: Any, inputs: list[Any]) -> np.ndarray:
    """``main`` of the compiled ``ex`` on ``inputs``, on the CPU."""
    from tvm import relax

    return relax.VirtualMachine(ex, tvm.cpu())["main"](*tensors(inputs)).numpy()


def unsharded(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with its ``R.dist.annotate_sharding`` calls removed: the module a single device runs."""
    from tvm import relax

    @relax.expr_functor.mutator
    class Strip(relax.PyExprMutator):
        def visit_call_(self, call: Any) -> Any:
            call = super().visit_call_(call)
            return call.args[0] if isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.dist.annotate_sharding" \
                else call

    return tvm.IRModule({gv: Strip().visit_expr(f) for gv, f in mod.functions_items()})


def distributed(out_dir: Path) -> None:
    """Every kind of ``modules()`` through ``distributed_pipeline``, and the MLP through TVM's passes in the
    order that drops its allreduce. Worker 0's inputs are the only ones read: the other ranks pass zeros.
    The test compiles and runs the unsharded modules itself."""
    from tvm.relax.distributed import transform as dist

    from tvm_combiners.collectives.relax.distributed import distributed_pipeline
    from tvm_combiners.collectives.runtime import rank
    from tvm_combiners.collectives.runtime.comm import mpi

    me = rank()
    mods, inputs = modules(), case_inputs()
    built = {kind: tvm.compile(mod, "llvm", relax_pipeline=distributed_pipeline("llvm")) for kind, mod in mods.items()}
    trap = mods["mlp"]  # TVM's tests' order: PropagateSharding on high-level ops, no LegalizeOps first
    for p in (dist.PropagateSharding(), dist.LowerGlobalViewToLocalView(), dist.LegalizeRedistribute(),
              dist.LowerDistIR()):
        trap = p(trap)
    built["trap"], inputs["trap"] = tvm.compile(trap, "llvm"), inputs["mlp"]
    # everything compiled first, then one barrier that sleeps: a rank waiting in a collective for a slower
    # one busy-polls a core, the core the other may need (2 cores, and the test compiles beside them)
    done = mpi().COMM_WORLD.Ibarrier()
    while not done.Test():
        time.sleep(0.005)
    got = {kind: run(ex, inputs[kind] if me == 0 else zeros(inputs[kind])) for kind, ex in built.items()}
    np.savez(out_dir / f"rank{me}.npz", **got)


def main() -> None:
    out_dir, mode = Path(sys.argv[1]), sys.argv[2]
    {"runtime": runtime, "distributed": distributed}[mode](out_dir)


if __name__ == "__main__":
    main()
