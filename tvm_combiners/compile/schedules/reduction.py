"""The row reduction rule: softmax, layer norm, sum/mean/max over the last axis, one row at a time."""

from __future__ import annotations

from typing import Any

from tvm import s_tir, tirx
from tvm.target import Target

from .common import SCALAR_CALLS, CPURule, calls_any, loop_extent, reads_var, vector_lanes, vectorize_inner
from .injective import is_spatial, parallel_outer, product, root_blocks


class CPUReduction(CPURule):
    """Functions of reductions along the innermost axis (each ``out[row] = reduce(a[row, k])``, one
    reduction iterator, the last) and spatial blocks around them: softmax, layer norm, RMS norm,
    sum, mean and max over the last axis, with the elementwise prologue and epilogue FuseOps put in
    them.

    The epilogue is folded into the last stage and a prologue read by one stage computed in it;
    every other block is computed at the row loop of the last block, so a row's stages (max, exp,
    sum, divide) pass over it while it is in cache. The row loops run in parallel where the work
    (the row's elements times the stages over them) reaches ``PARALLEL_MIN_ELEMENTS``. Each
    reduction becomes a vector of partial results (rfactor) accumulated along the row where a
    vector divides it, combined at the row's end in a different order than the naive loop's, as
    any vectorized sum is; each elementwise stage's innermost loop is vectorized, but for stages of
    libm calls (``SCALAR_CALLS``: a softmax's exp). Reductions over other axes, several reduction
    iterators, symbolic extents and blocks of other kinds are declined: the function keeps its loops.
    """

    ATTEMPTS = ((True,), (False,))  # with vectors of partial results (rfactor), then without

    def _schedule(self, func: tirx.PrimFunc, target: Target, vector_reductions: bool) -> s_tir.Schedule | None:
        sch = s_tir.Schedule(func)
        blocks = root_blocks(sch)
        reductions = [b for b in blocks if not is_spatial(sch, b)]
        if not reductions or not all(_is_row_reduction(sch, b) for b in reductions):
            return None
        if any(loop_extent(sch, loop) is None for b in blocks for loop in sch.get_loops(b)):
            return None
        *rows, width = [loop_extent(sch, loop) for loop in sch.get_loops(reductions[0])]
        if any([loop_extent(sch, loop) for loop in sch.get_loops(b)] != [*rows, width] for b in reductions):
            return None  # reductions of different rows: no one row loop to compute them at
        # The epilogue after the last reduction folds into the last block where it is elementwise in it.
        last = max(blocks.index(b) for b in reductions)
        for block in reversed(blocks[last + 1:]):
            if any(len(sch.get_consumers(p)) > 1 for p in sch.get_producers(block)):
                # where(isnan(softmax), 0, softmax): TVM inlines the isnan into the softmax's last
                # stage though the where still reads that stage's buffer, which nothing writes then
                continue
            try:
                sch.reverse_compute_inline(block)
            except (RuntimeError, ValueError):  # not elementwise in its producer: it stays a block of the row
                continue
        for block in root_blocks(sch)[:-1]:
            # a prologue read by one stage is computed in it (an exp read by a sum and a divide stays a
            # stage, and so does one of libm calls, scalar before a vectorized reduction)
            if is_spatial(sch, block) and len(sch.get_consumers(block)) == 1 and \
                    not calls_any(sch.get(block).body, SCALAR_CALLS):
                try:
                    sch.compute_inline(block)
                except (RuntimeError, ValueError):  # not inlinable (read at other points): a stage of the row
                    continue
        blocks = root_blocks(sch)
        anchor = blocks[-1]
        loops = sch.get_loops(anchor)
        extents = [loop_extent(sch, loop) for loop in loops]
        depth = len(rows)
        while depth and rows[depth - 1] == 1:
            depth -= 1  # a reduction's kept unit axis (keepdims) is the row's, not one of rows
        if is_spatial(sch, anchor):
            # softmax, layer norm, x - mean: the row loops then one along the row; sum/mean: the row loops
            if extents[:depth] != rows[:depth] or len(extents) - depth not in (0, 1):
                return None
        elif extents[:-1] != rows:
            return None
        row_loops = loops[:depth]
        # the stages along the row, each a pass over it (a mean from its sum is a scalar of the row, not one)
        stages = sum(len(sch.get_loops(b)) > depth for b in blocks)
        names = {sch.get(b).name_hint for b in reductions}
        partials = set()
        for block in root_blocks(sch):
            lanes = vector_lanes(target, sch.get(block).writes[0].source.dtype.bits, width)
            if vector_reductions and sch.get(block).name_hint in names and lanes is not None and width > lanes \
                    and not calls_any(sch.get(block).body, SCALAR_CALLS):
                ki = sch.split(sch.get_loops(block)[-1], [None, lanes])[1]
                partials.add(sch.get(sch.rfactor(ki, len(rows))).name_hint)  # partial[row, lane], a vector along the row
        if row_loops:
            for block in reversed(root_blocks(sch)[:-1]):
                sch.compute_at(block, row_loops[-1])
            _check_row_local(sch, depth, max([width, *extents[depth:]]))
        along = [b for b in (sch.get_child_blocks(row_loops[-1]) if row_loops else root_blocks(sch))
                 if len(sch.get_loops(b)) > depth]
        if row_loops:  # before the partial results' initialisation is split off: parallel needs whole reductions
            parallel_outer(sch, row_loops, product(rows) * width * max(stages, 1))
        for block in along:
            if sch.get(block).name_hint in partials:
                _vectorize_partial(sch, block)
            elif is_spatial(sch, block) and not calls_any(sch.get(block).body, SCALAR_CALLS):
                inner = loop_extent(sch, sch.get_loops(block)[-1])
                lanes = vector_lanes(target, sch.get(block).writes[0].source.dtype.bits, inner)
                if lanes is not None:
                    vectorize_inner(sch, block, lanes)
        return sch


def _is_row_reduction(sch: s_tir.Schedule, block_rv: Any) -> bool:
    """One output; spatial iterators then one reduction iterator, the innermost loop's, which every
    read that uses it indexes its last axis with (and nothing else does)."""
    block = sch.get(block_rv)
    kinds = [iv.iter_type for iv in block.iter_vars]
    if len(block.writes) != 1 or kinds[-1] != tirx.IterVar.CommReduce or \
            any(kind != tirx.IterVar.DataPar for kind in kinds[:-1]):
        return False
    loops = sch.get_loops(block_rv)
    if len(loops) != len(kinds) or not isinstance(block.iter_vars[-1].dom.extent, tirx.IntImm) or \
            loop_extent(sch, loops[-1]) != int(block.iter_vars[-1].dom.extent):
        return False
    k = block.iter_vars[-1].var
    for read in block.reads:
        *outer, inner = read.region
        if any(reads_var(r.min, k) for r in outer):
            return False
        if reads_var(inner.min, k) and not (inner.min.same_as(k) and int(inner.extent) == 1):
            return False
    return any(read.region and read.region[-1].min.same_as(k) for read in block.reads)


def _check_row_local(sch: s_tir.Schedule, depth: int, width: int) -> None:
    """Raise where a block computed at the row loop would compute more than a row each time
    (its reads did not map onto the row): correct, but the whole tensor again for every row."""
    for block in root_blocks(sch):
        if product([loop_extent(sch, loop) for loop in sch.get_loops(block)[depth:]]) > width:
            raise ValueError("a stage computes more than a row at the row loop")


def _vectorize_partial(sch: s_tir.Schedule, block: Any) -> None:
    """The rfactor block ``partial[lane] = op(partial[lane], a[ko * lanes + lane])``: the lane loop
    innermost and vectorized, its initialisation a vector store."""
    *_, first, second = sch.get_loops(block)
    realize = sch.get(second).body
    if not isinstance(realize, s_tir.SBlockRealize):
        raise ValueError("the partial results' loops hold more than their block")
    reduce_values = [value for iv, value in zip(realize.block.iter_vars, realize.iter_values)
                     if iv.iter_type == tirx.IterVar.CommReduce]
    # compute_at orders the loops as the block's iterators: find which one runs along the row
    ko, ki = (first, second) if reads_var(reduce_values[0], sch.get(first).loop_var) else (second, first)
    sch.reorder(ko, ki)
    sch.vectorize(ki)  # before the init is split off: vectorize checks the block is a whole reduction
    init = sch.decompose_reduction(block, ko)
    sch.vectorize(sch.get_loops(init)[-1])
