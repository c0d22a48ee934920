"""What every collective combiner does per region, whatever the IR: units in, a plan out.

The adapters (``collectives.relax.combiners``, ``collectives.relay.combiners``) turn a region into
units (:class:`Unit`: what each reads, which op it is, whether it is a barrier) and emit the IR for
the :class:`~.planning.RegionPlan` that :func:`plan_combining` returns. In between, always in this
sequence: pin units to barriers, match sends with recvs (a recv waits for its send, whichever
families combine: a collective must not move across a transfer it waits on), put the units in the
order they run, build the neutral graph, pick the transfers this pass may combine, key the
collectives, plan the region (:func:`~.planning.plan_region`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Sequence
from typing import Protocol

from ...core.graph import Graph, parse_dtype_bits
from ..dependences import order_around_barriers
from ..ordering import OrderNode, OrderPlan, SendRecvOrderError, index_order, plan_send_recv_order
from .keys import ChannelBook
from .options import CombinerOptions
from .planning import RegionPlan, plan_region

_TRANSFER_FAMILIES = ("send", "recv")


class CombinableOp(Protocol):
    """A classified op, as the driver reads it (the adapters' own ops carry more)."""

    family: str  # allreduce | allgather | reduce_scatter | send | recv | ccl.allreduce | ccl.allgather
    key: Hashable
    shape: tuple[int, ...]
    dtype: str


@dataclasses.dataclass(frozen=True)
class Unit:
    """One unit of a region, in the region's order."""

    #: Earlier units it must follow (what it reads, in-place writes).
    deps: tuple[int, ...] = ()
    #: The op it is, classified whatever the pass combines; None: nothing to combine.
    op: CombinableOp | None = None
    #: A send or recv, as the IR's runtime matches it (its ``deps`` are replaced by the unit's).
    transfer: OrderNode | None = None
    #: An effect no unit marked below may cross.
    barrier: bool = False
    #: Stays before the next barrier.
    before_barrier: bool = False
    #: Stays after the previous barrier.
    after_barrier: bool = False
    #: A call of a function that sends or receives: transfers on channels that functions share
    #: stay on their side of it (a channel's messages pair first in, first out across functions).
    calls_transfers: bool = False


def plan_combining(units: Sequence[Unit], opts: CombinerOptions, channels: ChannelBook, *,
                   topological: bool = False, hidden_transfers: bool = False, ends_share_key: bool = False,
                   dtype_bits: Callable[[str], int] = parse_dtype_bits) -> RegionPlan | None:
    """Which units combine and the order to emit the region in, in unit indices; None: change nothing.

    ``topological``: the IR runs the units in any topological order (Relay's executors), so the
    send -> recv edges may reorder them and they are planned in the order they then take.
    Otherwise (Relax) they run as listed, and transfers that do not match in that order (a recv
    before its send, counts or pairs that differ) change nothing: they are OrderSendRecv's to fix
    or report. ``hidden_transfers``: a send or recv sits where the region cannot see it, so no match
    is provable where the region has transfers. ``ends_share_key``: a transfer combines only where
    its recv's key is its send's. ``dtype_bits``: the IR's bits per element of a dtype.
    """
    deps = _pinned_deps(units, channels)
    matched = _match_transfers(units, topological, hidden_transfers)
    if matched is None:
        return None
    for s, r in matched.matches:
        deps[r].add(s)
    order = _run_order(deps, topological)
    if order is None:
        return None
    at = {old: k for k, old in enumerate(order)}
    graph, ops = _graph(units, deps, order, at, opts, dtype_bits)
    transfers = _combinable_transfers(units, matched.matches, ops, at, channels, ends_share_key)
    keys = [op.key if op is not None and op.family not in _TRANSFER_FAMILIES else None for op in ops]
    plan = plan_region(graph, keys, transfers, opts.threshold_bytes, opts.threshold_count, opts.op_cap(),
                       [[(at[s], at[r]) for s, r in pairs] for pairs in matched.channels])
    return _in_units(plan, order) if plan.changed else None


def _pinned_deps(units: Sequence[Unit], channels: ChannelBook) -> list[set[int]]:
    """Each unit's deps, plus the order its barriers and calls of transfer-holding functions impose."""
    deps = [set(u.deps) for u in units]
    order_around_barriers(deps, [u.barrier for u in units], before=[u.before_barrier for u in units],
                          after=[u.after_barrier for u in units])
    calls = [u.calls_transfers for u in units]
    if any(calls):  # the book of shared channels is read only where a function calls one that transfers
        shared = [u.transfer is not None and u.transfer.channel_id in channels.shared for u in units]
        order_around_barriers(deps, calls, before=shared, after=shared)
    return deps


def _match_transfers(units: Sequence[Unit], topological: bool, hidden_transfers: bool) -> OrderPlan | None:
    """The sends and recvs matched as the runtime matches them; None: no match is provable."""
    if not any(u.transfer is not None for u in units):
        return OrderPlan(order=[], channels=[])
    if hidden_transfers:
        return None
    # on the units' own deps, as OrderSendRecv reads them (pins add no match, only a refusal)
    nodes = [OrderNode("other", u.deps) if u.transfer is None else dataclasses.replace(u.transfer, deps=u.deps)
             for u in units]
    if topological:  # OrderSendRecv has ordered these already: an error here is one to report
        return plan_send_recv_order(nodes, "combiner")
    try:
        plan = plan_send_recv_order(nodes, "combiner")
    except SendRecvOrderError:
        return None
    return None if any(s > r for s, r in plan.matches) else plan


def _run_order(deps: Sequence[set[int]], topological: bool) -> list[int] | None:
    """The units in the order they run: as listed, or the topological order nearest it (None: a cycle)."""
    if not topological:
        return list(range(len(deps)))
    return index_order([sorted(d) for d in deps])


def _graph(units: Sequence[Unit], deps: Sequence[set[int]], order: Sequence[int], at: dict[int, int],
           opts: CombinerOptions, dtype_bits: Callable[[str], int]) -> tuple[Graph, list[CombinableOp | None]]:
    """The neutral graph of the units in run order (``at``: unit -> position), and each node's op
    where this pass combines it."""
    graph = Graph(dtype_bits=dtype_bits)
    ops: list[CombinableOp | None] = []
    for old in order:
        op = units[old].op
        if op is not None and not opts.combines(op.family, op.key):
            op = None
        graph.add(op="unit", operands=(), deps=tuple(sorted(at[d] for d in deps[old])),
                  shape=op.shape if op is not None else None, dtype=op.dtype if op is not None else None)
        ops.append(op)
    return graph, ops


def _combinable_transfers(units: Sequence[Unit], matches: Sequence[tuple[int, int]],
                          ops: Sequence[CombinableOp | None], at: dict[int, int], channels: ChannelBook,
                          ends_share_key: bool) -> list[tuple[int, int, Hashable]]:
    """The matched transfers this pass may combine, as (send, recv, key) in run order: both ends
    combined by this pass, on a channel no other function shares."""
    out = []
    for s, r in matches:
        send, recv = ops[at[s]], ops[at[r]]
        if send is None or recv is None or (ends_share_key and send.key != recv.key):
            continue
        if units[s].transfer.channel_id not in channels.shared:  # type: ignore[union-attr]
            out.append((at[s], at[r], send.key))
    return sorted(out)


def _in_units(plan: RegionPlan, order: Sequence[int]) -> RegionPlan:
    """The plan with run-order positions mapped back to unit indices."""
    back = lambda members: [order[m] for m in members]  # noqa: E731
    return RegionPlan([back(g) for g in plan.groups], [(back(s), back(r)) for s, r in plan.transfers],
                      [order[u] if u >= 0 else u for u in plan.order])
