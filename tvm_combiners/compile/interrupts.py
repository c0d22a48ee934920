"""Ctrl-C stays an interrupt through TVM.

TVM's FFI turns a KeyboardInterrupt raised inside a Python callback (a schedule rule, a pass,
MetaSchedule's) into a RuntimeError: left alone, a job would report it as a failure of the stage
("TVM cannot compile the model"), or lose it where a caller catches RuntimeError (a schedule rule
declining) and finish. :func:`keep_interrupts` records each Ctrl-C before raising it, and ends its
block in KeyboardInterrupt whatever became of it.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

_hits: list[int] = []  # every Ctrl-C a handler of ours saw


def _handler(signum: int, _frame: Any) -> None:
    _hits.append(signum)
    raise KeyboardInterrupt


@contextlib.contextmanager
def keep_interrupts() -> Iterator[None]:
    """A Ctrl-C inside the block ends it in KeyboardInterrupt, raised or swallowed on the way.

    Only where Python's own handler is in place (an ignored SIGINT stays ignored; inside another
    such block the outer one keeps watch) and on the main thread (signals are its alone).
    """
    ours = (threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler)
    if not ours:
        yield
        return
    seen = len(_hits)
    signal.signal(signal.SIGINT, _handler)
    try:
        yield
    except Exception as err:
        if len(_hits) > seen:
            raise KeyboardInterrupt from err
        raise
    else:
        if len(_hits) > seen:
            raise KeyboardInterrupt
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP raise KeyboardInterrupt while the job runs, so the ranks (in a session of
    their own, where a terminal's or a batch system's signal does not reach) are killed too."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    # a signal ignored by whoever started us (nohup ignores SIGHUP) stays ignored
    caught = [sig for sig in (signal.SIGTERM, signal.SIGHUP) if signal.getsignal(sig) is not signal.SIG_IGN]
    saved = {sig: signal.signal(sig, interrupt) for sig in caught}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
