"""Relay adapter of the collective combiners: IR -> the driver's units (:mod:`..combiners.driver`) -> plan -> IR.

The region is what a function evaluates unconditionally (:func:`..relay.region`), in post-order
(the executors' order), each expression a node reading its operands; an if, closure or loop is one
opaque node, and one holding collectives is a barrier, as an if is in Relax. A recv also reads the
send it is matched with, whatever families are enabled. Groups come from the same driver as Relax
(:mod:`..combiners.driver`). A let chain whose collectives are whole top-level bindings (A-normal form) is
re-emitted in the planner's contracted order, as Relax's bindings are; in other let-form code a group
whose combined op would read a let variable out of scope is not built. Packing is plain Relay that ``FuseOps`` turns into one kernel: ``reshape`` /
``transpose`` of every operand into its block layout (:mod:`.keys`) and one ``concatenate``;
unpacking is one ``strided_slice`` per result (fused with its reshape and the allgather reorder). ``concatenate`` cannot mix
dtypes, so in Relay allgathers and transfers of different dtypes stay apart.

Sends and recvs: :func:`~tvm_combiners.collectives.relay.OrderSendRecv` runs first, so every recv
depends on its matched send through tokens; matches are read the way that pass reads them.
Options as in :mod:`.relax_passes` (``max_op_bytes="auto"`` is 64 KiB here: Relay passes run
before ``relay.build``, outside any target context).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Hashable
from typing import Any

import tvm
from tvm import relay

from ...core.graph import ir_dtype_bits
from ...relay.shallow_mutator import ShallowExprMutator
from .. import spec as S
from ..combiners.driver import Unit, plan_combining
from ..combiners.factories import pass_factories
from ..combiners.keys import ChannelBook, PackPlan, collective_key, plan_pack, transfer_key
from ..combiners.options import CombinerOptions
from ..combiners.planning import RegionPlan
from ..ordering import SendRecvOrderError
from . import ops as C
from .chains import LetChain, let_chain, reorderable

_DTYPE_BITS = ir_dtype_bits(tvm.DataType)



def _static(ty: Any) -> tuple[tuple[int, ...], str] | None:
    if not isinstance(ty, relay.TensorType):
        return None
    dims = []
    for d in ty.shape:
        if not isinstance(d, tvm.tir.IntImm):
            return None
        dims.append(int(d))
    return tuple(dims), str(ty.dtype)


@dataclasses.dataclass
class _Op:
    family: str
    key: Hashable
    shape: tuple[int, ...]
    dtype: str
    spec: S.CollectiveSpec
    call: relay.Call


def _classify(expr: Any, opts: CombinerOptions) -> _Op | None:
    spec = C.info(expr)
    if spec is None or spec.kind == "after_all":
        return None
    if spec.kind == "recv":
        assert spec.shape is not None and spec.dtype is not None
        return _Op("recv", (transfer_key(spec), spec.dtype), spec.shape, spec.dtype, spec, expr)
    payload = _static(expr.args[0].checked_type)
    if payload is None:
        return None
    if spec.kind == "send":
        return _Op("send", (transfer_key(spec), payload[1]), *payload, spec, expr)
    key = collective_key(spec, payload[1], opts.combine_by_dim)
    if spec.kind == "allgather":
        key = (*key, payload[1])  # Relay's concatenate cannot mix dtypes
    return _Op(spec.kind, key, *payload, spec, expr)


# --------------------------------------------------------------------------- pack / unpack in Relay


def _pack(plan: PackPlan, operands: list[relay.Expr]) -> relay.Expr:
    parts = []
    for seg, x in zip(plan.segments, operands):
        if plan.kind == "reduce_scatter":
            n = plan.blocks_in
            c = seg.extent // n * seg.inner
            x = relay.reshape(relay.transpose(relay.reshape(x, (seg.outer, n, c)), (1, 0, 2)), (n, seg.outer * c))
        else:
            x = relay.reshape(x, (seg.size,))
        parts.append(x)
    if plan.kind == "reduce_scatter":
        return relay.reshape(relay.concatenate(parts, axis=1), (plan.in_len,))
    return relay.concatenate(parts, axis=0)


def _unpack(plan: PackPlan, flat: relay.Expr) -> list[relay.Expr]:
    """One ``strided_slice`` per result (each fuses with its reshape/transpose into one kernel).

    Not ``split``: TOPI's split with many outputs compiles to one slow kernel (~470 us for 64
    outputs of 4 KiB on llvm), while a slice per result is a plain copy.
    """
    out = []
    if plan.kind == "allgather":
        n = plan.blocks_out
        grid = relay.reshape(flat, (n, plan.block))
        for seg in plan.segments:
            c = seg.extent * seg.inner
            piece = relay.strided_slice(grid, [0, seg.offset], [n, seg.offset + seg.chunk])
            out.append(relay.reshape(relay.transpose(relay.reshape(piece, (n, seg.outer, c)), (1, 0, 2)), seg.result_shape))
        return out
    for seg in plan.segments:
        piece = relay.strided_slice(flat, [seg.offset], [seg.offset + seg.chunk])
        out.append(piece if tuple(seg.result_shape) == (seg.chunk,) else relay.reshape(piece, seg.result_shape))
    return out


def _token_of(calls: list[relay.Expr]) -> relay.Expr:
    tokens: list[relay.Expr] = []
    for tok in calls:
        if not isinstance(tok, relay.Constant) and not any(tok.same_as(t) for t in tokens):
            tokens.append(tok)
    if not tokens:
        return C.token()
    return tokens[0] if len(tokens) == 1 else C.after_all(*tokens)


_Group = tuple[str, list[_Op], "int | None"]  # role ("collective", "send", "recv"), members, channel


def _combined(group: _Group, opts: CombinerOptions,
              visit: Callable[[relay.Expr], relay.Expr]) -> tuple[relay.Call, Callable[[relay.Expr], list[relay.Expr]]]:
    """The group's one op over its members' packed operands (``visit``-ed), and what gives each member its
    result from that op's value (the op itself in graph form, a variable bound to it in let form)."""
    role, ops, channel = group
    first = ops[0]
    if role in ("send", "recv"):
        plan = plan_pack("send_recv", [(op.shape, op.dtype, 0) for op in ops])
        if role == "send":
            opts.report("send_recv", len(ops), plan.total_bytes, first.key)
            tok = _token_of([visit(op.call.args[1]) for op in ops])
            packed = _pack(plan, [visit(op.call.args[0]) for op in ops])
            return C._call(dataclasses.replace(first.spec, channel_id=channel), [packed, tok]), lambda t: [t] * len(ops)
        tok = _token_of([visit(op.call.args[0]) for op in ops])
        spec = dataclasses.replace(first.spec, channel_id=channel, shape=(plan.in_len,), dtype=plan.flat_dtype)
        return C._call(spec, [tok]), functools.partial(_unpack, plan)
    axis = first.spec.axis
    plan = plan_pack(first.family, [(op.shape, op.dtype, op.spec.axis or 0) for op in ops], first.spec.group_size or 1)
    opts.report(first.family, len(ops), plan.total_bytes, first.key)
    packed = _pack(plan, [visit(op.call.args[0]) for op in ops])
    return C._call(dataclasses.replace(first.spec, axis=None if axis is None else 0), [packed]), functools.partial(_unpack, plan)


class _Rewrite(ShallowExprMutator):
    """Graph form: replace every member of a group by its piece of the combined op (built once per group)."""

    def __init__(self, groups: list[_Group], opts: CombinerOptions) -> None:
        super().__init__()
        self.opts = opts
        self.groups = groups
        self.member: dict[Any, tuple[int, int]] = {}
        for g, (_, ops, _) in enumerate(groups):
            for i, op in enumerate(ops):
                self.member[op.call] = (g, i)
        self.built: dict[int, list[relay.Expr]] = {}

    def visit_call(self, call: relay.Call) -> relay.Expr:
        where = self.member.get(call)
        if where is None:
            return super().visit_call(call)
        g, i = where
        if g not in self.built:
            combined, pieces = _combined(self.groups[g], self.opts, self.visit)
            self.built[g] = pieces(combined)
        return self.built[g][i]


def _units(groups: list[list[int]], transfers: list[tuple[list[int], list[int]]], ops: list[Any],
           channels: ChannelBook) -> list[_Group]:
    """The planner's units (:attr:`.planning.RegionPlan.units` order), transfers on fresh channels."""
    units: list[_Group] = [("collective", [ops[m] for m in g], None) for g in groups]
    for sends, recvs in transfers:
        channel = channels.take()  # in program order: the same on every rank
        units += [("send", [ops[m] for m in sends], channel), ("recv", [ops[m] for m in recvs], channel)]
    return units


def _reschedule(reg: Any, plan_order: list[int], units: list[_Group], chain: LetChain,
                opts: CombinerOptions) -> relay.Expr:
    """The let chain re-emitted in the planner's contracted order, each group at its unit's place:
    ``let c = <combined op>`` then every member's variable bound to its piece of ``c``."""
    var_of = chain.var_of
    out: list[tuple[relay.Var, relay.Expr]] = []
    for u in plan_order:
        if u >= 0:
            e = reg.exprs[u]
            if e in var_of:
                out.append((var_of[e], e))
            continue
        group = units[-1 - u]
        combined, pieces = _combined(group, opts, lambda e: e)
        c = relay.Var(f"combined_{group[1][0].family}")
        out.append((c, combined))
        out.extend((var_of[op.call], piece) for op, piece in zip(group[1], pieces(c)))
    body = chain.result
    for var, value in reversed(out):
        body = relay.Let(var, value, body)
    return body


def _combine_function(func: relay.Function, opts: CombinerOptions, channels: ChannelBook,
                      holders: Callable[[], frozenset[str]]) -> relay.Function:
    """Combine the collectives of the function's top-level region (:func:`..relay.region`).

    Left unchanged where nothing is provable: dependences in a cycle, or a send or recv out of the
    region (their matches would be unknown). Outside a reorderable let chain, a group whose combined
    op would read a let variable where one of its members cannot see it is not built.
    """
    reg = C.region(func.body)
    if reg is None:
        return func
    specs = [C.info(e) for e in reg.exprs]
    ops = [_classify(e, opts) for e in reg.exprs]
    # Relay's executors run any topological order: the driver sorts the region after adding the
    # send -> recv edges, and transfers inside an if, closure or loop have no provable match
    plan = plan_combining(_neutral_units(reg, specs, ops, holders), opts, channels, topological=True,
                          hidden_transfers=reg.nested_p2p is not None, ends_share_key=True, dtype_bits=_DTYPE_BITS)
    if plan is None:
        return func
    body = _emit(func.body, reg, specs, ops, plan, opts, channels)
    return func if body is None else _with_body(func, body, reg)


def _neutral_units(reg: Any, specs: list[S.CollectiveSpec | None], ops: list[_Op | None],
                   holders: Callable[[], frozenset[str]]) -> list[Unit]:
    """The region as the driver reads it: deps, ops, transfers and what no collective may cross.

    An if, closure or loop holding collectives is a barrier (as an if is in Relax): no collective
    moves across it, so every rank keeps calling them in the same sequence. A call to a global
    function that sends or receives is one for the transfers on channels that functions share: a
    send moved past a call sending on its channel swapped the two recvs' payloads.
    """
    p2p = [spec is not None and spec.kind in S.P2P_KINDS for spec in specs]
    nodes = C.order_nodes(reg) if any(p2p) else []  # as the executors match them
    out = []
    for i, (e, spec, op) in enumerate(zip(reg.exprs, specs, ops)):
        calls = isinstance(e, relay.Call) and isinstance(e.op, relay.GlobalVar) and e.op.name_hint in holders()
        out.append(Unit(reg.deps[i], op, nodes[i] if p2p[i] else None, barrier=i in reg.nested,
                        before_barrier=spec is not None, after_barrier=spec is not None, calls_transfers=calls))
    return out


def _emit(body: relay.Expr, reg: Any, specs: list[S.CollectiveSpec | None], ops: list[_Op | None],
          plan: RegionPlan, opts: CombinerOptions, channels: ChannelBook) -> relay.Expr | None:
    """The body with the plan's groups built; None where none can be."""
    chain = let_chain(body)
    if reorderable(chain, body, reg, C.moving(reg, specs)):
        return _reschedule(reg, plan.order, _units(plan.groups, plan.transfers, ops, channels), chain, opts)

    # graph form, or let form the chain cannot carry: each group where its first member sits, if
    # there it sees every let variable its members read
    def in_scope(members: list[int]) -> bool:
        return reg.needs([a for m in members for a in ops[m].call.args]) <= reg.visible_at(members)  # type: ignore[union-attr]

    units = _units([g for g in plan.groups if in_scope(g)],
                   [(s, r) for s, r in plan.transfers if in_scope(s) and in_scope(r)], ops, channels)
    return _Rewrite(units, opts).visit(body) if units else None


def _with_body(func: relay.Function, body: relay.Expr, reg: Any) -> relay.Function:
    """The function with ``body``; the original where the new one is not well scoped."""
    # The function's type is unchanged: keep it, so a caller type-checked before this function's
    # body is inferred again still knows what it returns (InferType cannot infer it from the call).
    new = relay.Function(func.params, body, func.checked_type.ret_type, func.type_params, func.attrs, func.span)
    if reg.let_vars and not C.well_scoped(new):
        # a group built inside another's combined op (a recv group in a send group's payload) can read
        # a let variable bound after where that op sits: the scope check above sees members only
        return func
    return new


def _combine_module(mod: tvm.IRModule, opts: CombinerOptions) -> tvm.IRModule:
    if not opts.enabled:
        return mod
    original = mod
    # Relay matches a channel's sends in the order their data gives them, and a group can give one
    # send a recv of its own channel as an ancestor, moving it behind a later send (two allreduces
    # combined: each recv got the other's payload). OrderSendRecv's tokens fix each channel's order.
    # ordering adds tokens only: the channels and calls of each function stay as this walk finds them
    walk = C.transfers_by_function(mod)
    mod = relay.transform.InferType()(mod)
    try:
        names = C.p2p_functions(walk)
        ordered = C.order_typed_module(mod, names) if names else None
    except SendRecvOrderError:
        if "send_recv" in opts.families:
            raise
        return original  # transfers without a provable order: no collective moves among them
    if ordered is not None:
        mod = relay.transform.InferType()(ordered)
    channels = ChannelBook(lambda: (t.channels for t in walk.values()))
    holders = functools.cache(lambda: C.functions_with_transfers(walk))  # read where a function calls one
    updates = {}
    # by name: every rank numbers the new channels alike (a Map's order follows object addresses,
    # and ranks that numbered 8 functions differently received each other's payloads)
    for gv, func in sorted(mod.functions.items(), key=lambda item: item[0].name_hint):
        if isinstance(func, relay.Function):
            new = _combine_function(func, opts, channels, holders)
            if not new.same_as(func):
                updates[gv] = new
    if not updates:
        return original  # nothing combined: the module as it came
    new_mod = tvm.IRModule(dict(mod.functions.items()), mod.type_definitions, attrs=mod.attrs)
    for gv, func in updates.items():
        new_mod[gv] = func
    return relay.transform.InferType()(new_mod)


AllReduceCombiner, AllGatherCombiner, ReduceScatterCombiner, SendRecvCombiner, CombineCollectives = pass_factories(
    _combine_module, __name__, {
        "AllGatherCombiner": "Combine independent allgathers of one dtype; ``combine_by_dim=False``: any axes together.",
        "SendRecvCombiner": "Send transfers with the same pairs, dtype and independent payloads as one (fresh channel ids).",
    }
)


__all__ = ["AllReduceCombiner", "AllGatherCombiner", "ReduceScatterCombiner", "SendRecvCombiner", "CombineCollectives"]
