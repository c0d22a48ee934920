"""Collective ops in Relay (TVM builds with Relay, e.g. hhb-tvm 3.2.3): builders, registration, lowering.

Ops ``collectives.<kind>`` with ``DictAttrs`` (layout in :mod:`..spec`): they print, compare and hash
structurally, and :func:`info` reads them back as a :class:`~..spec.CollectiveSpec`.

Side effects: every op is ``OPAQUE`` (never fused) and the ones with effects are registered
stateful, which keeps EliminateCommonSubexpr and FoldConstant away from them. Relay has no program
order: an op runs when something uses its result, so a send must reach the function's result
through its token (return it, pass it to a recv or another send, or join it with ``after_all``);
an allreduce whose result is part of the output always runs, even where nothing reads it further.

Lowering: ``te.extern`` calling ``tvm.tir.call_packed("tvm_combiners.<kind>", ..., out)`` (graph
executor and VM alike); token operands stay inputs of the lowered function, so they order the
graph, but are never handed to the runtime. bfloat16 payloads reach the runtime as their uint16
words (TVM 0.16's BF16 legalization labels a bfloat16 buffer float32 in ``call_packed``: the
runtime read 4-byte floats from 2-byte elements, past the buffer's end): gathers and transfers
move the words unchanged, and allreduce and reduce_scatter call the runtime's
``*_bfloat16_words`` functions, which reduce them as bfloat16 (in float32).

Deadlock freedom: apply :func:`OrderSendRecv` to the module before ``relay.build`` (Relay has no
hook for user passes in its build). It adds token edges so every send runs before the recv it is
matched with, whatever order the executor picks. Sends and recvs must be evaluated unconditionally
in the function (not in an if branch, a closure or a loop): elsewhere the pass refuses them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import tvm
from tvm import relay, te, topi
from tvm.relay.op import op as _op
from tvm.relay.op.strategy.generic import wrap_topi_schedule

from ...core.driver import gc_paused
from ...relay.shallow_mutator import ShallowExprMutator
from .. import spec as S
from ..builders import IRAdapter, make_builders
from ..ordering import OrderNode, SendRecvOrderError, index_order, payload, plan_send_recv_order
from .chains import let_chain, reorderable

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
_BF16 = "bfloat16"


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
        return expr.type_annotation  # None for a let variable typed by its value: see _untyped
    return relay.transform.InferTypeLocal(expr)


def _untyped(kind: str, what: str, ty: Any) -> None:
    if ty is None:  # an unannotated variable ("got None" said nothing)
        raise S.CollectiveError(f"{kind}: {what} is a variable without a type annotation, and the op checks its "
                                "operands' types when built: annotate it (relay.var(name, shape=..., dtype=...)) "
                                "or build the call on the variable's value")


def _check_tensor(kind: str, what: str, ty: Any) -> tuple[list[Any], str]:
    _untyped(kind, what, ty)
    dims, dtype = _dims(ty)
    if dims is None or dtype is None:
        raise S.CollectiveError(f"{kind}: {what} must be a tensor of known rank, got {ty}")
    dynamic = [i for i, d in enumerate(dims) if not isinstance(d, int)]
    if dynamic:  # the executors would need a shape function (the VM failed with an InternalError)
        extent = "?" if isinstance(dims[dynamic[0]], tvm.tir.Any) else dims[dynamic[0]]
        raise S.CollectiveError(f"{kind}: {what} has the dynamic extent {extent} on axis {dynamic[0]}; "
                                "Relay collectives need static shapes (Relax's take symbolic ones)")
    return dims, dtype


def _check_token(kind: str, what: str, ty: Any) -> None:
    _untyped(kind, what, ty)
    dims, dtype = _dims(ty)
    S.check_token(kind, what, dims, dtype)


def _fields(ty: Any) -> list[Any] | None:
    return list(ty.fields) if isinstance(ty, relay.TupleType) else None


_TYPES = S.OperandTypes(_check_tensor, _check_token, _fields, str)


def _rel(kind: str):
    def rel(arg_types: Sequence[Any], attrs: Any) -> Any:
        spec = S.CollectiveSpec.from_attrs(kind, attrs)
        out_shape, out_dtype = S.infer_call_type(spec, arg_types, _TYPES)
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

        payload = out_type if kind == "recv" else ins[0]
        empty = kind in S.P2P_KINDS and any(int(d) == 0 for d in payload.shape)
        out_dtype = out_type.dtype
        if str(payload.dtype) == _BF16:  # as uint16 words (module docstring)
            ins = [topi.reinterpret(t, "uint16") if str(t.dtype) == _BF16 else t for t in ins]
            out_dtype = "uint16" if out_dtype == _BF16 else out_dtype
            if kind in ("allreduce", "reduce_scatter"):
                name = S.bfloat16_words_function(kind)

        def body(ins_buf: Sequence[Any], outs: Sequence[Any]) -> Any:
            if empty:  # the Relay VM never runs a zero-size recv, though it runs the send: the message
                # stayed queued and the channel's next recv read it. Relay shapes are static, and a
                # send and its recv agree on them (OrderSendRecv): both sides skip the transfer.
                return tvm.tir.Evaluate(0)
            return tvm.tir.call_packed(name, *ins_buf[:n_payload], *extra, outs[0])

        out = te.extern([out_type.shape], ins, body, dtype=[out_dtype], name=kind)
        return [topi.reinterpret(out, _BF16) if out_dtype != out_type.dtype else out]

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
    IRAdapter("Relay", relay.Expr, _type_of, _TYPES, _call, relay.Tuple, token), __name__
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


# --------------------------------------------------------------------------- the function's top-level region


_BRANCH = "an if/else branch"
_CLOSURE = "a local function (a closure or a relay.loops.while_loop body)"
_OTHER = "a match clause or reference expression"


@dataclasses.dataclass
class _Region:
    """The expressions a function evaluates unconditionally, in an order the executors may run them.

    Relay evaluates an expression in the innermost scope (let body, if branch, function body) that
    holds all its uses. Only expressions that some path from the function body reaches without
    entering an if branch or a function body are here: a collective inside a branch runs on some
    ranks only, one inside a closure or loop runs when (and as often as) it is called, so neither
    may be merged with, or ordered against, anything outside it. Such an if/function/match node is
    one opaque node here, reading whatever region expressions it refers to inside.
    """

    exprs: list[relay.Expr]  #: topological (deps first), as close to Relay's post-order as it allows
    deps: list[tuple[int, ...]]
    index: dict[relay.Expr, int]
    #: Let variables in scope wherever the expression sits (the intersection over its uses).
    scopes: list[frozenset[relay.Var]]
    let_vars: frozenset[relay.Var]
    #: Each let-bound value -> the variables bound to it.
    binders: dict[relay.Expr, tuple[relay.Var, ...]]
    #: Opaque nodes holding collectives: node -> what it is (``_BRANCH``, ``_CLOSURE``, ``_OTHER``).
    nested: dict[int, str]
    #: What holds the first send or recv out of the region's reach, None if none does.
    nested_p2p: str | None

    def needs(self, exprs: Sequence[relay.Expr]) -> frozenset[relay.Var]:
        """Let variables ``exprs`` read: where an expression moves, those must stay in scope."""
        out: set[relay.Var] = set()
        if not self.let_vars:
            return frozenset()  # graph form: every expression is in scope everywhere
        for e in exprs:
            out.update(v for v in relay.analysis.free_vars(e) if v in self.let_vars)
        return frozenset(out)

    def visible_at(self, members: Sequence[int]) -> frozenset[relay.Var]:
        """Let variables in scope where one expression shared by ``members`` would sit (their common scope)."""
        return frozenset.intersection(*(self.scopes[m] for m in members))


def _direct(e: relay.Expr) -> tuple[list[tuple[relay.Expr, relay.Var | None]], str | None]:
    """Operands evaluated with ``e`` (and the let variable each one's scope adds), and what ``e``
    is when it opens scopes the region does not enter (None where it opens none)."""
    if isinstance(e, relay.Call):
        return [(a, None) for a in e.args] + ([] if isinstance(e.op, tvm.ir.Op) else [(e.op, None)]), None
    if isinstance(e, relay.Tuple):
        return [(f, None) for f in e.fields], None
    if isinstance(e, relay.TupleGetItem):
        return [(e.tuple_value, None)], None
    if isinstance(e, relay.Let):
        return [(e.value, None), (e.body, e.var)], None
    if isinstance(e, relay.If):
        return [(e.cond, None)], _BRANCH
    if isinstance(e, relay.Function):
        return [], _CLOSURE
    if isinstance(e, (relay.Var, relay.Constant, relay.GlobalVar, tvm.ir.Op, relay.Constructor)):
        return [], None
    return [], _OTHER


def region(body: relay.Expr) -> _Region | None:
    """The top-level region of a function body; None where its dependences form a cycle (a let
    variable read by its own value other than through a function): nothing is then provable."""
    post: list[relay.Expr] = []
    relay.analysis.post_order_visit(body, post.append)  # the executors' order, the tie-breaker
    members: set[relay.Expr] = set()
    bound: dict[relay.Var, relay.Expr] = {}
    stack = [body]
    while stack:
        e = stack.pop()
        if e in members:
            continue
        members.add(e)
        if isinstance(e, relay.Let):
            bound[e.var] = e.value
        stack.extend(k for k, _ in _direct(e)[0])
    exprs = [e for e in post if e in members]
    pos = {e: i for i, e in enumerate(exprs)}
    kids: list[list[tuple[int, relay.Var | None]]] = []
    inner: list[list[int]] = []  # region expressions an opaque node refers to inside
    deps: list[set[int]] = []
    nested: dict[int, str] = {}
    nested_p2p: str | None = None
    for i, e in enumerate(exprs):
        direct, opaque = _direct(e)
        kids.append([(pos[k], v) for k, v in direct])
        d = {pos[k] for k, _ in direct}
        if isinstance(e, relay.Var) and e in bound:
            d.add(pos[bound[e]])
        hits: set[int] = set()
        if opaque is not None:
            seen: list[relay.Expr] = []
            relay.analysis.post_order_visit(e, seen.append)
            for x in seen:
                if isinstance(x, relay.Var) and x in bound and bound[x].same_as(e):
                    continue  # a recursive function calling itself (a loop): no dependence
                if x in pos:
                    hits.add(pos[x])
                elif isinstance(x, relay.Var) and x in bound:
                    d.add(pos[bound[x]])
                spec = info(x) if x not in pos else None
                if spec is not None:
                    nested[i] = opaque
                    if spec.kind in S.P2P_KINDS and nested_p2p is None:
                        nested_p2p = opaque
            d |= hits
        d.discard(i)
        hits.discard(i)
        inner.append(sorted(hits))
        deps.append(d)
    order = index_order([sorted(d) for d in deps])
    if order is None:
        return None
    new = {old: k for k, old in enumerate(order)}
    scopes: list[frozenset[relay.Var] | None] = [None] * len(exprs)
    scopes[pos[body]] = frozenset()
    for u in reversed(order if bound else ()):  # users before what they use; graph form: no scopes
        su = scopes[u] or frozenset()
        uses = [(k, su | {v} if v is not None else su) for k, v in kids[u]] + [(k, su) for k in inner[u]]
        for k, s in uses:
            scopes[k] = s if scopes[k] is None else scopes[k] & s
    return _Region(
        exprs=[exprs[i] for i in order],
        deps=[tuple(sorted(new[d] for d in deps[i])) for i in order],
        index={exprs[i]: k for k, i in enumerate(order)},
        scopes=[scopes[i] or frozenset() for i in order],
        let_vars=frozenset(bound),
        binders=_binders(bound),
        nested={new[i]: what for i, what in nested.items()},
        nested_p2p=nested_p2p,
    )


def _binders(bound: dict[relay.Var, relay.Expr]) -> dict[relay.Expr, tuple[relay.Var, ...]]:
    out: dict[relay.Expr, tuple[relay.Var, ...]] = {}
    for var, value in bound.items():
        out[value] = (*out.get(value, ()), var)
    return out


def moving(reg: _Region, specs: Sequence[S.CollectiveSpec | None]) -> list[bool]:
    """Per region expression (``specs``: :func:`info` of each), whether a reorder must keep it in
    order with the others: a collective, send or recv, or an opaque node holding some."""
    return [i in reg.nested or (spec is not None and spec.kind != "after_all") for i, spec in enumerate(specs)]


def order_nodes(reg: _Region) -> list[OrderNode]:
    """The order view of a region: its sends and recvs with their channels, pairs and payloads."""
    nodes: list[OrderNode] = []
    # per node: its ancestor recvs as one bitset over the region's recvs, and per channel the mask
    # of that channel's recvs (a set per channel per node was quadratic: 9 s of 3000 transfers)
    reads_recv: list[int] = []
    of_channel: dict[int, int] = {}
    count = 0
    for e, deps in zip(reg.exprs, reg.deps):
        spec = info(e)
        seen = 0
        for d in deps:
            seen |= reads_recv[d]
        if spec is not None and spec.kind in S.P2P_KINDS:
            channel = int(spec.channel_id or 0)
            seq = ((seen & of_channel.get(channel, 0)).bit_count(), len(nodes))
            if spec.kind == "send":
                nodes.append(OrderNode("send", deps, channel, spec.pairs, payload(*_dims(_type_of(e.args[0]))), seq))
            else:
                nodes.append(OrderNode("recv", deps, channel, spec.pairs, payload(spec.shape, spec.dtype), seq))
                of_channel[channel] = of_channel.get(channel, 0) | 1 << count
                seen |= 1 << count
                count += 1
        else:
            nodes.append(OrderNode("other", deps))
        reads_recv.append(seen)
    return nodes


def _ancestors(nodes: Sequence[OrderNode]) -> list[int]:
    out: list[int] = []
    for node in nodes:
        bits = 0
        for d in node.deps:
            bits |= out[d] | (1 << d)
        out.append(bits)
    return out


# --------------------------------------------------------------------------- ordering pass


class _AddTokens(ShallowExprMutator):
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


@dataclasses.dataclass(frozen=True)
class FunctionTransfers:
    """What one global function sends and receives on, and which global functions it calls."""

    channels: tuple[int, ...]  # the channel id of each send and recv, nested ones included
    callees: frozenset[str]


def transfers_by_function(mod: tvm.IRModule) -> dict[str, FunctionTransfers]:
    """One walk of every global function, without types (so a module with no send or recv is
    never type-checked for OrderSendRecv: InferType is most of the collective passes' time)."""
    out: dict[str, FunctionTransfers] = {}
    for gv, func in mod.functions.items():
        if not isinstance(func, relay.Function):
            continue
        channels: list[int] = []
        called: set[str] = set()

        def visit(e: Any, channels: list[int] = channels, called: set[str] = called) -> None:
            if isinstance(e, relay.GlobalVar):
                called.add(e.name_hint)
            else:
                spec = info(e)
                if spec is not None and spec.kind in S.P2P_KINDS:
                    channels.append(spec.channel_id)

        relay.analysis.post_order_visit(func.body, visit)
        out[gv.name_hint] = FunctionTransfers(tuple(channels), frozenset(called))
    return out


def p2p_functions(walk: dict[str, FunctionTransfers]) -> set[str]:
    """Names of the functions that hold a send or recv themselves."""
    return {name for name, t in walk.items() if t.channels}


def functions_with_transfers(walk: dict[str, FunctionTransfers]) -> frozenset[str]:
    """Global functions that send or receive, themselves or through the functions they call."""
    holds = p2p_functions(walk)
    grew = True
    while grew:
        grew = False
        for name, t in walk.items():
            if name not in holds and not t.callees.isdisjoint(holds):
                holds.add(name)
                grew = True
    return frozenset(holds)


def well_scoped(func: relay.Function) -> bool:
    """Every variable bound once and read only where it is bound (what TVM checks, with an
    InternalError, when the function enters a module)."""
    return bool(relay.analysis.well_formed(func)) and not relay.analysis.free_vars(func)


def _order_function(name: str, func: relay.Function) -> relay.Function:
    where = f"function '{name}'"
    reg = region(func.body)
    if reg is None:
        raise SendRecvOrderError(
            f"OrderSendRecv: {where} has a let variable that its own value reads (other than through a "
            "function), so its sends and recvs cannot be ordered"
        )
    if reg.nested_p2p is not None:
        raise SendRecvOrderError(
            f"OrderSendRecv: {where} has a send or recv inside {reg.nested_p2p}, where it cannot be ordered; sends and "
            "recvs must be evaluated unconditionally in the function itself (move the transfer out, or the code "
            "into its own global function)"
        )
    nodes = order_nodes(reg)
    if not any(n.kind in S.P2P_KINDS for n in nodes):
        return func
    plan = plan_send_recv_order(nodes, where)
    # Tokens read the sends' let variables where the chain stays reorderable for the combiners
    # (:mod:`.chains`). A variable can still end up read before its binding (a send moved to a
    # recv bound ahead of it carries the tokens it got itself): then the sends' calls, as elsewhere.
    # Graph form has no let variables: nothing to read through, nothing to read out of scope.
    chain = let_chain(func.body)
    reads_vars = bool(chain.lets) and reorderable(chain, func.body, reg, moving(reg, [info(e) for e in reg.exprs]))
    for through_vars in (True, False) if reads_vars else (False,):
        after = _token_sources(reg, nodes, plan, where, through_vars)
        if not after:
            return func
        new = relay.Function(func.params, _AddTokens(after).visit(func.body), func.ret_type, func.type_params,
                             func.attrs, func.span)
        if not reg.let_vars or well_scoped(new):
            return new
    raise SendRecvOrderError(
        f"OrderSendRecv: in {where}, a send must run before a recv or send bound ahead of it, and the tokens that "
        "order it read let variables bound after that; bind the sends of each channel before its recvs"
    )


def _token_sources(reg: _Region, nodes: list[OrderNode], plan: Any, where: str,
                   through_vars: bool) -> dict[relay.Expr, list[relay.Expr]]:
    """Per expression, the sends (their let variables, ``through_vars``, or calls) whose tokens it must join."""
    exprs = reg.exprs
    anc = _ancestors(nodes)

    def before(a: int, b: int) -> bool:
        return bool(anc[b] >> a & 1)

    def run_before(a: int, b: int) -> None:
        """Give ``b`` the token of send ``a``: through ``a``'s let variable where ``b`` sees one (the
        send stays in its binding); else ``a`` itself, which then sits where ``b`` can see it, so must
        read no let variable out of ``b``'s scope."""
        var = next((v for v in reg.binders.get(exprs[a], ()) if v in reg.scopes[b]), None) if through_vars else None
        if var is not None:
            after.setdefault(exprs[b], []).append(var)
            return
        lost = reg.needs([exprs[a]]) - reg.scopes[b]
        if lost:
            names = ", ".join(sorted(v.name_hint for v in lost))
            raise SendRecvOrderError(
                f"OrderSendRecv: in {where}, a send on channel_id {nodes[a].channel_id} reads let variable(s) {names}, "
                f"bound where the {nodes[b].kind} it must run before cannot see them; bind the send first"
            )
        after.setdefault(exprs[b], []).append(exprs[a])

    after: dict[relay.Expr, list[relay.Expr]] = {}
    for s, r in plan.matches:
        if not before(s, r):
            run_before(s, r)
    for a, b in plan.chains:
        if before(a, b):
            continue
        if nodes[b].kind == "send":
            run_before(a, b)
        else:
            raise SendRecvOrderError(
                f"OrderSendRecv: two recvs of channel_id {nodes[b].channel_id} in {where} are not ordered by their "
                "data, and Relay may run them in either order; give each transfer its own channel_id or make the "
                "later recv depend on the earlier one (through its token)"
            )
    return after


def order_typed_module(mod: tvm.IRModule, names: set[str]) -> tvm.IRModule | None:
    """OrderSendRecv's rewrite of the functions ``names`` (those that send or receive) of a
    type-checked module, not type-checked again (the combiners type-check the module anyway);
    None: nothing to order."""
    updates = {}
    for gv, func in sorted(mod.functions.items(), key=lambda item: item[0].name_hint):  # one error on every rank
        if isinstance(func, relay.Function) and gv.name_hint in names:
            new = _order_function(gv.name_hint, func)
            if not new.same_as(func):
                updates[gv] = new
    if not updates:
        return None
    new_mod = tvm.IRModule(dict(mod.functions.items()), mod.type_definitions, attrs=mod.attrs)
    for gv, func in updates.items():
        new_mod[gv] = func
    return new_mod


def OrderSendRecv() -> tvm.transform.Pass:  # noqa: N802 - a pass factory, named like TVM's passes
    """Give every recv its matched send's token (and chain each channel's sends), so no rank waits forever.

    Sends and recvs of one channel match in the executors' order (post-order). Raises
    :class:`~..ordering.SendRecvOrderError` for a cycle, unmatched counts, mismatched pairs or
    payload types, two recvs of one channel that nothing orders, or a send or recv inside an if
    branch, a closure or a loop (Relay runs those conditionally or repeatedly: no static match).
    """

    @gc_paused()
    def transform(original: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        names = p2p_functions(transfers_by_function(original))
        ordered = order_typed_module(relay.transform.InferType()(original), names) if names else None
        return original if ordered is None else relay.transform.InferType()(ordered)

    return tvm.transform.module_pass(transform, opt_level=0, name="OrderSendRecv")

