"""Translate a Relay function body into the core's neutral :class:`Graph`."""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field
from typing import Any

import tvm
from tvm import relay

from ..core.graph import Dim, FollowerInfo, Graph, RootInfo, constant_key, ir_dtype_bits
from ..core.op_tables import COMMUTATIVE, FOLLOWERS
from ..core.root_specs import conv2d_root, matmul_root
from ..core.struct_key import StructKey, SymDim


class UnsupportedRegion(Exception):
    """The body holds control flow or closures: the passes leave such functions unchanged."""


class UntypedBody(Exception):
    """A node has no checked type yet: the module must go through ``InferType`` first."""


def checked_type(expr: Any) -> Any:
    """The type inference left on ``expr``; reading it spares a whole-module ``InferType``."""
    ty = read_field(expr, "_checked_type_")
    if ty is None:
        raise UntypedBody(type(expr).__name__)
    return ty


def struct_key(obj: Any) -> StructKey:
    return StructKey(obj, tvm.ir.structural_hash, tvm.ir.structural_equal)


_unknown = itertools.count()


_DTYPE_BITS = ir_dtype_bits(tvm.DataType)

# Reading TVM 0.16 objects is ctypes-bound: ``obj.handle.value`` costs a ``ctypes.cast`` (three
# times this call), iterating an Array costs a size call per element besides the item call, and
# ``obj.field`` goes through a Python ``__getattr__`` that costs as much as the read it wraps.
address = tvm.get_global_func("runtime.ObjectPtrHash")  # the object's address (an identity hash)
read_field = tvm.get_global_func("node.NodeGetAttr")
_ARRAY_ITEM = tvm.get_global_func("runtime.ArrayGetItem")
_ARRAY_SIZE = tvm.get_global_func("runtime.ArraySize")


def items(array: Any) -> list[Any]:
    """A TVM 0.16 Array as a list, one FFI call per element."""
    return [_ARRAY_ITEM(array, i) for i in range(_ARRAY_SIZE(array))]


def dims_of(ty: Any) -> tuple[Dim, ...] | None:
    """Static ints; every other dim (``?``, a ``tir.Var``, an expression of one) is a dim of its own.

    Type inference shares one Any object between dims that need not be equal at run time, so
    two ``?`` never compare equal: roots over dynamic batches still combine (their split axis is
    static), followers whose shapes involve ``?`` do not. A ``tir.Var`` is treated the same way:
    Relay's ``broadcast_to`` takes static ints only, and its type solver does not simplify
    arithmetic on them (a split part typed ``3 + n - 3`` does not unify with ``n``).
    """
    if not isinstance(ty, relay.TensorType):
        return None
    dims: list[Dim] = []
    for d in ty.shape:
        if isinstance(d, tvm.tir.IntImm):
            dims.append(int(d.value))
        else:
            dims.append(SymDim(f"?{next(_unknown)}"))
    return tuple(dims)


def _has_symbolic_vars(expr: Any) -> bool:
    """Whether ``expr``'s type has a dim that is a ``tir.Var`` or an expression of one (not ``?``)."""
    ty = checked_type(expr)
    return isinstance(ty, relay.TensorType) and any(
        not isinstance(d, (tvm.tir.IntImm, tvm.tir.Any)) for d in ty.shape)


def cannot_emit(graph: Graph, plan: Any) -> bool:
    """Plans Relay cannot type: inputs of ``n`` rows (a ``tir.Var``) joined with others for a shared
    weight come back out of the split typed ``3 + n - 3``, which Relay's solver does not unify with ``n``."""
    if plan.shares != "weight":
        return False
    return any(_has_symbolic_vars(graph[graph[r].operands[graph[r].root.data]].handle) for r in plan.roots)


def _is_unknown(dim: Dim) -> bool:
    return isinstance(dim, SymDim) and dim.name.startswith("?")


@dataclass
class BodyView:
    graph: Graph
    exprs: list[Any] = field(default_factory=list)  # node -> original expression
    leaves: set[int] = field(default_factory=set)
    arg_positions: dict[int, tuple[int, ...]] = field(default_factory=dict)
    # expression address -> node: an address is one cheap FFI call, a dict keyed by the object would
    # add its ``__eq__``; ``exprs`` keeps every object (and so its address) alive
    index: dict[int, int] = field(default_factory=dict)

    def expr_of(self, node: int) -> Any:
        return self.exprs[node]

    def node_of(self, expr: Any) -> int:
        return self.index[address(expr)]


def build_body_view(body: relay.Expr) -> BodyView:
    """Nodes in post order (a topological order); ``body`` itself escapes."""
    graph = Graph(dtype_bits=_DTYPE_BITS)
    view = BodyView(graph)
    index = view.index
    order: list[Any] = []
    # Type inference shares one type object between an op and its elementwise users, and ops are
    # interned: reading each once by address saves most of the FFI calls (ctypes in TVM 0.16).
    # The cached objects stay referenced, so no address is reused while the view is built.
    types: dict[int, tuple[Any, tuple[Dim, ...] | None, str | None]] = {}
    op_names: dict[int, tuple[Any, str]] = {}

    def collect(expr: Any) -> None:
        if isinstance(expr, (relay.Let, relay.If, relay.Function, relay.RefCreate, relay.RefRead, relay.RefWrite, relay.Match)):
            raise UnsupportedRegion(type(expr).__name__)
        if not isinstance(expr, tvm.ir.Op):
            order.append(expr)

    relay.analysis.post_order_visit(body, collect)
    for expr in order:
        if isinstance(expr, relay.Call):
            children = items(read_field(expr, "args"))
        elif isinstance(expr, relay.Tuple):
            children = items(read_field(expr, "fields"))
        elif isinstance(expr, relay.TupleGetItem):
            children = [read_field(expr, "tuple_value")]
        else:
            children = []
        deps = tuple(index[address(c)] for c in children)  # ordered, repeats kept: value numbering needs both
        ty = checked_type(expr)
        ty_address = address(ty)
        known = types.get(ty_address)
        if known is None:
            known = (ty, dims_of(ty), str(ty.dtype) if isinstance(ty, relay.TensorType) else None)
            if not any(_is_unknown(d) for d in known[1] or ()):
                types[ty_address] = known  # a ? stays a dim of its own for every node (see dims_of)
        kwargs: dict[str, Any] = {"shape": known[1], "dtype": known[2]}
        op = read_field(expr, "op") if isinstance(expr, relay.Call) else None
        if isinstance(op, tvm.ir.Op):
            # an argument is a tensor when its node has a dtype: no second read of its checked_type
            positions = tuple(i for i, d in enumerate(deps) if graph[d].dtype is not None)
            op_address = address(op)
            named = op_names.get(op_address)
            if named is None:
                named = op_names[op_address] = (op, op.name)
            name = named[1]
            attrs = read_field(expr, "attrs")
            attrs_key = struct_key(attrs)
            node = graph.add(
                op=name, operands=tuple(deps[i] for i in positions), deps=deps, value_key=(name, attrs_key), **kwargs,
            )
            view.arg_positions[node.index] = positions
            _classify(node, attrs, attrs_key, graph)
        elif isinstance(expr, (relay.Call, relay.Tuple, relay.TupleGetItem)):
            key = ("tuple",) if isinstance(expr, relay.Tuple) else ("get", expr.index) if isinstance(expr, relay.TupleGetItem) else None
            node = graph.add(op=type(expr).__name__, operands=(), deps=deps, value_key=key, **kwargs)
        else:  # Var, GlobalVar: leaves equal only to themselves; small constants compare by value
            key = constant_key(kwargs["shape"], expr.data.numpy) if isinstance(expr, relay.Constant) else None
            node = graph.add(op=type(expr).__name__, operands=(), deps=(), value_key=key, **kwargs)
            view.leaves.add(node.index)
        node.handle = expr
        index[address(expr)] = node.index
        view.exprs.append(expr)
    graph[view.node_of(body)].escapes = True
    return view


def _classify(node: Any, attrs: Any, attrs_key: StructKey, graph: Graph) -> None:
    name = node.op
    if name == "split":
        sections = attrs.indices_or_sections
        node.split_sections = int(sections) if isinstance(sections, (int, tvm.tir.IntImm)) else len(sections) + 1
    elif name == "reshape" and node.shape is not None and node.shape == graph[node.operands[0]].shape:
        node.follower = FollowerInfo(("identity",), identity=True)
    elif name == "nn.bias_add":
        rank = len(node.shape) if node.shape else 0
        node.follower = FollowerInfo((name,), operand_axes=((1, (int(attrs.axis) % max(rank, 1),)),))
    elif name in FOLLOWERS:
        node.follower = FollowerInfo((name, attrs_key), commutative=name in COMMUTATIVE)
    elif len(node.operands) == 2 and name in ("nn.dense", "nn.matmul", "nn.batch_matmul"):
        node.root = _matmul_root(name, attrs, graph, node)
    elif len(node.operands) == 2 and name == "nn.conv2d":
        node.root = _conv2d_root(attrs, graph, node)


def _matmul_root(name: str, attrs: Any, graph: Graph, node: Any) -> RootInfo | None:
    if name != "nn.dense" and bool(attrs.transpose_a):  # dense has no such attribute (a raised FFI error)
        return None  # matmul and batch_matmul: a transposed input is never read as [.., M, K]
    data, weight = (graph[i] for i in node.operands)
    family = "batch_matmul" if name == "nn.batch_matmul" else "dense"
    transposed = True if name == "nn.dense" else bool(attrs.transpose_b)
    root = matmul_root(family, data.shape, weight.shape, node.shape, transposed,
                       (name, data.dtype, weight.dtype, str(attrs.out_dtype)))
    if root is not None and not isinstance(root.width, int):
        return None  # a ? width: Relay's static split and concat need it known
    if root is not None and root.stack and not all(isinstance(d, int) for d in node.shape):
        root = dataclasses.replace(root, stack=None)  # unstacking reshapes to the branch shape: ? has none
    if root is not None and root.stack == "new" and len(data.shape) != 2:
        root = dataclasses.replace(root, stack=None)  # Relay's batch_matmul is 3-D: [1, M, K] at most
    if root is not None and root.stack and (data.dtype in EIGHT_BIT or weight.dtype in EIGHT_BIT):
        # TVM 0.16's x86 uint8 x int8 batch_matmul gets every batch after the first wrong when the
        # data's batch of 1 is broadcast over the weights' (seen with N % 16 == 0, K % 4 == 0);
        # concatenated along N the same branches are right
        root = dataclasses.replace(root, stack=None)
    return root


#: Data types of convolutions left alone: built with a plain ``relay.build`` for an x86 CPU without
#: VNNI, TVM 0.16's int8 conv2d adds pairs of products in saturating 16-bit sums (wrong in 33-99% of
#: the elements), and combining would move more branches onto it. The package's own builds widen
#: them (``runner.for_target``); Relax (TVM 0.27) computes both forms correctly, and its adapter
#: combines them.
EIGHT_BIT = ("int8", "uint8")


def _conv2d_root(attrs: Any, graph: Graph, node: Any) -> RootInfo | None:
    data, weight = (graph[i] for i in node.operands)
    if data.dtype in EIGHT_BIT or weight.dtype in EIGHT_BIT:
        return None
    return conv2d_root(
        str(attrs.data_layout), str(attrs.kernel_layout), str(attrs.out_layout) or str(attrs.data_layout),
        weight.shape, node.shape, [int(p) for p in attrs.padding], [int(s) for s in attrs.strides],
        [int(d) for d in attrs.dilation], int(attrs.groups), (str(attrs.out_dtype), data.dtype, weight.dtype),
    )
