"""Find groups of parallel branches that can share one combined op.

A branch starts at a *root* (matmul, conv2d, ...) reading a shared input and continues through
elementwise/broadcast *followers* whose input has no other user. Branches group when their shared
inputs are structurally equal (value numbering, not object identity) and their roots agree on
everything in :attr:`RootInfo.key`; a group extends through followers as deep as all its
branches agree. Every group is checked for dependencies like XLA's combiners do: no input of the
combined op may depend on any node the combined op replaces, taking earlier combinations into
account, so a rewrite can never create a cycle.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from .graph import Contract, Dim, Graph, Node, Reachability, RootInfo, bitset, plan_without_cycles
from .kernel_alignment import KernelAlignment, align_kernels

#: Stacking is the default: on llvm a stacked matmul runs as fast as the separate ones or faster,
#: where one GEMM over concatenated weights runs slower once tuned (its wider row is a search of its
#: own); on cuda the two forms run alike (docs/benchmarks.md).
DEFAULT_TO_BATCH = True


@dataclass(frozen=True)
class CombineOptions:
    """Limits on a combined group, in the spirit of XLA's combiner thresholds.

    ``max_branches`` caps how many branches one combined op covers, ``max_combined_bytes`` caps
    the size of its concatenated weight; a group that would exceed either is cut into several
    combined ops. ``None`` means unlimited. ``to_batch`` (the default) stacks branches of one
    shape into one batched matmul (the shared input is broadcast, never copied) instead of
    concatenating them; branches of several widths on one input concatenate, all of them.
    """

    min_num_branches: int = 2
    max_branches: int | None = None
    max_combined_bytes: int | None = None
    to_batch: bool = DEFAULT_TO_BATCH

    def __post_init__(self) -> None:
        for name in ("min_num_branches", "max_branches", "max_combined_bytes"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise TypeError(f"{name} must be an int{'' if name == 'min_num_branches' else ' or None'}, "
                                f"got {type(value).__name__} {value!r}")
        if not isinstance(self.to_batch, bool):  # bool("False") is True: never coerce
            raise TypeError(f"to_batch must be a bool, got {type(self.to_batch).__name__} {self.to_batch!r}")
        if self.min_num_branches < 2:
            raise ValueError(f"min_num_branches must be >= 2, got {self.min_num_branches}")
        if self.max_branches is not None and self.max_branches < self.min_num_branches:
            raise ValueError(
                f"max_branches ({self.max_branches}) must be >= min_num_branches ({self.min_num_branches})"
            )
        if self.max_combined_bytes is not None and self.max_combined_bytes <= 0:
            raise ValueError(f"max_combined_bytes must be positive, got {self.max_combined_bytes}")


@dataclass(frozen=True)
class SideOperand:
    """How a follower's non-branch operand enters the combined follower.

    ``shared``: equal in all branches and constant along the split axis, used once.
    ``concat``: one slice per branch along ``axis``. ``expand``: constant along the split axis
    but different per branch, so each is broadcast to ``shapes[b]`` and then concatenated.
    ``stack`` (stacked plans): equal shapes, one slice per branch along a leading axis.
    """

    position: int  # in the combined follower (the first branch's order)
    mode: str
    axis: int = 0
    shapes: tuple[tuple[Dim, ...], ...] = ()
    sources: tuple[int, ...] = ()  # per branch: the node that supplies this operand


@dataclass(frozen=True)
class FollowerStep:
    nodes: tuple[int, ...]  # the follower of each branch at this depth
    carried: tuple[int, ...]  # operand positions fed by the previous step
    sides: tuple[SideOperand, ...]


@dataclass(frozen=True)
class CombinePlan:
    """One combined op: its branches (in program order), followers and split.

    ``shares`` says what the branches have in common: ``"input"`` (weights concatenate on
    ``concat_axis``, the output splits on ``out_axis``) or ``"weight"`` (XLA's DotMerger case:
    the inputs concatenate on their row axis ``concat_axis`` and the output splits by rows).
    """

    family: str
    roots: tuple[int, ...]  # program order, but a branch of symbolic width comes last
    widths: tuple[Dim, ...]
    steps: tuple[FollowerStep, ...]
    out_axis: int
    concat_axis: int
    alignment: KernelAlignment | None = None
    stack: str | None = None  # set when branches are stacked into a batched op (RootInfo.stack)
    shares: str = "input"

    @property
    def ends(self) -> tuple[int, ...]:
        """The last node of every branch: where the split results replace the branch."""
        return self.steps[-1].nodes if self.steps else self.roots

    @property
    def members(self) -> list[int]:
        return list(self.roots) + [n for step in self.steps for n in step.nodes]


Veto = Callable[[CombinePlan], bool]


def plan_combinations(
    graph: Graph,
    families: Sequence[str],
    options: CombineOptions = CombineOptions(),
    veto: Veto | None = None,
    shared_weight_families: Sequence[str] = (),
) -> list[CombinePlan]:
    """All combinations to apply to ``graph``, in deterministic program order.

    Groups never depend on each other (:func:`plan_without_cycles`), so a rewrite can never
    create a cycle.
    ``shared_weight_families`` also groups roots of those families that read one weight with
    different inputs; shared-input groups are planned first, so a root prefers them.
    """
    args = (graph, frozenset(families), frozenset(shared_weight_families), options, veto)
    return plan_without_cycles(graph, lambda contract: _Planner(*args, contract=contract).run(),
                               lambda p: p.members, lambda p: min(p.ends))


# -- how the branches of one bucket combine ----------------------------------------------------


class _Sharing(Protocol):
    """What the branches of a bucket have in common, and so which operand each branch owns."""

    name: str  # CombinePlan.shares

    def shared(self, node: Node) -> int: ...

    def own(self, node: Node) -> int: ...

    def width(self, graph: Graph, node: Node) -> Dim:
        """The branch's extent on the split axis."""
        ...

    def axes(self, graph: Graph, node: Node) -> tuple[int, int]:
        """(split axis of the output, concatenation axis of the owned operands)."""
        ...


class _SharedInput:
    """Branches read one input; each owns a weight, concatenated on ``weight_axis``, and its share
    of the output is its ``width`` on ``out_axis``."""

    name = "input"

    def shared(self, node: Node) -> int:
        return node.operands[node.root.data]

    def own(self, node: Node) -> int:
        return node.operands[node.root.weight]

    def width(self, graph: Graph, node: Node) -> Dim:
        return node.root.width

    def axes(self, graph: Graph, node: Node) -> tuple[int, int]:
        return node.root.out_axis, node.root.weight_axis


class _SharedWeight:
    """Branches read one weight (XLA's DotMerger); each owns an input, concatenated on its row
    axis (-2), and its share of the output is its rows."""

    name = "weight"

    def shared(self, node: Node) -> int:
        return node.operands[node.root.weight]

    def own(self, node: Node) -> int:
        return node.operands[node.root.data]

    def width(self, graph: Graph, node: Node) -> Dim:
        return graph[self.own(node)].shape[-2]

    def axes(self, graph: Graph, node: Node) -> tuple[int, int]:
        return len(node.shape) - 2, len(graph[self.own(node)].shape) - 2


@dataclass(frozen=True)
class _SideSources:
    """A follower's non-branch operand at one position, one source per branch, past the checks
    every layout makes (known shapes, one dtype, one rank no higher than the output's)."""

    pos: int
    sources: tuple[int, ...]
    shapes: list[tuple[Dim, ...]]
    same: bool  # structurally equal in every branch (equal value numbers)
    out_rank: int
    placed: tuple[int, ...] | None  # the output axis of each dimension, where the follower names them

    @property
    def rank(self) -> int:
        return len(self.shapes[0])

    def shared(self) -> SideOperand:
        return SideOperand(self.pos, "shared", sources=self.sources)


class _Layout(Protocol):
    """How the combined op lays its branches out, which decides how follower operands join."""

    def stack(self, root: RootInfo) -> str | None:
        """``CombinePlan.stack`` for a group of such roots."""
        ...

    def side(self, side: _SideSources, widths: tuple[Dim, ...], axis: int) -> SideOperand | None: ...


class _Concatenated:
    """Branches join along the split axis ``axis``, so per-branch follower operands join on it too."""

    def stack(self, root: RootInfo) -> str | None:
        return None

    def side(self, side: _SideSources, widths: tuple[Dim, ...], axis: int) -> SideOperand | None:
        if side.placed is None:
            return self._broadcast(side, widths, axis)
        if axis not in side.placed:  # explicitly placed dims off the split axis: one operand for all
            return side.shared() if side.same else None
        return self._slices(side, side.placed.index(axis), widths)

    @staticmethod
    def _broadcast(side: _SideSources, widths: tuple[Dim, ...], axis: int) -> SideOperand | None:
        """A numpy-style (right-aligned) operand."""
        local = axis - (side.out_rank - side.rank)
        if local >= 0 and not all(s[local] == 1 for s in side.shapes):
            return _Concatenated._slices(side, local, widths)
        # Constant along the split axis: one operand if equal, else each broadcast to its branch.
        if side.same:
            return side.shared()
        shapes = side.shapes
        if len({tuple(d for i, d in enumerate(s) if i != local) for s in shapes}) != 1:
            return None
        if local < 0:  # lift to the lowest rank that has the split axis
            shapes = [(1,) * (-local) + tuple(s) for s in shapes]
            local = 0
        targets = tuple(tuple(w if i == local else d for i, d in enumerate(s)) for s, w in zip(shapes, widths))
        return SideOperand(side.pos, "expand", local, targets, side.sources)

    @staticmethod
    def _slices(side: _SideSources, local: int, widths: tuple[Dim, ...]) -> SideOperand | None:
        """One slice per branch on ``local``: each must span its branch's width, all else equal."""
        others = {tuple(d for i, d in enumerate(s) if i != local) for s in side.shapes}
        if len(others) == 1 and all(s[local] == w for s, w in zip(side.shapes, widths)):
            return SideOperand(side.pos, "concat", local, sources=side.sources)
        return None


class _Stacked:
    """Branches of equal shapes stack on a new leading axis into one batched op (RootInfo.stack),
    so per-branch follower operands of one shape stack there too."""

    def stack(self, root: RootInfo) -> str | None:
        return root.stack

    def side(self, side: _SideSources, widths: tuple[Dim, ...], axis: int) -> SideOperand | None:
        if side.placed is not None and side.placed != tuple(range(side.out_rank - side.rank, side.out_rank)):
            return None  # only trailing (add-like) placement survives the extra leading axis
        if side.same:
            return side.shared()
        return SideOperand(side.pos, "stack", sources=side.sources) if len(set(side.shapes)) == 1 else None


@dataclass(frozen=True)
class _Kind:
    """How the branches of one bucket combine: what they share, and how the combined op lays them out."""

    sharing: _Sharing
    layout: _Layout


_CONCAT_SHARED_INPUT = _Kind(_SharedInput(), _Concatenated())
_STACK_SHARED_INPUT = _Kind(_SharedInput(), _Stacked())
_CONCAT_SHARED_WEIGHT = _Kind(_SharedWeight(), _Concatenated())


@dataclass(frozen=True)
class _Fit:
    """Roots that pass every limit, with how their kernels align (None: they have no kernels)."""

    alignment: KernelAlignment | None


class _Planner:
    def __init__(self, graph: Graph, families: frozenset[str], weight_families: frozenset[str],
                 options: CombineOptions, veto: Veto | None,
                 contract: Contract | None) -> None:
        self.graph = graph
        self.families = families
        self.weight_families = weight_families
        self.options = options
        self.veto = veto
        self.contract = contract  # which taken groups reachability is contracted for (None: none)
        self.users = graph.users()
        self.values = graph.value_numbers()
        self.reach = Reachability(graph)
        self.taken: set[int] = set()
        self._chains: dict[int, list[int]] = {}  # root -> its chain, dropped when a chain node is taken
        self._chains_through: dict[int, list[int]] = {}  # node -> roots whose cached chain holds it

    def run(self) -> list[CombinePlan]:
        stacks, buckets, weight_buckets = self._buckets()
        plans: list[CombinePlan] = []
        widths: dict[tuple, set[int]] = {}
        for value, key, width in stacks:
            widths.setdefault((value, key), set()).add(width)
        for (value, key, _), roots in stacks.items():
            # Branches of several widths on one input concatenate, all of them: one op, where
            # stacking would leave one op per width.
            if len(roots) >= self.options.min_num_branches and len(widths[value, key]) == 1:
                roots.sort()
                plans.extend(self._plans_for_bucket(roots, _STACK_SHARED_INPUT))
            # What did not stack (several widths, or left over by a limit or a dependency) concatenates
            # with the other leftovers now: a second run would find it there otherwise.
            leftovers = [r for r in roots if r not in self.taken]
            buckets.setdefault((value, key), []).extend(leftovers)
        for roots in buckets.values():
            roots.sort()
            plans.extend(self._plans_for_bucket(roots, _CONCAT_SHARED_INPUT))
        for roots in weight_buckets.values():  # after the shared-input groups: a root prefers those
            plans.extend(self._plans_for_bucket(roots, _CONCAT_SHARED_WEIGHT))
        plans.sort(key=lambda p: min(p.roots))
        return plans

    def _buckets(self) -> tuple[dict[tuple, list[int]], dict[tuple, list[int]], dict[tuple, list[int]]]:
        """Candidate roots in program order: (to stack, to concatenate on a shared input, to
        concatenate on a shared weight). A root may be in a weight bucket and one of the others."""
        buckets: dict[tuple, list[int]] = {}
        stacks: dict[tuple, list[int]] = {}
        weight_buckets: dict[tuple, list[int]] = {}
        for node in self.graph.nodes:
            info = node.root
            if info is None or any(self.graph[n].empty for n in (node.index, *node.operands)):
                continue
            if info.family in self.weight_families and set(node.deps) == set(node.operands):
                key = self._weight_bucket(node)
                if key is not None:
                    weight_buckets.setdefault(key, []).append(node.index)
            if info.family not in self.families:
                continue
            if isinstance(info.width, int) and info.width <= 0:
                continue
            if set(node.deps) != set(node.operands):
                continue
            data = node.operands[info.data]
            if self.options.to_batch and self._branch_count(node.index) > 1:
                continue  # an earlier run's combined op: stacking or concatenating it again would not be idempotent
            if self.options.to_batch and info.stack is not None and isinstance(info.width, int):
                stacks.setdefault((self.values[data], info.key, info.width), []).append(node.index)
            else:  # everything else (convolutions, symbolic widths, batched weights) concatenates as usual
                buckets.setdefault((self.values[data], info.key), []).append(node.index)
        return stacks, buckets, weight_buckets

    def _weight_bucket(self, node: Node) -> tuple | None:
        """Bucket of a root that may share its weight with siblings of other inputs, or None.

        Inputs concatenate on their row axis (-2), so every other input dimension must agree.
        """
        info = node.root
        data = self.graph[node.operands[info.data]]
        if info.kernel is not None or data.shape is None or len(data.shape) < 2 or node.shape is None \
                or len(node.shape) < 2:
            return None
        rows = data.shape[-2]
        if isinstance(rows, int) and rows <= 0:
            return None
        rest = tuple(d for i, d in enumerate(data.shape) if i != len(data.shape) - 2)
        return self.values[node.operands[info.weight]], info.key, rest, data.dtype

    def _plans_for_bucket(self, roots: list[int], kind: _Kind) -> list[CombinePlan]:
        plans: list[CombinePlan] = []
        remaining = [r for r in roots if r not in self.taken]
        while len(remaining) >= self.options.min_num_branches:
            chosen = self._choose_roots(remaining, kind.sharing)
            plan = self._plan(chosen, kind) if len(chosen) >= self.options.min_num_branches else None
            # Followers brought a dependency or a limit: try candidates one by one. Not when no
            # root can join the first at all: one by one checks the same pairs (and more), so it
            # would find none either, and a chain of dependent roots (an unrolled RNN's h @ U)
            # would make that n full plans per root, n^2 in all.
            if plan is None and len(chosen) > 1:
                chosen, plan = self._choose_one_by_one(remaining, kind)
            if plan is None or len(chosen) < self.options.min_num_branches:
                remaining = remaining[1:]
                continue
            remaining = [r for r in remaining if r not in chosen]
            if self.veto is not None and self.veto(plan):
                continue
            plans.append(plan)
            self._take(plan.members)
        return plans

    def _choose_roots(self, remaining: list[int], sharing: _Sharing) -> list[int]:
        """Greedy over roots alone, each candidate checked in O(1): limits and root dependencies.

        The followers are planned once for the chosen set afterwards; this keeps a bucket of n
        branches linear where planning followers per candidate would cost n^2.
        """
        g = self.graph
        chosen = [remaining[0]]
        count = self._branch_count(remaining[0])
        members = 1 << remaining[0]
        inputs = self._closure(sharing.shared(g[remaining[0]])) | self._closure(sharing.own(g[remaining[0]]))
        symbolic = self._symbolic(remaining[0], sharing)  # counted as we go: re-counting per candidate is n^2
        ancestors = self.reach.ancestors
        for candidate in remaining[1:]:
            own = sharing.own(g[candidate])
            closure = ancestors(own) | 1 << own
            if (inputs | closure) & (members | 1 << candidate):
                continue  # an operand reads another branch (or the other way round): checked first, as
                # the cheapest and the usual refusal (a chain of dependent roots refuses every pair)
            grown = count + self._branch_count(candidate)
            grown_symbolic = symbolic + self._symbolic(candidate, sharing)
            if self._fit(chosen + [candidate], grown, grown_symbolic, sharing) is None:
                continue
            chosen.append(candidate)
            count, symbolic, members, inputs = grown, grown_symbolic, members | 1 << candidate, inputs | closure
        return self._symbolic_last(chosen, sharing)

    def _choose_one_by_one(self, remaining: list[int], kind: _Kind) -> tuple[list[int], CombinePlan | None]:
        """Each candidate tried with the whole plan (followers included): exact, quadratic."""
        chosen = [remaining[0]]
        plan: CombinePlan | None = None
        for candidate in remaining[1:]:
            trial = self._plan(self._symbolic_last(chosen + [candidate], kind.sharing), kind)
            if trial is not None:
                chosen.append(candidate)
                plan = trial
        return chosen, plan

    def _fit(self, roots: list[int], branches: int, symbolic: int, sharing: _Sharing) -> _Fit | None:
        """Whether ``roots`` may form one combined op under every limit, or None.

        ``branches`` (what the roots stand for, :meth:`_branch_count`) and ``symbolic`` (how many
        have a symbolic width) come from the caller, so that a greedy caller keeps running totals.
        """
        opts = self.options
        if symbolic > 1:
            return None  # at most one branch of a group may have a symbolic width (TVM's rule too)
        if opts.max_branches is not None and branches > opts.max_branches:
            return None
        alignment = None
        if self.graph[roots[0]].root.kernel is not None:
            alignment = align_kernels([self.graph[r].root.kernel for r in roots])
            if alignment is None:
                return None
        if opts.max_combined_bytes is not None:
            total = self._weight_bytes(roots, alignment, sharing)
            if total is None or total > opts.max_combined_bytes:
                return None
        return _Fit(alignment)

    def _weight_bytes(self, roots: list[int], alignment: KernelAlignment | None, sharing: _Sharing) -> int | None:
        """Size of the concatenated operand (weights, or inputs when the weight is shared); None
        when a size is symbolic."""
        total = 0
        for r in roots:
            node = self.graph[r]
            nbytes = self.graph[sharing.own(node)].nbytes
            if nbytes is None:
                return None
            if alignment is not None:  # each kernel grows to the aligned size
                for (k, *_), size in zip(node.root.kernel, alignment.sizes):
                    nbytes = nbytes // k * size
            total += nbytes
        return total

    def _symbolic(self, root: int, sharing: _Sharing) -> int:
        return 0 if isinstance(sharing.width(self.graph, self.graph[root]), int) else 1

    def _symbolic_last(self, roots: list[int], sharing: _Sharing) -> list[int]:
        """The symbolic-width branch goes last, so every split offset is a sum of static widths."""
        return sorted(roots, key=lambda r: not isinstance(sharing.width(self.graph, self.graph[r]), int))

    def _closure(self, node: int) -> int:
        return self.reach.ancestors(node) | 1 << node

    def _take(self, members: list[int]) -> None:
        self.taken.update(members)
        for m in members:
            for root in self._chains_through.pop(m, ()):
                self._chains.pop(root, None)
        if self.contract is not None and self.contract(members):
            self.reach.contract(members)

    # -- one candidate set of branches -------------------------------------------------------

    def _branch_count(self, root: int) -> int:
        """Branches a root already stands for: a previously combined op ends in a split."""
        chain = self._chain(root)
        users = self.users[chain[-1]]
        if len(users) == 1 and self.graph[users[0]].split_sections:
            return int(self.graph[users[0]].split_sections)
        return 1

    def _plan(self, roots: list[int], kind: _Kind) -> CombinePlan | None:
        """The combined op for ``roots`` in this order, with as many followers as stay
        independent; None when a limit or a dependency forbids even the roots."""
        g, sharing = self.graph, kind.sharing
        fit = self._fit(roots, sum(self._branch_count(r) for r in roots),
                        sum(self._symbolic(r, sharing) for r in roots), sharing)
        if fit is None:
            return None
        first = g[roots[0]]
        widths = tuple(sharing.width(g, g[r]) for r in roots)  # static, but for a symbolic last one
        out_axis, concat_axis = sharing.axes(g, first)
        steps = self._steps(roots, widths, out_axis, kind.layout)
        plan = CombinePlan(first.root.family, tuple(roots), widths, tuple(steps), out_axis, concat_axis,
                           fit.alignment, kind.layout.stack(first.root), sharing.name)
        return self._deepest_independent(plan, sharing)

    def _deepest_independent(self, plan: CombinePlan, sharing: _Sharing) -> CombinePlan | None:
        """``plan`` cut to its deepest prefix of followers that keeps it independent, or None.

        A follower's operand may read the group (say a recurrence through a side input). Fewer
        steps only drop inputs and members, so independence is monotone in depth and a binary
        search finds the depth.
        """
        if self._independent(plan, sharing):
            return plan
        low, high = 0, len(plan.steps) - 1  # depth `low` is assumed independent, `high + 1` is not
        while low < high:
            mid = (low + high + 1) // 2
            if self._independent(dataclasses.replace(plan, steps=plan.steps[:mid]), sharing):
                low = mid
            else:
                high = mid - 1
        trimmed = dataclasses.replace(plan, steps=plan.steps[:low])
        return trimmed if self._independent(trimmed, sharing) else None

    def _chain(self, root: int) -> list[int]:
        """The longest run of single-use, shape-preserving followers after ``root`` (cached)."""
        chain = self._chains.get(root)
        if chain is None:
            chain = self._chains[root] = self._walk_chain(root)
            for n in chain:
                self._chains_through.setdefault(n, []).append(root)
        return chain

    def _walk_chain(self, root: int) -> list[int]:
        chain = [root]
        while True:
            cur = self.graph[chain[-1]]
            users = self.users[cur.index]
            if cur.escapes or len(users) != 1:
                return chain
            nxt = self.graph[users[0]]
            if (
                nxt.follower is None
                or nxt.index in self.taken
                or cur.shape is None
                or nxt.shape != cur.shape
                or cur.index not in nxt.operands
                or set(nxt.deps) != set(nxt.operands)
            ):
                return chain
            chain.append(nxt.index)

    def _steps(self, roots: list[int], widths: tuple[Dim, ...], axis: int, layout: _Layout) -> list[FollowerStep]:
        chains = [self._chain(r) for r in roots]
        on_branches = {n for c in chains for n in c}
        steps: list[FollowerStep] = []
        depth = 1
        while all(len(c) > depth for c in chains):
            nodes = [c[depth] for c in chains]
            if len(set(nodes)) != len(nodes):
                break  # one op joins two branches: that is where the branches end
            step = self._step(nodes, [c[depth - 1] for c in chains], widths, axis, layout)
            if step is None or any(src in on_branches for side in step.sides for src in side.sources):
                break
            steps.append(step)
            depth += 1
        return steps

    def _step(self, nodes: list[int], prevs: list[int], widths: tuple[Dim, ...], axis: int,
              layout: _Layout) -> FollowerStep | None:
        """The followers ``nodes`` of the branches ending in ``prevs`` as one combined follower."""
        g = self.graph
        first = g[nodes[0]]
        carried = tuple(i for i, o in enumerate(first.operands) if o == prevs[0])
        orders = self._operand_orders(nodes, prevs, carried)
        if orders is None:
            return None
        out_rank = len(g[prevs[0]].shape)
        placements = dict(first.follower.operand_axes)
        sides: list[SideOperand] = []
        for pos in range(len(first.operands)):
            if pos in carried:
                continue
            sources = tuple(g[n].operands[order[pos]] for n, order in zip(nodes, orders))
            side = self._side(pos, sources, out_rank, placements.get(pos), widths, axis, layout)
            if side is None:
                return None
            sides.append(side)
        return FollowerStep(tuple(nodes), carried, tuple(sides))

    def _operand_orders(self, nodes: list[int], prevs: list[int],
                        carried: tuple[int, ...]) -> list[tuple[int, ...]] | None:
        """Per branch: its follower's operand positions in the first follower's order, or None
        when the followers differ (op, dtype, arity, or where the branch comes in)."""
        first = self.graph[nodes[0]]
        orders: list[tuple[int, ...]] = []
        for n, p in zip(nodes, prevs):
            node = self.graph[n]
            if node.follower != first.follower or node.dtype != first.dtype:
                return None
            if len(node.operands) != len(first.operands):
                return None
            mine = tuple(i for i, o in enumerate(node.operands) if o == p)
            if mine == carried:
                orders.append(tuple(range(len(node.operands))))
            elif first.follower.commutative and len(node.operands) == 2 and len(mine) == 1 == len(carried):
                orders.append((1, 0))
            else:
                return None
        return orders

    def _side(self, pos: int, sources: tuple[int, ...], out_rank: int, placed: tuple[int, ...] | None,
              widths: tuple[Dim, ...], axis: int, layout: _Layout) -> SideOperand | None:
        """How the operands at ``pos`` enter the combined follower, or None when they cannot."""
        g = self.graph
        shapes = [g[o].shape for o in sources]
        if any(s is None for s in shapes) or len({g[o].dtype for o in sources}) != 1:
            return None
        rank = len(shapes[0])
        if rank > out_rank or any(len(s) != rank for s in shapes):
            return None
        same = len({self.values[o] for o in sources}) == 1
        return layout.side(_SideSources(pos, sources, shapes, same, out_rank, placed), widths, axis)

    def _independent(self, plan: CombinePlan, sharing: _Sharing) -> bool:
        members = bitset(plan.members)
        inputs = [sharing.shared(self.graph[plan.roots[0]])] + [sharing.own(self.graph[r]) for r in plan.roots]
        for step in plan.steps:
            for side in step.sides:
                inputs += side.sources
        for e in inputs:
            if (1 << e) & members or self.reach.depends_on_any(e, members):
                return False
        return True
