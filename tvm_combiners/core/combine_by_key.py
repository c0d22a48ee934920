"""Group independent ops with equal keys, up to byte and count thresholds (XLA's combine-by-key).

The second combining algorithm of the core, beside branch grouping: where branch grouping merges
ops that share an input, this merges ops that merely *agree* (collectives with the same reduction,
dtype and replica groups) so that one larger op replaces many small ones. Adapters supply a key
per node (None: not combinable) and build the combined ops; this module only decides the groups.

Walk the nodes in program order. Unlike XLA, where a dependent op closes its key's group, a key
keeps several open groups: a node joins the oldest one it fits in (thresholds) and does not
depend on, and opens a new one otherwise, so independent ops after a dependent one still join
(``x -> allreduce -> add -> allreduce`` beside independent allreduces). A group closes when it is
full. A node larger than the byte threshold on its own is left alone.

A member of a group may also be several nodes, one per *stage* (:func:`group_by_key`): each stage
of a group becomes one combined op, emitted after the previous stage's, as a matched send and recv
become one send and one recv. A member then joins a group only if none of its nodes depends on a
node of the group at the same or a later stage, nor the other way round: a recv may read the
group's sends, but a send that read one of its recvs would wait for the combined recv that waits
for it.

Groups are first formed against the graph's own reachability and the whole set is then proven
acyclic in one linear pass (:func:`contracted_order`). Only if groups would depend on each
other is the walk repeated, contracting reachability after the joins of the groups on that cycle,
and, should a cycle remain, after every join (as XLA recomputes it after every group), so no set
of groups can ever form a cycle.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from .graph import Contract, Graph, Node, Reachability, plan_without_cycles


class Member(NamedTuple):
    """A candidate for :func:`group_by_key`: its ``key``, its ``nodes`` (one per stage) and the
    bytes it adds to a group (None: unknown)."""

    key: Hashable
    nodes: tuple[int, ...]
    nbytes: int | None


@dataclass
class _OpenGroup:
    stages: list[list[int]]  # per stage, the members' nodes in joining order
    bits: list[int]  # per stage, its nodes as a bitset
    last: list[int]  # per stage, its highest node
    size: int = 0
    nbytes: int = 0


def combine_by_key(
    graph: Graph,
    key_of: Callable[[Node], Hashable | None],
    threshold_bytes: int | None = None,
    threshold_count: int | None = None,
) -> list[list[int]]:
    """Groups (node indices in program order) of two or more nodes, ordered by their first node.

    ``None`` thresholds are unlimited; a threshold <= 0 disables combining (no groups), as a
    count below 2 does.
    """
    for name, value in (("threshold_bytes", threshold_bytes), ("threshold_count", threshold_count)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise TypeError(f"{name} must be an int or None, got {type(value).__name__} {value!r}")
    if (threshold_bytes is not None and threshold_bytes <= 0) or (threshold_count is not None and threshold_count < 2):
        return []
    keys = [key_of(node) for node in graph.nodes]
    return plan_without_cycles(graph, lambda contract: _walk(graph, keys, threshold_bytes, threshold_count, contract),
                               lambda group: group, lambda group: group[0])


def _walk(graph: Graph, keys: list[Hashable | None], threshold_bytes: int | None, threshold_count: int | None,
          contract: Contract | None) -> list[list[int]]:
    """One walk over the nodes with a key, each a member of one stage."""
    members = (Member(key, (i,), graph[i].nbytes) for i, key in enumerate(keys) if key is not None)
    return [stages[0] for stages in group_by_key(graph, members, threshold_bytes, threshold_count, contract)]


def group_by_key(graph: Graph, members: Iterable[Member], threshold_bytes: int | None, threshold_count: int | None,
                 contract: Contract | None, contracted: Sequence[Sequence[int]] = ()) -> list[list[list[int]]]:
    """One walk over ``members`` in the order given (all with as many stages); the groups of two or
    more members, each as its nodes per stage, ordered by their first node.

    Thresholds as in :func:`combine_by_key`, not validated. ``contract`` says after which joins
    reachability is contracted (called with all nodes of the group, contracted stage by stage;
    None: never, the fast way); ``contracted``: groups already chosen, contracted before the walk.
    """
    exact = contract is not None or bool(contracted)
    reach = Reachability(graph)
    for nodes in contracted:
        reach.contract(nodes)
    open_groups: dict[Hashable, list[_OpenGroup]] = {}
    done: list[list[list[int]]] = []

    def fits(group: _OpenGroup, nbytes: int) -> bool:
        if threshold_bytes is not None and group.nbytes + nbytes > threshold_bytes:
            return False
        return threshold_count is None or group.size < threshold_count

    def independent(group: _OpenGroup, nodes: tuple[int, ...]) -> bool:
        later = ahead = 0  # the group's nodes, the member's, at this stage or a later one
        lowest = len(graph)
        for stage in reversed(range(len(nodes))):
            later |= group.bits[stage]
            ahead |= 1 << nodes[stage]
            lowest = min(lowest, nodes[stage])
            if reach.depends_on_any(nodes[stage], later):
                return False
            # A node reads only lower indices unless groups were contracted, which can make an
            # earlier node depend on a later one.
            if (exact or group.last[stage] > lowest) and any(
                    reach.depends_on_any(m, ahead) for m in group.stages[stage]):
                return False
        return True

    for member in members:
        nbytes = member.nbytes
        if threshold_bytes is not None and (nbytes is None or nbytes > threshold_bytes):
            continue  # unknown or too large on its own: leave it alone
        nodes = member.nodes
        candidates = open_groups.setdefault(member.key, [])
        group = next((g for g in candidates if fits(g, nbytes or 0) and independent(g, nodes)), None)
        if group is None:
            group = _OpenGroup([[] for _ in nodes], [0] * len(nodes), [-1] * len(nodes))
            candidates.append(group)
        for stage, node in enumerate(nodes):
            group.stages[stage].append(node)
            group.bits[stage] |= 1 << node
            group.last[stage] = max(group.last[stage], node)
        group.size += 1
        group.nbytes += nbytes or 0
        if contract is not None and group.size > 1 and contract([n for part in group.stages for n in part]):
            for part in group.stages:
                reach.contract(part)
        if not fits(group, 0) or (threshold_bytes is not None and group.nbytes == threshold_bytes):
            candidates.remove(group)  # full: nothing more can join
            done.append(group.stages)
    done.extend(g.stages for groups in open_groups.values() for g in groups)
    return sorted((stages for stages in done if len(stages[0]) >= 2), key=lambda stages: stages[0][0])
