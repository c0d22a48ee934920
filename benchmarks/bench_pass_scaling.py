"""How our pass time grows with graph size: 4x more work should cost about 4x more time.

    .venv/bin/python benchmarks/bench_pass_scaling.py [--sizes 100,400] [--ir relax|relay|both]

Two shapes (issue 8, item 5): one input read by N sibling branches of 20 followers each, and N
layers of three sibling matmuls (QKV-like) chained through their sum. Each row is timed in the
same run; the ratio column divides by the row with the smallest N of that shape.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYTHONS = {"relax": ROOT / ".venv" / "bin" / "python", "relay": ROOT / ".venv-relay" / "bin" / "python"}
FOLLOWERS = 20


def relax_module(shape: str, n: int):
    from tvm import relax

    R = relax.op
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 8), "float32"))
    w = relax.Var("w", relax.TensorType((8, 8), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            if shape == "siblings":
                outs = []
                for _ in range(n):
                    y = bb.emit(R.matmul(x, w))
                    for _ in range(FOLLOWERS):
                        y = bb.emit(R.nn.relu(y))
                    outs.append(y)
                out = bb.emit_output(relax.Tuple(outs))
            else:
                h = x
                for _ in range(n):
                    q, k, v = (bb.emit(R.matmul(h, w)) for _ in range(3))
                    h = bb.emit(R.add(R.add(q, k), v))
                out = bb.emit_output(h)
        bb.emit_func_output(out)
    return bb.get()


def relay_module(shape: str, n: int):
    import tvm
    from tvm import relay

    x, w = relay.var("x", shape=(2, 8)), relay.var("w", shape=(8, 8))
    if shape == "siblings":
        outs = []
        for _ in range(n):
            y = relay.nn.dense(x, w)
            for _ in range(FOLLOWERS):
                y = relay.nn.relu(y)
            outs.append(y)
        body = relay.Tuple(outs)
    else:
        body = x
        for _ in range(n):
            q, k, v = (relay.nn.dense(body, w) for _ in range(3))
            body = relay.add(relay.add(q, k), v)
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x, w], body)))


def measure(ir: str, shape: str, n: int) -> dict:
    """In this process: build, run our pass, count ops."""
    if ir == "relax":
        from tvm_combiners.relax import CombineParallelOps
        from tvm_combiners.relax.runner import count_ops

        mod, op = relax_module(shape, n), "matmul"
    else:
        from tvm_combiners.relay import CombineParallelOps
        from tvm_combiners.relay.runner import count_ops

        mod, op = relay_module(shape, n), "nn.dense"
    start = time.process_time()  # CPU time: other processes on a busy machine do not count
    new = CombineParallelOps()(mod)
    seconds = time.process_time() - start
    return {"ir": ir, "shape": shape, "n": n, "seconds": seconds, "before": count_ops(mod)[op],
            "after": count_ops(new)[op]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="200,800")
    parser.add_argument("--ir", choices=["relax", "relay", "both"], default="both")
    parser.add_argument("--one", nargs=3, metavar=("IR", "SHAPE", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        ir, shape, n = args.one
        print(json.dumps(measure(ir, shape, int(n))))
        return
    irs = ["relax", "relay"] if args.ir == "both" else [args.ir]
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    for ir in irs:
        if not PYTHONS[ir].exists():
            continue
        for shape in ("siblings", "layers"):
            for n in sizes:
                proc = subprocess.run([str(PYTHONS[ir]), __file__, "--one", ir, shape, str(n)], capture_output=True,
                                      text=True)
                if proc.returncode != 0:
                    print(f"# {ir} {shape} {n}: failed: {proc.stderr.strip()[-300:]}", file=sys.stderr)
                    continue
                rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    print(f"{'ir':6} {'shape':9} {'N':>6} {'ops before':>10} {'after':>6} {'cpu s':>8} {'x work':>6} {'x time':>6}")
    for r in rows:
        base = next(b for b in rows if b["ir"] == r["ir"] and b["shape"] == r["shape"])
        print(f"{r['ir']:6} {r['shape']:9} {r['n']:>6} {r['before']:>10} {r['after']:>6} {r['seconds']:>8.2f} "
              f"{r['n'] / base['n']:>6.1f} {r['seconds'] / base['seconds']:>6.2f}")


if __name__ == "__main__":
    main()
