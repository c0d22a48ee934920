"""Collective combiners on 2 ranks: many small collectives before and after combining (Relax, llvm).

    .venv/bin/python benchmarks/bench_collective_combiners.py [--quick | --smoke]

Launches its own 2 ranks (tvm_combiners.collectives.runtime.launcher); rank 0 prints one table.
Each case is one Relax function holding k independent collectives of the given size per rank,
compiled for llvm and called through the VM: ``before`` as written, ``after`` through
``CombineCollectives`` (one pack kernel, one collective, the results read as views of its
buffer), ``one op``: a single collective of the total size, and ``k-tensor VM``: a function that
takes the same k tensors and returns them untouched (the VM's own cost of k arguments and k
results, which ``before`` and ``after`` pay and ``one op`` does not). 64 KiB ops are the largest
``max_op_bytes="auto"`` packs on CPU; it leaves larger ones alone, and ``no op cap`` packs them
anyway, to show whether the cap's choice holds. The fastest of several batches (the machines are
shared and MPI busy-polls, so medians mostly measure other processes), the slower rank's figure,
microseconds per call, all from the same run. The two small allreduce cases run again between
producers and consumers (``_in_function``: one kernel makes each operand, one reads each
result), beside the same program without collectives, whose time the collectives' share leaves
out; there the kernels write the packed buffer and read the combined one themselves
(``tvm_combiners.compile.in_place``), so neither a pack kernel nor a view is left.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from tvm_combiners.collectives.testing.cluster import add_cluster_options, launch_two_ranks

CASES = (  # (name, op, count, bytes per op, max_op_bytes)
    ("64 x 4 KiB allreduce", "allreduce", 64, 4 << 10, "auto"),
    ("256 x 256 B allreduce", "allreduce", 256, 256, "auto"),
    ("16 x 64 KiB allreduce", "allreduce", 16, 64 << 10, "auto"),
    ("16 x 128 KiB allreduce", "allreduce", 16, 128 << 10, "auto"),
    ("16 x 128 KiB, no op cap", "allreduce", 16, 128 << 10, None),
    ("16 x 1 MiB allreduce", "allreduce", 16, 1 << 20, "auto"),
    ("16 x 1 MiB, no op cap", "allreduce", 16, 1 << 20, None),
    ("64 x 4 KiB allgather", "allgather", 64, 4 << 10, "auto"),
)


def _module(op: str, count: int, nbytes: int, n: int):
    import tvm
    from tvm import relax

    from tvm_combiners.collectives import relax as CR

    elems = nbytes // 4
    xs = [relax.Var(f"x{i}", relax.TensorType((elems,), "float32")) for i in range(count)]
    bb = relax.BlockBuilder()
    with bb.function("main", xs, pure=False):
        outs = []
        for x in xs:
            call = CR.allreduce(x) if op == "allreduce" else CR.allgather(x, group=[list(range(n))])
            outs.append(bb.emit(call))
        bb.emit_func_output(relax.Tuple(outs))
    return bb.get(), [tvm.runtime.tensor(__import__("numpy").full((elems,), i + 1, "float32")) for i in range(count)]


def _in_function(count: int, nbytes: int, collectives: bool = True):
    """The collectives between producers and consumers: ``x (count, elems)`` -> one kernel per row
    (``2 * x[i]``) -> an allreduce per row -> one kernel per result (``+ 1``) -> their tuple;
    without ``collectives``, the same program with no allreduce (its compute alone)."""
    import numpy as np
    import tvm
    from tvm import relax

    from tvm_combiners.collectives import relax as CR

    elems = nbytes // 4
    x = relax.Var("x", relax.TensorType((count, elems), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x], pure=False):
        two, one = relax.const(2.0, "float32"), relax.const(1.0, "float32")
        rows = [bb.emit(relax.op.multiply(relax.op.strided_slice(x, [0], [i], [i + 1]), two)) for i in range(count)]
        if collectives:
            rows = [bb.emit(CR.allreduce(r)) for r in rows]
        bb.emit_func_output(relax.Tuple([bb.emit(relax.op.add(r, one)) for r in rows]))
    return bb.get(), [tvm.runtime.tensor(np.arange(count * elems, dtype="float32").reshape(count, elems) % 7)]


def _identity(count: int, nbytes: int):
    from tvm import relax

    xs = [relax.Var(f"x{i}", relax.TensorType((nbytes // 4,), "float32")) for i in range(count)]
    bb = relax.BlockBuilder()
    with bb.function("main", xs, pure=False):
        bb.emit_func_output(relax.Tuple(xs))
    return bb.get()


def _compile(mod):
    import tvm
    from tvm import relax

    from tvm_combiners.collectives import relax as CR

    ex = tvm.compile(mod, target="llvm", relax_pipeline=CR.pipeline("llvm"))
    return relax.VirtualMachine(ex, tvm.cpu())["main"]


def _scaled(name: str, count: int, smoke: bool) -> tuple[str, int]:
    """A smoke run's case: every code path at an eighth of its tensors (compiling 256 of them takes
    most of a run)."""
    if not smoke:
        return name, count
    count = max(2, count // 8)
    return f"{count}{name[name.index(' x '):]}", count


def _time(comm, fns, calls: int, batches: int) -> list[float]:
    """Microseconds per call of each function: batches interleaved (load drifts over time on shared
    machines), the fastest batch of each, the slower rank's figure."""
    from mpi4py import MPI

    for fn in fns:
        for _ in range(min(calls, 10)):
            fn()
    best = [float("inf")] * len(fns)
    for _ in range(batches):
        for i, fn in enumerate(fns):
            comm.Barrier()
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            best[i] = min(best[i], (time.perf_counter() - start) / calls * 1e6)
    return [comm.allreduce(b, op=MPI.MAX) for b in best]


def rank_main(quick: bool, smoke: bool = False) -> None:
    import numpy as np
    from mpi4py import MPI

    import tvm_combiners.collectives.runtime  # noqa: F401 - registers the runtime functions
    from tvm_combiners.collectives.relax import combiners as CB

    comm = MPI.COMM_WORLD
    n = comm.Get_size()
    rows = []
    for name, op, count, nbytes, cap in CASES:
        name, count = _scaled(name, count, smoke)
        mod, args = _module(op, count, nbytes, n)
        combined = CB.CombineCollectives(max_op_bytes=cap)(mod)
        one, one_args = _module(op, 1, count * nbytes, n)
        unchanged = combined.same_as(mod)  # nothing combined (e.g. ops over max_op_bytes): the same program
        before, single, floor = _compile(mod), _compile(one), _compile(_identity(count, nbytes))
        after = before if unchanged else _compile(combined)
        got_b, got_a = before(*args), after(*args)
        for a, b in zip(got_b, got_a):  # the benchmark also checks the combined results
            np.testing.assert_array_equal(a.numpy(), b.numpy())
        calls = 3 if smoke else 20 if quick else 200 if count * nbytes <= 1 << 20 else 30
        batches = 1 if smoke else 3 if quick else 7
        fns = [lambda f=before, a=args: f(*a), lambda f=single, a=one_args: f(*a), lambda f=floor, a=args: f(*a)]
        if not unchanged:
            fns.append(lambda f=after, a=args: f(*a))
        times = _time(comm, fns, calls, batches)
        t_before, t_one, t_floor = times[:3]
        t_after = t_before if unchanged else times[3]
        name += " (unchanged)" if unchanged else ""
        rows.append((name, t_before, t_after, t_one, t_floor))
    inner = []
    for name, op, count, nbytes, _cap in CASES[:2]:  # the small allreduces again, between producers and consumers
        name, count = _scaled(name, count, smoke)
        mod, args = _in_function(count, nbytes)
        combined = CB.CombineCollectives()(mod)
        one, one_args = _module(op, 1, count * nbytes, n)
        before, after, single = _compile(mod), _compile(combined), _compile(one)
        compute = _compile(_in_function(count, nbytes, collectives=False)[0])
        for a, b in zip(before(*args), after(*args)):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
        calls, batches = (3, 1) if smoke else (20, 3) if quick else (100, 7)
        fns = [lambda f=f, a=a: f(*a) for f, a in ((compute, args), (before, args), (after, args), (single, one_args))]
        inner.append((name, *_time(comm, fns, calls, batches)))
    if comm.Get_rank() == 0:
        run = "smoke (not a measurement)" if smoke else "quick" if quick else "full"
        print(f"2 ranks, llvm, Relax VM, us per call (fastest batch, slower rank); {run} run")
        print(f"{'case':<36}{'before':>10}{'after':>10}{'one op':>10}{'k-tensor VM':>13}{'before/after':>14}{'after/one op':>14}")
        for name, b, a, o, f in rows:
            print(f"{name:<36}{b:>10.1f}{a:>10.1f}{o:>10.1f}{f:>13.1f}{b / a:>13.2f}x{a / o:>13.2f}x")
        print("\nIn a function: a kernel makes each operand and one reads each result; 'compute': the same program")
        print("without collectives; the collectives' share is a column minus 'compute'")
        print(f"{'case':<36}{'compute':>10}{'before':>10}{'after':>10}{'one op':>10}{'share before/after':>20}"
              f"{'after share/one op':>20}")
        for name, c, b, a, o in inner:
            ratio = f"{(b - c) / (a - c):>19.2f}x" if a > c else f"{'-':>20}"  # noise can put 'after' under 'compute'
            print(f"{name:<36}{c:>10.1f}{b:>10.1f}{a:>10.1f}{o:>10.1f}{ratio}{(a - c) / o:>19.2f}x")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="fewer calls and batches")
    mode.add_argument("--smoke", action="store_true", help="an eighth of each case's tensors, 3 calls: a test that it runs")
    parser.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    add_cluster_options(parser)
    args = parser.parse_args()
    if args.rank:
        rank_main(args.quick, args.smoke)
        return 0
    argv = [sys.executable, str(Path(__file__).resolve()), "--rank"] + (["--quick"] if args.quick else []) \
        + (["--smoke"] if args.smoke else [])
    return launch_two_ranks(argv, args.nodes, args.rate, delay=args.delay)  # rank 0 alone prints the table


if __name__ == "__main__":
    sys.exit(main())
