"""Measure one model in one IR: op counts, pass times (ours beside TVM's own), compile, latency.

Runs in either environment (``--ir relax`` in .venv, ``--ir relay`` in .venv-relay) and prints one
JSON object, so bench_combiners.py can put both IRs in one table.
"""

from __future__ import annotations

import argparse
import json
import time

from tvm_combiners.models import default_model_path, example_inputs, prepare_onnx, run_onnxruntime


def builtin_combine(ir: str, mod):
    """TVM's own combiners, as a user would run them."""
    if ir == "relax":
        from tvm import relax

        return relax.transform.CombineParallelMatmul()(mod)
    from tvm_combiners.compile.relay_runner import relays_own_passes

    return relays_own_passes(mod[0]), mod[1]


def timed(fn, *args):
    start = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - start


def measure(ir: str, path: str | None, batch: int, seq: int | None, repeat: int, target: str) -> dict:
    from tvm_combiners.app.job import max_abs_diff
    from tvm_combiners.app.job.run import select_backend

    backend = select_backend(ir)
    model = prepare_onnx(path or default_model_path(), batch, seq)
    inputs = example_inputs(model, batch, seq)
    reference = run_onnxruntime(model, inputs)
    base = backend.import_model(model)
    ours, ours_s = timed(backend.combine, base, None, True)  # stacked, as the CLI's default
    theirs, theirs_s = timed(builtin_combine, ir, base)
    row = {
        "ir": ir, "target": target,
        "ops_before": sum(backend.count_ops(base).values()),
        "ops_tvm": sum(backend.count_ops(theirs).values()),
        "ops_ours": sum(backend.count_ops(ours).values()),
        "pass_ours_s": ours_s, "pass_tvm_s": theirs_s,
    }
    run_here = target == "llvm" or backend.has_gpu()
    for label, mod in (("before", base), ("after", ours)):
        built, row[f"compile_{label}_s"] = timed(backend.compile, mod, target)
        if run_here:
            row[f"diff_{label}"] = max_abs_diff(backend.run(built, inputs, target), reference)
            row[f"latency_{label}_s"] = backend.time(built, inputs, target, repeat)
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model", nargs="?")
    parser.add_argument("--ir", default="relax", choices=["relax", "relay"])
    parser.add_argument("--target", default="llvm", choices=["llvm", "cuda"])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=128, help="0 keeps the model's own input sizes")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(json.dumps(measure(args.ir, args.model, args.batch, args.seq or None, args.repeat, args.target)))


if __name__ == "__main__":
    main()
