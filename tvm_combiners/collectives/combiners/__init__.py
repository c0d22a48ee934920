"""The IR-neutral half of the collective combiners: keys, options, planning and the pass factories.

The passes themselves live with each IR's ops, in :mod:`tvm_combiners.collectives.relax` and
:mod:`tvm_combiners.collectives.relay` (each IR's TVM lives in its own environment).
"""

from __future__ import annotations

from .options import CombineReport

__all__ = ["CombineReport"]
