"""Collective ops in Relax (apache-tvm 0.27): builders, registration, type inference, lowering.

Ops ``relax.collectives.<kind>`` print as ``R.collectives.allreduce(x, groups="", op="sum")``;
their attributes are ``ir.DictAttrs`` (see :mod:`..spec` for the layout), so calls compare and hash
structurally and :func:`info` reads them back as a :class:`~..spec.CollectiveSpec`.

Side effects: allreduce, allgather, reduce_scatter, send and recv are registered impure
(``FPurity`` False): they live outside dataflow blocks, in functions marked ``pure=False``, and
DeadCodeElimination and CSE leave them alone. Their lowering (``FLegalize``) stays impure too:
``out = R.builtin.alloc_tensor(...)`` then ``R.call_packed("tvm_combiners.<kind>", ..., out)``, which
the default pipeline never drops (``call_dps_packed`` is pure and would be). ``after_all`` is pure
and lowers to a constant token: tokens only order the IR.

Deadlock freedom: run :func:`OrderSendRecv` before legalization (or use :func:`pipeline`, which
puts it in front of TVM's default pipeline). If a module reaches legalization with a recv placed
before the send it matches, legalization stops with an error naming ``OrderSendRecv`` instead of
producing a program that waits forever.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import tvm
from tvm import ir, relax, tirx
from tvm.relax.utils import convert_to_expr
from tvm.sym import Analyzer

from ...compile.pipelines import default_pipeline
from ...core.driver import gc_paused
from ...relax.graph_view import op_name
from ...relax.module import with_functions
from .. import spec as S
from ..builders import IRAdapter, make_builders
from ..dependences import UnitAccess, _Buffers, unit_dependences
from ..ordering import OrderNode, OrderPlan, SendRecvOrderError, is_deadlock_free, payload, plan_send_recv_order

__all__ = [
    "allreduce",
    "allgather",
    "reduce_scatter",
    "send",
    "recv",
    "after_all",
    "token",
    "info",
    "is_collective",
    "OrderSendRecv",
    "pipeline",
]


# --------------------------------------------------------------------------- types


def _type_of(expr: relax.Expr) -> Any:
    ty = getattr(expr, "ty", None)
    if ty is None or type(ty) is ir.Type:  # not normalized yet: infer it now
        ty = relax.BlockBuilder().normalize(expr).ty
    return ty


def _dims(ty: Any) -> tuple[list[Any] | None, str | None]:
    """(dims, dtype) of a tensor type: ints for static extents, PrimExprs otherwise; None if no tensor."""
    if not isinstance(ty, relax.TensorType) or ty.ndim < 0:
        return None, None if not isinstance(ty, relax.TensorType) else str(ty.dtype)
    if ty.shape is None:  # rank known, extents not even symbolic: an opaque marker per axis
        return [_UNKNOWN] * ty.ndim, str(ty.dtype)
    dims = [int(d) if isinstance(d, tirx.IntImm) else d for d in ty.shape.values]
    return dims, str(ty.dtype)


class _Unknown:
    """An extent the type does not name (``R.Tensor(ndim=2)``)."""

    def __repr__(self) -> str:
        return "?"


_UNKNOWN = _Unknown()


def _out_type(dims: Sequence[Any], dtype: str) -> relax.TensorType:
    if any(d is _UNKNOWN for d in dims):
        return relax.TensorType(None, dtype, ndim=len(dims))
    return relax.TensorType(list(dims), dtype)


def _describe(ty: Any) -> str:
    return str(ty) if ty is not None else "nothing"


def _check_tensor(kind: str, what: str, ty: Any) -> tuple[list[Any], str]:
    dims, dtype = _dims(ty)
    if dims is None or dtype is None:
        raise S.CollectiveError(f"{kind}: {what} must be a tensor of known rank, got {_describe(ty)}")
    return dims, dtype


def _check_token(kind: str, what: str, ty: Any) -> None:
    dims, dtype = _dims(ty)
    S.check_token(kind, what, dims, dtype)


def _fields(ty: Any) -> list[Any] | None:
    return list(ty.fields) if isinstance(ty, relax.TupleType) else None


_TYPES = S.OperandTypes(_check_tensor, _check_token, _fields, _describe)


# --------------------------------------------------------------------------- registration


def _infer(call: relax.Call, _bb: relax.BlockBuilder) -> relax.TensorType:
    kind = S.kind_of_op_name(call.op.name)
    assert kind is not None
    spec = S.CollectiveSpec.from_attrs(kind, call.attrs)
    return _out_type(*S.infer_call_type(spec, [_type_of(arg) for arg in call.args], _TYPES))


def _legalize(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    kind = S.kind_of_op_name(call.op.name)
    assert kind is not None
    if kind == "after_all":
        return relax.const(0, S.TOKEN_DTYPE)
    _check_module_order(bb.get())  # once per module: dataflow blocks, and recvs after their sends
    spec = S.CollectiveSpec.from_attrs(kind, call.attrs)
    name, extra = spec.runtime_call()
    ty = call.ty
    inputs = [] if kind == "recv" else [call.args[0]]
    shape = ty.shape
    if shape is None:  # allreduce of an R.Tensor(ndim=k): name the extents so the output can be allocated
        dims = [tirx.Var(f"n{i}", "int64") for i in range(ty.ndim)]
        inputs = [bb.match_cast(call.args[0], relax.TensorType(dims, str(ty.dtype)))]
        shape = relax.ShapeExpr(dims)
    if kind not in S.P2P_KINDS and not _static(_type_of(inputs[0])):  # MPI would not notice ranks that disagree
        groups = S.encode_groups(spec.groups)
        bb.emit(relax.Call(relax.ExternFunc(S.AGREE_SHAPES), [inputs[0], convert_to_expr(kind), convert_to_expr(groups)],
                           ty_args=[relax.ObjectType()]))
    if _native_target():
        lowered = _NATIVE[kind](bb, spec, inputs, shape, str(ty.dtype))
        if lowered is not None:
            return lowered
    out = bb.emit(relax.op.builtin.alloc_tensor(shape, str(ty.dtype), 0))
    bb.emit(relax.Call(relax.ExternFunc(name), [*inputs, *(convert_to_expr(e) for e in extra), out],
                       ty_args=[relax.ObjectType()]))
    return out


def _static(ty: Any) -> bool:
    dims, _ = _dims(ty)
    return dims is not None and all(isinstance(d, int) for d in dims)


# --------------------------------------------------------------------------- native lowering
# Host collectives compiled for llvm call the runtime's native kernels (runtime/native.py: MPI from
# compiled code, no Python): the IR names groups by key and text, pairs as a constant, dtypes and
# reductions by position, so the module runs in any process. Anything they cannot run (cuda, dtypes
# or reductions MPI does not compute as the generic path does, check mode, no MPICH here) keeps
# the generic runtime function.


def _native_target() -> bool:
    from ..runtime import native

    target = tvm.target.Target.current(allow_none=True)
    return native.ENABLED and target is not None and target.kind.name == "llvm"


def _emit_native(bb: relax.BlockBuilder, kind: str, args: Sequence[relax.Expr]) -> None:
    from ..runtime import native

    bb.emit(relax.Call(relax.ExternFunc(native.NAMES[kind]), list(args), ty_args=[relax.ObjectType()]))


def _alloc(bb: relax.BlockBuilder, shape: Any, dtype: str) -> relax.Var:
    shape = shape if isinstance(shape, relax.ShapeExpr) else relax.ShapeExpr(list(shape))
    return bb.emit(relax.op.builtin.alloc_tensor(shape, dtype, 0))


def _int(value: Any, dtype: str = "int64") -> relax.Expr:
    """A scalar argument: a constant where it is one (a PrimExpr would be computed at every call)."""
    if not isinstance(value, int):
        value = Analyzer().simplify(tirx.Cast(dtype, value))  # a cast to its own dtype simplifies away
        if isinstance(value, tirx.IntImm):
            value = int(value)
    return relax.prim_value(tirx.IntImm(dtype, value) if isinstance(value, int) else value)


def _count(dims: Sequence[Any]) -> Any:
    """The element count of a shape (an int, or a PrimExpr where an extent is symbolic)."""
    count: Any = 1
    for d in dims:
        count = count * (int(d) if isinstance(d, tirx.IntImm) else d)
    return count


def _itemsize(dtype: str) -> int | None:
    """Bytes per element, None for a dtype MPI cannot move as whole bytes (int4, vector lanes)."""
    t = tvm.DataType(dtype)
    if t.lanes != 1:
        return None
    if t.bits == 1 and str(dtype) == "bool":
        return 1  # stored as a byte
    return t.bits // 8 if t.bits % 8 == 0 else None


def _shape_of(expr: relax.Expr) -> list[Any] | None:
    """An operand's extents (ints, or PrimExprs), None where they are not all named."""
    dims, _ = _dims(_type_of(expr))
    return None if dims is None or any(d is _UNKNOWN for d in dims) else dims


def _group_args(spec: S.CollectiveSpec) -> list[relax.Expr]:
    from ..runtime import native

    text = S.encode_groups(spec.groups)
    return [_int(native.group_key(text)), relax.const(native.text_bytes(text))]


def _ready(dtype: str) -> bool:
    """The kernels exist in this process (built now, so that VMs created here call them)."""
    from ..runtime import native

    return _itemsize(dtype) is not None and native.prepare()


def _native_allreduce(bb: relax.BlockBuilder, spec: S.CollectiveSpec, inputs: list, shape: relax.ShapeExpr,
                      dtype: str) -> relax.Expr | None:
    from ..runtime import native

    codes = native.codes(spec.op, dtype)
    if codes is None or not _ready(dtype):
        return None
    out = _alloc(bb, shape, dtype)
    args = [inputs[0], out, _int(_count(shape.values)), _int(codes[1], "int32"), _int(codes[0], "int32")]
    if spec.groups is None:
        _emit_native(bb, "allreduce", args)
    else:
        _emit_native(bb, "allreduce_group", [*args, *_group_args(spec)])
    return out


def _leading_one(dims: Sequence[Any], axis: int) -> bool:
    """Whether every extent before ``axis`` is 1: each rank's block is then contiguous in the result."""
    return all(isinstance(d, int) and d == 1 for d in dims[:axis])


def _native_allgather(bb: relax.BlockBuilder, spec: S.CollectiveSpec, inputs: list, shape: relax.ShapeExpr,
                      dtype: str) -> relax.Expr | None:
    dims = _shape_of(inputs[0])
    if dims is None or spec.groups is None or not _ready(dtype):
        return None
    from tvm import topi

    g, axis = len(spec.groups[0]), int(spec.axis or 0)
    nbytes = _int(_count(dims) * _itemsize(dtype))
    if _leading_one(dims, axis):  # the blocks land in place
        out = _alloc(bb, shape, dtype)
        _emit_native(bb, "allgather", [inputs[0], out, nbytes, *_group_args(spec)])
        return out
    blocks = _alloc(bb, [g, *dims], dtype)  # gathered in group order, then each block moved to its place
    _emit_native(bb, "allgather", [inputs[0], blocks, nbytes, *_group_args(spec)])
    perm = [*range(1, axis + 1), 0, *range(axis + 1, len(dims) + 1)]
    return bb.emit_te(lambda b: topi.reshape(topi.transpose(b, perm), list(shape.values)), blocks,
                      primfunc_name_hint="allgather_blocks")


def _native_reduce_scatter(bb: relax.BlockBuilder, spec: S.CollectiveSpec, inputs: list, shape: relax.ShapeExpr,
                           dtype: str) -> relax.Expr | None:
    from ..runtime import native

    dims = _shape_of(inputs[0])
    codes = native.codes(spec.op, dtype)
    if dims is None or codes is None or spec.groups is None or not _ready(dtype):
        return None
    from tvm import topi

    g, axis = len(spec.groups[0]), int(spec.axis or 0)
    x = inputs[0]
    if not _leading_one(dims, axis):  # each member's chunk made contiguous, in member order
        split = [*dims[:axis], g, dims[axis] // g, *dims[axis + 1:]]
        perm = [axis, *range(axis), *range(axis + 1, len(split))]
        x = bb.emit_te(lambda a: topi.transpose(topi.reshape(a, split), perm), x,
                       primfunc_name_hint="reduce_scatter_blocks")
    out = _alloc(bb, shape, dtype)
    _emit_native(bb, "reduce_scatter", [x, out, _int(_count(shape.values)), _int(codes[1], "int32"),
                                        _int(codes[0], "int32"), *_group_args(spec)])
    return out


@dataclasses.dataclass
class _P2PLowering:
    """One legalization run's native sends and recvs (``bb`` is the run's builder).

    ``channels``: those whose transfers may go native. ``posted``: per channel, the payload and the
    request (the send's result, an int) of each native send whose recv is still to come. LegalizeOps visits a function's
    bindings in order, and every send comes before the recv matched with it (the k-th of the channel
    in the function), so each recv takes the first send posted on its channel.
    """

    bb: relax.BlockBuilder
    channels: set[int]
    posted: dict[int, list[tuple[relax.Expr, relax.Expr]]]


_p2p_run: list[_P2PLowering] = []


def _p2p_lowering(bb: relax.BlockBuilder) -> _P2PLowering:
    if not _p2p_run or not _p2p_run[0].bb.same_as(bb):
        _p2p_run[:] = [_P2PLowering(bb, _native_channels(bb.get()), {})]
    return _p2p_run[0]


def _native_channels(mod: tvm.IRModule) -> set[int]:
    """Channels whose sends may hand MPI their payload itself, for the matched recv to complete.

    Every send of the channel must (a mix would let a native recv take a generic send's place in
    the pairing and wait for the wrong send). Not a channel two functions use (a function's recv
    would complete its own send only, while MPI pairs messages across the two: each rank's recv
    would wait for a send that the other rank's later recv takes), nor one with a send whose payload
    (or a buffer sharing it) something may write in place before its recv (MPI may still be reading
    it; the generic send copies), nor one whose payload's extents or byte size are not known."""
    users: dict[int, int] = {}
    refused: set[int] = set()
    for gv, func in mod.functions_items():
        planned = _plan(gv.name_hint, func)
        if planned is None:
            continue
        units, plan = planned
        access = [unit_access(u, b) for u, b in units]
        buffers = _Buffers()
        for a in access:
            for d in a.defines:
                for alias in a.aliases:
                    buffers.join(d, alias)
        for matches in plan.channels:
            channel = info(units[matches[0][0]][0].value).channel_id
            users[channel] = users.get(channel, 0) + 1
            for s, r in matches:
                x = units[s][0].value.args[0]
                root = buffers.find(x)
                if (_payload_bytes(x) is None
                        or any(buffers.find(w) == root for a in access[s + 1:r] for w in a.writes)):
                    refused.add(channel)
    return {c for c, n in users.items() if n == 1} - refused


def _payload_bytes(x: relax.Expr) -> Any:
    """A payload's byte count (an int, or a PrimExpr), None where its extents or dtype are not known."""
    dims = _shape_of(x)
    _, dtype = _dims(_type_of(x))
    size = None if dtype is None else _itemsize(dtype)
    return None if dims is None or size is None else _count(dims) * size


def _pairs_args(spec: S.CollectiveSpec) -> tuple[relax.Expr, relax.Expr]:
    import numpy as np

    pairs = np.array(spec.pairs or [(0, 0)], "int32").reshape(-1)  # never empty: a constant needs an element
    return relax.const(pairs), _int(len(spec.pairs or ()), "int32")


def _native_send(bb: relax.BlockBuilder, spec: S.CollectiveSpec, inputs: list, shape: relax.ShapeExpr,
                 dtype: str) -> relax.Expr | None:
    from ..runtime import native

    run = _p2p_lowering(bb)
    if spec.channel_id not in run.channels or not native.prepare():  # every send of the channel, or none
        return None
    pairs, npairs = _pairs_args(spec)
    request = bb.emit(relax.Call(relax.ExternFunc(native.NAMES["send"]), [inputs[0], pairs, npairs,
                                 _int(_payload_bytes(inputs[0])), _int(spec.channel_id, "int32")],
                                 ty_args=[ir.PrimType("int32")]))
    run.posted.setdefault(spec.channel_id, []).append((inputs[0], request))
    return relax.const(0, S.TOKEN_DTYPE)  # tokens only order the IR, and this call stays where it is (impure)


def _native_recv(bb: relax.BlockBuilder, spec: S.CollectiveSpec, inputs: list, shape: relax.ShapeExpr,
                 dtype: str) -> relax.Expr | None:
    from ..runtime import native

    run = _p2p_lowering(bb)
    posted = run.posted.get(spec.channel_id)
    if not posted:
        if spec.channel_id in run.channels and native.prepare():  # a native send must be completed by its recv
            raise SendRecvOrderError(f"recv on channel_id {spec.channel_id}: its native send was not lowered first")
        return None  # its send went the generic way
    x, request = posted.pop(0)
    size = _itemsize(dtype)
    if size is None:  # the send's dtype moves as bytes, and OrderSendRecv matched the two dtypes
        raise SendRecvOrderError(f"recv on channel_id {spec.channel_id}: {dtype} does not match its native send")
    pairs, npairs = _pairs_args(spec)
    out = _alloc(bb, shape, dtype)
    _emit_native(bb, "recv", [x, pairs, out, npairs, _int(_count(shape.values) * size), _int(spec.channel_id, "int32"),
                              request])
    return out


_NATIVE = {"allreduce": _native_allreduce, "allgather": _native_allgather, "reduce_scatter": _native_reduce_scatter,
           "send": _native_send, "recv": _native_recv}


def _register() -> None:
    """Register every op once; importing this module again leaves the registry as it is."""
    for kind in S.KINDS:
        name = S.relax_op_name(kind)
        try:
            op = ir.Op.get(name)
        except Exception:  # noqa: BLE001 - Op.get raises a TVM error for unknown ops
            ir._ffi_api.RegisterOp(name, f"tvm_combiners collective op {kind}")
            op = ir.Op.get(name)
        if op.get_attr("FInferType") is None:
            ir.register_op_attr(name, "FInferType", _infer)
        if op.get_attr("FPurity") is None:
            ir.register_op_attr(name, "FPurity", kind not in S.IMPURE_KINDS)
        if op.get_attr("FLegalize") is None:
            ir.register_op_attr(name, "FLegalize", _legalize)
        if op.get_attr("RequiresArgumentShapes") is None:  # legalize R.Tensor(ndim=k) operands too
            ir.register_op_attr(name, "RequiresArgumentShapes", False)


_register()


# --------------------------------------------------------------------------- builders


def _call(spec: S.CollectiveSpec, args: Sequence[relax.Expr]) -> relax.Call:
    return relax.Call(ir.Op.get(spec.op_name_relax), list(args), ir.make_node("ir.DictAttrs", **spec.attrs()))


def token() -> relax.Expr:
    """A fresh token (orders nothing): what ``token=None`` stands for."""
    return relax.const(0, S.TOKEN_DTYPE)


allreduce, allgather, reduce_scatter, send, recv, after_all = make_builders(
    IRAdapter("Relax", relax.Expr, _type_of, _TYPES, _call, relax.Tuple, token), __name__
)


# --------------------------------------------------------------------------- read back


#: op name -> kind; :func:`info` reads names through ``op_name``, which caches them per op (a
#: name read through the FFI costs more than the rest of :func:`info`, called on every expression)
_KIND_OF_OP = {S.relax_op_name(kind): kind for kind in S.KINDS}


def info(expr: Any) -> S.CollectiveSpec | None:
    """The spec of a collective call (kind, reduction, axis, groups, pairs, ...), None otherwise."""
    if not isinstance(expr, relax.Call):
        return None
    op = expr.op
    if not isinstance(op, ir.Op):
        return None
    kind = _KIND_OF_OP.get(op_name(op))
    return None if kind is None else S.CollectiveSpec.from_attrs(kind, expr.attrs)


def is_collective(expr: Any, kinds: Sequence[str] = S.KINDS) -> bool:
    spec = info(expr)
    return spec is not None and spec.kind in kinds


# --------------------------------------------------------------------------- ordering pass


def _units(body: relax.SeqExpr) -> list[tuple[Any, bool]]:
    """The body's units in order: (binding, False) outside dataflow, (block, True) per dataflow block."""
    out: list[tuple[Any, bool]] = []
    for block in body.blocks:
        if isinstance(block, relax.DataflowBlock):
            out.append((block, True))
        else:
            out.extend((b, False) for b in block.bindings)
    return out


_IN_PLACE = {"relax.call_tir_inplace": lambda call: list(call.args[1].fields),
             "relax.call_inplace_packed": lambda call: list(call.args[1:])}


_TYPED = (relax.Var, relax.ShapeExpr, relax.Call)


def _binding_access(binding: Any, known_effects: bool) -> tuple[list, list, list, list]:
    """(reads, defines, writes, aliases) of one binding; see :func:`unit_access`."""
    value = binding.value
    free = list(relax.analysis.free_vars(value))
    reads: list = list(free)
    writes: list = []

    def visit(e: Any) -> None:
        ty = getattr(e, "ty", None) if isinstance(e, _TYPED) else None
        if ty is not None and type(ty) is not ir.Type:  # the bare base class: an unset (missing) type
            reads.extend(relax.analysis.tir_vars_in_type(ty))  # symbolic dims, as shapes and types name them
        if isinstance(e, relax.Call) and isinstance(e.op, ir.Op) and e.op.name in _IN_PLACE:
            args = _IN_PLACE[e.op.name](e)
            writes.extend(args[int(i)] for i in e.attrs.inplace_indices if int(i) >= 0 and int(i) < len(args))

    relax.analysis.post_order_visit(value, visit)
    reads.extend(relax.analysis.tir_vars_in_type(binding.var.ty))
    defines: list = [binding.var]
    if isinstance(binding, relax.MatchCast):
        defines.extend(relax.analysis.tir_vars_in_type(binding.ty))  # the first cast naming a dim defines it
    if not known_effects and relax.analysis.contains_impure_call(value):
        writes.extend(free)  # an opaque call may write what it is given
    elif isinstance(value, relax.Call) and isinstance(value.op, ir.GlobalVar):
        writes.extend(free)  # so may a function of the module, in place
    writes = [w for w in writes if isinstance(w, relax.Var)]
    aliases = list(writes)
    if isinstance(value, relax.Var):
        aliases.append(value)  # another name, same buffer
    elif isinstance(value, relax.TupleGetItem) and isinstance(value.tuple_value, relax.Var):
        aliases.append(value.tuple_value)  # a field: a write to it is a write to the tuple, and back
    elif isinstance(value, relax.Tuple):
        aliases.extend(f for f in value.fields if isinstance(f, relax.Var))
    return reads, defines, writes, aliases


def unit_access(unit: Any, is_block: bool) -> UnitAccess:
    """What a unit (a binding, or a whole dataflow block) reads, defines and may write in place.

    Writes: the in-place arguments of ``call_tir_inplace`` / ``call_inplace_packed``, and every
    variable an impure call other than our collectives and ``R.ccl``, or a call to a function of
    the module, receives. A tuple shares buffers with its fields, a name with what it renames.
    """
    reads: list = []
    defines: list = []
    writes: list = []
    aliases: list = []
    own: set = set()
    for b in unit.bindings if is_block else [unit]:
        known = info(b.value) is not None or (isinstance(b.value, relax.Call) and isinstance(b.value.op, ir.Op)
                                              and b.value.op.name.startswith("relax.ccl."))
        r, d, w, a = _binding_access(b, known)
        reads.extend(k for k in r if k not in own)  # a block's own definitions are not reads
        defines.extend(d)
        own.update(d)
        writes.extend(w)
        aliases.extend(a)
    return UnitAccess(tuple(reads), tuple(defines), tuple(writes), tuple(aliases))


def dependences(units: Sequence[tuple[Any, bool]]) -> list[set[int]]:
    """Per unit, the earlier units it must follow: reads, symbolic dims, in-place writes."""
    return unit_dependences([unit_access(u, b) for u, b in units])


def _nested_p2p(value: relax.Expr) -> bool:
    found = [False]

    def visit(e: Any) -> None:
        if is_collective(e, S.P2P_KINDS):
            found[0] = True

    relax.analysis.post_order_visit(value, visit)
    return found[0]


def _order_nodes(units: list[tuple[Any, bool]], where: str) -> list[OrderNode] | None:
    """The units as the ordering sees them; None when no top-level unit sends or receives (the
    dependences, most of the cost, are then never computed)."""
    kinds: list[tuple[str, OrderNode | None]] = []
    for unit, is_block in units:
        kind, node = "other", None
        if not is_block:
            spec = info(unit.value)
            if spec is not None and spec.kind == "send":
                kind, node = "send", OrderNode("send", (), spec.channel_id, spec.pairs,
                                               payload(*_dims(_type_of(unit.value.args[0]))))
            elif spec is not None and spec.kind == "recv":
                assert spec.shape is not None and spec.dtype is not None
                kind, node = "recv", OrderNode("recv", (), spec.channel_id, spec.pairs, payload(spec.shape, spec.dtype))
            elif spec is None and relax.analysis.contains_impure_call(unit.value):
                if not isinstance(unit.value, relax.Call) and _nested_p2p(unit.value):
                    inside = ("a local function (a closure)" if isinstance(unit.value, relax.Function)
                              else "an if/else branch")
                    raise SendRecvOrderError(
                        f"OrderSendRecv: {where} has a send or recv inside {inside}; sends and recvs must "
                        "be top-level bindings of the function (move that code into its own global function or "
                        "the transfer out of it)"
                    )
                kind = "effect"
        kinds.append((kind, node))
    if not any(kind in S.P2P_KINDS for kind, _ in kinds):
        return None
    return [OrderNode(kind, tuple(sorted(deps))) if node is None else dataclasses.replace(node, deps=tuple(sorted(deps)))
            for (kind, node), deps in zip(kinds, dependences(units))]


def _refuse_in_dataflow(units: list[tuple[Any, bool]], tail: relax.Expr, where: str) -> None:
    """Our collectives are impure: in a dataflow block (ill-formed, yet TVM compiles it) no pass
    orders them, and a recv there ran before its send: every rank waited out the recv timeout.
    Dataflow blocks in if/else branches and local functions are refused too (an allreduce there
    compiled)."""

    def refuse(block: relax.DataflowBlock, place: str) -> None:
        for binding in block.bindings:
            spec = info(binding.value)
            if spec is not None and spec.kind != "after_all":
                raise S.CollectiveError(
                    f"{spec.kind} in a dataflow block of {place}: collectives are impure and must run once, in "
                    "program order, on every rank; emit them outside dataflow blocks, in a function built "
                    "with pure=False"
                )

    def nested(e: Any, place: str) -> None:
        if isinstance(e, relax.SeqExpr):
            for block in e.blocks:
                if isinstance(block, relax.DataflowBlock):
                    refuse(block, place)

    values = [binding.value for unit, is_block in units for binding in (unit.bindings if is_block else [unit])]
    for unit, is_block in units:
        if is_block:
            refuse(unit, where)
    for value in [*values, tail]:  # the body's result too: an If there before normalization
        if isinstance(value, (relax.If, relax.Function)):
            kind = "an if/else branch" if isinstance(value, relax.If) else "a local function"
            relax.analysis.post_order_visit(value, lambda e, p=f"{kind} in {where}": nested(e, p))


def _plan(name: str, func: relax.Function) -> tuple[list[tuple[Any, bool]], OrderPlan] | None:
    if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
        return None
    units = _units(func.body)
    where = f"function '{name}'"
    _refuse_in_dataflow(units, func.body.body, where)
    nodes = _order_nodes(units, where)
    if nodes is None:
        return None
    return units, plan_send_recv_order(nodes, where)


def blocks_of(units: list[tuple[Any, bool]]) -> list[relax.BindingBlock]:
    """Units (a loose binding, or a whole block when the flag is set) back into blocks, in order:
    each run of loose bindings becomes one BindingBlock. The combiners rebuild bodies with it too."""
    blocks: list[relax.BindingBlock] = []
    pending: list[Any] = []
    for unit, is_block in units:
        if is_block:
            if pending:
                blocks.append(relax.BindingBlock(pending))
                pending = []
            blocks.append(unit)
        else:
            pending.append(unit)
    if pending:
        blocks.append(relax.BindingBlock(pending))
    return blocks


def _reorder(func: relax.Function, units: list[tuple[Any, bool]], order: list[int]) -> relax.Function:
    blocks = blocks_of([units[i] for i in order])
    body = relax.BlockBuilder().normalize(relax.SeqExpr(blocks, func.body.body))
    return relax.Function(func.params, body, func.ret_ty, func.is_pure, func.attrs, func.span)


def OrderSendRecv() -> tvm.transform.Pass:  # noqa: N802 - a pass factory, named like TVM's passes
    """Reorder every function so each send runs before the recv it is matched with.

    Sends and recvs of one channel match in program order. Units move as little as possible
    (a stable topological order); dataflow blocks move as a whole. Raises
    :class:`~..ordering.SendRecvOrderError` for a cycle (a send needing its own recv), unmatched
    counts, or a send and its recv that disagree on pairs or payload type.
    """

    @gc_paused()
    def transform(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        updates = {}
        for gv, func in mod.functions_items():
            planned = _plan(gv.name_hint, func)
            if planned is not None and planned[1].changed:
                updates[gv] = _reorder(func, planned[0], planned[1].order)
        return with_functions(mod, updates)

    return tvm.transform.module_pass(transform, opt_level=0, name="OrderSendRecv")


_checked: list[tuple[str, Any]] = []  # (name, function) of the last module found in order


def _check_module_order(mod: tvm.IRModule) -> None:
    """Legalization's safety net: refuse a module whose recvs run before their sends, or with a
    collective in a dataflow block.

    Called for each collective being legalized; the functions checked last are remembered (by
    identity) so a module is analysed once, not once per op.
    """
    funcs = [(gv.name_hint, f) for gv, f in mod.functions_items() if isinstance(f, relax.Function)]
    if len(funcs) == len(_checked) and all(a == c and f.same_as(g) for (a, f), (c, g) in zip(funcs, _checked)):
        return
    for name, func in funcs:
        planned = _plan(name, func)
        if planned is not None and not is_deadlock_free(planned[1]):
            raise SendRecvOrderError(
                f"OrderSendRecv: function '{name}' runs a recv before the send it is matched with, "
                "so every rank would wait forever; apply tvm_combiners.collectives.relax.OrderSendRecv() before "
                "legalization (or compile with tvm_combiners.collectives.relax.pipeline(target))"
            )
    _checked[:] = funcs


def pipeline(target: Any, before: Sequence[tvm.transform.Pass] = ()) -> tvm.transform.Pass:
    """``before`` (e.g. combiners), ``OrderSendRecv``, then the default pipeline for ``target``.

    The default pipeline is TVM's, with default schedules on llvm (:mod:`tvm_combiners.compile.schedules`).

    The compile path for modules with sends and recvs:
    ``tvm.compile(mod, target, relax_pipeline=pipeline(target))``.
    """
    target = tvm.target.Target(target) if isinstance(target, (str, dict)) else target
    passes = [*before, OrderSendRecv(), default_pipeline(target)]
    return tvm.transform.Sequential(passes, name="collectives_pipeline")

