"""Relax modules from the collective fuzzer's resolved programs (``collective_spec``), and their inputs."""

from __future__ import annotations

import itertools

import tvm
from collective_spec import TYPES, Op, Resolved
from tvm import relax

from tvm_combiners.collectives import relax as CR

ONE_RANK = [[0, 0]]  # source-target pairs of a one-rank world
GROUP = [[0]]


def build_module(program: Resolved, dataflow: bool = False) -> tvm.IRModule:
    """``main`` emits the ops in program order and returns every tensor made; with ``dataflow``,
    each run of pure ops (compute, TVM's own ccl ops) sits in a dataflow block of its own."""
    xs = [relax.Var(f"x{i}", relax.TensorType(*TYPES[t])) for i, t in enumerate(program.params)]
    bb = relax.BlockBuilder()
    with bb.function("main", xs, pure=False):
        values: list[relax.Expr] = list(xs)
        for pure, run in itertools.groupby(program.ops, key=lambda op: dataflow and _pure(op)):
            if pure:
                with bb.dataflow():  # every tensor is an output of main, so of its block
                    for op in run:
                        values.append(bb.emit_output(_call(op, values)))
            else:
                for op in run:
                    values.append(bb.emit(_call(op, values)))
        bb.emit_func_output(relax.Tuple([values[v] for v in program.outputs]))
    return bb.get()


def _pure(op: Op) -> bool:
    return op.kind in ("add", "offset") or op.native


def _call(op: Op, values: list[relax.Expr]) -> relax.Expr:
    args = [values[a] for a in op.args]
    if op.native:
        if op.kind == "allreduce":
            return relax.op.ccl.allreduce(args[0], op.reduce, True)
        return relax.op.ccl.allgather(args[0], 1, True)  # one worker: along axis 0
    if op.kind == "send":
        return CR.send(args[0], ONE_RANK, channel_id=op.channel, is_host_transfer=op.host)
    if op.kind == "recv":
        shape, dtype = TYPES[op.type]
        return CR.recv(shape, dtype, ONE_RANK, channel_id=op.channel, is_host_transfer=op.host,
                       token=args[0] if args else None)
    if op.kind == "allreduce":
        return CR.allreduce(args[0], op.reduce)
    if op.kind == "allgather":
        return CR.allgather(args[0], axis=op.axis, group=GROUP)
    if op.kind == "reduce_scatter":
        return CR.reduce_scatter(args[0], op.reduce, axis=op.axis, group=GROUP)
    if op.kind == "add":
        return relax.op.add(args[0], args[1])
    return relax.op.add(args[0], relax.const(op.constant, TYPES[op.type][1]))  # offset
