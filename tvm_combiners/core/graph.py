"""An IR-neutral view of one dataflow region: nodes, users, value numbers, reachability.

Adapters (Relax, Relay) translate their IR into a :class:`Graph`; the combiner algorithms in
this package only ever look at this view, so they are written once for both IRs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

#: A tensor dimension: a static ``int`` or a hashable key naming a symbolic extent.
Dim = Hashable


@dataclass(frozen=True)
class RootInfo:
    """What an adapter knows about a combinable op (matmul, conv2d, ...).

    ``key`` holds everything that must be equal for two ops to share one combined op (family,
    dtypes, attributes, the reduction extent). ``width`` is the branch's extent on ``out_axis``
    (its share of the combined output) and on ``weight_axis`` (its share of the combined weight).
    ``kernel`` is set for convolutions: per spatial axis ``(kernel size, pad before, pad after,
    dilation, stride)``, so kernels of different sizes can be aligned by zero padding.
    ``stack`` says how branches of equal shape can instead be stacked into one batched op:
    ``"new"`` (a new leading batch axis: 2-D matmuls) or ``"batch"`` (an existing batch axis of
    extent 1 grows); None when they cannot.
    """

    family: str
    data: int
    weight: int
    key: Hashable
    out_axis: int
    weight_axis: int
    width: Dim
    kernel: tuple[tuple[int, int, int, int, int], ...] | None = None
    kernel_axes: tuple[int, ...] = ()
    stack: str | None = None


@dataclass(frozen=True)
class FollowerInfo:
    """An elementwise or broadcasting op that may follow a root; ``key`` = op and attributes.

    Operands broadcast numpy-style (right-aligned) unless ``operand_axes`` names, for an operand
    position, which output axis each of its dimensions lies on (Relay's ``bias_add`` puts a 1-D
    bias on a chosen axis). ``identity`` marks ops that return their input unchanged (a reshape
    to the same shape): the combined op simply skips them. Operands of a ``commutative`` binary op
    may appear in either order (``add(bias, y)`` beside ``add(y, bias)``).
    """

    key: Hashable
    operand_axes: tuple[tuple[int, tuple[int, ...]], ...] = ()
    identity: bool = False
    commutative: bool = False


@dataclass
class Node:
    """One value in the region.

    ``operands`` are the tensor operands in argument order (what a rewrite may replace);
    ``deps`` are every value the node reads, operands included (what reachability follows).
    ``value_key`` is ``None`` for values that are only equal to themselves (parameters,
    constants, impure calls); otherwise two nodes with equal keys and equal operand values
    compute the same value.
    """

    index: int
    op: str
    operands: tuple[int, ...]
    deps: tuple[int, ...]
    shape: tuple[Dim, ...] | None
    dtype: str | None
    value_key: Hashable | None = None
    root: RootInfo | None = None
    follower: FollowerInfo | None = None
    escapes: bool = False
    split_sections: int | None = None
    handle: Any = None

    @property
    def nbytes(self) -> int | None:
        """Static size in bytes, or None when a dimension is symbolic or the dtype unknown."""
        if self.shape is None or self.dtype is None or any(not isinstance(d, int) for d in self.shape):
            return None
        count = 1
        for d in self.shape:
            count *= d
        return count * dtype_bytes(self.dtype)


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of a TVM dtype string such as ``float32`` or ``int8x4``."""
    bits = int("".join(ch for ch in dtype.split("x")[0] if ch.isdigit()) or 8)
    lanes = int(dtype.split("x")[1]) if "x" in dtype else 1
    return max(1, bits * lanes // 8)


@dataclass
class Graph:
    """Nodes in topological order (every dependency has a smaller index)."""

    nodes: list[Node] = field(default_factory=list)

    def add(self, **kwargs: Any) -> Node:
        node = Node(index=len(self.nodes), **kwargs)
        for d in node.deps:
            if d >= node.index:
                raise ValueError(f"node {node.index} ({node.op}) depends on later node {d}")
        self.nodes.append(node)
        return node

    def __len__(self) -> int:
        return len(self.nodes)

    def __getitem__(self, index: int) -> Node:
        return self.nodes[index]

    def users(self) -> list[list[int]]:
        """For every node, the distinct nodes that read it, in order."""
        result: list[list[int]] = [[] for _ in self.nodes]
        for node in self.nodes:
            for d in dict.fromkeys(node.deps):
                result[d].append(node.index)
        return result

    def value_numbers(self) -> list[int]:
        """Hash-consed value numbers: equal numbers mean structurally equal values."""
        table: dict[Hashable, int] = {}
        numbers: list[int] = []
        for node in self.nodes:
            if node.value_key is None:
                key: Hashable = ("unique", node.index)
            else:
                key = (node.value_key, tuple(numbers[d] for d in node.deps))
            numbers.append(table.setdefault(key, len(table)))
        return numbers


class Reachability:
    """Ancestor sets as integer bitsets over a graph whose node groups may be contracted.

    Contracting a group (the nodes one combined op replaces) merges their ancestor sets: after
    the rewrite every user of any group member depends on every input of every member. XLA's
    combiners recompute reachability after each combination for the same reason.
    """

    def __init__(self, graph: Graph) -> None:
        self._graph = graph
        self._rep = list(range(len(graph)))  # node -> representative of its contracted group
        self._members: dict[int, list[int]] = {}
        self._ancestors: list[int] = []
        self._recompute()

    def _recompute(self) -> None:
        anc = [0] * len(self._graph)
        for node in self._graph.nodes:
            bits = 0
            for d in node.deps:
                bits |= anc[d] | (1 << d)
            anc[node.index] = bits
        # Contracted groups: every member sees the union of members' ancestors, iterated to a
        # fixed point because one group's union may pull in another group's members.
        changed = True
        while changed and self._members:
            changed = False
            for members in self._members.values():
                union = 0
                for m in members:
                    union |= anc[m]
                for m in members:
                    if anc[m] != union:
                        anc[m] = union
                        changed = True
            for node in self._graph.nodes:
                bits = anc[node.index]
                for d in node.deps:
                    bits |= anc[d] | (1 << d)
                if bits != anc[node.index]:
                    anc[node.index] = bits
                    changed = True
        self._ancestors = anc

    def depends_on_any(self, node: int, targets: int) -> bool:
        """Whether ``node`` (or its contracted group) reads any node in bitset ``targets``."""
        return bool(self._ancestors[node] & targets)

    def contract(self, members: Sequence[int]) -> None:
        rep = min(members)
        merged = list(members)
        for m in members:
            old = self._rep[m]
            if old in self._members and old != rep:
                merged.extend(self._members.pop(old))
        merged = sorted(set(merged))
        for m in merged:
            self._rep[m] = rep
        self._members[rep] = merged
        self._recompute()


def bitset(indices: Sequence[int]) -> int:
    bits = 0
    for i in indices:
        bits |= 1 << i
    return bits


def constant_key(shape: Sequence[Dim] | None, load: Callable[[], Any], max_elements: int = 64) -> Hashable | None:
    """Value key of a small constant, so equal scalars written twice count as one value.

    ``load`` returns the numpy value and is called only for small constants: large ones stay
    identity-keyed, since reading and hashing their bytes would cost more than it finds.
    """
    if shape is None or any(not isinstance(d, int) for d in shape) or math.prod(shape) > max_elements:
        return None
    array = load()
    return ("constant", str(array.dtype), tuple(array.shape), array.tobytes())
