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

Groups are first formed against the graph's own reachability and the whole set is then proven
acyclic in one linear pass (:func:`contracted_order`). Only if groups would depend on each
other is the walk repeated, contracting reachability after the joins of the groups on that cycle,
and, should a cycle remain, after every join (as XLA recomputes it after every group), so no set
of groups can ever form a cycle.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from .graph import Contract, Graph, Node, Reachability, plan_without_cycles


@dataclass
class _OpenGroup:
    members: list[int] = field(default_factory=list)
    bits: int = 0
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
    """One walk in program order; ``contract`` says after which joins reachability is contracted
    (None: never, the fast way)."""
    exact = contract is not None
    reach = Reachability(graph)
    open_groups: dict[Hashable, list[_OpenGroup]] = {}
    done: list[list[int]] = []

    def fits(group: _OpenGroup, nbytes: int) -> bool:
        if threshold_bytes is not None and group.nbytes + nbytes > threshold_bytes:
            return False
        return threshold_count is None or len(group.members) < threshold_count

    def independent(group: _OpenGroup, node: int) -> bool:
        if reach.depends_on_any(node, group.bits):
            return False
        # Exact mode only: contracted groups can make an earlier member depend on a later node.
        return not exact or not any(reach.depends_on_any(m, 1 << node) for m in group.members)

    for node, key in zip(graph.nodes, keys):
        if key is None:
            continue
        nbytes = node.nbytes
        if threshold_bytes is not None and (nbytes is None or nbytes > threshold_bytes):
            continue  # unknown or too large on its own: leave it alone
        candidates = open_groups.setdefault(key, [])
        group = next((g for g in candidates if fits(g, nbytes or 0) and independent(g, node.index)), None)
        if group is None:
            group = _OpenGroup()
            candidates.append(group)
        group.members.append(node.index)
        group.bits |= 1 << node.index
        group.nbytes += nbytes or 0
        if contract is not None and len(group.members) > 1 and contract(group.members):
            reach.contract(group.members)
        if not fits(group, 0) or (threshold_bytes is not None and group.nbytes == threshold_bytes):
            candidates.remove(group)  # full: nothing more can join
            done.append(group.members)
    done.extend(g.members for groups in open_groups.values() for g in groups)
    return sorted((members for members in done if len(members) >= 2), key=lambda members: members[0])


