"""Hashable wrappers that compare IR objects structurally (attributes, symbolic dimensions)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class StructKey:
    """Wraps an IR object so dict keys compare it by structure rather than identity."""

    __slots__ = ("obj", "_hash", "_equal")

    def __init__(self, obj: Any, hash_fn: Callable[[Any], int], equal_fn: Callable[[Any, Any], bool]) -> None:
        self.obj = obj
        self._hash = 0 if obj is None else int(hash_fn(obj))
        self._equal = equal_fn

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StructKey) or self._hash != other._hash:
            return False
        if self.obj is None or other.obj is None:
            return self.obj is None and other.obj is None
        return bool(self._equal(self.obj, other.obj))

    def __repr__(self) -> str:
        return f"StructKey({self.obj})"


class SymDim:
    """A symbolic dimension: compares by ``key``, keeps the IR expression for rebuilding.

    The key defaults to the printed form; an IR whose variables may share a name passes a key that
    compares them by identity (Relax's ONNX importer names every dynamic Squeeze's extent alike, and
    two different ``b`` extents would make two weights look concatenable).
    """

    __slots__ = ("name", "expr", "key")

    def __init__(self, expr: Any, key: Any = None) -> None:
        self.expr = expr
        self.name = str(expr)
        self.key = self.name if key is None else key

    def __hash__(self) -> int:
        return hash(("sym", self.key))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SymDim) and other.key == self.key

    def __repr__(self) -> str:
        return self.name
