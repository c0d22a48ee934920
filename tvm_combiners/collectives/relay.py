"""Collective ops in Relay (TVM builds with Relay, e.g. hhb-tvm 3.2.3): builders, registration, lowering.

Ops ``collectives.<kind>`` with ``DictAttrs`` (layout in :mod:`.spec`): they print, compare and hash
structurally, and :func:`info` reads them back as a :class:`~.spec.CollectiveSpec`.

Side effects: every op is ``OPAQUE`` (never fused) and the ones with effects are registered
stateful, which keeps EliminateCommonSubexpr and FoldConstant away from them. Relay has no program
order: an op runs when something uses its result, so a send must reach the function's result
through its token (return it, pass it to a recv or another send, or join it with ``after_all``);
an allreduce whose result is part of the output always runs, even where nothing reads it further.

Lowering: ``te.extern`` calling ``tvm.tir.call_packed("tvm_combiners.<kind>", ..., out)`` (graph
executor and VM alike); token operands stay inputs of the lowered function, so they order the
graph, but are never handed to the runtime.

Deadlock freedom: apply :func:`OrderSendRecv` to the module before ``relay.build`` (Relay has no
hook for user passes in its build). It adds token edges so every send runs before the recv it is
matched with, whatever order the executor picks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tvm
from tvm import relay, te, topi
from tvm.relay.op import op as _op
from tvm.relay.op.strategy.generic import wrap_topi_schedule

from . import spec as S
from .builders import IRAdapter, make_builders
from .ordering import OrderNode, SendRecvOrderError, plan_send_recv_order

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
    "AllReduceCombiner",
    "AllGatherCombiner",
    "ReduceScatterCombiner",
    "SendRecvCombiner",
    "CombineCollectives",
]

_INPUTS = {
    "allreduce": (("x", "Tensor"),),
    "allgather": (("x", "Tensor"),),
    "reduce_scatter": (("x", "Tensor"),),
    "send": (("x", "Tensor"), ("token", "Tensor")),
    "recv": (("token", "Tensor"),),
    "after_all": (("tokens", "Tuple"),),
}
_MARKER = "tvm_combiners.collectives.relay_registered"


# --------------------------------------------------------------------------- types


def _dims(ty: Any) -> tuple[list[Any] | None, str | None]:
    if not isinstance(ty, relay.TensorType):
        return None, None
    return [int(d) if isinstance(d, tvm.tir.IntImm) else d for d in ty.shape], str(ty.dtype)


def _type_of(expr: relay.Expr) -> Any:
    try:
        return expr.checked_type
    except ValueError:  # not inferred yet
        pass
    if isinstance(expr, relay.Var):
        return expr.type_annotation
    return relay.transform.InferTypeLocal(expr)


def _check_tensor(kind: str, what: str, ty: Any) -> tuple[list[Any], str]:
    dims, dtype = _dims(ty)
    if dims is None or dtype is None:
        raise S.CollectiveError(f"{kind}: {what} must be a tensor of known rank, got {ty}")
    return dims, dtype


def _check_token(kind: str, what: str, ty: Any) -> None:
    dims, dtype = _dims(ty)
    S.check_token(kind, what, dims, dtype)


def _rel(kind: str):
    def rel(arg_types: Sequence[Any], attrs: Any) -> Any:
        spec = S.CollectiveSpec.from_attrs(kind, attrs)
        if kind == "after_all":
            tup = arg_types[0]
            if not isinstance(tup, relay.TupleType):
                raise S.CollectiveError(f"after_all: its argument must be a tuple of tokens, got {tup}")
            for i, f in enumerate(tup.fields):
                _check_token(kind, f"argument {i}", f)
        elif kind == "recv":
            _check_token(kind, "token", arg_types[0])
        elif kind == "send":
            _, dtype = _check_tensor(kind, "x", arg_types[0])
            S.check_dtype(kind, dtype)
            _check_token(kind, "token", arg_types[1])
        shape, dtype = (None, None) if kind in ("send", "recv", "after_all") else _check_tensor(kind, "x", arg_types[0])
        out_shape, out_dtype = S.infer_type(spec, shape, dtype)
        return relay.TensorType(list(out_shape), out_dtype)

    return rel


def _compute(kind: str):
    def compute(attrs: Any, inputs: Sequence[te.Tensor], out_type: Any) -> list[te.Tensor]:
        if kind == "after_all":
            return [te.compute((), lambda: tvm.tir.const(0, S.TOKEN_DTYPE), name="after_all")]
        spec = S.CollectiveSpec.from_attrs(kind, attrs)
        name, extra = spec.runtime_call()
        ins = list(inputs)
        n_payload = 0 if kind == "recv" else 1

        def body(ins_buf: Sequence[Any], outs: Sequence[Any]) -> Any:
            return tvm.tir.call_packed(name, *ins_buf[:n_payload], *extra, outs[0])

        out = te.extern([out_type.shape], ins, body, dtype=[out_type.dtype], name=kind)
        return [out]

    return compute


def _register() -> None:
    """Register every op once per process (a re-import finds the marker and leaves them be)."""
    if tvm.get_global_func(_MARKER, allow_missing=True) is not None:
        return
    for kind in S.KINDS:
        name = S.relay_op_name(kind)
        _op.register(name, f"tvm_combiners collective op {kind}")
        op = _op.get(name)
        op.set_num_inputs(len(_INPUTS[kind]))
        for arg, ty in _INPUTS[kind]:
            op.add_argument(arg, ty, f"{arg} of {kind}")
        op.add_type_rel(f"CollectivesRel_{kind}", _rel(kind))
        _op.register_pattern(name, _op.OpPattern.OPAQUE)
        if kind in S.IMPURE_KINDS:
            _op.register_stateful(name, True)
        compute = _compute(kind)
        _op.register_compute(name, compute)

        def strategy(attrs: Any, inputs: Any, out_type: Any, target: Any, compute: Any = compute, kind: str = kind):
            s = _op.OpStrategy()
            s.add_implementation(compute, wrap_topi_schedule(topi.generic.schedule_extern), name=f"collectives.{kind}")
            return s

        generic = tvm.target.override_native_generic_func(f"collectives_{kind}_strategy")(strategy)
        _op.register_strategy(name, generic)
    tvm.register_func(_MARKER, lambda: True)


_register()


# --------------------------------------------------------------------------- builders


def _call(spec: S.CollectiveSpec, args: Sequence[relay.Expr]) -> relay.Call:
    return relay.Call(_op.get(spec.op_name_relay), list(args), tvm.ir.make_node("DictAttrs", **spec.attrs()))


def token() -> relay.Expr:
    """A fresh token (orders nothing): what ``token=None`` stands for."""
    return relay.const(0, S.TOKEN_DTYPE)


allreduce, allgather, reduce_scatter, send, recv, after_all = make_builders(
    IRAdapter("Relay", relay.Expr, _type_of, _check_tensor, _check_token, _call, relay.Tuple, token), __name__
)


# --------------------------------------------------------------------------- read back


def info(expr: Any) -> S.CollectiveSpec | None:
    """The spec of a collective call (kind, reduction, axis, groups, pairs, ...), None otherwise."""
    if not isinstance(expr, relay.Call) or not isinstance(expr.op, tvm.ir.Op):
        return None
    name = expr.op.name
    kind = S.kind_of_op_name(name)
    if kind is None or not name.startswith(S.RELAY_PREFIX):
        return None
    return S.CollectiveSpec.from_attrs(kind, expr.attrs)


def is_collective(expr: Any, kinds: Sequence[str] = S.KINDS) -> bool:
    spec = info(expr)
    return spec is not None and spec.kind in kinds


# --------------------------------------------------------------------------- ordering pass


def _graph(body: relay.Expr) -> tuple[list[relay.Expr], list[OrderNode]]:
    """Post-order nodes of a dataflow body (the order Relay's executors use) and their order view."""
    exprs: list[relay.Expr] = []
    relay.analysis.post_order_visit(body, exprs.append)
    index = {e: i for i, e in enumerate(exprs)}
    bound: dict[relay.Var, relay.Expr] = {}
    for e in exprs:
        if isinstance(e, relay.Let):
            bound[e.var] = e.value
    nodes: list[OrderNode] = []
    reads_recv: list[dict[int, frozenset[int]]] = []  # per node: channel -> ancestor recvs of that channel
    for e in exprs:
        if isinstance(e, relay.Call):
            reads = list(e.args) + ([e.op] if not isinstance(e.op, tvm.ir.Op) else [])
        elif isinstance(e, relay.Tuple):
            reads = list(e.fields)
        elif isinstance(e, relay.TupleGetItem):
            reads = [e.tuple_value]
        elif isinstance(e, relay.Let):
            reads = [e.value, e.body]
        elif isinstance(e, relay.If):
            reads = [e.cond, e.true_branch, e.false_branch]
        elif isinstance(e, relay.Var) and e in bound:
            reads = [bound[e]]
        else:
            reads = []
        deps = tuple(sorted({index[r] for r in reads if r in index}))
        spec = info(e)
        seen: dict[int, set[int]] = {}
        for d in deps:
            for channel, recvs in reads_recv[d].items():
                seen.setdefault(channel, set()).update(recvs)
        if spec is not None and spec.kind in S.P2P_KINDS:
            channel = int(spec.channel_id or 0)
            seq = (len(seen.get(channel, ())), len(nodes))
            if spec.kind == "send":
                dims, dtype = _dims(_type_of(e.args[0]))
                static = dims is not None and all(isinstance(d, int) for d in dims)
                payload = (tuple(dims), str(dtype)) if static else None
                nodes.append(OrderNode("send", deps, channel, spec.pairs, payload, seq))
            else:
                nodes.append(OrderNode("recv", deps, channel, spec.pairs, (spec.shape, spec.dtype), seq))
                seen.setdefault(channel, set()).add(len(nodes) - 1)
        else:
            nodes.append(OrderNode("other", deps))
        reads_recv.append({c: frozenset(v) for c, v in seen.items()})
    return exprs, nodes


def _ancestors(nodes: Sequence[OrderNode]) -> list[int]:
    out: list[int] = []
    for node in nodes:
        bits = 0
        for d in node.deps:
            bits |= out[d] | (1 << d)
        out.append(bits)
    return out


class _AddTokens(relay.ExprMutator):
    """Order ``call`` after extra sends by joining their tokens into its token operand."""

    def __init__(self, after: dict[relay.Expr, list[relay.Expr]]):
        super().__init__()
        self.after = after

    def visit_call(self, call: relay.Call) -> relay.Expr:
        new = super().visit_call(call)
        extra = self.after.get(call)
        if not extra:
            return new
        args = list(new.args)
        tokens = [args[-1], *(self.visit(e) for e in extra)]
        args[-1] = relay.Call(_op.get(S.relay_op_name("after_all")), [relay.Tuple(tokens)], tvm.ir.make_node("DictAttrs"))
        return relay.Call(new.op, args, new.attrs, new.type_args, new.span)


def _order_function(name: str, func: relay.Function) -> relay.Function:
    exprs, nodes = _graph(func.body)
    if not any(n.kind in S.P2P_KINDS for n in nodes):
        return func
    where = f"function '{name}'"
    plan = plan_send_recv_order(nodes, where)
    anc = _ancestors(nodes)

    def before(a: int, b: int) -> bool:
        return bool(anc[b] >> a & 1)

    after: dict[relay.Expr, list[relay.Expr]] = {}
    for s, r in plan.matches:
        if not before(s, r):
            after.setdefault(exprs[r], []).append(exprs[s])
    for a, b in plan.chains:
        if before(a, b):
            continue
        if nodes[b].kind == "send":
            after.setdefault(exprs[b], []).append(exprs[a])
        else:
            raise SendRecvOrderError(
                f"OrderSendRecv: two recvs of channel_id {nodes[b].channel_id} in {where} are not ordered by their "
                "data, and Relay may run them in either order; give each transfer its own channel_id or make the "
                "later recv depend on the earlier one (through its token)"
            )
    if not after:
        return func
    body = _AddTokens(after).visit(func.body)
    return relay.Function(func.params, body, func.ret_type, func.type_params, func.attrs, func.span)


def OrderSendRecv() -> tvm.transform.Pass:  # noqa: N802 - a pass factory, named like TVM's passes
    """Give every recv its matched send's token (and chain each channel's sends), so no rank waits forever.

    Sends and recvs of one channel match in the executors' order (post-order). Raises
    :class:`~.ordering.SendRecvOrderError` for a cycle, unmatched counts, mismatched pairs or
    payload types, or two recvs of one channel that nothing orders.
    """

    def transform(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        mod = relay.transform.InferType()(mod)
        updates = {}
        for gv, func in mod.functions.items():
            if isinstance(func, relay.Function):
                new = _order_function(gv.name_hint, func)
                if not new.same_as(func):
                    updates[gv] = new
        if not updates:
            return mod
        new_mod = tvm.IRModule(dict(mod.functions.items()), mod.type_definitions, attrs=mod.attrs)
        for gv, func in updates.items():
            new_mod[gv] = func
        return relay.transform.InferType()(new_mod)

    return tvm.transform.module_pass(transform, opt_level=0, name="OrderSendRecv")


from .combiners.relay_passes import (  # noqa: E402 - after the ops: the passes build them
    AllGatherCombiner,
    AllReduceCombiner,
    CombineCollectives,
    ReduceScatterCombiner,
    SendRecvCombiner,
)
