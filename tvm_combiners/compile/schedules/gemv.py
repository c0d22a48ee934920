"""The one-row GEMM rule (a classifier's fully connected layer): column blocks of the weight streamed once."""

from __future__ import annotations

from typing import Any

from tvm import s_tir, tirx
from tvm.target import Target

from .common import CPURule, loop_extent, reads_var, vector_lanes
from .injective import is_spatial, parallel_outer, product, root_blocks, schedule_injective

# Vectors of one column block: its accumulators stay in registers while K passes, and each row of
# the block is a few whole cache lines of the weight.
TILE_VECTORS = 4


class CPUGemv(CPURule):
    """``C[..., 0, j] (+)= A[..., 0, k] * B[k, j]`` (every spatial loop but ``j`` of extent 1), ``j``
    contiguous in ``B`` and ``C``: ``C`` in column blocks of up to ``TILE_VECTORS`` vectors, each
    accumulated in registers over all of K (each element of A one broadcast), the blocks in parallel
    where the weight is large, the elementwise epilogue FuseOps put in the function computed on
    each block. :class:`~.matmul.CPUMatmul` takes the GEMMs of more rows; it declines these (they
    have no row loop to tile). Other functions are declined.
    """

    def _schedule(self, func: tirx.PrimFunc, target: Target) -> s_tir.Schedule | None:
        sch = s_tir.Schedule(func)
        blocks = root_blocks(sch)
        spatial = [is_spatial(sch, b) for b in blocks]
        if spatial.count(False) != 1 or not all(spatial[spatial.index(False) + 1:]):
            return None
        position = spatial.index(False)
        block = blocks[position]
        if not _is_gemv(sch, block):
            return None
        *units, j, k = sch.get_loops(block)
        width = loop_extent(sch, j)
        lanes = vector_lanes(target, sch.get(block).writes[0].source.dtype.bits, width)
        if lanes is None:
            return None
        tile = lanes * next(v for v in (TILE_VECTORS, 2, 1) if (width // lanes) % v == 0)
        jo, ji = sch.split(j, [None, tile])
        sch.reorder(*units, jo, k, ji)
        accumulate = sch.cache_write(block, 0, "local")
        sch.reverse_compute_at(accumulate, jo)
        pending = blocks[position + 1:]
        while pending:
            try:
                sch.reverse_compute_inline(pending[0])  # on the column block as it leaves the registers
            except (RuntimeError, ValueError):  # not elementwise in the output: it and those after stay loops
                break
            pending.pop(0)
        for producer in blocks[:position]:
            schedule_injective(sch, producer, target)
        parallel_outer(sch, [jo], width * loop_extent(sch, k))
        sch.vectorize(ji)  # before the init is split off: vectorize checks the block is a whole reduction
        init = sch.decompose_reduction(block, k)
        sch.vectorize(sch.get_loops(init)[-1])
        sch.vectorize(sch.get_loops(accumulate)[-1])
        for rest in pending:
            schedule_injective(sch, rest, target)
        return sch


def _is_gemv(sch: s_tir.Schedule, block_rv: Any) -> bool:
    """Spatial loops of extent 1, then ``j``, then the reduction ``k``, all static; A reads ``k`` and
    not ``j``; B (2-d) reads ``[k, j]``; the output's last index is ``j``."""
    block = sch.get(block_rv)
    loops = sch.get_loops(block_rv)
    extents = [loop_extent(sch, loop) for loop in loops]
    kinds = [iv.iter_type for iv in block.iter_vars]
    if (len(loops) < 2 or len(loops) != len(kinds) or None in extents or kinds[-1] != tirx.IterVar.CommReduce
            or any(kind != tirx.IterVar.DataPar for kind in kinds[:-1]) or product(extents[:-2]) != 1):
        return False
    if len(block.reads) != 2 or len(block.writes) != 1:
        return False
    j, k = block.iter_vars[-2].var, block.iter_vars[-1].var
    write = block.writes[0].region
    if not (write[-1].min.same_as(j) and int(write[-1].extent) == 1):
        return False
    for a, b in (block.reads, block.reads[::-1]):
        index = [r.min for r in b.region]
        if (len(index) == 2 and index[0].same_as(k) and index[1].same_as(j)
                and all(int(r.extent) == 1 for r in b.region)
                and any(reads_var(r.min, k) for r in a.region) and not any(reads_var(r.min, j) for r in a.region)):
            return True
    return False
