"""Parameter memory per rank of a tensor-parallel MLP: full-size inputs vs each rank's local shards.

    .venv/bin/python benchmarks/bench_distributed.py [--hidden 1024] [--width 256] [--ranks 1 2]

The MLP of tests/collectives (x @ w1, gelu, hidden layer split by columns over a mesh of as many
workers as ranks, @ w2) is compiled with ``distributed_pipeline`` twice: as LowerDistIR leaves it
(every rank passes full-size parameters, worker 0's are broadcast or scattered, each rank then
also holds the copy it received) and with ``local_shards=True`` (each rank passes its own shard,
cut by ``shard_inputs``). Each rank counts the bytes of the parameter tensors it holds and checks
its result against numpy (error relative to the largest output); the table shows the largest count over the ranks.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def worker(out_dir: Path, hidden: int, width: int, batch: int, repeat: int) -> None:
    """One rank: compile both forms, run them, save bytes held, error and time per call."""
    import numpy as np
    import tvm
    from tvm import relax

    sys.path.insert(0, str(ROOT / "tests" / "collectives" / "progs"))
    from disco_combine_prog import mlp_inputs, mlp_module

    from tvm_combiners.collectives.relax.distributed import distributed_pipeline, shard_inputs
    from tvm_combiners.collectives.runtime import rank, world_size

    me, n = rank(), world_size()
    target = tvm.target.Target({"kind": "llvm"})
    mod, xs = mlp_module(hidden, n, batch, width), mlp_inputs(hidden, batch, width)
    x, w1, w2 = (a.astype(np.float64) for a in xs)
    h = x @ w1
    want = (0.5 * h * (1 + np.vectorize(math.erf)(h / math.sqrt(2)))) @ w2  # gelu, as TVM legalizes it
    plan = shard_inputs(mod, target)
    shards = plan.inputs["main"]
    rows = {}
    for mode, local in (("full", False), ("local shards", True)):
        ex = tvm.compile(mod, target, relax_pipeline=distributed_pipeline(target, local_shards=local))
        vm = relax.VirtualMachine(ex, tvm.cpu())
        arrays = plan.local_inputs("main", xs, me) if local else xs
        args = [tvm.runtime.tensor(a) for a in arrays]
        passed = sum(a.nbytes for a in arrays)
        received = 0 if local else sum(s.local_bytes for s in shards)  # the broadcast / scattered copies
        y = vm["main"](*args).numpy()
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            vm["main"](*args)
            times.append(time.perf_counter() - start)
        rows[mode] = {"passed": passed, "received": received, "error": float(np.abs(y - want).max() / np.abs(want).max()),
                      "ms": 1e3 * sorted(times)[len(times) // 2]}
    (out_dir / f"rank{me}.json").write_text(json.dumps(rows))


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)  # a rank of a launch below
    args = parser.parse_args()
    if args.worker is not None:
        worker(args.worker, args.hidden, args.width, args.batch, args.repeat)
        return
    from tvm_combiners.app.text_table import table

    rows = []
    for n in args.ranks:
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [sys.executable, "-m", "tvm_combiners.collectives.runtime.launcher", "-n", str(n), "--timeout", "300",
                   "--", sys.executable, __file__, "--worker", tmp, "--hidden", str(args.hidden), "--width",
                   str(args.width), "--batch", str(args.batch), "--repeat", str(args.repeat)]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
            if proc.returncode != 0:
                sys.exit(f"bench_distributed: {n} ranks failed: {(proc.stderr.strip().splitlines() or ['no output'])[-1]}")
            ranks = [json.loads((Path(tmp) / f"rank{r}.json").read_text()) for r in range(n)]
        for mode in ranks[0]:
            per = [r[mode] for r in ranks]
            held = max(p["passed"] + p["received"] for p in per)
            rows.append([n, mode, _mib(max(p["passed"] for p in per)), _mib(max(p["received"] for p in per)),
                         _mib(held), f"{max(p['error'] for p in per):.1e}", f"{max(p['ms'] for p in per):.2f}"])
    print(f"MLP x ({args.batch}, {args.width}) @ w1 ({args.width}, {args.hidden}) @ w2 ({args.hidden}, {args.width}), "
          "float32; MiB of parameters per rank (largest over the ranks)")
    print(table(rows, ["ranks", "inputs", "passed MiB", "received MiB", "held MiB", "max rel. error", "ms/call"]))


if __name__ == "__main__":
    main()
