"""End-to-end examples on the collectives: ``tvm-combiners launch -n N --example NAME [--json]``.

- ``dp-train`` (:mod:`.dp_train`): a data-parallel training step (TVM's Gradient and optimizer,
  one allreduce per gradient, bucketed by ``AllReduceCombiner``), checked against one process
  stepping on the full batch;
- ``pipeline-bert`` (:mod:`.pipeline_bert`): MiniLM-L3 cut into pipeline stages joined by
  send/recv (merged by ``SendRecvCombiner``), checked against onnxruntime;
- ``tp-bert`` (:mod:`.tp_bert`): MiniLM-L3 tensor-parallel through TVM's ``relax.distributed``
  annotations (Q/K/V merged by ``CombineParallelOps``), each rank holding only its shards, ``--tp``
  below the ranks adding data parallelism; checked against onnxruntime on every rank.

Each is also a program of its own: ``tvm-combiners launch -n 4 -- python -m
tvm_combiners.app.examples.dp_train --help``. Importing this package imports neither TVM nor MPI, nor
does :func:`check_options`: the launching process checks an example's options before any rank starts.
"""

from __future__ import annotations

import argparse
import importlib
import math

from ..usage import UsageError

#: ``--example`` name -> the module its ranks run.
EXAMPLES: dict[str, str] = {
    "dp-train": "tvm_combiners.app.examples.dp_train",
    "pipeline-bert": "tvm_combiners.app.examples.pipeline_bert",
    "tp-bert": "tvm_combiners.app.examples.tp_bert",
}


def example_command(name: str, extra: list[str], json_out: str | None = None) -> list[str]:
    """The command every rank runs for example ``name``: extra options go to the example.

    ``json_out``: rank 0 writes the report there as JSON (the CLI prints it as the job's one document).
    """
    if name not in EXAMPLES:
        raise ValueError(f"unknown example {name!r}: choose from {', '.join(EXAMPLES)}")
    return ["python", "-m", EXAMPLES[name], *extra, *(["--json-out", json_out] if json_out else [])]


def check_options(name: str, argv: list[str], ranks: int) -> str | None:
    """Check example ``name``'s options ``argv`` for a job of ``ranks`` ranks with the example's own parser.

    Returns the example's help text where ``argv`` asks for it (-h/--help), else None; a bad option
    raises :class:`~tvm_combiners.app.usage.UsageError` naming the option and the rule.
    """
    module = importlib.import_module(EXAMPLES[name])
    parser = module.parser(prog=f"tvm-combiners launch -n {ranks} --example {name} --")
    if "-h" in argv or "--help" in argv:
        return parser.format_help()
    module.config(parser.parse_args(argv), ranks)
    return None


def require_positive(args: argparse.Namespace, *names: str) -> None:
    """Each option ``--name`` is an integer >= 1 (0 steps, rows or repeats leave nothing to check or time)."""
    for name in names:
        value = getattr(args, name)
        if value is not None and value < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be a positive integer, got {value}")


def require_finite(args: argparse.Namespace, name: str, low: float, strict: bool) -> None:
    """Option ``--name`` is a finite number above ``low`` (or at least ``low`` where not ``strict``)."""
    value = getattr(args, name)
    if not math.isfinite(value) or value < low or strict and value == low:
        rule = f"a finite number {'>' if strict else '>='} {low:g}"
        raise UsageError(f"--{name.replace('_', '-')} must be {rule}, got {value:g}")
