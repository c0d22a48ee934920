"""The job's output checks: a combined or tuned module must compute what the baseline does."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..backends import Backend
from ..compare import exact_dtype, largest, output_diff, output_diffs
from .errors import JobError, job_stage
from .report import Variant

#: The smallest output scale the check's tolerance is relative to: an output of all zeros may still
#: differ by ``rtol * CHECK_SCALE_FLOOR`` (float32 rounding of terms that cancel).
CHECK_SCALE_FLOOR = 1e-3


#: How far beyond the baseline's own distance from onnxruntime the combined module may stray.
NOISE_FACTOR = 10.0


#: ... but never more than this share of the output's scale: a baseline far from onnxruntime (a
#: frontend that computes something else) made the allowance so wide that random numbers passed.
NOISE_CAP = 0.05


def _scale(output: np.ndarray) -> float:
    """The largest finite magnitude of an output, at least :data:`CHECK_SCALE_FLOOR`."""
    b64 = np.asarray(output).astype(np.float64)
    finite = np.abs(b64[np.isfinite(b64)])
    return max(float(finite.max()) if finite.size else 0.0, CHECK_SCALE_FLOOR)


def reference_disagreement(noise: list[float], reference: list[np.ndarray]) -> str | None:
    """The report's line where TVM's baseline is further (``noise``, per output) from onnxruntime's
    ``reference`` than float32 noise explains (beyond :data:`NOISE_CAP` of an output's scale): the
    numbers then check TVM against itself only."""
    for i, (diff, r) in enumerate(zip(noise, reference, strict=True)):
        scale = _scale(r)
        if not diff <= NOISE_CAP * scale:
            return (f"warning: TVM's baseline differs from onnxruntime by {diff:.3g} on output {i} (scale "
                    f"{scale:.3g}): TVM computes something else for this model; the combined module is "
                    "checked against the baseline")
    return None


def check_combined(path: str, combined: list[np.ndarray], baseline: list[np.ndarray],
                    noise: list[float] | None = None, rtol: float = 1e-4) -> None:
    """A combined module must compute what the baseline does: never report a changed result as success.

    Output by output, against that output's own scale (one large output must not hide another's
    error), or, where larger, ``NOISE_FACTOR`` times the baseline's own distance from onnxruntime
    (``noise``, per output): an output computed by cancellation (a small difference of large sums)
    carries float32 noise far above its own scale, which two correct evaluations in other orders show.
    """
    problem = difference(combined, baseline, noise, rtol, "the combined module", "the baseline's")
    if problem is not None:
        raise JobError(path, "check", problem, bad_input=False)


def difference(got: list[np.ndarray], want: list[np.ndarray], noise: list[float] | None, rtol: float,
                name: str, ref: str) -> str | None:
    """How ``got`` (``name``'s outputs) differs from ``want`` (``ref``) beyond :func:`check_combined`'s
    tolerance, or None."""
    noise = [0.0] * len(want) if noise is None else noise
    for i, (c, b, off) in enumerate(zip(got, want, noise, strict=True)):
        c, b = np.asarray(c), np.asarray(b)
        diff = output_diff(c, b)
        scale = _scale(b)
        tol = max(rtol * scale, 0.0 if math.isnan(off) else min(NOISE_FACTOR * off, NOISE_CAP * scale))
        if exact_dtype(c) and exact_dtype(b):
            tol = 0.0
        if diff <= tol:
            continue
        if c.shape != b.shape:
            return f"output {i} of {name} has shape {c.shape}, {ref} {b.shape}"
        if math.isnan(diff):
            return f"output {i} of {name} has NaN or infinity where {ref} has another value"
        return f"{name}'s outputs differ from {ref} by {diff:.3e} (output {i}, allowed {tol:.1e})"
    return None


class TunedCheck:
    """Tuned modules must compute what the untuned baseline does.

    A wrong schedule (a MetaSchedule bug, a record applied to the wrong workload) would otherwise pass
    unseen, or a wrong tuned baseline would fail the combined module's check and blame the combiner.
    Where the combined module fails its check, its untuned build tells whose fault it is.
    """

    def __init__(self, path: str, backend: Backend, baseline: Any, inputs: dict[str, np.ndarray],
                 reference: list[np.ndarray], target: str, progress: Callable[[str], None]) -> None:
        self.path, self.backend, self.inputs, self.target, self.progress = path, backend, inputs, target, progress
        self.plain, self.plain_built, compile_s = self._untuned("baseline", baseline)
        self.noise = output_diffs(self.plain, reference)  # the untuned baseline's distance from onnxruntime
        self.variant = Variant("baseline untuned", backend.count_ops(baseline), compile_s,
                               max_abs_diff=largest(self.noise))

    def _untuned(self, label: str, mod: Any) -> tuple[list[np.ndarray], Any, float]:
        """The untuned module's outputs, its build, and the seconds the build took."""
        with job_stage(self.path, "check", f"TVM cannot compile or run the untuned {label} module (the tuned "
                                        "modules' reference)", bad_input=label == "baseline"):
            self.progress(f"compiling and running the untuned {label}, to check the tuned modules' outputs")
            start = time.perf_counter()
            built = self.backend.compile(mod, self.target)
            seconds = time.perf_counter() - start
            return self.backend.run(built, self.inputs, self.target), built, seconds

    def check(self, label: str, mod: Any, tuned: list[np.ndarray], blame_tuning_only: bool = False) -> None:
        """Raise where ``tuned`` differs from the untuned baseline; with ``blame_tuning_only``, only
        where ``mod`` untuned matches it (else the combiner is at fault: the caller says so)."""
        if blame_tuning_only and difference(self._untuned(label, mod)[0], self.plain, self.noise, 1e-4, "", ""):
            return
        problem = difference(tuned, self.plain, self.noise, 1e-4, f"the tuned {label} module",
                              "the untuned baseline's")
        if problem is not None:
            raise JobError(self.path, "check", f"{problem}: a tuned schedule computes something else (delete the "
                                               "--tune-dir records to tune afresh)", bad_input=True)
