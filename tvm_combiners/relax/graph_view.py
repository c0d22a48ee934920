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


_ARRAY_ITEM = tvm_ffi.get_global_func("ffi.ArrayGetItem")
_ARRAY_SIZE = tvm_ffi.get_global_func("ffi.ArraySize")


def items(array: Any) -> list[Any]:
    """An FFI array as a list: one FFI call per element, where iterating one costs three."""
    return [_ARRAY_ITEM(array, i) for i in range(_ARRAY_SIZE(array))]


def dims_of(ty: Any, shapes: dict[int, tuple[Any, tuple[Dim, ...]]]) -> tuple[Dim, ...] | None:
    """Static ints and :class:`SymDim` for a tensor type, or None when the shape is unknown.

    ``shapes`` maps shape handles to (shape, dims): ops that keep their input's shape share its
    ``ShapeExpr``, so a graph of thousands of tensors often has only a few hundred shapes.
    """
    if not isinstance(ty, relax.TensorType):
        return None
    shape = ty.shape
    if not isinstance(shape, relax.ShapeExpr):
        return None
    handle = shape.__chandle__()
    if handle not in shapes:  # the shape stays referenced: its address is not reused meanwhile
        shapes[handle] = shape, tuple(int(v.value) if isinstance(v, tvm.tirx.IntImm) else SymDim(v, struct_key(v))
                                      for v in items(shape.values))
    return shapes[handle][1]


def dtype_of(ty: Any) -> str | None:
    return str(ty.dtype) if isinstance(ty, relax.TensorType) else None


Constant = tvm.ir.expr.Constant


def constant_array(const: Any) -> np.ndarray:
    """The numpy value of a Relax constant (scalars come back as Python numbers in 0.27)."""
    value = const.value
    return np.asarray(value.numpy() if hasattr(value, "numpy") else value, dtype=str(const.ty.dtype))


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
    """Read every binding once.

    Nodes are found by object handle: a dict keyed by the Relax object would call its Python
    ``__eq__`` (which reads the type through the FFI) on every lookup, as each field read returns
    a fresh wrapper. A call whose arguments are all known vars and constants takes its free vars
    from the arguments; any other value asks ``free_vars``.
    """
    graph = Graph(dtype_bits=_DTYPE_BITS)
    bindings: list[Any] = []
    view = BlockView(graph, bindings)
    index: dict[int, int] = {}
    shapes: dict[int, tuple[Any, tuple[Dim, ...]]] = {}

    def leaf(expr: Any) -> int:
        handle = expr.__chandle__()
        if handle not in index:
            ty = expr.ty
            dims = dims_of(ty, shapes)
            key = constant_key(dims, lambda: constant_array(expr)) if isinstance(expr, Constant) else None
            node = graph.add(op=type(expr).__name__, operands=(), deps=(), shape=dims, dtype=dtype_of(ty),
                             value_key=key, handle=expr)
            index[handle] = node.index
            bindings.append(None)
        return index[handle]

    def known(args: list[Any]) -> bool:
        return all(isinstance(a, Constant) or a.__chandle__() in index for a in args)

    def free_vars(value: Any, args: list[Any] | None) -> list[int]:
        if args is None or not known(args):
            free = [leaf(v) for v in relax.analysis.free_vars(value)]
            if args is None or not known(args):  # a shape or a tuple among the args
                return free
        # the same list for the same call, whether or not its vars were seen before
        return list(dict.fromkeys(index[a.__chandle__()] for a in args if not isinstance(a, Constant)))

    for binding in items(block.bindings):
        value, var = binding.value, binding.var
        is_op_call = isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)
        args = items(value.args) if is_op_call else None
        free = free_vars(value, args)
        operands: list[int] = []
        positions: list[int] = []
        op_name, value_key = type(value).__name__, None
        if isinstance(value, relax.Call) and isinstance(binding, relax.VarBinding):
            if args is None:
                args = items(value.args)
            for pos, arg in enumerate(args):
                # prim values and strings are Constants too in 0.27: attributes, never nodes
                tensor_constant = isinstance(arg, Constant) and isinstance(arg.ty, relax.TensorType)
                if tensor_constant or (isinstance(arg, relax.Var) and arg.__chandle__() in index):
                    operand = leaf(arg)
                    if graph[operand].dtype is not None:  # a tensor (a shape or prim var is an attribute)
                        operands.append(operand)
                        positions.append(pos)
            others = tuple((pos, struct_key(a)) for pos, a in enumerate(args) if pos not in positions)
            op_name = value.op.name if is_op_call else str(value.op)
            value_key = (op_name, struct_key(value.attrs), others, struct_key(items(value.ty_args)))
        deps = tuple(operands + free)  # ordered, repeats kept: value numbering needs both
        ty = var.ty
        node = graph.add(
            op=op_name.removeprefix("relax."),
            operands=tuple(operands),
            deps=deps,
            shape=dims_of(ty, shapes),
            dtype=dtype_of(ty),
            value_key=value_key,
            escapes=not isinstance(var, relax.DataflowVar),
            handle=var,
        )
        index[var.__chandle__()] = node.index
        bindings.append(binding)
        view.arg_positions[node.index] = tuple(positions)
        if is_op_call and value_key is not None:
            _classify(node, value, others, graph)
    return view


def _classify(node: Any, call: relax.Call, others: tuple[tuple[int, StructKey], ...], graph: Graph) -> None:
    name = node.op
    if name == "split":
        sections = call.attrs.indices_or_sections
        node.split_sections = int(sections) if isinstance(sections, (int, tvm.tirx.IntImm)) else len(sections) + 1
    elif name in FOLLOWERS:
        others = tuple(key for _, key in others)
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
