"""End-to-end examples on the collectives: ``tvm-combiners launch -n N --example NAME [--json]``.

- ``dp-train`` (:mod:`.dp_train`): a data-parallel training step (TVM's Gradient and optimizer,
  one allreduce per gradient, bucketed by ``AllReduceCombiner``), checked against one process
  stepping on the full batch;
- ``pipeline-bert`` (:mod:`.pipeline_bert`): MiniLM-L3 cut into pipeline stages joined by
  send/recv (merged by ``SendRecvCombiner``), checked against onnxruntime.

Each is also a program of its own: ``tvm-combiners launch -n 4 -- python -m
tvm_combiners.examples.dp_train --help``. Importing this package imports neither TVM nor MPI.
"""

from __future__ import annotations

#: ``--example`` name -> the module its ranks run.
EXAMPLES: dict[str, str] = {
    "dp-train": "tvm_combiners.examples.dp_train",
    "pipeline-bert": "tvm_combiners.examples.pipeline_bert",
}


def example_command(name: str, extra: list[str], json_out: str | None = None) -> list[str]:
    """The command every rank runs for example ``name``: extra options go to the example.

    ``json_out``: rank 0 writes the report there as JSON (the CLI prints it as the job's one document).
    """
    if name not in EXAMPLES:
        raise ValueError(f"unknown example {name!r}: choose from {', '.join(EXAMPLES)}")
    return ["python", "-m", EXAMPLES[name], *extra, *(["--json-out", json_out] if json_out else [])]
