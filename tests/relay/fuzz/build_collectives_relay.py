"""Relay modules from the collective fuzzer's resolved programs (``collective_spec``), one rank or n.

Relay has no program order: the executors run a channel's sends and recvs in any order their data
allows, and :func:`~tvm_combiners.collectives.relay.OrderSendRecv` (which every Relay combiner runs
first) matches them in the order it reads from the data, refusing two recvs of one channel that
nothing orders. ``order="program"`` writes each channel's program order into the data, so the
module means what the program does (``collective_spec.reference``):

- each send's token is the previous send of its channel (a token chain);
- each recv's token reads the previous recv of its channel (:func:`token_of` its value);
- a send no later op reads reaches the result through one extra ``after_all`` output, as a send
  must in Relay.

``order="loose"`` leaves the send chains out: OrderSendRecv then orders each channel's sends by
how many of its recvs they read (program order where they read alike), which may differ from the
program's, so only before/after comparisons hold; this is where a group that gives a send a new
recv ancestor reorders the channel (the combiners' past silent bug, caught only here). Recvs
hold their matched send's token where the program gives one; OrderSendRecv adds the others.
``order="none"`` leaves the recv chains out too: OrderSendRecv refuses nearly every such module.

``form="graph"``: one expression per op, shared where read twice (graph executor).
``form="let"``: a let chain binding every op in program order (A-normal form, Relay VM); the tokens
OrderSendRecv adds read the sends' variables, so the combiners reorder the chain and combine
what they combine in graph form.

On n ranks (``ranks``, read by ``collective_world``) groups name every rank, sends and recvs go
around the ring, and the two collectives that change shapes carry the wraps of the Relax builder
(``build_collectives_relax``), which give back the operand's type: a weighted fold after an
allgather (``split``, multiplies, adds in block order), an offset tile before a reduce_scatter
(adds, ``concatenate``); in let form each wrap op is a binding of its own, so the combiners see
the chain they would see in a real model. On one rank the wraps vanish and every group and pair
is the rank itself: the modules are the one-rank fuzzer's, unchanged.
"""

from __future__ import annotations

from collections.abc import Callable

import tvm
from collective_spec import TYPES, Op, Resolved
from collective_world import gather_weight, scatter_offset
from tvm import relay

from tvm_combiners.collectives import relay as C

FORMS = ("graph", "let")
ORDERS = ("program", "loose", "none")
#: Binds a wrap op in let form (a new variable of the given type, named) or keeps it inline (graph).
_Bind = Callable[[relay.Expr, relay.Type, str], relay.Expr]


def token_of(value: relay.Expr) -> relay.Expr:
    """A token computed from ``value``'s data (its maximum, cast): whatever takes it runs after ``value``.

    Relay tokens are 0-d int32 tensors and only order; no pass folds this one away (its operand is
    an opaque op's result)."""
    return relay.cast(relay.max(value), "int32")


def _join(tokens: list[relay.Expr]) -> relay.Expr | None:
    return None if not tokens else tokens[0] if len(tokens) == 1 else C.after_all(*tokens)


def _call(op: Op, args: list[relay.Expr], token: relay.Expr | None, n: int) -> relay.Expr:
    group = [list(range(n))]
    ring = [[r, (r + 1) % n] for r in range(n)]  # one rank: [[0, 0]]
    if op.kind == "send":
        return C.send(args[0], ring, channel_id=op.channel, is_host_transfer=op.host, token=token)
    if op.kind == "recv":
        shape, dtype = TYPES[op.type]
        return C.recv(shape, dtype, ring, channel_id=op.channel, is_host_transfer=op.host, token=token)
    if op.kind == "allreduce":
        return C.allreduce(args[0], op.reduce)
    if op.kind == "allgather":
        return C.allgather(args[0], axis=op.axis, group=group)
    if op.kind == "reduce_scatter":
        return C.reduce_scatter(args[0], op.reduce, axis=op.axis, group=group)
    if op.kind == "add":
        return relay.add(args[0], args[1])
    return relay.add(args[0], relay.const(op.constant, TYPES[op.type][1]))  # offset


def build_module(program: Resolved, form: str = "graph", order: str = "program", ranks: int = 1) -> tvm.IRModule:
    """``main(x0, x1, ...)`` for every rank of a world of ``ranks``, returning every tensor the
    program made (and, if needed, one last token).

    Relay has no ops of its own for collectives: ``Op.native`` builds ours too."""
    assert form in FORMS and order in ORDERS and ranks >= 1, (form, order, ranks)
    xs = [relay.var(f"x{i}", shape=TYPES[t][0], dtype=TYPES[t][1]) for i, t in enumerate(program.params)]
    values: list[relay.Expr] = list(xs)
    sends: dict[int, list[int]] = {}  # channel -> value ids of its sends so far
    recvs: dict[int, list[int]] = {}
    unread: set[int] = set()  # sends whose token nothing reads yet
    bindings: list[tuple[relay.Var, relay.Expr]] = []

    def bind(expr: relay.Expr, type_: relay.Type, name: str) -> relay.Expr:
        if form == "graph":
            return expr
        var = relay.Var(name, type_)
        bindings.append((var, expr))
        return var

    for op in program.ops:
        v = len(values)
        args = [values[a] for a in op.args]
        token = None
        if op.kind == "send":
            earlier = sends.setdefault(op.channel, [])
            if earlier and order == "program":
                token = values[earlier[-1]]
                unread.discard(earlier[-1])
            earlier.append(v)
            unread.add(v)
        elif op.kind == "recv":
            earlier = recvs.setdefault(op.channel, [])
            matched = sends[op.channel][len(earlier)]
            given = list(op.args)
            assert set(given) <= {matched}, "a recv's token names another send"
            unread.difference_update(given)
            parts = [values[a] for a in given]
            if earlier and order != "none":
                parts.append(token_of(values[earlier[-1]]))
            token = _join(parts)
            earlier.append(v)
            args = []
        if op.kind == "reduce_scatter":
            args = [_tile(bind, args[0], op, ranks, f"v{v}")]
        call = _call(op, args, token, ranks)
        shape, dtype = ((), "int32") if op.type is None else TYPES[op.type]  # the op's value keeps its type
        if op.kind == "allgather" and ranks > 1:
            gathered = bind(call, relay.TensorType(_widened(op, ranks), dtype), f"v{v}_gathered")
            values.append(_fold(bind, gathered, op, ranks, f"v{v}"))
        else:
            values.append(bind(call, relay.TensorType(shape, dtype), f"v{v}"))
    outs = [values[v] for v in program.outputs]
    if unread:
        outs.append(C.after_all(*(values[v] for v in sorted(unread))))
    body: relay.Expr = relay.Tuple(outs)
    for var, value in reversed(bindings):
        body = relay.Let(var, value, body)
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function(xs, body)))


def _widened(op: Op, n: int) -> tuple[int, ...]:
    """The shape of ``n`` blocks of the op's type along its axis (an allgather's result, a tile)."""
    shape = list(TYPES[op.type][0])
    shape[op.axis] *= n
    return tuple(shape)


def _fold(bind: _Bind, gathered: relay.Expr, op: Op, n: int, name: str) -> relay.Expr:
    """``collective_world.fold_gathered`` in Relay: block k times ``k + 1``, added in block order;
    the last add is the op's value (``name``)."""
    shape, dtype = TYPES[op.type]
    block = relay.TensorType(shape, dtype)
    parts = bind(relay.split(gathered, n, axis=op.axis).astuple(), relay.TupleType([block] * n), f"{name}_blocks")
    acc = bind(relay.TupleGetItem(parts, 0), block, f"{name}_b0")
    for k in range(1, n):
        part = bind(relay.TupleGetItem(parts, k), block, f"{name}_b{k}")
        weighted = bind(relay.multiply(part, relay.const(gather_weight(k), dtype)), block, f"{name}_w{k}")
        acc = bind(relay.add(acc, weighted), block, name if k == n - 1 else f"{name}_a{k}")
    return acc


def _tile(bind: _Bind, x: relay.Expr, op: Op, n: int, name: str) -> relay.Expr:
    """``collective_world.tile_for_scatter`` in Relay: n copies along the axis, copy k plus ``k``."""
    if n == 1:
        return x
    shape, dtype = TYPES[op.type]
    copies = [x] + [bind(relay.add(x, relay.const(scatter_offset(k), dtype)), relay.TensorType(shape, dtype),
                         f"{name}_copy{k}") for k in range(1, n)]
    return bind(relay.concatenate(copies, axis=op.axis), relay.TensorType(_widened(op, n), dtype), f"{name}_tile")
