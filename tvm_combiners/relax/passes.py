"""Public Relax passes: combine parallel matmul, batch matmul and conv2d branches."""

from __future__ import annotations

import tvm
from tvm import relax

from ..core.driver import CombineSettings, gc_paused, pass_factory
from .graph_view import build_block_view
from .module import rewrite_functions
from .rewrite import rewrite_block


def _build(settings: CombineSettings) -> tvm.transform.Pass:
    def rewrite_function(func: relax.Function) -> relax.Function:
        body = func.body
        if not isinstance(body, relax.SeqExpr):
            return func
        blocks, changed = [], False
        for block in body.blocks:
            if isinstance(block, relax.DataflowBlock):
                view = build_block_view(block)
                plans = settings.plan(view.graph, view.expr_of, lambda: relax.analysis.get_var2val(func))
                if plans:
                    block = rewrite_block(view, plans)
                    changed = True
            blocks.append(block)
        if not changed:
            return func
        new_body = relax.BlockBuilder().normalize(relax.SeqExpr(blocks, body.body))
        return relax.Function(func.params, new_body, func.ret_ty, func.is_pure, func.attrs, func.span)

    def transform(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        with gc_paused():
            return combine_module(mod)

    def combine_module(mod: tvm.IRModule) -> tvm.IRModule:
        return rewrite_functions(mod, lambda _name, func: rewrite_function(func))

    return tvm.transform.module_pass(transform, opt_level=0, name=settings.pass_name)


CombineParallelMatmul = pass_factory(
    "CombineParallelMatmul",
    "Merge sibling ``R.matmul`` ops that read the same input: 2-D weights, and batched weights of equal batch "
    "(as TVM's ``relax.transform.CombineParallelMatmul``).", _build)
CombineParallelBatchMatmul = pass_factory(
    "CombineParallelBatchMatmul", "Merge sibling ``R.matmul`` ops with batched weights of equal batch.", _build)
CombineParallelConv2D = pass_factory(
    "CombineParallelConv2D", "Merge sibling ``R.nn.conv2d`` ops (groups == 1), zero-padding smaller kernels.", _build)
CombineSharedWeightMatmul = pass_factory(
    "CombineSharedWeightMatmul",
    "Merge sibling ``R.matmul`` ops that read one weight with different inputs (inputs concatenated by rows).",
    _build)
CombineParallelOps = pass_factory(
    "CombineParallelOps",
    "Merge parallel matmul, batch matmul and conv2d branches, and matmuls sharing a weight, in one pass.", _build)
