"""Which units of a region must stay in order, IR-neutral: reads, definitions and in-place writes.

The collective passes reorder a function's units (OrderSendRecv moves a send up to its recv; a
combiner moves members of a group next to each other). Variables read give most of the order,
but not all of it: an in-place kernel (``call_tir_inplace``) or an impure call may write a tensor
it is given, so every earlier reader of that tensor, or of a name for the same buffer, must run
before it (else it reads the new values) and every later reader after it. Symbolic dimensions a
``match_cast`` defines are read like variables. The adapters say what each unit reads, defines
and may write; this module turns that into edges.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class UnitAccess:
    """What one unit touches. ``aliases``: keys its definitions may share a buffer with."""

    reads: tuple[Hashable, ...] = ()
    defines: tuple[Hashable, ...] = ()
    writes: tuple[Hashable, ...] = ()
    aliases: tuple[Hashable, ...] = ()


class _Buffers:
    """Union-find over keys (interned to ints: dict lookups are the only comparison keys need)."""

    def __init__(self) -> None:
        self.ids: dict[Hashable, int] = {}
        self.parent: list[int] = []

    def find(self, key: Hashable) -> int:
        i = self.ids.setdefault(key, len(self.ids))
        if i == len(self.parent):
            self.parent.append(i)
        root = i
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[i] != root:  # path compression
            self.parent[i], i = root, self.parent[i]
        return root

    def join(self, a: Hashable, b: Hashable) -> None:
        self.parent[self.find(a)] = self.find(b)


def unit_dependences(units: Sequence[UnitAccess]) -> list[set[int]]:
    """For each unit, the earlier units it must follow (a key is read after the unit defining it;
    a write is ordered after every earlier reader of its buffer and before every later one)."""
    buffers = _Buffers()
    for unit in units:
        for d in unit.defines:
            for a in unit.aliases:
                buffers.join(d, a)
    definer: dict[Hashable, int] = {}
    deps: list[set[int]] = []
    readers: dict[int, list[int]] = {}
    for i, unit in enumerate(units):
        deps.append({definer[k] for k in unit.reads if k in definer})
        for k in unit.defines:
            definer.setdefault(k, i)
        for b in {buffers.find(k) for k in (*unit.reads, *unit.writes)}:
            readers.setdefault(b, []).append(i)
    for i, unit in enumerate(units):
        for b in {buffers.find(k) for k in unit.writes}:
            for j in readers.get(b, ()):
                if j < i:
                    deps[i].add(j)
                elif j > i:
                    deps[j].add(i)
    return deps


def order_around_barriers(deps: Sequence[set[int]], barriers: Sequence[bool], before: Sequence[bool],
                          after: Sequence[bool]) -> None:
    """Pin units to barriers (effects nothing may cross), in place: a barrier follows the previous
    barrier and every ``before`` unit since it; every ``after`` unit follows the last barrier."""
    last: int | None = None
    since: list[int] = []
    for i, d in enumerate(deps):
        if barriers[i]:
            d.update(since)
            if last is not None:
                d.add(last)
            last, since = i, []
            continue
        if last is not None and after[i]:
            d.add(last)
        if before[i]:
            since.append(i)
