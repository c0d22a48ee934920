"""How our pass time grows with graph size, beside TVM's own combiner on the same module.

    .venv/bin/python benchmarks/bench_pass_scaling.py [--sizes 200,800] [--bert-layers 12,48] [--ir relax|relay|both]

Three shapes: one input read by N sibling branches of 20 followers each; N layers of three sibling
matmuls (QKV-like) chained through their sum; and a BERT-base-sized model (hidden 768, seq 32) of
N layers, exported with torch and imported from ONNX. 4x more work should cost about 4x more
time: the ``x time`` column divides by the row with the smallest N of that shape. TVM's pass is
``relax.transform.CombineParallelMatmul`` or Relay's ``CombineParallel*`` after CSE at opt_level 4
(what ``benchmarks/measure.py`` runs). CPU seconds of this process, every row from the same run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tvm_combiners.app.text_table import table

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


def measure(ir: str, shape: str, n: int, model: str | None) -> None:
    """In this process: build, run our pass, then TVM's on the same module, count the combinable ops.

    Prints one JSON line after each pass, so a TVM pass that outlives the parent's timeout still
    leaves our row behind.
    """
    from measure import builtin_combine

    from tvm_combiners.app.job.run import select_backend
    from tvm_combiners.models import prepare_onnx

    backend = select_backend(ir)
    synthetic = lambda shape, n: relax_module(shape, n) if ir == "relax" else (relay_module(shape, n), {})  # noqa: E731
    # the ONNX model as the main job imports it (Relay: module and params)
    mod = backend.import_model(prepare_onnx(model, 1, 32)) if model else synthetic(shape, n)
    small = synthetic("layers", 2)
    ops = lambda m: sum(backend.count_ops(m).values())  # noqa: E731
    row = {"ir": ir, "shape": shape, "n": n, "before": ops(mod)}
    for name, run in (("ours", lambda m: backend.combine(m, None, to_batch=False)), ("tvm", lambda m: builtin_combine(ir, m))):
        run(small)  # warm up: lazy imports and first-call costs are not pass time
        start = time.process_time()  # CPU time: other processes on a busy machine do not count
        out = run(mod)
        row[f"{name}_s"], row[f"after_{name}"] = time.process_time() - start, ops(out)
        print(json.dumps(row), flush=True)


def run_case(ir: str, shape: str, n: int, model: str, timeout: float) -> dict | None:
    """One case in a fresh process; TVM's figures are None when its pass did not finish in time."""
    cmd = [str(PYTHONS[ir]), __file__, "--one", ir, shape, str(n), model]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        out, failed = proc.stdout, proc.returncode != 0 and proc.stderr.strip()[-300:]
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        failed = None
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    if failed or not rows:
        print(f"# {ir} {shape} {n}: failed: {failed or 'no result in time'}", file=sys.stderr)
        return None
    return {"tvm_s": None, "after_tvm": None, **rows[-1]}


def export_berts(layers: list[int], folder: Path) -> dict[int, str]:
    from tvm_combiners.models.hf_export import export_bert

    paths = {}
    for n in layers:
        print(f"# exporting a {n}-layer BERT-base-sized model (hidden 768)", file=sys.stderr, flush=True)
        paths[n] = str(folder / f"bert_{n}.onnx")
        export_bert(paths[n], layers=n, hidden=768, heads=12, vocab=2000, seq=32, dynamic=False)
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="200,800", help="N of the two synthetic shapes")
    parser.add_argument("--bert-layers", default="12,48", help="layers of the BERT-base-sized models ('' for none)")
    parser.add_argument("--ir", choices=["relax", "relay", "both"], default="both")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per case (TVM's pass may not finish)")
    parser.add_argument("--one", nargs=4, metavar=("IR", "SHAPE", "N", "MODEL"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        ir, shape, n, model = args.one
        measure(ir, shape, int(n), model or None)
        return
    irs = ["relax", "relay"] if args.ir == "both" else [args.ir]
    cases = [(shape, int(n), "") for shape in ("siblings", "layers") for n in args.sizes.split(",") if n]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        berts = export_berts([int(n) for n in args.bert_layers.split(",") if n], Path(tmp))
        cases += [("bert", n, path) for n, path in berts.items()]
        for ir in irs:
            if not PYTHONS[ir].exists():
                continue
            for shape, n, model in cases:
                print(f"# {ir} {shape} {n}", file=sys.stderr, flush=True)
                row = run_case(ir, shape, n, model, args.timeout)
                if row:
                    rows.append(row)
    head = ["ir", "shape", "N", "ops before", "ours", "TVM", "our cpu s", "TVM cpu s", "TVM/ours", "x work", "x time"]
    late = f"> {args.timeout:.0f}"
    body = []
    for r in rows:
        base = next(b for b in rows if b["ir"] == r["ir"] and b["shape"] == r["shape"])
        tvm_s = late if r["tvm_s"] is None else f"{r['tvm_s']:.2f}"
        ratio = ">" if r["tvm_s"] is None else f"{r['tvm_s'] / max(r['ours_s'], 1e-9):.2f}"
        body.append([r["ir"], r["shape"], r["n"], r["before"], r["after_ours"],
                     "-" if r["after_tvm"] is None else r["after_tvm"], f"{r['ours_s']:.2f}", tvm_s, ratio,
                     f"{r['n'] / base['n']:.1f}", f"{r['ours_s'] / base['ours_s']:.2f}"])
    print(table(body, head))


if __name__ == "__main__":
    main()
