"""Default CPU schedules: TVM's llvm pipeline leaves every function as the naive loops LegalizeOps wrote.

On cuda TVM's default pipeline schedules each fused function with its dlight rules; on llvm it
schedules none, so an untuned BERT runs some 35-60x slower than it need (a GEMM is a scalar triple
loop) and a user comparing against onnxruntime sees a gap that deployment would not have.
:class:`CPUMatmul` is the GEMM rule dlight has for GPUs only: a register-tiled, vectorized,
parallel loop nest, K in cache-sized blocks, with the elementwise epilogue FuseOps put in the same
function computed on each tile (or column block) while it is in cache. Everything else keeps its
loops: dlight's CPU reduction rule parallelizes a softmax or mean over a non-last axis into every
thread recomputing the whole reduction into one shared buffer (10-120x slower, and a data race),
so it is not applied.

The rule only splits, reorders, caches and annotates loops with TVM's schedule primitives, which
check each step's dependences (parallel is marked once every block is in place, over loops each
block under it is spatial in); a function it does not recognise, or a primitive refuses, keeps
its loops.
"""

from __future__ import annotations

from typing import Any

import tvm
from tvm import relax, s_tir, tirx
from tvm.relax.backend.cpu_generic import pipeline as cpu_generic  # its package exports two of the four lists
from tvm.s_tir import dlight
from tvm.s_tir.dlight.analysis import SBlockInfo, normalize_prim_func
from tvm.target import Target
from tvm.target.codegen import target_has_features

# Output rows per tile and vector registers per row: 4 x 2 AVX2 registers of accumulators leave
# room for the operands in x86's 16. MiniLM-L3 on a Zen 3 core, medians of 3 alternating rounds:
# 4 x 2 43.7 ms, 2 x 4 46.8, 8 x 1 49.2, 8 x 2 51.2, 4 x 4 58.7, 6 x 2 63.6, 4 x 1 66.4.
TILE_ROWS = 4
TILE_VECTORS = 2
# K in blocks of 256 (or 192, 128: what divides K) keeps a block of B in L1 while every row of A
# passes, C's column block waiting in a local buffer (at most 64 KiB). One GEMM alone, 7 rounds:
# 128 x 768 x 3072 23.1 -> 19.4 ms, 128 x 3072 x 768 16.5 -> 11.3 ms, 128 x 768 x 768 2.8 -> 2.5 ms.
K_BLOCKS = (256, 192, 128)
K_BLOCK_C_BYTES = 64 * 1024


def _extent(sch: s_tir.Schedule, loop: Any) -> int | None:
    extent = sch.get(loop).extent
    return int(extent.value) if isinstance(extent, tirx.IntImm) else None


def _reads(expr: Any, var: tirx.Var) -> bool:
    return any(v.same_as(var) for v in tirx.analysis.undefined_vars(expr))


def _vector_lanes(target: Target, dtype_bits: int, width: int) -> int | None:
    """Lanes of the widest vector of the target's CPU that divides ``width`` elements: its widest
    registers (LLVM's own answer says 512 bits for any x86), else a half or a quarter of them, down
    to 128 bits (8 floats on AVX-512 are one AVX2 register). None where none divides."""
    bits = next((b for feature, b in (("avx512f", 512), ("avx", 256)) if target_has_features(feature, target)), 128)
    widths = [lanes for lanes in (bits // dtype_bits, bits // dtype_bits // 2, bits // dtype_bits // 4)
              if lanes >= 1 and lanes * dtype_bits >= 128]
    return next((lanes for lanes in widths or [1] if width % lanes == 0), None)


class CPUMatmul(dlight.ScheduleRule):
    """``C[..., i, j] (+)= A[..., i, k] * B[..., k, j]`` with ``j`` contiguous in ``B`` and ``C``.

    A ``TILE_ROWS x TILE_VECTORS`` vectors tile of C accumulates in registers; tiles run column
    block by column block (a block of B stays in cache while every row of A passes), K in blocks
    of ``K_BLOCKS`` where one divides it, the outer spatial loops in parallel. Functions of
    another form are declined.
    """

    def apply(self, func: tirx.PrimFunc, target: Target, _tunable: bool) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc) or target.kind.name != "llvm":
            return None
        for fuse_epilogue in (True, False):
            try:
                return self._schedule(func, target, fuse_epilogue)
            except (RuntimeError, ValueError):  # a primitive refused (ScheduleError, or a region it cannot match)
                continue  # without the epilogue, then not at all: the function keeps its loops
        return None

    def _schedule(self, func: tirx.PrimFunc, target: Target, fuse_epilogue: bool) -> s_tir.Schedule | None:
        sch = s_tir.Schedule(func)
        infos = normalize_prim_func(sch)
        if infos is None:
            return None
        reductions = [b for b in infos if not b.is_injective()]
        if len(reductions) != 1 or not _is_matmul(sch, reductions[0]):
            return None
        main = reductions[0]
        bits = sch.get(main.block_rv).writes[0].source.dtype.bits
        *batch, i, j, k = sch.get_loops(main.block_rv)
        cols, rows = _extent(sch, j), _extent(sch, i)
        lanes = None if cols is None else _vector_lanes(target, bits, cols)
        if lanes is None:
            return None  # a vector tile needs a static width a vector divides: these stay as they were
        tile_cols = lanes * TILE_VECTORS if cols % (lanes * TILE_VECTORS) == 0 else lanes
        tile_rows = next(t for t in (TILE_ROWS, 2, 1) if rows is None or rows % t == 0)
        io, ii = sch.split(i, [None, tile_rows])
        jo, ji = sch.split(j, [None, tile_cols])
        depth = _k_block(_extent(sch, k), rows, tile_cols * bits // 8)
        if depth:  # K in blocks: a block of B stays in L1 while every row passes; C's column block in L1
            ko, ki = sch.split(k, [None, depth])
            sch.reorder(*batch, jo, ko, io, ki, ii, ji)
            tile, init_at = jo, ko
        else:
            sch.reorder(*batch, jo, io, k, ii, ji)
            tile, init_at = io, k
        accumulate = sch.cache_write(main.block_rv, 0, "local")
        sch.reverse_compute_at(accumulate, tile)
        if fuse_epilogue:
            for info in infos[infos.index(main) + 1:]:
                sch.reverse_compute_at(info.block_rv, tile)
                _vectorize_inner(sch, info.block_rv, lanes)
        sch.parallel(sch.fuse(*batch, jo) if batch else jo)  # after the moves: it checks every block under it
        sch.unroll(ii)
        sch.vectorize(ji)
        init = sch.decompose_reduction(main.block_rv, init_at)
        _vectorize_inner(sch, init, lanes)
        _vectorize_inner(sch, accumulate, lanes)
        return sch


def _k_block(depth: int | None, rows: int | None, row_bytes: int) -> int | None:
    """A K block that divides K, where C's whole column block (``rows`` x the tile's width) fits a
    local buffer of ``K_BLOCK_C_BYTES``; None keeps K whole (each tile then accumulates in registers)."""
    if depth is None or depth <= K_BLOCKS[0] or rows is None or rows * row_bytes > K_BLOCK_C_BYTES:
        return None  # a K of 256 or less: B's column block already fits L1 whole
    return next((b for b in K_BLOCKS if depth % b == 0), None)


def _is_matmul(sch: s_tir.Schedule, info: SBlockInfo) -> bool:
    """Spatial iterators ``..., i, j`` then one reduction ``k``; A reads (i, k), B (k, j) with j last."""
    kinds = info.dom_kind()
    if len(kinds) < 3 or kinds != "S" * (len(kinds) - 1) + "R":
        return False
    block = sch.get(info.block_rv)
    if len(block.reads) != 2 or len(block.writes) != 1:
        return False
    i, j, k = (it.var for it in block.iter_vars[-3:])
    if not _reads(block.writes[0].region[-1].min, j):
        return False
    a, b = block.reads
    if not _reads(b.region[-1].min, j):
        a, b = b, a

    def uses(region: Any, var: tirx.Var) -> bool:
        return any(_reads(r.min, var) for r in region.region)

    return (_reads(b.region[-1].min, j) and uses(b, k) and not uses(b, i)
            and uses(a, i) and uses(a, k) and not uses(a, j))


def _vectorize_inner(sch: s_tir.Schedule, block: Any, lanes: int) -> None:
    inner = sch.get_loops(block)[-1]
    extent = _extent(sch, inner)
    if extent is None or extent % lanes:
        return
    if extent > lanes:
        inner = sch.split(inner, [None, lanes])[1]
    sch.vectorize(inner)


def cpu_rules() -> list[dlight.ScheduleRule]:
    """The rules an untuned llvm build schedules with (and tuning times as each task's default)."""
    return [CPUMatmul()]


def default_schedules() -> tvm.transform.Pass:
    """The GEMM rule over every function no database or earlier rule has scheduled."""
    return dlight.ApplyDefaultSchedule(*cpu_rules())


def _fast_erf(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """erf as TOPI's vectorizable rational approximation where TVM's legalization calls libm's erff
    once per element: BERT's GELU on llvm. 590k elements (MiniLM-L3's three FFNs) took 7.6 ms
    that way, 0.28 ms this way, with |error| under 3e-7 against the exact erf (libm's: 5e-8);
    onnxruntime's CPU kernel approximates erf too. float16 computes in float32, as TVM's does;
    other dtypes keep TVM's legalization."""
    from tvm import topi

    dtype = call.ty.dtype  # erf keeps its input's dtype
    if dtype not in ("float32", "float16"):
        return tvm.ir.Op.get("relax.erf").get_attr("FLegalize")(bb, call)

    def te_fast_erf(x: Any) -> Any:
        wide = x if dtype == "float32" else topi.cast(x, "float32")
        erf = topi.fast_erf(wide)
        return erf if dtype == "float32" else topi.cast(erf, dtype)

    return bb.call_te(te_fast_erf, call.args[0], primfunc_name_hint="erf")  # the name fused functions take


def fusion_passes(target: Target) -> list[tvm.transform.Pass]:
    """Library dispatch, legalize and fuse, as TVM's pipelines do before scheduling (and MetaSchedule
    before extracting tasks: the tasks' keys are these functions). On llvm erf legalizes to
    :func:`_fast_erf`; cuda's keeps TVM's (a fast device intrinsic already)."""
    legalize = relax.transform.LegalizeOps({"relax.erf": _fast_erf} if target.kind.name == "llvm" else None)
    return [*relax.pipeline.library_dispatch_passes(target), legalize,
            relax.transform.AnnotateTIROpPattern(), relax.transform.FoldConstant(), relax.transform.FuseOps(),
            relax.transform.FuseTIR()]


def cpu_pipeline(target: Target, database: Any = None, schedules: bool = True) -> tvm.transform.Pass:
    """TVM's llvm pipeline with, after fusion, a tuning database's schedules and then the defaults.

    ``database``: MetaSchedule's records applied first (the caller enters it as the current
    database); the default schedules take what it does not cover. ``schedules=False`` leaves them
    out: without a database, that is TVM's llvm pipeline as it is.
    """

    @tvm.transform.module_pass(opt_level=0, name="tvm_combiners.CPUPipeline")
    def run(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        passes = fusion_passes(target)
        if database is not None:
            passes.append(relax.transform.MetaScheduleApplyDatabase())
        if schedules:
            passes.append(default_schedules())
        passes += [*cpu_generic.dataflow_lower_passes(target), *cpu_generic.finalize_passes(target)]
        with target:
            return tvm.transform.Sequential(passes)(mod)

    return run


def default_pipeline(target: Target) -> tvm.transform.Pass:
    """What this package compiles with: TVM's default pipeline, scheduled on llvm too."""
    return cpu_pipeline(target) if target.kind.name == "llvm" else relax.get_default_pipeline(target)
