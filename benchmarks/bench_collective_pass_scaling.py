"""How the collective passes' time grows with graph size, beside one TVM pass over the same module.

    .venv/bin/python benchmarks/bench_collective_pass_scaling.py [--sizes 250,1000] [--ir relax|relay|both]

The module is a data-parallel step's shape: N layers ``h = relu(h @ w)``, each also handing two
small tensors of ``h`` to an allreduce and one to an allgather, all independent of each other (the
gradients a backward pass reduces), so the combiners have 3N collectives to group. Relax holds it
as one binding block (collectives are impure); Relay in graph form (N layers make a path ~2N ops deep) and in let form
(``ToANormalForm``). ``ours`` is ``OrderSendRecv`` then ``CombineCollectives`` (what ``C.pipeline``
runs before a build); the TVM column is one pass of TVM's that also visits every node (Relax:
``CanonicalizeBindings``, Relay: ``InferType``), so the ratio says what a user pays on top of
the passes they already run. ``x time`` divides by the smallest N of that form: 4x more work
should cost about 4x more time. CPU seconds of one fresh process per row.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from tvm_combiners.app.text_table import table

ROOT = Path(__file__).resolve().parents[1]
PYTHONS = {"relax": ROOT / ".venv" / "bin" / "python", "relay": ROOT / ".venv-relay" / "bin" / "python"}
FORMS = {"relax": ["bindings"], "relay": ["graph", "let"]}


def relax_case(n: int):
    import tvm
    from tvm import relax

    from tvm_combiners.collectives import relax as C

    R = relax.op
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 16), "float32"))
    w = relax.Var("w", relax.TensorType((16, 16), "float32"))
    with bb.function("main", [x, w], pure=False):  # collectives are impure: one binding block
        h, outs = x, []
        for _ in range(n):
            h = bb.emit(R.nn.relu(R.matmul(h, w)))
            outs += [bb.emit(C.allreduce(bb.emit(R.multiply(h, relax.const(0.5))))),
                     bb.emit(C.allreduce(bb.emit(R.sum(h, axis=[0]))))]
            outs.append(bb.emit(C.allgather(bb.emit(R.strided_slice(h, axes=[0], begin=[0], end=[1])), axis=0,
                                            group=[[0, 1]])))
        bb.emit_func_output(relax.Tuple([h, *outs]))
    mod = bb.get()
    ours = tvm.transform.Sequential([C.OrderSendRecv(), C.CombineCollectives()])
    return mod, ours, relax.transform.CanonicalizeBindings()


def relay_case(n: int, form: str):
    import tvm
    from tvm import relay

    from tvm_combiners.collectives import relay as C

    x, w = relay.var("x", shape=(4, 16)), relay.var("w", shape=(16, 16))
    h, outs = x, []
    for _ in range(n):
        h = relay.nn.relu(relay.nn.dense(h, w))
        outs += [C.allreduce(relay.multiply(h, relay.const(0.5))), C.allreduce(relay.sum(h, axis=[0]))]
        outs.append(C.allgather(relay.strided_slice(h, [0], [1]), axis=0, group=[[0, 1]]))
    mod = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x, w], relay.Tuple([h, *outs]))))
    if form == "let":
        mod = relay.transform.InferType()(relay.transform.ToANormalForm()(mod))
    ours = tvm.transform.Sequential([C.OrderSendRecv(), C.CombineCollectives()])
    return mod, ours, relay.transform.InferType()


def _collectives(ir: str, mod) -> int:
    import importlib

    import tvm

    C = importlib.import_module(f"tvm_combiners.collectives.{ir}")
    found = []
    getattr(tvm, ir).analysis.post_order_visit(mod["main"], lambda e: found.append(C.info(e) is not None))
    return sum(found)


def measure(ir: str, form: str, n: int) -> None:
    """In this process: build the module, run ours, then TVM's pass; print one JSON line."""
    build = (lambda k: relax_case(k)) if ir == "relax" else (lambda k: relay_case(k, form))
    small, ours, theirs = build(2)
    ours(small), theirs(small)  # warm up: lazy imports and first-call costs are not pass time
    mod = build(n)[0]
    row = {"ir": ir, "form": form, "n": n, "before": _collectives(ir, mod)}
    for name, run in (("ours", ours), ("tvm", theirs)):
        start = time.process_time()  # CPU time: other processes on a busy machine do not count
        out = run(mod)
        row[f"{name}_s"] = time.process_time() - start
        if name == "ours":
            row["after"] = _collectives(ir, out)
    print(json.dumps(row), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="250,1000", help="layers N (3N collectives)")
    parser.add_argument("--ir", choices=["relax", "relay", "both"], default="both")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per row")
    parser.add_argument("--one", nargs=3, metavar=("IR", "FORM", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        measure(args.one[0], args.one[1], int(args.one[2]))
        return
    rows = []
    for ir in ["relax", "relay"] if args.ir == "both" else [args.ir]:
        if not PYTHONS[ir].exists():
            continue
        for form in FORMS[ir]:
            for n in (int(s) for s in args.sizes.split(",") if s):
                print(f"# {ir} {form} {n}", file=sys.stderr, flush=True)
                cmd = [str(PYTHONS[ir]), __file__, "--one", ir, form, str(n)]
                try:
                    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
                except subprocess.TimeoutExpired:
                    print(f"# {ir} {form} {n}: no result in {args.timeout:.0f} s", file=sys.stderr)
                    continue
                lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
                if proc.returncode or not lines:
                    print(f"# {ir} {form} {n}: failed: {proc.stderr.strip()[-300:]}", file=sys.stderr)
                    continue
                rows.append(json.loads(lines[-1]))
    head = ["ir", "form", "N", "collectives", "after", "ours cpu s", "TVM pass cpu s", "ours/TVM", "x work", "x time"]
    body = []
    for r in rows:
        base = next(b for b in rows if b["ir"] == r["ir"] and b["form"] == r["form"])
        body.append([r["ir"], r["form"], r["n"], r["before"], r["after"], f"{r['ours_s']:.2f}", f"{r['tvm_s']:.2f}",
                     f"{r['ours_s'] / max(r['tvm_s'], 1e-9):.1f}", f"{r['n'] / base['n']:.1f}",
                     f"{r['ours_s'] / max(base['ours_s'], 1e-9):.2f}"])
    print(table(body, head))


if __name__ == "__main__":
    main()
