"""Which ops of one region combine, and in what order the region is re-emitted (IR-neutral).

Collectives group through the core's :func:`~tvm_combiners.core.combine_by_key.combine_by_key`
(skip-ahead, exact thresholds, proven acyclic). Sends and recvs group as *transfers*: a transfer is
a matched (send, recv) pair, and a group of transfers becomes one send and one recv, so the send
group and the recv group must mirror each other. The driver (:mod:`.driver`) adds the edge
send -> recv for every match to the graph (a recv waits for its send), so keeping the contracted
graph acyclic keeps the combined send before the combined recv: no cycle and no deadlock. Transfers group through the same
core walk as collectives, each a member of two stages, send then recv
(:func:`~tvm_combiners.core.combine_by_key.group_by_key`): first against the graph's own
reachability, the whole plan then proven acyclic in one pass; only where it is not, again with
reachability contracted after every join (exact, as XLA does).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from ...core.combine_by_key import Member, combine_by_key, group_by_key
from ...core.graph import Graph, contracted_order
from ..ordering import channel_chains


@dataclass(frozen=True)
class RegionPlan:
    """``groups``: collective groups; ``transfers``: (sends, recvs) per combined transfer; ``order``:
    units to emit, node indices and ``-1 - u`` for unit ``u`` of :attr:`units`."""

    groups: list[list[int]]
    transfers: list[tuple[list[int], list[int]]]
    order: list[int]

    @property
    def units(self) -> list[list[int]]:
        return [*self.groups, *(part for pair in self.transfers for part in pair)]

    @property
    def changed(self) -> bool:
        return bool(self.groups or self.transfers)


def _limits(threshold_bytes: int, threshold_count: int) -> bool:
    return threshold_bytes > 0 and threshold_count >= 2


def group_transfers(graph: Graph, groups: Sequence[Sequence[int]], transfers: Sequence[tuple[int, int, Hashable]],
                    threshold_bytes: int, threshold_count: int, exact: bool = True) -> list[tuple[list[int], list[int]]]:
    """Groups of (send, recv, key) transfers, given collective ``groups`` already chosen: the core's
    walk (:func:`~tvm_combiners.core.combine_by_key.group_by_key`), each transfer a member of two
    stages, its send's bytes.

    ``exact``: reachability contracted for the collective groups and after every join (O(n)
    each: 3000 transfers took 35 s); otherwise the graph's own, and the caller proves the whole
    plan acyclic afterwards."""
    if not transfers or not _limits(threshold_bytes, threshold_count):
        return []
    members = (Member(key, (s, r), graph[s].nbytes) for s, r, key in transfers)
    found = group_by_key(graph, members, threshold_bytes, threshold_count,
                         (lambda _nodes: True) if exact else None, groups if exact else ())
    return [(sends, recvs) for sends, recvs in found]


def _rooted(graph: Graph, edges: Sequence[tuple[int, int]] = ()) -> Graph:
    """The graph, with ``edges`` (earlier, later) added, behind one entry node that every
    dependency-free node reads.

    ``combine_by_key`` proves its groups acyclic while skipping nodes without dependencies (as
    leaves), which is sound only if no such node is in a group; a collective of a function
    parameter is one. Behind the entry node no group member is dependency-free.
    """
    extra: dict[int, set[int]] = {}
    for a, b in edges:
        extra.setdefault(b, set()).add(a)
    out = Graph(dtype_bits=graph.dtype_bits)
    out.add(op="entry", operands=(), deps=(), shape=None, dtype=None)
    for node in graph.nodes:
        deps = tuple(d + 1 for d in sorted({*node.deps, *extra.get(node.index, ())})) or (0,)
        out.add(op=node.op, operands=(), deps=deps, shape=node.shape, dtype=node.dtype, bits=node.bits)
    return out


def plan_region(graph: Graph, keys: Sequence[Hashable | None], transfers: Sequence[tuple[int, int, Hashable]],
                threshold_bytes: int, threshold_count: int, max_op_bytes: int | None = None,
                channels: Sequence[Sequence[tuple[int, int]]] = ()) -> RegionPlan:
    """Groups and a re-emission order for one region (``keys[i]``: node i's collective key or None).

    Ops above ``max_op_bytes`` are left alone (packing them would cost more than it saves), and so
    are empty ones: nothing to move, and Relay's reshape reads a 0 in a shape as "keep this axis"
    (an allreduce of a (2, 0) tensor packed with another failed to type).

    ``channels``: each channel's (send, recv) transfers in the order MPI matches them. Those left on
    their channel must still pair up in the order they are emitted (a combined transfer gets a
    channel of its own): an allreduce group placed between two sends of a channel moved the first
    send, which reads the group, behind the second, and each recv got the other's payload. Where
    the plan would mispair them, the region is planned again with each channel's order as edges
    (which keeps two transfers of one channel from combining); where that is not possible,
    nothing changes.
    """
    fits = [not n.empty and (max_op_bytes is None or (n.nbytes is not None and n.nbytes <= max_op_bytes))
            for n in graph.nodes]
    keys = [k if fits[i] else None for i, k in enumerate(keys)]
    transfers = [t for t in transfers if fits[t[0]]]
    plan = _plan_rooted(graph, keys, transfers, threshold_bytes, threshold_count, [])
    if _keeps_channel_pairs(plan, channels):
        return plan
    edges = channel_chains(channels)
    if any(a >= b for a, b in edges):  # the graph's order is not the channel's: nothing is provable
        return RegionPlan([], [], list(range(len(graph))))
    return _plan_rooted(graph, keys, transfers, threshold_bytes, threshold_count, edges)


def _plan_rooted(graph: Graph, keys: Sequence[Hashable | None], transfers: Sequence[tuple[int, int, Hashable]],
                 threshold_bytes: int, threshold_count: int, edges: Sequence[tuple[int, int]]) -> RegionPlan:
    shifted = _plan(_rooted(graph, edges), [None, *keys], [(s + 1, r + 1, k) for s, r, k in transfers],
                    threshold_bytes, threshold_count)
    back = lambda members: [m - 1 for m in members]  # noqa: E731
    order = [u if u < 0 else u - 1 for u in shifted.order if u != 0]
    return RegionPlan([back(g) for g in shifted.groups], [(back(s), back(r)) for s, r in shifted.transfers], order)


def _keeps_channel_pairs(plan: RegionPlan, channels: Sequence[Sequence[tuple[int, int]]]) -> bool:
    """Whether the transfers that stay on each channel still pair up: the k-th send emitted with the
    k-th recv emitted (two sends swapped along with their recvs still pair up)."""
    at = {u: k for k, u in enumerate(plan.order) if u >= 0}
    for pairs in channels:
        kept = [(s, r) for s, r in pairs if s in at and r in at]
        by_send = [r for _, r in sorted(kept, key=lambda pair: at[pair[0]])]
        if by_send != sorted((r for _, r in kept), key=at.__getitem__):
            return False
    return True


def _plan(graph: Graph, keys: Sequence[Hashable | None], transfers: Sequence[tuple[int, int, Hashable]],
          threshold_bytes: int, threshold_count: int) -> RegionPlan:
    groups: list[list[int]] = []
    if any(k is not None for k in keys):
        groups = combine_by_key(graph, lambda node: keys[node.index], threshold_bytes, threshold_count)
    attempts = (lambda: group_transfers(graph, groups, transfers, threshold_bytes, threshold_count, exact=False),
                lambda: group_transfers(graph, groups, transfers, threshold_bytes, threshold_count), lambda: [])
    for attempt in attempts:  # fast, then exact only where the fast plan holds a cycle, then none
        pairs = attempt()
        plan = RegionPlan(groups, pairs, [])
        firsts = [members[0] for members in plan.units]
        order = contracted_order(graph, plan.units, lambda _i: False, firsts.__getitem__)
        if order is not None:
            return RegionPlan(groups, pairs, order)
    raise AssertionError("collective combiners: combine_by_key returned groups that form a cycle")
