"""The pack and unpack kernels of a combined collective, as TIR (TVM 0.27).

``R.concat`` of 64 inputs costs more than the 64 collectives it would save (PLATFORM.md), so
packing is one generated PrimFunc: a plain loop per operand (LLVM vectorizes it), reading and
writing typed aliases of the flat buffer, so mixed dtypes need no casts. Unpacking is one too,
for the results that are not views (:mod:`.combiners`): an allgather's over several ranks
(they interleave the ranks' blocks) and those at offsets TVM cannot alias. Index maps follow
:mod:`..combiners.keys`.

Built with TVMScript's IR builder, not by printing and parsing TVMScript: parsing costs ~12 ms
per operand, over ten times what building does.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ...compile.in_place import OPERAND_OFFSETS
from ..combiners.keys import PackPlan, Segment, itemsize


def _copy(T: Any, i: int, extents: tuple[int, ...], store: Callable[..., None]) -> None:
    """One spatial block per operand (so GPU schedulers such as dlight can bind it to threads)."""
    with T.grid(*extents) as loops:
        with T.sblock(f"copy{i}"):
            axes = T.axis.remap("S" * len(extents), list(loops)) if len(extents) > 1 else [T.axis.spatial(extents[0], loops)]
            store(*axes)


def _kernel(name: str, params: list[tuple[str, tuple[int, ...], str]], body: Callable[[Any, list[Any]], None],
            attrs: dict[str, Any] | None = None) -> Any:
    from tvm.script.ir_builder import IRBuilder
    from tvm.script.ir_builder import tirx as T

    with IRBuilder() as ib:
        with T.prim_func(private=True, s_tir=True):
            T.func_name(name)
            bufs = [T.arg(p, T.buffer(shape, dtype)) for p, shape, dtype in params]
            T.func_attr({"tirx.noalias": True, "op_pattern": 8, **(attrs or {})})
            with T.sblock("root"):
                body(T, bufs)
    return ib.get()


def _aliases(T: Any, plan: PackPlan, flat: Any, length: int) -> dict[str, Any]:
    """One typed view of the flat buffer per dtype among the segments."""
    names: dict[str, Any] = {}
    for seg in plan.segments:
        if seg.dtype not in names:
            count = length * itemsize(plan.flat_dtype) // itemsize(seg.dtype)
            names[seg.dtype] = T.decl_buffer((count,), seg.dtype, data=flat.data, layout=None)
    return names


def _flat(T: Any, buf: Any, seg: Segment, size: int) -> Any:
    """``layout=None``: what an ``s_tir`` function's buffers get anyway. The default makes TVMScript
    scan the whole frame stack for the enclosing function, and every buffer declared so far is a
    frame on it: a 500-operand kernel takes 4 s instead of 0.3 s."""
    return T.decl_buffer((max(1, size),), seg.dtype, data=buf.data, layout=None)


def pack_func(plan: PackPlan, name: str) -> Any:
    """``name(a0, ..., ak, out)`` writing every operand into the flat buffer."""
    params = [(f"a{i}", seg.shape, seg.dtype) for i, seg in enumerate(plan.segments)]
    params.append(("out", (plan.in_len,), plan.flat_dtype))

    def body(T: Any, bufs: list[Any]) -> None:
        outs = _aliases(T, plan, bufs[-1], plan.in_len)
        for i, seg in enumerate(plan.segments):
            if seg.size == 0:
                continue
            src, dst, stride = _flat(T, bufs[i], seg, seg.size), outs[seg.dtype], plan.stride(seg)
            if plan.kind == "reduce_scatter":  # block r gets chunk r of the scattered axis
                n = plan.blocks_in
                c = seg.extent // n * seg.inner
                _copy(T, i, (n, seg.outer, c), lambda r, p, k, src=src, dst=dst, stride=stride, seg=seg, c=c: T.buffer_store(
                    dst, src[p * (seg.extent * seg.inner) + r * c + k], [r * stride + seg.offset + p * c + k]))
            else:
                _copy(T, i, (seg.size,), lambda j, src=src, dst=dst, seg=seg: T.buffer_store(dst, src[j], [seg.offset + j]))

    offsets = [plan.operand_offset(seg) for seg in plan.segments]
    return _kernel(name, params, body, {OPERAND_OFFSETS: [-1 if o is None else o for o in offsets]})


def unpack_func(plan: PackPlan, name: str, which: tuple[int, ...]) -> Any:
    """``name(g, y...)`` reading the results of segments ``which`` out of the combined buffer; an
    allgather's rank r block holds every operand, so each result is ``(n, P, A, Q) -> (P, n, A, Q)``."""
    params = [("g", (plan.out_len,), plan.flat_dtype)]
    params += [(f"y{i}", plan.segments[i].result_shape, plan.segments[i].dtype) for i in which]

    def body(T: Any, bufs: list[Any]) -> None:
        ins = _aliases(T, plan, bufs[0], plan.out_len)
        for buf, i in zip(bufs[1:], which):
            seg = plan.segments[i]
            size = math.prod(seg.result_shape)
            if size == 0:
                continue
            dst, src, stride = _flat(T, buf, seg, size), ins[seg.dtype], plan.stride(seg)
            if plan.kind == "allgather":
                n = plan.blocks_out
                c = seg.extent * seg.inner
                _copy(T, i, (n, seg.outer, c), lambda r, p, k, src=src, dst=dst, stride=stride, seg=seg, n=n, c=c: T.buffer_store(
                    dst, src[r * stride + seg.offset + p * c + k], [p * (n * c) + r * c + k]))
            else:
                _copy(T, i, (seg.chunk,), lambda j, src=src, dst=dst, seg=seg: T.buffer_store(dst, src[seg.offset + j], [j]))

    return _kernel(name, params, body)
