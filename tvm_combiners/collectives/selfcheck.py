"""Run every collective op on N ranks through a compiled module and compare with numpy.

    tvm-combiners launch -n 4 -- python -m tvm_combiners.collectives.selfcheck --ir relax --out DIR

Each rank builds the same module (every reduction, groups, allgather and reduce_scatter on several
axes, send/recv as a pair swap, two rings in flight on two channels, partial pairs, a token chain,
a channel used twice, recvs placed before their sends in program order, every op in bfloat16, and
an allreduce whose result nobody uses), compiles it for llvm, runs it, checks its own results against numpy (so a
wrong rank ends the job with its error) and saves them to ``DIR/rank<R>.npz`` for the caller to
check again. The inputs depend only on the rank, so any process can compute every rank's
expected results with :func:`expected`.

bfloat16 results are compared and saved widened to float32, which holds every bfloat16 exactly:
numpy has no bfloat16 of its own (ml_dtypes supplies one, which ``np.savez`` cannot store).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

REDUCE = {
    "sum": lambda xs: np.sum(xs, axis=0),
    "prod": lambda xs: np.prod(xs, axis=0),
    "min": lambda xs: np.min(xs, axis=0),
    "max": lambda xs: np.max(xs, axis=0),
    "avg": lambda xs: np.sum(xs, axis=0) / len(xs),
}


NAN_DTYPES = ("float16", "bfloat16", "float32", "float64")
BFLOAT16 = np.dtype(ml_dtypes.bfloat16)


def widened(a: np.ndarray) -> np.ndarray:
    """``a`` as compared and saved: bfloat16 as float32 (exact), anything else as it is."""
    return a.astype("float32") if a.dtype == BFLOAT16 else a


def host_array(t: Any) -> np.ndarray:
    """A result tensor in numpy, :func:`widened`. TVM 0.16's ``numpy()`` hands bfloat16 over as its
    uint16 words (TVM 0.27's as ml_dtypes' bfloat16): the words are read back as bfloat16 first."""
    a = t.numpy()
    if str(t.dtype) == "bfloat16" and a.dtype != BFLOAT16:
        a = a.view(BFLOAT16)
    return widened(a)


def rounded(a: np.ndarray) -> np.ndarray:
    """A float32 result rounded to bfloat16 (to nearest even, as the runtime rounds), widened back."""
    return a.astype(BFLOAT16).astype("float32")


def inputs(rank: int) -> dict[str, np.ndarray]:
    """Rank-dependent inputs: small floats (products stay exact), ints, a (12, 2) and a (2, 12) tensor."""
    base = np.arange(24).reshape(4, 6)
    return {
        "f": ((base % 7 + 1) * (rank + 1) / 4).astype("float32"),
        "i": ((base * (rank + 2)) % 11 - 5).astype("int32"),
        "s": (np.arange(24).reshape(12, 2) + 100 * rank).astype("float32"),
        "t": (np.arange(24).reshape(2, 12) * (rank + 1)).astype("float32"),
        # a NaN at the rank's own position: min and max must propagate every rank's NaN (MPI's may not)
        **{f"nan_{dt}": np.where(np.arange(12) == rank, np.nan, np.arange(12) % 5 - rank).astype(dt)
           for dt in NAN_DTYPES},
        "big_float16": np.full(12, 40000.0, "float16"),  # the mean fits float16, the sum does not
        # 8 significant bits, bfloat16's all: a sum over ranks needs more, so its rounding shows
        "bf": ((base.reshape(12, 2) % 5 + 1) * (1 + (rank + 1) / 128)).astype(BFLOAT16),
    }


def groups_for(n: int) -> list[list[int]]:
    """Replica groups that exercise order and partition: evens/odds, else all ranks reversed."""
    if n % 2 == 0 and n > 2:
        return [list(range(0, n, 2)), list(range(1, n, 2))]
    return [list(reversed(range(n)))]


def swap_pairs(n: int) -> list[list[int]]:
    return [[i, i ^ 1] for i in range(n) if i ^ 1 < n]  # with n odd the last rank takes no part


def ring(n: int, step: int) -> list[list[int]]:
    return [[i, (i + step) % n] for i in range(n)]


@dataclass(frozen=True)
class Case:
    """One output: how to build it with an IR's builders, and its numpy value per rank."""

    name: str
    build: Callable[[Any, dict[str, Any], dict[str, Any]], Any]
    expect: Callable[[list[dict[str, np.ndarray]], int], np.ndarray]


def _group_of(groups: list[list[int]], rank: int) -> list[int]:
    return next(g for g in groups if rank in g)


def _recv_expect(pairs: list[list[int]], payload: Callable[[int], np.ndarray], like: np.ndarray, rank: int) -> np.ndarray:
    sources = [s for s, t in pairs if t == rank]
    return payload(sources[0]) if sources else np.zeros_like(like)


def cases(n: int) -> list[Case]:
    g = groups_for(n)
    singles = [[r] for r in range(n)]
    out: list[Case] = []
    for op in ("sum", "prod", "min", "max", "avg"):
        out.append(
            Case(f"allreduce_{op}", lambda C, v, T, op=op: C.allreduce(v["f"], op), lambda ins, r, op=op: REDUCE[op]([x["f"] for x in ins]))
        )
    for op in ("sum", "prod", "min", "max"):
        out.append(
            Case(
                f"allreduce_int_{op}",
                lambda C, v, T, op=op: C.allreduce(v["i"], op),
                lambda ins, r, op=op: REDUCE[op]([x["i"] for x in ins]).astype("int32"),
            )
        )
    for dt in NAN_DTYPES:
        for op in ("min", "max"):
            out.append(Case(f"allreduce_nan_{op}_{dt}", lambda C, v, T, op=op, dt=dt: C.allreduce(v[f"nan_{dt}"], op),
                            lambda ins, r, op=op, dt=dt: REDUCE[op]([x[f"nan_{dt}"] for x in ins])))
    out += [
        Case("reduce_scatter_nan_max_float32",
             lambda C, v, T: C.reduce_scatter(v["nan_float32"], "max", 0, world_size=n),
             lambda ins, r: np.split(REDUCE["max"]([x["nan_float32"] for x in ins]), n)[r]),
        Case("allreduce_avg_big_float16", lambda C, v, T: C.allreduce(v["big_float16"], "avg"),
             lambda ins, r: (np.sum([x["big_float16"].astype("float32") for x in ins], axis=0) / n).astype("float16")),
        Case(
            "allreduce_groups_sum",
            lambda C, v, T: C.allreduce(v["f"], "sum", group=g),
            lambda ins, r: REDUCE["sum"]([ins[q]["f"] for q in _group_of(g, r)]),
        ),
        Case("allreduce_singletons_max", lambda C, v, T: C.allreduce(v["i"], "max", group=singles), lambda ins, r: ins[r]["i"]),
        Case(
            "allgather_axis0",
            lambda C, v, T: C.allgather(v["f"], 0, world_size=n),
            lambda ins, r: np.concatenate([x["f"] for x in ins], axis=0),
        ),
        Case(
            "allgather_axis1_groups",
            lambda C, v, T: C.allgather(v["i"], axis=-1, group=g),
            lambda ins, r: np.concatenate([ins[q]["i"] for q in _group_of(g, r)], axis=1),
        ),
        Case(
            "reduce_scatter_sum",
            lambda C, v, T: C.reduce_scatter(v["s"], "sum", 0, world_size=n),
            lambda ins, r: np.split(REDUCE["sum"]([x["s"] for x in ins]), n, axis=0)[r],
        ),
        Case(
            "reduce_scatter_max_groups",
            lambda C, v, T: C.reduce_scatter(v["s"], "max", 0, group=g),
            lambda ins, r: np.split(REDUCE["max"]([ins[q]["s"] for q in _group_of(g, r)]), len(g[0]), axis=0)[
                _group_of(g, r).index(r)
            ],
        ),
        Case(
            "reduce_scatter_avg_axis1",
            lambda C, v, T: C.reduce_scatter(v["t"], "avg", 1, world_size=n),
            lambda ins, r: np.split(REDUCE["avg"]([x["t"] for x in ins]), n, axis=1)[r],
        ),
    ]
    out += bfloat16_cases(n)
    # Point to point. Every recv is built (placed) before its send: OrderSendRecv must fix the order.
    swap, fwd, back, part = swap_pairs(n), ring(n, 1), ring(n, -1), [[0, n - 1]]

    def p2p(C: Any, v: dict[str, Any], T: dict[str, Any]) -> None:
        T["swap"] = C.recv((4, 6), "float32", swap, channel_id=0)
        T["ring_fwd"] = C.recv((4, 6), "int32", fwd, channel_id=1)
        T["ring_back"] = C.recv((12, 2), "float32", back, channel_id=2)
        T["partial"] = C.recv((4, 6), "float32", part, channel_id=3)
        T["sends"] = [
            C.send(v["f"], swap, channel_id=0),
            C.send(v["i"], fwd, channel_id=1),
            C.send(v["s"], back, channel_id=2),
            C.send(v["f"], part, channel_id=3),
        ]

    out += [
        Case("swap", lambda C, v, T: T["swap"], lambda ins, r: _recv_expect(swap, lambda s: ins[s]["f"], ins[r]["f"], r)),
        Case("ring_fwd", lambda C, v, T: T["ring_fwd"], lambda ins, r: _recv_expect(fwd, lambda s: ins[s]["i"], ins[r]["i"], r)),
        Case("ring_back", lambda C, v, T: T["ring_back"], lambda ins, r: _recv_expect(back, lambda s: ins[s]["s"], ins[r]["s"], r)),
        Case("partial", lambda C, v, T: T["partial"], lambda ins, r: _recv_expect(part, lambda s: ins[s]["f"], ins[r]["f"], r)),
    ]

    def two_hops(ins: list[dict[str, np.ndarray]], r: int) -> np.ndarray:
        return ins[(r - 2) % n]["t"]

    def chained(C: Any, v: dict[str, Any], T: dict[str, Any]) -> Any:
        # channel 5 twice: the second send forwards what the first recv brought (ordered by data)
        first = C.recv((2, 12), "float32", fwd, channel_id=5)
        t1 = C.send(v["t"], fwd, channel_id=5)
        first = T["emit"](first)
        T["sends"].append(T["emit"](t1))
        t2 = T["emit"](C.send(first, fwd, channel_id=5))
        T["sends"].append(t2)
        return C.recv((2, 12), "float32", fwd, channel_id=5, token=t2)

    out.append(Case("two_hops", chained, two_hops))
    out.insert(0, Case("_p2p", lambda C, v, T: p2p(C, v, T), lambda ins, r: np.zeros(0)))
    return out


def bfloat16_cases(n: int) -> list[Case]:
    """Every op in bfloat16: reductions in float32, rounded once (sum and avg need more than
    bfloat16's 8 significant bits here), gathers and transfers moving 2-byte words unchanged."""

    def wide(ins: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
        return [x["bf"].astype("float32") for x in ins]

    fwd = ring(n, 1)
    out = [Case(f"allreduce_bf16_{op}", lambda C, v, T, op=op: C.allreduce(v["bf"], op),
                lambda ins, r, op=op: rounded(REDUCE[op](wide(ins)).astype("float32")))
           for op in ("sum", "prod", "min", "max", "avg")]
    return out + [
        Case("allgather_bf16_axis1", lambda C, v, T: C.allgather(v["bf"], 1, world_size=n),
             lambda ins, r: np.concatenate(wide(ins), axis=1)),
        Case("reduce_scatter_bf16_avg", lambda C, v, T: C.reduce_scatter(v["bf"], "avg", 0, world_size=n),
             lambda ins, r: np.split(rounded(REDUCE["avg"](wide(ins)).astype("float32")), n)[r]),
        Case("ring_bf16", lambda C, v, T: T["emit"](C.recv((12, 2), "bfloat16", fwd, channel_id=7,
                                                           token=T["emit"](C.send(v["bf"], fwd, channel_id=7)))),
             lambda ins, r: wide(ins)[(r - 1) % n]),
    ]


def expected(n: int, rank: int) -> dict[str, np.ndarray]:
    ins = [inputs(r) for r in range(n)]
    return {c.name: widened(c.expect(ins, rank)) for c in cases(n) if not c.name.startswith("_")}


def _count_calls(names: list[str], register: Callable[..., Any], get: Callable[[str], Any]) -> list[int]:
    """One counter over every runtime function an op may lower to."""
    count = [0]

    def counting(real: Any) -> Callable[..., Any]:
        def counted(*args: Any) -> Any:
            count[0] += 1
            return real(*args)

        return counted

    for name in names:
        register(name, counting(get(name)))
    return count


def run_relax(n: int, rank: int) -> tuple[dict[str, np.ndarray], int]:
    import tvm
    import tvm_ffi
    from tvm import relax

    from ..compile.relax_runner import make_target as make_relax_target
    from . import relax as C
    from . import runtime  # noqa: F401 - registers the packed functions
    from .runtime import native

    native.prepare()  # the kernels exist before they are wrapped: host allreduces lower to them
    count = _count_calls(["tvm_combiners.allreduce", native.NAMES["allreduce"], native.NAMES["allreduce_group"]],
                         lambda k, f: tvm_ffi.register_global_func(k, f, override=True), tvm.get_global_func)
    ins = inputs(rank)
    bb = relax.BlockBuilder()
    params = {k: relax.Var(k, relax.TensorType(v.shape, str(v.dtype))) for k, v in ins.items()}
    names: list[str] = []
    with bb.function("main", list(params.values()), pure=False):
        T: dict[str, Any] = {"emit": bb.emit}
        results = []
        for case in cases(n):
            value = case.build(C, params, T)
            if case.name == "_p2p":
                for key in ("swap", "ring_fwd", "ring_back", "partial"):
                    T[key] = bb.emit(T[key])
                T["sends"] = [bb.emit(s) for s in T["sends"]]
                continue
            results.append(bb.emit(value) if not isinstance(value, relax.Var) else value)
            names.append(case.name)
        bb.emit(C.allreduce(params["f"], "max"))  # unused: must still run on every rank
        bb.emit(C.after_all(*T["sends"]))
        bb.emit_func_output(relax.Tuple(results))
    mod = bb.get()
    target = make_relax_target("llvm")
    ex = tvm.compile(mod, target=target, relax_pipeline=C.pipeline(target))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    outs = vm["main"](*(tvm.runtime.tensor(ins[k]) for k in params))
    return {name: host_array(outs[i]) for i, name in enumerate(names)}, count[0]


def run_relay(n: int, rank: int) -> tuple[dict[str, np.ndarray], int]:
    import tvm
    from tvm import relay
    from tvm.contrib import graph_executor

    from ..compile.relay_runner import make_target as make_relay_target
    from . import relay as C
    from . import runtime  # noqa: F401 - registers the packed functions
    from .spec import bfloat16_words_function

    count = _count_calls(["tvm_combiners.allreduce", bfloat16_words_function("allreduce")],
                         lambda k, f: tvm.register_func(k, f, override=True), tvm.get_global_func)
    ins = inputs(rank)
    params = {k: relay.var(k, shape=v.shape, dtype=str(v.dtype)) for k, v in ins.items()}
    T: dict[str, Any] = {"emit": lambda e: e}
    names, results = [], []
    for case in cases(n):
        value = case.build(C, params, T)
        if case.name != "_p2p":
            names.append(case.name)
            results.append(value)
    unused = C.allreduce(params["f"], "max")  # in the output tuple, read by nobody
    results += [C.after_all(*T["sends"]), unused]
    mod = tvm.IRModule.from_expr(relay.Function(list(params.values()), relay.Tuple(results)))
    mod = C.OrderSendRecv()(mod)
    target = make_relay_target("llvm")  # this CPU, x86-64 triple
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(mod, target=target)
    gmod = graph_executor.GraphModule(lib["default"](tvm.cpu()))
    for k, v in ins.items():
        gmod.set_input(k, v)
    gmod.run()
    graph = {name: host_array(gmod.get_output(i)) for i, name in enumerate(names)}
    vm = relay.create_executor("vm", mod=mod, target=target, device=tvm.cpu()).evaluate()
    vm_outs = vm(*(ins[k] for k in params))
    for i, name in enumerate(names):
        graph[name + "@vm"] = host_array(vm_outs[i])
    return graph, count[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ir", choices=("relax", "relay"), default="relax")
    parser.add_argument("--out", default=None, help="folder for rank<R>.npz")
    args = parser.parse_args(argv)
    # TVM (and its disco library) loads before the runtime overrides TVM's R.ccl built-ins
    importlib.import_module(f"{__package__}.{args.ir}")
    from .runtime import rank as get_rank
    from .runtime import world_size

    rank, n = get_rank(), world_size()
    got, calls = (run_relax if args.ir == "relax" else run_relay)(n, rank)
    want = expected(n, rank)
    n_allreduce = sum(name.startswith("allreduce") for name in want) + 1  # + the unused one
    runs = 1 if args.ir == "relax" else 2  # Relay: graph executor and VM
    bad = []
    for name, value in got.items():
        ref = want[name.split("@")[0]]
        if value.shape != ref.shape or value.dtype != ref.dtype or not np.allclose(value, ref, rtol=1e-6, atol=1e-6, equal_nan=True):
            bad.append(f"{name}: got {value.dtype}{value.shape} {value.ravel()[:6]}, want {ref.dtype}{ref.shape} {ref.ravel()[:6]}")
    if calls != n_allreduce * runs:
        bad.append(f"allreduce ran {calls} times, expected {n_allreduce * runs} (one is unused and must still run)")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        np.savez(os.path.join(args.out, f"rank{rank}.npz"), _allreduce_calls=np.array(calls), **got)
    if bad:
        raise AssertionError(f"selfcheck {args.ir} rank {rank} of {n}: " + "; ".join(bad))
    print(f"selfcheck {args.ir} rank {rank} of {n}: {len(got)} results equal numpy", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
