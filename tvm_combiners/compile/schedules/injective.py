"""The catch-all rule for injective functions (elementwise, broadcast, transpose, concat, pad...)."""

from __future__ import annotations

from typing import Any

from tvm import s_tir, tirx
from tvm.target import Target

from .common import CPURule, loop_extent, vector_lanes, vectorize_inner

# Loop nests over fewer elements than this (of their output; of the weight a GEMV streams) run on one thread:
# a parallel loop's launch costs tens of microseconds where the cores are busy (a 3x3 max pool of
# 150k elements took 0.2 ms in parallel on one thread instead of 0.08 ms), and its body, a
# function of its own, loses the no-alias facts LLVM's own vectorizer needs.
PARALLEL_MIN_ELEMENTS = 1 << 18
# The parallel loop fuses leading loops until it has this many iterations: enough to share among
# threads, while the loops inside stay nested (a fused loop recovers each index with an integer
# division and a remainder on every iteration, which costs more than a small loop body).
PARALLEL_ITERATIONS = 256


class CPUInjective(CPURule):
    """Functions whose every block is spatial: each intermediate block inlined into its consumers
    where TVM allows, then each remaining loop nest's outer loops fused and run in parallel (from
    ``PARALLEL_MIN_ELEMENTS`` elements) and its innermost loop vectorized where a vector divides
    it. Functions with a reduction are declined, and so are those without blocks.
    """

    def _schedule(self, func: tirx.PrimFunc, target: Target) -> s_tir.Schedule | None:
        sch = s_tir.Schedule(func)
        blocks = root_blocks(sch)
        if not blocks or not all(is_spatial(sch, b) for b in blocks):
            return None
        for block in blocks[:-1]:
            try:
                sch.compute_inline(block)
            except (RuntimeError, ValueError):  # read at other points, or by several blocks: it stays
                continue
        for block in root_blocks(sch):
            schedule_injective(sch, block, target)
        return sch


def root_blocks(sch: s_tir.Schedule) -> list[Any]:
    """The blocks directly under the function's root block ([] where it has none)."""
    try:
        return list(sch.get_child_blocks(sch.get_sblock("root")))
    except (RuntimeError, ValueError):
        return []


def schedule_injective(sch: s_tir.Schedule, block: Any, target: Target) -> None:
    """``block``'s outer loops fused and in parallel (where the nest is large enough), its innermost
    loop vectorized where a vector of the target divides it."""
    loops = sch.get_loops(block)
    if not loops:
        return
    extents = [loop_extent(sch, loop) for loop in loops]
    elements = None if None in extents else product(extents)
    if len(loops) > 1:
        parallel_outer(sch, loops[:-1], elements)
    if extents[-1] is not None:
        lanes = vector_lanes(target, sch.get(block).writes[0].source.dtype.bits, extents[-1])
        if lanes is not None:
            vectorize_inner(sch, block, lanes)


def parallel_outer(sch: s_tir.Schedule, loops: list[Any], work: int | None = None) -> None:
    """The leading ``loops`` fused (until ``PARALLEL_ITERATIONS`` iterations, or all of them) into one
    parallel loop, unless ``work`` (elements or operations; None: unknown) is below ``PARALLEL_MIN_ELEMENTS``."""
    if work is not None and work < PARALLEL_MIN_ELEMENTS:
        return
    count, total = 0, 1
    for loop in loops:
        extent = loop_extent(sch, loop)
        count += 1
        if extent is None or total * extent >= PARALLEL_ITERATIONS:
            break
        total *= extent
    leading = loops[:count]
    sch.parallel(sch.fuse(*leading) if len(leading) > 1 else leading[0])


def is_spatial(sch: s_tir.Schedule, block: Any) -> bool:
    """One output, every iterator data-parallel."""
    stmt = sch.get(block)
    return len(stmt.writes) == 1 and all(iv.iter_type == tirx.IterVar.DataPar for iv in stmt.iter_vars)


def product(values: list[int]) -> int:
    total = 1
    for value in values:
        total *= value
    return total
