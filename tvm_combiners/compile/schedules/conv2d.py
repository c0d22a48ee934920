"""The conv2d rule (NCHW and NHWC): output channels in vector registers, a segment of an output row
per tile (depthwise convolutions too, an NCHW input packed so that a tap of a channel vector is one load)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tvm import s_tir, tirx
from tvm.sym import Analyzer, detect_linear_equation
from tvm.target import Target
from tvm.target.codegen import target_has_features

from .common import (
    PREPROC,
    SCALAR_CALLS,
    WITH_EPILOGUE_THEN_WITHOUT,
    CPURule,
    calls_any,
    inline_into_consumers,
    loop_extent,
    reads_var,
    vector_lanes,
)
from .injective import is_spatial, parallel_outer, root_blocks, schedule_injective

# Vector registers the accumulators of one tile may take: one broadcast input register stays free
# and the weight vectors are FMA memory operands (x86 has 16 vector registers, 32 with AVX-512).
ACCUMULATORS = {16: 14, 32: 28}
# Channel-vectors per tile: two reuse each broadcast input element twice as often as one.
TILE_VECTORS = 2
# Input channels a group needs before vectors along the output row beat the loops as they are:
# LLVM vectorizes a depthwise convolution's own loops well (64x28x28 3x3: 0.03 ms, 0.07 ms in row
# vectors; two inputs a group: 0.08 ms, 0.14 ms), while 64 inputs for 6 outputs took 3.7 ms, 0.4 ms.
WIDTH_FORM_MIN_INPUTS = 8
# Output width from which a depthwise convolution of stride 1 takes vectors along the output row
# (rows read as they are) rather than vectors of channels (the input packed first): with bias
# alone, 32 channels of 112x112 3x3 ran 0.36 ms in rows, 0.74 ms in channels, 0.42 ms as loops;
# 144 of 56x56 0.54, 0.48, 0.51 ms; 240 of 28x28 5x5 0.40, 0.34, 0.59 ms (AVX-512, loaded machine).
DEPTHWISE_ROWS_MIN_WIDTH = 64


@dataclass
class _Conv:
    """The conv2d block's loops ``n, f, y, x, rc, ry, rx`` and what its reads are."""

    block: Any
    weight: int  # read index of the OIHW weight
    per_group: int  # output channels of one group (all of them without groups)
    group_inputs: int  # input channels of one group
    channels: int  # output channels
    width: int  # output width
    stride: int | None  # the input columns between two output columns (None: not a constant)
    bits: int  # the accumulator dtype's bits
    layout: str = "NCHW"  # the input's and output's: NCHW or NHWC
    weight_axes: tuple[int, ...] = (0, 1, 2, 3)  # where the weight's output, input channel, row, column are


class CPUConv2D(CPURule):
    """``conv2d`` in NCHW or NHWC, the weight in any layout (OIHW, HWIO, OHWI), any stride, padding
    and dilation, with groups.

    Where a vector of the target divides a group's output channels, a tile is ``TILE_VECTORS``
    channel-vectors by a segment of an output row, accumulated in registers over every input
    channel and kernel tap: each input element is one broadcast used by every vector, each weight
    vector one FMA operand. The weight is read repacked as ``[O / tile, I, KH, KW, tile]`` (a block
    TVM's SplitLayoutRewritePreproc splits off, and FoldConstant computes once for a constant weight).
    Where none divides them but a group has ``WIDTH_FORM_MIN_INPUTS`` input channels or more, a
    tile is a segment of one channel's output row (in vectors where one divides the width, else an
    unrolled run of scalars; NCHW only: in NHWC a row's elements are a channel apart). Channel
    blocks and rows run in parallel; the padding is a loop nest of its own; the elementwise
    epilogue FuseOps put in the function is computed on each tile as it leaves registers.
    conv2d_transpose takes the same form: LegalizeOps writes it as a convolution of the
    zero-stuffed, padded input with the flipped kernel, which the repack computes (once, for a
    constant weight).

    A depthwise convolution (one input channel a group, one output each) has no input element to
    broadcast: where a vector divides its channels, a tile is one channel-vector by a segment of an
    output row, the padded input packed as ``[N, C / lanes, H, W, lanes]`` in one pass, so that each
    tap of the vector is one load (at any stride) and one FMA with the tap's weight vector (an NHWC
    input is read as it is: its channel vectors are contiguous already). Where the stride is 1 and
    NCHW rows have ``DEPTHWISE_ROWS_MIN_WIDTH`` outputs, it takes the row form instead (vectors along
    the row, the weight a broadcast per tap, the input read as it is). The epilogue's
    intermediate blocks are inlined into their consumers first, so that SiLU (``z * sigmoid(z)``)
    reaches the tile as one block reading ``z`` twice. Other groups of fewer inputs (a channel
    multiplier of 2), mixed dtypes, symbolic sizes, other layouts and other functions are declined:
    they keep their loops.
    """

    ATTEMPTS = WITH_EPILOGUE_THEN_WITHOUT

    def _schedule(self, func: tirx.PrimFunc, target: Target, fuse_epilogue: bool) -> s_tir.Schedule | None:
        sch = s_tir.Schedule(func)
        blocks = root_blocks(sch)
        reductions = [b for b in blocks if not is_spatial(sch, b)]
        if len(reductions) != 1:
            return None
        conv = _conv_form(sch, reductions[0])
        if conv is None:
            return None
        nhwc = conv.layout == "NHWC"
        if nhwc:  # the loops in NCHW's order: the tiles below are the same, the output's layout already the tile's
            n, y, x, f, ry, rx, rc = sch.get_loops(conv.block)
            sch.reorder(n, f, y, x, rc, ry, rx)
        position = [sch.get(b).same_as(sch.get(conv.block)) for b in blocks].index(True)
        before, after = blocks[:position], blocks[position + 1:]
        if not all(is_spatial(sch, b) for b in before + after):
            return None
        registers = 32 if target_has_features("avx512f", target) else 16
        lanes = vector_lanes(target, conv.bits, conv.per_group)
        depthwise = conv.group_inputs == conv.per_group == 1
        rows = (not nhwc and depthwise and conv.stride == 1 and conv.width >= DEPTHWISE_ROWS_MIN_WIDTH
                and vector_lanes(target, conv.bits, conv.width) is not None)
        if depthwise and not rows:  # vectors of channels, each tap a load of the packed input
            lanes = vector_lanes(target, conv.bits, conv.channels)
        channel_form = lanes is not None
        if channel_form and depthwise:  # NHWC's input has its channel vectors contiguous already
            before = before if nhwc else _pack_input(sch, conv, lanes)
            tile = _channel_tiles(sch, conv, lanes, registers, 1)
        elif channel_form:
            vectors = TILE_VECTORS if conv.per_group % (lanes * TILE_VECTORS) == 0 else 1
            tile = _channel_tiles(sch, conv, lanes, registers, vectors)
        elif not nhwc and (conv.group_inputs >= WIDTH_FORM_MIN_INPUTS or rows):
            tile = _width_tiles(sch, conv, target, registers)
        else:
            return None
        outer, init_at, vector = tile
        if channel_form:
            before = _repack_weight(sch, func, conv, vector, before)
        accumulate = sch.cache_write(conv.block, 0, "local")
        if channel_form and not nhwc:  # the tile's channels innermost, as the registers hold them
            sch.transform_layout(conv.block, ("write", 0), lambda n, f, y, x: (n, y, x, f))
        sch.reverse_compute_at(accumulate, outer)
        pending = list(after)
        if fuse_epilogue:  # SiLU's z * sigmoid(z) as one block that reads z twice, before it meets the tile
            pending = inline_into_consumers(sch, pending)
        while fuse_epilogue and pending:
            try:
                sch.reverse_compute_inline(pending[0])  # computed on the tile as it leaves the accumulators
            except (RuntimeError, ValueError):  # not elementwise in the output: it and those after stay loops
                break
            pending.pop(0)
        for block in before:
            _schedule_producer(sch, block, target)
        loops = sch.get_loops(conv.block)
        parallel = loops[:[sch.get(loop).same_as(sch.get(outer)) for loop in loops].index(True)]
        parallel_outer(sch, parallel)  # after the moves: it checks every block under it
        init = sch.decompose_reduction(conv.block, init_at)
        inner = sch.get_loops(init)[-1]
        if vector is not None and loop_extent(sch, inner) == vector:
            sch.vectorize(inner)
        store = sch.get_loops(accumulate)[-1]  # the tile's row segment, contiguous in NCHW
        scalar_calls = calls_any(sch.get(accumulate).body, SCALAR_CALLS)  # an epilogue of libm calls (tanh, exp)
        if not scalar_calls and (channel_form and (loop_extent(sch, store) or 1) > 1
                                 or vector is not None and not channel_form):
            # in the channel form a vector of any length (LLVM splits it): the row segment is read
            # across the registers' lanes and stored whole (a 1x1 convolution of 64 channels with a
            # residual add: 2.4 ms instead of 2.85 ms with a scalar store per element); an epilogue
            # of libm calls stays scalar, as the reduction rule's stages do (a depthwise 5x5 with
            # SiLU, 672 channels of 14x14: 0.81 ms, 1.05 ms with the store vectorized)
            sch.vectorize(store)
        for block in pending:
            schedule_injective(sch, block, target)
        return sch


def _channel_tiles(sch: s_tir.Schedule, conv: _Conv, lanes: int, registers: int,
                   vectors: int) -> tuple[Any, Any, int]:
    """``vectors`` channel-vectors by a row segment; the weight repacked to match."""
    channels = lanes * vectors
    width = _divisor_at_most(conv.width, ACCUMULATORS[registers] // vectors)
    n, f, y, x, rc, ry, rx = sch.get_loops(conv.block)
    fo, fi = sch.split(f, [None, channels])
    xo, xi = sch.split(x, [None, width])
    sch.reorder(n, fo, y, xo, rc, ry, rx, xi, fi)
    sch.unroll(xi)
    sch.vectorize(fi)
    return xo, rc, channels


def _pack_input(sch: s_tir.Schedule, conv: _Conv, lanes: int) -> list[Any]:
    """A depthwise convolution's input read padded and packed as ``[N, C / lanes, H, W, lanes]``
    (the padding computed in the same pass), so that a tap of ``lanes`` channels is one vector
    load at any stride; returns the blocks before the convolution."""
    packed = sch.cache_read(conv.block, 1 - conv.weight, "global")
    sch.transform_layout(packed, ("write", 0), lambda n, c, h, w: (n, c // lanes, h, w, c % lanes))
    blocks = root_blocks(sch)
    position = [sch.get(b).same_as(sch.get(packed)) for b in blocks].index(True)
    source = sch.get(packed).reads[0].source
    for block in blocks[:position]:
        if any(w.source.same_as(source) for w in sch.get(block).writes):
            sch.compute_inline(block)  # the padding
    sch.transform_block_layout(packed, lambda n, c, h, w: (n, c // lanes, h, w, c % lanes))
    blocks = root_blocks(sch)
    return blocks[:[sch.get(b).same_as(sch.get(conv.block)) for b in blocks].index(True)]


def _repack_weight(sch: s_tir.Schedule, func: tirx.PrimFunc, conv: _Conv, channels: int,
                   before: list[Any]) -> list[Any]:
    """Read the weight repacked as ``[O / channels, I, KH, KW, channels]``; returns the blocks of
    ``before`` still there.

    SplitLayoutRewritePreproc splits off only a repack that reads a parameter: a weight the function
    computes first (conv2d_transpose's flipped, transposed kernel) is computed inside the repack, so
    that the kernel too is computed once. Where it cannot be, the repack stays in the function.
    """
    packed = sch.cache_read(conv.block, conv.weight, "global")
    o, i, h, w = conv.weight_axes
    sch.transform_layout(packed, ("write", 0),
                         lambda *axes: (axes[o] // channels, axes[i], axes[h], axes[w], axes[o] % channels))
    params = list(func.params)  # the function's buffers

    def reads_param() -> bool:
        return any(sch.get(packed).reads[0].source.same_as(p) for p in params)

    if not reads_param():
        source = sch.get(packed).reads[0].source
        producers = [b for b in before if any(w.source.same_as(source) for w in sch.get(b).writes)]
        inlined = []
        try:
            for block in producers:
                sch.compute_inline(block)
                inlined.append(block)
        except (RuntimeError, ValueError):
            return [b for b in before if b not in inlined]
        before = [b for b in before if b not in producers]
    if reads_param():
        sch.annotate(packed, PREPROC, True)
    return before


def _width_tiles(sch: s_tir.Schedule, conv: _Conv, target: Target,
                 registers: int) -> tuple[Any, Any, int | None]:
    """A segment of an output row per channel: vectors along it where one divides the width, else
    an unrolled run of scalars; the weight is one broadcast per tap."""
    lanes = vector_lanes(target, conv.bits, conv.width)
    if lanes is not None:
        vectors = _divisor_at_most(conv.width // lanes, ACCUMULATORS[registers] // 2)
        width = lanes * vectors
    else:
        width = _divisor_at_most(conv.width, 8)
    n, f, y, x, rc, ry, rx = sch.get_loops(conv.block)
    xo, xi = sch.split(x, [None, width])
    sch.reorder(n, f, y, xo, rc, ry, rx, xi)
    if lanes is None:
        sch.unroll(xi)
        return xo, rc, None
    sch.vectorize(xi)
    return xo, rc, width


def _schedule_producer(sch: s_tir.Schedule, block: Any, target: Target) -> None:
    """The padding as an injective loop nest; a plain copy of the input (a 1x1 convolution's) is inlined."""
    stmt = sch.get(block)
    if len(stmt.reads) == 1 and len(stmt.writes) == 1 and _same_region(stmt.reads[0], stmt.writes[0]):
        try:
            sch.compute_inline(block)
            return
        except (RuntimeError, ValueError):
            pass
    schedule_injective(sch, block, target)


def _divisor_at_most(n: int, limit: int) -> int:
    return next(d for d in range(max(min(n, limit), 1), 0, -1) if n % d == 0)


def _same_region(read: Any, write: Any) -> bool:
    return len(read.region) == len(write.region) and all(
        a.min.same_as(b.min) and int(a.extent) == 1 == int(b.extent) for a, b in zip(read.region, write.region))


# The block's iterators as LegalizeOps writes each layout (n, f, y, x spatial; rc, ry, rx reduced),
# and where the input's channel, row and column are among its indices.
_ITERATORS = {"NCHW": ("n", "f", "y", "x", "rc", "ry", "rx"), "NHWC": ("n", "y", "x", "f", "ry", "rx", "rc")}
_INPUT_AXES = {"NCHW": (1, 2, 3), "NHWC": (3, 1, 2)}


def _conv_form(sch: s_tir.Schedule, block_rv: Any) -> _Conv | None:
    """The block as LegalizeOps writes conv2d NCHW or NHWC (:data:`_ITERATORS`): the output at
    ``[n, f, y, x]`` in the layout's order, the weight at ``f, rc, ry, rx`` in any order (OIHW,
    HWIO, OHWI), the input at its batch ``n``, its channel reading ``rc`` (and ``f``'s group), its
    row ``y`` and ``ry``, its column ``x`` and ``rx``."""
    block = sch.get(block_rv)
    kinds = "".join("S" if iv.iter_type == tirx.IterVar.DataPar else "R" if iv.iter_type == tirx.IterVar.CommReduce
                    else "?" for iv in block.iter_vars)
    if kinds != "SSSSRRR" or len(block.reads) != 2 or len(block.writes) != 1 or len(sch.get_loops(block_rv)) != 7:
        return None
    if any(loop_extent(sch, loop) is None for loop in sch.get_loops(block_rv)):
        return None  # tiles need static extents
    for layout, names in _ITERATORS.items():
        conv = _layout_form(sch, block_rv, layout, dict(zip(names, (iv.var for iv in block.iter_vars))))
        if conv is not None:
            return conv
    return None


def _layout_form(sch: s_tir.Schedule, block_rv: Any, layout: str, v: dict[str, Any]) -> _Conv | None:
    block = sch.get(block_rv)
    out = block.writes[0]
    if not _indexed_by(out, tuple(v[name] for name in _ITERATORS[layout][:4])):
        return None
    roles = (v["f"], v["rc"], v["ry"], v["rx"])
    weight = next((i for i, r in enumerate(block.reads) if _permutation_of(r, roles) is not None), None)
    if weight is None:
        return None
    data = block.reads[1 - weight]
    if len(data.region) != 4 or not all(int(r.extent) == 1 for r in data.region):
        return None
    c_axis, h_axis, w_axis = _INPUT_AXES[layout]
    index = [r.min for r in data.region]
    order = _ITERATORS["NCHW"]  # the canonical order the index checks below name positions in

    def reads(axis: int) -> list[bool]:
        return [reads_var(index[axis], v[name]) for name in order]

    batch, chan, row, col = reads(0), reads(c_axis), reads(h_axis), reads(w_axis)
    if not (batch == [True] + [False] * 6 and chan[4] and not any(chan[i] for i in (0, 2, 3, 5, 6))
            and row[2] and row[5] and not any(row[i] for i in (0, 1, 3, 4, 6))
            and col[3] and col[6] and not any(col[i] for i in (0, 1, 2, 4, 5))):
        return None
    in_channels, group_inputs = int(data.source.shape[c_axis]), _extent(block, layout, "rc")
    channels = _extent(block, layout, "f")
    if in_channels % group_inputs or channels % (in_channels // group_inputs):
        return None
    groups = in_channels // group_inputs
    if groups == 1 and chan[1] or groups > 1 and not chan[1]:
        return None
    if out.source.dtype != data.source.dtype or out.source.dtype != block.reads[weight].source.dtype:
        return None  # mixed dtypes (int8 with int32 sums) keep their loops
    coefficients = detect_linear_equation(index[w_axis], [v["x"]])  # [stride, the rest]; [] where not linear in x
    step = Analyzer().simplify(coefficients[0]) if len(coefficients) == 2 else None
    return _Conv(block_rv, weight, channels // groups, group_inputs, channels, _extent(block, layout, "x"),
                 int(step) if isinstance(step, tirx.IntImm) else None, out.source.dtype.bits, layout,
                 _permutation_of(block.reads[weight], roles))


def _extent(block: Any, layout: str, name: str) -> int:
    """The extent of the block's iterator ``name`` (of :data:`_ITERATORS`) in ``layout``."""
    return int(block.iter_vars[_ITERATORS[layout].index(name)].dom.extent)


def _permutation_of(region: Any, variables: tuple) -> tuple[int, ...] | None:
    """Where each of ``variables`` indexes ``region`` (each index one of them, whole), or None."""
    if len(region.region) != len(variables) or any(int(r.extent) != 1 for r in region.region):
        return None
    axes = [next((a for a, r in enumerate(region.region) if r.min.same_as(var)), None) for var in variables]
    return tuple(axes) if None not in axes and len(set(axes)) == len(axes) else None


def _indexed_by(region: Any, variables: tuple) -> bool:
    return len(region.region) == len(variables) and all(
        r.min.same_as(v) and int(r.extent) == 1 for r, v in zip(region.region, variables))
