"""Pipeline-parallel BERT: MiniLM-L3 cut into stages, one per rank, joined by send/recv.

    tvm-combiners launch -n 3 -- python -m tvm_combiners.app.examples.pipeline_bert [--json]

The imported Relax function is cut between layers (at the LayerNorm that ends a layer): each stage
becomes a function whose parameters are exactly what crosses its cut (the hidden state, the
attention mask in the forms later layers read, the inputs the outputs pass through). Every rank
runs the same program (SPMD, as StableHLO's send/recv): per micro-batch and stage, the stage's
inputs arrive by ``recv`` from the previous rank, the stage runs where ``rank == stage`` (an
``if``), its outputs leave by ``send`` with ``source_target_pairs=[[s, s + 1]]``. Sends never wait,
so stage s works on micro-batch m while stage s - 1 already computes micro-batch m + 1. Tokens chain
each hop's sends (and recvs) from one micro-batch to the next, so ``SendRecvCombiner`` merges what
travels together (the tensors of one micro-batch on one hop) and never holds a micro-batch back
for the next one.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ...compile.host import llvm_options

TAG = "pipeline-bert"
TOL = 1e-4


@dataclass(frozen=True)
class Config:
    seq: int = 16
    micro_batch: int = 1
    micro_batches: int = 4
    repeat: int = 5
    opt_level: int = 3
    atol: float = TOL  # the last stage vs onnxruntime


# --------------------------------------------------------------------------- cutting a function


@dataclass
class Stage:
    """One stage: its bindings (indices into the block), what it receives and what it hands on."""

    index: int
    bindings: list[int] = field(default_factory=list)
    inputs: list[Any] = field(default_factory=list)  # original vars (params or bindings' vars)
    outputs: list[Any] = field(default_factory=list)  # original vars, the next stage's inputs


def layer_ends(block: Any) -> list[int]:
    """Binding indices of the LayerNorms that end each encoder layer.

    A BERT layer has two LayerNorms (after attention, after the FFN) and the embeddings one:
    the (2k + 2)-th LayerNorm ends layer k.
    """
    from tvm import relax

    norms = [i for i, b in enumerate(block.bindings)
             if isinstance(b.value, relax.Call) and getattr(b.value.op, "name", "") == "relax.nn.layer_norm"]
    layer_count(len(norms))
    return norms[2::2]


def layer_count(norms: int) -> int:
    """The encoder layers of a BERT with ``norms`` LayerNorms (1 + 2 x layers)."""
    if norms < 3 or norms % 2 != 1:
        raise ValueError(f"pipeline-bert: expected 1 + 2 x layers LayerNorms (a BERT encoder), found {norms}")
    return (norms - 1) // 2


def model_limits() -> tuple[int, int | None]:
    """(encoder layers, positions) of the default model, read from its ONNX graph without importing it
    (half a second: the launching process checks the options with them before any rank starts)."""
    from ...models.loader import default_model_path, load_onnx, position_limit

    model = load_onnx(default_model_path())
    limit = position_limit(model)
    return layer_count(sum(n.op_type == "LayerNormalization" for n in model.graph.node)), limit and limit[0]


def plan_stages(func: Any, num_stages: int) -> list[Stage]:
    """Cut ``func`` (one dataflow block) into ``num_stages`` stages of whole layers.

    Layers are spread evenly, the earlier stages (which also hold the embeddings) taking fewer.
    Each layer-ending LayerNorm stays in its stage; every other binding moves as late as its users
    allow (the pooling's mask arithmetic runs in the last stage, so the small int64 mask crosses
    the cuts instead of a broadcast float copy of it). What crosses cut s is every value defined
    before it and used after it.
    """
    from tvm import relax

    blocks = func.body.blocks
    if len(blocks) != 1 or not isinstance(blocks[0], relax.DataflowBlock):
        raise ValueError("pipeline-bert: the imported function must be one dataflow block")
    block = blocks[0]
    ends = layer_ends(block)
    layers = len(ends)
    if not 1 <= num_stages <= layers:
        raise ValueError(f"pipeline-bert: {num_stages} stages for {layers} layers: need 1 <= stages <= layers")
    counts = [layers // num_stages + (1 if s >= num_stages - layers % num_stages else 0) for s in range(num_stages)]
    cuts = [ends[sum(counts[:s + 1]) - 1] for s in range(num_stages - 1)]  # last binding of stage s
    n = len(block.bindings)
    index_of = {b.var: i for i, b in enumerate(block.bindings)}
    users: list[list[int]] = [[] for _ in range(n)]
    param_users: dict[Any, list[int]] = {p: [] for p in func.params}
    for i, b in enumerate(block.bindings):
        for v in relax.analysis.free_vars(b.value):
            if v in index_of:
                users[index_of[v]].append(i)
            elif v in param_users:
                param_users[v].append(i)
    last = num_stages - 1
    output_vars = set(relax.analysis.free_vars(func.body.body))
    stage = [0] * n
    for i in reversed(range(n)):
        original = sum(c < i for c in cuts)
        if i in cuts:
            stage[i] = original
        elif block.bindings[i].var in output_vars:
            stage[i] = last
        elif users[i]:
            stage[i] = min(stage[u] for u in users[i])
        else:
            stage[i] = original
    stages = [Stage(s) for s in range(num_stages)]
    for i in range(n):
        stages[stage[i]].bindings.append(i)
    # live values: (var, defining stage, stages using it); params are defined in stage 0
    live = [(p, 0, {stage[u] for u in param_users[p]}) for p in func.params]
    live += [(b.var, stage[i], {stage[u] for u in users[i]} | ({last} if b.var in output_vars else set()))
             for i, b in enumerate(block.bindings)]
    for p in func.params:
        if p in output_vars:
            live[func.params.index(p)][2].add(last)
    stages[0].inputs = list(func.params)
    for s in range(1, num_stages):
        stages[s].inputs = [v for v, d, used in live if d < s and any(u >= s for u in used)]
        stages[s - 1].outputs = stages[s].inputs
    return stages


def build_stage_functions(mod: Any, stages: list[Stage]) -> tuple[Any, list[Any]]:
    """``mod`` with ``stage<s>`` for every stage instead of ``main`` (inputs -> outputs tuple; the
    last stage returns what ``main`` returned). ``main``'s helpers (TIR functions) stay."""
    import tvm
    from tvm import relax

    func = mod["main"]
    block = func.body.blocks[0]

    @relax.expr_functor.mutator
    class Rename(relax.PyExprMutator):  # type: ignore[misc]
        def __init__(self, mapping: dict[Any, Any]) -> None:
            super().__init__()
            self.mapping = mapping

        def visit_var_(self, op: Any) -> Any:
            return self.mapping.get(op, op)

        def visit_dataflow_var_(self, op: Any) -> Any:
            return self.mapping.get(op, op)

    bb = relax.BlockBuilder(tvm.IRModule({gv: f for gv, f in mod.functions_items() if gv.name_hint != "main"}))
    gvs = []
    for st in stages:
        params = [relax.Var(f"in{k}", v.ty) for k, v in enumerate(st.inputs)]
        mapping = dict(zip(st.inputs, params))
        rename = Rename(mapping)
        with bb.function(f"stage{st.index}", params):
            with bb.dataflow():
                for i in st.bindings:
                    b = block.bindings[i]
                    mapping[b.var] = bb.emit(rename.visit_expr(b.value))
                result = func.body.body if st.index == len(stages) - 1 else relax.Tuple(list(st.outputs))
                out = bb.emit_output(rename.visit_expr(result))
            gvs.append(bb.emit_func_output(out))
    return bb.get(), gvs


def describe_values(func: Any, vars_: list[Any]) -> list[str]:
    """What each crossing value is: an input, the hidden state after layer k, or an op of the inputs."""
    from tvm import relax

    block = func.body.blocks[0]
    ends = layer_ends(block)
    index_of = {b.var: i for i, b in enumerate(block.bindings)}
    params = set(func.params)

    def roots(v: Any, seen: set[Any]) -> set[str]:
        if v in params:
            return {v.name}
        if v in seen or v not in index_of:
            return set()
        seen.add(v)
        return set().union(*(roots(u, seen) for u in relax.analysis.free_vars(block.bindings[index_of[v]].value)))

    out = []
    for v, (shape, dtype) in zip(vars_, tensor_types(vars_)):
        kind = f"{dtype}{list(shape)}"
        if v in params:
            out.append(f"{v.name} {kind}")
        elif index_of.get(v) in ends:
            out.append(f"hidden state after layer {ends.index(index_of[v])} {kind}")
        else:
            op = block.bindings[index_of[v]].value.op.name.removeprefix("relax.")
            out.append(f"{v.name} = {op}(.. {', '.join(sorted(roots(v, set())))}) {kind}")
    return out


def tensor_types(vars_: list[Any]) -> list[tuple[tuple[int, ...], str]]:
    return [(tuple(int(d) for d in v.ty.shape.values), str(v.ty.dtype)) for v in vars_]


MAX_MICRO_BATCHES = 1024  # x (ranks - 1) hops x the tensors a cut carries stays within MPI's 32,768 channel ids


def build_pipeline(mod: Any, num_stages: int, micro_batches: int) -> tuple[Any, list[Stage]]:
    """The SPMD program ``main(rank, *inputs of every micro-batch)`` -> every micro-batch's outputs.

    On rank ``num_stages - 1`` the outputs are the model's; elsewhere zeros (nothing there computes them).
    """
    from tvm import relax

    from ...collectives import relax as C
    from ...collectives.spec import MAX_CHANNEL_ID

    func = mod["main"]
    stages = plan_stages(func, num_stages)
    needed = micro_batches * sum(len(st.outputs) for st in stages[:-1])
    if needed > MAX_CHANNEL_ID + 1:
        raise ValueError(f"{micro_batches} micro-batches need {needed} channel ids (one per tensor per hop), more than "
                         f"the {MAX_CHANNEL_ID + 1} MPI guarantees: use fewer micro-batches or ranks")
    mod, gvs = build_stage_functions(mod, stages)
    bb = relax.BlockBuilder(mod)
    rank = relax.Var("rank", relax.TensorType((), "int32"))
    inputs = [[relax.Var(f"{p.name}_{m}", p.ty) for p in func.params] for m in range(micro_batches)]
    ret_ty = mod[gvs[-1]].ret_ty
    channels: dict[tuple[int, int], int] = {}  # (micro-batch, hop) -> first channel id
    recv_token: dict[tuple[int, int], Any] = {}
    next_channel = 0
    with bb.function("main", [rank, *[v for mb in inputs for v in mb]], pure=False):
        hop_token: list[Any] = [None] * num_stages  # per hop: after the previous micro-batch's sends
        results = []
        for m in range(micro_batches):
            ins: list[Any] = inputs[m]
            for s, st in enumerate(stages):
                if s > 0:
                    start = channels[(m, s - 1)]
                    ins = [bb.emit(C.recv(shape, dtype, [[s - 1, s]], channel_id=start + k, token=recv_token[(m, s - 1)]))
                           for k, (shape, dtype) in enumerate(tensor_types(st.inputs))]
                here = bb.emit(relax.op.equal(rank, relax.const(s, "int32")))
                out_ty = ret_ty if s == num_stages - 1 else relax.TupleType([v.ty for v in st.outputs])
                zeros = relax.Tuple([relax.op.zeros(relax.ShapeExpr(list(t.shape.values)), t.dtype) for t in out_ty.fields])
                out = bb.emit(relax.If(here, relax.Call(gvs[s], ins), zeros))
                if s == num_stages - 1:
                    results.append(out)
                    continue
                start = channels[(m, s)] = next_channel
                next_channel += len(st.outputs)
                sent = [bb.emit(C.send(bb.emit(relax.TupleGetItem(out, k)), [[s, s + 1]], channel_id=start + k,
                                       token=hop_token[s]))
                        for k in range(len(st.outputs))]
                recv_token[(m, s)] = hop_token[s]
                hop_token[s] = bb.emit(C.after_all(*sent))
        bb.emit_func_output(relax.Tuple(results))
    return bb.get(), stages


# --------------------------------------------------------------------------- the run


def count_p2p(mod: Any) -> dict[str, list[int]]:
    """Payload bytes of every send and recv in ``mod``'s ``main``, by kind."""
    from tvm import relax

    from ...collectives import relax as C

    found: dict[str, list[int]] = {"send": [], "recv": []}

    def visit(e: Any) -> None:
        spec = C.info(e)
        if spec is not None and spec.kind in found:
            ty = e.args[0].ty if spec.kind == "send" else e.ty
            dims = [int(d) for d in ty.shape.values]
            found[spec.kind].append(int(np.prod(dims)) * np.dtype(str(ty.dtype)).itemsize)

    relax.analysis.post_order_visit(mod["main"], visit)
    return found


def run(cfg: Config) -> dict[str, Any]:
    """The whole job (every rank calls it); rank 0 returns the report, the others an empty dict."""
    import tvm
    from tvm import relax

    from ...collectives import relax as C
    from ...collectives.runtime import rank as get_rank
    from ...collectives.runtime import world_size
    from ...models import default_model_path, example_inputs, import_relax, prepare_onnx, run_onnxruntime
    from ..compare import largest, max_abs
    from .report import comm, compile_shared, interleaved_times, oversubscription, progress, times_in_turn

    rank, world = get_rank(), world_size()
    path = default_model_path()
    progress(TAG, f"{world} stages; importing {path.name} (micro-batch {cfg.micro_batch}, seq {cfg.seq})")
    model = prepare_onnx(path, batch=cfg.micro_batch, seq=cfg.seq)
    imported, _ = import_relax(model)
    base, stages = build_pipeline(imported, world, cfg.micro_batches)
    variants = {"uncombined": (base, [])}
    notes: list[str] = []
    variants["combined"] = (C.SendRecvCombiner(on_combine=lambda c: notes.append(c.describe()))(base), notes)
    target = tvm.target.Target({"kind": "llvm", "opt-level": cfg.opt_level, **llvm_options()})
    builders = {name: (lambda m=m: tvm.compile(m, target=target, relax_pipeline=C.pipeline(target)))
                for name, (m, _) in variants.items()}
    libs, compile_s = compile_shared(builders, TAG)

    inputs = [example_inputs(model, batch=cfg.micro_batch, seq=cfg.seq, seed=m) for m in range(cfg.micro_batches)]
    names = [p.name for p in imported["main"].params]
    args = [tvm.runtime.tensor(np.array(rank, "int32"))]
    args += [tvm.runtime.tensor(inputs[m][name]) for m in range(cfg.micro_batches) for name in names]
    mine: dict[str, Any] = {"outputs": {}, "time": {}}
    vms = {name: relax.VirtualMachine(libs[name], tvm.cpu()) for name in variants}
    for name, vm in vms.items():
        progress(TAG, f"running {name} ({cfg.micro_batches} micro-batches)")
        outs = vm["main"](*args)
        if rank == world - 1:
            mine["outputs"][name] = [[o.numpy() for o in mb] for mb in outs]
    progress(TAG, f"timing ({cfg.repeat} runs each, programs taking turns)")
    mine["time"] = interleaved_times({name: (lambda vm=vm: vm["main"](*args)) for name, vm in vms.items()}, cfg.repeat)
    # this rank's stage alone (the other ranks sleep meanwhile), on zeros of its input types: the time
    # the pipeline overlaps
    progress(TAG, f"timing each stage alone ({cfg.repeat} runs each, one rank at a time)")
    vm = relax.VirtualMachine(libs["uncombined"], tvm.cpu())
    st = stages[rank]
    stage_args = [tvm.runtime.tensor(np.zeros([int(d) for d in v.ty.shape.values], str(v.ty.dtype)))
                  for v in st.inputs]
    mine["stage_s"] = times_in_turn(lambda: vm[f"stage{rank}"](*stage_args), cfg.repeat)
    gathered = comm().gather(mine, root=0)
    if rank != 0:
        return {}
    assert gathered is not None
    reference = [run_onnxruntime(model, inputs[m]) for m in range(cfg.micro_batches)]
    output_names = [o.name for o in model.graph.output]
    last = gathered[world - 1]["outputs"]
    failures: list[str] = []
    report: dict[str, Any] = {
        "example": TAG,
        "ranks": world,
        "model": str(path.name),
        "config": asdict(cfg),
        "stages": [{"rank": s.index, "layers": _layers_of(imported["main"], s),
                    "receives": describe_values(imported["main"], s.inputs) if s.index else [f"{n} (input)" for n in names],
                    "sends": describe_values(imported["main"], s.outputs),
                    "stage_ms": 1e3 * gathered[s.index]["stage_s"]} for s in stages],
        "combiner": "SendRecvCombiner",
        "oversubscribed": oversubscription(world),
        "variants": {},
    }
    for name, (mod, notes) in variants.items():
        p2p = count_p2p(mod)
        diffs = {out: largest(max_abs(last[name][m][k], reference[m][k]) for m in range(cfg.micro_batches))
                 for k, out in enumerate(output_names)}
        furthest = largest(diffs.values())
        vs_uncombined = largest(max_abs(a, b) for mb_a, mb_b in zip(last[name], last["uncombined"])
                                for a, b in zip(mb_a, mb_b))
        report["variants"][name] = {
            "sends": len(p2p["send"]), "recvs": len(p2p["recv"]),
            "send_bytes": sorted(set(p2p["send"])),
            "compile_s": compile_s.get(name),
            "pipeline_ms": 1e3 * max(g["time"][name] for g in gathered),
            "max_abs_diff_vs_onnxruntime": diffs,
            "max_abs_diff_vs_uncombined": vs_uncombined,
            "notes": notes,
        }
        if not furthest <= cfg.atol:
            failures.append(f"{name}: last stage differs from onnxruntime by {furthest:.3g} > {cfg.atol:g}")
        if not vs_uncombined == 0.0:
            failures.append(f"{name}: differs from the uncombined program by {vs_uncombined:.3g}")
    stage_ms = [s["stage_ms"] for s in report["stages"]]
    m = cfg.micro_batches
    report["overlap"] = {"sequential_estimate_ms": m * sum(stage_ms),
                         "ideal_pipeline_ms": sum(stage_ms) + (m - 1) * max(stage_ms)}
    report["failures"] = failures
    report["ok"] = not failures
    return report


def _layers_of(func: Any, st: Stage) -> list[int]:
    ends = layer_ends(func.body.blocks[0])
    mine = set(st.bindings)
    return [k for k, e in enumerate(ends) if e in mine]


def render(report: dict[str, Any]) -> str:
    from ..compare import largest
    from ..text_table import table
    from .report import note_lines, verdict_line

    cfg = report["config"]
    lines = [f"pipeline-bert: {report['model']} on {report['ranks']} ranks, {cfg['micro_batches']} micro-batches "
             f"of {cfg['micro_batch']} x seq {cfg['seq']}"]
    for s in report["stages"]:
        what = ("embeddings + " if s["rank"] == 0 else "") + "layers " + ",".join(map(str, s["layers"]))
        lines.append(f"  rank {s['rank']}: {what}; {s['stage_ms']:.1f} ms per micro-batch; receives "
                     + ", ".join(s["receives"]) + ("; sends " + ", ".join(s["sends"]) if s["sends"] else ""))
    lines.append(f"combiner: {report['combiner']}")
    lines.append("")
    rows = []
    for name, v in report["variants"].items():
        rows.append([name, v["sends"], v["recvs"], ",".join(map(str, v["send_bytes"])),
                     f"{v['compile_s']:.1f}" if v["compile_s"] is not None else "-", f"{v['pipeline_ms']:.1f}",
                     f"{largest(v['max_abs_diff_vs_onnxruntime'].values()):.2e}", f"{v['max_abs_diff_vs_uncombined']:.1e}"])
    lines.append(table(rows, ["program", "sends", "recvs", "bytes per send", "compile s", "pipeline ms",
                              "max |diff| vs ORT", "vs uncombined"]))
    o = report["overlap"]
    lines.append(f"\nno overlap would take ~{o['sequential_estimate_ms']:.1f} ms (micro-batches x sum of stages, "
                 f"each timed alone); an ideal pipeline ~{o['ideal_pipeline_ms']:.1f} ms")
    if report["oversubscribed"]:
        lines.append(report["oversubscribed"])
    lines.extend(note_lines(report["variants"]))
    lines.append(verdict_line(report))
    return "\n".join(lines)


def parser(prog: str = "python -m tvm_combiners.app.examples.pipeline_bert") -> Any:
    """The example's options (``tvm-combiners launch --example pipeline-bert`` checks them with it too)."""
    from ..usage import Parser
    from .report import add_build_options, add_output_options

    p = Parser(prog=prog, description=__doc__.splitlines()[0])
    d = Config()
    p.add_argument("--seq", type=int, default=d.seq)
    p.add_argument("--micro-batch", type=int, default=d.micro_batch, help="rows per micro-batch")
    p.add_argument("--micro-batches", type=int, default=d.micro_batches, help="at least 2 (so stages overlap)")
    add_build_options(p, d.repeat, d.opt_level)
    p.add_argument("--atol", type=float, default=d.atol, help="allowed max |diff| vs onnxruntime")
    add_output_options(p)
    return p


def config(args: argparse.Namespace, ranks: int) -> Config:
    """The run's Config from parsed options for ``ranks`` stages, checked against the model's layers
    and positions; a bad option (or a missing model) raises UsageError."""
    from ..usage import UsageError
    from . import require_finite, require_positive

    require_positive(args, "seq", "micro_batch", "repeat")
    require_finite(args, "atol", 0.0, strict=False)
    if args.micro_batches < 2:
        raise UsageError(f"--micro-batches must be at least 2 (so stages overlap), got {args.micro_batches}")
    if args.micro_batches > MAX_MICRO_BATCHES:  # every transfer takes a channel of its own: too many
        # would run out of channel ids only after each rank had compiled for a minute
        raise UsageError(f"--micro-batches must be at most {MAX_MICRO_BATCHES}, got {args.micro_batches}")
    try:
        layers, positions = model_limits()
    except (OSError, ValueError) as err:  # FileNotFoundError: the model's package is missing
        raise UsageError(str(err)) from err
    if not 1 <= ranks <= layers:
        raise UsageError(f"-n {ranks}: one stage per rank needs 1 <= ranks <= {layers} (the model's layers)")
    if positions is not None and args.seq > positions:
        raise UsageError(f"--seq {args.seq} is beyond the model's {positions} positions")
    return Config(seq=args.seq, micro_batch=args.micro_batch, micro_batches=args.micro_batches, repeat=args.repeat,
                  opt_level=args.opt_level, atol=args.atol)


def main(argv: list[str] | None = None) -> int:
    from .report import example_main

    return example_main(parser(), config, run, render, argv)


if __name__ == "__main__":
    sys.exit(main())
