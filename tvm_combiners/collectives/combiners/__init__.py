"""Collective combiners: many small allreduces, allgathers, reduce_scatters and sends become few large ones.

``combiners.relax`` and ``combiners.relay`` hold the public passes of each IR (imported lazily:
each IR's TVM lives in its own environment); :mod:`.keys` and :mod:`.planning` are IR-neutral.
"""

from __future__ import annotations

import importlib
from typing import Any

from .options import CombineReport

__all__ = ["CombineReport", "relax", "relay"]


def __getattr__(name: str) -> Any:
    if name == "relax":
        return importlib.import_module(".relax_passes", __name__)
    if name == "relay":
        return importlib.import_module(".relay_passes", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
