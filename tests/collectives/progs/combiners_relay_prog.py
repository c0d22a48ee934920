"""Run on N ranks by tests/relay/test_relay_collective_combiners.py (Relay environment).

Builds Relay functions full of collectives and sends/recvs for this world size, compiles them
before and after every combiner pass (graph executor, opt_level 3, so packing fuses), runs them
on this rank and requires bitwise-equal results; a few are also checked against numpy. Writes
``<out>/rank<R>.json`` with the number of checks. Usage: ``combiners_relay_prog.py OUT_DIR [branches]``
(``branches``: only the if/else case, on the Relay VM).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import tvm
from tvm import relay
from tvm.contrib import graph_executor

import tvm_combiners.collectives.runtime as rt
from tvm_combiners.collectives import relay as C
from tvm_combiners.collectives.relay import combiners as CB

TARGET = tvm.target.Target("llvm -mtriple=x86_64-linux-gnu")


def data(rank: int, shape: tuple[int, ...], dtype: str, salt: int) -> np.ndarray:
    rng = np.random.default_rng([rank, salt])
    return rng.integers(1, 4, size=shape).astype(dtype)


def collectives(n: int):
    params = [((4, 6), "float32"), ((5,), "float32"), ((2, 3 * n, 4), "float32"), ((3, 2 * n), "int32"), ((2 * n, 3 * n), "float32")]
    xs = [relay.var(f"x{i}", shape=s, dtype=d) for i, (s, d) in enumerate(params)]
    every, back = [list(range(n))], [list(reversed(range(n)))]
    a = C.allreduce(xs[0])
    outs = [a, C.allreduce(xs[1]), C.allreduce(relay.add(a, relay.const(1.0))), C.allreduce(xs[2])]
    outs += [C.allreduce(xs[3], "max"), C.allreduce(xs[3], "min"), C.allreduce(xs[3], "max")]
    outs += [C.allgather(xs[0], axis=1, group=every), C.allgather(xs[2], axis=1, group=every),
             C.allgather(xs[2], axis=2, group=back), C.allgather(xs[4], axis=0, group=back), C.allgather(xs[1], 0, every)]
    outs += [C.reduce_scatter(xs[2], axis=1, group=every), C.reduce_scatter(xs[4], axis=0, group=every),
             C.reduce_scatter(xs[4], axis=1, group=every), C.reduce_scatter(xs[3], "max", axis=1, group=back),
             C.reduce_scatter(xs[3], "max", axis=1, group=back)]
    return xs, params, relay.Tuple(outs)


def p2p(n: int):
    params = [((4, 6), "float32"), ((3,), "float32"), ((2, 2), "int32"), ((5,), "int32")]
    xs = [relay.var(f"x{i}", shape=s, dtype=d) for i, (s, d) in enumerate(params)]
    ring = [[r, (r + 1) % n] for r in range(n)]
    partial = [[0, n - 1]]
    r1 = C.recv((4, 6), "float32", ring, channel_id=1, token=C.send(xs[0], ring, channel_id=1))
    r2 = C.recv((3,), "float32", ring, channel_id=2, token=C.send(xs[1], ring, channel_id=2))
    r3 = C.recv((2, 2), "int32", partial, channel_id=3, token=C.send(xs[2], partial, channel_id=3))
    r4 = C.recv((5,), "int32", partial, channel_id=4, token=C.send(xs[3], partial, channel_id=4))
    hop = C.send(relay.add(r1, relay.const(1.0)), ring, channel_id=5)
    r5 = C.recv((4, 6), "float32", ring, channel_id=5, token=hop)
    return xs, params, relay.Tuple([r1, r2, r3, r4, r5])


PASSES = {
    "allreduce": lambda: CB.AllReduceCombiner(),
    "allgather": lambda: CB.AllGatherCombiner(combine_by_dim=False),
    "reduce_scatter": lambda: CB.ReduceScatterCombiner(),
    "send_recv": lambda: CB.SendRecvCombiner(),
    "all": lambda: CB.CombineCollectives(),
    "all_any_dim": lambda: CB.CombineCollectives(combine_by_dim=False),
    "small": lambda: CB.CombineCollectives(threshold_bytes=200, threshold_count=2),
}
CASES = {"collectives": (collectives, ("allreduce", "allgather", "reduce_scatter", "all", "all_any_dim", "small")),
         "p2p": (p2p, ("send_recv", "all", "small"))}


def branches_module() -> tuple[tvm.IRModule, list[relay.Var]]:
    """``(if c then allreduce(x) else allreduce(y), allreduce(z), allreduce(w))``."""
    c = relay.var("c", shape=(), dtype="bool")
    xs = [relay.var(n, shape=(3,), dtype="float32") for n in ("x", "y", "z", "w")]
    body = relay.Tuple([relay.If(c, C.allreduce(xs[0]), C.allreduce(xs[1])), C.allreduce(xs[2]), C.allreduce(xs[3])])
    params = [c, *xs]
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function(params, body))), params


def branches_inputs(rank: int, cond: bool) -> list[np.ndarray]:
    return [np.array(cond), *(np.full(3, (k + 1) * 10 ** k * (rank + 1), "float32") for k in range(4))]


def run_vm(mod: tvm.IRModule, args: list[np.ndarray]) -> list[np.ndarray]:
    with tvm.transform.PassContext(opt_level=3):
        exe = relay.vm.compile(C.OrderSendRecv()(mod), target=TARGET)
    out = tvm.runtime.vm.VirtualMachine(exe, tvm.cpu()).invoke("main", *[tvm.nd.array(a) for a in args])
    return [o.numpy() for o in out]


def branches(n: int, rank: int) -> int:
    """Collectives in if branches under a uniform and a rank-dependent condition, before and after
    the combiners, against numpy: a branch's allreduce must never be merged with one outside it."""
    mod, _ = branches_module()
    checks = 0
    for cond_of in (lambda r: True, lambda r: r == 0):
        ins = [branches_inputs(r, cond_of(r)) for r in range(n)]
        want = [sum(a[1] if a[0] else a[2] for a in ins), sum(a[3] for a in ins), sum(a[4] for a in ins)]
        for m in (mod, CB.AllReduceCombiner()(mod), CB.CombineCollectives()(mod), CB.AllReduceCombiner(threshold_count=2)(mod)):
            got = run_vm(m, ins[rank])
            for g, w in zip(got, want, strict=True):
                np.testing.assert_array_equal(g, w.astype("float32"), err_msg=f"rank {rank} branches")
            checks += 1
    return checks


def run(mod: tvm.IRModule, args: list[np.ndarray]) -> list[np.ndarray]:
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(C.OrderSendRecv()(mod), target=TARGET)
    g = graph_executor.GraphModule(lib["default"](tvm.cpu()))
    for i, a in enumerate(args):
        g.set_input(f"x{i}", a)
    g.run()
    return [g.get_output(i).numpy() for i in range(g.get_num_outputs())]


def main(out: Path, only: str | None = None) -> None:
    n, rank = rt.world_size(), rt.rank()
    if only == "branches":
        (out / f"rank{rank}.json").write_text(json.dumps({"rank": rank, "world_size": n, "checks": branches(n, rank)}))
        return
    checks = branches(n, rank)
    for name, (build, passes) in CASES.items():
        xs, params, body = build(n)
        mod = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function(xs, body)))
        inputs = [[data(r, s, d, i) for i, (s, d) in enumerate(params)] for r in range(n)]
        want = run(mod, inputs[rank])
        for pass_name in passes:
            got = run(PASSES[pass_name]()(mod), inputs[rank])
            assert len(got) == len(want)
            for i, (a, b) in enumerate(zip(want, got)):
                assert a.dtype == b.dtype and a.shape == b.shape, (name, pass_name, i)
                np.testing.assert_array_equal(b, a, err_msg=f"rank {rank} case {name} pass {pass_name} output {i}")
                checks += 1
        if name == "collectives":
            np.testing.assert_array_equal(want[7], np.concatenate([x[0] for x in inputs], axis=1))
            np.testing.assert_array_equal(want[12], sum(x[2] for x in inputs)[:, 3 * rank : 3 * rank + 3, :])
            checks += 2
        else:
            np.testing.assert_array_equal(want[0], inputs[(rank - 1) % n][0])
            checks += 1
    (out / f"rank{rank}.json").write_text(json.dumps({"rank": rank, "world_size": n, "checks": checks}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else None)
