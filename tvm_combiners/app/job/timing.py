"""Timing the job's modules in alternating rounds, so a slow spell of a busy machine slows all of them alike."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..backends import Backend
from .report import JobReport, Variant, median_interval

#: Timing alternates between the modules in this many rounds (fewer when ``repeat`` is smaller).
ROUNDS = 10


#: A median ratio this close to 1 is no difference: more rounds are not timed to tell it apart.
UNDECIDED = 0.02


def time_alternating(backend: Backend, runnable: list[tuple[Variant, Any]], inputs: dict[str, np.ndarray],
                      target: str, repeat: int, report: JobReport, progress: Any,
                      extra: list[tuple[Variant, Any]] = ()) -> None:
    """``repeat`` timed runs per module, in rounds that time every module back to back (``extra``
    ones too, outside the speedup).

    A latency is the median of its rounds' medians; the speedup, the median of the rounds' ratios.
    """
    timed = [*runnable, *extra]
    rounds = max(1, min(ROUNDS, repeat))
    runs = -(-repeat // rounds)  # at least ``repeat`` runs in all
    *rest, last = [v.label for v, _ in timed]
    labels = f"{', '.join(rest)} and {last}" if rest else last
    progress(f"timing {labels}: {rounds} alternating round{'s' * (rounds > 1)} of {runs} run{'s' * (runs > 1)} each")
    samples: list[list[float]] = [[] for _ in timed]

    def time_rounds(count: int) -> None:
        for _ in range(count):
            for times, (_variant, built) in zip(samples, timed):
                times.append(backend.time(built, inputs, target, runs))

    time_rounds(rounds)
    if len(runnable) == 2 and rounds >= 3 and report.groups:
        # the median's interval holds 1 while the median is off it: as many rounds again narrow it
        ratios = [b / c for b, c in zip(*samples[:2])]
        low, high = median_interval(ratios)
        if low <= 1.0 <= high and abs(float(np.median(ratios)) - 1.0) > UNDECIDED:
            progress(f"the median's interval over the rounds is {low:.2f}x-{high:.2f}x: {rounds} more rounds")
            time_rounds(rounds)
    for (variant, _), times in zip(timed, samples):
        variant.latency_s = float(np.median(times))
    if len(runnable) == 2:
        report.round_speedups = [b / c for b, c in zip(*samples[:2])]
