"""Run on N ranks by tests/collectives/test_native_multirank.py: the native kernels against numpy.

``native_prog.py OUT_DIR all``: one Relax module with every op the kernels serve (dtypes, groups,
gathered and scattered axes that need a transpose, pairs with a rank that has no source, a 1 MiB
payload, a channel used twice, a 0-d and a symbolic payload), compiled for llvm and run three
ways on this rank: native (each kernel's calls counted), generic (``native.ENABLED`` off while it
compiles), and native-compiled but served by the generic functions under the kernels' names (a
module compiled in another process). Saves ``rank<R>.npz`` (the native results) and
``rank<R>.json`` (call counts, and whether the other two runs were bitwise equal).

``sizes``: a symbolic send whose ranks give 3, 4 and 5 elements to a recv of 4 (the byte count and
MPI's truncation, natively); errors go to ``rank<R>.json``. ``timeouts``: rank 1 calls nothing, so
rank 0's native recv times out (its small send completed eagerly), and then its 1 MiB send, never
taken, ends the job.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import tvm_combiners.collectives.runtime as rt

BIG = (512, 512)  # 1 MiB of float32: MPI's rendezvous protocol (the send completes only when received)


def data(rank: int, shape: tuple[int, ...], dtype: str, salt: int) -> np.ndarray:
    """Small integers (exact in every dtype, products too) that differ per rank and per case."""
    rng = np.random.default_rng([rank, salt])
    return rng.integers(1, 4, size=shape).astype(dtype)


def groups_for(n: int) -> list[list[list[int]]]:
    """Groups of equal size: every rank reversed, singletons, and (even n > 2) evens/odds reversed."""
    out = [[list(reversed(range(n)))], [[r] for r in range(n)]]
    if n % 2 == 0 and n > 2:
        out.append([list(reversed(range(0, n, 2))), list(reversed(range(1, n, 2)))])
    return out


def group_of(groups: list[list[int]], rank: int) -> list[int]:
    return next(g for g in groups if rank in g)


REDUCE: dict[str, Callable[[list[np.ndarray]], np.ndarray]] = {
    "sum": lambda xs: np.sum(xs, axis=0, dtype=xs[0].dtype),
    "prod": lambda xs: np.prod(xs, axis=0, dtype=xs[0].dtype),
    "min": lambda xs: np.min(xs, axis=0),
    "max": lambda xs: np.max(xs, axis=0),
    "avg": lambda xs: (np.sum(xs, axis=0, dtype=xs[0].dtype) / xs[0].dtype.type(len(xs))).astype(xs[0].dtype),
}
ALLREDUCE = [("int8", "sum"), ("uint64", "prod"), ("int16", "min"), ("int32", "max"), ("float32", "sum"),
             ("float64", "avg"), ("float32", "avg"), ("uint8", "max")]


def recv_expect(pairs: list[list[int]], payload: Callable[[int], np.ndarray], like: np.ndarray, rank: int) -> np.ndarray:
    sources = [s for s, t in pairs if t == rank]
    return payload(sources[0]) if sources else np.zeros_like(like)


class Case:
    """One result: how to build it (``build(C, params, emit)``), its inputs, and its value per rank."""

    def __init__(self, name: str, inputs: dict[str, tuple[tuple[int, ...], str]], build: Callable[..., Any],
                 expect: Callable[[list[dict[str, np.ndarray]], int], np.ndarray], native: dict[str, int]):
        self.name, self.inputs, self.build, self.expect, self.native = name, inputs, build, expect, native


def cases(n: int) -> list[Case]:
    out: list[Case] = []
    for dt, op in ALLREDUCE:
        key = f"ar_{dt}_{op}"
        out.append(Case(key, {key: ((3, 5), dt)}, lambda C, v, e, key=key, op=op: C.allreduce(v[key], op),
                        lambda ins, r, key=key, op=op: REDUCE[op]([x[key] for x in ins]), {"allreduce": 1}))
    for gi, groups in enumerate(groups_for(n)):
        for dt, op in (("float32", "avg"), ("int64", "sum")):
            key = f"arg{gi}_{dt}_{op}"
            out.append(Case(key, {key: ((4,), dt)}, lambda C, v, e, key=key, op=op, g=groups: C.allreduce(v[key], op, group=g),
                            lambda ins, r, key=key, op=op, g=groups: REDUCE[op]([ins[q][key] for q in group_of(g, r)]),
                            {"allreduce_group": 1}))
        size = len(groups[0])
        for axis, shape, dt in ((0, (2, 3), "float16"), (1, (2, 3), "int32"), (-1, (2, 1, 3), "int8"),
                                (1, (1, 2, 3), "uint8")):
            key = f"ag{gi}_{axis}_{dt}"
            out.append(Case(key, {key: (shape, dt)},
                            lambda C, v, e, key=key, axis=axis, g=groups: C.allgather(v[key], axis, group=g),
                            lambda ins, r, key=key, axis=axis, g=groups: np.concatenate([ins[q][key] for q in group_of(g, r)],
                                                                                       axis=axis),
                            {"allgather": 1}))
        for axis, op, dt in ((0, "sum", "float32"), (1, "max", "int16"), (2, "avg", "float64"), (0, "prod", "uint32")):
            shape = [2, 3, 2]
            shape[axis] = 2 * size
            key = f"rs{gi}_{axis}_{op}_{dt}"

            def expect(ins: list, r: int, key: str = key, axis: int = axis, op: str = op, g: list = groups) -> np.ndarray:
                members = group_of(g, r)
                total = REDUCE[op]([ins[q][key] for q in members])
                return np.split(total, len(members), axis=axis)[members.index(r)]

            out.append(Case(key, {key: (tuple(shape), dt)},
                            lambda C, v, e, key=key, axis=axis, op=op, g=groups: C.reduce_scatter(v[key], op, axis, group=g),
                            expect, {"reduce_scatter": 1}))
    # point to point: every recv built before its send (OrderSendRecv orders them)
    swap = [[i, i ^ 1] for i in range(n) if i ^ 1 < n]  # with n odd, the last rank takes no part
    ring = [[i, (i + 1) % n] for i in range(n)]
    back = [[i, (i - 1) % n] for i in range(n)]
    one_way = [[0, n - 1]]
    p2p = [("swap", swap, (4, 3), "float32"), ("ring", ring, BIG, "float32"), ("back", back, (5,), "int64"),
           ("one_way", one_way, (2, 2), "float16"), ("scalar", ring, (), "float64"), ("empty", [], (3,), "int32")]
    for channel, (name, pairs, shape, dt) in enumerate(p2p, start=1):
        key = f"p2p_{name}"

        def build(C: Any, v: dict, emit: Callable, key: str = key, pairs: list = pairs, shape: tuple = shape,
                  dt: str = dt, channel: int = channel) -> Any:
            got = emit(C.recv(shape, dt, pairs, channel_id=channel))
            emit(C.send(v[key], pairs, channel_id=channel))
            return got

        out.append(Case(key, {key: (shape, dt)}, build,
                        lambda ins, r, key=key, pairs=pairs: recv_expect(pairs, lambda s: ins[s][key], ins[r][key], r),
                        {"send": 1, "recv": 1}))

    def two_hops(C: Any, v: dict, emit: Callable) -> Any:
        """Channel 20 twice: the second send forwards what the first recv brought."""
        first = emit(C.recv((3,), "float32", ring, channel_id=20))
        emit(C.send(v["hops"], ring, channel_id=20))
        emit(C.send(first, ring, channel_id=20))
        return C.recv((3,), "float32", ring, channel_id=20)

    out.append(Case("hops", {"hops": ((3,), "float32")}, two_hops, lambda ins, r: ins[(r - 2) % n]["hops"],
                    {"send": 2, "recv": 2}))
    return out


def inputs(rank: int, n: int) -> dict[str, np.ndarray]:
    shapes = {k: v for c in cases(n) for k, v in c.inputs.items()}
    return {k: data(rank, shape, dt, salt) for salt, (k, (shape, dt)) in enumerate(sorted(shapes.items()))}


def expected(n: int, rank: int) -> dict[str, np.ndarray]:
    ins = [inputs(r, n) for r in range(n)]
    return {c.name: c.expect(ins, rank) for c in cases(n)}


def build(n: int) -> tuple[Any, list[str], list[str]]:
    """The module (one function, every case), its results' names, and its parameters' names."""
    from tvm import relax

    from tvm_combiners.collectives import relax as C

    specs = {k: v for c in cases(n) for k, v in c.inputs.items()}
    names = sorted(specs)
    params = {k: relax.Var(k, relax.TensorType(specs[k][0], specs[k][1])) for k in names}
    bb = relax.BlockBuilder()
    results = []
    with bb.function("main", [params[k] for k in names], pure=False):
        for case in cases(n):
            value = case.build(C, params, bb.emit)
            results.append(value if isinstance(value, relax.Var) else bb.emit(value))
        bb.emit_func_output(relax.Tuple(results))
    return bb.get(), [c.name for c in cases(n)], names


def compile_module(mod: Any) -> Any:
    import tvm

    from tvm_combiners.collectives import relax as C
    from tvm_combiners.compile.relax_runner import make_target

    target = make_target("llvm")
    return tvm.compile(mod, target=target, relax_pipeline=C.pipeline(target))


def counting(names: list[str]) -> dict[str, int]:
    """Wrap each registered function in ``names`` with a call counter (before a VM binds them)."""
    import tvm_ffi

    counts = dict.fromkeys(names, 0)

    def wrap(name: str, real: Any) -> Callable[..., Any]:
        def counted(*args: Any) -> Any:
            counts[name] += 1
            return real(*args)

        return counted

    for name in names:
        tvm_ffi.register_global_func(name, wrap(name, tvm_ffi.get_global_func(name)), override=True)
    return counts


def run(ex: Any, ins: dict[str, np.ndarray], order: list[str], results: list[str]) -> dict[str, np.ndarray]:
    import tvm
    from tvm import relax

    vm = relax.VirtualMachine(ex, tvm.cpu())
    outs = vm["main"](*(tvm.runtime.tensor(ins[k]) for k in order))
    return {name: outs[i].numpy() for i, name in enumerate(results)}


def same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> list[str]:
    """Names whose two results differ in dtype, shape or any bit."""
    return [k for k in a if a[k].dtype != b[k].dtype or a[k].shape != b[k].shape or a[k].tobytes() != b[k].tobytes()]


def run_all(out_dir: Path, n: int, me: int) -> None:
    import tvm_ffi

    from tvm_combiners.collectives.runtime import native

    assert native.prepare(), native._unavailable
    mod, results, order = build(n)
    ins = inputs(me, n)
    generic_names = [f"tvm_combiners.{k}" for k in ("allreduce", "allgather", "reduce_scatter", "send", "recv")]
    kernels = {name: tvm_ffi.get_global_func(name) for name in native.NAMES.values()}
    counts = counting([*native.NAMES.values(), *generic_names])
    got = run(compile_module(mod), ins, order, results)
    report: dict[str, Any] = {"native": {k: counts[v] for k, v in native.NAMES.items()},
                              "generic": sum(counts[g] for g in generic_names)}
    # the generic path for the same module (TVM_COMBINERS_NATIVE=0, or check mode)
    native.ENABLED = False
    try:
        generic_ex = compile_module(mod)
    finally:
        native.ENABLED = True
    report["generic_differs"] = same(got, run(generic_ex, ins, order, results))
    # a module compiled natively, run where the kernels are not built yet: the generic functions serve
    for kind, name in native.NAMES.items():
        tvm_ffi.register_global_func(name, native._GENERIC[kind], override=True)
    served = counting(list(native.NAMES.values()))
    report["fallback_differs"] = same(got, run(compile_module(mod), ins, order, results))
    report["fallback_calls"] = sum(served.values())
    for name, kernel in kernels.items():
        tvm_ffi.register_global_func(name, kernel, override=True)
    np.savez(out_dir / f"rank{me}.npz", **got)
    (out_dir / f"rank{me}.json").write_text(json.dumps(report))


def sizes(out_dir: Path, n: int, me: int) -> None:
    """A send of a symbolic extent: rank r gives 3 + r elements to a recv of 4 on the next rank."""
    import tvm
    from tvm import relax, tirx

    from tvm_combiners.collectives import relax as C

    k = tirx.Var("k", "int64")
    x = relax.Var("x", relax.TensorType((k,), "float32"))
    ring = [[i, (i + 1) % n] for i in range(n)]
    bb = relax.BlockBuilder()
    with bb.function("main", [x], pure=False):
        token = bb.emit(C.send(x, ring, channel_id=3))
        bb.emit_func_output(bb.emit(C.recv((4,), "float32", ring, channel_id=3, token=token)))
    ex = compile_module(bb.get())
    from tvm_combiners.collectives.runtime import native

    assert ("tvm_combiners.native.recv" in ex.as_text()) == native.ENABLED  # TVM_COMBINERS_NATIVE
    vm = relax.VirtualMachine(ex, tvm.cpu())
    errors, got = {}, {}
    try:
        got["out"] = vm["main"](tvm.runtime.tensor(data(me, (3 + me,), "float32", 1))).numpy()
    except Exception as err:  # noqa: BLE001 - the type and message are what the test checks
        errors["error"] = f"{type(err).__name__}: {str(err).strip()}"
    np.savez(out_dir / f"rank{me}.npz", **got)
    (out_dir / f"rank{me}.json").write_text(json.dumps(errors))


def timeouts(out_dir: Path, n: int, me: int) -> None:
    """Rank 1 calls nothing: rank 0's recv times out (its own small send completed eagerly) and says
    so; then its 1 MiB send, which rank 1 never takes, ends the job when the recv's timeout comes
    (MPI may still read the payload: raising would let the program free it)."""
    import tvm
    from mpi4py import MPI
    from tvm import relax

    from tvm_combiners.collectives import relax as C

    bb = relax.BlockBuilder()
    for name, shape, pairs, channel in (("small", (2,), [[0, 1], [1, 0]], 4), ("big", BIG, [[0, 1]], 5)):
        x = relax.Var("x", relax.TensorType(shape, "float32"))
        with bb.function(name, [x], pure=False):
            token = bb.emit(C.send(x, pairs, channel_id=channel))
            bb.emit_func_output(bb.emit(C.recv(shape, "float32", pairs, channel_id=channel, token=token)))
    vm = relax.VirtualMachine(compile_module(bb.get()), tvm.cpu())
    if me == 0:
        start = time.monotonic()
        try:
            vm["small"](tvm.runtime.tensor(np.ones((2,), "float32")))
        except Exception as err:  # noqa: BLE001 - the type and message are what the test checks
            error = f"{type(err).__name__}: {str(err).strip().splitlines()[0]}"
        (out_dir / "rank0.json").write_text(json.dumps({"small": error, "seconds": time.monotonic() - start}))
        payload = tvm.runtime.tensor(np.ones(BIG, "float32"))
        vm["big"](payload)  # ends the job
        raise AssertionError("the send nobody took went unnoticed")
    MPI.COMM_WORLD.Barrier()  # never passed: rank 0 ends the job


def main() -> None:
    out_dir, mode = Path(sys.argv[1]), sys.argv[2]
    from tvm_combiners.collectives import relax  # noqa: F401 - TVM first, then the runtime's registrations

    n, me = rt.world_size(), rt.rank()
    if mode == "timeouts":
        assert os.environ.get("TVM_COMBINERS_RECV_TIMEOUT") == "2"
    {"all": run_all, "sizes": sizes, "timeouts": timeouts}[mode](out_dir, n, me)


if __name__ == "__main__":
    main()
