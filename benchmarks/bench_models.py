"""Real-size models through the CLI: each exported with random weights, then ``tvm-combiners run``.

    .venv/bin/python benchmarks/bench_models.py [--models bert-base,gpt2,t5-small,resnet50,googlenet]
                                                [--ir relax|relay|both] [--repeat 3] [--small]

Each model is exported into a temporary folder (BERT-base, GPT-2 124M and T5-small from transformers
configs, ``tvm_combiners.models.hf_export``; ResNet-50 and GoogLeNet, ``tvm_combiners.models.cnn_export``)
and run by ``tvm-combiners run --json`` at its real input shapes (``--input-shapes``), in the
environment of each IR. One row per model and IR: the ops before and after combining, the largest
difference from onnxruntime, the verdict, the median latencies, the job's speed-up (the median of its
alternating rounds' ratios; ``n.s.``: no measurable difference), onnxruntime's latency with TVM's
thread count, and the job's wall time. A model that fails is a row saying why (its stage and
message); the script then exits 1, after the table. ``--small`` exports tiny configurations of the same models at small shapes (the smoke test): the
transformers at one layer, hidden 64 and 32 tokens, a one-block-a-stage ResNet and GoogLeNet on 32x32.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tvm_combiners.app.text_table import table
from tvm_combiners.models import hf_export

ROOT = Path(__file__).resolve().parents[1]
PYTHONS = {"relax": ROOT / ".venv" / "bin" / "python", "relay": ROOT / ".venv-relay" / "bin" / "python"}
TINY = {"layers": 1, "hidden": 64, "heads": 4, "vocab": 500}  # --small: every transformer at this size
SMALL_IMAGE = 32  # --small: the CNNs' image side


@dataclass
class Model:
    """A model to export: its label, how to write it to a path, and the input shapes it runs at."""

    label: str
    export: Callable[[Path, bool], None]
    shapes: Callable[[bool], str]


def _transformer(name: str) -> Callable[[Path, bool], None]:
    def export(path: Path, small: bool) -> None:
        hf_export.EXPORTS[name](path, **(TINY if small else hf_export.REAL_SIZES[name]))
    return export


def _text_shapes(*names: str) -> Callable[[bool], str]:
    """Batch 1 and 128 tokens (32 under --small) for each named input."""
    return lambda small: ",".join(f"{n}:1x{32 if small else 128}" for n in names)


def _cnn(kind: str, small_kind: str) -> Callable[[Path, bool], None]:
    def export(path: Path, small: bool) -> None:
        from tvm_combiners.models.cnn_export import export_cnn

        export_cnn(path, small_kind if small else kind, SMALL_IMAGE if small else 224)
    return export


def _image_shapes(small: bool) -> str:
    """One 224x224 RGB image (SMALL_IMAGE square under --small)."""
    side = SMALL_IMAGE if small else 224
    return f"input:1x3x{side}x{side}"


MODELS: dict[str, Model] = {
    "bert-base": Model("BERT-base", _transformer("bert"), _text_shapes("input_ids", "attention_mask")),
    "gpt2": Model("GPT-2 124M", _transformer("gpt2"), _text_shapes("input_ids", "attention_mask")),
    "t5-small": Model("T5-small", _transformer("t5"), _text_shapes("input_ids", "attention_mask", "decoder_input_ids")),
    "resnet50": Model("ResNet-50", _cnn("resnet50", "resnet-mini"), _image_shapes),
    "googlenet": Model("GoogLeNet", _cnn("googlenet", "googlenet"), _image_shapes),
}


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else "no output"


def run_cli(ir: str, path: Path, shapes: str, repeat: int, timeout: float) -> tuple[dict, float]:
    """``tvm-combiners run --json`` in the IR's environment: its JSON document (an ``ok: false``
    one, made here, where the process times out, crashes or prints none) and its wall seconds."""
    python = PYTHONS[ir]
    if not python.exists():
        return {"ok": False, "error": {"stage": "setup", "message": f"no {python.relative_to(ROOT)}"}}, 0.0
    cmd = [str(python), "-m", "tvm_combiners", "run", str(path), "--ir", ir, "--input-shapes", shapes,
           "--repeat", str(repeat), "--json"]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": {"stage": "timeout", "message": f"no result in {timeout:.0f} s"}}, \
            time.perf_counter() - start
    seconds = time.perf_counter() - start
    try:
        doc = json.loads(proc.stdout)
    except ValueError:
        why = f"exit {proc.returncode}, no JSON: {_last_line(proc.stderr)}"
        return {"ok": False, "error": {"stage": "crash", "message": why[:200]}}, seconds
    if doc.get("ok") and proc.returncode != 0:
        doc = {"ok": False, "error": {"stage": "exit", "message": f"exit {proc.returncode}: {_last_line(proc.stderr)}"}}
    return doc, seconds


def _ops(doc: dict) -> str:
    """The op counts that changed or are there, baseline -> combined, and the groups combined."""
    variants = {v["label"]: v["ops"] for v in doc.get("variants", [])}
    base, comb = variants.get("baseline", {}), variants.get("combined", variants.get("baseline", {}))
    counts = [f"{kind} {base.get(kind, 0)}->{comb.get(kind, 0)}" for kind in base
              if base.get(kind) or comb.get(kind)]
    groups = len(doc.get("groups", []))
    return f"{', '.join(counts) or 'none'} ({groups} group{'' if groups == 1 else 's'})"


def _speedup(doc: dict) -> str:
    """The job's speed-up (median of its alternating rounds' ratios, baseline over combined), with
    ``n.s.`` where its interval holds 1 or the rounds were too few to tell."""
    if not doc.get("groups"):
        return "-"
    speedup = doc.get("speedup")
    if speedup is None:
        return "-"
    return f"{speedup:.2f}x" + ("" if doc.get("speedup_measurable") else " n.s.")


def row(model: Model, ir: str, shapes: str, doc: dict, seconds: float) -> list[str]:
    inputs = " ".join(f"{n}:{'x'.join(map(str, s))}" for n, s in doc.get("inputs", {}).items()) or shapes
    if not doc.get("ok"):
        err = doc.get("error", {})
        why = f"FAILED {err.get('stage', '?')}: {' '.join(str(err.get('message', '')).split())[:120]}"
        return [model.label, inputs, ir, "-", "-", why, "-", "-", "-", "-", f"{seconds:.0f}"]
    variants = {v["label"]: v for v in doc["variants"]}
    diff = max((v["max_abs_diff"] for v in doc["variants"] if v.get("max_abs_diff") is not None), default=None)
    base, comb = variants.get("baseline", {}), variants.get("combined", {})

    def ms(v: dict | None) -> str:
        return "-" if not v or v.get("latency_s") is None else f"{v['latency_s'] * 1e3:.1f}"

    return [model.label, inputs, ir, _ops(doc), "-" if diff is None else f"{diff:.1e}", "passed", ms(base), ms(comb),
            _speedup(doc), ms(doc.get("onnxruntime")), f"{seconds:.0f}"]


HEADER = ["model", "inputs", "ir", "ops combined", "max |diff| vs ORT", "verdict", "baseline ms", "combined ms",
          "speedup", "ORT ms", "job s"]


def main() -> int:
    models = MODELS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(models), help="comma-separated: " + ", ".join(models))
    parser.add_argument("--ir", choices=["relax", "relay", "both"], default="relax")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per module (the CLI's --repeat)")
    parser.add_argument("--small", action="store_true", help="tiny configurations of the same models")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per job (default 3600)")
    args = parser.parse_args()
    keys = [k.strip() for k in args.models.split(",") if k.strip()]
    unknown = [k for k in keys if k not in models]
    if unknown:
        parser.error(f"unknown model {', '.join(unknown)} (known: {', '.join(models)})")
    irs = ["relax", "relay"] if args.ir == "both" else [args.ir]
    rows, failed = [], 0
    with tempfile.TemporaryDirectory() as tmp:
        for key in keys:
            model, path = models[key], Path(tmp) / f"{key}.onnx"
            shapes = model.shapes(args.small)
            print(f"# exporting {model.label}", file=sys.stderr, flush=True)
            try:
                model.export(path, args.small)
            except Exception as err:  # a failed export is a row, never a traceback
                failed += len(irs)
                why = f"FAILED export: {type(err).__name__}: {' '.join(str(err).split())[:120]}"
                rows += [[model.label, shapes, ir, "-", "-", why, "-", "-", "-", "-", "0"] for ir in irs]
                continue
            for ir in irs:
                print(f"# {model.label}: tvm-combiners run --ir {ir} --input-shapes {shapes}", file=sys.stderr,
                      flush=True)
                doc, seconds = run_cli(ir, path, shapes, args.repeat, args.timeout)
                failed += not doc.get("ok")
                rows.append(row(model, ir, shapes, doc, seconds))
            path.unlink(missing_ok=True)
    print(table(rows, HEADER))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
