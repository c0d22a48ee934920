"""Order the rewritten region: every combined op after all its inputs, before all its users."""

from __future__ import annotations

from collections.abc import Callable

from .branch_grouping import CombinePlan
from .graph import Graph, contracted_order

#: A scheduled unit: an untouched node (its index) or a combined op (its plan).
Unit = int | CombinePlan


def schedule(graph: Graph, plans: list[CombinePlan], is_leaf: Callable[[int], bool]) -> list[Unit]:
    """Topological order of untouched nodes and combined ops, as close to the original as possible.

    The nodes a plan replaces collapse into one unit that reads the union of their inputs; a heap
    keyed by original position keeps the order stable. Leaves (parameters, constants) are not
    scheduled. Raises RuntimeError if the plans would create a cycle (the planner's dependency
    check rules that out, so this is an internal error).
    """
    order = contracted_order(graph, [plan.members for plan in plans], is_leaf, lambda p: min(plans[p].ends))
    if order is None:
        raise RuntimeError("tvm_combiners internal error: combining would create a cycle; please report")
    return [plans[-1 - u] if u < 0 else u for u in order]
