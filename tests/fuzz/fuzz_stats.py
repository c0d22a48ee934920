"""Counts of fuzzed graphs per IR and pass, printed at the end of the session by the conftests."""

from __future__ import annotations

import collections
import json
import os

#: (ir, pass name) -> Counter of "graphs", "examples", "combined" (the pass changed the module).
COUNTS: dict[tuple[str, str], collections.Counter] = collections.defaultdict(collections.Counter)


def record(ir: str, pass_name: str, graphs: int, changed: bool, failed: str | None = None) -> None:
    """Count one checked module; a failing one (``failed``: the error) is only streamed, not counted."""
    if failed is None:
        c = COUNTS[(ir, pass_name)]
        c["examples"] += 1
        c["graphs"] += graphs
        c["combined"] += int(changed)
    path = os.environ.get("FUZZ_STATS")  # a long run also leaves its counts behind as it goes
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"ir": ir, "pass": pass_name, "graphs": graphs, "changed": changed,
                                "failed": failed}) + "\n")


def summary_lines() -> list[str]:
    if not COUNTS:
        return []
    lines = [f"{'ir':<6} {'pass':<36} {'graphs':>7} {'modules':>8} {'combined':>9}"]
    for (ir, name), c in sorted(COUNTS.items()):
        lines.append(f"{ir:<6} {name:<36} {c['graphs']:>7} {c['examples']:>8} {c['combined']:>9}")
    return lines
