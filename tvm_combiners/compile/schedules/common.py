"""What every CPU schedule rule shares: the rule's frame, static extents, what an index reads and calls, vector widths."""

from __future__ import annotations

from typing import Any

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir import dlight
from tvm.target import Target
from tvm.target.codegen import target_has_features

# Math LLVM lowers to a libm call per element: without a vector math library it splits a vector of
# them into one scalar call per lane plus lane shuffles, slower than the scalar loop (a softmax's
# exp stage of 1536 rows of 128: 0.85 ms vectorized, 0.63 ms scalar).
SCALAR_CALLS = frozenset(f"tirx.{name}" for name in (
    "exp", "exp2", "exp10", "expm1", "log", "log2", "log10", "log1p", "pow", "tanh", "sinh", "cosh", "erf",
    "sigmoid", "sin", "cos", "tan", "asin", "acos", "atan", "atan2", "fmod"))


class CPURule(dlight.ScheduleRule):
    """A rule for llvm targets: ``_schedule(func, target, *attempt)`` for each of ``ATTEMPTS`` in turn.

    ``_schedule`` returns the schedule, or None to decline the function. A schedule primitive that
    refuses (a ScheduleError, or a region it cannot match: RuntimeError, ValueError) moves on to the next,
    more modest attempt, and so does a schedule whose function is not well-formed TIR: TVM's
    ``reverse_compute_inline`` inlines a consumer into its producer's block while another block still
    reads the producer's buffer (SiLU's ``z * sigmoid(z)`` after a convolution), leaving that buffer
    without a writer, which only a later pass would notice. Where every attempt fails the function
    keeps its loops.
    """

    ATTEMPTS: tuple[tuple[Any, ...], ...] = ((),)

    def apply(self, func: tirx.PrimFunc, target: Target, _tunable: bool) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc) or target.kind.name != "llvm":
            return None
        for attempt in self.ATTEMPTS:
            try:
                sch = self._schedule(func, target, *attempt)
            except (RuntimeError, ValueError):
                continue
            if sch is None or s_tir.analysis.verify_well_formed(sch.mod, assert_mode=False):
                return sch
        return None

    def _schedule(self, func: tirx.PrimFunc, target: Target, *attempt: Any) -> s_tir.Schedule | None:
        raise NotImplementedError


#: The attempts of a rule that fuses the elementwise epilogue where it can, and schedules without it where not.
WITH_EPILOGUE_THEN_WITHOUT = ((True,), (False,))


def loop_extent(sch: s_tir.Schedule, loop: Any) -> int | None:
    extent = sch.get(loop).extent
    return int(extent.value) if isinstance(extent, tirx.IntImm) else None


def reads_var(expr: Any, var: tirx.Var) -> bool:
    return any(v.same_as(var) for v in tirx.analysis.undefined_vars(expr))


def vector_lanes(target: Target, dtype_bits: int, width: int) -> int | None:
    """Lanes of the widest vector of the target's CPU that divides ``width`` elements: its widest
    registers (LLVM's own answer says 512 bits for any x86), else a half or a quarter of them, down
    to 128 bits (8 floats on AVX-512 are one AVX2 register). None where none divides."""
    bits = next((b for feature, b in (("avx512f", 512), ("avx", 256)) if target_has_features(feature, target)), 128)
    widths = [lanes for lanes in (bits // dtype_bits, bits // dtype_bits // 2, bits // dtype_bits // 4)
              if lanes >= 1 and lanes * dtype_bits >= 128]
    return next((lanes for lanes in widths or [1] if width % lanes == 0), None)


def vectorize_inner(sch: s_tir.Schedule, block: Any, lanes: int) -> None:
    inner = sch.get_loops(block)[-1]
    extent = loop_extent(sch, inner)
    if extent is None or extent % lanes:
        return
    if extent > lanes:
        inner = sch.split(inner, [None, lanes])[1]
    sch.vectorize(inner)


def calls_any(stmt: Any, ops: frozenset[str]) -> bool:
    """Whether ``stmt`` (a block's store) calls one of ``ops``."""
    todo = [stmt]
    while todo:
        node = todo.pop()
        op = getattr(node, "op", None)
        if isinstance(op, tvm.ir.Op) and op.name in ops:
            return True
        for field in ("value", "a", "b", "args", "indices", "condition", "true_value", "false_value"):
            child = getattr(node, field, None)
            if isinstance(child, (tvm.ir.Expr, tirx.Stmt)):
                todo.append(child)
            elif isinstance(child, tvm_ffi.Array):  # a call's arguments, a load's indices
                todo.extend(child)
    return False
