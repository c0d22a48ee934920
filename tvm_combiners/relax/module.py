"""Replacing a Relax module's functions the way every module pass of the package does, and reading
a tensor type's static shape."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import tvm
from tvm import relax


def static_tensor(ty: Any) -> tuple[tuple[int, ...], str] | None:
    """A tensor type's shape and dtype where every extent is a constant; None otherwise."""
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return None
    dims = list(ty.shape.values)
    if not all(isinstance(d, tvm.tirx.IntImm) for d in dims):
        return None
    return tuple(int(d.value) for d in dims), str(ty.dtype)


def with_functions(mod: tvm.IRModule, updates: Mapping[tvm.ir.GlobalVar, tvm.ir.BaseFunc]) -> tvm.IRModule:
    """A copy of ``mod`` with ``updates`` in place of those functions, or ``mod`` itself where there
    are none: a pass never changes the module it is given, and one that changes nothing returns it."""
    if not updates:
        return mod
    mod = mod.clone()
    for gv, func in updates.items():
        mod.update_func(gv, func)
    return mod


def rewrite_functions(mod: tvm.IRModule,
                      rewrite: Callable[[str, relax.Function], relax.Function | None]) -> tvm.IRModule:
    """Each Relax function of ``mod`` through ``rewrite(name, func)``; those it changes (it returns
    another function, not None or ``func``) replace theirs in a copy (:func:`with_functions`)."""
    updates = {}
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            new = rewrite(gv.name_hint, func)
            if new is not None and not new.same_as(func):
                updates[gv] = new
    return with_functions(mod, updates)
