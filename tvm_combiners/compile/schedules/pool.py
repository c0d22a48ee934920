"""The 2-d pooling rule: a row segment of the output (NCHW) or a pixel's channels (NHWC) in vectors."""

from __future__ import annotations

from typing import Any

from tvm import s_tir, tirx
from tvm.sym.pattern import detect_linear_equation
from tvm.target import Target

from .common import WITH_EPILOGUE_THEN_WITHOUT, CPURule, loop_extent, reads_var, vector_lanes
from .injective import is_spatial, parallel_outer, product, root_blocks, schedule_injective

# Vectors of one tile: the accumulators of a window stay in registers as the window's taps pass.
TILE_VECTORS = 4


class CPUPool(CPURule):
    """``max_pool2d``/``avg_pool2d`` in NCHW or NHWC, any padding and dilation, the output's
    innermost axis (the row in NCHW, the channels in NHWC) read with stride 1: that axis in one
    vector where it is at most ``TILE_VECTORS`` of the target's widest vectors (LLVM splits a vector
    of any length into registers), else in tiles of up to ``TILE_VECTORS`` vectors (an unrolled run
    of scalars where no vector divides it), accumulated in registers over the window; the other
    output axes in parallel where the pool is large. The padding is a loop nest of its own; an
    average's division and any elementwise epilogue FuseOps put in the function are computed on
    each tile. Pools strided along that axis (vectors there would be gathers) and other functions
    are declined: LLVM's own vectorizer does well on their loops.
    """

    ATTEMPTS = WITH_EPILOGUE_THEN_WITHOUT

    def _schedule(self, func: tirx.PrimFunc, target: Target, fuse_epilogue: bool) -> s_tir.Schedule | None:
        sch = s_tir.Schedule(func)
        blocks = root_blocks(sch)
        spatial = [is_spatial(sch, b) for b in blocks]
        if spatial.count(False) != 1:
            return None
        position = spatial.index(False)
        pool = blocks[position]
        if not _is_pool(sch, pool):
            return None
        before, after = blocks[:position], blocks[position + 1:]
        *outer, x, ry, rx = sch.get_loops(pool)
        width = loop_extent(sch, x)
        elements = product([loop_extent(sch, loop) for loop in [*outer, x]])
        bits = sch.get(pool).writes[0].source.dtype.bits
        widest = vector_lanes(target, bits, 1 << 16)  # the target's widest vector
        lanes = vector_lanes(target, bits, width)
        if width <= widest * TILE_VECTORS:
            lanes = tile = width  # the whole row in one vector of any length: LLVM splits it into registers
        elif lanes is not None:
            tile = lanes * next(v for v in (TILE_VECTORS, 2, 1) if (width // lanes) % v == 0)
        else:
            tile = next(d for d in range(min(width, 8), 0, -1) if width % d == 0)
        xo, xi = sch.split(x, [None, tile])
        sch.reorder(*outer, xo, ry, rx, xi)
        accumulate = sch.cache_write(pool, 0, "local")
        sch.reverse_compute_at(accumulate, xo)
        pending = list(after)
        while fuse_epilogue and pending:
            try:
                sch.reverse_compute_inline(pending[0])  # an average's division, on the tile in registers
            except (RuntimeError, ValueError):  # not elementwise in the output: it and those after stay loops
                break
            pending.pop(0)
        for block in before:
            schedule_injective(sch, block, target)
        parallel_outer(sch, [*outer, xo], elements)  # memory-bound like an injective loop nest: its size decides
        if lanes is None:
            sch.unroll(xi)
        else:
            sch.vectorize(xi)  # before the init is split off: vectorize checks the block is a whole reduction
        init = sch.decompose_reduction(pool, ry)
        if lanes is not None:
            sch.vectorize(sch.get_loops(init)[-1])
            sch.vectorize(sch.get_loops(accumulate)[-1])
        for block in pending:
            schedule_injective(sch, block, target)
        return sch


def _is_pool(sch: s_tir.Schedule, block_rv: Any) -> bool:
    """Iterators ``a, b, c, d`` then a window ``ry, rx``, all static; one 4-d read at
    ``[n, c, y(ry), x(rx)]`` (NCHW) or ``[n, y(ry), x(rx), c]`` (NHWC); the write at ``[a, b, c, d]``."""
    block = sch.get(block_rv)
    kinds = "".join("S" if iv.iter_type == tirx.IterVar.DataPar else "R" if iv.iter_type == tirx.IterVar.CommReduce
                    else "?" for iv in block.iter_vars)
    loops = sch.get_loops(block_rv)
    if kinds != "SSSSRR" or len(loops) != 6 or any(loop_extent(sch, loop) is None for loop in loops):
        return False
    if len(block.reads) != 1 or len(block.writes) != 1 or len(block.reads[0].region) != 4:
        return False
    variables = [iv.var for iv in block.iter_vars]
    write = block.writes[0].region
    if len(write) != 4 or not all(r.min.same_as(v) and int(r.extent) == 1 for r, v in zip(write, variables)):
        return False
    read = block.reads[0].region
    if not all(int(r.extent) == 1 for r in read):
        return False
    uses = [frozenset(i for i, v in enumerate(variables) if reads_var(r.min, v)) for r in read]
    if uses not in ([{0}, {1}, {2, 4}, {3, 5}], [{0}, {1, 4}, {2, 5}, {3}]):
        return False
    # Vectors along a strided row are gathers, slower than the loops LLVM vectorizes itself (a
    # stride-2 3x3 max pool of 64x112x112: 4.5 ms instead of 0.6 ms).
    stride = detect_linear_equation(read[3].min, [variables[3]])
    return len(stride) == 2 and isinstance(stride[0], tirx.IntImm) and int(stride[0]) == 1
