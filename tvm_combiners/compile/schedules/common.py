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


#: The annotation of a block that repacks a weight: TVM's SplitLayoutRewritePreproc splits it into a
#: function of its own, which FoldConstant computes at compile time where the weight is a constant.
PREPROC = "meta_schedule.layout_rewrite_preproc"
#: A PrimFunc attribute: the indices of the parameters every call passes a constant
#: (:func:`~tvm_combiners.compile.schedules.mark_constant_params`).
CONSTANT_PARAMS = "tvm_combiners.constant_params"


def constant_param(func: tirx.PrimFunc, buffer: Any) -> bool:
    """Whether ``buffer`` is a parameter of ``func`` that every call passes a constant."""
    indices = (func.attrs or {}).get(CONSTANT_PARAMS, ())
    return any(buffer.same_as(func.params[int(i)]) for i in indices if int(i) < len(func.params))


class CPURule(dlight.ScheduleRule):
    """A rule for llvm targets: ``_schedule(func, target, *attempt)`` for each of ``ATTEMPTS`` in turn.

    ``_schedule`` returns the schedule, or None to decline the function. A schedule primitive that
    refuses (a ScheduleError, or a region it cannot match: RuntimeError, ValueError) moves on to the next,
    more modest attempt, and so does a schedule whose function is not well-formed TIR: TVM's
    ``reverse_compute_inline`` inlines a consumer into its producer's block while another block still
    reads the producer's buffer (SiLU's ``z * sigmoid(z)`` after a convolution), leaving that buffer
    without a writer, which only a later pass would notice. A schedule with a block that every thread
    of a parallel loop would run whole (:func:`shared_by_threads`) is refused the same way: TVM's
    ``reverse_compute_at`` moves a block that does not read the tile's output under the tile loop with
    its whole domain, and its consumers there then read what other threads have not written yet (a
    ReLU's backward ``where(x < 0, 0, dy @ w)``: wrong gradients with 2 threads, right with 1). Where
    every attempt fails the function keeps its loops. A function with an empty tensor keeps them
    too: it has nothing to compute, and LLVM's code generation refuses to vectorize a loop of
    extent 0.
    """

    ATTEMPTS: tuple[tuple[Any, ...], ...] = ((),)

    def apply(self, func: tirx.PrimFunc, target: Target, _tunable: bool) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc) or target.kind.name != "llvm" or has_empty_param(func):
            return None
        for attempt in self.ATTEMPTS:
            try:
                sch = self._schedule(func, target, *attempt)
            except (RuntimeError, ValueError):
                continue
            if sch is None or (s_tir.analysis.verify_well_formed(sch.mod, assert_mode=False)
                               and not shared_by_threads(sch.mod["main"])):
                return sch
        return None

    def _schedule(self, func: tirx.PrimFunc, target: Target, *attempt: Any) -> s_tir.Schedule | None:
        raise NotImplementedError


def has_empty_param(func: tirx.PrimFunc) -> bool:
    """A buffer parameter with a static extent of 0."""
    return any(isinstance(p.ty, tirx.BufferType) and any(isinstance(d, tirx.IntImm) and int(d.value) == 0 for d in p.ty.shape)
               for p in func.params)


def shared_by_threads(func: tirx.PrimFunc) -> list[str]:
    """The blocks under a parallel loop (of more than one iteration) none of whose spatial iterators
    is bound to it: each thread would run the block over the same instances (writing what the others
    write, reading what they may not have written yet); or with a reduction iterator bound to it (a
    sum split across threads, a data race)."""
    found: list[str] = []

    def visit(node: Any, parallel: tuple[tirx.Var, ...]) -> None:
        if isinstance(node, tirx.For):
            threads = node.kind == tirx.ForKind.PARALLEL and not (isinstance(node.extent, tirx.IntImm)
                                                                  and int(node.extent) == 1)
            inner = (*parallel, node.loop_var) if threads else parallel
            visit(node.body, inner)
        elif isinstance(node, s_tir.stmt.SBlockRealize):
            block = node.block
            if parallel:
                spatial = [reads_any(v, parallel) for iv, v in zip(block.iter_vars, node.iter_values)
                           if iv.iter_type == tirx.IterVar.DataPar]
                reduced = [reads_any(v, parallel) for iv, v in zip(block.iter_vars, node.iter_values)
                           if iv.iter_type != tirx.IterVar.DataPar]
                if not any(spatial) or any(reduced):  # a block without iterators: one instance, every thread
                    found.append(block.name_hint)
            visit(block.body, parallel)
            if block.init is not None:
                visit(block.init, parallel)
        elif isinstance(node, tirx.SeqStmt):
            for stmt in node.seq:
                visit(stmt, parallel)
        elif isinstance(node, (tirx.IfThenElse,)):
            visit(node.then_case, parallel)
            if node.else_case is not None:
                visit(node.else_case, parallel)
        elif hasattr(node, "body"):  # LetStmt, AttrStmt, DeclBuffer and the like
            visit(node.body, parallel)

    visit(func.body, ())
    return found


def reads_any(expr: Any, variables: tuple[tirx.Var, ...]) -> bool:
    return any(reads_var(expr, v) for v in variables)


def inline_into_consumers(sch: s_tir.Schedule, blocks: list[Any]) -> list[Any]:
    """Each of ``blocks`` but the last inlined into the blocks that read it, where TVM allows; returns
    those left. An epilogue then reaches its tile as one block that reads only what the tile wrote and
    the function's inputs (SiLU's ``z * sigmoid(z)``; a ReLU backward's ``where(x < 0, 0, y)``)."""
    left = []
    for block in blocks[:-1]:
        try:
            sch.compute_inline(block)
        except (RuntimeError, ValueError):
            left.append(block)
    return left + blocks[-1:]


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
