"""The GEMM rule: a register-tiled, vectorized, parallel loop nest, K in cache-sized blocks."""

from __future__ import annotations

from typing import Any

from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import SBlockInfo, normalize_prim_func
from tvm.target import Target

from .common import (
    PREPROC,
    WITH_EPILOGUE_THEN_WITHOUT,
    CPURule,
    constant_param,
    inline_into_consumers,
    loop_extent,
    reads_var,
    vector_lanes,
    vectorize_inner,
)

# Output rows per tile and vector registers per row: 4 x 2 accumulator registers leave room for the
# operands in x86's 16 vector registers (the fastest tile of those bench_cpu_schedules.py compares).
TILE_ROWS = 4
TILE_VECTORS = 2
# K in blocks of 256 (or 192, 128: what divides K) keeps a block of B in L1 while every row of A
# passes, C's column block waiting in a local buffer of at most 64 KiB.
K_BLOCKS = (256, 192, 128)
K_BLOCK_C_BYTES = 64 * 1024


class CPUMatmul(CPURule):
    """``C[..., i, j] (+)= A[..., i, k] * B[..., k, j]`` with ``j`` contiguous in ``B`` and ``C``.

    A ``TILE_ROWS x TILE_VECTORS`` vectors tile of C accumulates in registers; tiles run column
    block by column block (a block of B stays in cache while every row of A passes), K in blocks
    of ``K_BLOCKS`` where one divides it, the outer spatial loops in parallel. A constant ``B`` is
    read repacked into column panels of the tile's width (``[..., N / width, K, width]``, computed
    at compile time), so that a tile reads B contiguously: a row-major B's rows, a multiple of 4 KiB
    apart in a wide layer, fall into the same few L1 sets. Functions of another form are declined.
    """

    ATTEMPTS = WITH_EPILOGUE_THEN_WITHOUT

    def _schedule(self, func: tirx.PrimFunc, target: Target, fuse_epilogue: bool) -> s_tir.Schedule | None:
        sch = s_tir.Schedule(func)
        infos = normalize_prim_func(sch)
        if infos is None:
            return None
        reductions = [b for b in infos if not b.is_injective()]
        b_read = _matmul_b(sch, reductions[0]) if len(reductions) == 1 else None
        if b_read is None:
            return None
        main = reductions[0]
        bits = sch.get(main.block_rv).writes[0].source.dtype.bits
        *batch, i, j, k = sch.get_loops(main.block_rv)
        cols, rows = loop_extent(sch, j), loop_extent(sch, i)
        lanes = None if cols is None else vector_lanes(target, bits, cols)
        if lanes is None:
            return None  # a vector tile needs a static width a vector divides: these stay as they were
        tile_cols = lanes * TILE_VECTORS if cols % (lanes * TILE_VECTORS) == 0 else lanes
        tile_rows = next(t for t in (TILE_ROWS, 2, 1) if rows is None or rows % t == 0)
        io, ii = sch.split(i, [None, tile_rows])
        jo, ji = sch.split(j, [None, tile_cols])
        depth = _k_block(loop_extent(sch, k), rows, tile_cols * bits // 8)
        if depth:  # K in blocks: a block of B stays in L1 while every row passes; C's column block in L1
            ko, ki = sch.split(k, [None, depth])
            sch.reorder(*batch, jo, ko, io, ki, ii, ji)
            tile, init_at = jo, ko
        else:
            sch.reorder(*batch, jo, io, k, ii, ji)
            tile, init_at = io, k
        if constant_param(func, sch.get(main.block_rv).reads[b_read].source):
            _read_packed(sch, main.block_rv, b_read, tile_cols)
        accumulate = sch.cache_write(main.block_rv, 0, "local")
        sch.reverse_compute_at(accumulate, tile)
        if fuse_epilogue:
            at = infos.index(main)
            # blocks before the GEMM that only its epilogue reads (a ReLU backward's x < 0) go into the
            # epilogue too: a block moved onto the tile needs every producer under the tile loop
            epilogue = [info.block_rv for info in infos[at + 1:]]
            after = [sch.get(b) for b in epilogue]
            side = [i.block_rv for i in infos[:at] if _only_read_by(sch, i.block_rv, after)]
            for block in inline_into_consumers(sch, side + epilogue) if epilogue else ():
                sch.reverse_compute_at(block, tile)
                vectorize_inner(sch, block, lanes)
        sch.parallel(sch.fuse(*batch, jo) if batch else jo)  # after the moves: it checks every block under it
        sch.unroll(ii)
        sch.vectorize(ji)
        init = sch.decompose_reduction(main.block_rv, init_at)
        vectorize_inner(sch, init, lanes)
        vectorize_inner(sch, accumulate, lanes)
        return sch


def _read_packed(sch: s_tir.Schedule, block: Any, read: int, width: int) -> None:
    """The GEMM reads its ``read``-th operand ``[..., K, N]`` from a copy laid out ``[..., N / width, K,
    width]``, the copy marked as a weight repack."""
    packed = sch.cache_read(block, read, "global")

    def panels(*index: Any) -> tuple[Any, ...]:
        *batch, k, n = index
        return (*batch, n // width, k, n % width)

    sch.transform_layout(packed, ("write", 0), panels)
    sch.annotate(packed, PREPROC, True)


def _only_read_by(sch: s_tir.Schedule, block: Any, readers: list[Any]) -> bool:
    """Whether ``block``'s output is read, and only by ``readers`` (blocks, not their RVs)."""
    consumers = [sch.get(c) for c in sch.get_consumers(block)]
    return bool(consumers) and all(any(c.same_as(r) for r in readers) for c in consumers)


def _k_block(depth: int | None, rows: int | None, row_bytes: int) -> int | None:
    """A K block that divides K, where C's whole column block (``rows`` x the tile's width) fits a
    local buffer of ``K_BLOCK_C_BYTES``; None keeps K whole (each tile then accumulates in registers)."""
    if depth is None or depth <= K_BLOCKS[0] or rows is None or rows * row_bytes > K_BLOCK_C_BYTES:
        return None  # a K of 256 or less: B's column block already fits L1 whole
    return next((b for b in K_BLOCKS if depth % b == 0), None)


def _matmul_b(sch: s_tir.Schedule, info: SBlockInfo) -> int | None:
    """Where the block is ``C[..., i, j] (+)= A[..., i, k] * B[..., k, j]`` (spatial iterators
    ``..., i, j`` then one reduction ``k``; j last in B and C): the index of B among its reads."""
    kinds = info.dom_kind()
    if len(kinds) < 3 or kinds != "S" * (len(kinds) - 1) + "R":
        return None
    block = sch.get(info.block_rv)
    if len(block.reads) != 2 or len(block.writes) != 1:
        return None
    i, j, k = (it.var for it in block.iter_vars[-3:])
    if not reads_var(block.writes[0].region[-1].min, j):
        return None
    b_read = 1 if reads_var(block.reads[1].region[-1].min, j) else 0
    b, a = block.reads[b_read], block.reads[1 - b_read]

    def uses(region: Any, var: tirx.Var) -> bool:
        return any(reads_var(r.min, var) for r in region.region)

    matmul = (reads_var(b.region[-1].min, j) and uses(b, k) and not uses(b, i)
              and uses(a, i) and uses(a, k) and not uses(a, j))
    return b_read if matmul else None
