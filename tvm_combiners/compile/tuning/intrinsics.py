"""Importing TVM's tensor intrinsics (needed to read or search tensorized schedules) in seconds, not a minute."""

from __future__ import annotations

import inspect
import linecache
import sys


def cheap_stack(context: int = 1) -> list[inspect.FrameInfo]:
    """What ``inspect.stack()`` gives TVMScript (each frame's file, line, function and source line),
    without resolving every frame's module: ``inspect.getmodule`` scans ``sys.modules`` each time."""
    frame = sys._getframe(1)
    frames = []
    while frame is not None:
        code = frame.f_code
        line = linecache.getline(code.co_filename, frame.f_lineno)
        frames.append(inspect.FrameInfo(frame, code.co_filename, frame.f_lineno, code.co_name,
                                        [line] if line else None, 0 if line else None))
        frame = frame.f_back
    return frames


def import_tensor_intrinsics() -> None:
    """Import TVM's tensor intrinsics (MetaSchedule's first tuning context does), with :func:`cheap_stack`
    for ``inspect.stack``: each of the module's ~500 TVMScript functions asks for its caller's
    stack, and that takes 48 s of every first ``--tune`` on a 2-core machine (4.8 s this way, which
    registers structurally equal intrinsics)."""
    if "tvm.s_tir.tensor_intrin" in sys.modules:
        return
    stack = inspect.stack
    inspect.stack = cheap_stack
    try:
        import tvm.s_tir.tensor_intrin  # noqa: F401
    finally:
        inspect.stack = stack
