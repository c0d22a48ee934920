"""Tensor-parallel BERT: MiniLM-L3 sharded by TVM's relax.distributed annotations, each rank holding its shards.

    tvm-combiners launch -n 2 --example tp-bert [--json]
    tvm-combiners launch -n 4 --example tp-bert -- --tp 2     # tensor parallel 2 x data parallel 2

The encoder is built in Relax from the ONNX model's initializers, Megatron style: Q, K, V and the first
FFN matmul column-parallel, the attention output projection and the second FFN matmul row-parallel
(each ends in one allreduce); embeddings and LayerNorms replicated. Q, K and V weights are laid out per
head, ``(heads, hidden, head_dim)``, sharded on the heads axis: ``CombineParallelOps`` then concatenates
them along ``head_dim``, an axis no rank splits, so the merged projection shards the same way (on the
``(hidden, hidden)`` layout the concatenation would run along the sharded axis itself, and rank 0 would
get all of Q and half of K). ``distributed_pipeline(local_shards=True)`` lowers the module; every rank
passes only its shards. With ``--tp`` below the ranks, consecutive groups of ``tp`` ranks form disco groups
(data parallel), each with its own batch rows, and every collective runs within its group (``in_group``).
Every rank compares its rows with onnxruntime running the ONNX model.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ...compile.host import llvm_options

TAG = "tp-bert"
TOL = 1e-4


@dataclass(frozen=True)
class Config:
    seq: int = 16
    batch: int = 2  # rows per data-parallel group
    tp: int | None = None  # None: every rank
    repeat: int = 5
    opt_level: int = 3
    atol: float = TOL


# --------------------------------------------------------------------------- the model

#: Per layer, the ONNX node scope of each linear layer and the name it takes here.
LINEAR = {"q": "attention/self/query", "k": "attention/self/key", "v": "attention/self/value",
          "o": "attention/output/dense", "ffn1": "intermediate/dense", "ffn2": "output/dense"}
NORMS = {"ln1": "attention.output.LayerNorm", "ln2": "output.LayerNorm"}


@dataclass(frozen=True)
class Weights:
    """MiniLM's weights in ONNX layout (matmul weights ``(in, out)``), per layer by :data:`LINEAR` name."""

    embeddings: dict[str, np.ndarray]  # word, position, token_type, ln_g, ln_b
    layers: list[dict[str, np.ndarray]]  # q, q_b, ..., ffn2_b, ln1_g, ln1_b, ln2_g, ln2_b
    heads: int

    @property
    def hidden(self) -> int:
        return int(self.embeddings["word"].shape[1])


def minilm_weights(model: Any) -> Weights:
    """The weights of a BERT exported like the default model (sentence-transformers' MiniLM-L3), from
    its initializers; the head count from the attention's scale (1 / sqrt(head_dim))."""
    from onnx import numpy_helper

    graph = model.graph
    init = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    consts = {n.output[0]: numpy_helper.to_array(n.attribute[0].t) for n in graph.node if n.op_type == "Constant"}
    word = next(n for n in init if n.endswith("embeddings.word_embeddings.weight"))
    prefix = word.removesuffix("embeddings.word_embeddings.weight")
    emb = {key: init[f"{prefix}embeddings.{name}"] for key, name in (
        ("word", "word_embeddings.weight"), ("position", "position_embeddings.weight"),
        ("token_type", "token_type_embeddings.weight"), ("ln_g", "LayerNorm.weight"), ("ln_b", "LayerNorm.bias"))}
    matmuls = {n.name: n.input[1] for n in graph.node if n.op_type == "MatMul" and n.input[1] in init}
    layers = []
    while any(f"/layer.{len(layers)}/" in name for name in matmuls):
        i, layer = len(layers), {}
        for key, scope in LINEAR.items():
            (node,) = [name for name in matmuls if name.endswith(f"/layer.{i}/{scope}/MatMul")]
            layer[key] = init[matmuls[node]]
            layer[f"{key}_b"] = init[f"{prefix}encoder.layer.{i}.{scope.replace('/', '.')}.bias"]
        for key, scope in NORMS.items():
            layer[f"{key}_g"] = init[f"{prefix}encoder.layer.{i}.{scope}.weight"]
            layer[f"{key}_b"] = init[f"{prefix}encoder.layer.{i}.{scope}.bias"]
        layers.append(layer)
    (div,) = [n for n in graph.node if n.op_type == "Div" and n.name.endswith("/layer.0/attention/self/Div")]
    head_dim = round(float(consts[div.input[1]]) ** 2)
    return Weights(emb, layers, int(emb["word"].shape[1]) // head_dim)


def _per_head(w: np.ndarray, heads: int) -> np.ndarray:
    """``(hidden, heads * d)`` -> ``(heads, hidden, d)``: head h's columns as batch h."""
    return np.ascontiguousarray(w.reshape(w.shape[0], heads, -1).transpose(1, 0, 2))


def parameters(weights: Weights) -> list[tuple[str, np.ndarray, str]]:
    """(name, array, placement on the tensor-parallel mesh) of every parameter of :func:`build_encoder`."""
    e, heads = weights.embeddings, weights.heads
    out = [("word", e["word"], "R"), ("position", e["position"], "R"), ("token_type", e["token_type"][:1], "R"),
           ("emb_ln_g", e["ln_g"], "R"), ("emb_ln_b", e["ln_b"], "R")]
    for i, layer in enumerate(weights.layers):
        for key in ("q", "k", "v"):
            out += [(f"l{i}_{key}", _per_head(layer[key], heads), "S[0]"),
                    (f"l{i}_{key}_b", layer[f"{key}_b"].reshape(heads, 1, -1), "S[0]")]
        out += [(f"l{i}_o", layer["o"], "S[0]"), (f"l{i}_o_b", layer["o_b"], "R"),
                (f"l{i}_ln1_g", layer["ln1_g"], "R"), (f"l{i}_ln1_b", layer["ln1_b"], "R"),
                (f"l{i}_ffn1", layer["ffn1"], "S[1]"), (f"l{i}_ffn1_b", layer["ffn1_b"], "S[0]"),
                (f"l{i}_ffn2", layer["ffn2"], "S[0]"), (f"l{i}_ffn2_b", layer["ffn2_b"], "R"),
                (f"l{i}_ln2_g", layer["ln2_g"], "R"), (f"l{i}_ln2_b", layer["ln2_b"], "R")]
    return out


def build_encoder(weights: Weights, batch: int, seq: int, tp: int | None) -> Any:
    """``main(input_ids, attention_mask, *parameters)`` -> (hidden states, mean-pooled embedding), as the
    ONNX model computes them; with ``tp``, every parameter annotated with its placement on a mesh of
    ``tp`` workers (None: no annotation, the unsharded module)."""
    import tvm
    from tvm import relax
    from tvm.relax import op
    from tvm.relax.distributed import DeviceMesh, Placement

    hidden, heads, rows = weights.hidden, weights.heads, batch * seq
    head_dim = hidden // heads
    mesh = DeviceMesh((tp,), tvm.ir.Range(0, tp)) if tp else None
    specs = parameters(weights)
    ids = relax.Var("input_ids", relax.TensorType((batch, seq), "int64"))
    mask = relax.Var("attention_mask", relax.TensorType((batch, seq), "int64"))
    params = [relax.Var(name, relax.TensorType(a.shape, str(a.dtype))) for name, a, _ in specs]
    bb = relax.BlockBuilder()
    with bb.function("main", [ids, mask, *params]):
        with bb.dataflow():
            p = {}
            for var, (name, _, placement) in zip(params, specs):
                p[name] = bb.emit(op.distributed.annotate_sharding(var, mesh, Placement.from_text(placement))
                                  if mesh else var)

            def norm(x: Any, name: str) -> Any:
                return bb.emit(op.nn.layer_norm(x, p[f"{name}_g"], p[f"{name}_b"], axes=[-1], epsilon=1e-12))

            words = op.reshape(op.take(p["word"], op.reshape(ids, (rows,)), axis=0, mode="clip"), (batch, seq, hidden))
            positions = op.strided_slice(p["position"], axes=[0], begin=[0], end=[seq])
            x = bb.emit(op.reshape(op.add(op.add(words, positions), p["token_type"]), (rows, hidden)))
            x = norm(x, "emb_ln")
            # BERT's additive mask: 0 where attended, the most negative float where padded
            keep = op.astype(op.reshape(mask, (batch, 1, seq)), "float32")
            bias = bb.emit(op.multiply(op.subtract(relax.const(1.0, "float32"), keep),
                                       relax.const(np.finfo(np.float32).min, "float32")))
            for i in range(len(weights.layers)):
                q, k, v = (bb.emit(op.reshape(op.add(bb.emit(op.matmul(x, p[f"l{i}_{n}"])), p[f"l{i}_{n}_b"]),
                                              (heads, batch, seq, head_dim))) for n in "qkv")
                scores = op.multiply(op.matmul(q, op.permute_dims(k, [0, 1, 3, 2])),
                                     relax.const(1 / math.sqrt(head_dim), "float32"))
                probs = bb.emit(op.nn.softmax(op.add(scores, bias), axis=-1))
                context = op.reshape(op.permute_dims(op.matmul(probs, v), [1, 2, 0, 3]), (rows, hidden))
                attn = op.add(bb.emit(op.matmul(context, p[f"l{i}_o"])), p[f"l{i}_o_b"])
                x = norm(op.add(attn, x), f"l{i}_ln1")
                h = bb.emit(op.add(op.matmul(x, p[f"l{i}_ffn1"]), p[f"l{i}_ffn1_b"]))
                h = op.multiply(op.multiply(h, relax.const(0.5, "float32")),
                                op.add(op.erf(op.multiply(h, relax.const(1 / math.sqrt(2), "float32"))),
                                       relax.const(1.0, "float32")))
                ffn = op.add(bb.emit(op.matmul(h, p[f"l{i}_ffn2"])), p[f"l{i}_ffn2_b"])
                x = norm(op.add(ffn, x), f"l{i}_ln2")
            states = bb.emit(op.reshape(x, (batch, seq, hidden)))
            weight = op.astype(op.reshape(mask, (batch, seq, 1)), "float32")
            pooled = op.divide(op.sum(op.multiply(states, weight), axis=[1]),
                               op.maximum(op.sum(weight, axis=[1]), relax.const(1e-9, "float32")))
            out = bb.emit_output(relax.Tuple([states, bb.emit(pooled)]))
        bb.emit_func_output(out)
    return bb.get()


def count_ops(mod: Any, *names: str) -> dict[str, int]:
    """How many calls of each ``relax.<name>`` op ``mod``'s ``main`` makes."""
    from tvm import relax

    found = dict.fromkeys(names, 0)

    def visit(e: Any) -> None:
        name = getattr(getattr(e, "op", None), "name", "").removeprefix("relax.")
        if isinstance(e, relax.Call) and name in found:
            found[name] += 1

    relax.analysis.post_order_visit(mod["main"], visit)
    return found


# --------------------------------------------------------------------------- the run


def run(cfg: Config) -> dict[str, Any]:
    """The whole job (every rank calls it); rank 0 returns the report, the others an empty dict."""
    import time

    import tvm
    from tvm import relax

    from ...collectives.relax.distributed import distributed_passes, distributed_pipeline, shard_inputs
    from ...collectives.runtime import rank as get_rank
    from ...collectives.runtime import world_size
    from ...collectives.runtime.comm import DISCO_GROUPS_ENV
    from ...compile.pipelines import default_pipeline
    from ...models import default_model_path, example_inputs, load_onnx, prepare_onnx, run_onnxruntime
    from ...relax import CombineParallelOps
    from ..compare import largest, max_abs
    from .report import comm, compile_shared, interleaved_times, oversubscription, progress, quiet_barrier

    rank, world = get_rank(), world_size()
    tp = cfg.tp or world
    dp, group = world // tp, rank // tp
    os.environ[DISCO_GROUPS_ENV] = str(dp)  # read at each disco call: the ranks' groups are the DP groups
    path = default_model_path()
    progress(TAG, f"{world} ranks: tensor parallel {tp} x data parallel {dp}; building {path.name} "
                  f"(batch {cfg.batch} per group, seq {cfg.seq})")
    weights = minilm_weights(load_onnx(path))
    target = tvm.target.Target({"kind": "llvm", "opt-level": cfg.opt_level, **llvm_options()})
    notes: list[str] = []
    combine = CombineParallelOps(on_combine=lambda c: notes.append(c.describe()))
    sharded = combine(build_encoder(weights, cfg.batch, cfg.seq, tp))
    lowered = tvm.transform.Sequential(distributed_passes(target))(sharded)
    plan = shard_inputs(lowered)
    pipeline = distributed_pipeline(target, local_shards=True, in_group=dp > 1)
    builders = {"sharded": lambda: tvm.compile(sharded, target=target, relax_pipeline=pipeline),
                # Q/K/V merged too: the two differ by the sharding alone
                "unsharded": lambda: tvm.compile(CombineParallelOps()(build_encoder(weights, cfg.batch, cfg.seq, None)),
                                                 target=target, relax_pipeline=default_pipeline(target))}
    libs, compile_s = compile_shared(builders, TAG)

    model = prepare_onnx(path, batch=cfg.batch * dp, seq=cfg.seq)
    full = example_inputs(model, batch=cfg.batch * dp, seq=cfg.seq, seed=1)
    rows = slice(group * cfg.batch, (group + 1) * cfg.batch)
    mine = [full["input_ids"][rows], full["attention_mask"][rows]]
    specs = parameters(weights)
    arrays = [a for _, a, _ in specs]
    local = plan.local_inputs("main", [*mine, *arrays], rank % tp)
    held = {"sharded": 0, "replicated": 0, "sharded_full": 0}
    for (_, a, placement), shard in zip(specs, local[2:]):
        kind = "replicated" if placement == "R" else "sharded"
        held[kind] += shard.nbytes
        held["sharded_full"] += a.nbytes if kind == "sharded" else 0
    placements = {s.name: s.placement for s in plan.inputs["main"]}
    wrong = [name for name, _, placement in specs if placements.get(name) != placement]

    vms = {name: relax.VirtualMachine(lib, tvm.cpu()) for name, lib in libs.items()}
    args = {"sharded": [tvm.runtime.tensor(a) for a in local],
            "unsharded": [tvm.runtime.tensor(a) for a in [*mine, *arrays]]}
    progress(TAG, "running")
    got = {name: [o.numpy() for o in vms[name]["main"](*args[name])] for name in vms}
    reference = [o[rows] for o in run_onnxruntime(model, full)[2:]]  # hidden states, pooled embedding
    times = interleaved_times({"sharded": lambda: vms["sharded"]["main"](*args["sharded"])}, cfg.repeat)
    unsharded_s = None
    if rank == 0:  # the whole model on one rank, the others asleep (they would share its cores)
        vms["unsharded"]["main"](*args["unsharded"])
        samples = []
        for _ in range(cfg.repeat):
            start = time.perf_counter()
            vms["unsharded"]["main"](*args["unsharded"])
            samples.append(time.perf_counter() - start)
        unsharded_s = float(np.median(samples))
    quiet_barrier()
    mine_report = {"rank": rank, "group": group, "held": held, "wrong_placements": wrong,
                   "vs_onnxruntime": {n: largest(max_abs(a, b) for a, b in zip(got[n], reference)) for n in got},
                   "sharded_ms": 1e3 * times["sharded"]}
    gathered = comm().gather(mine_report, root=0)
    if rank != 0:
        return {}

    failures = []
    for r in gathered:
        for name, diff in r["vs_onnxruntime"].items():
            if not diff <= cfg.atol:
                failures.append(f"rank {r['rank']}: {name} differs from onnxruntime by {diff:.3g} > {cfg.atol:g}")
        if r["wrong_placements"]:
            failures.append(f"rank {r['rank']}: TVM placed {', '.join(r['wrong_placements'])} otherwise than annotated")
        if r["held"]["sharded"] * tp != r["held"]["sharded_full"]:
            failures.append(f"rank {r['rank']}: holds {r['held']['sharded']} bytes of the sharded weights, "
                            f"not 1/{tp} of {r['held']['sharded_full']}")
    counts = count_ops(lowered, "ccl.allreduce", "ccl.broadcast_from_worker0", "ccl.scatter_from_worker0")
    report: dict[str, Any] = {
        "example": TAG, "model": path.name, "ranks": world, "tp": tp, "dp": dp, "config": asdict(cfg),
        "layers": len(weights.layers), "heads": weights.heads, "heads_per_rank": weights.heads // tp,
        "compile_s": compile_s,
        "allreduces": counts["ccl.allreduce"],
        "transfers_before_local_shards": counts["ccl.broadcast_from_worker0"] + counts["ccl.scatter_from_worker0"],
        "combined": notes,
        "unsharded_ms": 1e3 * unsharded_s,
        "sharded_ms": max(r["sharded_ms"] for r in gathered),
        "per_rank": gathered,
        "oversubscribed": oversubscription(world),
        "failures": failures,
        "ok": not failures,
    }
    return report


def render(report: dict[str, Any]) -> str:
    from ..text_table import table
    from .report import verdict_line

    cfg = report["config"]
    mib = 1 / 2**20
    lines = [f"tp-bert: {report['model']} on {report['ranks']} ranks, tensor parallel {report['tp']} x data parallel "
             f"{report['dp']} ({cfg['batch']} x seq {cfg['seq']} per group); {report['heads_per_rank']} of "
             f"{report['heads']} heads per rank, {report['allreduces']} allreduces ({report['layers']} layers x 2)"]
    lines += [f"CombineParallelOps: {note}" for note in report["combined"]]
    rows = [[r["rank"], r["group"], f"{r['held']['sharded'] * mib:.2f}", f"{r['held']['sharded_full'] * mib:.2f}",
             f"{r['held']['replicated'] * mib:.2f}", f"{r['sharded_ms']:.1f}",
             f"{r['vs_onnxruntime']['sharded']:.1e}"] for r in report["per_rank"]]
    lines.append(table(rows, ["rank", "dp group", "sharded MiB held", "of MiB", "replicated MiB", "ms",
                              "max |diff| vs ORT"]))
    ranks = f"{report['ranks']} rank{'s' if report['ranks'] > 1 else ''}"
    lines.append(f"unsharded, one rank alone: {report['unsharded_ms']:.1f} ms; sharded on {ranks}: "
                 f"{report['sharded_ms']:.1f} ms")
    if report["oversubscribed"]:
        lines.append(report["oversubscribed"])
    lines.append(verdict_line(report))
    return "\n".join(lines)


def parser(prog: str = "python -m tvm_combiners.app.examples.tp_bert") -> Any:
    """The example's options (``tvm-combiners launch --example tp-bert`` checks them with it too)."""
    from ..usage import Parser
    from .report import add_build_options, add_output_options

    p = Parser(prog=prog, description=__doc__.splitlines()[0])
    d = Config()
    p.add_argument("--seq", type=int, default=d.seq)
    p.add_argument("--batch", type=int, default=d.batch, help="rows per data-parallel group")
    p.add_argument("--tp", type=int, default=d.tp,
                   help="ranks per tensor-parallel group (default: all; it must divide the ranks and the heads)")
    add_build_options(p, d.repeat, d.opt_level)
    p.add_argument("--atol", type=float, default=d.atol, help="allowed max |diff| vs onnxruntime")
    add_output_options(p)
    return p


def config(args: argparse.Namespace, ranks: int) -> Config:
    """The run's Config from parsed options for ``ranks`` ranks; a bad option raises UsageError."""
    from ...collectives.runtime.comm import DISCO_GROUPS_ENV
    from ...models.loader import default_model_path, load_onnx, position_limit
    from ..usage import UsageError
    from . import require_finite, require_positive

    require_positive(args, "seq", "batch", "tp", "repeat")
    require_finite(args, "atol", 0.0, strict=False)
    tp = args.tp or ranks
    if ranks % tp:
        raise UsageError(f"--tp {tp} does not divide the {ranks} ranks")
    try:
        model = load_onnx(default_model_path())
        weights = minilm_weights(model)
    except (OSError, ValueError) as err:  # FileNotFoundError: the model's package is missing
        raise UsageError(str(err)) from err
    ffn = weights.layers[0]["ffn1"].shape[1]
    if weights.heads % tp or ffn % tp:
        raise UsageError(f"--tp {tp} must divide the model's {weights.heads} heads and {ffn} FFN columns")
    limit = position_limit(model)
    if limit is not None and args.seq > limit[0]:
        raise UsageError(f"--seq {args.seq} is beyond the model's {limit[0]} positions")
    groups = os.environ.get(DISCO_GROUPS_ENV)
    if groups not in (None, "", str(ranks // tp)):  # set by launch --disco-groups
        raise UsageError(f"--tp {tp} makes {ranks // tp} data-parallel groups, but launch --disco-groups gave {groups}")
    return Config(seq=args.seq, batch=args.batch, tp=args.tp, repeat=args.repeat, opt_level=args.opt_level,
                  atol=args.atol)


def main(argv: list[str] | None = None) -> int:
    from .report import example_main

    return example_main(parser(), config, run, render, argv)


if __name__ == "__main__":
    sys.exit(main())
