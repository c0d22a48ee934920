"""Public Relay passes: combine parallel dense/matmul, batch_matmul and conv2d branches."""

from __future__ import annotations

import tvm
from tvm import relay

from ..core.driver import Check, CombineSettings, Report
from .graph_view import UnsupportedRegion, build_body_view
from .rewrite import rewrite_body


def _combine_pass(name: str, min_num_branches: int, max_branches: int | None, max_combined_bytes: int | None,
                  check: Check | None, on_combine: Report | None) -> tvm.transform.Pass:
    settings = CombineSettings(name, min_num_branches, max_branches, max_combined_bytes, check, on_combine)

    def rewrite_function(func: relay.Function) -> relay.Function:
        try:
            view = build_body_view(func.body)
        except UnsupportedRegion:
            return func
        plans = settings.plan(view.graph, view.expr_of)
        if not plans:
            return func
        body = rewrite_body(view, plans, func.body)
        return relay.Function(func.params, body, None, func.type_params, func.attrs, func.span)

    def transform(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        mod = relay.transform.InferType()(mod)
        updates = {}
        for gv, func in mod.functions.items():
            if isinstance(func, relay.Function) and not func.attrs or isinstance(func, relay.Function) and "Primitive" not in func.attrs:
                new = rewrite_function(func)
                if not new.same_as(func):
                    updates[gv] = new
        if not updates:
            return mod
        mod = tvm.IRModule(dict(mod.functions), mod.type_definitions)
        for gv, func in updates.items():
            mod[gv] = func
        return relay.transform.InferType()(mod)

    return tvm.transform.module_pass(transform, opt_level=0, name=name)


def CombineParallelDense(min_num_branches: int = 2, max_branches: int | None = None,
                         max_combined_bytes: int | None = None, check: Check | None = None,
                         on_combine: Report | None = None) -> tvm.transform.Pass:
    """Merge sibling ``nn.dense`` / ``nn.matmul`` ops with 2-D weights that read the same input."""
    return _combine_pass("CombineParallelDense", min_num_branches, max_branches, max_combined_bytes, check, on_combine)


def CombineParallelBatchMatmul(min_num_branches: int = 2, max_branches: int | None = None,
                               max_combined_bytes: int | None = None, check: Check | None = None,
                               on_combine: Report | None = None) -> tvm.transform.Pass:
    """Merge sibling ``nn.batch_matmul`` ops (either ``transpose_b``) of equal batch."""
    return _combine_pass("CombineParallelBatchMatmul", min_num_branches, max_branches, max_combined_bytes, check,
                         on_combine)


def CombineParallelConv2D(min_num_branches: int = 2, max_branches: int | None = None,
                          max_combined_bytes: int | None = None, check: Check | None = None,
                          on_combine: Report | None = None) -> tvm.transform.Pass:
    """Merge sibling ``nn.conv2d`` ops (groups == 1), zero-padding smaller kernels."""
    return _combine_pass("CombineParallelConv2D", min_num_branches, max_branches, max_combined_bytes, check, on_combine)


def CombineParallelOps(min_num_branches: int = 2, max_branches: int | None = None,
                       max_combined_bytes: int | None = None, check: Check | None = None,
                       on_combine: Report | None = None) -> tvm.transform.Pass:
    """All three combiners in one pass."""
    return _combine_pass("CombineParallelOps", min_num_branches, max_branches, max_combined_bytes, check, on_combine)
