"""Relax modules from the collective fuzzer's resolved programs (``collective_spec``), and their inputs."""

from __future__ import annotations

import numpy as np
import tvm
from collective_spec import TYPES, Resolved
from tvm import relax

from tvm_combiners.collectives import relax as CR

ONE_RANK = [[0, 0]]  # source-target pairs of a one-rank world
GROUP = [[0]]


def build_module(program: Resolved) -> tvm.IRModule:
    """``main`` emits the ops in program order in one impure block, and returns every tensor made."""
    xs = [relax.Var(f"x{i}", relax.TensorType(*TYPES[t])) for i, t in enumerate(program.params)]
    bb = relax.BlockBuilder()
    with bb.function("main", xs, pure=False):
        values: list[relax.Expr] = list(xs)
        for op in program.ops:
            args = [values[a] for a in op.args]
            if op.kind == "send":
                call = CR.send(args[0], ONE_RANK, channel_id=op.channel, is_host_transfer=op.host)
            elif op.kind == "recv":
                shape, dtype = TYPES[op.type]
                call = CR.recv(shape, dtype, ONE_RANK, channel_id=op.channel, is_host_transfer=op.host,
                               token=args[0] if args else None)
            elif op.kind == "allreduce":
                call = CR.allreduce(args[0], op.reduce)
            elif op.kind == "allgather":
                call = CR.allgather(args[0], axis=op.axis, group=GROUP)
            elif op.kind == "reduce_scatter":
                call = CR.reduce_scatter(args[0], op.reduce, axis=op.axis, group=GROUP)
            elif op.kind == "add":
                call = relax.op.add(args[0], args[1])
            else:  # offset
                call = relax.op.add(args[0], relax.const(op.constant, TYPES[op.type][1]))
            values.append(bb.emit(call))
        bb.emit_func_output(relax.Tuple([values[v] for v in program.outputs]))
    return bb.get()


def random_inputs(program: Resolved, seed: int) -> list[np.ndarray]:
    """Small integers in every dtype: sums, maxima and offsets stay exact."""
    rng = np.random.default_rng(seed)
    return [rng.integers(1, 4, size=TYPES[t][0]).astype(TYPES[t][1]) for t in program.params]
