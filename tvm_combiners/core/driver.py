"""What every combiner pass does per region, whatever the IR: plan, ask ``check``, report."""

from __future__ import annotations

import contextlib
import gc
import inspect
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from .branch_grouping import DEFAULT_TO_BATCH, CombineOptions, CombinePlan, plan_combinations
from .candidate import CombineCandidate, candidate_of
from .graph import Graph

Check = Callable[[CombineCandidate], bool]
Report = Callable[[CombineCandidate], None]
#: TVM's ``relax.transform.CombineParallelMatmul`` veto: ``check(lhs, rhs, bias, bindings) -> bool``.
TVMCheck = Callable[[Any, list, list, Any], bool]

#: Family names each public pass combines (the Relay passes call 2-D matmuls "dense").
FAMILIES = {
    "CombineParallelMatmul": ("matmul", "batch_matmul"),  # TVM's combines batched weights of one batch too
    "CombineParallelDense": ("dense",),
    "CombineParallelBatchMatmul": ("batch_matmul",),
    "CombineParallelConv2D": ("conv2d",),
    "CombineParallelOps": ("matmul", "dense", "batch_matmul", "conv2d"),
}
#: Families whose siblings may instead share a *weight* (inputs concatenated by rows).
SHARED_WEIGHT_FAMILIES = {
    "CombineSharedWeightMatmul": ("matmul", "batch_matmul"),
    "CombineSharedWeightDense": ("dense", "batch_matmul"),
    "CombineParallelOps": ("matmul", "dense", "batch_matmul"),
}


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Run a pass without Python's cyclic GC, restoring its state after.

    A pass allocates many small objects while the IR holds many more; full collections then
    rescan the whole heap again and again and turn a linear pass superlinear (800 sibling
    branches plan 1.5x slower with GC on). Nothing a pass allocates needs cycle collection.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class CombineSettings:
    """Validated options of one pass instance."""

    def __init__(self, pass_name: str, min_num_branches: int, max_branches: int | None,
                 max_combined_bytes: int | None, check: Check | None, on_combine: Report | None,
                 to_batch: bool = DEFAULT_TO_BATCH, tvm_check: TVMCheck | None = None) -> None:
        for label, fn in (("check", check), ("on_combine", on_combine), ("check", tvm_check)):
            if fn is not None and not callable(fn):
                raise TypeError(f"{pass_name}: {label} must be callable or None, got {type(fn).__name__}")
        if check is not None and tvm_check is not None:
            raise TypeError(f"{pass_name}: check given twice (positionally and as check=)")
        if tvm_check is not None and _takes(tvm_check, 4) is False:
            raise TypeError(f"{pass_name}: a positional check has TVM's signature check(lhs, rhs, bias, bindings) "
                            "and must accept 4 arguments; pass check=f for check(candidate)")
        if check is not None and _takes(check, 4) and _takes(check, 1) is False:
            check, tvm_check = None, check  # check=f with TVM's signature, as TVM's own keyword allows
        self.tvm_check = tvm_check
        try:
            self.options = CombineOptions(min_num_branches, max_branches, max_combined_bytes, to_batch)
        except (TypeError, ValueError) as err:
            raise type(err)(f"{pass_name}: {err}") from None
        self.pass_name = pass_name
        self.families: Sequence[str] = FAMILIES.get(pass_name, ())
        self.shared_weight_families: Sequence[str] = SHARED_WEIGHT_FAMILIES.get(pass_name, ())
        self.check = check
        self.on_combine = on_combine

    def plan(self, graph: Graph, expr_of: Callable[[int], Any],
             bindings: Callable[[], Any] | None = None,
             cannot_emit: Callable[[CombinePlan], bool] | None = None) -> list[CombinePlan]:
        """Plans for one region; ``expr_of`` maps a node back to its IR expression.

        ``bindings`` returns the function's variable-to-value map, which TVM's form of ``check``
        receives (computed only when such a check is set). ``cannot_emit`` lets an adapter refuse
        a plan its IR cannot express; the planner then tries other groupings, as for a user's veto.
        """
        cached: list[Any] = []

        def veto(plan: CombinePlan) -> bool:
            if cannot_emit is not None and cannot_emit(plan):
                return True
            if self.tvm_check is not None:
                if not cached:
                    cached.append(bindings() if bindings is not None else {})
                if not self.tvm_check(*_tvm_check_args(plan, graph, expr_of), cached[0]):
                    return True
            return self.check is not None and not self.check(candidate_of(plan, graph, expr_of))

        plans = plan_combinations(graph, self.families, self.options, veto, self.shared_weight_families)
        if self.on_combine is not None:
            for plan in plans:
                self.on_combine(candidate_of(plan, graph, expr_of))
        return plans


def _takes(fn: Callable[..., Any], count: int) -> bool | None:
    """Whether ``fn`` accepts ``count`` positional arguments; None when Python cannot tell."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(*range(count))
    except TypeError:
        return False
    return True


def _tvm_check_args(plan: CombinePlan, graph: Graph, expr_of: Callable[[int], Any]) -> tuple[Any, list, list]:
    """``(lhs, rhs, bias)`` as TVM's check receives them: the shared input, the weights, and the
    per-branch bias of a leading ``add`` follower (empty when the group has none). For a group
    sharing a weight (which TVM's pass never forms) ``lhs`` is that weight, ``rhs`` the inputs."""
    def operands(position: str) -> list[Any]:
        return [expr_of(graph[r].operands[getattr(graph[r].root, position)]) for r in plan.roots]

    shared, own = ("weight", "data") if plan.shares == "weight" else ("data", "weight")
    lhs, rhs = operands(shared)[0], operands(own)
    bias: list = []
    if plan.steps and graph[plan.steps[0].nodes[0]].op == "add" and len(plan.steps[0].sides) == 1:
        bias = [expr_of(source) for source in plan.steps[0].sides[0].sources]
    return lhs, rhs, bias


OPTIONS_DOC = """
    Parameters
    ----------
    check : callable, optional (positional)
        TVM's form, for a drop-in replacement of ``relax.transform.CombineParallelMatmul(check)``:
        ``check(lhs, rhs, bias, bindings) -> bool`` with the shared input, the list of weights,
        the list of biases (empty without a bias add) and the function's var-to-value map;
        False vetoes the group. A function passed as ``check=`` that takes exactly four
        arguments is read the same way; one taking one argument gets a ``CombineCandidate``.
    min_num_branches : int
        Fewest branches worth one combined op (>= 2).
    max_branches : int, optional
        Most branches per combined op; larger groups are cut into several.
    max_combined_bytes : int, optional
        Largest combined weight, in bytes, like XLA's combiner thresholds.
    check : callable, optional (keyword)
        ``check(candidate) -> bool``; returning False vetoes that group.
    on_combine : callable, optional
        Called with every group that is combined (for reports and logging).
    to_batch : bool
        True (the default): branches of one static width on one input stack into one batched
        matmul (the shared input is broadcast, not copied); False: one op over concatenated
        weights. Stacking applies to matmuls with 2-D weights (Relax: inputs of any rank >= 2;
        Relay: 2-D inputs) and batch_matmul of batch 1; every other group (several widths on one
        input, convolutions, symbolic widths) concatenates either way.

    Returns
    -------
    tvm.transform.Pass
"""


def pass_factory(name: str, summary: str, build: Callable[[CombineSettings], Any]) -> Callable[..., Any]:
    """A public pass constructor: validates options, then lets the adapter ``build`` the pass."""

    def factory(tvm_check: TVMCheck | None = None, /, *, min_num_branches: int = 2, max_branches: int | None = None,
                max_combined_bytes: int | None = None, check: Check | None = None, on_combine: Report | None = None,
                to_batch: bool = DEFAULT_TO_BATCH) -> Any:
        return build(CombineSettings(name, min_num_branches, max_branches, max_combined_bytes, check, on_combine,
                                     to_batch, tvm_check))

    factory.__name__ = factory.__qualname__ = name
    factory.__doc__ = summary + "\n" + OPTIONS_DOC
    return factory
