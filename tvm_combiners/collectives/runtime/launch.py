"""Run a command on N ranks with the venv's mpiexec, and never let a rank wait forever.

``python`` programs run under mpi4py's entry point (``rank_main.py``, which is ``python -m mpi4py``
plus a marker at the program's end): an uncaught exception on one rank then calls MPI_Abort and ends
the whole job (plain ``python prog.py`` would leave the other ranks waiting in their collectives),
and a rank that mpiexec stopped before its program ended is named even when the job exits 0.  A hung rank is handled by the timeout: mpiexec gets SIGTERM (it tears down
its ranks), then every process of the job still alive gets SIGKILL.  Each rank's stderr goes to its
own file (mpiexec's ``-errfile-pattern``) and is copied live to our stderr prefixed ``[rank R]``; at
the end every rank that raised is named with its error.  stdout passes through untouched.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ...host import on_start_cores, usable_cores
from .rank_main import ABORT_PREFIX, LOST_ERROR_PREFIX, MARKER_DIR

DEFAULT_TIMEOUT = 300.0
PREFIX = "tvm-combiners launch"
# interpreter options that take a value, kept before rank_main.py
_PY_VALUE_OPTS = {"-W", "-X", "--check-hash-based-pycs"}
_PYTHON = re.compile(r"python(\d+(\.\d+)?)?")


def find_mpiexec() -> str:
    """mpiexec beside this interpreter (the mpich wheel puts it in the venv's bin/), else on PATH."""
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("mpiexec")
    if found is None:
        raise FileNotFoundError(f"{PREFIX}: mpiexec not found beside {sys.executable} nor on PATH: "
                                "install the mpich wheel (pip install mpich mpi4py)")
    return found


RANK_MAIN = str(Path(__file__).with_name("rank_main.py"))


def rank_command(argv: list[str]) -> list[str]:
    """``python [opts] prog.py args`` -> ``<this python> [opts] rank_main.py prog.py args``; others unchanged.

    A bare ``python``/``python3`` becomes this interpreter, so the ranks see the same packages;
    ``python -m mpi4py ...`` runs through rank_main.py too.
    """
    if not argv or not _PYTHON.fullmatch(os.path.basename(argv[0])):
        return list(argv)
    exe = sys.executable if argv[0] in ("python", "python3") else argv[0]
    i = 1
    while i < len(argv) and argv[i].startswith("-") and argv[i] not in ("-m", "-c", "-"):
        i += 2 if argv[i] in _PY_VALUE_OPTS else 1
    rest = argv[i + 2:] if argv[i:i + 2] == ["-m", "mpi4py"] else argv[i:]
    return [exe, *argv[1:i], RANK_MAIN, *rest]


def rank_error(text: str, recorded: str | None = None, records_errors: bool = False) -> str | None:
    """The error a rank's stderr reports: the runtime's own line for an error TVM 0.16 loses, else
    the reason the rank ``recorded`` (``rank_main.record_error``: its last stderr lines may be lost),
    a traceback's last line, a fatal Python error, the runtime's reason to abort, or MPI's abort.

    ``records_errors``: the rank ran under ``rank_main``, which records every uncaught exception and
    the runtime's aborts, so a traceback or abort line it did not record was handled, or printed by
    a rank the others' failure stopped: not its error (a review: such a rank was named as failed)."""
    lines = text.splitlines()
    said = None
    for line in lines:  # the runtime's line counts only where TVM then failed with a bare "TVMError:"
        if line.startswith(LOST_ERROR_PREFIX):
            said = line[len(LOST_ERROR_PREFIX):].strip()
        elif line.strip() == "TVMError:" and said is not None:
            return said
    if recorded:
        return recorded
    error = None
    if not records_errors:  # the last traceback's error
        for i, line in enumerate(lines):
            if line.startswith("Traceback (most recent call last):"):
                error = next((f.strip() for f in lines[i + 1:] if f and not f[0].isspace()), error)
    if error is None:  # a crash (faulthandler's line)
        error = next((ln.strip() for ln in lines if ln.startswith("Fatal Python error:")), None)
    if error is None and not records_errors:  # why the runtime aborted, else MPI's abort line
        error = next((ln[len(ABORT_PREFIX):].strip() for ln in lines if ln.startswith(ABORT_PREFIX)), None)
    if error is None:
        error = next((ln.strip() for ln in lines if ln.startswith("Abort(")), None)
    return error


class _Tail(threading.Thread):
    """Copies every rank's stderr file to ours line by line, prefixed with the rank."""

    def __init__(self, folder: Path, n: int) -> None:
        super().__init__(daemon=True)
        self.paths = [folder / f"rank.{r}" for r in range(n)]
        self.offsets = [0] * n
        self.partial = [b""] * n
        self.texts = [bytearray() for _ in range(n)]
        self.done = threading.Event()

    def poll(self, final: bool = False) -> None:
        for r, path in enumerate(self.paths):
            try:
                with open(path, "rb") as f:
                    f.seek(self.offsets[r])
                    chunk = f.read()
            except FileNotFoundError:
                continue
            self.offsets[r] += len(chunk)
            self.texts[r] += chunk
            data = self.partial[r] + chunk
            *lines, rest = data.split(b"\n")
            if final and rest:
                lines.append(rest)
                rest = b""
            self.partial[r] = rest
            for line in lines:
                sys.stderr.write(f"[rank {r}] {line.decode(errors='replace')}\n")
            if lines:
                sys.stderr.flush()

    def run(self) -> None:
        while not self.done.wait(0.05):
            self.poll()

    def finish(self) -> list[str]:
        self.done.set()
        self.join()
        self.poll(final=True)
        return [t.decode(errors="replace") for t in self.texts]


def _descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (from /proc; hydra's proxies start their own sessions)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _markers(folder: Path, stem: str, n: int) -> dict[int, str]:
    """Rank -> the text of its ``<stem>.<rank>`` file in launch's folder (``rank_main``), where not empty."""
    found = {}
    for r in range(n):
        with contextlib.suppress(OSError):
            text = (folder / f"{stem}.{r}").read_text(errors="replace").strip()
            if text:
                found[r] = text
    return found


def _program_ends(folder: Path, n: int) -> dict[int, int]:
    """Each rank whose program ended (``rank_main``'s markers) -> its exit code."""
    return {r: int(code) for r, code in _markers(folder, "done", n).items() if code.lstrip("-").isdigit()}


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def _left_early(ends: dict[int, int], n: int) -> tuple[str, str] | None:
    """('rank 1 ended its program, exit code 0, while rank 0 had not', 'rank 0'): only some ranks ended theirs."""
    running = [r for r in range(n) if r not in ends]
    if not ends or not running:
        return None
    codes = ", ".join(map(str, sorted(set(ends.values()))))
    return (f"{_ranks(sorted(ends))} ended {'its' if len(ends) == 1 else 'their'} program, exit code {codes}, "
            f"while {_ranks(running)} had not", _ranks(running))


def _kill_job(proc: subprocess.Popen) -> None:
    tree = _descendants(proc.pid)
    try:
        proc.send_signal(signal.SIGTERM)  # hydra forwards it and tears its ranks down
        proc.wait(timeout=3)
    except (subprocess.TimeoutExpired, ProcessLookupError):
        pass
    for pid in [proc.pid, *tree]:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    proc.wait()


_KILLING_SIGNALS = (signal.SIGILL, signal.SIGABRT, signal.SIGBUS, signal.SIGFPE, signal.SIGKILL, signal.SIGSEGV,
                    signal.SIGTERM)


def _signal_hint(code: int) -> str:
    """mpiexec exits with a killed rank's signal number (or a rank's own exit code: it cannot tell which)."""
    if code not in _KILLING_SIGNALS:
        return ""
    return f"; a rank exited with code {code}, or was killed by {signal.Signals(code).name}"


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
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


def rank_environment(n: int, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The ranks' environment: TVM's thread pool sized to this machine's share of each rank, unpinned.

    Every rank would otherwise start one worker per core, so n ranks oversubscribe the machine n
    times over (measured: Relay's per-kernel parallel launches 9x slower). A user's own
    ``TVM_NUM_THREADS`` is kept.
    """
    env = dict(os.environ if environ is None else environ)
    env.setdefault("TVM_NUM_THREADS", str(max(1, usable_cores() // n)))
    env.setdefault("PYTHONFAULTHANDLER", "1")  # a crashing rank says so ("Fatal Python error: ...")
    # TVM's pool pins the thread that starts it to the pool's first cores, the same ones on every
    # rank: 2 ranks of 1 thread each both ran on core 0 of 2 (os.sched_getaffinity: {0} on each)
    env.setdefault("TVM_BIND_THREADS", "0")
    return env


def check_job(n: int, timeout: float | None) -> float:
    """The job's timeout in seconds, once ``n`` and ``timeout`` are known to be usable (ValueError else)."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"{PREFIX}: the number of ranks must be a positive integer, got {n!r}")
    timeout = DEFAULT_TIMEOUT if timeout is None else float(timeout)
    if not 0 < timeout < math.inf:  # NaN and inf too: no rank may wait forever
        raise ValueError(f"{PREFIX}: the timeout must be a positive, finite number of seconds, got {timeout:g}")
    return timeout


def launch(n: int, argv: list[str], timeout: float | None = None) -> int:
    """Run ``argv`` on ``n`` ranks; return its exit code (124 after a timeout), naming failed ranks.

    ``timeout`` (seconds, default 300) bounds the whole job: past it every rank is killed. So does
    Ctrl-C, or a SIGTERM or SIGHUP to this process (in the main thread): the ranks are killed and
    ``KeyboardInterrupt`` (its message names the signal) propagates.
    """
    timeout = check_job(n, timeout)
    argv = list(argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise ValueError(f"{PREFIX}: no command to run: give it after '--', e.g. -n 2 -- python prog.py")
    command = rank_command(argv)  # a bare python is this interpreter, on PATH or not
    if RANK_MAIN in command and command[command.index(RANK_MAIN) + 1:][:1] in ([], ["-"]):
        raise ValueError(f"{PREFIX}: {' '.join(argv)!r} reads its program from stdin, which only rank 0 "
                         "gets (the others would wait for it forever): put the program in a file")
    if shutil.which(command[0]) is None:
        raise ValueError(f"{PREFIX}: command not found: {argv[0]!r} (not an executable path, nor on PATH)")
    mpiexec = find_mpiexec()
    marked = RANK_MAIN in command  # python ranks mark the end of their program
    with tempfile.TemporaryDirectory(prefix="tvm-combiners-launch-") as folder:
        cmd = [mpiexec, "-n", str(n), "-errfile-pattern", f"{folder}/rank.%r", *command]
        tail = _Tail(Path(folder), n)
        tail.start()
        start = time.monotonic()
        timed_out, proc = False, None
        try:
            with _terminate_as_interrupt():
                env = {**rank_environment(n), MARKER_DIR: folder}
                with on_start_cores():  # ranks forked from a thread TVM's pool pinned ran all on its core
                    proc = subprocess.Popen(cmd, start_new_session=True, env=env)
                code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_job(proc)
            code = 124
        except BaseException:  # Ctrl-C, SIGTERM, SIGHUP: never leave ranks behind (their own session)
            if proc is not None:
                _kill_job(proc)
            tail.finish()
            raise
        texts = tail.finish()
        ends = _program_ends(Path(folder), n) if marked else {}
        # each rank's reason to fail as it wrote it (rank_main.record_error): its stderr may be lost
        recorded = _markers(Path(folder), "error", n) if marked else {}
        early = _left_early(ends, n) if marked else None
    elapsed = time.monotonic() - start
    failed = [(r, err) for r, err in ((r, rank_error(t, recorded.get(r), marked)) for r, t in enumerate(texts))
              if err]
    if code == 0 and not timed_out and not early:
        failed = []  # a traceback a rank printed and handled: the job succeeded
    for r, err in failed:
        print(f"{PREFIX}: rank {r} failed: {err}", file=sys.stderr)
    if timed_out:
        why = (f"{early[0]}: did {early[1]} wait in a collective or recv that the others left without?" if early
               else f"every rank ended its program, exit code {', '.join(map(str, sorted(set(ends.values()))))}, "
                    "but mpiexec waited on: a process a rank started and left running holds the job's output?"
               if len(ends) == n else "a rank hung, or waits for a peer that never comes")
        print(f"{PREFIX}: timed out after {timeout:g} s: killed all {n} ranks ({why})", file=sys.stderr)
    elif code != 0 and not failed:
        print(f"{PREFIX}: the job exited with code {code} after {elapsed:.1f} s (no rank reported an error"
              f"{_signal_hint(code)}{'; ' + early[0] if early else ''})", file=sys.stderr)
    elif code == 0 and early:  # mpiexec stopped the rest when a rank left with code 0
        print(f"{PREFIX}: the job did not finish: {early[0]}; mpiexec stopped {early[1]} and exited 0 "
              "(did a rank leave with os._exit or sys.exit before its peers were done?)", file=sys.stderr)
        code = 1
    sys.stderr.flush()
    return code


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``-n/--np N [--timeout S] -- command ...`` (for ``tvm-combiners launch``)."""
    parser.add_argument("-n", "--np", dest="np", type=int, required=True, metavar="N", help="number of ranks")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="S",
                        help=f"seconds before every rank is killed (default {DEFAULT_TIMEOUT:g})")
    # dest "argv", not "command": tvm-combiners' subparsers already store the subcommand in "command"
    parser.add_argument("argv", nargs=argparse.REMAINDER, metavar="command",
                        help="the command after '--'; python programs run as under python -m mpi4py")


def main(args: argparse.Namespace) -> int:
    """Run the parsed ``launch`` arguments; 2 on a usage error, else the job's exit code."""
    try:
        return launch(args.np, args.argv, timeout=args.timeout)
    except (ValueError, FileNotFoundError) as err:
        # as the CLI's other usage errors (and argparse's own for launch) read
        print(f"tvm-combiners: error: launch: {str(err).removeprefix(PREFIX + ': ')}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as err:
        why = str(err) or "SIGINT"
        print(f"{PREFIX}: interrupted ({why}): killed all {args.np} ranks", file=sys.stderr)
        return 128 + int(getattr(signal, why, signal.SIGINT))


if __name__ == "__main__":
    _parser = argparse.ArgumentParser(prog="python -m tvm_combiners.collectives.runtime.launch", description=__doc__)
    add_arguments(_parser)
    sys.exit(main(_parser.parse_args()))
