"""Translate one Relax dataflow block into the core's neutral :class:`Graph`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import tvm
import tvm_ffi
from tvm import relax

from ..core.graph import Dim, FollowerInfo, Graph, Node, RootInfo, constant_key, ir_dtype_bits
from ..core.op_tables import COMMUTATIVE, FOLLOWERS
from ..core.root_specs import conv2d_root, matmul_root
from ..core.struct_key import StructKey, SymDim


def struct_key(obj: Any) -> StructKey:
    return StructKey(obj, tvm_ffi.structural_hash, tvm_ffi.structural_equal)


_DTYPE_BITS = ir_dtype_bits(tvm.DataType)


_ARRAY_ITEM = tvm_ffi.get_global_func("ffi.ArrayGetItem")
_ARRAY_SIZE = tvm_ffi.get_global_func("ffi.ArraySize")


# registered ops live as long as the process, so names are cached by handle (holding the op keeps
# the handle from being reused); reading ``op.name`` costs an FFI call per binding otherwise
_OP_NAMES: dict[int, tuple[Any, str]] = {}


def op_name(op: Any) -> str:
    """The name of a registered op, read once per op."""
    handle = op.__chandle__()
    known = _OP_NAMES.get(handle)
    if known is None:
        known = _OP_NAMES[handle] = (op, op.name)
    return known[1]


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


def dtype_of(ty: Any, dtypes: dict[int, tuple[Any, str]]) -> str | None:
    """The dtype's name; ``dtypes`` maps dtype handles to (dtype, name), since tensor types share
    their dtype object and printing one costs ten times reading its handle."""
    if not isinstance(ty, relax.TensorType):
        return None
    dtype = ty.dtype
    handle = dtype.__chandle__()
    if handle not in dtypes:  # kept referenced, as in dims_of
        dtypes[handle] = dtype, str(dtype)
    return dtypes[handle][1]


#: The key of a call without type arguments (almost every call): hashing an empty array is not free.
_NO_TY_ARGS = struct_key([])


Constant = tvm.ir.expr.Constant


def constant_array(const: Any) -> np.ndarray:
    """The numpy value of a Relax constant (scalars come back as Python numbers in 0.27): a view of
    a CPU tensor's memory where numpy reads its dtype through DLPack, else a copy."""
    value = const.value
    if hasattr(value, "__dlpack__"):
        try:
            view = np.from_dlpack(value)
        except (TypeError, ValueError, BufferError, RuntimeError):  # a dtype numpy lacks (bfloat16), a device
            pass
        else:
            view.flags.writeable = False  # the module's own constant: never to be changed through this
            return view
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
    """Read every binding once, in order: its var's node follows the leaves it reads first."""
    reader = _BlockReader()
    for binding in items(block.bindings):
        reader.add_binding(binding)
    return reader.view


class _Args(NamedTuple):
    """What one pass over a call's arguments finds."""

    read: list[int]  # the nodes of the vars the args read, in order, repeats kept
    operands: list[Any]  # tensor args: nodes, or tensor constants not yet made leaves
    positions: list[int]  # the argument index of each operand
    others: list[tuple[int, StructKey]]  # (index, key) of every other arg: attributes of the call


class _Parts(NamedTuple):
    """The fields of a binding's node that come from its value."""

    name: str
    operands: list[int]
    positions: list[int]
    value_key: tuple[Any, ...] | None  # (name, attrs, others, type args) for a call bound to a var


class _BlockReader:
    """Builds one block's :class:`BlockView`, one binding at a time.

    Nodes are found by object handle: a dict keyed by the Relax object would call its Python
    ``__eq__`` (which reads the type through the FFI) on every lookup, as each field read returns
    a fresh wrapper.
    """

    def __init__(self) -> None:
        self.graph = Graph(dtype_bits=_DTYPE_BITS)
        self.view = BlockView(self.graph, [])
        self.index: dict[int, int] = {}  # var or constant handle -> node
        self.shapes: dict[int, tuple[Any, tuple[Dim, ...]]] = {}  # see dims_of
        self.dtypes: dict[int, tuple[Any, str]] = {}  # see dtype_of
        # symbolic dim handle -> (dim, the match_cast in this block that names it first): a binding
        # using the dim must stay after that cast, though it reads none of its values
        self.dims_cast: dict[int, tuple[Any, int]] = {}

    def add_binding(self, binding: Any) -> None:
        """Add the node of one binding, with the leaves it reads first."""
        value, var = binding.value, binding.var
        is_call = isinstance(value, relax.Call)
        op = value.op if is_call else None
        args = items(value.args) if is_call else None
        is_op_call = isinstance(op, tvm.ir.Op)
        is_var_call = is_call and isinstance(binding, relax.VarBinding)
        free, read = self.reads(value, args, is_op_call, is_var_call)
        if is_var_call:
            parts = self.call_parts(value, op, read, is_op_call)
        else:
            parts = _Parts(type(value).__name__, [], [], None)
        node = self.add_node(binding, value, var, parts, free)
        if is_op_call and is_var_call:
            _classify(node, value, parts.value_key[1], parts.value_key[2], self.graph)

    def reads(self, value: Any, args: list[Any] | None, is_op_call: bool,
              is_var_call: bool) -> tuple[list[int], _Args | None]:
        """The nodes ``value`` reads, and the args of a call bound to a var, read in one pass."""
        # An op call whose args are all vars and constants takes its free vars from the args, in
        # their order: the same list for the same call, whether or not its vars were seen before.
        # Any other value asks ``free_vars`` (which makes its vars leaves).
        read = self.read_args(args, strict=True) if is_op_call else None
        if read is None:
            free = self.free_var_nodes(value)
            read = self.read_args(args, strict=True) if is_op_call else None
        if read is not None:
            free = list(dict.fromkeys(read.read))
        elif is_var_call:
            read = self.read_args(args, strict=False)
        return free, read

    def read_args(self, args: list[Any], strict: bool) -> _Args | None:
        """Sort the args into vars read, tensor operands and attributes; strict: None on any other arg."""
        # ``strict`` gives up on an arg that is neither a known var nor a constant (a shape or a
        # tuple): the caller then asks ``free_vars``; otherwise such an arg is an attribute
        index, nodes = self.index, self.graph.nodes
        found = _Args([], [], [], [])
        for pos, arg in enumerate(args):
            if isinstance(arg, Constant):  # prim values and strings are Constants too in 0.27: attributes
                if isinstance(arg.ty, relax.TensorType):
                    found.operands.append(arg)
                    found.positions.append(pos)
                else:
                    found.others.append((pos, struct_key(arg)))
                continue
            node = index.get(arg.__chandle__())
            if node is None:
                if strict:
                    return None
                found.others.append((pos, struct_key(arg)))
                continue
            found.read.append(node)
            if nodes[node].dtype is not None:  # a tensor (a shape or prim var is an attribute)
                found.operands.append(node)
                found.positions.append(pos)
            else:
                found.others.append((pos, struct_key(arg)))
        return found

    def free_var_nodes(self, value: Any) -> list[int]:
        """The nodes of ``value``'s free vars, in ``free_vars`` order; vars not seen yet become leaves."""
        return [self.leaf(v) for v in relax.analysis.free_vars(value)]

    def leaf(self, expr: Any) -> int:
        """The node of a var or constant defined outside the block, added on first use."""
        handle = expr.__chandle__()
        if handle not in self.index:
            ty = expr.ty
            dims = dims_of(ty, self.shapes)
            key = constant_key(dims, lambda: constant_array(expr)) if isinstance(expr, Constant) else None
            node = self.graph.add(op=type(expr).__name__, operands=(), deps=(), shape=dims,
                                  dtype=dtype_of(ty, self.dtypes), value_key=key, handle=expr)
            self.index[handle] = node.index
            self.view.bindings.append(None)
        return self.index[handle]

    def call_parts(self, call: relax.Call, op: Any, args: _Args, is_op_call: bool) -> _Parts:
        """The name, operand nodes (constants made leaves) and value key of a call bound to a var."""
        operands = [o if isinstance(o, int) else self.leaf(o) for o in args.operands]
        others = tuple(args.others)
        name = op_name(op) if is_op_call else str(op)
        ty_args = call.ty_args
        value_key = (name, struct_key(call.attrs), others,
                     struct_key(items(ty_args)) if _ARRAY_SIZE(ty_args) else _NO_TY_ARGS)
        return _Parts(name, operands, args.positions, value_key)

    def add_node(self, binding: Any, value: Any, var: Any, parts: _Parts, free: list[int]) -> Node:
        """Add the node of ``var`` and record what later bindings and the rewrite look up about it."""
        ty = var.ty
        if self.dims_cast:
            free = free + [n for n in self.cast_nodes(value, ty) if n not in free]
        node = self.graph.add(
            op=parts.name.removeprefix("relax."),
            operands=tuple(parts.operands),
            deps=tuple(parts.operands + free),  # ordered, repeats kept: value numbering needs both
            shape=dims_of(ty, self.shapes),
            dtype=dtype_of(ty, self.dtypes),
            value_key=parts.value_key,
            escapes=not isinstance(var, relax.DataflowVar),
            handle=var,
        )
        self.index[var.__chandle__()] = node.index
        self.view.bindings.append(binding)
        if isinstance(binding, relax.MatchCast):
            self.record_cast_dims(binding, node.index)
        self.view.arg_positions[node.index] = tuple(parts.positions)
        return node

    def cast_nodes(self, value: Any, ty: Any) -> list[int]:
        """The match_casts of this block that first name a symbolic dim used by ``value`` or ``ty``."""
        used = [*relax.analysis.free_symbolic_vars(value), *relax.analysis.tir_vars_in_type(ty)]
        casts = self.dims_cast
        return list(dict.fromkeys(casts[h][1] for v in used if (h := v.__chandle__()) in casts))

    def record_cast_dims(self, cast: relax.MatchCast, node: int) -> None:
        """Make ``node`` the cast naming each symbolic dim of ``cast``'s type that none named before."""
        for dim in relax.analysis.tir_vars_in_type(cast.ty):
            self.dims_cast.setdefault(dim.__chandle__(), (dim, node))


def _classify(node: Any, call: relax.Call, attrs: StructKey, others: tuple[tuple[int, StructKey], ...],
              graph: Graph) -> None:
    name = node.op
    if name == "split":
        sections = call.attrs.indices_or_sections
        node.split_sections = int(sections) if isinstance(sections, (int, tvm.tirx.IntImm)) else len(sections) + 1
    elif name in FOLLOWERS:  # other args keep their positions: subtract(y, 2.0) is not subtract(2.0, y)
        node.follower = FollowerInfo((name, attrs, others), commutative=name in COMMUTATIVE)
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
