"""Relax adapter of the collective combiners: IR -> the driver's units (:mod:`..combiners.driver`) -> plan -> IR.

Two levels per function:

- the function body, where our collectives (impure) live in non-dataflow blocks: every binding
  outside dataflow blocks is one unit and every dataflow block one unit (it moves whole);
- each dataflow block, where TVM's pure ``R.ccl.allreduce``/``R.ccl.allgather`` may sit (they may
  also sit outside, and then combine at the first level).

A unit's dependencies are the variables and symbolic dims it reads, plus the order an in-place
write imposes on the readers of its buffer (:mod:`..dependences`); a recv also waits for the send
it is matched with, whichever families combine (OrderSendRecv runs first, so that send comes
earlier); an impure call we do not know is a barrier (nothing moves across it). The region is
re-emitted in the contracted order the planner returns. A combined group is: one pack kernel
(``call_tir``), the collective on the flat buffer, and the results bound to the members' original
variables (so users are untouched): views of the buffer where a result is one run of it starting
at a multiple of 64 bytes, the outputs of one unpack kernel for the others.

Options (every pass): ``threshold_bytes`` / ``threshold_count`` bound one combined op (payload
bytes per rank, exact; <= 0 or a count below 2 disables the pass); ``on_combine`` gets a
:class:`~.options.CombineReport` per combined op; ``combine_by_dim`` (allgather, reduce_scatter)
lets any axes share one op; keyword-only ``max_op_bytes`` leaves larger ops alone (``"auto"``:
64 KiB when compiling for a CPU or outside a target, 8 MiB for GPU targets; None: no cap),
because packing copies every byte (and unpacking some).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable
from typing import Any

import tvm
from tvm import ir, relax

from ...compile.in_place import ALIGN
from ...relax.module import static_tensor
from .. import spec as S
from ..combiners.driver import Unit, plan_combining
from ..combiners.factories import pass_factories
from ..combiners.keys import ChannelBook, PackPlan, Segment, ccl_key, collective_key, plan_pack, transfer_key
from ..combiners.options import CombinerOptions
from ..combiners.planning import RegionPlan
from ..ordering import OrderNode
from . import ops as C
from . import tir_kernels

_CCL = ("relax.ccl.allreduce", "relax.ccl.allgather")


@dataclasses.dataclass
class _Op:
    """A combinable binding: its family, key, payload and what rebuilding it needs."""

    family: str  # allreduce | allgather | reduce_scatter | send | recv | ccl.allreduce | ccl.allgather
    key: Hashable
    shape: tuple[int, ...]
    dtype: str
    axis: int = 0
    group_size: int = 1
    spec: S.CollectiveSpec | None = None
    call: relax.Call | None = None


def _classify(binding: Any, opts: CombinerOptions) -> _Op | None:
    if not isinstance(binding, relax.VarBinding) or not isinstance(binding.value, relax.Call):
        return None
    call = binding.value
    if not isinstance(call.op, ir.Op):
        return None
    spec = C.info(call)
    if spec is not None:
        if spec.kind == "recv":
            assert spec.shape is not None and spec.dtype is not None
            return _Op("recv", transfer_key(spec, spec.dtype), spec.shape, spec.dtype, spec=spec, call=call)
        if spec.kind == "after_all":
            return None
        payload = static_tensor(call.args[0].ty)
        if payload is None:
            return None
        if spec.kind == "send":
            return _Op("send", transfer_key(spec, payload[1]), *payload, spec=spec, call=call)
        key = collective_key(spec, payload[1], opts.combine_by_dim)
        return _Op(spec.kind, key, *payload, axis=spec.axis or 0, group_size=spec.group_size or 1, spec=spec, call=call)
    if call.op.name in _CCL:
        payload = static_tensor(call.args[0].ty)
        if payload is None or payload[1] not in S.SUPPORTED_DTYPES or (call.op.name == "relax.ccl.allgather" and not payload[0]):
            return None  # TVM's ops take bool, float8, ...: we pack only what our own ops carry
        name = call.op.name.removeprefix("relax.")
        attrs = {k: getattr(call.attrs, k) for k in ("op_type", "in_group", "num_workers") if hasattr(call.attrs, k)}
        size = int(attrs.get("num_workers", 1))
        return _Op(name, ccl_key(name, attrs, payload[1]), *payload, group_size=size, call=call)
    return None


class _FunctionCombiner:
    def __init__(self, bb: relax.BlockBuilder, opts: CombinerOptions, channels: ChannelBook,
                 kernels: dict[tuple[Any, PackPlan], tvm.ir.GlobalVar]) -> None:
        self.bb = bb
        self.opts = opts
        self.channels = channels
        self.kernels = kernels  # (builder, plan) -> its PrimFunc in the module (shared, deduplicated)

    def classify(self, binding: Any) -> _Op | None:
        """The combinable op a binding is (a subclass combines other ops)."""
        return _classify(binding, self.opts)

    # ------------------------------------------------------------------ regions
    def combine_units(self, units: list[tuple[Any, bool]], dataflow: bool) -> tuple[list[tuple[Any, bool]], bool]:
        """Re-emit one region; ``units``: (binding, False) or (dataflow block, True)."""
        ops, neutral = self._neutral_units(units, dataflow)
        plan = plan_combining(neutral, self.opts, self.channels)
        if plan is None:
            return units, False
        return self._emit(units, ops, plan, dataflow), True

    def _neutral_units(self, units: list[tuple[Any, bool]], dataflow: bool) -> tuple[list[_Op | None], list[Unit]]:
        """Each unit's op, and the units as the driver reads them."""
        ops: list[_Op | None] = []
        out: list[Unit] = []
        for (unit, is_block), deps in zip(units, C.dependences(units)):
            op = None if is_block else self.classify(unit)
            spec = None if is_block else C.info(unit.value)
            ours = op is not None or (not is_block and (spec is not None or _is_ccl(unit.value)))
            impure = not is_block and not dataflow and relax.analysis.contains_impure_call(unit.value)
            # a dataflow block runs in no fixed order (OrderSendRecv refuses transfers there): none is matched
            p2p = not dataflow and spec is not None and spec.kind in S.P2P_KINDS
            transfer = OrderNode(spec.kind, (), spec.channel_id, spec.pairs) if p2p else None  # type: ignore[union-attr]
            ops.append(op)
            # an effect we do not understand is a barrier: nothing crosses it
            out.append(Unit(tuple(sorted(deps)), op, transfer, barrier=impure and not ours, before_barrier=ours,
                            after_barrier=True))
        return ops, out

    def _emit(self, units: list[tuple[Any, bool]], ops: list[_Op | None], plan: RegionPlan,
              dataflow: bool) -> list[tuple[Any, bool]]:
        """The region in the plan's order, each group built where the plan puts it."""
        groups = plan.units
        n_collective = len(plan.groups)
        channel_of: dict[int, int] = {}
        out: list[tuple[Any, bool]] = []
        for u in plan.order:
            if u >= 0:
                out.append(units[u])
                continue
            g = -1 - u
            bindings, members = [units[m][0] for m in groups[g]], [ops[m] for m in groups[g]]
            if g < n_collective:
                new = self._collective(bindings, members, dataflow)
            else:
                t, is_recv = divmod(g - n_collective, 2)
                if not is_recv:  # the send group is emitted first (the recv group depends on it)
                    channel_of[t] = self.channels.take()
                    new = self._send(bindings, members, channel_of[t])
                else:
                    new = self._recv(bindings, members, channel_of[t])
            out.extend((b, False) for b in new)
        return out

    # ------------------------------------------------------------------ emission
    def _var(self, name: str, ty: Any, dataflow: bool) -> relax.Var:
        return (relax.DataflowVar if dataflow else relax.Var)(name, ty)

    def _kernel(self, make: Any, plan: PackPlan, prefix: str, *extra: Any) -> tvm.ir.GlobalVar:
        key = (make, plan, *extra)
        gv = self.kernels.get(key)
        if gv is None:
            gv = self.kernels[key] = self.bb.add_func(make(plan, prefix, *extra), prefix)
        return gv

    def _pack_unpack(self, plan: PackPlan, operands: list[relax.Expr], dataflow: bool,
                     collective: Any, results: list[relax.Var], label: str | None = None) -> list[relax.Binding]:
        """pack -> ``collective(flat)`` -> unpack into ``results`` (the members' own variables);
        ``label`` names the kernels (the plan's kind by default)."""
        label = label or plan.kind
        flat_ty = relax.TensorType([plan.in_len], plan.flat_dtype)
        pack = self._var("combined_in", flat_ty, dataflow)
        out: list[relax.Binding] = []
        if operands:
            gv = self._kernel(tir_kernels.pack_func, plan, f"pack_{label}")
            out.append(relax.VarBinding(pack, self.bb.normalize(relax.call_tir(gv, operands, flat_ty))))
        bindings, reduced = collective(pack if operands else None)
        out += bindings
        if results:
            # ensure_zero_offset aliases a view at a multiple of ALIGN, and would allocate and copy
            # (outside any CUDA graph's stream) at any other offset: the unpack kernel copies those
            offsets = [plan.run_offset(seg) for seg in plan.segments]
            viewed = [(offset, seg, var) for offset, seg, var in zip(offsets, plan.segments, results)
                      if offset is not None and offset % ALIGN == 0]
            copied = tuple(i for i, offset in enumerate(offsets) if offset is None or offset % ALIGN)
            out += self._views(reduced, viewed, dataflow)
            if copied:
                out += self._unpack(plan, reduced, copied, [results[i] for i in copied], dataflow, label)
        return out

    def _unpack(self, plan: PackPlan, reduced: relax.Var, which: tuple[int, ...], results: list[relax.Var],
                dataflow: bool, label: str) -> list[relax.Binding]:
        """The results of segments ``which`` copied out of the combined buffer by one kernel."""
        tys = [relax.TensorType(list(plan.segments[i].result_shape), plan.segments[i].dtype) for i in which]
        gv = self._kernel(tir_kernels.unpack_func, plan, f"unpack_{label}", which)
        if len(tys) == 1:  # call_tir of one output returns the tensor itself
            return [relax.VarBinding(results[0], self.bb.normalize(relax.call_tir(gv, [reduced], tys[0])))]
        parts = self._var("combined_parts", relax.TupleType(tys), dataflow)
        out = [relax.VarBinding(parts, self.bb.normalize(relax.call_tir(gv, [reduced], tys)))]
        return out + [relax.VarBinding(v, self.bb.normalize(relax.TupleGetItem(parts, i))) for i, v in enumerate(results)]

    def _views(self, reduced: relax.Var, results: list[tuple[int, Segment, relax.Var]],
               dataflow: bool) -> list[relax.Binding]:
        """Results read in place from the combined buffer, each (byte offset, segment, variable): a
        view at the offset (a multiple of :data:`ALIGN`), then ``ensure_zero_offset``, because legalized kernels
        insist on ``byte_offset == 0``; at such an offset TVM moves it into the data pointer (no
        copy, no allocation: safe inside a CUDA graph too). Memory planning counts a view's uses as
        uses of the buffer, so the buffer is not reused while a result lives."""
        out: list[relax.Binding] = []
        for offset, seg, var in results:
            view = self._var("combined_view", var.ty, dataflow)
            at = relax.prim_value(tvm.tirx.IntImm("int64", offset))
            out.append(relax.VarBinding(view, self.bb.normalize(
                relax.op.memory.view(reduced, relax.ShapeExpr(list(seg.result_shape)), seg.dtype, at))))
            out.append(relax.VarBinding(var, self.bb.normalize(relax.op.memory.ensure_zero_offset(view))))
        return out

    def _collective(self, bindings: list[Any], ops: list[Any], dataflow: bool) -> list[relax.Binding]:
        first = ops[0]
        kind = first.family.removeprefix("ccl.")
        plan = plan_pack(kind, [(op.shape, op.dtype, op.axis) for op in ops], first.group_size)
        self.opts.report(first.family, len(ops), plan.total_bytes, first.key)

        def collective(flat: relax.Var) -> tuple[list[relax.Binding], relax.Var]:
            if first.family.startswith("ccl."):
                call = first.call
                if first.family == "ccl.allreduce":
                    new = relax.op.ccl.allreduce(flat, str(call.attrs.op_type), bool(call.attrs.in_group))
                else:
                    new = relax.op.ccl.allgather(flat, int(call.attrs.num_workers), bool(call.attrs.in_group))
            else:
                spec = dataclasses.replace(first.spec, axis=None if first.spec.axis is None else 0)
                new = _call(spec, [flat])
            new = self.bb.normalize(new)
            var = self._var("combined", new.ty, dataflow)
            return [relax.VarBinding(var, new)], var

        return self._pack_unpack(plan, [op.call.args[0] for op in ops], dataflow, collective, [b.var for b in bindings])

    def _token(self, calls: list[relax.Call], position: int) -> tuple[list[relax.Binding], relax.Expr]:
        """One token after every member's token (a fresh one when none orders anything)."""
        tokens: list[relax.Expr] = []
        for call in calls:
            tok = call.args[position]
            if not isinstance(tok, tvm.ir.expr.Constant) and not any(tok.same_as(t) for t in tokens):
                tokens.append(tok)
        if not tokens:
            return [], C.token()
        if len(tokens) == 1:
            return [], tokens[0]
        joined = relax.Var("combined_token", relax.TensorType([], S.TOKEN_DTYPE))
        return [relax.VarBinding(joined, self.bb.normalize(C.after_all(*tokens)))], joined

    def _send(self, bindings: list[Any], ops: list[Any], channel: int) -> list[relax.Binding]:
        plan = plan_pack("send_recv", [(op.shape, op.dtype, 0) for op in ops])
        self.opts.report("send_recv", len(ops), plan.total_bytes, ops[0].key)
        pre, tok = self._token([op.call for op in ops], 1)
        spec = dataclasses.replace(ops[0].spec, channel_id=channel)
        done = relax.Var("combined_send", relax.TensorType([], S.TOKEN_DTYPE))

        def collective(flat: relax.Var) -> tuple[list[relax.Binding], relax.Var]:
            return [relax.VarBinding(done, self.bb.normalize(_call(spec, [flat, tok])))], done

        out = pre + self._pack_unpack(plan, [op.call.args[0] for op in ops], False, collective, [])
        return out + [relax.VarBinding(b.var, done) for b in bindings]

    def _recv(self, bindings: list[Any], ops: list[Any], channel: int) -> list[relax.Binding]:
        plan = plan_pack("send_recv", [(op.shape, op.dtype, 0) for op in ops])
        pre, tok = self._token([op.call for op in ops], 0)
        spec = dataclasses.replace(ops[0].spec, channel_id=channel, shape=(plan.in_len,), dtype=plan.flat_dtype)

        def collective(_flat: Any) -> tuple[list[relax.Binding], relax.Var]:
            call = self.bb.normalize(_call(spec, [tok]))
            var = relax.Var("combined_recv", call.ty)
            return [relax.VarBinding(var, call)], var

        return pre + self._pack_unpack(plan, [], False, collective, [b.var for b in bindings])


def _is_ccl(value: Any) -> bool:
    return isinstance(value, relax.Call) and isinstance(value.op, ir.Op) and value.op.name in _CCL


def _call(spec: S.CollectiveSpec, args: list[relax.Expr]) -> relax.Call:
    return relax.Call(ir.Op.get(spec.op_name_relax), list(args), ir.make_node("ir.DictAttrs", **spec.attrs()))


def _channels_by_function(mod: tvm.IRModule) -> list[list[int]]:
    """The channel ids of each function's sends and recvs."""
    out: list[list[int]] = []
    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            used: list[int] = []

            def visit(e: Any, used: list[int] = used) -> None:
                spec = C.info(e)
                if spec is not None and spec.kind in S.P2P_KINDS:
                    used.append(spec.channel_id)

            relax.analysis.post_order_visit(func.body, visit)
            out.append(used)
    return out


def _rebuild(units: list[tuple[Any, bool]], dataflow: bool) -> list[relax.BindingBlock]:
    if dataflow:
        return [relax.DataflowBlock([b for b, _ in units])]
    return C.blocks_of(units)


def _combine_module(mod: tvm.IRModule, opts: CombinerOptions, combiner_class: type = _FunctionCombiner) -> tvm.IRModule:
    if not opts.enabled:
        return mod
    original = mod
    if "send_recv" in opts.families:
        mod = C.OrderSendRecv()(mod)  # sends before their recvs: the matches below rely on it
    bb = relax.BlockBuilder(mod)
    channels = ChannelBook(lambda mod=mod: _channels_by_function(mod))
    kernels: dict[tuple[Any, PackPlan], tvm.ir.GlobalVar] = {}
    updates = {}
    for gv, func in mod.functions_items():
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        combiner = combiner_class(bb, opts, channels, kernels)
        units: list[tuple[Any, bool]] = []
        changed = False
        for block in func.body.blocks:
            if isinstance(block, relax.DataflowBlock):
                inner, did = combiner.combine_units([(b, False) for b in block.bindings], dataflow=True)
                if did:
                    block, changed = _rebuild(inner, True)[0], True
                units.append((block, True))
            else:
                units.extend((b, False) for b in block.bindings)
        units, did = combiner.combine_units(units, dataflow=False)
        if not (did or changed):
            continue
        body = relax.SeqExpr(_rebuild(units, False), func.body.body)
        updates[gv] = relax.Function(func.params, body, func.ret_ty, func.is_pure, func.attrs, func.span)
    if not updates:
        return original  # nothing combined: the module as it came, not merely reordered
    out = bb.get()
    for gv, func in updates.items():
        out[gv] = relax.BlockBuilder().normalize(func)
    return out


AllReduceCombiner, AllGatherCombiner, ReduceScatterCombiner, SendRecvCombiner, CombineCollectives = pass_factories(
    _combine_module, __name__, {
        "AllReduceCombiner": "Combine independent allreduces of one key (ours and ``R.ccl.allreduce``) into one each.",
        "AllGatherCombiner": "Combine independent allgathers (and ``R.ccl.allgather``); ``combine_by_dim=False``: any axes together.",
    }
)


__all__ = ["AllReduceCombiner", "AllGatherCombiner", "ReduceScatterCombiner", "SendRecvCombiner", "CombineCollectives"]
