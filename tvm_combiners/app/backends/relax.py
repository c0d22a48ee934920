"""The Relax side of the main job."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...compile import relax_runner as runner
from ...models import import_relax
from ...relax import CombineParallelOps
from .base import COUNTED_OPS


class RelaxBackend:
    name = "relax"

    def import_model(self, model: Any) -> Any:
        return import_relax(model)[0]

    def combine(self, mod: Any, on_combine: Any, to_batch: bool) -> Any:
        return CombineParallelOps(on_combine=on_combine, to_batch=to_batch)(mod)

    def count_ops(self, mod: Any) -> dict[str, int]:
        counts = runner.count_ops(mod)
        return {k: counts.get(k, 0) + counts.get("nn." + k, 0) for k in COUNTED_OPS}

    def target_problem(self, target: str) -> str | None:
        return None  # cuda compiles everywhere (NVRTC, or nvcc with TVM_CUDA_COMPILE_MODE); it runs only where a GPU is

    def compile(self, mod: Any, target: str) -> Any:
        return runner.compile_module(mod, target)

    def run(self, built: Any, inputs: dict[str, np.ndarray], target: str) -> list[np.ndarray]:
        return runner.run_vm(built, list(inputs.values()), target)

    def time(self, built: Any, inputs: dict[str, np.ndarray], target: str, repeat: int) -> float:
        return runner.time_vm(built, list(inputs.values()), target, number=repeat)

    def has_gpu(self) -> bool:
        return runner.has_gpu()

    def tune_problem(self, target: str, root: str | None) -> str | None:
        if target == "cuda" and not self.has_gpu():
            return "--tune measures candidates on the device: tuning for cuda needs a CUDA GPU here"
        from ...compile.tuning import targets

        return targets.dependency_problem() or targets.folder_problem(root, runner.make_target(target))

    def tune(self, mod: Any, target: str, trials: int, root: str | None, say: Any, tasks: str) -> tuple[Any, Any]:
        from ...compile.tuning import search

        return search.tune(mod, runner.make_target(target), trials, root, say, tasks)

    def compile_tuned(self, mod: Any, target: str, database: Any) -> Any:
        from ...compile.tuning import search

        return search.compile_tuned(mod, runner.make_target(target), database)
