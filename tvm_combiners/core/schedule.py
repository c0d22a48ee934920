"""Order the rewritten region: every combined op after all its inputs, before all its users."""

from __future__ import annotations

import heapq
from collections.abc import Callable

from .branch_grouping import CombinePlan
from .graph import Graph

#: A scheduled unit: an untouched node (its index) or a combined op (its plan).
Unit = int | CombinePlan


def schedule(graph: Graph, plans: list[CombinePlan], is_leaf: Callable[[int], bool]) -> list[Unit]:
    """Topological order of untouched nodes and combined ops, as close to the original as possible.

    The nodes a plan replaces collapse into one unit that reads the union of their inputs; a heap
    keyed by original position keeps the order stable. Leaves (parameters, constants) are not
    scheduled. Raises RuntimeError if the plans would create a cycle (the planner's dependency
    check rules that out, so this is an internal error).
    """
    owner: dict[int, int] = {}
    for p, plan in enumerate(plans):
        for m in plan.members:
            owner[m] = -1 - p

    def unit(node: int) -> int:
        return owner.get(node, node)

    deps: dict[int, set[int]] = {}
    for node in graph.nodes:
        if is_leaf(node.index):
            continue
        u = unit(node.index)
        own = deps.setdefault(u, set())
        own.update(unit(d) for d in node.deps if not is_leaf(d) and unit(d) != u)
    users: dict[int, list[int]] = {u: [] for u in deps}
    pending = {u: len(d) for u, d in deps.items()}
    for u, ds in deps.items():
        for d in ds:
            users[d].append(u)
    position = {u: (min(plans[-1 - u].ends) if u < 0 else u) for u in deps}
    ready = [(position[u], u) for u, n in pending.items() if n == 0]
    heapq.heapify(ready)
    order: list[Unit] = []
    while ready:
        _, u = heapq.heappop(ready)
        order.append(plans[-1 - u] if u < 0 else u)
        for v in users[u]:
            pending[v] -= 1
            if pending[v] == 0:
                heapq.heappush(ready, (position[v], v))
    if len(order) != len(deps):
        raise RuntimeError("tvm_combiners internal error: combining would create a cycle; please report")
    return order
