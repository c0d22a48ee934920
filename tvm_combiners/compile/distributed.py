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
inputs, and worker 0's (rank 0's) are broadcast or scattered to the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tvm
import tvm_ffi
from tvm import relax
from tvm.relax.distributed import DTensorType
from tvm.relax.distributed import transform as dist
from tvm.target import Target

from .legalize import legalizations
from .pipelines import default_pipeline

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
                                "tvm_combiners.compile.distributed.distributed_pipeline does)")


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
        if not updates:
            return mod
        mod = mod.clone()  # a pass must not change the module it is given
        for gv, func in updates.items():
            mod.update_func(gv, func)
        return mod


def distributed_passes(target: Any) -> list[tvm.transform.Pass]:
    """LegalizeOps, then TVM's distributed passes, checked: what :func:`distributed_pipeline` runs first."""
    target = Target(target) if isinstance(target, (str, dict)) else target
    return [relax.transform.LegalizeOps(legalizations(target)), dist.PropagateSharding(),
            dist.LowerGlobalViewToLocalView(), CheckShardedOps(), UniqueGlobalSymbols(),
            dist.LegalizeRedistribute(), dist.LowerDistIR()]


def distributed_pipeline(target: Any, before: Sequence[tvm.transform.Pass] = ()) -> tvm.transform.Pass:
    """``before``, :func:`distributed_passes`, then the package's default pipeline for ``target``.

    ``tvm.compile(mod, target, relax_pipeline=distributed_pipeline(target))`` compiles a module
    annotated with ``R.dist.annotate_sharding`` (or typed with ``R.DTensor``) into one that each rank
    runs on its shard, with TVM's ``R.ccl`` collectives served by the collectives runtime.
    """
    target = Target(target) if isinstance(target, (str, dict)) else target
    return tvm.transform.Sequential([*before, *distributed_passes(target), default_pipeline(target)],
                                    name="tvm_combiners.distributed_pipeline")
