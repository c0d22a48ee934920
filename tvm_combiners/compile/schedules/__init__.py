"""Default CPU schedules: TVM's llvm pipeline leaves every function as the naive loops LegalizeOps wrote.

On cuda TVM's default pipeline schedules each fused function with its dlight rules; on llvm it
schedules none, so an untuned model runs as scalar loops (a GEMM is a scalar triple loop). Each
rule here is a dlight ``ScheduleRule`` of its own module, applied where no database or earlier
rule has scheduled a function, in this order:

- :class:`~.matmul.CPUMatmul`: GEMMs, with the elementwise epilogue FuseOps put in the same
  function computed on each tile (or column block) while it is in cache.
- :class:`~.gemv.CPUGemv`: GEMMs of one row (a classifier's fully connected layer), which
  CPUMatmul declines: column blocks of the weight streamed once, accumulated in registers.
- :class:`~.conv2d.CPUConv2D`: NCHW and NHWC convolutions (strided, dilated, grouped, depthwise) and
  conv2d_transpose, output channels in vector registers over a segment of an output row, the weight
  repacked once (a depthwise convolution's input packed by channel vectors too), the epilogue
  (SiLU included) computed on each tile.
- :class:`~.pool.CPUPool`: 2-d pools read with stride 1 along the output's innermost axis.
- :class:`~.reduction.CPUReduction`: softmax, layer norm and other reductions along the last axis,
  every stage computed on one row while it is in cache, the rows in parallel where the work is large,
  vectors along the row.
- :class:`~.injective.CPUInjective`: the catch-all for functions without a reduction
  (elementwise, broadcast, transpose, concat, pad): inlined into one loop nest where TVM allows,
  outer loops in parallel where the nest is large, the innermost vectorized.

A weight repacking a rule asks for is a block TVM's SplitLayoutRewritePreproc splits into a
function of its own; FoldConstant then computes it at compile time where the weight is a constant.
Other reductions (over a non-last axis) keep their loops: dlight's CPU reduction rule
parallelizes a softmax or mean over a non-last axis into every thread recomputing the whole
reduction into one shared buffer (slower, and a data race), so it is not applied. A rule only
splits, reorders, caches, repacks and annotates loops with TVM's schedule primitives, which check
each step's dependences; a function it does not recognise, or a primitive refuses, keeps its loops.
"""

from __future__ import annotations

import tvm
from tvm import relax, s_tir, tirx
from tvm.s_tir import dlight

from .common import CONSTANT_PARAMS, PREPROC
from .conv2d import CPUConv2D
from .gemv import CPUGemv
from .injective import CPUInjective, root_blocks
from .matmul import CPUMatmul
from .pool import CPUPool
from .reduction import CPUReduction


def cpu_rules() -> list[dlight.ScheduleRule]:
    """The rules an untuned llvm build schedules with (and tuning times as each task's default)."""
    return [CPUMatmul(), CPUGemv(), CPUConv2D(), CPUPool(), CPUReduction(), CPUInjective()]


def default_schedules() -> tvm.transform.Pass:
    """The CPU rules over every function no database or earlier rule has scheduled, then each
    weight repacking a schedule asked for split into a function of its own and, for a constant
    weight, computed at compile time."""
    def run(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        scheduled = None
        # constants are marked only where their repacks can be hoisted: in the kernels they would run on
        # every call; and again without marks where TVM's split refuses the module all the same
        for mark in ((True, False) if _hoistable(_schedules(mod)) else (False,)):
            marks = [mark_constant_params()] if mark else []
            passes = [*marks, dlight.ApplyDefaultSchedule(*cpu_rules()), unmark_constant_params()]
            scheduled = tvm.transform.Sequential(passes)(_copy(mod))
            try:
                return hoist_weight_repacks()(scheduled)
            except RuntimeError:  # TVM's SplitLayoutRewritePreproc refuses the module (a send/recv kernel's
                continue          # loops without blocks): no GEMM reads its weight packed, on every call
        return scheduled  # the convolutions' repacks stay in their kernels

    return tvm.transform.module_pass(run, opt_level=0, name="tvm_combiners.DefaultSchedules")


def _copy(mod: tvm.IRModule) -> tvm.IRModule:
    """A module of the same functions and attributes (the passes here replace its functions in place)."""
    return tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs, global_infos=mod.global_infos)


def mark_constant_params() -> tvm.transform.Pass:
    """Each PrimFunc called with a constant argument gets the indices of those parameters
    (``CONSTANT_PARAMS``; those constant at every call): a rule repacks such a weight for free, where
    :func:`hoist_weight_repacks` then computes the repack at compile time."""

    def mark(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        call_tir = tvm.ir.Op.get("relax.call_tir")
        constant: dict[tvm.ir.GlobalVar, set[int]] = {}

        def visit(expr: relax.Expr) -> None:
            if isinstance(expr, relax.Call) and expr.op.same_as(call_tir) and isinstance(expr.args[1], relax.Tuple):
                gv = expr.args[0]
                here = {i for i, arg in enumerate(expr.args[1].fields) if isinstance(arg, tvm.ir.expr.GenericConst)}
                constant[gv] = constant[gv] & here if gv in constant else here

        for func in mod.functions.values():
            if isinstance(func, relax.Function):
                relax.analysis.post_order_visit(func, visit)
        for gv, indices in constant.items():
            if indices and isinstance(mod[gv], tirx.PrimFunc):
                mod[gv] = mod[gv].with_attr(CONSTANT_PARAMS, sorted(indices))
        return mod

    return tvm.transform.module_pass(mark, opt_level=0, name="tvm_combiners.MarkConstantParams")


def unmark_constant_params() -> tvm.transform.Pass:
    """``CONSTANT_PARAMS`` taken off again: only the rules read it."""

    def unmark(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        for gv, func in list(mod.functions.items()):
            if isinstance(func, tirx.PrimFunc) and func.attrs is not None and CONSTANT_PARAMS in func.attrs:
                mod[gv] = func.without_attr(CONSTANT_PARAMS)
        return mod

    return tvm.transform.module_pass(unmark, opt_level=0, name="tvm_combiners.UnmarkConstantParams")


def hoist_weight_repacks() -> tvm.transform.Pass:
    """TVM's SplitLayoutRewritePreproc, then FoldConstant, where a function repacks a weight.

    TVM's split visits every PrimFunc and fails on one without blocks (the collectives' kernels
    call the runtime and have none): a module holding such a function keeps its convolutions'
    repacks inside the kernels that use them, computed on every call, and its GEMMs read their
    weights as they are (:func:`default_schedules` marks no constants there)."""

    def hoist(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        schedules = _schedules(mod)
        if not any(map(_repacks, schedules)) or not _hoistable(schedules):
            return mod
        return relax.transform.FoldConstant()(relax.transform.SplitLayoutRewritePreproc()(mod))

    return tvm.transform.module_pass(hoist, opt_level=0, name="tvm_combiners.HoistWeightRepacks")


def _schedules(mod: tvm.IRModule) -> list[s_tir.Schedule]:
    return [s_tir.Schedule(f) for f in mod.functions.values() if isinstance(f, tirx.PrimFunc)]


def _hoistable(schedules: list[s_tir.Schedule]) -> bool:
    """Whether TVM's SplitLayoutRewritePreproc can visit every PrimFunc of a module, given a schedule
    of each (:func:`_schedules`): each must have blocks."""
    return all(map(root_blocks, schedules))


def _repacks(sch: s_tir.Schedule) -> bool:
    """Whether a block of the function is a weight repack a rule marked."""
    todo = root_blocks(sch)
    while todo:
        block = todo.pop()
        if PREPROC in sch.get(block).annotations:
            return True
        todo.extend(sch.get_child_blocks(block))
    return False
