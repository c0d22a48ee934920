"""Collective latency on 2 ranks: raw mpi4py beside our runtime, called directly and from compiled TVM.

    .venv/bin/python benchmarks/bench_collectives.py [--quick]

Launches its own 2 ranks (tvm_combiners.collectives.runtime.launcher); rank 0 prints one table. Every
op at every size runs twice: over all ranks, and over a group (``[[1, 0]]``: a sub-communicator
that lists the ranks in the other order; send/recv: one-way pairs ``[[0, 1]]``, rank 0 gets
zeros). Columns, from the same run, the same buffers (TVM tensors; numpy views of them for
mpi4py) and batches taken in turn (a noisy moment hits every column alike):
- ``mpi4py``: the bare MPI call (send/recv: Isend, Recv, Wait; the group's rows on the
  communicator ``Comm.Split`` gives);
- ``compiled``: a Relax module holding just that op (``tvm_combiners.collectives.relax``), compiled
  for llvm and called through the VM (allocating its output, as a real program does), and the
  path it took (``native``: the runtime's kernels, ``generic``: its Python functions);
- ``packed fn``: the registered ``tvm_combiners.*`` function called from Python with TVM tensors;
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
GROUP = [[1, 0]]  # every rank, listed in the other order: a communicator of its own
ONE_WAY = [[0, 1]]
SWAP = [[0, 1], [1, 0]]


def _iters(nbytes: int, quick: bool) -> tuple[int, int]:
    """(calls per batch, batches): short batches, many of them, so that one lands in a quiet moment."""
    calls, batches = (100, 15) if nbytes <= 4096 else (10, 9) if nbytes <= 1 << 20 else (4, 9)
    return (max(calls // 10, 2), 3) if quick else (calls, batches)


def _time(comm, fns: dict[str, Callable[[], object]], calls: int, batches: int) -> dict[str, float]:
    """Microseconds per op of each function (each makes two calls of its op) in its best batch, the
    batches of all of them taken in turn; the slower rank's figure (both ranks take part in every call)."""
    from mpi4py import MPI

    for fn in fns.values():
        for _ in range(min(calls, 20)):
            fn()
    best = {name: float("inf") for name in fns}
    for _ in range(batches):
        for name, fn in fns.items():
            comm.Barrier()
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            best[name] = min(best[name], (time.perf_counter() - start) / (2 * calls) * 1e6)
    return {name: comm.allreduce(value, op=MPI.MAX) for name, value in best.items()}


def _module(op: str, shape: tuple[int, ...], n: int, grouped: bool, ccl: bool):
    """A Relax function with one collective (or one send + recv), compiled for llvm, in a VM; and
    which runtime functions it calls (:func:`_path`)."""
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

        group = GROUP if grouped else None
        with bb.function("main", [x], pure=False):
            if op == "allreduce":
                out = bb.emit(C.allreduce(x, "sum", group=group))
            elif op == "allgather":
                out = bb.emit(C.allgather(x, 0, group=group, world_size=n))
            elif op == "reduce_scatter":
                out = bb.emit(C.reduce_scatter(x, "sum", 0, group=group, world_size=n))
            else:
                pairs = ONE_WAY if grouped else SWAP
                token = bb.emit(C.send(x, pairs, channel_id=1))
                out = bb.emit(C.recv(shape, "float32", pairs, channel_id=1, token=token))
            bb.emit_func_output(out)
        ex = tvm.compile(bb.get(), target="llvm", relax_pipeline=C.pipeline("llvm"))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm["main"], _path(ex.as_text())


def _path(bytecode: str) -> str:
    """``native`` where a module calls the runtime's native kernels only, ``generic`` where its Python
    functions only, ``mixed`` for both, ``-`` for neither (R.ccl's built-ins)."""
    calls = {line.split()[1] for line in bytecode.splitlines() if line.strip().startswith("call ")}
    native = any(c.startswith("tvm_combiners.native.") for c in calls)
    generic = any(c.startswith("tvm_combiners.") and not c.startswith("tvm_combiners.native.") for c in calls)
    return {(True, False): "native", (False, True): "generic", (True, True): "mixed"}.get((native, generic), "-")


def _raw(op: str, comm, me: int, grouped: bool, a, outs) -> Callable[[], object]:
    """The bare mpi4py call for one op, twice: into each of ``outs`` (``comm``: the group's communicator)."""
    from mpi4py import MPI

    if op == "allreduce":
        return lambda: [comm.Allreduce(a, b, MPI.SUM) for b in outs]
    if op == "allgather":
        return lambda: [comm.Allgather(a, b) for b in outs]
    if op == "reduce_scatter":
        return lambda: [comm.Reduce_scatter_block(a, b, MPI.SUM) for b in outs]
    world, peer = MPI.COMM_WORLD, 1 - me

    def swap() -> None:
        for b in outs:
            req = world.Isend(a, peer, 7)
            world.Recv(b, peer, 7)
            req.Wait()

    def one_way() -> None:  # rank 0 sends and, as the compiled recv does, zeros its own result
        for b in outs:
            if me == 0:
                req = world.Isend(a, 1, 7)
                b.fill(0)
                req.Wait()
            else:
                world.Recv(b, 0, 7)

    return one_way if grouped else swap


def _packed(op: str, fns: dict, groups: str, x, outs, token) -> Callable[[], object]:
    """The registered generic function for one op, called from Python, twice: into each of ``outs``."""
    if op == "allreduce":
        return lambda: [fns["allreduce"](x, "sum", groups, y) for y in outs]
    if op == "allgather":
        return lambda: [fns["allgather"](x, 0, groups, y) for y in outs]
    if op == "reduce_scatter":
        return lambda: [fns["reduce_scatter"](x, "sum", 0, groups, y) for y in outs]
    pairs = "0,1" if groups else "0,1;1,0"

    def packed() -> None:
        for y in outs:
            fns["send"](x, pairs, 1, 0, token)
            fns["recv"](pairs, 1, 0, y)

    return packed


def worker(quick: bool) -> None:
    import numpy as np
    import tvm
    import tvm_ffi
    from mpi4py import MPI

    import tvm_combiners.collectives.relax  # noqa: F401 - the Relax ops (TVM first, then the runtime)
    from tvm_combiners.collectives import runtime
    from tvm_combiners.collectives.runtime import native

    world = MPI.COMM_WORLD
    n, me = runtime.world_size(), runtime.rank()
    position = GROUP[0].index(me)
    sub = world.Split(0, position)  # the group's communicator, as the runtime makes it
    fns = {k: tvm_ffi.get_global_func(f"tvm_combiners.{k}") for k in ("allreduce", "allgather", "reduce_scatter",
                                                                        "send", "recv")}
    native.prepare()  # built before the modules compile, as an application's first collective does
    rows = []
    for nbytes in SIZES:
        count = nbytes // 4
        calls, batches = _iters(nbytes, quick)
        a = np.random.default_rng(me).random(count, dtype=np.float32)
        big = np.random.default_rng(me).random(count * n, dtype=np.float32)
        for op in OPS:
            for grouped in (False, True):
                src = big if op == "reduce_scatter" else a
                out_len = count * n if op == "allgather" else count
                x = tvm.runtime.tensor(src)
                ys = [tvm.runtime.empty((out_len,), "float32") for _ in range(2)]
                token = tvm.runtime.empty((), "int32")
                # mpi4py on the same memory: TVM's (numpy gives its arrays of 4 MiB and more transparent
                # huge pages, which MPI copied up to 1.8x faster here than TVM's allocations), into two
                # outputs in turn, as the VM's pool hands out the compiled function's results (MPICH
                # moved 16 MiB 15-25% faster into one output used again and again)
                src, outs = np.from_dlpack(x), [np.from_dlpack(y) for y in ys]
                groups = ";".join(",".join(map(str, g)) for g in GROUP) if grouped else ""
                compiled, path = _module(op, src.shape, n, grouped, ccl=False)
                fns_timed = {"mpi4py": _raw(op, sub if grouped else world, me, grouped, src, outs),
                             "compiled": lambda main=compiled, x=x: (main(x), main(x)),
                             "packed": _packed(op, fns, groups, x, ys, token)}
                if op in ("allreduce", "allgather") and not grouped:
                    ccl, _ = _module(op, src.shape, n, grouped, ccl=True)
                    fns_timed["ccl"] = lambda main=ccl, x=x: (main(x), main(x))
                row = {"op": op, "group": _group_name(op, grouped), "bytes": nbytes, "ccl": None,
                       **_time(world, fns_timed, calls, batches)}
                row["path"] = path
                rows.append(row)
    if me == 0:
        print(render(rows))


def _group_name(op: str, grouped: bool) -> str:
    if op == "send/recv":
        return "0->1" if grouped else "swap"
    return "[[1,0]]" if grouped else "all"


def _size(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB" if nbytes >= 1 << 10 else f"{nbytes} B"


def render(rows: list[dict]) -> str:
    def us(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f}" if v < 1000 else f"{v:.0f}"

    def ratio(v: float | None, base: float) -> str:
        return "-" if v is None else f"{v / base:.2f}x"

    head = ["op", "ranks", "size", "mpi4py us", "compiled us", "compiled/mpi", "path", "packed fn us", "packed/mpi",
            "R.ccl us", "R.ccl/mpi"]
    body = [[r["op"], r["group"], _size(r["bytes"]), us(r["mpi4py"]), us(r["compiled"]),
             ratio(r["compiled"], r["mpi4py"]), r["path"], us(r["packed"]), ratio(r["packed"], r["mpi4py"]),
             us(r["ccl"]), ratio(r["ccl"], r["mpi4py"])]
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
    return launch_two_ranks(argv, args.nodes, args.rate, delay=args.delay)  # rank 0 alone prints the table


if __name__ == "__main__":
    sys.exit(main())
