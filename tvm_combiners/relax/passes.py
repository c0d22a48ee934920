"""Public Relax passes: combine parallel matmul, batch matmul and conv2d branches."""

from __future__ import annotations

import tvm
from tvm import relax

from ..core.driver import Check, CombineSettings, Report
from .graph_view import build_block_view
from .rewrite import rewrite_block


def _combine_pass(name: str, min_num_branches: int, max_branches: int | None, max_combined_bytes: int | None,
                  check: Check | None, on_combine: Report | None) -> tvm.transform.Pass:
    settings = CombineSettings(name, min_num_branches, max_branches, max_combined_bytes, check, on_combine)

    def rewrite_function(func: relax.Function) -> relax.Function:
        body = func.body
        if not isinstance(body, relax.SeqExpr):
            return func
        blocks, changed = [], False
        for block in body.blocks:
            if isinstance(block, relax.DataflowBlock):
                view = build_block_view(block)
                plans = settings.plan(view.graph, view.expr_of)
                if plans:
                    block = rewrite_block(view, plans)
                    changed = True
            blocks.append(block)
        if not changed:
            return func
        new_body = relax.BlockBuilder().normalize(relax.SeqExpr(blocks, body.body))
        return relax.Function(func.params, new_body, func.ret_ty, func.is_pure, func.attrs, func.span)

    def transform(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        updates = {}
        for gv, func in mod.functions_items():
            if isinstance(func, relax.Function):
                new = rewrite_function(func)
                if not new.same_as(func):
                    updates[gv] = new
        if not updates:
            return mod
        mod = mod.clone()
        for gv, func in updates.items():
            mod[gv] = func
        return mod

    return tvm.transform.module_pass(transform, opt_level=0, name=name)


_DOC_OPTIONS = """
    Parameters
    ----------
    min_num_branches : int
        Fewest branches worth one combined op (>= 2).
    max_branches : int, optional
        Most branches per combined op; larger groups are cut into several.
    max_combined_bytes : int, optional
        Largest concatenated weight, in bytes, like XLA's combiner thresholds.
    check : callable, optional
        ``check(candidate) -> bool``; returning False vetoes that group.
    on_combine : callable, optional
        Called with every group that is combined (for reports and logging).
"""


def CombineParallelMatmul(min_num_branches: int = 2, max_branches: int | None = None,
                          max_combined_bytes: int | None = None, check: Check | None = None,
                          on_combine: Report | None = None) -> tvm.transform.Pass:
    """Merge sibling ``R.matmul`` ops with 2-D weights that read the same input."""
    return _combine_pass("CombineParallelMatmul", min_num_branches, max_branches,
                         max_combined_bytes, check, on_combine)


def CombineParallelBatchMatmul(min_num_branches: int = 2, max_branches: int | None = None,
                               max_combined_bytes: int | None = None, check: Check | None = None,
                               on_combine: Report | None = None) -> tvm.transform.Pass:
    """Merge sibling ``R.matmul`` ops with batched (rank >= 3) weights of equal batch."""
    return _combine_pass("CombineParallelBatchMatmul", min_num_branches, max_branches,
                         max_combined_bytes, check, on_combine)


def CombineParallelConv2D(min_num_branches: int = 2, max_branches: int | None = None,
                          max_combined_bytes: int | None = None, check: Check | None = None,
                          on_combine: Report | None = None) -> tvm.transform.Pass:
    """Merge sibling ``R.nn.conv2d`` ops (groups == 1), zero-padding smaller kernels."""
    return _combine_pass("CombineParallelConv2D", min_num_branches, max_branches,
                         max_combined_bytes, check, on_combine)


def CombineParallelOps(min_num_branches: int = 2, max_branches: int | None = None,
                       max_combined_bytes: int | None = None, check: Check | None = None,
                       on_combine: Report | None = None) -> tvm.transform.Pass:
    """All three combiners in one pass."""
    return _combine_pass("CombineParallelOps", min_num_branches,
                         max_branches, max_combined_bytes, check, on_combine)


for _fn in (CombineParallelMatmul, CombineParallelBatchMatmul, CombineParallelConv2D, CombineParallelOps):
    _fn.__doc__ = (_fn.__doc__ or "") + "\n" + _DOC_OPTIONS
