"""An IR-neutral view of one dataflow region: nodes, users, value numbers, reachability.

Adapters (Relax, Relay) translate their IR into a :class:`Graph`; the combiner algorithms in
this package only ever look at this view, so they are written once for both IRs.
"""

from __future__ import annotations

import functools
import hashlib
import heapq
import math
import re
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

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
    ``"new"`` (a new leading batch axis: matmuls with 2-D weights, over the input's own batch
    axes) or ``"batch"`` (an existing batch axis of extent 1 grows); None when they cannot.
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
    ``deps`` are every value the node reads, operands included, in argument order with repeats
    kept (reachability follows them; value numbering keys on them, so ``f(a, a, b)`` and
    ``f(a, b, b)`` stay apart). ``value_key`` is ``None`` for values that are only equal to
    themselves (parameters, constants, impure calls); otherwise two nodes with equal keys, equal
    types and equal ordered ``deps`` compute the same value.
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
    bits: int | None = None  # per element, lanes included (set by Graph.add from its dtype_bits)

    @property
    def nbytes(self) -> int | None:
        """Static size in bytes, or None when a dimension is symbolic or the dtype unknown."""
        if self.shape is None or self.bits is None or any(not isinstance(d, int) for d in self.shape):
            return None
        return -(-math.prod(self.shape) * self.bits // 8)  # sub-byte dtypes pack: round up once

    @property
    def empty(self) -> bool:
        """A static extent is 0. Such a tensor is never combined: there is nothing to compute, and
        both IRs' reshape read a 0 in the new shape as "keep this axis's extent"."""
        return self.shape is not None and any(isinstance(d, int) and d == 0 for d in self.shape)


def parse_dtype_bits(dtype: str) -> int:
    """Bits per element of a dtype string (``float32``, ``int8x4``, ``float8_e4m3fn``, ``bool``).

    Adapters pass the IR's own answer (``tvm.DataType``) instead; this serves graphs built
    without an IR and dtypes the IR cannot parse. Booleans are stored one per byte.
    """
    match = re.fullmatch(r"[a-z]*?(\d+)(?:_[a-z0-9]*?)?(?:x(\d+))?", dtype)
    if dtype == "bool" or match is None:
        return 8
    return int(match.group(1)) * int(match.group(2) or 1)


def ir_dtype_bits(datatype: Callable[[str], Any]) -> Callable[[str], int]:
    """``Graph.dtype_bits`` from an IR's own dtype class (``tvm.DataType``: ``bits``, ``lanes``).

    Cached per dtype string: a graph has a handful of dtypes and parsing one is an FFI call.
    """

    @functools.cache
    def bits(dtype: str) -> int:
        if dtype == "bool":
            return 8
        try:
            parsed = datatype(dtype)
        except Exception:  # a name this TVM does not know: read the string
            return parse_dtype_bits(dtype)
        return int(parsed.bits) * int(parsed.lanes)

    return bits


@dataclass
class Graph:
    """Nodes in topological order (every dependency has a smaller index)."""

    nodes: list[Node] = field(default_factory=list)
    dtype_bits: Callable[[str], int] = parse_dtype_bits

    def add(self, **kwargs: Any) -> Node:
        node = Node(index=len(self.nodes), **kwargs)
        if node.dtype is not None and node.bits is None:
            node.bits = self.dtype_bits(node.dtype)
        if node.deps and max(node.deps) >= node.index:
            raise ValueError(f"node {node.index} ({node.op}) depends on later node {max(node.deps)}")
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
        """Hash-consed value numbers: equal numbers mean structurally equal values.

        The key is the op with its attributes, the result type and the *ordered* operand values
        (repeats included): anything less would merge values that differ.
        """
        table: dict[Hashable, int] = {}
        numbers: list[int] = []
        for node in self.nodes:
            if node.value_key is None:
                key: Hashable = ("unique", node.index)
            else:
                key = (node.value_key, node.dtype, node.shape, tuple(numbers[d] for d in node.deps))
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

    def ancestors(self, node: int) -> int:
        """Bitset of every node ``node`` (or its contracted group) reads, directly or not."""
        return self._ancestors[node]

    def depends_on_any(self, node: int, targets: int) -> bool:
        """Whether ``node`` (or its contracted group) reads any node in bitset ``targets``."""
        return bool(self._ancestors[node] & targets)

    def contract(self, members: Sequence[int]) -> None:
        rep = min(members)
        merged = list(members)
        for m in members:  # whole groups merge: a subset of an earlier group given again keeps the rest
            old = self._rep[m]
            if old in self._members:
                merged.extend(self._members.pop(old))
        merged = sorted(set(merged))
        for m in merged:
            self._rep[m] = rep
        self._members[rep] = merged
        # Incrementally, one pass instead of the fixed point: the members take the union of their
        # ancestors, and so does every node with a member among its ancestors (ancestor sets are
        # transitively closed, so bits alone say who reads a member, in any order). It equals
        # _recompute's result when no member reads another (every group a planner forms); a
        # group that does (a cycle) falls back to the fixed point. Recomputing after every group
        # would make a function with one cycle between groups cubic (26.5 s for 800 layers).
        anc = self._ancestors
        union = 0
        for m in merged:
            union |= anc[m]
        members = bitset(merged)
        if union & members:
            self._recompute()
            return
        for i, bits in enumerate(anc):
            if members >> i & 1:
                anc[i] = union
            elif bits & members:
                anc[i] = bits | union


def _contracted_deps(graph: Graph, groups: Sequence[Sequence[int]], is_leaf: Callable[[int], bool]) -> dict[int, set[int]]:
    """Each unit's dependences with every group collapsed into unit ``-1 - g``; leaves skipped."""
    owner = {m: -1 - g for g, members in enumerate(groups) for m in members}
    # a group member is never a leaf: its users depend on the group
    skipped = [i not in owner and is_leaf(i) for i in range(len(graph))]
    deps: dict[int, set[int]] = {}
    for node in graph.nodes:
        i = node.index
        if skipped[i]:
            continue
        u = owner.get(i, i)
        own = deps.get(u)
        if own is None:
            own = deps[u] = set()
        own.update([owner.get(d, d) for d in node.deps if not skipped[d]])
        own.discard(u)
    return deps


def _peel(deps: dict[int, set[int]], key: Callable[[int], Any] | None = None) -> list[int]:
    """Kahn's order of the units that no cycle holds up (by ``key`` first where given)."""
    users: dict[int, list[int]] = {u: [] for u in deps}
    pending = {u: len(d) for u, d in deps.items()}
    for u, ds in deps.items():
        for d in ds:
            users[d].append(u)
    ready = [((key(u) if key else 0), u) for u, n in pending.items() if n == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        _, u = heapq.heappop(ready)
        order.append(u)
        for v in users[u]:
            pending[v] -= 1
            if pending[v] == 0:
                heapq.heappush(ready, ((key(v) if key else 0), v))
    return order


def contracted_order(graph: Graph, groups: Sequence[Sequence[int]], is_leaf: Callable[[int], bool],
                     position: Callable[[int], int]) -> list[int] | None:
    """A topological order of the graph with every group collapsed into one unit, or None on a cycle.

    Units are node indices (untouched nodes) and ``-1 - g`` for group ``g``, which reads the
    union of its members' inputs. A heap keyed by ``position`` (a node's own index; for a group,
    ``position(g)``) keeps the order as close to the original as possible. Leaves are skipped.
    Linear in the graph (times a log for the heap): the planner uses it to prove a whole set of
    groups acyclic at once instead of recomputing reachability after every group.
    """
    deps = _contracted_deps(graph, groups, is_leaf)
    order = _peel(deps, lambda u: position(-1 - u) if u < 0 else u)
    return order if len(order) == len(deps) else None


def groups_on_cycles(graph: Graph, groups: Sequence[Sequence[int]], is_leaf: Callable[[int], bool]) -> list[int]:
    """The groups that lie on a cycle of the contracted graph (or between two cycles): what
    neither a forward nor a backward topological peel removes. Linear; empty when acyclic."""
    deps = _contracted_deps(graph, groups, is_leaf)
    done = set(_peel(deps))
    left = {u: {d for d in ds if d not in done} for u, ds in deps.items() if u not in done}
    users: dict[int, set[int]] = {u: set() for u in left}
    for u, ds in left.items():
        for d in ds:
            users[d].add(u)
    done = set(_peel(users))  # backward: units nothing on a cycle reads
    return sorted(-1 - u for u in left if u < 0 and u not in done)


#: After which groups a planner contracts reachability (None: never; the fast way).
Contract = Callable[[Sequence[int]], bool]
Plan = TypeVar("Plan")


def plan_without_cycles(graph: Graph, plan: Callable[[Contract | None], list[Plan]],
                        members: Callable[[Plan], Sequence[int]], position: Callable[[Plan], int]) -> list[Plan]:
    """Run a greedy grouping ``plan`` so that its groups never depend on each other.

    Checking each group against the graph's own reachability is linear, but groups can then form
    a cycle together; contracting reachability after every group (XLA's way) cannot, but is
    quadratic. So: the fast way first, proven acyclic in one pass (:func:`contracted_order`);
    if it is not, again contracting only after groups that touch the groups on a cycle (so one
    motif among 800 layers does not re-plan all 800 exactly); the exact way only if a cycle
    still remains. ``position`` keys a group in the proof's order (where it would be emitted).
    """
    def leaf(i: int) -> bool:
        return not graph[i].deps  # leaves cannot take part in a cycle

    def units(groups: list[Plan]) -> list[Sequence[int]]:
        return [members(g) for g in groups]

    def acyclic(groups: list[Plan]) -> bool:
        return contracted_order(graph, units(groups), leaf, lambda g: position(groups[g])) is not None

    fast = plan(None)
    if acyclic(fast):
        return fast
    hot = {m for g in groups_on_cycles(graph, units(fast), leaf) for m in members(fast[g])}
    partial = plan(lambda group: not hot.isdisjoint(group))
    if acyclic(partial):
        return partial
    return plan(lambda group: True)


def bitset(indices: Sequence[int]) -> int:
    bits = 0
    for i in indices:
        bits |= 1 << i
    return bits


class ConstantData:
    """A large constant's bytes as part of a value key.

    Its hash is constant, so a key's dtype and shape decide which constants are compared at all.
    Two are compared by a sample of about 1024 evenly spaced elements first (a weight differs from
    another of its shape there), by a digest of all their bytes only where the samples agree: on
    MiniLM-L3, hashing every weight of a shared shape costs 56 ms a pass, the samples well under 1 ms.
    """

    __slots__ = ("_load", "_sample", "_digest")
    SAMPLE = 1024

    def __init__(self, load: Callable[[], Any]) -> None:
        self._load = load
        self._sample: bytes | None = None
        self._digest: bytes | None = None

    def sample(self) -> bytes:
        if self._sample is None:
            flat = self._load().reshape(-1)
            self._sample = flat[::max(1, flat.size // self.SAMPLE)].tobytes()
        return self._sample

    def digest(self) -> bytes:
        if self._digest is None:
            array = self._load()
            data = memoryview(array).cast("B") if array.flags.c_contiguous else array.tobytes()
            self._digest = hashlib.blake2b(data, digest_size=16).digest()
        return self._digest

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ConstantData):
            return False
        return self is other or (self.sample() == other.sample() and self.digest() == other.digest())

    def __hash__(self) -> int:
        return 0


def constant_key(shape: Sequence[Dim] | None, load: Callable[[], Any], max_elements: int = 64) -> Hashable | None:
    """Value key of a constant, so equal constants written twice (a scalar, a weight built once per
    use) count as one value.

    ``load`` returns the numpy value. Small constants are keyed by their bytes; larger ones by a
    :class:`ConstantData`, read only if another constant has their dtype and shape.
    """
    if shape is None or any(not isinstance(d, int) for d in shape):
        return None
    if math.prod(shape) > max_elements:
        return ("constant", tuple(shape), ConstantData(load))
    array = load()
    return ("constant", str(array.dtype), tuple(array.shape), array.tobytes())
