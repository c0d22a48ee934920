"""The user-facing description of a group about to be combined (for ``check`` and reports)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .branch_grouping import CombinePlan
from .graph import Graph


@dataclass(frozen=True)
class CombineCandidate:
    """A group of branches, described with the IR's own expressions.

    ``roots`` are the matmul/conv calls, ``weights`` their weight operands, ``inputs`` their
    input operands, ``followers`` the elementwise ops combined after each root (per branch),
    ``widths`` each branch's share of the split axis. ``shares`` is ``"input"`` (``data`` is the
    one input all branches read) or ``"weight"`` (all ``weights`` are one weight; the inputs
    concatenate by rows and ``widths`` are their row counts).
    """

    family: str
    data: Any
    roots: tuple[Any, ...]
    weights: tuple[Any, ...]
    followers: tuple[tuple[Any, ...], ...]
    widths: tuple[Any, ...]  # ints; a symbolic last one where the IR allows it
    follower_ops: tuple[str, ...]
    input_shape: tuple | None = None
    weight_shapes: tuple = ()
    stacked: bool = False
    shares: str = "input"
    inputs: tuple[Any, ...] = ()

    def describe(self) -> str:
        """One line for reports: ops, input and weight shapes, branch widths."""
        chain = " -> ".join((self.family,) + self.follower_ops)
        if self.shares == "weight":
            return (f"{len(self.roots)} x {chain}: shared weight {_fmt(self.weight_shapes[0])}, "
                    f"inputs of rows {list(self.widths)}")
        shapes = {tuple(s) if s is not None else None for s in self.weight_shapes}
        weights = f"{len(self.weight_shapes)} x {_fmt(self.weight_shapes[0])}" if len(shapes) == 1 else \
            ", ".join(_fmt(s) for s in self.weight_shapes)
        how = "stacked" if self.stacked else "widths"
        return f"{len(self.roots)} x {chain}: input {_fmt(self.input_shape)}, weights {weights}, {how} {list(self.widths)}"


def _fmt(shape: tuple | None) -> str:
    return "?" if shape is None else "(" + ", ".join(str(d) for d in shape) + ")"


def candidate_of(plan: CombinePlan, graph: Graph, expr_of: Callable[[int], Any]) -> CombineCandidate:
    first = graph[plan.roots[0]]
    return CombineCandidate(
        family=plan.family,
        data=expr_of(first.operands[first.root.data]),
        roots=tuple(expr_of(r) for r in plan.roots),
        weights=tuple(expr_of(graph[r].operands[graph[r].root.weight]) for r in plan.roots),
        followers=tuple(tuple(expr_of(step.nodes[b]) for step in plan.steps) for b in range(len(plan.roots))),
        widths=plan.widths,
        follower_ops=tuple(graph[step.nodes[0]].op for step in plan.steps),
        input_shape=graph[first.operands[first.root.data]].shape,
        weight_shapes=tuple(graph[graph[r].operands[graph[r].root.weight]].shape for r in plan.roots),
        stacked=plan.stack is not None,
        shares=plan.shares,
        inputs=tuple(expr_of(graph[r].operands[graph[r].root.data]) for r in plan.roots),
    )
