"""Parallel-op combiners on MiniLM-L3 and a BERT-base-sized model, Relax and Relay side by side.

    .venv/bin/python benchmarks/bench_combiners.py [--quick]

Every row comes from one run of benchmarks/measure.py; ratios compare numbers from the same run.
The BERT-base-sized model (12 layers, hidden 768, small vocabulary) is a randomly initialised
transformers BertModel exported with torch.onnx.export into a temporary folder.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import onnx

from tvm_combiners.app.text_table import table as text_table
from tvm_combiners.models.hf_export import export_bert
from tvm_combiners.models.inception import inception_model

ROOT = Path(__file__).resolve().parents[1]
PYTHONS = {"relax": ROOT / ".venv" / "bin" / "python", "relay": ROOT / ".venv-relay" / "bin" / "python"}
FAILED: list[str] = []  # rows whose measurement failed: the script then exits 1, after the table


def measure(ir: str, model: str | None, seq: int, repeat: int, target: str = "llvm") -> dict | None:
    python = PYTHONS[ir]
    if not python.exists():
        return None
    cmd = [str(python), str(ROOT / "benchmarks" / "measure.py"), "--ir", ir, "--seq", str(seq), "--repeat",
           str(repeat), "--target", target] + ([model] if model else [])
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        FAILED.append(f"{ir} {model or 'MiniLM'}: {(proc.stderr.strip().splitlines() or ['no output'])[-1]}")
        print(f"# {FAILED[-1]}", file=sys.stderr)
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def fmt(value, scale=1.0, digits=2):
    return "-" if value is None else f"{value * scale:.{digits}f}"


def table(rows: list[tuple[str, dict]]) -> str:
    head = ["model", "ir", "ops before", "TVM's pass", "ours", "TVM pass ms", "our pass ms", "compile s before/after",
            "latency ms before", "after", "speedup", "max|diff| after"]
    lines = []
    for name, r in rows:
        lb, la = r.get("latency_before_s"), r.get("latency_after_s")
        lines.append([
            name, r["ir"], str(r["ops_before"]), str(r["ops_tvm"]), str(r["ops_ours"]),
            fmt(r["pass_tvm_s"], 1e3, 1), fmt(r["pass_ours_s"], 1e3, 1),
            f"{r['compile_before_s']:.1f}/{r['compile_after_s']:.1f}",
            fmt(lb, 1e3, 1), fmt(la, 1e3, 1), "-" if not lb or not la else f"{lb / la:.2f}x",
            "-" if r.get("diff_after") is None else f"{r['diff_after']:.1e}",
        ])
    return text_table(lines, head)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="MiniLM only, one timed run")
    args = parser.parse_args()
    repeat = 1 if args.quick else 3
    rows: list[tuple[str, dict]] = []
    with tempfile.TemporaryDirectory() as tmp:
        models = [("MiniLM-L3 s128", None, 128)]
        if not args.quick:
            inception = Path(tmp) / "inception.onnx"
            onnx.save(inception_model(), str(inception))
            models.append(("GoogLeNet 3a-5b", str(inception), 0))
            bert = Path(tmp) / "bert_base.onnx"
            print("# exporting a BERT-base-sized model (12 layers, hidden 768)", file=sys.stderr, flush=True)
            export_bert(bert, layers=12, hidden=768, heads=12, vocab=2000, seq=32, dynamic=False)
            models.append(("BERT-base s32", str(bert), 32))
        for name, model, seq in models:
            for ir in ("relax", "relay"):
                print(f"# measuring {name} in {ir}", file=sys.stderr, flush=True)
                row = measure(ir, model, seq, repeat)
                if row:
                    rows.append((name, row))
    print("ops = matmul/dense/batch_matmul/conv2d calls; TVM's pass = relax.transform.CombineParallelMatmul "
          "or Relay's CombineParallel* at opt_level 4 after EliminateCommonSubexpr; target llvm (default pipeline)")
    print(table(rows))
    if FAILED:
        sys.exit(f"{len(FAILED)} measurement(s) failed: " + "; ".join(FAILED))


if __name__ == "__main__":
    main()
