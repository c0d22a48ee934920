"""A Relay function's top-level let chain, and whether the collective passes may re-emit it in another order.

The combiners reorder a chain (so that a combined op sits after its last operand) only where every
collective, send, recv and opaque node holding some is the whole value of one binding, read nowhere
else but through its variable. ``OrderSendRecv`` reads chains the same way: it gives a recv its
send's let variable (not its call) only in such a chain, where the variable keeps the chain
reorderable; elsewhere a variable token would pin a recv group where its first member sits, before
later sends are bound, and the combiners would build fewer groups.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from tvm import relay

_REFS = (relay.RefCreate, relay.RefRead, relay.RefWrite)


@dataclasses.dataclass
class LetChain:
    """A function body's top-level ``let v1 = e1; let v2 = e2; ...; result``, read once."""

    lets: list[relay.Let]
    result: relay.Expr
    var_of: dict[relay.Expr, relay.Var]  # each bound value -> its variable (the last, if bound twice)


def let_chain(body: relay.Expr) -> LetChain:
    lets = []
    while isinstance(body, relay.Let):
        lets.append(body)
        body = body.body
    return LetChain(lets, body, {let.value: let.var for let in lets})


def reorderable(chain: LetChain, whole: relay.Expr, reg: Any, ordered: Sequence[bool]) -> bool:
    """Whether ``chain`` can be re-emitted in another order: every ``ordered`` expression of the
    region ``reg`` (:func:`..relay.region`) is the whole value of one top-level binding and read
    nowhere else but through its variable, so it moves exactly where the new order puts it; no two
    bindings share one value; and no reference cell is read or written (the order between those is
    not a dependence the passes see)."""
    if not chain.lets:
        return False
    values = chain.var_of
    if len(values) != len(chain.lets) or not all(e in values for e, must in zip(reg.exprs, ordered) if must):
        return False
    lets = set(chain.lets)
    for user, deps in zip(reg.exprs, reg.deps):
        for d in deps:
            e = reg.exprs[d]
            if not ordered[d] or (user in lets and user.value.same_as(e)) or user.same_as(values[e]):
                continue  # its own binding in the chain, and its variable
            return False  # also read elsewhere (an operand, a let body): it would run twice
    refs: list[relay.Expr] = []
    relay.analysis.post_order_visit(whole, lambda e: refs.append(e) if isinstance(e, _REFS) else None)
    return not refs
