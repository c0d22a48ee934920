"""Relax modules full of collectives, for the combiner tests (single rank and multi-rank).

Every builder takes the world size ``n`` and returns ``(mod, inputs)``: ``inputs(rank)`` gives
that rank's arguments as numpy arrays of small integers (exact under every reduction, whatever
the order of summation).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tvm
from tvm import relax

from tvm_combiners.collectives import relax as CR

Case = tuple[tvm.IRModule, Callable[[int], list[np.ndarray]]]


def data(rank: int, shape: tuple[int, ...], dtype: str, salt: int) -> np.ndarray:
    rng = np.random.default_rng([rank, salt])
    return rng.integers(1, 4, size=shape).astype(dtype)


def _inputs(params: list[tuple[tuple[int, ...], str]]) -> Callable[[int], list[np.ndarray]]:
    return lambda rank: [data(rank, shape, dtype, salt) for salt, (shape, dtype) in enumerate(params)]


def collectives(n: int) -> Case:
    """allreduce, allgather and reduce_scatter on several axes, dtypes, groups and a dependent chain."""
    params = [((4, 6), "float32"), ((5,), "float32"), ((2, 3 * n, 4), "float32"), ((3, 2 * n), "int32"),
              ((2 * n, 3), "float16"), ((n, 2, 2), "int32"), ((2 * n, 3 * n), "float32")]
    xs = [relax.Var(f"x{i}", relax.TensorType(s, d)) for i, (s, d) in enumerate(params)]
    everyone = [list(range(n))]
    backwards = [list(reversed(range(n)))]
    bb = relax.BlockBuilder()
    with bb.function("main", xs, pure=False):
        outs = [bb.emit(CR.allreduce(xs[0])), bb.emit(CR.allreduce(xs[1]))]
        chain = bb.emit(relax.op.add(outs[0], relax.const(1.0, "float32")))
        outs.append(bb.emit(CR.allreduce(chain)))  # depends on a combined one: stays apart
        outs.append(bb.emit(CR.allreduce(xs[2])))  # independent, after the dependent one: joins
        outs += [bb.emit(CR.allreduce(xs[3], "max")), bb.emit(CR.allreduce(xs[5], "max"))]
        outs += [bb.emit(CR.allreduce(xs[3], "min")), bb.emit(CR.allreduce(xs[0], "avg"))]
        outs += [bb.emit(CR.allgather(xs[0], axis=1, group=everyone)), bb.emit(CR.allgather(xs[2], axis=1, group=everyone))]
        outs += [bb.emit(CR.allgather(xs[2], axis=2, group=backwards)), bb.emit(CR.allgather(xs[3], axis=0, group=backwards))]
        outs += [bb.emit(CR.allgather(xs[4], axis=1, group=everyone)), bb.emit(CR.allgather(xs[5], axis=2, group=everyone))]
        outs += [bb.emit(CR.reduce_scatter(xs[2], axis=1, group=everyone)), bb.emit(CR.reduce_scatter(xs[3], "max", axis=1, group=everyone))]
        outs += [bb.emit(CR.reduce_scatter(xs[5], axis=0, group=everyone)), bb.emit(CR.reduce_scatter(xs[4], axis=0, group=backwards))]
        outs += [bb.emit(CR.reduce_scatter(xs[3], "max", axis=1, group=backwards)), bb.emit(CR.reduce_scatter(xs[2], axis=1, group=backwards))]
        outs += [bb.emit(CR.reduce_scatter(xs[6], axis=0, group=everyone)), bb.emit(CR.reduce_scatter(xs[6], axis=1, group=everyone))]
        outs += [bb.emit(CR.reduce_scatter(xs[3], "max", axis=1, group=everyone)), bb.emit(CR.reduce_scatter(xs[6], axis=1, group=backwards))]
        if n % 2 == 0 and n > 2:
            halves = [list(range(0, n, 2)), list(range(1, n, 2))]
            outs += [bb.emit(CR.allreduce(xs[0], group=halves)), bb.emit(CR.allreduce(xs[1], group=halves))]
            outs += [bb.emit(CR.allgather(xs[0], axis=1, group=halves)), bb.emit(CR.allgather(xs[4], axis=0, group=halves))]
        bb.emit_func_output(relax.Tuple(outs))
    return bb.get(), _inputs(params)


def p2p(n: int) -> Case:
    """Sends and recvs: a ring on two channels, partial pairs on two channels (mixed dtypes), a swap
    alone on its pairs, recvs written before their sends, a token chain."""
    params = [((4, 6), "float32"), ((3,), "int32"), ((2, 2), "float16"), ((5,), "float32")]
    xs = [relax.Var(f"x{i}", relax.TensorType(s, d)) for i, (s, d) in enumerate(params)]
    ring = [[r, (r + 1) % n] for r in range(n)]
    partial = [[0, n - 1]]
    swap = [[0, 1], [1, 0]] if n > 1 else [[0, 0]]
    bb = relax.BlockBuilder()
    with bb.function("main", xs, pure=False):
        r1 = bb.emit(CR.recv((4, 6), "float32", ring, channel_id=1))  # before its send
        bb.emit(CR.send(xs[0], ring, channel_id=1))
        t2 = bb.emit(CR.send(xs[1], ring, channel_id=2))
        r2 = bb.emit(CR.recv((3,), "int32", ring, channel_id=2, token=t2))
        bb.emit(CR.send(xs[2], partial, channel_id=3))
        bb.emit(CR.send(xs[3], partial, channel_id=4))
        r3 = bb.emit(CR.recv((2, 2), "float16", partial, channel_id=3))
        r4 = bb.emit(CR.recv((5,), "float32", partial, channel_id=4))
        bb.emit(CR.send(xs[0], swap, channel_id=7))
        r5 = bb.emit(CR.recv((4, 6), "float32", swap, channel_id=7))
        y = bb.emit(relax.op.add(r1, relax.const(1.0, "float32")))  # a second ring hop reads the first
        bb.emit(CR.send(y, ring, channel_id=1))
        r6 = bb.emit(CR.recv((4, 6), "float32", ring, channel_id=1))
        bb.emit_func_output(relax.Tuple([r1, r2, r3, r4, r5, r6]))
    return bb.get(), _inputs(params)


def ccl(n: int) -> Case:
    """TVM's own R.ccl.allreduce / R.ccl.allgather in a dataflow block (pure) and outside it."""
    params = [((4, 6), "float32"), ((7,), "float32"), ((2, 3), "int32"), ((3, 2), "float32")]
    xs = [relax.Var(f"x{i}", relax.TensorType(s, d)) for i, (s, d) in enumerate(params)]
    bb = relax.BlockBuilder()
    with bb.function("main", xs, pure=False):
        with bb.dataflow():
            a = bb.emit(relax.op.ccl.allreduce(xs[0], "sum", True))
            b = bb.emit(relax.op.ccl.allreduce(xs[1], "sum", True))
            c = bb.emit(relax.op.ccl.allreduce(xs[2], "max", True))
            d = bb.emit(relax.op.ccl.allreduce(xs[2], "max", True))
            g1 = bb.emit(relax.op.ccl.allgather(xs[0], n, True))
            g2 = bb.emit(relax.op.ccl.allgather(xs[2], n, True))
            s = bb.emit(relax.op.add(a, relax.const(2.0, "float32")))
            e = bb.emit(relax.op.ccl.allreduce(s, "sum", True))
            out = bb.emit_output(relax.Tuple([a, b, c, d, g1, g2, e]))
        f = bb.emit(relax.op.ccl.allreduce(xs[3], "sum", True))
        g = bb.emit(relax.op.ccl.allreduce(xs[0], "sum", True))
        bb.emit_func_output(relax.Tuple([out, f, g]))
    return bb.get(), _inputs(params)


CASES = {"collectives": collectives, "p2p": p2p, "ccl": ccl}


def count_ops(mod: tvm.IRModule, names: tuple[str, ...]) -> int:
    """Calls to ops whose name ends with one of ``names`` in every Relax function."""
    found = [0]

    def visit(e: object) -> None:
        if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) and e.op.name.endswith(names):
            found[0] += 1

    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func.body, visit)
    return found[0]


def flatten(value: object) -> list[np.ndarray]:
    if hasattr(value, "numpy"):
        return [value.numpy()]
    return [a for v in value for a in flatten(v)]  # type: ignore[attr-defined]


def compile_and_run(mod: tvm.IRModule, args: list[np.ndarray]) -> list[np.ndarray]:
    ex = tvm.compile(mod, target="llvm", relax_pipeline=CR.pipeline("llvm"))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return flatten(vm["main"](*[tvm.runtime.tensor(a) for a in args]))


def random_program(n: int, seed: int) -> Case:
    """A random DAG of collectives, sends/recvs and compute with random dependencies (seeded, so
    every rank builds the same program)."""
    rng = np.random.default_rng(seed)
    shapes = [(2 * n, 3), (3, 2 * n), (n, 2, 2)]
    params = [(shapes[int(rng.integers(3))], str(rng.choice(["float32", "int32"]))) for _ in range(3)]
    xs = [relax.Var(f"x{i}", relax.TensorType(s, d)) for i, (s, d) in enumerate(params)]
    groups = [[list(range(n))], [list(reversed(range(n)))]]
    ring = [[r, (r + 1) % n] for r in range(n)]
    bb = relax.BlockBuilder()
    with bb.function("main", xs, pure=False):
        values: list[relax.Expr] = list(xs)
        channel = 0
        for _ in range(int(rng.integers(6, 16))):
            x = values[int(rng.integers(len(values)))]
            shape = tuple(int(d) for d in x.ty.shape)
            dtype = str(x.ty.dtype)
            kind = int(rng.integers(6))
            group = groups[int(rng.integers(2))]
            if kind == 0:
                v = CR.allreduce(x, str(rng.choice(["sum", "max", "min"])))
            elif kind == 1:
                v = CR.allgather(x, axis=int(rng.integers(len(shape))), group=group)
            elif kind == 2:
                axes = [a for a, d in enumerate(shape) if d % n == 0]
                v = CR.reduce_scatter(x, "sum", axis=axes[int(rng.integers(len(axes)))], group=group) if axes else CR.allreduce(x)
            elif kind == 3:
                same = [w for w in values if str(w.ty) == str(x.ty)]
                v = relax.op.add(x, same[int(rng.integers(len(same)))])
            else:
                tok = bb.emit(CR.send(x, ring, channel_id=channel))
                v = CR.recv(shape, dtype, ring, channel_id=channel, token=tok if rng.integers(2) else None)
                channel += 1
            values.append(bb.emit(v))
        bb.emit_func_output(relax.Tuple(values[len(xs):]))
    return bb.get(), _inputs(params)
