"""Default CPU schedules: TVM's llvm pipeline as it is (naive loops) vs with ours, beside onnxruntime.

    .venv/bin/python benchmarks/bench_cpu_schedules.py [--models minilm,bert-base,googlenet,resnet50,...]
        [--rounds 6] [--repeat 5] [--image 224] [--functions 0] [--no-naive]

For each model (batch 1; transformers at seq 128, CNNs on ``--image`` x ``--image`` images): the
baseline compiled with TVM's own llvm pipeline, the baseline and the combined module (stacked)
compiled with the default schedules (``tvm_combiners.compile.schedules``), and onnxruntime with
TVM's thread count, all on the same inputs. The three TVM builds are timed in alternating rounds
(the naive one once a round: it runs for seconds; baseline and combined in turn first); each ratio
is the median of the rounds' ratios, their range in brackets; onnxruntime runs in every round
too, so the last ratio also compares runs made under the same load. Every build's outputs are
checked against onnxruntime's first. ``--functions N`` then lists the N fused functions of the scheduled
baseline that take longest, each timed alone (times its calls). The CNNs are the papers' layer
tables with random weights (``tvm_combiners.models.cnn_export``); ``resnet-mini`` (one block a
stage, a quarter of the width) is for smoke runs.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from tvm_combiners.app.text_table import table
from tvm_combiners.compile import relax_runner as runner
from tvm_combiners.compile.pipelines import cpu_pipeline
from tvm_combiners.models import loader
from tvm_combiners.relax.passes import CombineParallelOps

MODELS = {"minilm": "MiniLM-L3", "bert-base": "BERT-base", "googlenet": "GoogLeNet", "resnet50": "ResNet-50",
          "inception-v3": "Inception-v3", "efficientnet-b0": "EfficientNet-B0", "resnet-mini": "ResNet-mini"}
CNNS = ("googlenet", "resnet50", "inception-v3", "efficientnet-b0", "resnet-mini")


def _model(key: str, tmp: Path, image: int) -> str:
    if key == "minilm":
        return str(loader.default_model_path())
    if key in CNNS:
        from tvm_combiners.models.cnn_export import export_cnn

        path = tmp / f"{key}.onnx"
        print(f"# exporting {MODELS[key]} ({image}x{image}, BatchNorm calibrated)", file=sys.stderr, flush=True)
        export_cnn(path, key, image)
        return str(path)
    from tvm_combiners.models.hf_export import export_bert

    path = tmp / "bert_base.onnx"
    print("# exporting a BERT-base-sized model (12 layers, hidden 768)", file=sys.stderr, flush=True)
    export_bert(path, layers=12, hidden=768, heads=12, vocab=2000, seq=128)
    return str(path)


def _ratio(rounds: list[float]) -> str:
    return f"{np.median(rounds):.2f}x ({min(rounds):.2f}-{max(rounds):.2f})"


def measure(path: str, rounds: int, repeat: int, functions: int = 0, naive: bool = True) -> list[str]:
    model = loader.prepare_onnx(loader.load_onnx(path), 1, 128)
    inputs = loader.example_inputs(model, 1, 128)
    reference = loader.run_onnxruntime(model, inputs)
    mod = loader.import_relax(model)[0]
    target = runner.make_target("llvm")
    builds = {
        "naive": runner.compile_module(mod, "llvm", cpu_pipeline(target, schedules=False)) if naive else None,
        "baseline": runner.compile_module(mod, "llvm"),
        "combined": runner.compile_module(CombineParallelOps(to_batch=True)(mod), "llvm"),
    }
    builds = {name: built for name, built in builds.items() if built is not None}
    args = list(inputs.values())
    for name, built in builds.items():
        diff = max(float(np.abs(a - b).max()) for a, b in zip(runner.run_vm(built, args), reference))
        if diff > 1e-3:
            sys.exit(f"{name} differs from onnxruntime by {diff:.2e}: not timing it")
    times: dict[str, list[float]] = {name: [] for name in [*builds, "ort"]}
    for r in range(rounds):  # the naive build runs for seconds: once a round
        print(f"# round {r + 1}/{rounds}", file=sys.stderr, flush=True)
        order = ["naive", "baseline", "combined", "ort"] if r % 2 == 0 else ["naive", "ort", "combined", "baseline"]
        for name in (n for n in order if n in times):  # onnxruntime in every round too: each ratio compares runs under the same load
            if name == "ort":
                times[name].append(loader.time_onnxruntime(model, inputs, repeat=repeat))
            else:
                times[name].append(runner.time_vm(builds[name], args, number=1 if name == "naive" else repeat))
    base, comb, ort = (np.array(times[n]) for n in ("baseline", "combined", "ort"))
    if functions:
        for line in slowest_functions(mod, target, functions):
            print(f"# {Path(path).stem}: {line}")
    slow = np.array(times["naive"]) if naive else None
    return [f"{np.median(slow) * 1e3:.1f}" if naive else "-", f"{np.median(base) * 1e3:.2f}", f"{np.median(comb) * 1e3:.2f}",
            f"{np.median(ort) * 1e3:.2f}", _ratio(list(slow / base)) if naive else "-", _ratio(list(base / comb)),
            _ratio(list(base / ort))]


def slowest_functions(mod: Any, target: Any, count: int) -> list[str]:
    """The ``count`` fused functions of ``mod`` scheduled by default that take longest, each built
    and timed alone on random inputs, times the calls ``main`` makes of it."""
    import collections

    import tvm
    from tvm import relax
    from tvm.s_tir import meta_schedule as ms

    from tvm_combiners.compile.pipelines import fusion_passes
    from tvm_combiners.compile.schedules import default_schedules

    with target:
        lowered = tvm.transform.Sequential([*fusion_passes(target), default_schedules()])(mod)
    calls: collections.Counter = collections.Counter()

    def visit(expr: Any) -> None:
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == "relax.call_tir":
            calls[expr.args[0].name_hint] += 1

    relax.analysis.post_order_visit(lowered["main"].body, visit)
    rng = np.random.default_rng(0)
    rows = []
    for gv, func in lowered.functions_items():
        if not isinstance(func, tvm.tirx.PrimFunc) or gv.name_hint not in calls:
            continue
        built = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=target)
        shapes = [([int(d) for d in info.shape], str(info.dtype)) for info in ms.arg_info.ArgInfo.from_prim_func(func)]
        # integer inputs are indices (a gather's): zeros stay in bounds
        args = [tvm.runtime.tensor(rng.standard_normal(shape).astype(dtype) if np.dtype(dtype).kind == "f"
                                   else np.zeros(shape, dtype)) for shape, dtype in shapes]
        seconds = built.mod.time_evaluator("main", tvm.cpu(), number=3, repeat=1)(*args).mean
        scheduled = "scheduled" if func.attrs.get("tirx.is_scheduled", False) else "loops"
        rows.append((seconds * calls[gv.name_hint], gv.name_hint, calls[gv.name_hint], scheduled, shapes[0][0]))
    rows.sort(key=lambda row: -row[0])
    total = sum(row[0] for row in rows)
    return [f"all {len(rows)} functions {total * 1e3:.1f} ms, timed alone",
            *(f"{gv}: {t * 1e3:.2f} ms ({n} call(s), {kind}, first input {shape})" for t, gv, n, kind, shape in rows[:count])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="minilm,bert-base", help="comma-separated: " + ", ".join(MODELS))
    parser.add_argument("--rounds", type=int, default=6, help="alternating rounds (default 6)")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per scheduled module a round (median)")
    parser.add_argument("--image", type=int, default=224, help="the CNNs' input height and width (default 224)")
    parser.add_argument("--functions", type=int, default=0, help="list the N slowest fused functions of each model")
    parser.add_argument("--no-naive", action="store_true",
                        help="leave out TVM's own llvm pipeline (its loops run for seconds to minutes a round)")
    args = parser.parse_args()
    keys = [k.strip() for k in args.models.split(",") if k.strip()]
    unknown = [k for k in keys if k not in MODELS]
    if unknown or args.rounds < 1 or args.repeat < 1:
        parser.error(f"unknown model(s) {', '.join(unknown)}" if unknown else "--rounds and --repeat must be >= 1")
    if args.image < 32 or args.functions < 0:
        parser.error("--image must be at least 32 and --functions at least 0")
    head = ["model", "TVM's llvm pipeline ms", "default schedules ms", "combined ms", "onnxruntime ms",
            "naive/scheduled", "combined/baseline", "scheduled/ORT"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for key in keys:
            size = f"{args.image}x{args.image}" if key in CNNS else "s128"
            path = _model(key, Path(tmp), args.image)
            rows.append([f"{MODELS[key]} b1 {size}",
                         *measure(path, args.rounds, args.repeat, args.functions, naive=not args.no_naive)])
            print("# " + " | ".join(rows[-1]), file=sys.stderr, flush=True)
    print(f"llvm ({runner.make_target('llvm').attrs['mcpu']}), untuned; onnxruntime with TVM's thread count "
          f"({loader.cpu_threads()}); combined: stacked (the job's default); ratios > 1: the second is faster")
    print(table(rows, head))


if __name__ == "__main__":
    main()
