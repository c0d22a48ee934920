"""Relax modules from the collective fuzzer's resolved programs (``collective_spec``), one rank or n.

On n ranks (``collective_world``) groups name every rank, sends and recvs go around the ring, and
the two collectives that change shapes carry wraps that give back the operand's type: a weighted
fold after an allgather, an offset tile before a reduce_scatter (``collective_world`` says why).
On one rank the wraps vanish and every group and pair is the rank itself.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import tvm
from collective_spec import TYPES, Op, Resolved
from collective_world import gather_weight, scatter_offset
from tvm import relax

from tvm_combiners.collectives import relax as CR

_Bind = Callable[..., relax.Var]


def build_module(program: Resolved, dataflow: bool = False, ranks: int = 1) -> tvm.IRModule:
    """``main`` for every rank of a world of ``ranks``: the ops in program order, every tensor made
    returned; with ``dataflow``, each run of pure ops (compute, TVM's own ccl ops, with their wraps)
    sits in a dataflow block of its own."""
    xs = [relax.Var(f"x{i}", relax.TensorType(*TYPES[t])) for i, t in enumerate(program.params)]
    bb = relax.BlockBuilder()
    with bb.function("main", xs, pure=False):
        values: list[relax.Expr] = list(xs)
        for pure, run in itertools.groupby(program.ops, key=lambda op: dataflow and _pure(op)):
            if pure:
                with bb.dataflow():  # every op's value is an output of main, so of its block
                    for op in run:
                        values.append(_emit(bb, op, values, ranks, output=True))
            else:
                for op in run:
                    values.append(_emit(bb, op, values, ranks, output=False))
        bb.emit_func_output(relax.Tuple([values[v] for v in program.outputs]))
    return bb.get()


def _pure(op: Op) -> bool:
    return op.kind in ("add", "offset") or op.native


def _emit(bb: relax.BlockBuilder, op: Op, values: list[relax.Expr], n: int, output: bool) -> relax.Var:
    """Bind op's call with its wraps; the op's value is the last binding (its block's output when ``output``)."""

    def bind(expr: relax.Expr, last: bool = False) -> relax.Var:
        return bb.emit_output(expr) if output and last else bb.emit(expr)

    args = [values[a] for a in op.args]
    if op.kind == "allgather":
        return _fold(bind, bind(_call(op, args, n), last=n == 1), op, n)
    if op.kind == "reduce_scatter":
        args = [_tile(bind, args[0], op, n)]
    return bind(_call(op, args, n), last=True)


def _call(op: Op, args: list[relax.Expr], n: int) -> relax.Expr:
    group = [list(range(n))]
    ring = [[r, (r + 1) % n] for r in range(n)]  # one rank: [[0, 0]]
    if op.native:
        if op.kind == "allreduce":
            return relax.op.ccl.allreduce(args[0], op.reduce, True)
        return relax.op.ccl.allgather(args[0], n, True)  # along axis 0
    if op.kind == "send":
        return CR.send(args[0], ring, channel_id=op.channel, is_host_transfer=op.host)
    if op.kind == "recv":
        shape, dtype = TYPES[op.type]
        return CR.recv(shape, dtype, ring, channel_id=op.channel, is_host_transfer=op.host,
                       token=args[0] if args else None)
    if op.kind == "allreduce":
        return CR.allreduce(args[0], op.reduce)
    if op.kind == "allgather":
        return CR.allgather(args[0], axis=op.axis, group=group)
    if op.kind == "reduce_scatter":
        return CR.reduce_scatter(args[0], op.reduce, axis=op.axis, group=group)
    if op.kind == "add":
        return relax.op.add(args[0], args[1])
    return relax.op.add(args[0], relax.const(op.constant, TYPES[op.type][1]))  # offset


def _fold(bind: _Bind, gathered: relax.Var, op: Op, n: int) -> relax.Var:
    """``collective_world.fold_gathered`` in Relax: block k times ``k + 1``, added in block order."""
    if n == 1:
        return gathered
    dtype = TYPES[op.type][1]
    parts = bind(relax.op.split(gathered, n, axis=op.axis))
    acc = bind(relax.TupleGetItem(parts, 0))
    for k in range(1, n):
        block = bind(relax.TupleGetItem(parts, k))
        weighted = bind(relax.op.multiply(block, relax.const(gather_weight(k), dtype)))
        acc = bind(relax.op.add(acc, weighted), last=k == n - 1)
    return acc


def _tile(bind: _Bind, x: relax.Expr, op: Op, n: int) -> relax.Expr:
    """``collective_world.tile_for_scatter`` in Relax: n copies along the axis, copy k plus ``k``."""
    if n == 1:
        return x
    dtype = TYPES[op.type][1]
    copies = [x] + [bind(relax.op.add(x, relax.const(scatter_offset(k), dtype))) for k in range(1, n)]
    return bind(relax.op.concat(copies, axis=op.axis))
