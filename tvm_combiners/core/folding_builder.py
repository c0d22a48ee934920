"""The data-movement half of a :class:`PlanBuilder`, folding constants with numpy.

Concatenating, padding, broadcasting or reshaping constant weights at pass time leaves one
constant in the module instead of a per-call op. Adapters subclass this and supply how to read
and make constants and how to emit each op on non-constant values.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .graph import Dim


class FoldingBuilder:
    def constant_value(self, value: Any) -> np.ndarray | None:
        """The numpy value of ``value`` when it is a constant, else None."""
        raise NotImplementedError

    def make_constant(self, array: np.ndarray) -> Any:
        raise NotImplementedError

    def emit_concat(self, parts: Sequence[Any], axis: int) -> Any:
        raise NotImplementedError

    def emit_pad(self, value: Any, pads: Sequence[tuple[int, int]]) -> Any:
        raise NotImplementedError

    def emit_broadcast(self, value: Any, shape: Sequence[Dim]) -> Any:
        raise NotImplementedError

    def emit_reshape(self, value: Any, shape: Sequence[Dim]) -> Any:
        raise NotImplementedError

    def concat(self, parts: Sequence[Any], axis: int) -> Any:
        if len(parts) == 1:
            return parts[0]
        arrays = [self.constant_value(p) for p in parts]
        if all(a is not None for a in arrays):
            return self.make_constant(np.concatenate(arrays, axis=axis))
        return self.emit_concat(parts, axis)

    def pad(self, value: Any, pads: Sequence[tuple[int, int]]) -> Any:
        array = self.constant_value(value)
        return self.emit_pad(value, pads) if array is None else self.make_constant(np.pad(array, pads))

    def broadcast(self, value: Any, shape: Sequence[Dim]) -> Any:
        array = self.constant_value(value)
        if array is None or not all(isinstance(d, int) for d in shape):
            return self.emit_broadcast(value, shape)
        array = array.reshape((1,) * (len(shape) - array.ndim) + array.shape)
        return self.make_constant(np.ascontiguousarray(np.broadcast_to(array, tuple(shape))))

    def reshape(self, value: Any, shape: Sequence[Dim]) -> Any:
        array = self.constant_value(value)
        if array is None or not all(isinstance(d, int) for d in shape):
            return self.emit_reshape(value, shape)
        return self.make_constant(array.reshape(tuple(shape)))
