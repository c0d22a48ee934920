"""Every script of ``make bench`` runs at its smallest size and prints its table, so none rots unseen
(bench_combiners failed on every row for weeks: its measure.py called combine with too few arguments)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"

# script -> the smallest run that still prints every column (tens of seconds at most on 2 cores)
SMOKE = {
    "bench_collectives.py": ["--quick"],
    "bench_collective_combiners.py": ["--smoke"],
    "bench_dp_train.py": ["--quick"],
    "bench_collective_pass_scaling.py": ["--sizes", "10", "--ir", "both"],
    "bench_pass_scaling.py": ["--sizes", "10", "--bert-layers", "", "--ir", "both"],
    "bench_cpu_schedules.py": ["--models", "minilm,resnet-mini", "--image", "32", "--rounds", "1", "--repeat", "1",
                               "--functions", "2"],
    "bench_tuned.py": ["--trials", "0", "--models", "minilm", "--repeat", "1", "--combine-as", "stack"],
    "bench_combiners.py": ["--quick"],
    "bench_distributed.py": ["--hidden", "64", "--width", "16", "--ranks", "2", "--repeat", "1"],
    "bench_models.py": ["--small", "--repeat", "1", "--models", "bert-base,gpt2,t5-small,vit-s"],
}
OWN_SMOKE_TEST = {"bench_models.py", "bench_distributed.py"}  # scripts whose smoke run is a test of its own below


def test_every_benchmark_script_has_a_smoke_run():
    assert sorted(SMOKE) == sorted(p.name for p in BENCHMARKS.glob("bench_*.py"))


@pytest.mark.slow
@pytest.mark.parametrize("script", [s for s in SMOKE if s not in OWN_SMOKE_TEST])
def test_benchmark_runs_and_prints_its_table(script):
    proc = subprocess.run([sys.executable, str(BENCHMARKS / script), *SMOKE[script]], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # a table: a header and at least one row, of three or more columns two spaces apart
    rows = [line for line in proc.stdout.splitlines() if len(re.split(r"\s{2,}", line.strip())) >= 3]
    assert len(rows) >= 2, proc.stdout[-3000:]


def _bench_models():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import bench_models
    finally:
        sys.path.remove(str(BENCHMARKS))
    return bench_models


def _bench_rows(args: list[str]) -> tuple[subprocess.CompletedProcess, list[dict[str, str]]]:
    """Run bench_models.py with ``args``: the process and its table's rows, by column."""
    bench_models = _bench_models()
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "bench_models.py"), *args], capture_output=True, text=True,
                          timeout=600)
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert re.split(r"\s{2,}", lines[0].strip()) == bench_models.HEADER and set(lines[1]) <= {"-", " "}
    return proc, [dict(zip(bench_models.HEADER, re.split(r"\s{2,}", line.strip()))) for line in lines[2:]]


@pytest.mark.slow
def test_bench_models_small_runs_the_transformers_through_the_cli_and_each_passes():
    """bench_models.py --small: one-layer BERT, GPT-2, T5 and ViT each exported and run by `tvm-combiners run
    --json`, one row each, every verdict passed. The CNNs stay out (their exports are tested with
    cnn_export; each row costs 15 s or more, GoogLeNet's 57 convolutions a minute even on 32x32 images)."""
    proc, rows = _bench_rows(SMOKE["bench_models.py"])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert [r["model"] for r in rows] == ["BERT-base", "GPT-2 124M", "T5-small", "ViT-S/16"]
    assert all(r["verdict"] == "passed" and r["ir"] == "relax" for r in rows), proc.stdout
    assert all(float(r["max |diff| vs ORT"]) < 1e-3 for r in rows), proc.stdout
    by_model = {r["model"]: r for r in rows}
    assert by_model["T5-small"]["inputs"] == "input_ids:1x32 attention_mask:1x32 decoder_input_ids:1x32"
    assert by_model["ViT-S/16"]["inputs"] == "pixel_values:1x3x32x32"
    # the attentions' Q/K/V: BERT's and ViT's one group, T5's encoder, decoder and cross-attention (K/V) three
    assert by_model["BERT-base"]["ops combined"] == "matmul 9->7 (1 group)"
    assert by_model["ViT-S/16"]["ops combined"] == "matmul 9->7, conv2d 1->1 (1 group)"
    assert by_model["T5-small"]["ops combined"] == "matmul 22->17 (3 groups)"
    assert by_model["GPT-2 124M"]["ops combined"] == "matmul 6->6 (0 groups)"  # its Q/K/V is one GEMM already


@pytest.mark.slow
def test_bench_models_runs_silero_vad_from_its_wheel_on_a_16khz_chunk():
    """Silero VAD, a model nobody here wrote, from the silero-vad wheel (fetched by pip download: skipped
    where PyPI cannot be reached) on one 16 kHz chunk with sr 16000 as data: the file without LSTM ops passes
    and matches onnxruntime; the one with them is a row saying what TVM's Relax frontend lacks."""
    proc, rows = _bench_rows(["--repeat", "1", "--models", "silero,silero-op15"])
    if any(r["verdict"].startswith("FAILED export") for r in rows):
        pytest.skip(f"the silero-vad wheel could not be fetched: {rows[0]['verdict']}")
    assert proc.returncode == 1 and [r["model"] for r in rows] == ["Silero VAD op18 ifless", "Silero VAD 16k op15"]
    ifless, op15 = rows
    assert ifless["verdict"] == "passed" and float(ifless["max |diff| vs ORT"]) < 1e-4, proc.stdout
    assert ifless["inputs"] == "input:1x576 sr:[] state:2x1x128" and ifless["ops combined"] == "matmul 4->4 (0 groups)"
    assert op15["verdict"] == "FAILED import: TVM's Relax ONNX frontend does not support the op LSTM", proc.stdout
    assert op15["inputs"] == "input:1x576 state:2x1x128 sr:[]"


def test_bench_models_a_failed_model_is_a_row_saying_why(tmp_path):
    """A job that fails, times out or prints no JSON is a row naming its stage and why, not a traceback."""
    bench_models = _bench_models()
    model = bench_models.MODELS["gpt2"]
    (tmp_path / "bad.onnx").write_text("not onnx")
    doc, _ = bench_models.run_cli("relax", tmp_path / "bad.onnx", "input_ids:1x8", 1, 300)
    cells = bench_models.row(model, "relax", "input_ids:1x8", doc, 1.0)
    assert cells[:3] == ["GPT-2 124M", "input_ids:1x8", "relax"] and len(cells) == len(bench_models.HEADER)
    assert cells[5].startswith("FAILED load: not an ONNX file (8 bytes"), cells
    doc, _ = bench_models.run_cli("relax", tmp_path / "bad.onnx", "input_ids:1x8", 1, 0.01)
    assert bench_models.row(model, "relax", "x", doc, 0.01)[5] == "FAILED timeout: no result in 0 s"
