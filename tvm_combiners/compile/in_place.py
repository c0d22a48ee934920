"""Kernels that read and write a packed buffer in place: a Relax pass for after scheduling.

A combined collective (:mod:`tvm_combiners.collectives.relax.combiners`) still leaves each member
a tensor of its own twice: its producer's output is an argument of the pack kernel, and its result
a view of the combined buffer. The VM pays for each (~0.4 us a tensor), which for hundreds of
small members outweighs the collective. With the kernels scheduled and final, this pass takes both
away:

- a ``call_tir`` argument that is ``ensure_zero_offset(view(buf, ...))`` of a 1-D ``buf`` at a
  multiple of :data:`ALIGN` bytes, where ``buf`` is allocated in the function (so its own offset
  is 0), becomes ``buf`` and the element offset: a variant of the kernel declares its parameter at
  that element of ``buf``;
- where every operand of a pack kernel (a PrimFunc with the :data:`OPERAND_OFFSETS` attribute) is
  the one output of a ``call_tir`` that nothing else reads, at an aligned offset, those producers
  write into the packed buffer themselves, chained in place on it (the first allocates it), and the
  pack kernel is gone.

It runs on functions without dataflow blocks (after ``ToNonDataflow``) and before
``CallTIRRewrite``; bindings inside ``If`` branches are left as they are, and so are the kernels
no call is left to.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import tvm
from tvm import relax, tirx
from tvm.s_tir import stmt as S

from ..core.graph import parse_dtype_bits
from ..relax.module import static_tensor
from .schedules.common import CONSTANT_PARAMS

#: TVM's allocation alignment, which a kernel's buffer parameter declares (``data_alignment``): a
#: view at a multiple of it keeps that promise, so only such views become the parameter in place.
ALIGN = 64
#: A pack kernel's attribute: each operand's byte offset in the packed buffer (-1 where it is not
#: one run of it).
OPERAND_OFFSETS = "tvm_combiners.operand_offsets"

_CALL_TIR = tvm.ir.Op.get("relax.call_tir")
_VIEW = tvm.ir.Op.get("relax.memory.view")
_ZERO_OFFSET = tvm.ir.Op.get("relax.memory.ensure_zero_offset")
#: Function attributes that name parameters by index.
_PARAM_INDEX_ATTRS = ("layout_free_buffers", CONSTANT_PARAMS)
#: Calls whose result is a tensor of its own, at offset 0 of its storage.
_FRESH = tuple(tvm.ir.Op.get(f"relax.{name}") for name in ("builtin.alloc_tensor", "call_tir", "call_dps_packed"))


def _children(expr: Any) -> Iterator[Any]:
    if isinstance(expr, relax.Call):
        yield expr.op  # a closure called through a variable reads it
        yield from expr.args
    elif isinstance(expr, relax.Tuple):
        yield from expr.fields
    elif isinstance(expr, relax.TupleGetItem):
        yield expr.tuple_value
    elif isinstance(expr, relax.If):
        yield from (expr.cond, expr.true_branch, expr.false_branch)
    elif isinstance(expr, relax.SeqExpr):
        for block in expr.blocks:
            yield from (b.value for b in block.bindings)
        yield expr.body
    elif isinstance(expr, relax.Function):
        yield expr.body


def _uses(expr: Any, counts: Counter) -> Counter:
    """How often each variable is read in ``expr`` (every occurrence, unlike TVM's visitors)."""
    stack = [expr]
    while stack:
        e = stack.pop()
        if isinstance(e, relax.Var):
            counts[e] += 1
        else:
            stack.extend(_children(e))
    return counts


def _called(mod: tvm.IRModule) -> set[tvm.ir.GlobalVar]:
    """The global functions the Relax functions of ``mod`` name."""
    found: set[tvm.ir.GlobalVar] = set()
    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func.body, lambda e: found.add(e) if isinstance(e, tvm.ir.GlobalVar) else None)
    return found


def _bytes(dtype: str) -> int:
    return parse_dtype_bits(dtype) // 8


def _is_call(value: Any, op: tvm.ir.Op) -> bool:
    return isinstance(value, relax.Call) and value.op.same_as(op)


def _static_1d(ty: Any) -> tuple[int, str] | None:
    """A 1-D tensor type's static length and dtype."""
    static = static_tensor(ty)
    return (static[0][0], static[1]) if static is not None and len(static[0]) == 1 else None


def _param_fits(param: Any, shape: tuple[int, ...], dtype: str) -> bool:
    """A kernel's buffer parameter of ``shape``/``dtype``, dense, that asks no more alignment than
    :data:`ALIGN` (which every offset this pass passes is a multiple of)."""
    ty = param.ty
    if not isinstance(ty, tirx.BufferType) or str(ty.dtype) != dtype or len(ty.strides):
        return False
    if not (isinstance(ty.elem_offset, tirx.IntImm) and int(ty.elem_offset.value) == 0):
        return False
    dims = [int(d.value) if isinstance(d, tirx.IntImm) else None for d in ty.shape]
    return dims == list(shape) and int(ty.data_alignment) <= ALIGN


class _Function:
    def __init__(self, bb: relax.BlockBuilder, prims: dict[Any, tirx.PrimFunc], variants: dict[Any, Any],
                 replaced: set[tvm.ir.GlobalVar]) -> None:
        self.bb, self.prims, self.variants, self.replaced = bb, prims, variants, replaced

    def prim(self, gv: Any) -> tirx.PrimFunc | None:
        return self.prims.get(gv)

    def variant(self, gv: tvm.ir.GlobalVar, which: tuple[int, ...], flats: tuple[tuple[int, str], ...],
                insert_at: int) -> tvm.ir.GlobalVar | None:
        """The kernel ``gv`` through :func:`at_offsets` (once per form), None where it cannot be."""
        key = (gv, which, flats, insert_at)
        if key not in self.variants:
            func = at_offsets(self.prims[gv], which, flats, insert_at)
            new = None if func is None else self.bb.add_func(func, f"{gv.name_hint}_in_place")
            if new is not None:
                self.prims[new] = func
            self.variants[key] = new
        self.replaced.add(gv)
        return self.variants[key]

    def rewrite(self, func: relax.Function) -> relax.Function | None:
        blocks = func.body.blocks
        if any(isinstance(b, relax.DataflowBlock) for b in blocks):
            return None
        bindings = [b for block in blocks for b in block.bindings]
        if not any(_is_call(b.value, _ZERO_OFFSET) or self._pack_offsets(b.value) is not None for b in bindings):
            return None  # nothing to work on (most functions): skip counting uses
        uses = _uses(func.body, Counter())
        bindings, read = self._consumers(bindings, uses)
        bindings, wrote = self._producers(bindings, uses)
        if not (read or wrote):
            return None
        bindings = [b for b in bindings if b is not None]
        body = relax.SeqExpr([relax.BindingBlock(bindings)], func.body.body)
        return relax.Function(func.params, body, func.ret_ty, func.is_pure, func.attrs, func.span)

    # -- results read in place -------------------------------------------------------------------

    def _view(self, var: Any, bound: dict[Any, int], bindings: list[Any]) -> tuple[relax.Var, int, int] | None:
        """``var = ensure_zero_offset(view(buf, shape, buf's dtype, bytes))`` at an aligned offset
        of a 1-D static ``buf``: (buf, element offset, index of the view's binding)."""
        at = bound.get(var)
        if at is None or not _is_call(bindings[at].value, _ZERO_OFFSET):
            return None
        inner = bindings[at].value.args[0]
        at_view = bound.get(inner)
        if at_view is None or not _is_call(bindings[at_view].value, _VIEW):
            return None
        buf, _shape, dtype, offset = bindings[at_view].value.args
        at_buf = bound.get(buf) if isinstance(buf, relax.Var) else None
        if at_buf is None or not any(_is_call(bindings[at_buf].value, op) for op in _FRESH):
            return None  # a parameter or a view may carry an offset of its own
        flat = _static_1d(buf.ty)
        if flat is None or str(getattr(dtype, "value", None)) != flat[1]:
            return None
        if not isinstance(offset, tirx.IntImm):
            return None
        nbytes = int(offset.value)
        if nbytes % ALIGN:
            return None
        return buf, nbytes // _bytes(flat[1]), at_view

    def _consumers(self, bindings: list[Any], uses: Counter) -> tuple[list[Any], bool]:
        bound = {b.var: i for i, b in enumerate(bindings)}
        out, changed = list(bindings), False
        for i, b in enumerate(bindings):
            call = b.value
            if not _is_call(call, _CALL_TIR) or (func := self.prim(call.args[0])) is None:
                continue
            args = list(call.args[1].fields)
            which, flats, offsets, dropped = [], [], [], []
            for k, arg in enumerate(args):
                view = self._view(arg, bound, bindings) if isinstance(arg, relax.Var) else None
                static = static_tensor(arg.ty) if view is not None else None
                if static is None or not _param_fits(func.params[k], *static):
                    continue
                buf, elem, at_view = view
                uses[buf] += 1
                which.append(k)
                flats.append(_static_1d(buf.ty))
                offsets.append(relax.prim_value(tirx.IntImm("int64", elem)))
                args[k] = buf
                dropped.append((arg, at_view))
            if not which:
                continue
            gv = self.variant(call.args[0], tuple(which), tuple(flats), len(args))
            if gv is None:
                for _var, at_view in dropped:
                    uses[bindings[at_view].value.args[0]] -= 1
                continue
            out_ty = call.ty_args[0]  # several outputs: one tuple type
            out_ty = list(out_ty.fields) if isinstance(out_ty, relax.TupleType) else out_ty
            out[i] = relax.VarBinding(b.var, relax.call_tir(gv, args + offsets, out_ty))
            changed = True
            for var, at_view in dropped:
                uses[var] -= 1
                if uses[var] == 0:  # the view pair is read by nothing else now
                    out[bound[var]] = None
                    view_var = bindings[at_view].var
                    uses[view_var] -= 1
                    if uses[view_var] == 0:
                        out[at_view] = None
                        uses[bindings[at_view].value.args[0]] -= 1
        return out, changed

    # -- operands written in place ---------------------------------------------------------------

    def _pack_offsets(self, value: Any) -> Any:
        """The operands' byte offsets where ``value`` calls a pack kernel (:data:`OPERAND_OFFSETS`)."""
        if not _is_call(value, _CALL_TIR) or (pack := self.prim(value.args[0])) is None:
            return None
        return pack.attrs[OPERAND_OFFSETS] if pack.attrs is not None and OPERAND_OFFSETS in pack.attrs else None

    def _producers(self, bindings: list[Any], uses: Counter) -> tuple[list[Any], bool]:
        bound = {b.var: i for i, b in enumerate(bindings) if b is not None}
        out, changed = list(bindings), False
        for i, b in enumerate(bindings):
            if b is None:
                continue
            offsets, flat = self._pack_offsets(b.value), _static_1d(b.var.ty)
            if offsets is None or flat is None or any(int(o) < 0 for o in offsets):
                continue
            operands = list(b.value.args[1].fields)
            if len(offsets) != len(operands) or not all(
                    self._writes_into(a, int(offsets[k]), flat, bound, out, uses) for k, a in enumerate(operands)):
                continue
            chain = sorted((bound[a], k) for k, a in enumerate(operands))
            kernels = []
            for at, _ in chain:
                n_args = len(out[at].value.args[1].fields)
                kernels.append(self.variant(out[at].value.args[0], (n_args,), (flat,), n_args))
            if None in kernels:
                continue
            part = None
            for n, ((at, k), gv) in enumerate(zip(chain, kernels)):
                args = list(out[at].value.args[1].fields)
                offset = relax.prim_value(tirx.IntImm("int64", int(offsets[k]) // _bytes(flat[1])))
                var = b.var if n == len(chain) - 1 else relax.Var(f"{b.var.name}_part", b.var.ty)
                if part is None:
                    value = relax.call_tir(gv, [*args, offset], b.var.ty)
                else:
                    value = relax.call_tir_inplace(gv, [*args, offset, part], len(args) + 1, b.var.ty)
                out[at], part = relax.VarBinding(var, value), var
            out[i] = None
            self.replaced.add(b.value.args[0])
            changed = True
        return out, changed

    def _writes_into(self, operand: Any, offset: int, flat: tuple[int, str], bound: dict[Any, int],
                     bindings: list[Any], uses: Counter) -> bool:
        """``operand`` is the one output of a ``call_tir`` read only by the pack, of the packed
        buffer's dtype, at an aligned offset."""
        if not isinstance(operand, relax.Var) or uses[operand] != 1 or offset % ALIGN:
            return False
        at = bound.get(operand)
        if at is None or bindings[at] is None or not _is_call(bindings[at].value, _CALL_TIR):
            return False
        call = bindings[at].value
        func, static = self.prim(call.args[0]), static_tensor(operand.ty)
        return (func is not None and isinstance(call.ty_args[0], relax.TensorType) and static is not None and static[1] == flat[1]
                and len(func.params) == len(call.args[1].fields) + 1 and _param_fits(func.params[-1], *static))


def at_offsets(func: tirx.PrimFunc, which: Sequence[int], flats: Sequence[tuple[int, str]],
               insert_at: int) -> tirx.PrimFunc | None:
    """``func`` with each buffer parameter ``which[i]`` replaced by a flat buffer of
    ``flats[i] = (length, dtype)`` and an int64 element offset into it (the offsets inserted, in
    order, at parameter ``insert_at`` of the original list): the body declares the old parameter at
    that element, so the scheduled kernel reads or writes the flat buffer in place. The caller
    passes offsets that keep the parameter's declared alignment. None where the root block matches
    buffers (they could name a replaced parameter before its declaration)."""
    body = func.body
    if isinstance(body, S.SBlockRealize) and len(body.block.match_buffers):
        return None
    params = list(func.params)
    decls, offsets = [], []
    for k, (length, dtype) in zip(which, flats):
        old = params[k]
        flat = tirx.decl_buffer((length,), dtype, name=f"{old.name}_flat", layout=None)
        at = tirx.Var(f"{old.name}_at", "int64")
        decls.append(tirx.DeclBuffer(old, data=tirx.address_of(tirx.BufferLoad(flat, [at]))))
        params[k] = flat
        offsets.append(at)
    params[insert_at:insert_at] = offsets
    if isinstance(body, S.SBlockRealize):  # inside the root block, where a kernel's declarations live
        root = body.block
        root = S.SBlock(root.iter_vars, root.reads, root.writes, root.name_hint, tirx.SeqStmt([*decls, root.body]),
                        root.init, root.alloc_buffers, root.match_buffers, root.annotations)
        body = S.SBlockRealize(body.iter_values, body.predicate, root)
    else:
        body = tirx.SeqStmt([*decls, body])
    # the variant is a function of its own, no pack kernel, and its parameters moved
    func = func.without_attr("global_symbol").without_attr(OPERAND_OFFSETS)
    for name in _PARAM_INDEX_ATTRS:
        if func.attrs is not None and name in func.attrs:
            moved = [int(i) + (len(offsets) if int(i) >= insert_at else 0) for i in func.attrs[name] if int(i) not in which]
            func = func.with_attr(name, moved)
    return tirx.PrimFunc(params, body, func.ret_type, func.attrs)


def InPlaceCombinedBuffers() -> tvm.transform.Pass:  # noqa: N802 (a pass factory, as TVM names them)
    """The pass (see the module docstring): for a pipeline after scheduling and ``ToNonDataflow``,
    before ``CallTIRRewrite``."""

    @tvm.transform.module_pass(opt_level=0, name="tvm_combiners.InPlaceCombinedBuffers")
    def run(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        bb = relax.BlockBuilder(mod)
        prims = {gv: f for gv, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)}
        variants: dict[Any, Any] = {}
        replaced: set[tvm.ir.GlobalVar] = set()
        updates = {}
        for gv, func in mod.functions_items():
            if isinstance(func, relax.Function) and isinstance(func.body, relax.SeqExpr):
                new = _Function(bb, prims, variants, replaced).rewrite(func)
                if new is not None:
                    updates[gv] = new
        if not updates:
            return mod
        out = bb.get()
        for gv, func in updates.items():
            out[gv] = relax.BlockBuilder().normalize(func)
        called = _called(out)
        made = {gv for gv in variants.values() if gv is not None}  # some unused where a chain gave up
        for gv in replaced | made:  # a private kernel no call is left to would still be compiled
            func = out[gv]
            if gv not in called and (func.attrs is None or "global_symbol" not in func.attrs):
                del out[gv]
        return out

    return run
