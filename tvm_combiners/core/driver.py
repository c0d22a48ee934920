"""What every combiner pass does per region, whatever the IR: plan, ask ``check``, report."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from .branch_grouping import CombineOptions, CombinePlan, plan_combinations
from .candidate import CombineCandidate, candidate_of
from .graph import Graph

Check = Callable[[CombineCandidate], bool]
Report = Callable[[CombineCandidate], None]

#: Family names each public pass combines (the Relay passes call 2-D matmuls "dense").
FAMILIES = {
    "CombineParallelMatmul": ("matmul",),
    "CombineParallelDense": ("dense",),
    "CombineParallelBatchMatmul": ("batch_matmul",),
    "CombineParallelConv2D": ("conv2d",),
    "CombineParallelOps": ("matmul", "dense", "batch_matmul", "conv2d"),
}


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Run a pass without Python's cyclic GC, restoring its state after.

    A pass allocates many small objects while the IR holds many more; full collections then
    rescan the whole heap again and again and turn a linear pass superlinear (measured: 800
    sibling branches 1.5x slower with GC on). Nothing a pass allocates needs cycle collection.
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
                 to_batch: bool = False) -> None:
        for label, fn in (("check", check), ("on_combine", on_combine)):
            if fn is not None and not callable(fn):
                raise TypeError(f"{pass_name}: {label} must be callable or None, got {type(fn).__name__}")
        try:
            self.options = CombineOptions(min_num_branches, max_branches, max_combined_bytes, to_batch)
        except (TypeError, ValueError) as err:
            raise type(err)(f"{pass_name}: {err}") from None
        self.pass_name = pass_name
        self.families: Sequence[str] = FAMILIES[pass_name]
        self.check = check
        self.on_combine = on_combine

    def plan(self, graph: Graph, expr_of: Callable[[int], Any]) -> list[CombinePlan]:
        """Plans for one region; ``expr_of`` maps a node back to its IR expression."""

        def veto(plan: CombinePlan) -> bool:
            return self.check is not None and not self.check(candidate_of(plan, graph, expr_of))

        plans = plan_combinations(graph, self.families, self.options, veto)
        if self.on_combine is not None:
            for plan in plans:
                self.on_combine(candidate_of(plan, graph, expr_of))
        return plans


OPTIONS_DOC = """
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
    to_batch : bool
        Stack branches of equal shapes into one batched matmul (the shared input is broadcast,
        not copied) instead of concatenating weights. Applies to 2-D matmul/dense inputs and
        batch_matmul of batch 1; other groups (convolutions included) concatenate as usual.

    Returns
    -------
    tvm.transform.Pass
"""


def pass_factory(name: str, summary: str, build: Callable[[CombineSettings], Any]) -> Callable[..., Any]:
    """A public pass constructor: validates options, then lets the adapter ``build`` the pass."""

    def factory(min_num_branches: int = 2, max_branches: int | None = None, max_combined_bytes: int | None = None,
                check: Check | None = None, on_combine: Report | None = None, to_batch: bool = False) -> Any:
        return build(CombineSettings(name, min_num_branches, max_branches, max_combined_bytes, check, on_combine,
                                     to_batch))

    factory.__name__ = factory.__qualname__ = name
    factory.__doc__ = summary + "\n" + OPTIONS_DOC
    return factory
