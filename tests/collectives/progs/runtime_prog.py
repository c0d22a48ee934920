"""Run on N ranks by tests/collectives/test_runtime.py: every runtime function on this rank's data.

Each rank saves what it got to ``<out>/rank<R>.npz`` (arrays) and ``<out>/rank<R>.json`` (error
messages); the test recomputes every expected value with numpy from ``data()`` and compares.
Usage: ``prog.py OUT_DIR all`` (every check), ``fail`` (rank 1 breaks C4 in a send while the others
wait in a recv), ``hang`` (rank 1 sleeps while the others wait in a barrier; ``sigkill`` and
``segfault``: rank 1 dies instead; ``os_exit`` and ``sys_exit``: rank 1 leaves with code 0 instead,
``fork_os_exit`` too after rank 0 ran a forked worker, which leaves through ``os._exit``;
``all_os_exit``: every rank leaves with ``os._exit(0)`` after the barrier), ``mismatch`` (rank 1
multiplies where the others sum; a send of (4, 2) into a recv of (2, 4)), ``recv_first`` (each rank
receives before it sends), ``mixed_check`` (check mode on one rank only, each way), ``shapes``
(compiled collectives of a symbolic extent, given equal and then rank-dependent shapes).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np

REDUCTIONS = ("sum", "prod", "min", "max", "avg")
BIG = (512, 512)  # 1 MiB of float32: MPI's rendezvous protocol, where a blocking send would wait for its recv


def data(rank: int, shape: tuple[int, ...], dtype: str, salt: int) -> np.ndarray:
    """Small integers (exact in every dtype and under prod) that differ per rank and per case."""
    rng = np.random.default_rng([rank, salt])
    return rng.integers(1, 4, size=shape).astype(dtype)


def group_specs(n: int) -> list[str]:
    """The groups strings every launch checks: all ranks, reversed order, and a split into two."""
    specs = ["", ",".join(str(r) for r in reversed(range(n)))]
    if n >= 3:
        evens = [r for r in range(n) if r % 2 == 0]
        odds = [r for r in range(n) if r % 2 == 1]
        specs.append(";".join(",".join(map(str, g)) for g in (list(reversed(evens)), odds)))
    return specs


def p2p_patterns(n: int) -> dict[str, str]:
    ring = ";".join(f"{r},{(r + 1) % n}" for r in range(n))
    back = ";".join(f"{r},{(r - 1) % n}" for r in range(n))
    return {"swap": "0,1;1,0", "ring": ring, "back": back, "partial": f"0,{n - 1}"}


def shapes(out_dir: Path, n: int, me: int) -> None:
    """Collectives of a symbolic extent, compiled: equal shapes on every rank, then rank-dependent ones."""
    import tvm
    from tvm import relax, tirx

    from tvm_combiners.collectives import relax as C

    k = tirx.Var("k", "int64")
    bb = relax.BlockBuilder()
    fns = {"allreduce": lambda x: C.allreduce(x), "allgather": lambda x: C.allgather(x, axis=1, world_size=n),
           "reduce_scatter": lambda x: C.reduce_scatter(x, axis=1, world_size=n)}
    for kind, make in fns.items():
        x = relax.Var("x", relax.TensorType((k, 2 * n), "float32"))  # gathered/scattered axes static
        with bb.function(kind, [x], pure=False):
            bb.emit_func_output(bb.emit(make(x)))
    vm = relax.VirtualMachine(tvm.compile(bb.get(), "llvm", relax_pipeline=C.pipeline("llvm")), tvm.cpu())
    got, errors = {}, {}
    for kind in fns:
        got[kind] = vm[kind](tvm.runtime.tensor(data(me, (3, 2 * n), "float32", 7))).numpy()
        try:
            vm[kind](tvm.runtime.tensor(data(me, (3 + me, 2 * n), "float32", 7)))
        except Exception as err:  # raised on every rank, after they all compared shapes: no rank waits
            errors[kind] = f"{type(err).__name__}: {str(err).strip().splitlines()[-1]}"
    # TVM's own R.ccl ops over (rows, cols), both symbolic: rank 0 gives (2, 3), rank 1 (3, 2), the same bytes
    rows, cols = tirx.Var("rows", "int64"), tirx.Var("cols", "int64")
    bb = relax.BlockBuilder()
    ccl = {"ccl_allreduce": lambda x: relax.op.ccl.allreduce(x, "sum"), "ccl_allgather": lambda x: relax.op.ccl.allgather(x, n)}
    for kind, make in ccl.items():
        x = relax.Var("x", relax.TensorType((rows, cols), "float32"))
        with bb.function(kind, [x]):
            bb.emit_func_output(bb.emit(make(x)))
    vm = relax.VirtualMachine(tvm.compile(bb.get(), "llvm"), tvm.cpu())
    for kind in ccl:
        got[kind] = vm[kind](tvm.runtime.tensor(data(me, (3, 2), "float32", 8))).numpy()
        try:
            vm[kind](tvm.runtime.tensor(data(me, (2 + me, 3 - me), "float32", 8)))
        except Exception as err:  # noqa: BLE001 - the type and message are what the test checks
            errors[kind] = f"{type(err).__name__}: {str(err).strip().splitlines()[-1]}"
    np.savez(out_dir / f"rank{me}.npz", **got)
    (out_dir / f"rank{me}.json").write_text(json.dumps(errors))


def main() -> None:
    out_dir, mode = Path(sys.argv[1]), sys.argv[2]
    if mode in ("hang", "sigkill", "segfault", "os_exit", "fork_os_exit", "sys_exit", "all_os_exit"):  # no TVM import
        from mpi4py import MPI

        if MPI.COMM_WORLD.Get_rank() == 0 and mode == "fork_os_exit":
            import multiprocessing

            worker = multiprocessing.get_context("fork").Process(target=int)
            worker.start()
            worker.join()
        if MPI.COMM_WORLD.Get_rank() == 1 and mode != "all_os_exit":
            if mode == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
            if mode == "segfault":
                ctypes.string_at(0)
            if mode in ("os_exit", "fork_os_exit"):
                time.sleep(1 if mode == "fork_os_exit" else 0)  # after rank 0's worker
                os._exit(0)
            if mode == "sys_exit":
                sys.exit(0)
            time.sleep(600)
        MPI.COMM_WORLD.Barrier()
        (out_dir / f"rank{MPI.COMM_WORLD.Get_rank()}.passed").touch()
        if mode == "all_os_exit":
            os._exit(0)
        return

    import tvm
    import tvm_ffi
    from tvm import relax

    from tvm_combiners.collectives import runtime

    n, me = runtime.world_size(), runtime.rank()
    fn = {name: tvm_ffi.get_global_func(f"tvm_combiners.{name}")
          for name in ("allreduce", "allgather", "reduce_scatter", "send", "recv")}
    tensor, empty = tvm.runtime.tensor, tvm.runtime.empty

    if mode == "fail":
        if me == 1:
            fn["send"](tensor(np.zeros(2, "float32")), f"1,{n + 3}", 0, 0, empty((), "int32"))
        fn["recv"]("1,0", 0, 0, empty((2,), "float32"))
        return
    if mode == "shapes":
        shapes(out_dir, n, me)
        return
    if mode == "recv_first":  # every rank waits for its peer before sending: each must give up, not hang
        from mpi4py import MPI

        out = empty((2,), "float32")
        MPI.COMM_WORLD.Barrier()  # a rank reaching its recv 2 s after the other would find the send already there
        try:
            fn["recv"]("0,1;1,0", 3, 0, out)
        except Exception as err:  # noqa: BLE001 - the type and message are what the test checks
            (out_dir / f"rank{me}.json").write_text(json.dumps({"error": f"{type(err).__name__}: {err}"}))
        fn["send"](tensor(data(me, (2,), "float32", 3)), "0,1;1,0", 3, 0, empty((), "int32"))
        fn["recv"]("0,1;1,0", 3, 0, out)  # the late send arrives whole: the cancelled recv took nothing
        np.savez(out_dir / f"rank{me}.npz", out=out.numpy())
        return
    if mode == "mixed_check":  # TVM_COMBINERS_CHECK_COLLECTIVES on one rank only (a user's own mpiexec)
        from tvm_combiners.collectives.runtime import functions

        errors, got = {}, {}
        cases = [(0, 8, "float32"), (0, 256, "float32"), (0, 512, "float32"), (1, 8, "float32"), (1, 256, "float32"),
                 (0, 1, "float32"), (0, 3, "int8")]
        for channel, (sender, size, dtype) in enumerate(cases, start=6):
            functions._CHECK = me == 0  # rank 0 checks: as sender (channels 6-8, 11, 12), as receiver (9, 10)
            pairs = f"{sender},{1 - sender}"
            for attempt in ("mixed", "same"):  # then both plain: the channel must hold nothing left over
                if attempt == "same":
                    functions._CHECK = False
                if me == sender:
                    payload = data(me, (size,), dtype, 2 * channel + (attempt == "same"))
                    fn["send"](tensor(payload), pairs, channel, 0, empty((), "int32"))
                    continue
                out = empty((size,), dtype)
                try:
                    fn["recv"](pairs, channel, 0, out)
                    got[f"{channel}|{attempt}"] = out.numpy()
                except Exception as err:  # noqa: BLE001 - the type and message are what the test checks
                    errors[f"{channel}|{attempt}"] = f"{type(err).__name__}: {err}"
        np.savez(out_dir / f"rank{me}.npz", **got)
        (out_dir / f"rank{me}.json").write_text(json.dumps(errors))
        return
    if mode == "mismatch":  # rank 1 multiplies where the others sum: MPI takes it, silently (float max
        # is a user op since 2026-11-24, and MPICH aborts on one mixed with its own SUM: not silent);
        # then a send of (4, 2) meets a recv of (2, 4): the same bytes, so MPI takes that too
        got, errors = {}, {}
        # TVM's R.ccl.allreduce, served by the runtime, sums on rank 0 and multiplies on rank 1 too; then an
        # allgather whose group lists the ranks in another order on rank 1 (its blocks' order)
        bb = relax.BlockBuilder()
        xv = relax.Var("x", relax.TensorType((3,), "float32"))
        with bb.function("main", [xv]):
            bb.emit_func_output(bb.emit(relax.op.ccl.allreduce(xv, "prod" if me == 1 else "sum")))
        ccl = relax.VirtualMachine(tvm.compile(bb.get(), target="llvm"), tvm.cpu())
        calls = {"out": lambda out: fn["allreduce"](tensor(data(me, (3,), "float32", 1)), "prod" if me == 1 else "sum",
                                                    "", out),
                 "p2p": lambda out: (fn["send"](tensor(data(me, (4, 2), "float32", 2)), "0,1", 5, 0, empty((), "int32")),
                                     fn["recv"]("0,1", 5, 0, out)),
                 "ccl": lambda out: out.copyfrom(ccl["main"](tensor(data(me, (3,), "float32", 3)))),
                 "groups": lambda out: fn["allgather"](tensor(data(me, (2,), "float32", 4)), 0, "1,0" if me else "0,1", out)}
        for key, call in calls.items():
            out = empty({"p2p": (2, 4), "groups": (4,)}.get(key, (3,)), "float32")
            try:
                call(out)
                got[key] = out.numpy()
            except Exception as err:  # noqa: BLE001 - the message is what the test checks
                errors[key] = str(err).strip().splitlines()[-1]
        np.savez(out_dir / f"rank{me}.npz", **got)
        if errors:
            (out_dir / f"rank{me}.json").write_text(json.dumps(errors))
        return
    if mode == "cuda":  # needs a GPU: NCCL (one GPU per rank), or host-staged MPI where ranks share one
        from tvm_combiners.compile.host import rank_gpu

        dev = tvm.cuda(rank_gpu())
        got = {}
        for op in REDUCTIONS:
            out = empty((3, 4), "float32", dev)
            fn["allreduce"](tensor(data(me, (3, 4), "float32", 1), dev), op, "", out)
            got[f"allreduce|{op}"] = out.numpy()
        for op in ("min", "max"):  # a NaN on either rank is in both results (NCCL's own min/max drop it)
            out = empty((2,), "float32", dev)
            fn["allreduce"](tensor(np.array([np.nan, 1] if me == 0 else [5, np.nan], "float32"), dev), op, "", out)
            got[f"nan|{op}"] = out.numpy()
        out = empty((0, 4), "float32", dev)
        fn["allreduce"](tensor(np.zeros((0, 4), "float32"), dev), "sum", "", out)
        got["empty"] = out.numpy()
        out = empty((2, 4 * n), "float32", dev)
        fn["allgather"](tensor(data(me, (2, 4), "float32", 2), dev), 1, "", out)
        got["allgather"] = out.numpy()
        out = empty((12 // n, 2), "float32", dev)
        fn["reduce_scatter"](tensor(data(me, (12, 2), "float32", 3), dev), "sum", 0, "", out)
        got["reduce_scatter"] = out.numpy()
        fn["send"](tensor(data(me, (5,), "float32", 4), dev), "0,1;1,0", 1, 0, empty((), "int32"))
        out = empty((5,), "float32", dev)
        fn["recv"]("0,1;1,0", 1, 0, out)
        got["p2p"] = out.numpy()
        np.savez(out_dir / f"rank{me}.npz", **got)
        return

    got: dict[str, np.ndarray] = {}
    errors: dict[str, str] = {}
    salt = 0
    for groups in group_specs(n):
        mine = next(g for g in (groups.split(";") if groups else [""]) if not g or str(me) in g.split(","))
        size = len(mine.split(",")) if mine else n
        for dtype in ("float32", "int32", "float64", "float16"):
            for op in REDUCTIONS:
                if op == "avg" and "float" not in dtype:
                    continue
                for shape in ((3, 4), ()):
                    salt += 1
                    out = empty(shape, dtype)
                    fn["allreduce"](tensor(data(me, shape, dtype, salt)), op, groups, out)
                    got[f"allreduce|{groups}|{dtype}|{op}|{shape}|{salt}"] = out.numpy()
        for axis in (0, 1, 2, -1):
            salt += 1
            x = data(me, (2, 3, 4), "float32", salt)
            shape = list(x.shape)
            shape[axis] *= size
            out = empty(tuple(shape), "float32")
            fn["allgather"](tensor(x), axis, groups, out)
            got[f"allgather|{groups}|{axis}|{salt}"] = out.numpy()
        for axis in (0, 1, 2):
            for op in ("sum", "max", "avg"):
                salt += 1
                shape = [2, 3, 5]
                shape[axis] = 12  # divisible by every group size used here
                x = data(me, tuple(shape), "float32", salt)
                shape[axis] = 12 // size
                out = empty(tuple(shape), "float32")
                fn["reduce_scatter"](tensor(x), op, axis, groups, out)
                got[f"reduce_scatter|{groups}|{op}|{axis}|{salt}"] = out.numpy()

    # send / recv: every pattern sends first and receives after, with payloads big enough for the
    # rendezvous protocol, so a blocking send would deadlock every one of them.
    for channel, (kind, pairs) in enumerate(p2p_patterns(n).items(), start=1):
        salt += 1
        token = tensor(np.array(7, "int32"))
        fn["send"](tensor(data(me, BIG, "float32", salt)), pairs, channel, 0, token)
        got[f"token|{kind}"] = token.numpy()
        out = empty(BIG, "float32")
        fn["recv"](pairs, channel, 0, out)
        got[f"p2p|{kind}|{pairs}|{salt}"] = out.numpy()
    # two channels in flight, received in the opposite order of their sends
    pats = p2p_patterns(n)
    salt += 1
    fn["send"](tensor(data(me, BIG, "float32", salt)), pats["ring"], 20, 0, empty((), "int32"))
    fn["send"](tensor(data(me, (3,), "int32", salt)), pats["back"], 21, 0, empty((), "int32"))
    second, first = empty((3,), "int32"), empty(BIG, "float32")
    fn["recv"](pats["back"], 21, 0, second)
    fn["recv"](pats["ring"], 20, 0, first)
    got[f"p2p|ring|{pats['ring']}|{salt}"] = first.numpy()
    got[f"p2p|back|{pats['back']}|{salt}|int32"] = second.numpy()
    # the same channel twice: messages arrive in order
    salt += 1
    fn["send"](tensor(data(me, (4,), "float32", salt)), pats["swap"], 30, 0, empty((), "int32"))
    fn["send"](tensor(data(me, (4,), "float32", salt + 1)), pats["swap"], 30, 0, empty((), "int32"))
    for k in (0, 1):
        out = empty((4,), "float32")
        fn["recv"](pats["swap"], 30, 0, out)
        got[f"p2p|swap|{pats['swap']}|{salt + k}|small"] = out.numpy()
    salt += 1
    # a 0-d payload
    salt += 1
    fn["send"](tensor(data(me, (), "float64", salt)), pats["ring"], 31, 0, empty((), "int32"))
    out = empty((), "float64")
    fn["recv"](pats["ring"], 31, 0, out)
    got[f"p2p|ring|{pats['ring']}|{salt}|scalar"] = out.numpy()

    # errors, raised on every rank before any communication (so no rank waits)
    x = tensor(np.ones((4,), "float32"))
    bad = [
        ("allreduce_c4", lambda: fn["allreduce"](x, "sum", f"0;{n}", empty((4,), "float32"))),
        ("allgather_c4", lambda: fn["allgather"](x, 0, f"{n + 1}", empty((4,), "float32"))),
        ("reduce_scatter_c4", lambda: fn["reduce_scatter"](x, "sum", 0, f"0,{n}", empty((4,), "float32"))),
        ("send_c4", lambda: fn["send"](x, f"0,{n}", 0, 0, empty((), "int32"))),
        ("recv_c4", lambda: fn["recv"](f"{n},0", 0, 0, empty((4,), "float32"))),
        ("unknown_op", lambda: fn["allreduce"](x, "mean", "", empty((4,), "float32"))),
        ("missing_rank", lambda: fn["allreduce"](x, "sum", "0", empty((4,), "float32"))),
        ("int_avg", lambda: fn["allreduce"](tensor(np.ones(2, "int32")), "avg", "", empty((2,), "int32"))),
        ("scatter_divisible", lambda: fn["reduce_scatter"](tensor(np.ones(n + 1, "float32")), "sum", 0, "",
                                                          empty((1,), "float32"))),
        ("axis_range", lambda: fn["allgather"](x, 3, "", empty((4 * n,), "float32"))),
        ("c2", lambda: fn["send"](x, "0,1;0,1", 0, 0, empty((), "int32"))),
    ]
    for key, call in bad:
        try:
            call()
        except Exception as err:  # noqa: BLE001 - the message is what the test checks
            errors[key] = str(err).strip().splitlines()[-1]
        else:
            errors[key] = "no error"

    # host-staged path (what cuda tensors use where NCCL cannot run), driven here with host tensors
    from tvm_combiners.collectives.runtime import comm, nccl

    salt += 1
    x_np = data(me, (2, 6), "float32", salt)
    out = empty((2, 6), "float32")
    nccl.allreduce("staged", "", comm.group("", "staged"), tensor(x_np), "max", out)
    got[f"staged_allreduce|{salt}"] = out.numpy()
    out = empty((2, 6 * n), "float32")
    nccl.allgather("staged", "", comm.group("", "staged"), tensor(x_np), 1, out)
    got[f"staged_allgather|{salt}"] = out.numpy()

    # TVM's own R.ccl ops, compiled for llvm and run by the VM on this runtime
    salt += 1
    bb = relax.BlockBuilder()
    xv = relax.Var("x", relax.TensorType((4, 3), "float32"))
    with bb.function("main", [xv]):
        with bb.dataflow():
            outs = [bb.emit(relax.op.ccl.allreduce(xv, op)) for op in REDUCTIONS]
            outs.append(bb.emit(relax.op.ccl.allgather(xv, n)))
            outs.append(bb.emit(relax.op.ccl.broadcast_from_worker0(xv)))
            result = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(result)
    ex = tvm.compile(bb.get(), target="llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    res = vm["main"](tensor(data(me, (4, 3), "float32", salt)))
    for op, value in zip([*REDUCTIONS, "allgather", "broadcast"], res):
        got[f"ccl|{op}|{salt}"] = value.numpy()
    # in bfloat16, which numpy reads from DLPack only through ml_dtypes (saved as float32: exact here)
    bb = relax.BlockBuilder()
    xv = relax.Var("x", relax.TensorType((4, 3), "bfloat16"))
    with bb.function("main", [xv]):
        with bb.dataflow():
            outs = [bb.emit(relax.op.ccl.allreduce(xv, op)) for op in ("sum", "max")]
            outs.append(bb.emit(relax.op.ccl.allgather(xv, n)))
            result = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(result)
    vm = relax.VirtualMachine(tvm.compile(bb.get(), target="llvm"), tvm.cpu())
    res = vm["main"](tensor(data(me, (4, 3), "float32", salt).astype("bfloat16")))
    for op, value in zip(["sum", "max", "allgather"], res):
        got[f"ccl|{op}|{salt}|bfloat16"] = value.numpy().astype("float32")

    # a send still in flight when its rank finishes: completed at exit, not lost
    salt += 1
    fn["send"](tensor(data(me, BIG, "float32", salt)), "0,1", 40, 0, empty((), "int32"))
    if me == 1:
        time.sleep(0.5)  # rank 0 is past its last call by now
    out = empty(BIG, "float32")
    fn["recv"]("0,1", 40, 0, out)
    got[f"p2p|drain|0,1|{salt}"] = out.numpy()

    np.savez(out_dir / f"rank{me}.npz", **got)
    (out_dir / f"rank{me}.json").write_text(json.dumps(errors))


if __name__ == "__main__":
    main()
