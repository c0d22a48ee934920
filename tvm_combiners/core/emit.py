"""Turn a :class:`CombinePlan` into IR through a small builder interface each adapter implements.

The order of operations (pad and concatenate weights, build the combined root, rebuild each
follower with shared, concatenated or expanded side operands, split the result) lives here once;
adapters only know how to build one IR op of each kind.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from .branch_grouping import CombinePlan
from .graph import Dim, Graph


class PlanBuilder(Protocol):
    """IR-specific construction of the pieces of a combined op. Handles are IR expressions."""

    def value(self, node: int) -> Any:
        """The (possibly already rewritten) expression of an existing node."""

    def concat(self, parts: Sequence[Any], axis: int) -> Any: ...

    def pad(self, value: Any, pads: Sequence[tuple[int, int]]) -> Any:
        """Zero-pad ``value``: one ``(before, after)`` pair per dimension."""

    def broadcast(self, value: Any, shape: Sequence[Dim]) -> Any: ...

    def combined_root(self, plan: CombinePlan, data: Any, weight: Any) -> Any:
        """A copy of the plan's first root reading ``data`` and the concatenated ``weight``
        (with the plan's kernel alignment for convolutions)."""

    def combined_follower(self, plan: CombinePlan, template: int, operands: Sequence[Any]) -> Any:
        """A copy of follower ``template`` with new operands (right-aligned when ``plan.stack``)."""

    def reshape(self, value: Any, shape: Sequence[Dim]) -> Any: ...

    def split(self, value: Any, widths: Sequence[int], axis: int) -> list[Any]:
        """One piece per branch, in order."""


def emit_plan(plan: CombinePlan, graph: Graph, builder: PlanBuilder) -> list[Any]:
    """Build the combined op of ``plan``; return what replaces each branch's last node.

    Concatenated plans put branches side by side on the split axis. Stacked plans (``to_batch``)
    put branches of equal shape on a new leading axis of a batched op that broadcasts the shared
    input over it: the input is never copied once per branch.
    """
    stacked = plan.stack is not None
    combined = (_stacked_root if stacked else _concatenated_root)(plan, graph, builder)
    rank = len(graph[plan.roots[0]].shape) + (1 if plan.stack == "new" else 0)
    for step in plan.steps:
        template = graph[step.nodes[0]]
        if template.follower.identity:
            continue
        operands: list[Any] = [combined if i in step.carried else None for i in range(len(template.operands))]
        for side in step.sides:
            values = [builder.value(source) for source in side.sources]
            if side.mode == "shared":
                operands[side.position] = values[0]
            elif side.mode == "concat":
                operands[side.position] = builder.concat(values, side.axis)
            elif side.mode == "expand":
                expanded = [builder.broadcast(v, s) for v, s in zip(values, side.shapes)]
                operands[side.position] = builder.concat(expanded, side.axis)
            else:  # stack: lift each to the combined rank, one slice per branch on axis 0
                shape = tuple(graph[side.sources[0]].shape)
                lifted = [builder.reshape(v, (1,) * (rank - len(shape)) + shape) for v in values]
                operands[side.position] = builder.concat(lifted, 0)
        combined = builder.combined_follower(plan, step.nodes[0], operands)
    if not stacked:
        return builder.split(combined, plan.widths, plan.out_axis)
    parts = builder.split(combined, [1] * len(plan.roots), 0)
    if plan.stack == "batch":
        return parts
    return [builder.reshape(p, graph[end].shape) for p, end in zip(parts, plan.ends)]


def _weight(graph: Graph, root: int) -> tuple[int, tuple]:
    node = graph[root]
    weight = node.operands[node.root.weight]
    return weight, tuple(graph[weight].shape)


def _concatenated_root(plan: CombinePlan, graph: Graph, builder: PlanBuilder) -> Any:
    weights = []
    for b, r in enumerate(plan.roots):
        node, (weight_node, shape) = graph[r], _weight(graph, r)
        weight = builder.value(weight_node)
        if plan.alignment is not None and any(p != (0, 0) for p in plan.alignment.weight_pads[b]):
            pads = [(0, 0)] * len(shape)
            for axis, pad in zip(node.root.kernel_axes, plan.alignment.weight_pads[b]):
                pads[axis] = pad
            weight = builder.pad(weight, pads)
        weights.append(weight)
    first = graph[plan.roots[0]]
    if plan.shares == "weight":  # the weight is shared: inputs concatenate by rows instead
        inputs = [builder.value(graph[r].operands[graph[r].root.data]) for r in plan.roots]
        return builder.combined_root(plan, builder.concat(inputs, plan.concat_axis), weights[0])
    data = builder.value(first.operands[first.root.data])
    return builder.combined_root(plan, data, builder.concat(weights, plan.concat_axis))


def _stacked_root(plan: CombinePlan, graph: Graph, builder: PlanBuilder) -> Any:
    first = graph[plan.roots[0]]
    data_node = first.operands[first.root.data]
    weights = []
    for r in plan.roots:
        weight_node, shape = _weight(graph, r)
        weight = builder.value(weight_node)
        if plan.stack == "new":  # a 2-D weight gains one axis of extent 1 per input axis but the last,
            # so the stack lines up with the input's batch axes and the input broadcasts over it
            weight = builder.reshape(weight, (1,) * (len(graph[data_node].shape) - 1) + shape)
        weights.append(weight)
    data = builder.value(data_node)
    return builder.combined_root(plan, data, builder.concat(weights, 0))
