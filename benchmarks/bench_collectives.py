"""Collective latency on 2 ranks: raw mpi4py beside our runtime, called directly and from compiled TVM.

    .venv/bin/python benchmarks/bench_collectives.py [--quick]

Launches its own 2 ranks (tvm_combiners.collectives.runtime.launch); rank 0 prints one table.
Columns, all from the same run and the same buffers:
- ``mpi4py``: the bare MPI call on numpy arrays (send/recv: Isend, Recv, Wait, a pair swap);
- ``packed fn``: the registered ``tvm_combiners.*`` function called from Python with TVM tensors;
- ``compiled``: a Relax module holding just that op (``tvm_combiners.collectives.relax``), compiled
  for llvm and called through the VM (allocating its output, as a real program does);
- ``R.ccl``: TVM's own ``R.ccl.allreduce`` / ``R.ccl.allgather`` compiled the same way, running on
  our ``runtime.disco.*`` overrides.
Size is each rank's input (reduce_scatter: each rank's output, so its input is 2x). Microseconds per
call, the best of several batches (on a shared machine other processes only add time), the slower
rank's figure; ratios are against mpi4py.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tvm_combiners.app.text_table import table
from tvm_combiners.collectives.testing.cluster import add_cluster_options, launch_two_ranks

SIZES = (4, 4 << 10, 1 << 20, 16 << 20)
OPS = ("allreduce", "allgather", "reduce_scatter", "send/recv")


def _iters(nbytes: int, quick: bool) -> tuple[int, int]:
    """(calls per batch, batches): short batches, many of them, so that one lands in a quiet moment."""
    calls, batches = (200, 15) if nbytes <= 4096 else (20, 9) if nbytes <= 1 << 20 else (4, 5)
    return (max(calls // 10, 2), 3) if quick else (calls, batches)


def _time(comm, fn: Callable[[], object], calls: int, batches: int) -> float:
    """Microseconds per call in the best batch; the slower rank's figure (both ranks take part in every call)."""
    from mpi4py import MPI

    for _ in range(min(calls, 20)):
        fn()
    samples = []
    for _ in range(batches):
        comm.Barrier()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return comm.allreduce(min(samples), op=MPI.MAX)


def _module(op: str, shape: tuple[int, ...], n: int, ccl: bool):
    """A Relax function with one collective (or one send + recv), compiled for llvm, in a VM."""
    import tvm
    from tvm import relax

    x = relax.Var("x", relax.TensorType(shape, "float32"))
    bb = relax.BlockBuilder()
    if ccl:
        with bb.function("main", [x]):
            with bb.dataflow():
                call = relax.op.ccl.allreduce(x, "sum") if op == "allreduce" else relax.op.ccl.allgather(x, n)
                out = bb.emit_output(call)
            bb.emit_func_output(out)
        ex = tvm.compile(bb.get(), target="llvm")
    else:
        from tvm_combiners.collectives import relax as C

        with bb.function("main", [x], pure=False):
            if op == "allreduce":
                out = bb.emit(C.allreduce(x, "sum"))
            elif op == "allgather":
                out = bb.emit(C.allgather(x, 0, world_size=n))
            elif op == "reduce_scatter":
                out = bb.emit(C.reduce_scatter(x, "sum", 0, world_size=n))
            else:
                token = bb.emit(C.send(x, [[0, 1], [1, 0]], channel_id=1))
                out = bb.emit(C.recv(shape, "float32", [[0, 1], [1, 0]], channel_id=1, token=token))
            bb.emit_func_output(out)
        ex = tvm.compile(bb.get(), target="llvm", relax_pipeline=C.pipeline("llvm"))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm["main"]


def _callables(op: str, comm, fns: dict, peer: int, a, b, x, y, token) -> tuple[Callable[[], object], Callable[[], object]]:
    """(bare mpi4py call, our packed function call) for one op on the same buffers."""
    from mpi4py import MPI

    if op == "allreduce":
        return (lambda: comm.Allreduce(a, b, MPI.SUM)), (lambda: fns["allreduce"](x, "sum", "", y))
    if op == "allgather":
        return (lambda: comm.Allgather(a, b)), (lambda: fns["allgather"](x, 0, "", y))
    if op == "reduce_scatter":
        return (lambda: comm.Reduce_scatter_block(a, b, MPI.SUM)), (lambda: fns["reduce_scatter"](x, "sum", 0, "", y))

    def raw() -> None:
        req = comm.Isend(a, peer, 7)
        comm.Recv(b, peer, 7)
        req.Wait()

    def packed() -> None:
        fns["send"](x, "0,1;1,0", 1, 0, token)
        fns["recv"]("0,1;1,0", 1, 0, y)

    return raw, packed


def worker(quick: bool) -> None:
    import numpy as np
    import tvm
    import tvm_ffi
    from mpi4py import MPI

    from tvm_combiners.collectives import runtime

    comm = MPI.COMM_WORLD
    n, me, peer = runtime.world_size(), runtime.rank(), 1 - runtime.rank()
    fns = {k: tvm_ffi.get_global_func(f"tvm_combiners.{k}") for k in ("allreduce", "allgather", "reduce_scatter",
                                                                        "send", "recv")}
    try:
        from tvm_combiners.collectives import relax as _  # noqa: F401 - the ops helper's Relax ops
        have_ops = True
    except ImportError:
        have_ops = False
    rows = []
    for nbytes in SIZES:
        count = nbytes // 4
        calls, batches = _iters(nbytes, quick)
        a = np.random.default_rng(me).random(count, dtype=np.float32)
        big = np.random.default_rng(me).random(count * n, dtype=np.float32)
        for op in OPS:
            src = big if op == "reduce_scatter" else a
            out_len = count * n if op == "allgather" else count
            b = np.empty(out_len, np.float32)
            x, y = tvm.runtime.tensor(src), tvm.runtime.empty((out_len,), "float32")
            token = tvm.runtime.empty((), "int32")
            raw, packed = _callables(op, comm, fns, peer, src, b, x, y, token)
            row = {"op": op, "bytes": nbytes, "mpi4py": _time(comm, raw, calls, batches),
                   "packed": _time(comm, packed, calls, batches), "compiled": None, "ccl": None}
            if have_ops:
                main = _module(op, src.shape, n, ccl=False)
                row["compiled"] = _time(comm, lambda main=main, x=x: main(x), calls, batches)
            if op in ("allreduce", "allgather"):
                main = _module(op, src.shape, n, ccl=True)
                row["ccl"] = _time(comm, lambda main=main, x=x: main(x), calls, batches)
            rows.append(row)
    if me == 0:
        print(render(rows))


def _size(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB" if nbytes >= 1 << 10 else f"{nbytes} B"


def render(rows: list[dict]) -> str:
    def us(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f}" if v < 1000 else f"{v:.0f}"

    def ratio(v: float | None, base: float) -> str:
        return "-" if v is None else f"{v / base:.2f}x"

    head = ["op", "size", "mpi4py us", "packed fn us", "compiled us", "R.ccl us", "packed/mpi", "compiled/mpi",
            "R.ccl/mpi"]
    body = [[r["op"], _size(r["bytes"]), us(r["mpi4py"]), us(r["packed"]), us(r["compiled"]), us(r["ccl"]),
             ratio(r["packed"], r["mpi4py"]), ratio(r["compiled"], r["mpi4py"]), ratio(r["ccl"], r["mpi4py"])]
            for r in rows]
    return "2 ranks, float32, microseconds per call (best batch)\n" + table(body, head)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer calls per size (a smoke run)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    add_cluster_options(parser)
    args = parser.parse_args()
    if args.worker:
        worker(args.quick)
        return 0
    argv = [sys.executable, str(Path(__file__).resolve()), "--worker", *(["--quick"] if args.quick else [])]
    return launch_two_ranks(argv, args.nodes, args.rate)  # rank 0 alone prints the table


if __name__ == "__main__":
    sys.exit(main())
