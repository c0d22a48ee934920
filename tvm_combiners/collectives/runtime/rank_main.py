"""What ``launch`` runs a python rank as: mpi4py's ``python -m mpi4py`` plus an end-of-program marker.

mpiexec cannot tell a rank that finished its program from one stopped on the way: when one rank
leaves early with code 0 (``os._exit(0)`` before a collective), mpiexec stops the others and the job
exits 0 although no rank finished.  So each rank writes ``done.<rank>`` (its exit code) into
launch's folder when its program ends, by returning, ``sys.exit`` or ``os._exit``; a rank without
one was stopped, and launch says so.  A rank that replaces itself with ``os.exec*`` marks nothing
(it counts as stopped); a forked child (multiprocessing's workers leave through ``os._exit``) marks
nothing for its parent.

Each rank also writes its pid to ``pid.<rank>`` (mpiexec names a rank it saw killed by its pid), its
host's name to ``host.<rank>``, and what it waits for after its program ended to ``waiting.<rank>``
(the runtime's sends at exit).
The reason a rank fails (its uncaught exception, or the runtime's reason to abort) is also written to
``error.<rank>`` there: MPI_Abort tears the job down while mpiexec may still hold the rank's last
stderr lines, and under load those lines can be lost.

Run by path, not ``-m``, so that the rank imports nothing of tvm_combiners (its package import
loads TVM, seconds per rank) and any interpreter with mpi4py can run it; kept to the standard
library for that reason.
"""

import os
import socket
import sys
import traceback

MARKER_DIR = "TVM_COMBINERS_LAUNCH_DIR"  # launch's folder, set by launch for the ranks
#: How a rank says an error that TVM 0.16's compiled code may lose (``launch`` reports this line where
#: TVM then failed with an empty ``TVMError:``).
LOST_ERROR_PREFIX = "tvm_combiners: a runtime function raised "
#: How the runtime says why it aborts the job (MPI's own abort line says only that it was called).
ABORT_PREFIX = "tvm_combiners: aborting the job: "
HOST_MARKER = "host"  # the marker holding the rank's host name
_RANK_PID = os.getpid()  # the rank itself, not a child forked from it


def exit_status(code: object) -> int:
    """The process exit status of ``sys.exit(code)``: an int (a bool too: ``sys.exit(not ok)``) as is,
    None 0, anything else (a message) 1."""
    if isinstance(code, int):
        return int(code)
    return 0 if code is None else 1


def _marker_path(stem: str) -> str | None:
    """``<launch's folder>/<stem>.<rank>`` where this process is a rank under launch, not a child
    forked from one; None elsewhere."""
    folder, rank = os.environ.get(MARKER_DIR), os.environ.get("PMI_RANK")
    if not folder or rank is None or os.getpid() != _RANK_PID:
        return None
    return os.path.join(folder, f"{stem}.{rank}")


def _write_marker(stem: str, text: str, mode: str = "w") -> None:
    """:func:`_marker_path` holds ``text`` (``mode`` "x": only if nothing is there yet)."""
    path = _marker_path(stem)
    if path is None:
        return
    try:
        with open(path, mode) as f:
            f.write(text)
    except OSError:
        pass  # launch's folder gone (launch killed), or "x" found an earlier reason: it stays


def _mark(code: object) -> None:
    _write_marker("done", f"{exit_status(code)}\n")


def record_error(text: str) -> None:
    """Leave launch this rank's reason to fail, in a file: its stderr may not reach launch (module doc).
    The first reason stays: an exception, then the exit drain's abort over a send it left behind."""
    _write_marker("error", text.strip() + "\n", "x")


def record_waiting(text: str | None) -> None:
    """Leave launch what this rank waits for after its program ended (None: nothing any more), so
    that a timeout there names it rather than guessing."""
    if text is not None:
        _write_marker("waiting", text.strip() + "\n")
    elif (path := _marker_path("waiting")) is not None:
        try:
            os.remove(path)
        except OSError:
            pass


def _exception_line(exc: BaseException) -> str:
    """The line of a traceback that names ``exc`` (a SyntaxError's comes after its source lines)."""
    lines = "".join(traceback.format_exception_only(type(exc), exc)).splitlines() or [type(exc).__name__]
    return next((ln for ln in lines if ln.strip() and not ln[0].isspace()), lines[-1]).strip()


def _marking_exit(real_exit):  # noqa: ANN001, ANN202 - keeps os._exit's signature
    def _exit(code: int) -> None:
        _mark(code)
        real_exit(code)
    return _exit


def main() -> None:
    # ran by path, python put this folder first on sys.path: give it back to the program, as -m would
    # (under -P or -I python put nothing there and there is nothing to give back)
    if sys.path and os.path.realpath(sys.path[0] or ".") == os.path.dirname(os.path.realpath(__file__)):
        sys.path[0] = os.getcwd()
    from mpi4py import run  # mpi4py's own entry: an uncaught exception calls MPI_Abort

    os._exit = _marking_exit(os._exit)
    _write_marker("pid", f"{os.getpid()}\n")  # mpiexec names a killed rank by its pid only
    _write_marker(HOST_MARKER, f"{socket.gethostname()}\n")
    try:
        run.main()
    except SystemExit as exc:
        _mark(exc.code)
        if exc.code is not None and not isinstance(exc.code, int):
            record_error(str(exc.code))  # sys.exit("message"): Python prints it, mpi4py aborts the job
        raise
    except BaseException as exc:  # mpi4py aborts the job at exit; Python prints the traceback first
        record_error(_exception_line(exc))
        raise
    _mark(0)


if __name__ == "__main__":
    main()
