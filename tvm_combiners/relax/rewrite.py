"""Rewrite one Relax dataflow block according to the core's combine plans."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Any

import numpy as np
from tvm import relax

from ..core.branch_grouping import CombinePlan
from ..core.emit import emit_plan
from ..core.graph import Dim
from ..core.kernel_alignment import KernelAlignment
from ..core.struct_key import SymDim
from .graph_view import BlockView, Constant, constant_array


def _shape_expr(dims: Sequence[Dim]) -> relax.ShapeExpr:
    return relax.ShapeExpr([d.expr if isinstance(d, SymDim) else int(d) for d in dims])


class RelaxPlanBuilder:
    """Builds combined ops as new bindings appended to ``bindings``.

    Constant operands are concatenated, padded and broadcast with numpy right here, so the
    compiled module holds one constant weight instead of a per-call concatenation.
    """

    def __init__(self, view: BlockView, bindings: list[relax.Binding], name: str) -> None:
        self.view = view
        self.bindings = bindings
        self.name = name
        self._bb = relax.BlockBuilder()
        self._count = 0

    def _emit(self, expr: relax.Expr) -> relax.Var:
        expr = self._bb.normalize(expr)
        var = relax.DataflowVar(f"{self.name}_{self._count}", expr.ty)
        self._count += 1
        self.bindings.append(relax.VarBinding(var, expr))
        return var

    def value(self, node: int) -> Any:
        return self.view.graph[node].handle

    def concat(self, parts: Sequence[Any], axis: int) -> Any:
        if len(parts) == 1:
            return parts[0]
        if all(isinstance(p, Constant) for p in parts):
            return relax.const(np.concatenate([constant_array(p) for p in parts], axis=axis))
        return self._emit(relax.op.concat(list(parts), axis=axis))

    def pad(self, value: Any, pads: Sequence[tuple[int, int]]) -> Any:
        if isinstance(value, Constant):
            return relax.const(np.pad(constant_array(value), pads))
        return self._emit(relax.op.nn.pad(value, [p for pair in pads for p in pair], pad_value=0.0))

    def broadcast(self, value: Any, shape: Sequence[Dim]) -> Any:
        if isinstance(value, Constant) and all(isinstance(d, int) for d in shape):
            array = constant_array(value)
            array = array.reshape((1,) * (len(shape) - array.ndim) + array.shape)
            return relax.const(np.ascontiguousarray(np.broadcast_to(array, tuple(shape))))
        return self._emit(relax.op.broadcast_to(value, _shape_expr(shape)))

    def combined_root(self, template: int, data: Any, weight: Any, alignment: KernelAlignment | None) -> Any:
        call = self.view.call_of(template)
        if alignment is None:
            return self._emit(relax.Call(call.op, [data, weight], call.attrs, call.ty_args))
        a = call.attrs
        (top, bottom), (left, right) = alignment.padding
        out_dtype = None if a.out_dtype is None or str(a.out_dtype) in ("", "void") else str(a.out_dtype)
        return self._emit(
            relax.op.nn.conv2d(
                data, weight, strides=[int(s) for s in a.strides], padding=(top, left, bottom, right),
                dilation=[int(d) for d in a.dilation], groups=int(a.groups), data_layout=str(a.data_layout),
                kernel_layout=str(a.kernel_layout), out_layout=str(a.out_layout), out_dtype=out_dtype,
            )
        )

    def combined_follower(self, template: int, operands: Sequence[Any]) -> Any:
        call = self.view.call_of(template)
        args = list(call.args)
        for pos, operand in zip(self.view.arg_positions[template], operands, strict=False):
            args[pos] = operand
        return self._emit(relax.Call(call.op, args, call.attrs, call.ty_args))

    def split(self, value: Any, widths: Sequence[int], axis: int) -> list[Any]:
        offsets = list(np.cumsum(widths[:-1]).tolist())
        parts = self._emit(relax.op.split(value, offsets, axis=axis))
        return [relax.TupleGetItem(parts, i) for i in range(len(widths))]


def rewrite_block(view: BlockView, plans: list[CombinePlan], name: str = "combined") -> relax.DataflowBlock:
    """The block with every plan applied, bindings re-ordered topologically.

    A combined op must come after the inputs of all its branches and before the users of any,
    so bindings are re-emitted in a topological order that stays as close to the original as
    possible (a heap keyed by original position). Dataflow blocks are pure: reordering is safe.
    """
    graph = view.graph
    unit_of: dict[int, int] = {}  # plan member -> unit id (-1 - plan index)
    for p, plan in enumerate(plans):
        for m in plan.members:
            unit_of[m] = -1 - p

    def unit(node: int) -> int:
        return unit_of.get(node, node)

    units: dict[int, set[int]] = {}
    for node in graph.nodes:
        if view.bindings[node.index] is None:
            continue
        u = unit(node.index)
        deps = units.setdefault(u, set())
        deps.update(unit(d) for d in node.deps if view.bindings[d] is not None and unit(d) != u)
    users: dict[int, list[int]] = {u: [] for u in units}
    indegree = {u: len(d) for u, d in units.items()}
    for u, deps in units.items():
        for d in deps:
            users[d].append(u)
    order_key = {u: (min(m for m in plans[-1 - u].ends) if u < 0 else u) for u in units}
    ready = [(order_key[u], u) for u, n in indegree.items() if n == 0]
    heapq.heapify(ready)
    out: list[relax.Binding] = []
    builder = RelaxPlanBuilder(view, out, name)
    emitted = 0
    while ready:
        _, u = heapq.heappop(ready)
        emitted += 1
        if u >= 0:
            out.append(view.bindings[u])
        else:
            plan = plans[-1 - u]
            parts = emit_plan(plan, graph, builder)
            for end, part in zip(plan.ends, parts, strict=False):
                out.append(relax.VarBinding(graph[end].handle, builder._bb.normalize(part)))
        for v in users[u]:
            indegree[v] -= 1
            if indegree[v] == 0:
                heapq.heappush(ready, (order_key[v], v))
    if emitted != len(units):
        raise RuntimeError("tvm_combiners internal error: combining created a cycle; please report")
    return relax.DataflowBlock(out)
