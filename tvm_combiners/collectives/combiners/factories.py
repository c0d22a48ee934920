"""The public combiner pass factories, written once for both IRs.

Each IR's passes module supplies only ``combine_module(mod, opts)``; :func:`pass_factories` wraps
it into ``AllReduceCombiner`` ... ``CombineCollectives`` with the same names, signatures, defaults
and pass names on Relax and Relay, so option checking and pass construction cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import tvm

from ...core.driver import gc_paused
from .keys import DEFAULT_THRESHOLD_BYTES, DEFAULT_THRESHOLD_COUNT
from .options import CombinerOptions, make_options

#: Docstrings shared by both IRs; an IR passes its own wording for a factory through ``docs``.
DOCS: dict[str, str] = {
    "AllReduceCombiner": "Combine independent allreduces of one key into one each.",
    "AllGatherCombiner": "Combine independent allgathers; ``combine_by_dim=False``: any axes together.",
    "ReduceScatterCombiner": "Combine independent reduce_scatters; ``combine_by_dim=False``: any axes together.",
    "SendRecvCombiner": "Send transfers with the same pairs and independent payloads as one (fresh channel ids).",
    "CombineCollectives": "All four combiners in one pass.",
}

CombineModule = Callable[[tvm.IRModule, CombinerOptions], tvm.IRModule]


def pass_factories(combine_module: CombineModule, module: str, docs: Mapping[str, str] | None = None
                   ) -> tuple[Callable[..., tvm.transform.Pass], ...]:
    """``(AllReduceCombiner, AllGatherCombiner, ReduceScatterCombiner, SendRecvCombiner, CombineCollectives)``.

    ``module`` is the IR module that exposes them (for ``__module__``, so help() and pickling name it).
    """

    def make(pass_name: str, threshold_bytes: int, threshold_count: int, on_combine: Any, max_op_bytes: Any,
             combine_by_dim: bool = True) -> tvm.transform.Pass:
        opts = make_options(pass_name, threshold_bytes, threshold_count, on_combine, combine_by_dim, max_op_bytes)

        @gc_paused()
        def transform(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
            return combine_module(mod, opts)

        return tvm.transform.module_pass(transform, opt_level=0, name=pass_name)

    def AllReduceCombiner(threshold_bytes: int = DEFAULT_THRESHOLD_BYTES, threshold_count: int = DEFAULT_THRESHOLD_COUNT,  # noqa: N802
                          on_combine: Any = None, *, max_op_bytes: Any = "auto") -> tvm.transform.Pass:
        return make("AllReduceCombiner", threshold_bytes, threshold_count, on_combine, max_op_bytes)

    def AllGatherCombiner(threshold_bytes: int = DEFAULT_THRESHOLD_BYTES, threshold_count: int = DEFAULT_THRESHOLD_COUNT,  # noqa: N802
                          on_combine: Any = None, combine_by_dim: bool = True, *, max_op_bytes: Any = "auto") -> tvm.transform.Pass:
        return make("AllGatherCombiner", threshold_bytes, threshold_count, on_combine, max_op_bytes, combine_by_dim)

    def ReduceScatterCombiner(threshold_bytes: int = DEFAULT_THRESHOLD_BYTES, threshold_count: int = DEFAULT_THRESHOLD_COUNT,  # noqa: N802
                              on_combine: Any = None, combine_by_dim: bool = True, *, max_op_bytes: Any = "auto") -> tvm.transform.Pass:
        return make("ReduceScatterCombiner", threshold_bytes, threshold_count, on_combine, max_op_bytes, combine_by_dim)

    def SendRecvCombiner(threshold_bytes: int = DEFAULT_THRESHOLD_BYTES, threshold_count: int = DEFAULT_THRESHOLD_COUNT,  # noqa: N802
                         on_combine: Any = None, *, max_op_bytes: Any = "auto") -> tvm.transform.Pass:
        return make("SendRecvCombiner", threshold_bytes, threshold_count, on_combine, max_op_bytes)

    def CombineCollectives(threshold_bytes: int = DEFAULT_THRESHOLD_BYTES, threshold_count: int = DEFAULT_THRESHOLD_COUNT,  # noqa: N802
                           on_combine: Any = None, combine_by_dim: bool = True, *, max_op_bytes: Any = "auto") -> tvm.transform.Pass:
        return make("CombineCollectives", threshold_bytes, threshold_count, on_combine, max_op_bytes, combine_by_dim)

    out = (AllReduceCombiner, AllGatherCombiner, ReduceScatterCombiner, SendRecvCombiner, CombineCollectives)
    for f in out:
        f.__doc__ = (docs or {}).get(f.__name__, DOCS[f.__name__])
        f.__module__ = module
        f.__qualname__ = f.__name__
    return out
