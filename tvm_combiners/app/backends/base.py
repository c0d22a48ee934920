"""The interface the main job drives an IR through."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

#: The ops whose counts the job reports before and after combining.
COUNTED_OPS = ("matmul", "dense", "batch_matmul", "conv2d")
#: The IRs a job can use, in order of preference.
IRS = ("relax", "relay")


class Backend(Protocol):
    """What the job needs from an IR (Relax or Relay)."""

    name: str

    def import_model(self, model: Any) -> Any: ...
    def combine(self, mod: Any, on_combine: Any, to_batch: bool) -> Any: ...
    def count_ops(self, mod: Any) -> dict[str, int]: ...
    def target_problem(self, target: str) -> str | None:
        """Why this build cannot compile for ``target`` (None when it can): checked before any work."""
    def compile(self, mod: Any, target: str) -> Any: ...
    def run(self, built: Any, inputs: dict[str, np.ndarray], target: str) -> list[np.ndarray]: ...
    def time(self, built: Any, inputs: dict[str, np.ndarray], target: str, repeat: int) -> float:
        """Median seconds per run, inputs already on the device (TVM's time evaluator)."""
    def has_gpu(self) -> bool: ...
    def tune_problem(self, target: str, root: str | None) -> str | None:
        """Why ``--tune`` cannot run here (or keep its records under ``root``), or None."""
    def tune(self, mod: Any, target: str, trials: int, root: str | None, say: Any, tasks: str) -> tuple[Any, Any]:
        """Tune ``tasks`` ("all", or "gemm": GEMMs and convolutions only) of ``mod``: (database, summary)."""
    def compile_tuned(self, mod: Any, target: str, database: Any) -> Any: ...
