"""How far apart two results are, as the job and the examples report it: NaN-aware, JSON-safe."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np


def exact_dtype(a: np.ndarray) -> bool:
    """Integer and bool outputs (ids, masks, counts) must match exactly: no tolerance of their scale."""
    return a.dtype.kind in "biu"


def output_diff(output: np.ndarray, reference: np.ndarray) -> float:
    """max |output - reference| in float64; equal NaNs and equal infinities agree; NaN where the shapes
    differ or a NaN or infinity meets another value (no number says how far apart those are)."""
    a, b = np.asarray(output), np.asarray(reference)
    if a.shape != b.shape:
        return math.nan
    if a.size == 0:
        return 0.0
    if exact_dtype(a) and exact_dtype(b):  # int64 ids past 2**53 differ by 1, equal in float64: Python ints
        differ = a != b
        return float(max((abs(int(x) - int(y)) for x, y in zip(a[differ], b[differ])), default=0))
    a, b = a.astype(np.float64), b.astype(np.float64)
    same = (a == b) | (np.isnan(a) & np.isnan(b))
    if not np.all(same | (np.isfinite(a) & np.isfinite(b))):
        return math.nan
    with np.errstate(invalid="ignore"):  # inf - inf where they agree: masked, not a warning on stderr
        return float(np.max(np.abs(np.where(same, 0.0, a - b))))


def output_diffs(outputs: list[np.ndarray], reference: list[np.ndarray]) -> list[float]:
    """:func:`output_diff` of each output."""
    if len(outputs) != len(reference):
        raise ValueError(f"{len(outputs)} outputs but {len(reference)} reference outputs")
    return [output_diff(o, r) for o, r in zip(outputs, reference)]


def largest(values: Iterable[float]) -> float:
    """The largest difference (0.0 of none); NaN if any is: Python's ``max`` drops a NaN that follows a
    number, so a check over outputs, steps or micro-batches would see only the first one's NaN."""
    found = [float(v) for v in values]
    return math.nan if any(math.isnan(v) for v in found) else max(found, default=0.0)


def max_abs_diff(outputs: list[np.ndarray], reference: list[np.ndarray]) -> float:
    """The largest :func:`output_diff` over all outputs; NaN if any is."""
    return largest(output_diffs(outputs, reference))


def max_abs(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| in float64 (0.0 for empty tensors)."""
    return float(np.max(np.abs(a.astype("float64") - b.astype("float64")))) if a.size else 0.0


def rel_diff(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| / max |b|: relative to the tensor's scale (elementwise ratios blow up near 0)."""
    scale = float(np.max(np.abs(b))) if b.size else 0.0
    diff = max_abs(a, b)
    return diff / scale if scale > 0 else diff


def json_safe(value: Any) -> Any:
    """``value`` as JSON can hold it: NaN and infinities become the strings 'nan', 'inf', '-inf',
    numpy scalars Python numbers, tuples lists."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value
