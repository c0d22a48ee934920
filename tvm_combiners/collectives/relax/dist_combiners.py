"""Combining the parameter transfers that TVM's ``LowerDistIR`` emits: ``R.ccl.broadcast_from_worker0``
(a replicated parameter) and ``R.ccl.scatter_from_worker0`` (a sharded one), one per parameter.

The same units, driver and planner as every other combiner (:mod:`.combiners`): keys hold the kind,
the dtype, ``in_group`` (always False for these ops: TVM's legalization passes False) and, for a
scatter, the worker count; independent ops skip ahead over the ones between; thresholds are exact.

Layouts, reusing :func:`~..combiners.keys.plan_pack`:

- N broadcasts: the operands flattened one after the other (``allreduce``'s layout), one broadcast,
  each result a contiguous slice of the received buffer.
- N scatters: ``scatter_from_worker0(x, n, axis)`` hands worker ``r`` the block ``r`` of ``x`` along
  ``axis``; one scatter along axis 0 hands worker ``r`` the ``r``-th flat block of its input. So the
  packed buffer is ``[worker][operand]``: block ``r`` holds, operand after operand, the shard ``r`` of
  each (``reduce_scatter``'s input layout, exact on any axis), and each worker unpacks its block into
  its own shards by contiguous slices. Bitwise exact: bytes only move.
"""

from __future__ import annotations

from typing import Any

import tvm
from tvm import ir, relax

from ...core.driver import gc_paused
from ...relax.module import static_tensor
from .. import spec as S
from ..combiners.keys import DEFAULT_THRESHOLD_BYTES, DEFAULT_THRESHOLD_COUNT, plan_pack
from ..combiners.options import CombinerOptions, make_options
from .combiners import _combine_module, _FunctionCombiner, _Op

PASS_NAME = "BroadcastScatterCombiner"
BROADCAST, SCATTER = "relax.ccl.broadcast_from_worker0", "relax.ccl.scatter_from_worker0"
#: Kernel names of a combined group, per family.
_LABELS = {"ccl.broadcast_from_worker0": "broadcast", "ccl.scatter_from_worker0": "scatter"}


def broadcast_scatter_key(op_name: str, dtype: str, num_workers: int = 1, in_group: bool = False) -> tuple:
    """Key of a broadcast or scatter from worker 0: equal keys may share one transfer."""
    if op_name == BROADCAST:
        return ("ccl.broadcast_from_worker0", in_group, dtype)
    return ("ccl.scatter_from_worker0", num_workers, in_group, dtype)


class _TransferCombiner(_FunctionCombiner):
    """The function combiner of :mod:`.combiners`, classifying and rebuilding broadcasts and scatters."""

    def classify(self, binding: Any) -> _Op | None:
        if not isinstance(binding, relax.VarBinding) or not isinstance(binding.value, relax.Call):
            return None
        call = binding.value
        if not isinstance(call.op, ir.Op) or call.op.name not in (BROADCAST, SCATTER):
            return None
        payload = static_tensor(call.args[0].ty)
        if payload is None or payload[1] not in S.SUPPORTED_DTYPES or not payload[0]:
            return None  # symbolic shapes, bool, float8, scalars: left as they are
        shape, dtype = payload
        if call.op.name == BROADCAST:
            return _Op("ccl.broadcast_from_worker0", broadcast_scatter_key(BROADCAST, dtype), shape, dtype, call=call)
        workers, axis = int(call.attrs.num_workers), int(call.attrs.axis)
        if shape[axis] % workers:
            return None  # TVM's legalization refuses it, with its own message
        return _Op("ccl.scatter_from_worker0", broadcast_scatter_key(SCATTER, dtype, workers), shape, dtype, axis=axis,
                   group_size=workers, call=call)

    def _collective(self, bindings: list[Any], ops: list[Any], dataflow: bool) -> list[relax.Binding]:
        first = ops[0]
        scatter = first.family == "ccl.scatter_from_worker0"
        layout = "reduce_scatter" if scatter else "allreduce"
        plan = plan_pack(layout, [(op.shape, op.dtype, op.axis) for op in ops], first.group_size)
        self.opts.report(first.family, len(ops), plan.total_bytes, first.key)

        def collective(flat: relax.Var) -> tuple[list[relax.Binding], relax.Var]:
            new = (relax.op.ccl.scatter_from_worker0(flat, first.group_size, 0) if scatter
                   else relax.op.ccl.broadcast_from_worker0(flat))
            new = self.bb.normalize(new)
            var = self._var("combined", new.ty, dataflow)
            return [relax.VarBinding(var, new)], var

        return self._pack_unpack(plan, [op.call.args[0] for op in ops], dataflow, collective,
                                 [b.var for b in bindings], _LABELS[first.family])


def _options(threshold_bytes: Any, threshold_count: Any, on_combine: Any, max_op_bytes: Any) -> CombinerOptions:
    return make_options(PASS_NAME, threshold_bytes, threshold_count, on_combine, True, max_op_bytes)


def BroadcastScatterCombiner(threshold_bytes: int = DEFAULT_THRESHOLD_BYTES,  # noqa: N802 - a pass factory
                             threshold_count: int = DEFAULT_THRESHOLD_COUNT, on_combine: Any = None, *,
                             max_op_bytes: Any = "auto") -> tvm.transform.Pass:
    """Combine independent ``R.ccl.broadcast_from_worker0`` ops of one key into one each, and likewise
    ``R.ccl.scatter_from_worker0`` (what LowerDistIR emits per parameter). Options as every combiner's;
    reports name ``ccl.broadcast_from_worker0`` or ``ccl.scatter_from_worker0`` and the payload bytes
    worker 0 sends."""
    opts = _options(threshold_bytes, threshold_count, on_combine, max_op_bytes)

    @gc_paused()
    def transform(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return _combine_module(mod, opts, _TransferCombiner)

    return tvm.transform.module_pass(transform, opt_level=0, name=f"tvm_combiners.{PASS_NAME}")


__all__ = ["BroadcastScatterCombiner", "broadcast_scatter_key"]
