"""Default CPU schedules: TVM's llvm pipeline as it is (naive loops) vs with ours, beside onnxruntime.

    .venv/bin/python benchmarks/bench_cpu_schedules.py [--models minilm,bert-base] [--rounds 6] [--repeat 5]

For each model (batch 1, seq 128): the baseline compiled with TVM's own llvm pipeline, the baseline
and the combined module (stacked) compiled with the default schedules (``tvm_combiners.compile.
schedules``: our GEMM rule), and onnxruntime with TVM's thread
count, all on the same inputs. The three TVM builds are timed in alternating rounds (the naive one
once a round: it runs for seconds; baseline and combined in turn first); each ratio is the median of
the rounds' ratios, their range in brackets. Every build's outputs are checked against onnxruntime's first.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

from tvm_combiners.app.text_table import table
from tvm_combiners.compile import relax_runner as runner
from tvm_combiners.compile.pipelines import cpu_pipeline
from tvm_combiners.models import loader
from tvm_combiners.relax.passes import CombineParallelOps

MODELS = {"minilm": "MiniLM-L3", "bert-base": "BERT-base"}


def _model(key: str, tmp: Path) -> str:
    if key == "minilm":
        return str(loader.default_model_path())
    from tvm_combiners.models.hf_export import export_bert

    path = tmp / "bert_base.onnx"
    print("# exporting a BERT-base-sized model (12 layers, hidden 768)", file=sys.stderr, flush=True)
    export_bert(path, layers=12, hidden=768, heads=12, vocab=2000, seq=128)
    return str(path)


def _ratio(rounds: list[float]) -> str:
    return f"{np.median(rounds):.2f}x ({min(rounds):.2f}-{max(rounds):.2f})"


def measure(path: str, rounds: int, repeat: int) -> list[str]:
    model = loader.prepare_onnx(loader.load_onnx(path), 1, 128)
    inputs = loader.example_inputs(model, 1, 128)
    reference = loader.run_onnxruntime(model, inputs)
    mod = loader.import_relax(model)[0]
    target = runner.make_target("llvm")
    builds = {
        "naive": runner.compile_module(mod, "llvm", cpu_pipeline(target, schedules=False)),
        "baseline": runner.compile_module(mod, "llvm"),
        "combined": runner.compile_module(CombineParallelOps(to_batch=True)(mod), "llvm"),
    }
    args = list(inputs.values())
    for name, built in builds.items():
        diff = max(float(np.abs(a - b).max()) for a, b in zip(runner.run_vm(built, args), reference))
        if diff > 1e-3:
            sys.exit(f"{name} differs from onnxruntime by {diff:.2e}: not timing it")
    times: dict[str, list[float]] = {name: [] for name in builds}
    for r in range(rounds):  # the naive build runs for seconds: once a round
        print(f"# round {r + 1}/{rounds}", file=sys.stderr, flush=True)
        order = ["naive", "baseline", "combined"] if r % 2 == 0 else ["naive", "combined", "baseline"]
        for name in order:
            times[name].append(runner.time_vm(builds[name], args, number=1 if name == "naive" else repeat))
    ort = loader.time_onnxruntime(model, inputs, repeat=repeat * rounds)
    naive, base, comb = (np.array(times[n]) for n in builds)
    return [f"{np.median(naive) * 1e3:.1f}", f"{np.median(base) * 1e3:.2f}", f"{np.median(comb) * 1e3:.2f}",
            f"{ort * 1e3:.2f}", _ratio(list(naive / base)), _ratio(list(base / comb)),
            f"{np.median(base) / ort:.2f}x"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="minilm,bert-base", help="comma-separated: " + ", ".join(MODELS))
    parser.add_argument("--rounds", type=int, default=6, help="alternating rounds (default 6)")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per scheduled module a round (median)")
    args = parser.parse_args()
    keys = [k.strip() for k in args.models.split(",") if k.strip()]
    unknown = [k for k in keys if k not in MODELS]
    if unknown or args.rounds < 1 or args.repeat < 1:
        parser.error(f"unknown model(s) {', '.join(unknown)}" if unknown else "--rounds and --repeat must be >= 1")
    head = ["model", "TVM's llvm pipeline ms", "default schedules ms", "combined ms", "onnxruntime ms",
            "naive/scheduled", "combined/baseline", "scheduled/ORT"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for key in keys:
            rows.append([f"{MODELS[key]} b1 s128", *measure(_model(key, Path(tmp)), args.rounds, args.repeat)])
            print("# " + " | ".join(rows[-1]), file=sys.stderr, flush=True)
    print(f"llvm ({runner.make_target('llvm').attrs['mcpu']}), untuned; onnxruntime with TVM's thread count "
          f"({loader.cpu_threads()}); combined: stacked (the job's default); ratios > 1: the second is faster")
    print(table(rows, head))


if __name__ == "__main__":
    main()
