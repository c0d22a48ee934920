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
    """Build the combined op of ``plan``; return what replaces each branch's last node."""
    if plan.stack is not None:
        return _emit_stacked(plan, graph, builder)
    first = graph[plan.roots[0]]
    data = builder.value(first.operands[first.root.data])
    weights = []
    for b, r in enumerate(plan.roots):
        node = graph[r]
        weight = builder.value(node.operands[node.root.weight])
        if plan.alignment is not None and any(p != (0, 0) for p in plan.alignment.weight_pads[b]):
            pads = [(0, 0)] * len(graph[node.operands[node.root.weight]].shape)
            for axis, pad in zip(node.root.kernel_axes, plan.alignment.weight_pads[b]):
                pads[axis] = pad
            weight = builder.pad(weight, pads)
        weights.append(weight)
    combined = builder.combined_root(plan, data, builder.concat(weights, plan.weight_axis))
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
            else:
                expanded = [builder.broadcast(v, s) for v, s in zip(values, side.shapes)]
                operands[side.position] = builder.concat(expanded, side.axis)
        combined = builder.combined_follower(plan, step.nodes[0], operands)
    return builder.split(combined, plan.widths, plan.out_axis)


def _emit_stacked(plan: CombinePlan, graph: Graph, builder: PlanBuilder) -> list[Any]:
    """Branches of equal shape as one batched op over a leading axis of extent ``len(roots)``.

    The shared input is only viewed with an extra axis of extent 1 and broadcast by the batched
    matmul, never copied once per branch; per-branch operands are stacked on the leading axis.
    """
    first = graph[plan.roots[0]]
    weights = []
    for r in plan.roots:
        node = graph[r]
        weight = builder.value(node.operands[node.root.weight])
        if plan.stack == "new":
            weight = builder.reshape(weight, (1, *graph[node.operands[node.root.weight]].shape))
        weights.append(weight)
    data = builder.value(first.operands[first.root.data])
    combined = builder.combined_root(plan, data, builder.concat(weights, 0))
    rank = len(first.shape) + (1 if plan.stack == "new" else 0)
    for step in plan.steps:
        template = graph[step.nodes[0]]
        if template.follower.identity:
            continue
        operands: list[Any] = [combined if i in step.carried else None for i in range(len(template.operands))]
        for side in step.sides:
            values = [builder.value(source) for source in side.sources]
            if side.mode == "shared":
                operands[side.position] = values[0]
            else:
                shape = graph[side.sources[0]].shape
                lifted = [builder.reshape(v, (1,) * (rank - len(shape)) + tuple(shape)) for v in values]
                operands[side.position] = builder.concat(lifted, 0)
        combined = builder.combined_follower(plan, step.nodes[0], operands)
    parts = builder.split(combined, [1] * len(plan.roots), 0)
    if plan.stack == "batch":
        return parts
    return [builder.reshape(p, graph[end].shape) for p, end in zip(parts, plan.ends)]
