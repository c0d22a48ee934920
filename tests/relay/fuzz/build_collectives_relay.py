"""Relay modules from the collective fuzzer's resolved programs (``collective_spec``), and their inputs.

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
"""

from __future__ import annotations

import tvm
from collective_spec import TYPES, Op, Resolved
from tvm import relay

from tvm_combiners.collectives import relay as C

FORMS = ("graph", "let")
ORDERS = ("program", "loose", "none")
ONE_RANK = [[0, 0]]  # source-target pairs of a one-rank world
GROUP = [[0]]


def token_of(value: relay.Expr) -> relay.Expr:
    """A token computed from ``value``'s data (its maximum, cast): whatever takes it runs after ``value``.

    Relay tokens are 0-d int32 tensors and only order; no pass folds this one away (its operand is
    an opaque op's result)."""
    return relay.cast(relay.max(value), "int32")


def _join(tokens: list[relay.Expr]) -> relay.Expr | None:
    return None if not tokens else tokens[0] if len(tokens) == 1 else C.after_all(*tokens)


def _call(op: Op, args: list[relay.Expr], token: relay.Expr | None) -> relay.Expr:
    if op.kind == "send":
        return C.send(args[0], ONE_RANK, channel_id=op.channel, is_host_transfer=op.host, token=token)
    if op.kind == "recv":
        shape, dtype = TYPES[op.type]
        return C.recv(shape, dtype, ONE_RANK, channel_id=op.channel, is_host_transfer=op.host, token=token)
    if op.kind == "allreduce":
        return C.allreduce(args[0], op.reduce)
    if op.kind == "allgather":
        return C.allgather(args[0], axis=op.axis, group=GROUP)
    if op.kind == "reduce_scatter":
        return C.reduce_scatter(args[0], op.reduce, axis=op.axis, group=GROUP)
    if op.kind == "add":
        return relay.add(args[0], args[1])
    return relay.add(args[0], relay.const(op.constant, TYPES[op.type][1]))  # offset


def build_module(program: Resolved, form: str = "graph", order: str = "program") -> tvm.IRModule:
    """``main(x0, x1, ...)`` returning every tensor the program made (and, if needed, one last token).

    Relay has no ops of its own for collectives: ``Op.native`` builds ours too."""
    assert form in FORMS and order in ORDERS, (form, order)
    xs = [relay.var(f"x{i}", shape=TYPES[t][0], dtype=TYPES[t][1]) for i, t in enumerate(program.params)]
    values: list[relay.Expr] = list(xs)
    sends: dict[int, list[int]] = {}  # channel -> value ids of its sends so far
    recvs: dict[int, list[int]] = {}
    unread: set[int] = set()  # sends whose token nothing reads yet
    bindings: list[tuple[relay.Var, relay.Expr]] = []
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
        call = _call(op, args, token)
        if form == "let":
            shape, dtype = ((), "int32") if op.type is None else TYPES[op.type]  # one rank: types never change
            var = relay.Var(f"v{v}", relay.TensorType(shape, dtype))
            bindings.append((var, call))
            call = var
        values.append(call)
    outs = [values[v] for v in program.outputs]
    if unread:
        outs.append(C.after_all(*(values[v] for v in sorted(unread))))
    body: relay.Expr = relay.Tuple(outs)
    for var, value in reversed(bindings):
        body = relay.Let(var, value, body)
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function(xs, body)))
