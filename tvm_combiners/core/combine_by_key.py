"""Group independent ops with equal keys, up to byte and count thresholds (XLA's combine-by-key).

The second combining algorithm of the core, beside branch grouping: where branch grouping merges
ops that share an input, this merges ops that merely *agree* (collectives with the same reduction,
dtype and replica groups) so that one larger op replaces many small ones. Adapters supply a key
per node (None: not combinable) and build the combined ops; this module only decides the groups.

Walk the nodes in program order; every key has one open group. A node joins its key's group
unless that would exceed ``threshold_bytes`` or ``threshold_count`` or the node depends on a
member (then the group is closed and a new one opened). A node larger than the byte threshold
on its own is left alone. Closed groups of two or more are contracted in the reachability
relation at once, and a closing group drops members that now depend on one another, so no group
can form a cycle with an earlier one (XLA recomputes reachability after each group for this).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from .graph import Graph, Node, Reachability, bitset


@dataclass
class _OpenGroup:
    members: list[int] = field(default_factory=list)
    nbytes: int = 0


def combine_by_key(
    graph: Graph,
    key_of: Callable[[Node], Hashable | None],
    threshold_bytes: int | None = None,
    threshold_count: int | None = None,
) -> list[list[int]]:
    """Groups (node indices in program order) of two or more nodes to combine, in closing order."""
    if threshold_bytes is not None and threshold_bytes <= 0:
        raise ValueError(f"threshold_bytes must be positive, got {threshold_bytes}")
    if threshold_count is not None and threshold_count < 2:
        raise ValueError(f"threshold_count must be >= 2, got {threshold_count}")
    reach = Reachability(graph)
    open_groups: dict[Hashable, _OpenGroup] = {}
    done: list[list[int]] = []

    def close(key: Hashable) -> None:
        # Groups closed since this one opened may have made members depend on each other
        # (through a contracted group): keep only members independent of those kept so far.
        kept: list[int] = []
        for m in open_groups.pop(key).members:
            if not reach.depends_on_any(m, bitset(kept)) and not any(reach.depends_on_any(k, 1 << m) for k in kept):
                kept.append(m)
        if len(kept) >= 2:
            done.append(kept)
            reach.contract(kept)

    for node in graph.nodes:
        key = key_of(node)
        if key is None:
            continue
        nbytes = node.nbytes
        if threshold_bytes is not None and (nbytes is None or nbytes > threshold_bytes):
            continue  # unknown or too large on its own: leave it alone
        group = open_groups.get(key)
        if group is not None:
            too_big = threshold_bytes is not None and group.nbytes + nbytes > threshold_bytes
            too_many = threshold_count is not None and len(group.members) + 1 > threshold_count
            dependent = reach.depends_on_any(node.index, bitset(group.members))
            if too_big or too_many or dependent:
                close(key)
                group = None
        if group is None:
            group = open_groups.setdefault(key, _OpenGroup())
        group.members.append(node.index)
        group.nbytes += nbytes or 0
    for key in list(open_groups):
        close(key)
    return done
