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

from ...compile.pipelines import default_pipeline
from ...core.driver import gc_paused
from ...relax.graph_view import op_name
from .. import spec as S
from ..builders import IRAdapter, make_builders
from ..dependences import UnitAccess, unit_dependences
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
    out = bb.emit(relax.op.builtin.alloc_tensor(shape, str(ty.dtype), 0))
    native = _native_allreduce(spec, str(ty.dtype), shape)
    if native is not None:
        name, args = native[0], [*inputs, out, *native[1]]
    else:
        args = [*inputs, *(convert_to_expr(e) for e in extra), out]
    bb.emit(relax.Call(relax.ExternFunc(name), args, ty_args=[relax.ObjectType()]))
    return out


def _static(ty: Any) -> bool:
    dims, _ = _dims(ty)
    return dims is not None and all(isinstance(d, int) for d in dims)


def _native_allreduce(spec: S.CollectiveSpec, dtype: str, shape: relax.ShapeExpr) -> tuple[str, list] | None:
    """The native kernel's name and scalar arguments for an allreduce over all ranks on a CPU target.

    Anything else (groups, other dtypes, cuda, no MPI here) keeps the generic runtime function.
    """
    target = tvm.target.Target.current(allow_none=True)
    if spec.kind != "allreduce" or spec.groups is not None or target is None or target.kind.name != "llvm":
        return None
    from ..runtime import native

    codes = native.codes(spec.op, dtype)
    if codes is None or not native.prepare():  # built now so that VMs created in this process call it
        return None
    count = tirx.const(1, "int64")
    for dim in shape.values:
        count = count * dim
    return native.NAME, [relax.prim_value(count), relax.prim_value(tirx.IntImm("int32", codes[1])),
                         relax.prim_value(tirx.IntImm("int32", codes[0]))]


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
        if not updates:
            return mod
        mod = mod.clone()
        for gv, func in updates.items():
            mod[gv] = func
        return mod

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

