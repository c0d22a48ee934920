"""Compiling a module sharded with TVM's ``relax.distributed`` for ranks, in the order that keeps its collectives.

TVM's passes lower sharding annotations (``R.dist.annotate_sharding``) to ``R.ccl`` collectives:
PropagateSharding types every tensor with a placement, LowerGlobalViewToLocalView rewrites each
``call_tir`` to compute its shard and adds the allreduce a sharded contraction needs,
LegalizeRedistribute and LowerDistIR turn placements into collectives and local shapes.  Only
``call_tir`` gets that allreduce: a high-level op (``R.matmul``) that contracts a sharded axis into
a replicated result is lowered as a local op, and every rank returns its partial sum, without an
error (a 2-rank MLP: errors of tens to hundreds).  So :func:`distributed_pipeline` legalizes the ops
first, and :class:`CheckShardedOps` refuses, in one line, any op that would still lose its collective.

Run the result on ranks with the collectives runtime (``launch``): every rank passes full-size
inputs, and worker 0's (rank 0's) are broadcast or scattered to the others, in one transfer per
kind and dtype (:func:`~tvm_combiners.collectives.relax.dist_combiners.BroadcastScatterCombiner`).
With ``local_shards``, each rank passes its own shard instead (:func:`shard_inputs` cuts them) and
never holds a full sharded parameter.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import tvm
import tvm_ffi
from tvm import relax
from tvm.relax.distributed import DTensorType
from tvm.relax.distributed import transform as dist
from tvm.target import Target

from ...compile.legalize import legalizations
from ...compile.pipelines import default_pipeline
from ...relax.module import rewrite_functions, static_tensor, with_functions
from .dist_combiners import BroadcastScatterCombiner

_SHARDING, _REPLICA = 0, 1  # PlacementSpec.kind
# ops whose placements TVM's passes turn into collectives or local views themselves
_LOWERED = ("relax.dist.", "relax.ccl.")


class ShardingError(ValueError):
    """A sharded module that TVM's distributed passes would lower to wrong results without a word."""


tvm_ffi.register_error(ShardingError.__name__, ShardingError)  # raised inside a pass, it keeps its class


def _placements(ty: Any) -> list[tuple[int, int]] | None:
    """(kind, tensor axis) per mesh axis of a DTensor type; None for any other type."""
    if not isinstance(ty, DTensorType):
        return None
    return [(int(s.kind), int(s.axis)) for s in ty.placement.dim_specs]


def _name(expr: relax.Expr) -> str:
    return expr.name if isinstance(expr, relax.Var) else type(expr).__name__


def _op_text(op: tvm.ir.Op) -> str:
    return "R." + op.name.removeprefix("relax.")


def _dropped_collective(func_name: str, call: relax.Call) -> str | None:
    """Why ``call`` would lose a collective: a sharded operand on a mesh axis where its result is
    replicated, from an op that TVM lowers as a local computation."""
    if not isinstance(call.op, tvm.ir.Op) or call.op.name.startswith(_LOWERED):
        return None
    result = _placements(call.ty)
    if result is None:
        return None
    for arg in call.args:
        for mesh_axis, ((kind, axis), (out_kind, _)) in enumerate(zip(_placements(arg.ty) or [], result)):
            if kind == _SHARDING and out_kind == _REPLICA:
                return (f"{_op_text(call.op)} in function '{func_name}' takes {_name(arg)} sharded on its axis {axis} "
                        f"(S[{axis}] on mesh axis {mesh_axis}) and gives a replicated (R) result: TVM lowers a "
                        "high-level op as a local computation, so each rank would return its partial result "
                        "with no collective")
    return None


def check_sharded_ops(mod: tvm.IRModule) -> None:
    """Raise :class:`ShardingError` where a sharded-operand op reaches a replicated result with no collective.

    Meant for a module after PropagateSharding and LowerGlobalViewToLocalView: ``call_tir`` has then
    become ``R.dist.call_tir_local_view`` followed by its allreduce, and any op still computing a
    replicated result from a sharded operand is one TVM would lower without the allreduce.
    """
    for gv, func in mod.functions_items():
        if not isinstance(func, relax.Function):
            continue
        calls: list[relax.Call] = []
        relax.analysis.post_order_visit(func, lambda e, calls=calls: calls.append(e) if isinstance(e, relax.Call) else None)
        found = next((why for why in (_dropped_collective(gv.name_hint, c) for c in calls) if why), None)
        if found:
            raise ShardingError(f"tvm_combiners.CheckShardedOps: {found} (annotate plain tensors with "
                                "R.dist.annotate_sharding and legalize the ops before PropagateSharding, as "
                                "tvm_combiners.collectives.relax.distributed_pipeline does)")


@tvm.transform.module_pass(opt_level=0, name="tvm_combiners.CheckShardedOps")
class CheckShardedOps:
    """:func:`check_sharded_ops` as a pass (the module is returned unchanged)."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        check_sharded_ops(mod)
        return mod


@tvm.transform.module_pass(opt_level=0, name="tvm_combiners.UniqueGlobalSymbols")
class UniqueGlobalSymbols:
    """Give each copy of a PrimFunc that LowerGlobalViewToLocalView made (one per sharding it is called
    with) its own name as its symbol: the copies keep the original's ``global_symbol``, and building
    then fails ("IRModule contains duplicate global symbol")."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        symbols: dict[str, list[tvm.ir.GlobalVar]] = {}
        for gv, func in mod.functions_items():
            symbol = func.attrs.get("global_symbol") if func.attrs is not None else None
            if symbol is not None:
                symbols.setdefault(str(symbol), []).append(gv)
        updates = {}
        for symbol, gvs in symbols.items():
            keep = next((g for g in gvs if g.name_hint == symbol), gvs[0])
            updates.update({gv: mod[gv].with_attr("global_symbol", gv.name_hint) for gv in gvs if not gv.same_as(keep)})
        return with_functions(mod, updates)


def _mutate_functions(mod: tvm.IRModule, mutator: Any) -> tvm.IRModule:
    """Each Relax function of ``mod`` through ``mutator(name)`` (one with a ``changed`` flag); ``mod`` itself
    where none changed."""

    def rewrite(name: str, func: relax.Function) -> relax.Function | None:
        m = mutator(name)
        new = m.visit_expr(func)
        return new if m.changed else None

    return rewrite_functions(mod, rewrite)


def _placement_text(specs: list[tuple[int, int]]) -> str:
    return ", ".join(f"S[{axis}]" if kind == _SHARDING else "R" for kind, axis in specs)


@relax.expr_functor.mutator
class _ConstantOperands(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, func_name: str) -> None:
        super().__init__(mod)
        self.func_name = func_name
        self.bound: dict[Any, Any] = {}  # a var bound to a constant (or to its annotation) -> the constant
        self.changed = False

    def constant(self, expr: relax.Expr) -> Any:
        """The constant ``expr`` is, stands for (a var bound to one) or annotates replicated; None if none."""
        if isinstance(expr, tvm.ir.expr.GenericConst):
            return expr
        if isinstance(expr, relax.Var):
            return self.bound.get(expr)
        if not (isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op)
                and expr.op.name == "relax.dist.annotate_sharding"):
            return None
        const = self.constant(expr.args[0])
        specs = [(int(s.kind), int(s.axis)) for s in expr.attrs.placement.dim_specs]
        if const is not None and any(kind == _SHARDING for kind, _ in specs):
            raise ShardingError(f"tvm_combiners.ConstantOperands: R.dist.annotate_sharding in function "
                                f"'{self.func_name}' shards a constant of shape {_shape_of(const.ty)} "
                                f"({_placement_text(specs)}): TVM's PropagateSharding cannot shard a constant; pass it as a "
                                "parameter")
        return const  # every rank holds the whole constant: replicated already

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        const = self.constant(binding.value)
        if const is None:
            super().visit_var_binding_(binding)
        else:
            self.bound[binding.var] = const  # the binding goes: its uses take the constant itself
            self.changed = True

    def visit_var_(self, var: relax.Var) -> relax.Expr:
        const = self.bound.get(var)
        return super().visit_var_(var) if const is None else const

    def visit_dataflow_var_(self, var: relax.DataflowVar) -> relax.Expr:
        const = self.bound.get(var)
        return super().visit_dataflow_var_(var) if const is None else const

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        const = self.constant(call)
        if const is None:
            return call
        self.changed = True
        return const


@tvm.transform.module_pass(opt_level=0, name="tvm_combiners.ConstantOperands")
class ConstantOperands:
    """Every constant reaches its users as an operand, unannotated, as TVM's PropagateSharding needs: a var
    bound to a constant stays a plain tensor there (LowerGlobalViewToLocalView then fails: "Expected buffer
    parameter lv to receive a distributed tensor"), and an annotated constant fails its internal check
    ("inferred_tuple_ty"). A replicated annotation of a constant goes (every rank holds it whole); one that
    shards it is refused in one line. Runs first, on the annotated module."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return _mutate_functions(mod, lambda name: _ConstantOperands(mod, name))


@relax.expr_functor.mutator
class _LocalConstants(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule) -> None:
        super().__init__(mod)
        self.changed = False

    def visit_generic_const_(self, const: Any) -> relax.Expr:
        ty = const.ty
        if not isinstance(ty, DTensorType):
            return const
        self.changed = True
        if any(kind == _SHARDING for kind, _ in _placements(ty)):  # PropagateSharding refuses these itself
            raise ShardingError(f"tvm_combiners.LocalConstants: a constant of shape {_shape_of(ty.tensor_ty)} "
                                f"is sharded ({_placement_text(_placements(ty))}): pass it as a parameter")
        return tvm.ir.expr.GenericConst(const.value, ty.tensor_ty)


@tvm.transform.module_pass(opt_level=0, name="tvm_combiners.LocalConstants")
class LocalConstants:
    """Give each constant LowerDistIR leaves typed as a (replicated) DTensor its plain tensor type: TVM's
    LowerDistIR lowers parameters but not constants (a replicated weight ``R.const`` then fails the build
    with "Argument 1 type mismatch: expected R.Tensor(...), given R.DTensor(...)"). Every rank holds the
    whole constant, which is what a replicated constant is."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return _mutate_functions(mod, lambda _name: _LocalConstants(mod))


_BROADCAST, _SCATTER = "relax.ccl.broadcast_from_worker0", "relax.ccl.scatter_from_worker0"


def local_shard(array: np.ndarray, placement: str, worker: int, num_workers: int) -> np.ndarray:
    """The block of ``array`` that ``worker`` of ``num_workers`` holds under a 1-D mesh ``placement``:
    ``S[i]``: its block along tensor axis ``i``; ``R``: the whole array."""
    text = placement.strip()
    if text == "R":
        return array
    if not (text.startswith("S[") and text.endswith("]") and text[2:-1].isdigit()):
        raise ValueError(f"local_shard: placement {placement!r} is not 'R' or 'S[i]' (one mesh axis)")
    axis = int(text[2:-1])
    if axis >= array.ndim or array.shape[axis] % num_workers or not 0 <= worker < num_workers:
        raise ValueError(f"local_shard: placement {placement} of an array of shape {array.shape} for worker {worker} "
                         f"of {num_workers}: axis {axis} must exist and divide into {num_workers} equal blocks")
    size = array.shape[axis] // num_workers
    return np.ascontiguousarray(np.take(array, range(worker * size, (worker + 1) * size), axis=axis))


@dataclasses.dataclass(frozen=True)
class InputShard:
    """One parameter of a lowered function that worker 0 broadcasts (``R``) or scatters (``S[i]``)."""

    function: str
    index: int  # position among the function's parameters
    name: str
    shape: tuple[int, ...]
    dtype: str
    placement: str
    num_workers: int
    local_shape: tuple[int, ...]

    @property
    def full_bytes(self) -> int:
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize

    @property
    def local_bytes(self) -> int:
        return math.prod(self.local_shape) * np.dtype(self.dtype).itemsize

    def cut(self, array: np.ndarray, worker: int) -> np.ndarray:
        """``worker``'s shard of the full ``array``."""
        if tuple(array.shape) != self.shape:
            raise ValueError(f"InputShard.cut: parameter {self.name!r} of function {self.function!r} has shape "
                             f"{self.shape}, got an array of shape {tuple(array.shape)}")
        return local_shard(array, self.placement, worker, self.num_workers)


@dataclasses.dataclass(frozen=True)
class ShardPlan:
    """Per function, its parameters that each rank may pass as its local shard (:func:`shard_inputs`)."""

    inputs: dict[str, tuple[InputShard, ...]]

    def local_inputs(self, function: str, arrays: Sequence[np.ndarray], worker: int,
                     names: Iterable[str] | None = None) -> list[np.ndarray]:
        """What ``worker`` passes to ``function`` compiled with ``local_shards=names`` (None: every
        parameter of the plan): the shards of those, the other arrays whole."""
        chosen = None if names is None else set(names)
        by_index = {s.index: s for s in self.inputs.get(function, ()) if chosen is None or s.name in chosen}
        return [by_index[i].cut(a, worker) if i in by_index else a for i, a in enumerate(arrays)]


def _transfers(func: relax.Function) -> dict[int, relax.VarBinding]:
    """Per parameter index, the one binding that broadcasts or scatters it from worker 0, for parameters
    read by nothing else (any other reader needs the full tensor)."""
    params = {p: i for i, p in enumerate(func.params)}
    readers: dict[int, list[Any]] = {}

    def read(expr: Any, owner: Any) -> None:
        for v in relax.analysis.free_vars(expr):
            if v in params:
                readers.setdefault(params[v], []).append(owner)

    blocks = func.body.blocks if isinstance(func.body, relax.SeqExpr) else []
    for block in blocks:
        for b in block.bindings:
            read(b.value, b)
    read(func.body.body if isinstance(func.body, relax.SeqExpr) else func.body, None)
    out = {}
    for index, users in readers.items():
        (b,) = users if len(users) == 1 else (None,)
        value = getattr(b, "value", None)
        if (isinstance(b, relax.VarBinding) and isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)
                and value.op.name in (_BROADCAST, _SCATTER) and value.args[0].same_as(func.params[index])):
            out[index] = b
    return out


def _shape_of(ty: Any) -> tuple[int, ...] | None:
    static = static_tensor(ty)
    return static[0] if static is not None else None


def _lowered(mod: tvm.IRModule, target: Any) -> tvm.IRModule:
    """``mod`` after :func:`distributed_passes` unless it is lowered already (no ``R.dist`` op or DTensor)."""
    found = [False]

    def visit(e: Any) -> None:
        if (isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) and e.op.name.startswith("relax.dist.")) or (
                isinstance(e, relax.Var) and isinstance(e.ty, DTensorType)):
            found[0] = True

    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return tvm.transform.Sequential(distributed_passes(target))(mod) if found[0] else mod


def shard_inputs(mod: tvm.IRModule, target: Any = "llvm") -> ShardPlan:
    """Which parameters each rank may pass as its local shard, with their placements and shapes.

    ``mod``: a module annotated for ``relax.distributed`` (lowered here with :func:`distributed_passes`
    for ``target``) or one already lowered. A parameter qualifies where worker 0's copy reaches the
    function only through one ``broadcast_from_worker0`` (``R``) or ``scatter_from_worker0`` (``S[i]``;
    TVM's LowerDistIR lowers 1-D meshes only, so the scatter's axis is the whole placement).
    """
    lowered = _lowered(mod, Target(target) if isinstance(target, (str, dict)) else target)
    inputs: dict[str, tuple[InputShard, ...]] = {}
    for gv, func in lowered.functions_items():
        if not isinstance(func, relax.Function):
            continue
        found = []
        for index, b in sorted(_transfers(func).items()):
            param, call = func.params[index], b.value
            shape, local = _shape_of(param.ty), _shape_of(b.var.ty)
            if shape is None or local is None:
                continue  # a symbolic shape: no fixed block to cut
            scatter = call.op.name == _SCATTER
            found.append(InputShard(gv.name_hint, index, param.name, shape, str(param.ty.dtype),
                                    f"S[{int(call.attrs.axis)}]" if scatter else "R",
                                    int(call.attrs.num_workers) if scatter else 1, local))
        if found:
            inputs[gv.name_hint] = tuple(found)
    return ShardPlan(inputs)


@relax.expr_functor.mutator
class _DropTransfers(relax.PyExprMutator):
    """Bind each dropped transfer's result to the function's new (local) parameter instead."""

    def __init__(self, mod: tvm.IRModule, replace: dict[Any, relax.Var]) -> None:
        super().__init__(mod)
        self.replace = replace  # binding var -> the new parameter

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        new = self.replace.get(binding.var)
        if new is None:
            super().visit_var_binding_(binding)
        else:
            self.set_var_remap(binding.var, new)


def LocalShards(names: Iterable[str] | None = None) -> tvm.transform.Pass:  # noqa: N802 - a pass factory
    """Each rank passes its own shard of the chosen parameters (None: every one :func:`shard_inputs`
    finds): their ``broadcast_from_worker0`` / ``scatter_from_worker0`` go, and the function takes the
    local tensor directly. Runs after ``LowerDistIR``; a name that is no such parameter of any
    function is refused."""
    chosen = None if names is None else list(names)

    def transform(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        plan = shard_inputs(mod)
        known = {s.name for shards in plan.inputs.values() for s in shards}
        missing = [n for n in chosen or () if n not in known]
        if missing:
            raise ValueError(f"tvm_combiners.LocalShards: parameter {missing[0]!r} is not broadcast or scattered "
                             "from worker 0 alone in any function (its only reader must be one "
                             f"R.ccl.broadcast_from_worker0 or scatter_from_worker0); candidates: {sorted(known)}")
        updates = {}
        for gv, func in mod.functions_items():
            shards = [s for s in plan.inputs.get(gv.name_hint, ()) if chosen is None or s.name in chosen]
            if not shards:
                continue
            transfers = _transfers(func)
            params = list(func.params)
            replace = {}
            for s in shards:
                b = transfers[s.index]
                params[s.index] = relax.Var(s.name, b.var.ty)
                replace[b.var] = params[s.index]
            body = _DropTransfers(mod, replace).visit_expr(func.body)
            updates[gv] = relax.Function(params, body, func.ret_ty, func.is_pure, func.attrs, func.span)
        return with_functions(mod, updates)

    return tvm.transform.module_pass(transform, opt_level=0, name="tvm_combiners.LocalShards")


_IN_GROUP = {"relax.ccl.allreduce": lambda x, a: relax.op.ccl.allreduce(x, str(a.op_type), True),
             "relax.ccl.allgather": lambda x, a: relax.op.ccl.allgather(x, int(a.num_workers), True)}
# TVM legalizes these across every worker whatever the attribute (broadcast and scatter have none);
# replicated-to-sharded redistribution slices by the global worker id
_NOT_IN_GROUP = (_BROADCAST, _SCATTER, "relax.dist.redistribute_replica_to_shard")


@relax.expr_functor.mutator
class _InGroup(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, func_name: str) -> None:
        super().__init__(mod)
        self.func_name = func_name

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        name = call.op.name if isinstance(call.op, tvm.ir.Op) else ""
        if name in _NOT_IN_GROUP:
            fix = ("pass that tensor as a local shard (local_shards=True)" if name in (_BROADCAST, _SCATTER)
                   else "annotate the tensor sharded where it is computed, or pass it as a sharded parameter")
            raise ShardingError(f"tvm_combiners.InGroup: {_op_text(call.op)} of {_name(call.args[0])} in function "
                                f"'{self.func_name}' would run across every rank, not within its disco group "
                                f"(TVM's lowering cannot group it): {fix}")
        return _IN_GROUP[name](call.args[0], call.attrs) if name in _IN_GROUP else call


@tvm.transform.module_pass(opt_level=0, name="tvm_combiners.InGroup")
class InGroup:
    """Every allreduce and allgather of a lowered module runs within the rank's disco group (``launch
    --disco-groups``: tensor parallel x data parallel), where LowerDistIR makes them span every worker.
    A transfer from worker 0 or a replicated-to-sharded redistribution left is refused (ShardingError)."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return rewrite_functions(mod, lambda name, func: _InGroup(mod, name).visit_expr(func))


def distributed_passes(target: Any) -> list[tvm.transform.Pass]:
    """LegalizeOps, then TVM's distributed passes, checked (constants annotated or lowered as TVM's passes
    cannot: :class:`ConstantOperands`, :class:`LocalConstants`): what :func:`distributed_pipeline` runs first."""
    target = Target(target) if isinstance(target, (str, dict)) else target
    return [ConstantOperands(), relax.transform.LegalizeOps(legalizations(target)), dist.PropagateSharding(),
            dist.LowerGlobalViewToLocalView(), CheckShardedOps(), UniqueGlobalSymbols(),
            dist.LegalizeRedistribute(), dist.LowerDistIR(), LocalConstants()]


def distributed_pipeline(target: Any, before: Sequence[tvm.transform.Pass] = (), *, combine: bool = True,
                         local_shards: bool | Iterable[str] = False, in_group: bool = False,
                         **combine_options: Any) -> tvm.transform.Pass:
    """``before``, :func:`distributed_passes`, then the package's default pipeline for ``target``.

    ``tvm.compile(mod, target, relax_pipeline=distributed_pipeline(target))`` compiles a module
    annotated with ``R.dist.annotate_sharding`` (or typed with ``R.DTensor``) into one that each rank
    runs on its shard, with TVM's ``R.ccl`` collectives served by the collectives runtime.
    ``local_shards``: True (every parameter :func:`shard_inputs` finds) or parameter names: those are
    passed by each rank as its local shard (:class:`LocalShards`). ``combine``: the remaining
    broadcasts and scatters from worker 0 travel as one per kind and dtype (bitwise the same results);
    ``combine_options`` go to ``BroadcastScatterCombiner`` (``threshold_bytes``, ``max_op_bytes``, ...).
    ``in_group``: the collectives run within each disco group (:class:`InGroup`; the mesh is one group).
    """

    target = Target(target) if isinstance(target, (str, dict)) else target
    passes = [*before, *distributed_passes(target)]
    if local_shards is not False:
        names = [local_shards] if isinstance(local_shards, str) else local_shards
        passes.append(LocalShards(None if names is True else names))
    if combine:
        passes.append(BroadcastScatterCombiner(**combine_options))
    elif combine_options:
        raise TypeError(f"distributed_pipeline: {sorted(combine_options)[0]} is an option of the combiner, "
                        "but combine=False")
    if in_group:
        passes.append(InGroup())
    return tvm.transform.Sequential([*passes, default_pipeline(target)], name="tvm_combiners.distributed_pipeline")
