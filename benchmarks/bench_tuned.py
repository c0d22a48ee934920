"""Tuned latency: baseline vs combined vs onnxruntime, MetaSchedule with the same budget per task.

    .venv/bin/python benchmarks/bench_tuned.py [--trials N] [--models minilm,bert-base] [--tune-dir DIR]
        [--target llvm|cuda] [--batches 1,8] [--combine-as stack|concat|both] [--tune-tasks all|gemm]

``--trials 0`` measures the default schedules (dlight on cuda, ours on llvm) untuned; with trials, each row
also times the untuned baseline (built anyway, to check the tuned modules' outputs), so the table
says whether tuning paid at that budget (on cuda a small one did not beat dlight). ``--target cuda``
needs a CUDA GPU here; onnxruntime always runs on the CPU (the CPU package is what is installed).

Each model goes through the main job (``run_job(..., tune=N)``), so every figure of a row comes from
one run: the baseline and the combined module tuned with N trials per task (tasks they share are
tuned once, in one database), then timed in alternating rounds (combined/baseline is the median of
the rounds' ratios, their range in brackets), and onnxruntime timed on the same inputs with the same
thread count. Records persist under ``--tune-dir``: a second run only measures. The BERT-base-sized
model (12 layers, hidden 768, vocabulary 2000) is a randomly initialised transformers BertModel
exported with torch.onnx.export. Each model gets a row per way of combining equal-width matmuls
(``--combine-as``): stacked into one batched matmul, or concatenated into one wide GEMM.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from tvm_combiners.app.job import run_job
from tvm_combiners.app.text_table import table
from tvm_combiners.compile.tuning import TUNE_TASKS

MODELS = {"minilm": ("MiniLM-L3", 128), "bert-base": ("BERT-base", 128)}


def _model_path(key: str, tmp: Path) -> str | None:
    if key == "minilm":
        return None  # the job's default model
    from tvm_combiners.models.hf_export import export_bert

    path = tmp / "bert_base.onnx"
    if path.exists():  # exported for an earlier row of this run
        return str(path)
    print("# exporting a BERT-base-sized model (12 layers, hidden 768)", file=sys.stderr, flush=True)
    export_bert(path, layers=12, hidden=768, heads=12, vocab=2000, seq=128)  # batch and seq axes free: --batches
    return str(path)


def _tasks(tuning: dict) -> str:
    """``19 (3)``: a module's tasks (those tuned in this run); ``6 of 19 (3)`` where only GEMMs were chosen."""
    chosen = "" if tuning.get("selected") is None else f"{tuning['selected']} of "
    return f"{chosen}{tuning['tasks']} ({tuning['tuned']})"


def _ratio(median: float, rounds: list[float]) -> str:
    """The median of the alternating rounds' ratios, with their range (the run-to-run noise)."""
    return f"{median:.3f}x ({min(rounds):.2f}-{max(rounds):.2f})" if len(rounds) > 1 else f"{median:.3f}x"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=64, help="MetaSchedule trials per task (default 64; 0: untuned)")
    parser.add_argument("--models", default="minilm,bert-base", help="comma-separated: " + ", ".join(MODELS))
    parser.add_argument("--tune-dir", default=None, help="tuning records (default: the job's cache folder)")
    parser.add_argument("--repeat", type=int, default=10, help="timed runs per module (median)")
    parser.add_argument("--target", choices=["llvm", "cuda"], default="llvm")
    parser.add_argument("--batches", default="1", help="comma-separated batch sizes (default 1)")
    parser.add_argument("--tune-tasks", choices=TUNE_TASKS, default="all",
                        help="tune every task, or only the GEMMs and convolutions (the rest: the default schedules)")
    parser.add_argument("--combine-as", choices=["stack", "concat", "both"], default="both",
                        help="equal-width matmuls become one batched matmul (stack), one wide GEMM (concat), or a "
                             "row of each (both, the default)")
    args = parser.parse_args()
    if args.trials < 0:
        parser.error(f"--trials must be 0 (untuned) or positive, got {args.trials}")
    if args.trials == 0 and args.tune_tasks != "all":
        parser.error("--tune-tasks chooses what to tune: it needs --trials above 0")
    batches = [int(b) for b in args.batches.split(",") if b.strip()]
    if args.target == "cuda":
        from tvm_combiners.compile.relax_runner import has_gpu

        if not has_gpu():
            parser.error("--target cuda measures on the GPU: this machine has no CUDA GPU")
    keys = [k.strip() for k in args.models.split(",") if k.strip()]
    unknown = [k for k in keys if k not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}: expected {', '.join(MODELS)}")
    head = ["model", "combined as", "trials/task", "tasks base, comb (new)", "job s", "baseline ms", "combined ms",
            "onnxruntime ms", "combined/baseline", "baseline/ORT", "combined/ORT"]
    if args.trials:  # did tuning pay at this budget: the untuned baseline (the default schedules), timed in the same job
        head[7:7] = ["untuned baseline ms", "untuned/tuned"]
    rows = []
    most = args.trials  # the largest budget a reused record was tuned with
    forms = ["stack", "concat"] if args.combine_as == "both" else [args.combine_as]
    with tempfile.TemporaryDirectory() as tmp:
        for key, batch, form in ((k, b, f) for k in keys for b in batches for f in forms):
            name, seq = MODELS[key]
            start = time.perf_counter()
            report = run_job(_model_path(key, Path(tmp)), args.target, "relax", batch, seq, True, args.repeat,
                             tune=args.trials or None, tune_dir=args.tune_dir, stack=form == "stack",
                             tune_tasks=args.tune_tasks)
            base, comb = report.variants
            most = max([most] + [v.tuning["most_trials"] for v in (base, comb) if v.tuning])
            ort = report.ort_latency_s
            tasks = ", ".join(_tasks(v.tuning) for v in (base, comb)) if args.trials else "-"
            shape = next(iter(report.inputs.values()))  # what it ran on: a model may fix its batch
            ran = "b{} s{}".format(*shape) if len(shape) == 2 else str(tuple(shape))
            untuned = ([f"{report.untuned.latency_s * 1e3:.2f}", f"{report.tuning_gain():.2f}x"]
                       if args.trials else [])
            rows.append([f"{name} {ran}", form, str(args.trials or "untuned"), tasks,
                         f"{time.perf_counter() - start:.0f}",
                         f"{base.latency_s * 1e3:.2f}", f"{comb.latency_s * 1e3:.2f}", *untuned, f"{ort * 1e3:.2f}",
                         _ratio(report.speedup(), report.round_speedups), f"{base.latency_s / ort:.2f}x",
                         f"{comb.latency_s / ort:.2f}x"])
            print("# " + " | ".join(rows[-1]), file=sys.stderr, flush=True)  # kept if a later row is cut off
    budget = ("same budget for both modules" if most == args.trials else
              f"but some tasks reuse records of up to {most} trials from --tune-dir: budgets differ")
    which = ", GEMM and convolution tasks only" if args.tune_tasks == "gemm" else ""
    how = (f"tuned with MetaSchedule ({args.trials} trials per task{which}, {budget})" if args.trials
           else "default schedules, untuned" + (" (dlight)" if args.target == "cuda" else " (tvm_combiners' CPU rules)"))
    print(f"{args.target}, {how}; onnxruntime on the CPU with TVM's thread count; "
          f"combined/baseline > 1 means combined is faster; stack: one batched matmul over stacked weights, "
          f"concat: one GEMM over concatenated weights")
    print(table(rows, head))


if __name__ == "__main__":
    main()
