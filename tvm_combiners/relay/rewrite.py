"""Rebuild a Relay function body according to the core's combine plans."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from tvm import relay

from ..core.branch_grouping import CombinePlan
from ..core.emit import emit_plan
from ..core.folding_builder import FoldingBuilder
from ..core.graph import Dim
from ..core.schedule import schedule
from ..core.struct_key import SymDim
from .graph_view import BodyView


def _dims(shape: Sequence[Dim]) -> list[Any]:
    return [d.expr if isinstance(d, SymDim) else int(d) for d in shape]


class RelayPlanBuilder(FoldingBuilder):
    """Builds combined ops as Relay expressions; constant operands are folded with numpy."""

    def __init__(self, view: BodyView, new: dict[int, Any]) -> None:
        self.view = view
        self.new = new

    def value(self, node: int) -> Any:
        return self.new[node]

    def constant_value(self, value: Any) -> np.ndarray | None:
        """None also where numpy has no such dtype: TVM 0.16 hands bfloat16 over as uint16, and
        ``relay.const`` of that array would be a uint16 weight (that ``nn.dense`` accepts)."""
        if not isinstance(value, relay.Constant):
            return None
        array = value.data.numpy()
        return array if str(array.dtype) == str(value.data.dtype) else None

    def make_constant(self, array: np.ndarray) -> Any:
        return relay.const(array, dtype=str(array.dtype))  # a bare const turns float64 and int64 into 32 bits

    def emit_concat(self, parts: Sequence[Any], axis: int) -> Any:
        return relay.concatenate(list(parts), axis=axis)

    def emit_pad(self, value: Any, pads: Sequence[tuple[int, int]]) -> Any:
        return relay.nn.pad(value, [list(p) for p in pads], pad_value=0.0)

    def emit_broadcast(self, value: Any, shape: Sequence[Dim]) -> Any:
        return relay.broadcast_to(value, _dims(shape))

    def emit_reshape(self, value: Any, shape: Sequence[Dim]) -> Any:
        return relay.reshape(value, _dims(shape))

    def combined_root(self, plan: CombinePlan, data: Any, weight: Any) -> Any:
        call = self.view.expr_of(plan.roots[0])
        alignment = plan.alignment
        a = call.attrs
        name = call.op.name
        if plan.stack is not None:
            transposed = name == "nn.dense" or bool(a.transpose_b)
            if plan.stack == "new":
                data = relay.expand_dims(data, 0)  # a view: broadcast by batch_matmul, not copied
            return relay.nn.batch_matmul(data, weight, out_dtype=a.out_dtype, transpose_a=False, transpose_b=transposed)
        if name == "nn.dense":
            return relay.nn.dense(data, weight, units=None, out_dtype=a.out_dtype)
        if name == "nn.matmul":
            return relay.nn.matmul(data, weight, units=None, out_dtype=a.out_dtype, transpose_a=a.transpose_a,
                                   transpose_b=a.transpose_b)
        if name == "nn.conv2d":
            (top, bottom), (left, right) = alignment.padding
            return relay.nn.conv2d(
                data, weight, strides=a.strides, padding=(top, left, bottom, right), dilation=a.dilation,
                groups=a.groups, channels=sum(plan.widths), kernel_size=alignment.sizes, data_layout=a.data_layout,
                kernel_layout=a.kernel_layout, out_layout=a.out_layout, out_dtype=a.out_dtype,
            )
        return relay.Call(call.op, [data, weight], call.attrs, call.type_args, call.span)

    def combined_follower(self, plan: CombinePlan, template: int, operands: Sequence[Any]) -> Any:
        call = self.view.expr_of(template)
        if plan.stack is not None and call.op.name == "nn.bias_add":
            return relay.add(operands[0], operands[1])  # the bias is trailing: right-aligned add is the same
        args = list(call.args)
        for pos, operand in zip(self.view.arg_positions[template], operands):
            args[pos] = operand
        return relay.Call(call.op, args, call.attrs, call.type_args, call.span)

    def split(self, value: Any, widths: Sequence[int], axis: int) -> list[Any]:
        offsets = [int(x) for x in np.cumsum(widths[:-1])]
        parts = relay.split(value, offsets, axis=axis).astuple()
        return [relay.TupleGetItem(parts, i) for i in range(len(widths))]


def rewrite_body(view: BodyView, plans: list[CombinePlan], body: relay.Expr) -> relay.Expr:
    """The body with every plan applied (expressions rebuilt in a topological order)."""
    new: dict[int, Any] = {i: view.exprs[i] for i in view.leaves}
    builder = RelayPlanBuilder(view, new)
    graph = view.graph
    for unit in schedule(graph, plans, lambda i: i in view.leaves):
        if isinstance(unit, CombinePlan):
            for end, part in zip(unit.ends, emit_plan(unit, graph, builder)):
                new[end] = part
            continue
        expr = view.exprs[unit]
        if isinstance(expr, relay.Call):
            args = [_mapped(a, view, new) for a in expr.args]
            new[unit] = relay.Call(expr.op, args, expr.attrs, expr.type_args, expr.span)
        elif isinstance(expr, relay.Tuple):
            new[unit] = relay.Tuple([_mapped(f, view, new) for f in expr.fields], expr.span)
        elif isinstance(expr, relay.TupleGetItem):
            new[unit] = relay.TupleGetItem(_mapped(expr.tuple_value, view, new), expr.index)
        else:
            raise TypeError(f"tvm_combiners: unexpected Relay node {type(expr).__name__}")
    return new[view.node_of(body)]


def _mapped(expr: Any, view: BodyView, new: dict[int, Any]) -> Any:
    return new[view.node_of(expr)]
