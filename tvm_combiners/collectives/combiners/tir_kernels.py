"""The one pack kernel and the one unpack kernel of a combined collective, as TIR (TVM 0.27).

``R.concat`` of 64 inputs costs more than the 64 collectives it would save (PLATFORM.md), and
``R.memory.view`` at a byte offset cannot feed a legalized kernel in TVM 0.27 (the kernels insist
on ``byte_offset == 0``). So both directions are one generated PrimFunc: a plain loop per
operand (LLVM vectorizes it), reading and writing typed aliases of the flat buffer, so mixed
dtypes need no casts. Index maps follow :mod:`.keys`.
"""

from __future__ import annotations

from typing import Any

from .keys import PackPlan, Segment, itemsize


def _buf(shape: tuple[int, ...], dtype: str) -> str:
    dims = ", ".join(str(d) for d in shape)
    return f'T.Buffer(({dims}{"," if len(shape) == 1 else ""}), "{dtype}")'


def _aliases(lines: list[str], plan: PackPlan, flat: str, length: int) -> dict[str, str]:
    names = {}
    for seg in plan.segments:
        if seg.dtype not in names:
            name = f"{flat}_{seg.dtype}"
            count = length * itemsize(plan.flat_dtype) // itemsize(seg.dtype)
            lines.append(f'    {name} = T.decl_buffer(({count},), "{seg.dtype}", data={flat}.data)')
            names[seg.dtype] = name
    return names


def _flat(lines: list[str], i: int, prefix: str, seg: Segment, shape: tuple[int, ...]) -> str:
    size = max(1, seg.size if prefix == "a" else _prod(shape))
    name = f"{prefix}{i}f"
    lines.append(f'    {name} = T.decl_buffer(({size},), "{seg.dtype}", data={prefix}{i}.data)')
    return name


def _prod(shape: tuple[int, ...]) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


def _loop(i: int, extent: int, store: str) -> list[str]:
    """One spatial block per operand, so GPU schedulers (dlight) can bind its loop to threads."""
    return [f"    for j_ in range({extent}):", f'        with T.sblock("copy{i}"):',
            f"            j = T.axis.spatial({extent}, j_)", f"            {store}"]


def _grid(i: int, extents: tuple[int, int, int], store: str) -> list[str]:
    return [f"    for r_, p_, k_ in T.grid({', '.join(map(str, extents))}):", f'        with T.sblock("copy{i}"):',
            '            r, p, k = T.axis.remap("SSS", [r_, p_, k_])', f"            {store}"]


def pack_source(plan: PackPlan, name: str) -> str:
    """TVMScript of ``name(a0, ..., ak, out)`` writing every operand into the flat buffer."""
    params = [f"a{i}: {_buf(seg.shape, seg.dtype)}" for i, seg in enumerate(plan.segments)]
    params.append(f"out: {_buf((plan.in_len,), plan.flat_dtype)}")
    lines = ["@T.prim_func(private=True, s_tir=True)", f"def {name}({', '.join(params)}):", '    T.func_attr({"tirx.noalias": True, "op_pattern": 8})']
    outs = _aliases(lines, plan, "out", plan.in_len)
    for i, seg in enumerate(plan.segments):
        if seg.size == 0:
            continue
        src, dst, stride = _flat(lines, i, "a", seg, seg.shape), outs[seg.dtype], plan.stride(seg)
        if plan.kind == "reduce_scatter":  # block r gets chunk r of the scattered axis
            n = plan.blocks_in
            c = seg.extent // n * seg.inner
            lines += _grid(i, (n, seg.outer, c),
                           f"{dst}[r * {stride} + {seg.offset} + p * {c} + k] = {src}[p * {seg.extent * seg.inner} + r * {c} + k]")
        else:
            lines += _loop(i, seg.size, f"{dst}[{seg.offset} + j] = {src}[j]")
    return _rooted(lines)


def unpack_source(plan: PackPlan, name: str) -> str:
    """TVMScript of ``name(g, y0, ..., yk)`` reading every result out of the combined buffer."""
    params = [f"g: {_buf((plan.out_len,), plan.flat_dtype)}"]
    params += [f"y{i}: {_buf(seg.result_shape, seg.dtype)}" for i, seg in enumerate(plan.segments)]
    lines = ["@T.prim_func(private=True, s_tir=True)", f"def {name}({', '.join(params)}):", '    T.func_attr({"tirx.noalias": True, "op_pattern": 8})']
    ins = _aliases(lines, plan, "g", plan.out_len)
    for i, seg in enumerate(plan.segments):
        if _prod(seg.result_shape) == 0:
            continue
        dst, src, stride = _flat(lines, i, "y", seg, seg.result_shape), ins[seg.dtype], plan.stride(seg)
        if plan.kind == "allgather":  # rank r's block holds its operand: (n, P, A, Q) -> (P, n, A, Q)
            n = plan.blocks_out
            c = seg.extent * seg.inner
            lines += _grid(i, (n, seg.outer, c), f"{dst}[p * {n * c} + r * {c} + k] = {src}[r * {stride} + {seg.offset} + p * {c} + k]")
        else:
            lines += _loop(i, seg.chunk, f"{dst}[j] = {src}[{seg.offset} + j]")
    return _rooted(lines)


def _rooted(lines: list[str]) -> str:
    """Wrap the body in a root ``sblock``: Relax's dataflow analyses expect block-structured TIR."""
    head, body = lines[:3], lines[3:]
    return "\n".join([*head, '    with T.sblock("root"):', *("    " + line for line in body)]) + "\n"


def build(source: str) -> Any:
    """Parse generated TVMScript into a PrimFunc."""
    import tvm
    from tvm.script import tirx as T

    return tvm.script.from_source(source, extra_vars={"T": T})
