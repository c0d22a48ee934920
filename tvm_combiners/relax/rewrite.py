"""Rewrite one Relax dataflow block according to the core's combine plans."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import tvm_ffi
from tvm import relax

from ..core.branch_grouping import CombinePlan
from ..core.emit import emit_plan
from ..core.folding_builder import FoldingBuilder
from ..core.graph import Dim
from ..core.schedule import schedule
from ..core.struct_key import SymDim
from .graph_view import BlockView, Constant, constant_array


def _shape_expr(dims: Sequence[Dim]) -> relax.ShapeExpr:
    return relax.ShapeExpr([d.expr if isinstance(d, SymDim) else int(d) for d in dims])


class RelaxPlanBuilder(FoldingBuilder):
    """Builds combined ops as new bindings appended to ``bindings``.

    Constant operands are concatenated, padded and broadcast with numpy (``FoldingBuilder``), so
    the compiled module holds one constant weight instead of a per-call concatenation.
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

    def normalize(self, expr: relax.Expr) -> relax.Expr:
        return self._bb.normalize(expr)

    def value(self, node: int) -> Any:
        return self.view.graph[node].handle

    def constant_value(self, value: Any) -> np.ndarray | None:
        return constant_array(value) if isinstance(value, Constant) else None

    def make_constant(self, array: np.ndarray) -> Any:
        return relax.const(array, dtype=str(array.dtype))  # a bare const turns float64 and int64 into 32 bits

    def emit_concat(self, parts: Sequence[Any], axis: int) -> Any:
        return self._emit(relax.op.concat(list(parts), axis=axis))

    def emit_pad(self, value: Any, pads: Sequence[tuple[int, int]]) -> Any:
        return self._emit(relax.op.nn.pad(value, [p for pair in pads for p in pair], pad_value=0.0))

    def emit_broadcast(self, value: Any, shape: Sequence[Dim]) -> Any:
        return self._emit(relax.op.broadcast_to(value, _shape_expr(shape)))

    def emit_reshape(self, value: Any, shape: Sequence[Dim]) -> Any:
        if not isinstance(value, relax.Var):
            value = self._emit(value)  # a split's TupleGetItem: bind it before reshaping
        return self._emit(relax.op.reshape(value, _shape_expr(shape)))

    def combined_root(self, plan: CombinePlan, data: Any, weight: Any) -> Any:
        call = self.view.call_of(plan.roots[0])
        alignment = plan.alignment
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

    def combined_follower(self, plan: CombinePlan, template: int, operands: Sequence[Any]) -> Any:
        call = self.view.call_of(template)
        args = list(call.args)
        for pos, operand in zip(self.view.arg_positions[template], operands):
            args[pos] = operand
        return self._emit(relax.Call(call.op, args, call.attrs, call.ty_args))

    def split(self, value: Any, widths: Sequence[Dim], axis: int) -> list[Any]:
        offsets = [0] + list(np.cumsum([int(w) for w in widths[:-1]]).tolist())
        if isinstance(widths[-1], SymDim):  # TVM's split types (and legalizes) symbolic tails badly: slice
            ends = offsets[1:] + [offsets[-1] + widths[-1].expr]
            return [self._emit(relax.op.strided_slice(value, axes=[axis], begin=[b], end=[e], assume_inbound=True))
                    for b, e in zip(offsets, ends)]
        parts = self._emit(relax.op.split(value, offsets[1:], axis=axis))
        return [relax.TupleGetItem(parts, i) for i in range(len(widths))]


def rewrite_block(view: BlockView, plans: list[CombinePlan], name: str = "combined") -> relax.DataflowBlock:
    """The block with every plan applied; dataflow blocks are pure, so re-ordering is safe."""
    out: list[relax.Binding] = []
    builder = RelaxPlanBuilder(view, out, name)
    for unit in schedule(view.graph, plans, lambda i: view.bindings[i] is None):
        if isinstance(unit, int):
            out.append(view.bindings[unit])
            continue
        for end, part in zip(unit.ends, emit_plan(unit, view.graph, builder)):
            var, part = view.graph[end].handle, builder.normalize(part)
            if tvm_ffi.structural_equal(part.ty, var.ty):
                out.append(relax.VarBinding(var, part))
            else:  # a split of a symbolic width: shapes TVM cannot prove equal, checked at run time
                out.append(relax.MatchCast(var, part, var.ty))
    return relax.DataflowBlock(out)
