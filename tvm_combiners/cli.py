"""``tvm-combiners``: the command-line main job."""

from __future__ import annotations

import argparse
import sys


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tvm-combiners", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="import an ONNX model, combine parallel ops, compile, run and report")
    run.add_argument("model", nargs="?", help="ONNX file (default: paraphrase-MiniLM-L3-v2 from PyPI)")
    run.add_argument("--target", choices=["llvm", "cuda"], default="llvm")
    run.add_argument("--ir", choices=["relax", "relay"], default="relax")
    run.add_argument("--batch", type=int, default=1)
    run.add_argument("--seq", type=int, default=128)
    run.add_argument("--repeat", type=int, default=5, help="timed runs per module (median reported)")
    run.add_argument("--no-combine", action="store_true", help="skip the combiner passes")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from .main_job import run_job

    if args.batch < 1 or args.seq < 1 or args.repeat < 1:
        print("tvm-combiners: error: --batch, --seq and --repeat must be positive", file=sys.stderr)
        return 2
    try:
        report = run_job(args.model, args.target, args.ir, args.batch, args.seq, not args.no_combine, args.repeat)
    except (FileNotFoundError, ImportError, ValueError) as err:
        print(f"tvm-combiners: error: {err}", file=sys.stderr)
        return 2
    print(report.render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
