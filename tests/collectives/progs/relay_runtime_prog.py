"""Run on N ranks in the Relay environment (TVM 0.16) by tests/relay/test_relay_runtime.py.

Compiled code reaches the runtime the two ways TVM 0.16 offers: ``te.extern`` + ``call_packed``
(the DLTensor handles Relay's lowering passes) for every ``tvm_combiners.*`` function, and TVM's own
``R.ccl`` ops in a Relax module (``runtime.disco.*`` overrides, called without ``in_group`` there).
Each rank saves what it got to ``<out>/rank<R>.npz``.  Usage: ``prog.py OUT_DIR``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np


def data(rank: int, shape: tuple[int, ...], dtype: str, salt: int) -> np.ndarray:
    return np.random.default_rng([rank, salt]).integers(1, 4, size=shape).astype(dtype)


def main() -> None:
    import tvm
    from tvm import relax, te

    from tvm_combiners.collectives import runtime

    out_dir = Path(sys.argv[1])
    n, me = runtime.world_size(), runtime.rank()
    target = tvm.target.Target("llvm -mtriple=x86_64-linux-gnu")
    got: dict[str, np.ndarray] = {}

    def extern(in_shape, in_dtype, out_shape, out_dtype, make_call):
        """A compiled function out = f(x) whose body is one call_packed (x may be absent)."""
        inputs = [te.placeholder(in_shape, in_dtype, name="x")] if in_shape is not None else []
        out = te.extern(out_shape, inputs, lambda ins, outs: make_call(*ins, outs[0]), name="out", dtype=out_dtype)
        sched = te.create_schedule(out.op)
        return tvm.build(sched, [*inputs, out], target=target)

    cases = [  # key, dtype, input shape, output shape, call
        ("allreduce_f16_max", "float16", (3, 4), (3, 4),
         lambda x, o: tvm.tir.call_packed("tvm_combiners.allreduce", x, "max", "", o)),
        ("allreduce_i8_sum", "int8", (5,), (5,), lambda x, o: tvm.tir.call_packed("tvm_combiners.allreduce", x, "sum", "", o)),
        ("allreduce_f64_avg_0d", "float64", (), (), lambda x, o: tvm.tir.call_packed("tvm_combiners.allreduce", x, "avg", "", o)),
        ("allgather_axis1", "int32", (2, 3), (2, 3 * n),
         lambda x, o: tvm.tir.call_packed("tvm_combiners.allgather", x, 1, "", o)),
        ("reduce_scatter_axis1", "float32", (2, 4 * n), (2, 4),
         lambda x, o: tvm.tir.call_packed("tvm_combiners.reduce_scatter", x, "sum", 1, "", o)),
    ]
    for salt, (key, dtype, in_shape, out_shape, call) in enumerate(cases):
        f = extern(in_shape, dtype, out_shape, dtype, call)
        out = tvm.nd.empty(out_shape, dtype)
        f(tvm.nd.array(data(me, in_shape, dtype, salt)), out)
        got[key] = out.numpy()
    ring = ";".join(f"{r},{(r + 1) % n}" for r in range(n))
    send = extern((6,), "int8", (), "int32", lambda x, o: tvm.tir.call_packed("tvm_combiners.send", x, ring, 3, 0, o))
    recv = extern(None, None, (6,), "int8", lambda o: tvm.tir.call_packed("tvm_combiners.recv", ring, 3, 0, o))
    token, out = tvm.nd.array(np.array(5, "int32")), tvm.nd.empty((6,), "int8")
    send(tvm.nd.array(data(me, (6,), "int8", 99)), token)  # sent before its recv is posted anywhere
    recv(out)
    got["ring_int8"], got["token"] = out.numpy(), token.numpy()

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorStructInfo((4, 3), "float32"))
    kinds = ("sum", "prod", "min", "max", "avg")
    with bb.function("main", [x]):
        with bb.dataflow():
            outs = [bb.emit(relax.op.ccl.allreduce(x, k)) for k in kinds]
            outs.append(bb.emit(relax.op.ccl.allgather(x, n)))
            outs.append(bb.emit(relax.op.ccl.broadcast_from_worker0(x)))
            result = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(result)
    vm = relax.VirtualMachine(relax.build(bb.get(), target), tvm.cpu())
    for key, value in zip([*kinds, "allgather", "broadcast"], vm["main"](tvm.nd.array(data(me, (4, 3), "float32", 7)))):
        got[f"ccl_{key}"] = value.numpy()
    np.savez(out_dir / f"rank{me}.npz", **got)


if __name__ == "__main__":
    main()
