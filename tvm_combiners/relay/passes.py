"""Public Relay passes: combine parallel dense/matmul, batch_matmul and conv2d branches."""

from __future__ import annotations

from typing import Any

import tvm
from tvm import relay

from ..core.driver import CombineSettings, gc_paused, pass_factory
from .graph_view import BodyView, UnsupportedRegion, UntypedBody, build_body_view, cannot_emit, checked_type
from .rewrite import rewrite_body


def _build(settings: CombineSettings) -> tvm.transform.Pass:
    def rewrite_function(func: relay.Function, view: BodyView) -> relay.Function:
        plans = settings.plan(view.graph, view.expr_of, cannot_emit=lambda plan: cannot_emit(view.graph, plan))
        if not plans:
            return func
        body = rewrite_body(view, plans, func.body)
        # The rewrite keeps the function's type; stating it lets callers in the module type-check
        # before this function is inferred again (Relay infers a call from its callee's type).
        return relay.Function(func.params, body, checked_type(func).ret_type, func.type_params, func.attrs,
                              func.span)

    def transform(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        with gc_paused():
            try:  # a typed module (the usual input: every Relay pass returns one) is read as it is
                views = read_module(mod)
            except UntypedBody:
                mod = relay.transform.InferType()(mod)
                views = read_module(mod)
            return combine_module(mod, views)

    def read_module(mod: tvm.IRModule) -> dict[Any, tuple[relay.Function, BodyView]]:
        """Every function is read before any is planned: an untyped one is found before a group is reported."""
        views = {}
        for gv, func in mod.functions.items():
            if isinstance(func, relay.Function) and not (func.attrs and "Primitive" in func.attrs):
                checked_type(func)  # raises UntypedBody; the ret type is read again when rewriting
                try:
                    views[gv] = func, build_body_view(func.body)
                except UnsupportedRegion:
                    pass
        return views

    def combine_module(mod: tvm.IRModule, views: dict[Any, tuple[relay.Function, BodyView]]) -> tvm.IRModule:
        updates = {}
        for gv, (func, view) in views.items():
            new = rewrite_function(func, view)
            if not new.same_as(func):
                updates[gv] = new
        if not updates:
            return mod
        functions = dict(mod.functions)
        functions.update(updates)
        attrs = {str(k): v for k, v in mod.attrs.items()} if mod.attrs else None
        new = tvm.IRModule(functions, mod.type_definitions, attrs, dict(getattr(mod, "global_infos", {}) or {}))
        return relay.transform.InferType()(new)

    return tvm.transform.module_pass(transform, opt_level=0, name=settings.pass_name)


CombineParallelDense = pass_factory(
    "CombineParallelDense", "Merge sibling ``nn.dense`` / ``nn.matmul`` ops with 2-D weights reading one input.", _build)
CombineParallelBatchMatmul = pass_factory(
    "CombineParallelBatchMatmul", "Merge sibling ``nn.batch_matmul`` ops (either ``transpose_b``) of equal batch.",
    _build)
CombineParallelConv2D = pass_factory(
    "CombineParallelConv2D", "Merge sibling ``nn.conv2d`` ops (groups == 1), zero-padding smaller kernels.", _build)
CombineSharedWeightDense = pass_factory(
    "CombineSharedWeightDense",
    "Merge sibling ``nn.dense``/``nn.matmul``/``nn.batch_matmul`` ops that read one weight with different inputs.",
    _build)
CombineParallelOps = pass_factory(
    "CombineParallelOps",
    "Merge parallel dense, batch_matmul and conv2d branches, and denses sharing a weight, in one pass.", _build)
