"""The Relay side of the main job."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...compile import relay_runner as runner
from ...models import import_relay
from ...relay import CombineParallelOps
from .base import COUNTED_OPS


class RelayBackend:
    name = "relay"

    def import_model(self, model: Any) -> Any:
        return import_relay(model)

    def combine(self, mod: Any, on_combine: Any, to_batch: bool) -> Any:
        relay_mod, params = mod
        return CombineParallelOps(on_combine=on_combine, to_batch=to_batch)(relay_mod), params

    def count_ops(self, mod: Any) -> dict[str, int]:
        counts = runner.count_ops(mod[0])
        return {k: counts.get("nn." + k, 0) for k in COUNTED_OPS}

    def tune_problem(self, target: str, root: str | None) -> str | None:
        return "--tune uses MetaSchedule over Relax: run it with --ir relax (the main environment)"

    def tune(self, mod: Any, target: str, trials: int, root: str | None, say: Any, tasks: str) -> tuple[Any, Any]:
        raise NotImplementedError(self.tune_problem(target, None))

    def compile_tuned(self, mod: Any, target: str, database: Any) -> Any:
        raise NotImplementedError(self.tune_problem(target, None))

    def target_problem(self, target: str) -> str | None:
        import tvm

        if target == "cuda" and not tvm.runtime.enabled("cuda"):
            return "this Relay build of TVM has no CUDA code generation: use --ir relax for cuda"
        return None

    def compile(self, mod: Any, target: str) -> Any:
        problem = self.target_problem(target)
        if problem is not None:
            raise ValueError(problem)
        return runner.build(mod[0], mod[1], target)

    def run(self, built: Any, inputs: dict[str, np.ndarray], target: str) -> list[np.ndarray]:
        return runner.run_graph(built, inputs, target)

    def time(self, built: Any, inputs: dict[str, np.ndarray], target: str, repeat: int) -> float:
        return runner.time_graph(built, inputs, target, repeat)

    def has_gpu(self) -> bool:
        import tvm

        return tvm.runtime.enabled("cuda") and tvm.cuda(0).exist
