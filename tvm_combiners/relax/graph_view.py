"""Translate one Relax dataflow block into the core's neutral :class:`Graph`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tvm
import tvm_ffi
from tvm import relax

from ..core.graph import Dim, FollowerInfo, Graph, RootInfo, constant_key, ir_dtype_bits
from ..core.op_tables import COMMUTATIVE, FOLLOWERS
from ..core.root_specs import conv2d_root, matmul_root
from ..core.struct_key import StructKey, SymDim


def struct_key(obj: Any) -> StructKey:
    return StructKey(obj, tvm_ffi.structural_hash, tvm_ffi.structural_equal)


_DTYPE_BITS = ir_dtype_bits(tvm.DataType)


def dims_of(ty: Any) -> tuple[Dim, ...] | None:
    """Static ints and :class:`SymDim` for a tensor type, or None when the shape is unknown."""
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return None
    return tuple(int(v.value) if isinstance(v, tvm.tirx.IntImm) else SymDim(v) for v in ty.shape.values)


def dtype_of(ty: Any) -> str | None:
    return str(ty.dtype) if isinstance(ty, relax.TensorType) else None


Constant = tvm.ir.expr.Constant


def constant_array(const: Any) -> np.ndarray:
    """The numpy value of a Relax constant (scalars come back as Python numbers in 0.27)."""
    value = const.value
    return np.asarray(value.numpy() if hasattr(value, "numpy") else value, dtype=str(const.ty.dtype))


def _is_tensor(expr: Any) -> bool:
    return isinstance(expr, (relax.Var, Constant)) and isinstance(expr.ty, relax.TensorType)


@dataclass
class BlockView:
    """The graph of one block plus what the rewrite needs to map nodes back to bindings."""

    graph: Graph
    bindings: list[Any]  # per node: the binding, or None for leaves
    arg_positions: dict[int, tuple[int, ...]] = field(default_factory=dict)  # operand -> call arg index

    def call_of(self, node: int) -> relax.Call:
        return self.bindings[node].value

    def expr_of(self, node: int) -> Any:
        binding = self.bindings[node]
        return self.graph[node].handle if binding is None else binding.value


def build_block_view(block: relax.DataflowBlock) -> BlockView:
    graph = Graph(dtype_bits=_DTYPE_BITS)
    bindings: list[Any] = []
    view = BlockView(graph, bindings)
    index: dict[Any, int] = {}

    def leaf(expr: Any) -> int:
        if expr not in index:
            ty = expr.ty
            key = constant_key(dims_of(ty), lambda: constant_array(expr)) if isinstance(expr, Constant) else None
            node = graph.add(op=type(expr).__name__, operands=(), deps=(), shape=dims_of(ty), dtype=dtype_of(ty),
                             value_key=key, handle=expr)
            index[expr] = node.index
            bindings.append(None)
        return index[expr]

    for binding in block.bindings:
        value = binding.value
        free = [leaf(v) if v not in index else index[v] for v in relax.analysis.free_vars(value)]
        operands: list[int] = []
        positions: list[int] = []
        op_name, value_key = type(value).__name__, None
        if isinstance(value, relax.Call) and isinstance(binding, relax.VarBinding):
            for pos, arg in enumerate(value.args):
                if _is_tensor(arg):
                    operands.append(index[arg] if arg in index else leaf(arg))
                    positions.append(pos)
            others = tuple((pos, struct_key(a)) for pos, a in enumerate(value.args) if pos not in positions)
            op_name = value.op.name if isinstance(value.op, tvm.ir.Op) else str(value.op)
            value_key = (op_name, struct_key(value.attrs), others, struct_key(list(value.ty_args)))
        deps = tuple(operands + free)  # ordered, repeats kept: value numbering needs both
        ty = binding.var.ty
        node = graph.add(
            op=op_name.removeprefix("relax."),
            operands=tuple(operands),
            deps=deps,
            shape=dims_of(ty),
            dtype=dtype_of(ty),
            value_key=value_key,
            escapes=not isinstance(binding.var, relax.DataflowVar),
            handle=binding.var,
        )
        index[binding.var] = node.index
        bindings.append(binding)
        view.arg_positions[node.index] = tuple(positions)
        if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
            _classify(node, value, graph)
    return view


def _classify(node: Any, call: relax.Call, graph: Graph) -> None:
    name = node.op
    if name == "split":
        sections = call.attrs.indices_or_sections
        node.split_sections = int(sections) if isinstance(sections, (int, tvm.tirx.IntImm)) else len(sections) + 1
    elif name in FOLLOWERS:
        others = tuple(struct_key(a) for a in call.args if not _is_tensor(a))
        node.follower = FollowerInfo((name, struct_key(call.attrs), others), commutative=name in COMMUTATIVE)
    elif name == "matmul" and len(node.operands) == 2:
        node.root = _matmul_root(call, graph, node)
    elif name == "nn.conv2d" and len(node.operands) == 2:
        node.root = _conv2d_root(call, graph, node)


def _matmul_root(call: relax.Call, graph: Graph, node: Any) -> RootInfo | None:
    data, weight = (graph[i] for i in node.operands)
    if weight.shape is None or data.shape is None:
        return None
    # Batched weights may meet an input of another rank (a 2-D x broadcast over the weights' batch):
    # concatenating along N commutes with any broadcast, and the key keeps batch dims and ranks equal.
    family = "matmul" if len(weight.shape) == 2 else "batch_matmul"
    return matmul_root(family, data.shape, weight.shape, node.shape, False,
                       (data.dtype, weight.dtype, str(call.attrs.out_dtype)))


def _conv2d_root(call: relax.Call, graph: Graph, node: Any) -> RootInfo | None:
    a = call.attrs
    data, weight = (graph[i] for i in node.operands)
    return conv2d_root(
        str(a.data_layout), str(a.kernel_layout), str(a.out_layout), weight.shape, node.shape,
        [int(p) for p in a.padding], [int(s) for s in a.strides], [int(d) for d in a.dilation], int(a.groups),
        (str(a.out_dtype), data.dtype, weight.dtype),
    )
