"""Data-parallel training step: a BERT-like encoder, TVM's own backward, one allreduce per gradient.

    tvm-combiners launch -n 4 -- python -m tvm_combiners.app.examples.dp_train [--json]

Every rank builds the same Relax module: ``main`` (forward and loss of a small encoder),
``main_adjoint`` (added by ``relax.transform.Gradient``), ``optimizer`` (from
``tvm.relax.training.optimizer``) and ``step``, an impure function that calls the adjoint,
averages every gradient with its own ``allreduce(avg)`` (what naive data parallelism emits) and
applies the optimizer. Each rank trains on its own shard of the batch. ``AllReduceCombiner`` then
buckets the allreduces; ``CombineParallelOps`` merges the Q/K/V projections. Rank 0 gathers every
rank's gradients and parameters and checks them against one process stepping on the full batch.
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ...compile.host import llvm_options
from ..compare import largest, max_abs, rel_diff

EPS = 1e-5


@dataclass(frozen=True)
class Config:
    """Model and run sizes (the test uses the defaults; hidden 128 is the smallest the example is meant for)."""

    layers: int = 2
    hidden: int = 128
    heads: int = 4
    ffn: int = 256
    seq: int = 16
    classes: int = 4
    batch_per_rank: int = 2
    steps: int = 4
    lr: float = 0.02
    optimizer: str = "sgd"
    seed: int = 0
    repeat: int = 5  # timed steps per program (median reported)
    fresh_data: bool = False
    opt_level: int = 3  # LLVM's: 0 compiles ~8x faster (tests), 3 runs faster
    threshold_bytes: int | None = None  # AllReduceCombiner's bucket size (None: the pass's default)


def param_shapes(cfg: Config) -> dict[str, tuple[int, ...]]:
    """Parameter names and shapes, in the order ``main`` takes them."""
    h, f = cfg.hidden, cfg.ffn
    shapes: dict[str, tuple[int, ...]] = {}
    for i in range(cfg.layers):
        p = f"l{i}_"
        for name in ("q", "k", "v", "o"):
            shapes[p + "w" + name] = (h, h)
            if name != "k":  # no key bias: softmax ignores it, its gradient is 0 (rounding noise that Adam amplifies)
                shapes[p + "b" + name] = (h,)
        shapes[p + "ln1_g"], shapes[p + "ln1_b"] = (h,), (h,)
        shapes[p + "w1"], shapes[p + "b1"] = (h, f), (f,)
        shapes[p + "w2"], shapes[p + "b2"] = (f, h), (h,)
        shapes[p + "ln2_g"], shapes[p + "ln2_b"] = (h,), (h,)
    shapes["cls_w"], shapes["cls_b"] = (h, cfg.classes), (cfg.classes,)
    return shapes


def init_params(cfg: Config) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(cfg.seed)
    out = {}
    for name, shape in param_shapes(cfg).items():
        if name.endswith("_g"):
            out[name] = np.ones(shape, "float32")
        elif len(shape) == 1:
            out[name] = (0.02 * rng.standard_normal(shape)).astype("float32")
        else:
            out[name] = (rng.standard_normal(shape) / np.sqrt(shape[0])).astype("float32")
    return out


def full_batch(cfg: Config, world: int, step: int) -> tuple[np.ndarray, np.ndarray]:
    """The whole batch of one step (features, one-hot labels); rank r trains on rows r*b:(r+1)*b.

    The same batch every step (the loss then falls step by step: the optimizer visibly works),
    fresh features every step with ``fresh_data``; labels come from a fixed random linear teacher
    on the mean feature.
    """
    rng = np.random.default_rng(1000 + 7 * (step if cfg.fresh_data else 0) + cfg.seed)
    n = cfg.batch_per_rank * world
    x = rng.standard_normal((n, cfg.seq, cfg.hidden)).astype("float32")
    teacher = np.random.default_rng(cfg.seed + 1).standard_normal((cfg.hidden, cfg.classes))
    labels = np.eye(cfg.classes, dtype="float32")[np.argmax(x.mean(axis=1) @ teacher, axis=1)]
    return x, labels


def shard(arr: np.ndarray, cfg: Config, rank: int) -> np.ndarray:
    b = cfg.batch_per_rank
    return np.ascontiguousarray(arr[rank * b:(rank + 1) * b])


# --------------------------------------------------------------------------- the module


def _forward(bb: Any, cfg: Config, x: Any, labels: Any, p: dict[str, Any]) -> Any:
    """Emit the encoder and its loss into ``bb``'s current dataflow block; returns the loss."""
    from tvm import relax
    from tvm.relax import op as R

    batch = x.ty.shape.values[0]
    h, nh = cfg.hidden, cfg.heads
    dh = h // nh
    e = bb.emit

    def linear(v: Any, w: str, b: str | None) -> Any:
        y = e(R.matmul(v, p[w]))
        return e(R.add(y, p[b])) if b else y

    def layer_norm(v: Any, g: str, b: str) -> Any:  # written out: nn.layer_norm has no gradient in TVM
        mu = e(R.mean(v, axis=[-1], keepdims=True))
        c = e(R.subtract(v, mu))
        var = e(R.mean(e(R.multiply(c, c)), axis=[-1], keepdims=True))
        norm = e(R.divide(c, e(R.sqrt(e(R.add(var, relax.const(EPS, "float32")))))))
        return e(R.add(e(R.multiply(norm, p[g])), p[b]))

    def heads(v: Any, axes: list[int]) -> Any:
        return e(R.permute_dims(e(R.reshape(v, (batch, cfg.seq, nh, dh))), axes))

    for i in range(cfg.layers):
        pre = f"l{i}_"
        q = heads(linear(x, pre + "wq", pre + "bq"), [0, 2, 1, 3])
        k = heads(linear(x, pre + "wk", None), [0, 2, 3, 1])
        v = heads(linear(x, pre + "wv", pre + "bv"), [0, 2, 1, 3])
        scores = e(R.multiply(e(R.matmul(q, k)), relax.const(1.0 / np.sqrt(dh), "float32")))
        ctx = e(R.matmul(e(R.nn.softmax(scores, axis=-1)), v))
        ctx = e(R.reshape(e(R.permute_dims(ctx, [0, 2, 1, 3])), (batch, cfg.seq, h)))
        x = layer_norm(e(R.add(x, linear(ctx, pre + "wo", pre + "bo"))), pre + "ln1_g", pre + "ln1_b")
        ffn = linear(e(R.nn.relu(linear(x, pre + "w1", pre + "b1"))), pre + "w2", pre + "b2")
        x = layer_norm(e(R.add(x, ffn)), pre + "ln2_g", pre + "ln2_b")
    pooled = e(R.mean(x, axis=[1]))
    logits = linear(pooled, "cls_w", "cls_b")
    return e(R.nn.cross_entropy_with_logits(e(R.nn.log_softmax(logits)), labels))


def _step(bb: Any, name: str, adjoint: Any, optimizer: Any, x_ty: Any, y_ty: Any, params: list[tuple[str, Any]],
          state_ty: Any, allreduce: bool) -> None:
    """``name(x, labels, *params, state) -> (loss, grads, new_params, new_state)``.

    With ``allreduce`` every gradient is averaged over all ranks by its own collective (outside any
    dataflow block, in an impure function) before the optimizer sees it.
    """
    from tvm import relax

    from ...collectives import relax as C

    x, y = relax.Var("x", x_ty), relax.Var("labels", y_ty)
    ps = [relax.Var(name, ty) for name, ty in params]
    state = relax.Var("optim_states", state_ty)
    with bb.function(name, [x, y, *ps, state], pure=not allreduce):
        out = bb.emit(relax.Call(adjoint, [x, y, *ps]))
        loss = bb.emit(relax.TupleGetItem(out, 0))
        grads_in = bb.emit(relax.TupleGetItem(out, 1))
        grads = []
        for i in range(len(ps)):
            g = bb.emit(relax.TupleGetItem(grads_in, i))
            grads.append(bb.emit(C.allreduce(g, "avg")) if allreduce else g)
        grads_t = bb.emit(relax.Tuple(grads))
        updated = bb.emit(relax.Call(optimizer, [bb.emit(relax.Tuple(ps)), grads_t, state]))
        bb.emit_func_output(relax.Tuple([loss, grads_t, bb.emit(relax.TupleGetItem(updated, 0)),
                                         bb.emit(relax.TupleGetItem(updated, 1))]))


def _sync(bb: Any, params: list[tuple[str, Any]]) -> None:
    """``sync(*grads)``: only the step's allreduces (the communication, timed on its own)."""
    from tvm import relax

    from ...collectives import relax as C

    grads = [relax.Var(name + "_grad", ty) for name, ty in params]
    with bb.function("sync", grads, pure=False):
        bb.emit_func_output(relax.Tuple([bb.emit(C.allreduce(g, "avg")) for g in grads]))


def build_module(cfg: Config, batch: int, reference_batch: int | None = None) -> tuple[Any, Any]:
    """``main_adjoint``, ``optimizer``, ``step`` (one allreduce(avg) per gradient) for ``batch`` rows and ``sync``.

    With ``reference_batch`` the module also has ``step_local``: the same step on one process over
    that many rows, without collectives (the full-batch reference). Backward is TVM's
    ``relax.transform.Gradient``; the optimizer is ``tvm.relax.training.optimizer``'s. Returns the
    module and the initialized optimizer (its ``state`` is the first step's state).
    """
    import tvm
    from tvm import relax

    f32 = "float32"
    ptypes = [(name, relax.TensorType(s, f32)) for name, s in param_shapes(cfg).items()]
    sizes = {"main": batch} if reference_batch is None else {"main": batch, "main_full": reference_batch}
    bb = relax.BlockBuilder()
    types = {}
    for name, rows in sizes.items():
        types[name] = (relax.TensorType((rows, cfg.seq, cfg.hidden), f32), relax.TensorType((rows, cfg.classes), f32))
        x, y = relax.Var("x", types[name][0]), relax.Var("labels", types[name][1])
        params = {k: relax.Var(k, ty) for k, ty in ptypes}
        with bb.function(name, [x, y, *params.values()]):
            with bb.dataflow():
                loss = bb.emit_output(_forward(bb, cfg, x, y, params))
            bb.emit_func_output(loss)
    mod = bb.get()
    for name in sizes:
        mod = relax.transform.Gradient(name, require_grads=list(mod[name].params[2:]))(mod)

    optimizer = new_optimizer(cfg).init(list(mod["main"].params[2:]))
    opt_func = optimizer.get_function()
    bb = relax.BlockBuilder(mod)
    opt_gv = bb.add_func(opt_func, "optimizer")
    state_ty = opt_func.params[2].ty
    _step(bb, "step", mod.get_global_var("main_adjoint"), opt_gv, *types["main"], ptypes, state_ty, True)
    if reference_batch is not None:
        _step(bb, "step_local", mod.get_global_var("main_full_adjoint"), opt_gv, *types["main_full"], ptypes,
              state_ty, False)
    _sync(bb, ptypes)
    mod = bb.get()
    return tvm.IRModule({gv: f for gv, f in mod.functions_items() if gv.name_hint not in sizes}), optimizer


def count_allreduces(mod: Any, func: str = "step") -> list[int]:
    """Payload bytes of every allreduce in ``mod[func]``, in program order."""
    from tvm import relax

    from ...collectives import relax as C

    sizes: list[int] = []

    def visit(e: Any) -> None:
        if C.is_collective(e, ("allreduce",)):
            ty = e.args[0].ty
            sizes.append(int(np.prod([int(d) for d in ty.shape.values])) * np.dtype(str(ty.dtype)).itemsize)

    relax.analysis.post_order_visit(mod[func], visit)
    return sizes


# --------------------------------------------------------------------------- variants and the run

TAG = "dp-train"
TOL = 1e-5


def allreduce_combiner() -> Callable[..., Any]:
    """``AllReduceCombiner`` bucketing as DDP does: every gradient joins a bucket, whatever its size.

    The pass's default ``max_op_bytes`` leaves ops over 64 KiB alone on a CPU (packing copies them
    twice); one gradient step gains from a single bucket all the same (on 2 ranks one allreduce takes
    0.72 ms where 32 take 1.21 ms), so the example lifts the cap.
    """
    from ...collectives.relax import AllReduceCombiner

    return functools.partial(AllReduceCombiner, max_op_bytes=None)


@dataclass
class Variant:
    """One way of compiling the step: its module after our passes, and what the passes did."""

    name: str
    mod: Any
    allreduce_bytes: list[int]
    notes: list[str]


VARIANTS = ("naive", "bucketed", "bucketed+parallel-ops")


def variant_names() -> tuple[str, ...]:
    """The programs this job compares."""
    return VARIANTS


def make_variant(cfg: Config, world: int, name: str, threshold_bytes: int | None = None) -> Variant:
    """``naive``: one allreduce per gradient, plus the full-batch reference ``step_local``;
    ``bucketed``: then ``AllReduceCombiner``; ``bucketed+parallel-ops``: ``CombineParallelOps`` first."""
    from ...relax import CombineParallelOps

    b = cfg.batch_per_rank
    if name == "naive":
        mod, _ = build_module(cfg, b, reference_batch=b * world)
        return Variant(name, mod, count_allreduces(mod), [])
    combiner = allreduce_combiner()
    if name not in VARIANTS:
        raise ValueError(f"dp-train: no program {name!r} here (have {', '.join(variant_names())})")
    mod, _ = build_module(cfg, b)
    notes: list[str] = []
    if name == "bucketed+parallel-ops":
        mod = CombineParallelOps(on_combine=lambda c: notes.append("parallel ops: " + c.describe()))(mod)
    kwargs: dict[str, Any] = {}  # the buckets are read back from the module (on_combine also sees sync's)
    if threshold_bytes is not None:
        kwargs["threshold_bytes"] = threshold_bytes
    mod = combiner(**kwargs)(mod)
    return Variant(name, mod, count_allreduces(mod), notes)


def make_optimizer(cfg: Config) -> Any:
    """The optimizer over the parameters (its ``state`` is the first step's state), as build_module's."""
    from tvm import relax

    params = [relax.Var(n, relax.TensorType(s, "float32")) for n, s in param_shapes(cfg).items()]
    return new_optimizer(cfg).init(params)


def new_optimizer(cfg: Config) -> Any:
    """``tvm.relax.training.optimizer``'s SGD or Adam, not yet initialized.

    TVM 0.27's Adam (and MomentumSGD) keep the parameters' dtype as a ``DataType`` that numpy
    cannot read when they build their state (``np.ones((), dtype)`` raises): the subclass keeps it
    as a string, which every use of it accepts.
    """
    from tvm.relax.training import optimizer as opt

    base = opt.Adam if cfg.optimizer == "adam" else opt.SGD

    class Optimizer(base):  # type: ignore[misc, valid-type]
        def _set_params_and_dtype(self, params: list[Any]) -> None:
            super()._set_params_and_dtype(params)
            self.dtype = str(self.dtype)

    return Optimizer(cfg.lr)


def _flat(arrays: Any) -> np.ndarray:
    return np.concatenate([np.asarray(a.numpy()).ravel() for a in arrays])


def run_steps(vm: Any, func: str, cfg: Config, world: int, rank: int | None, params: dict[str, np.ndarray],
              state: Any, at: list[np.ndarray] | None = None) -> dict[str, Any]:
    """``cfg.steps`` steps of ``func``; rank None = the full batch. Flat grads/params after every step,
    and the first step's arguments (``first``) for timing.

    ``at`` (another run's flat parameters after each of its steps) makes every step start from that
    run's parameters instead of this one's: a program's gradients are checked against the full batch
    at the program's own parameters, since Adam soon moves two runs' parameters apart by more than
    TOL even where both are right."""
    import tvm

    shapes = [v.shape for v in params.values()]
    splits = np.cumsum([v.size for v in params.values()])[:-1]
    cur = [tvm.runtime.tensor(v) for v in params.values()]
    out: dict[str, Any] = {"loss": [], "grads": [], "params": []}
    for step in range(cfg.steps):
        if at is not None and step > 0:
            cur = [tvm.runtime.tensor(np.ascontiguousarray(part.reshape(shape)))
                   for part, shape in zip(np.split(at[step - 1], splits), shapes)]
        x, y = full_batch(cfg, world, step)
        if rank is not None:
            x, y = shard(x, cfg, rank), shard(y, cfg, rank)
        args = [tvm.runtime.tensor(x), tvm.runtime.tensor(y)]
        if step == 0:
            first = (args, cur, state)
        loss, grads, new_params, state = vm[func](*args, *cur, state)
        cur = list(new_params)
        out["loss"].append(float(loss.numpy()))
        out["grads"].append(_flat(grads))
        out["params"].append(_flat(cur))
    out["first"] = first
    return out


def run(cfg: Config) -> dict[str, Any]:
    """The whole job (every rank calls it); rank 0 returns the report, the others an empty dict."""
    import tvm
    from tvm import relax

    from ...collectives import relax as C
    from ...collectives.runtime import rank as get_rank
    from ...collectives.runtime import world_size
    from .report import comm, compile_shared, interleaved_times, oversubscription, progress

    rank, world = get_rank(), world_size()
    progress(TAG, f"{world} ranks; building the step ({cfg.layers} layers, hidden {cfg.hidden}, "
                  f"{cfg.batch_per_rank} rows per rank)")
    names = variant_names()
    target = tvm.target.Target({"kind": "llvm", "opt-level": cfg.opt_level, **llvm_options()})
    built: dict[str, tuple[list[int], list[str]]] = {}

    def compile_variant(name: str) -> Any:  # only on the rank that compiles it
        v = make_variant(cfg, world, name, cfg.threshold_bytes)
        built[name] = (v.allreduce_bytes, v.notes)
        return tvm.compile(v.mod, target=target, relax_pipeline=C.pipeline(target))

    builders = {name: (lambda name=name: compile_variant(name)) for name in names}
    libs, compile_s = compile_shared(builders, TAG)
    for part in comm().allgather(built):
        built.update(part)
    variants = [Variant(name, None, *built[name]) for name in names]
    optimizer = make_optimizer(cfg)
    params = init_params(cfg)
    sizes = [int(np.prod(s)) for s in param_shapes(cfg).values()]
    results = {}
    vms = {v.name: relax.VirtualMachine(libs[v.name], tvm.cpu()) for v in variants}
    for v in variants:
        progress(TAG, f"running {cfg.steps} steps of {v.name}")
        results[v.name] = run_steps(vms[v.name], "step", cfg, world, rank, params, optimizer.state)
    progress(TAG, f"timing the step and its allreduces ({cfg.repeat} runs each, programs taking turns)")
    zero_grads = [tvm.runtime.tensor(np.zeros(s, "float32")) for s in param_shapes(cfg).values()]
    step_s = interleaved_times({name: (lambda vm=vm, a=results[name].pop("first"): vm["step"](*a[0], *a[1], a[2]))
                                for name, vm in vms.items()}, cfg.repeat)
    sync_s = interleaved_times({name: (lambda vm=vm: vm["sync"](*zero_grads)) for name, vm in vms.items()}, 4 * cfg.repeat)
    for name in vms:
        results[name]["time"], results[name]["sync_time"] = step_s[name], sync_s[name]
    reference = None
    if rank == 0:
        progress(TAG, "rank 0: the single-process step on the full batch (reference)")
        vm = relax.VirtualMachine(libs["naive"], tvm.cpu())
        reference = run_steps(vm, "step_local", cfg, world, None, params, optimizer.state)
        reference.pop("first")
        at_run = run_steps(vm, "step_local", cfg, world, None, params, optimizer.state, at=results["naive"]["params"])
        reference["grads_at_run"], reference["loss_at_run"] = at_run["grads"], at_run["loss"]
    gathered = comm().gather(results, root=0)
    if rank != 0:
        return {}
    assert reference is not None and gathered is not None

    failures: list[str] = []
    report: dict[str, Any] = {
        "example": TAG,
        "ranks": world,
        "config": asdict(cfg),
        "parameters": {"count": len(sizes), "elements": sum(sizes), "bytes": 4 * sum(sizes)},
        "placement": [{"rank": r, "rows": [r * cfg.batch_per_rank, (r + 1) * cfg.batch_per_rank],
                       "compiled": [v.name for i, v in enumerate(variants) if i % world == r]} for r in range(world)],
        "combiner": "AllReduceCombiner (max_op_bytes=None: every gradient bucketed, "
                    + (f"buckets up to {cfg.threshold_bytes} bytes)" if cfg.threshold_bytes else "default bucket size)"),
        "oversubscribed": oversubscription(world),
        "variants": {},
        "reference_loss": reference["loss"],
    }
    naive = gathered[0]["naive"]
    p0 = np.concatenate([a.ravel() for a in params.values()])
    for v in variants:
        per_rank = [g[v.name] for g in gathered]
        checked, found = check_variant(v.name, per_rank, reference, naive, optimizer, p0)
        failures += found
        report["variants"][v.name] = {
            "allreduces": len(v.allreduce_bytes),
            "bucket_bytes": v.allreduce_bytes if len(v.allreduce_bytes) <= 8 else [min(v.allreduce_bytes), max(v.allreduce_bytes)],
            "allreduce_bytes_total": sum(v.allreduce_bytes),
            "compile_s": compile_s.get(v.name),
            "step_s": max(res["time"] for res in per_rank),
            "allreduces_s": max(res["sync_time"] for res in per_rank),
            **checked,
            "notes": v.notes,
        }
    report["failures"] = failures
    report["ok"] = not failures
    return report


def replay_optimizer(optimizer: Any, p0: np.ndarray, grads: list[np.ndarray]) -> list[np.ndarray]:
    """The flat parameters after each step of TVM's SGD or Adam fed ``grads``, in float64.

    The formulas of ``tvm.relax.training.optimizer`` (Adam: bias-corrected moments,
    ``lr * m_hat / (sqrt(v_hat) + eps)``), with ``optimizer``'s hyperparameters.
    """
    p = p0.astype("float64")
    m, v = np.zeros_like(p), np.zeros_like(p)
    out = []
    for t, g in enumerate(grads, 1):
        g = g.astype("float64") + optimizer.weight_decay * p
        if hasattr(optimizer, "eps"):  # Adam
            b1, b2 = optimizer.beta1, optimizer.beta2
            m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
            p = p - optimizer.lr * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + optimizer.eps)
        else:
            p = p - optimizer.lr * g
        out.append(p)
    return out


def check_variant(name: str, per_rank: list[dict[str, Any]], reference: dict[str, Any], naive: dict[str, Any],
                  optimizer: Any, p0: np.ndarray) -> tuple[dict[str, Any], list[str]]:
    """The differences of one program's run (every rank's flat grads, params and losses per step) and
    the failed equalities among them.

    Gradients and the loss must equal the full-batch step's at the program's own parameters
    (``reference["grads_at_run"]``, ``["loss_at_run"]``) within TOL. Parameters must equal the optimizer
    replayed (float64) on the rank's averaged gradients within TOL, and the full-batch step's within
    TOL plus what the optimizer makes of the gradients' own difference: Adam's ``g / (|g| + eps)``
    turns float32 rounding of a near-zero gradient (~1e-9) into up to ``lr`` of its parameter,
    SGD passes it on unchanged.
    """
    steps = range(len(reference["grads"]))
    ref_replay = replay_optimizer(optimizer, p0, reference["grads"])
    explained = params_vs_optimizer = 0.0
    for res in per_rank:
        replay = replay_optimizer(optimizer, p0, res["grads"])
        params_vs_optimizer = largest([params_vs_optimizer] + [rel_diff(res["params"][s], replay[s]) for s in steps])
        explained = largest([explained] + [rel_diff(replay[s], ref_replay[s]) for s in steps])
    losses = [float(np.mean([res["loss"][s] for res in per_rank])) for s in steps]
    d = {
        "loss": losses,
        "max_rel_diff_grads_vs_reference": largest(rel_diff(res["grads"][s], reference["grads_at_run"][s])
                                               for res in per_rank for s in steps),
        "max_rel_diff_params_vs_reference": largest(rel_diff(res["params"][s], reference["params"][s])
                                                for res in per_rank for s in steps),
        "params_vs_reference_allowed": TOL + explained,
        "max_rel_diff_params_vs_optimizer": params_vs_optimizer,
        "max_rel_diff_loss_vs_reference": largest(abs(a - b) / abs(b) if b else abs(a - b)  # a loss of exactly 0
                                              for a, b in zip(losses, reference["loss_at_run"])),
        "max_abs_diff_across_ranks": largest(largest((max_abs(res["grads"][s], per_rank[0]["grads"][s]),
                                               max_abs(res["params"][s], per_rank[0]["params"][s])))
                                         for res in per_rank for s in steps),
        "max_rel_diff_vs_naive": largest(largest((rel_diff(res["grads"][s], naive["grads"][s]),
                                           rel_diff(res["params"][s], naive["params"][s])))
                                     for res in per_rank for s in steps),
    }
    failures = []
    for what, key, allowed in (
            ("gradients vs the full-batch step", "max_rel_diff_grads_vs_reference", TOL),
            ("parameters vs the optimizer on the averaged gradients",
             "max_rel_diff_params_vs_optimizer", TOL),
            ("parameters vs the full-batch step", "max_rel_diff_params_vs_reference", d["params_vs_reference_allowed"]),
            ("loss vs the full-batch step", "max_rel_diff_loss_vs_reference", TOL),
            ("differs from the naive program", "max_rel_diff_vs_naive", TOL)):
        if not d[key] <= allowed:
            failures.append(f"{name}: {what}: relative difference {d[key]:.3g} > {allowed:.3g}")
    if not d["max_abs_diff_across_ranks"] == 0.0:
        failures.append(f"{name}: ranks disagree on gradients or parameters (max |diff| {d['max_abs_diff_across_ranks']:.3g})")
    return d, failures


def _params_cell(v: dict[str, Any]) -> str:
    """The parameters' difference from one process, with its allowance where Adam widened it."""
    diff, allowed = v["max_rel_diff_params_vs_reference"], v["params_vs_reference_allowed"]
    return f"{diff:.2e}" + (f" (<= {allowed:.1e})" if allowed > 1.01 * TOL else "")


def render(report: dict[str, Any]) -> str:
    from .report import note_lines, verdict_line

    cfg = report["config"]
    lines = [f"dp-train: {report['ranks']} ranks, BERT-like encoder: {cfg['layers']} layers, hidden {cfg['hidden']}, "
             f"{cfg['heads']} heads, seq {cfg['seq']}; {report['parameters']['count']} gradients "
             f"({report['parameters']['bytes']} bytes); optimizer {cfg['optimizer']} lr {cfg['lr']}",
             "placement: " + "; ".join(f"rank {p['rank']} rows {p['rows'][0]}:{p['rows'][1]}"
                                       + (f", compiled {', '.join(p['compiled'])}" if p["compiled"] else "")
                                       for p in report["placement"]),
             f"combiner: {report['combiner']}", ""]
    from ..text_table import table

    rows = []
    for name, v in report["variants"].items():
        sizes = v["bucket_bytes"]
        rows.append([name, v["allreduces"], ",".join(map(str, sizes)) if len(sizes) == v["allreduces"] else f"{sizes[0]}..{sizes[1]}",
                     f"{v['compile_s']:.1f}" if v["compile_s"] is not None else "-", f"{1e3 * v['step_s']:.1f}", f"{1e3 * v['allreduces_s']:.2f}",
                     f"{v['max_rel_diff_grads_vs_reference']:.2e}", _params_cell(v),
                     f"{v['max_abs_diff_across_ranks']:.1e}", f"{v['max_rel_diff_vs_naive']:.1e}"])
    lines.append(table(rows, ["program", "allreduces", "bytes per allreduce", "compile s", "step ms", "allreduces ms",
                              "grads rel vs 1 proc", "params rel vs 1 proc", "across ranks", "rel vs naive"]))
    if report["oversubscribed"]:
        lines.append(report["oversubscribed"])
    lines.append("")
    lines.append("loss per step: full batch, 1 process: " + ", ".join(f"{x:.6f}" for x in report["reference_loss"]))
    for name, v in report["variants"].items():
        lines.append(f"               {name} (mean of ranks): " + ", ".join(f"{x:.6f}" for x in v["loss"]))
    lines.extend(note_lines(report["variants"]))
    lines.append(verdict_line(report))
    return "\n".join(lines)


def parser(prog: str = "python -m tvm_combiners.app.examples.dp_train") -> Any:
    """The example's options (``tvm-combiners launch --example dp-train`` checks them with it too)."""
    from ..usage import Parser
    from .report import add_build_options, add_output_options

    p = Parser(prog=prog, description=__doc__.splitlines()[0])
    d = Config()
    p.add_argument("--layers", type=int, default=d.layers)
    p.add_argument("--hidden", type=int, default=d.hidden)
    p.add_argument("--heads", type=int, default=d.heads)
    p.add_argument("--seq", type=int, default=d.seq)
    p.add_argument("--batch-per-rank", type=int, default=d.batch_per_rank)
    p.add_argument("--steps", type=int, default=d.steps)
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--optimizer", choices=("sgd", "adam"), default=d.optimizer)
    p.add_argument("--fresh-data", action="store_true", help="a new batch every step (default: the same batch)")
    add_build_options(p, d.repeat, d.opt_level, "timed steps per program (median)")
    p.add_argument("--threshold-bytes", type=int, default=None,
                   help="AllReduceCombiner's bucket size in bytes (default: the pass's, 30 MiB)")
    add_output_options(p)
    return p


def config(args: argparse.Namespace, ranks: int) -> Config:
    """The run's Config from parsed options; a size that leaves nothing to run raises UsageError."""
    from ..usage import UsageError
    from . import require_finite, require_positive

    require_positive(args, "layers", "hidden", "heads", "seq", "batch_per_rank", "steps", "repeat", "threshold_bytes")
    require_finite(args, "lr", 0.0, strict=True)
    if args.hidden % args.heads:
        raise UsageError(f"--hidden {args.hidden} must be divisible by --heads {args.heads}")
    return Config(layers=args.layers, hidden=args.hidden, heads=args.heads, ffn=2 * args.hidden, seq=args.seq,
                  batch_per_rank=args.batch_per_rank, steps=args.steps, lr=args.lr, optimizer=args.optimizer,
                  repeat=args.repeat, opt_level=args.opt_level, fresh_data=args.fresh_data,
                  threshold_bytes=args.threshold_bytes)


def main(argv: list[str] | None = None) -> int:
    from .report import example_main

    return example_main(parser(), config, run, render, argv)


if __name__ == "__main__":
    sys.exit(main())
