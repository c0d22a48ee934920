"""Run a command on N ranks with the venv's mpiexec, and never let a rank wait forever.

``python`` programs run under mpi4py's entry point (``rank_main.py``, which is ``python -m mpi4py``
plus a marker at the program's end): an uncaught exception on one rank then calls MPI_Abort and ends
the whole job (plain ``python prog.py`` would leave the other ranks waiting in their collectives),
and a rank that mpiexec stopped before its program ended is named even when the job exits 0.  A hung
rank is handled by the timeout: mpiexec gets SIGTERM (it tears down its ranks), then every process of
the job still alive gets SIGKILL.  Each rank's stderr goes to its own file (mpiexec's
``-errfile-pattern``) and is copied live to our stderr prefixed ``[rank R]``; at the end every rank
that raised is named with its error.  Each rank's stdout goes to a file of its own too and is copied
to our stdout whole line by whole line, prefixed ``[rank R]`` where there are several ranks: two
ranks' lines never run together.

Across hosts (``hosts=``: MPICH hydra's ``host:slots`` list, or a hostfile), mpiexec starts each host's
ranks through its remote shell (ssh, or ``launcher_exec``); the job's folder then lives in the current
directory, which every host must see (``job_dir`` names another), and every message names the rank's
host.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
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
from pathlib import Path
from typing import Any

from ...compile.host import on_start_cores, usable_cores
from ...compile.interrupts import terminate_as_interrupt
from ...errors import install_line
from .comm import DISCO_GROUPS_ENV, group_size
from .rank_main import ABORT_PREFIX, HOST_MARKER, LOST_ERROR_PREFIX, MARKER_DIR

DEFAULT_TIMEOUT = 300.0
PREFIX = "tvm-combiners launch"
# interpreter options that take a value, kept before rank_main.py
_PY_VALUE_OPTS = {"-W", "-X", "--check-hash-based-pycs"}
_PYTHON = re.compile(r"python(\d+(\.\d+)?)?")


Hosts = list[tuple[str, int]]
_HOST = re.compile(r"[A-Za-z0-9_.\-]+")


def _host_entry(text: str, where: str) -> tuple[str, int]:
    name, _, slots = text.strip().partition(":")
    if not _HOST.fullmatch(name):
        raise ValueError(f"{PREFIX}: {where}: {text.strip()!r} is not a host name (letters, digits, '.', '-', '_')")
    if not slots:
        return name, 1
    if not slots.isdigit() or int(slots) < 1:
        raise ValueError(f"{PREFIX}: {where}: host {name!r} has {slots!r} slots: give a positive whole number")
    return name, int(slots)


def parse_hosts(spec: str) -> Hosts:
    """``"h1:2,h2:2"`` (hydra's ``-hosts`` form; a host without ``:N`` has one slot) -> ``[("h1", 2), ("h2", 2)]``."""
    entries = [e for e in spec.split(",") if e.strip()]
    if not entries:
        raise ValueError(f"{PREFIX}: --hosts {spec!r} names no host: give e.g. node1:2,node2:2")
    return _unique([_host_entry(e, f"--hosts {spec!r}") for e in entries], f"--hosts {spec!r}")


def read_hostfile(path: str | os.PathLike) -> Hosts:
    """A hydra hostfile: one ``host[:slots]`` a line; ``#`` starts a comment."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as err:
        raise ValueError(f"{PREFIX}: hostfile {str(path)!r}: {err.strerror or err}") from None
    hosts = [_host_entry(text, f"hostfile {str(path)!r} line {i}")
             for i, line in enumerate(lines, 1) if (text := line.split("#", 1)[0].strip())]
    if not hosts:
        raise ValueError(f"{PREFIX}: hostfile {str(path)!r} names no host")
    return _unique(hosts, f"hostfile {str(path)!r}")


def _unique(hosts: Hosts, where: str) -> Hosts:
    names = [h for h, _ in hosts]
    twice = sorted({h for h in names if names.count(h) > 1})
    if twice:
        raise ValueError(f"{PREFIX}: {where} names {', '.join(twice)} twice: give each host once, with its slots")
    return hosts


def host_of_rank(hosts: Hosts, rank: int) -> str:
    """The host hydra places ``rank`` on: each host's slots filled in turn, round and round."""
    slot = rank % sum(n for _, n in hosts)
    for name, n in hosts:
        if slot < n:
            return name
        slot -= n
    raise AssertionError("unreachable")


def find_mpiexec() -> str:
    """mpiexec beside this interpreter (the mpich wheel puts it in the venv's bin/), else on PATH."""
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("mpiexec")
    if found is None:
        raise FileNotFoundError(f"{PREFIX}: mpiexec not found beside {sys.executable} nor on PATH: "
                                f"{install_line('mpi', ['mpi4py', 'mpich'])}")
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
    a rank the others' failure stopped: not its error."""
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
    """Copies every rank's file (``<name>.<rank>``) to our ``stream`` (``"stderr"`` or ``"stdout"``)
    whole line by whole line, prefixed with the rank where ``prefix``, in blocks of :data:`BLOCK`
    bytes; of each rank's text it keeps the first :data:`HEAD` and last :data:`TAIL` bytes for
    :func:`rank_error` (read and kept whole, a rank's output would take about three times its size in
    memory)."""

    BLOCK = 1 << 20
    HEAD = 64 << 10
    TAIL = 1 << 20

    def __init__(self, folder: Path, n: int, name: str = "rank", stream: str = "stderr", prefix: bool = True) -> None:
        super().__init__(daemon=True)
        self.paths = [folder / f"{name}.{r}" for r in range(n)]
        self.stream, self.prefix = stream, prefix
        self.offsets = [0] * n
        self.partial = [b""] * n
        self.heads = [bytearray() for _ in range(n)]
        self.tails = [bytearray() for _ in range(n)]
        self.skipped = [False] * n  # bytes between head and tail were dropped
        self.done = threading.Event()

    def _keep(self, r: int, chunk: bytes) -> None:
        head, tail = self.heads[r], self.tails[r]
        room = self.HEAD - len(head)
        if room > 0:
            head += chunk[:room]
            chunk = chunk[room:]
        tail += chunk
        if len(tail) > self.TAIL:
            del tail[:len(tail) - self.TAIL]
            self.skipped[r] = True

    def _copy(self, r: int, chunk: bytes, final: bool) -> None:
        data = self.partial[r] + chunk
        *lines, rest = data.split(b"\n")
        if final and rest:
            lines.append(rest)
            rest = b""
        if len(rest) > self.BLOCK:  # a line with no end in sight: pass it on in pieces
            lines.append(rest)
            rest = b""
        self.partial[r] = rest
        if lines:
            lead = f"[rank {r}] " if self.prefix else ""
            out = getattr(sys, self.stream)  # looked up now: a caller may have redirected it
            try:
                out.write("".join(f"{lead}{line.decode(errors='replace')}\n" for line in lines))
                out.flush()
            except Exception:  # noqa: BLE001 - our stream closed or gone: keep reading, or a rank's file grows
                pass

    def poll(self, final: bool = False) -> None:
        for r, path in enumerate(self.paths):
            try:
                f = open(path, "rb")  # noqa: SIM115 - closed below, after a loop of reads
            except FileNotFoundError:
                continue
            with f:
                f.seek(self.offsets[r])
                while chunk := f.read(self.BLOCK):
                    self.offsets[r] += len(chunk)
                    self._keep(r, chunk)
                    self._copy(r, chunk, False)
            if final:
                self._copy(r, b"", True)

    def run(self) -> None:
        while not self.done.wait(0.05):
            self.poll()

    def finish(self) -> list[str]:
        """Each rank's stderr as :func:`rank_error` reads it: its start and its end."""
        self.done.set()
        if self.ident is not None:  # started
            self.join()
        self.poll(final=True)
        return [(bytes(h) + (b"\n" if skipped else b"") + bytes(t)).decode(errors="replace")
                for h, t, skipped in zip(self.heads, self.tails, self.skipped)]


class _Stdout(threading.Thread):
    """Copies mpiexec's own stdout (hydra's reports; the ranks' go to files) to ours as it comes, noting the
    pid and exit string of a process hydra reports as badly terminated: it names a rank killed by
    a signal (the OOM killer's SIGKILL) by nothing else."""

    PID = re.compile(rb"^=\s+(?:RANK \d+ )?PID (\d+) RUNNING AT ")
    EXIT = re.compile(rb"^YOUR APPLICATION TERMINATED WITH THE EXIT STRING: (.*?)\s*$")
    CARRY = 4096  # of a line still open, what is kept to match hydra's lines (short ones)

    def __init__(self, stream: Any) -> None:
        super().__init__(daemon=True)
        self.stream = stream
        self.pid: int | None = None
        self.exit_string = ""

    def _note(self, line: bytes) -> None:
        if self.pid is None and (found := self.PID.match(line)):
            self.pid = int(found.group(1))
        elif found := self.EXIT.match(line):
            self.exit_string = found.group(1).decode(errors="replace")

    def run(self) -> None:
        carry = b""
        while chunk := self.stream.read1(1 << 16):
            try:
                out = getattr(sys.stdout, "buffer", None)
                if out is not None:
                    out.write(chunk)
                    out.flush()
                elif sys.stdout is not None:
                    sys.stdout.write(chunk.decode(errors="replace"))
                    sys.stdout.flush()
            except Exception:  # noqa: BLE001 - our stdout closed or gone: keep draining, or mpiexec blocks
                pass
            *lines, carry = (carry + chunk).split(b"\n")
            carry = carry[-self.CARRY:]
            for line in lines:
                self._note(line)
        self._note(carry)

    def finish(self) -> None:
        """Wait for the pipe's end: a process a rank left running may hold it open, so not for long."""
        self.join(timeout=2)
        if not self.is_alive():
            self.stream.close()


def _stat(pid: int | str) -> list[bytes] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (state, ppid, ...), or None where
    the process is gone (a name is any bytes: it is skipped, not decoded)."""
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _start_time(pid: int) -> bytes | None:
    """When ``pid`` started (a pid reused by another process has another start time)."""
    fields = _stat(pid)
    return fields[19] if fields is not None and len(fields) > 19 else None


def _descendants(pid: int) -> dict[int, bytes]:
    """Every live process below ``pid`` (from /proc; hydra's proxies start their own sessions), with
    its start time."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        fields = _stat(entry) if entry.isdigit() else None
        if fields is not None and len(fields) > 19:
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = {}, [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            start = _start_time(child)
            if start is not None:
                found[child] = start
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


def _ranks(ranks: list[int], hosts: dict[int, str] | None = None) -> str:
    """``rank 1``, ``ranks 0, 2``; with ``hosts`` (rank -> host): ``rank 1 on node0``, ``ranks 0 (node0), 2 (node1)``."""
    if not hosts:
        return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))
    if len(ranks) == 1:
        return f"rank {ranks[0]} on {hosts.get(ranks[0], '?')}"
    return "ranks " + ", ".join(f"{r} ({hosts.get(r, '?')})" for r in ranks)


def _left_early(ends: dict[int, int], n: int, hosts: dict[int, str] | None = None) -> tuple[str, str] | None:
    """('rank 1 ended its program, exit code 0, while rank 0 had not', 'rank 0'): only some ranks ended theirs."""
    running = [r for r in range(n) if r not in ends]
    if not ends or not running:
        return None
    codes = ", ".join(map(str, sorted(set(ends.values()))))
    return (f"{_ranks(sorted(ends), hosts)} ended {'its' if len(ends) == 1 else 'their'} program, exit code "
            f"{codes}, while {_ranks(running, hosts)} had not", _ranks(running, hosts))


def _job_processes(folder: str) -> list[int]:
    """Live processes whose environment holds this job's ``MARKER_DIR``: every rank and whatever
    they started, a child that left the ranks' session (``setsid``) or lost its parent included."""
    mark = f"{MARKER_DIR}={folder}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        fields = _stat(entry)
        if fields is None or fields[0] == b"Z":  # gone, or dead already and waiting for its parent
            continue
        try:
            if mark in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                found.append(int(entry))
        except OSError:
            continue
    return found


_HYDRA = (b"mpiexec", b"mpiexec.hydra", b"hydra_pmi_proxy")  # the job's own processes, beside the ranks


def _started_by_a_rank(pid: int) -> bool:
    """Neither MPICH's launcher nor its proxy, nor a rank (a proxy's child)."""
    fields = _stat(pid)
    try:
        names = [Path(f"/proc/{p}/comm").read_bytes().strip() for p in (pid, int(fields[1]))] if fields else []
    except (OSError, ValueError):
        return False
    return len(names) == 2 and names[0] not in _HYDRA and names[1] != b"hydra_pmi_proxy"


def _kill_job(proc: subprocess.Popen, folder: str) -> int:
    """End the job: SIGTERM to mpiexec (hydra tears its ranks down), then SIGKILL to every process
    of the job still alive, until none is: those below mpiexec when it ended (unless their pid now
    names another process) and those carrying the job's environment. Returns how many of them the
    ranks had started (hydra's proxies start the ranks; the rest are the ranks' own children)."""
    try:  # before SIGTERM, which may end some of them; never in its way
        tree = _descendants(proc.pid)
        started = sum(map(_started_by_a_rank, _job_processes(folder)))
    except Exception:  # noqa: BLE001 - a /proc entry of an unexpected form: kill by the environment alone
        tree, started = {}, 0
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=3)
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    killed: set[int] = set()
    for _ in range(20):  # a process may fork while it is being killed: look again until none is left
        alive = [pid for pid, start in tree.items() if _start_time(pid) == start]
        alive = [pid for pid in dict.fromkeys([*alive, *_job_processes(folder)]) if pid not in killed]
        if not alive:
            break
        for pid in alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
            killed.add(pid)
        time.sleep(0.05)
    proc.wait()
    return started


_KILLING_SIGNALS = (signal.SIGILL, signal.SIGABRT, signal.SIGBUS, signal.SIGFPE, signal.SIGKILL, signal.SIGSEGV,
                    signal.SIGTERM)


def _signal_hint(code: int) -> str:
    """mpiexec exits with a killed rank's signal number (or a rank's own exit code: it cannot tell which)."""
    if code not in _KILLING_SIGNALS:
        return ""
    return f"; a rank exited with code {code}, or was killed by {signal.Signals(code).name}"


def rank_environment(n: int, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The ranks' environment: TVM's thread pool sized to this machine's share of each rank, unpinned.

    Every rank would otherwise start one worker per core, so n ranks oversubscribe the machine n
    times over (Relay's per-kernel parallel launches run 9x slower). A user's own
    ``TVM_NUM_THREADS`` is kept.
    """
    env = dict(os.environ if environ is None else environ)
    env.setdefault("TVM_NUM_THREADS", str(max(1, usable_cores() // n)))
    env.setdefault("PYTHONFAULTHANDLER", "1")  # a crashing rank says so ("Fatal Python error: ...")
    # TVM's pool pins the thread that starts it to the pool's first cores, the same ones on every
    # rank, so 2 ranks of 1 thread each would both run on core 0 of 2
    env.setdefault("TVM_BIND_THREADS", "0")
    return env


def job_hosts(hosts: Hosts | str | None = None, hostfile: str | os.PathLike | None = None) -> Hosts | None:
    """The hosts of a job from ``hosts`` (a list, or ``"h1:2,h2:2"``) or a ``hostfile``; None: this machine."""
    if hosts is not None and hostfile is not None:
        raise ValueError(f"{PREFIX}: give the hosts once: --hosts or --hostfile, not both")
    if hostfile is not None:
        return read_hostfile(hostfile)
    if isinstance(hosts, str):
        return parse_hosts(hosts)
    return None if hosts is None else _unique([_host_entry(f"{h}:{k}", "hosts") for h, k in hosts], "hosts")


def job_size(n: int | None, hosts: Hosts | None) -> int:
    """``n``, or every slot of ``hosts`` where ``n`` is None."""
    if n is None:
        if hosts is None:
            raise ValueError(f"{PREFIX}: give the number of ranks (-n N), or hosts whose slots make it")
        return sum(k for _, k in hosts)
    return n


def check_job(n: int, timeout: float | None) -> float:
    """The job's timeout in seconds, once ``n`` and ``timeout`` are known to be usable (ValueError else)."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"{PREFIX}: the number of ranks must be a positive integer, got {n!r}")
    timeout = DEFAULT_TIMEOUT if timeout is None else float(timeout)
    if not 0 < timeout < math.inf:  # NaN and inf too: no rank may wait forever
        raise ValueError(f"{PREFIX}: the timeout must be a positive, finite number of seconds, got {timeout:g}")
    return timeout


def launch(n: int | None, argv: list[str], timeout: float | None = None, prefix: bool | None = None,
           hosts: Hosts | str | None = None, hostfile: str | os.PathLike | None = None,
           launcher_exec: str | None = None, job_dir: str | os.PathLike | None = None,
           disco_groups: int | None = None) -> int:
    """Run ``argv`` on ``n`` ranks; return its exit code (124 after a timeout), naming failed ranks.

    Each rank's stdout reaches ours whole line by whole line, prefixed ``[rank R]`` where ``prefix``
    (by default: where there are several ranks); ``prefix=False`` suits a program whose rank 0 alone
    prints (a table).

    ``timeout`` (seconds, default 300) bounds the whole job: past it every rank is killed. So does
    Ctrl-C, or a SIGTERM or SIGHUP to this process (in the main thread): the ranks are killed and
    ``KeyboardInterrupt`` (its message names the signal) propagates.

    ``hosts`` (``"h1:2,h2:2"`` or ``[("h1", 2), ("h2", 2)]``) or ``hostfile`` (hydra's format) run the
    ranks on those hosts, each host's slots filled in turn (``n`` None: every slot), started through
    ssh or the program ``launcher_exec`` (called as ssh is: options, the host, the command). The job's
    folder (the ranks' output and markers) is made in ``job_dir``, by default the current directory
    when there are hosts (every host must see it), else the system's temporary folder.

    ``disco_groups`` (G) splits the ranks into G disco groups of consecutive ranks, for TVM's
    ``runtime.disco.*`` collectives called with ``in_group=True`` (``TVM_COMBINERS_DISCO_GROUPS``; G must
    divide ``n``). None leaves the environment's setting, by default one group.
    """
    hosts = job_hosts(hosts, hostfile)
    n = job_size(n, hosts)
    timeout = check_job(n, timeout)
    check_disco_groups(n, disco_groups)
    if launcher_exec is not None and shutil.which(launcher_exec) is None:
        raise ValueError(f"{PREFIX}: launcher {launcher_exec!r} is not an executable path, nor on PATH")
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
    if marked and importlib.util.find_spec("mpi4py") is None:  # every rank would fail to start, each in turn
        raise FileNotFoundError(f"{PREFIX}: python ranks run under mpi4py, which is not installed: "
                                f"{install_line('mpi', ['mpi4py', 'mpich'])}")
    where = job_dir if job_dir is not None else os.getcwd() if hosts else None
    if where is not None and not os.access(where, os.W_OK | os.X_OK):
        raise ValueError(f"{PREFIX}: the job's folder goes in {str(where)!r}, which is not a writable directory"
                         + ("" if job_dir is not None else ": run from one every host sees, or give --job-dir"))
    on_hosts = [] if hosts is None else ["-hosts", ",".join(f"{h}:{k}" for h, k in hosts)]
    if launcher_exec is not None:
        on_hosts += ["-launcher", "ssh", "-launcher-exec", shutil.which(launcher_exec) or launcher_exec]
    per_host = n if hosts is None else max(sum(1 for r in range(n) if host_of_rank(hosts, r) == h) for h, _ in hosts)
    with tempfile.TemporaryDirectory(prefix=".tvm-combiners-launch-" if hosts else "tvm-combiners-launch-",
                                     dir=where) as folder:
        cmd = [mpiexec, "-n", str(n), *on_hosts, "-errfile-pattern", f"{folder}/rank.%r",
               "-outfile-pattern", f"{folder}/out.%r", *command]
        tail = _Tail(Path(folder), n)
        tail.start()
        out_tail = _Tail(Path(folder), n, "out", "stdout", prefix=n > 1 if prefix is None else prefix)
        out_tail.start()
        start = time.monotonic()
        timed_out, proc, killed, stdout = False, None, 0, None
        try:
            with terminate_as_interrupt():
                env = {**rank_environment(per_host), MARKER_DIR: folder}
                if disco_groups is not None:
                    env[DISCO_GROUPS_ENV] = str(disco_groups)
                with on_start_cores():  # ranks forked from a thread TVM's pool pinned would all run on its core
                    proc = subprocess.Popen(cmd, start_new_session=True, env=env, stdout=subprocess.PIPE)
                stdout = _Stdout(proc.stdout)
                stdout.start()
                code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            killed = _kill_job(proc, folder)
            code = 124
        except BaseException:  # Ctrl-C, SIGTERM, SIGHUP: never leave ranks behind (their own session)
            if proc is not None:
                _kill_job(proc, folder)
            tail.finish()
            out_tail.finish()
            if stdout is not None:
                stdout.finish()
            raise
        texts = tail.finish()
        out_tail.finish()
        stdout.finish()
        ends = _program_ends(Path(folder), n) if marked else {}
        # each rank's reason to fail as it wrote it (rank_main.record_error): its stderr may be lost
        recorded = _markers(Path(folder), "error", n) if marked else {}
        waiting = _markers(Path(folder), "waiting", n) if marked else {}
        pids = {int(pid): r for r, pid in _markers(Path(folder), "pid", n).items() if pid.isdigit()}
        on = None if hosts is None else {r: host_of_rank(hosts, r) for r in range(n)}
        unseen = [] if on is None or not marked else [r for r in range(n) if r not in pids.values()]
        if on is not None and marked:
            on.update(_markers(Path(folder), HOST_MARKER, n))
        early = _left_early(ends, n, on) if marked else None
    elapsed = time.monotonic() - start
    failed = [(r, err) for r, err in ((r, rank_error(t, recorded.get(r), marked)) for r, t in enumerate(texts))
              if err]
    if code == 0 and not timed_out and not early:
        failed = []  # a traceback a rank printed and handled: the job succeeded
    for r, err in failed:
        print(f"{PREFIX}: {_ranks([r], on)} failed: {err}", file=sys.stderr)
    if timed_out:
        ended = f"every rank ended its program, exit code {', '.join(map(str, sorted(set(ends.values()))))}"
        why = (f"{early[0]}: did {early[1]} wait in a collective or recv that the others left without?" if early
               else f"{ended}, but " + "; ".join(f"{_ranks([r], on)} waited at exit for {text}" for r, text in
                                                 sorted(waiting.items())) + ": did a recv never come?"
               if len(ends) == n and waiting
               else f"{ended}, but mpiexec waited on: a process a rank started and left running holds the job's "
                    "output?" if len(ends) == n and killed
               else f"{ended}, but the ranks did not exit (in MPI_Finalize, or an exit handler)" if len(ends) == n
               else "a rank hung, or waits for a peer that never comes")
        also = f" and {killed} process{'es' * (killed > 1)} they started" if killed else ""
        print(f"{PREFIX}: timed out after {timeout:g} s: killed all {n} ranks{also} ({why})", file=sys.stderr)
    elif code != 0 and not failed and stdout.pid in pids:
        oom = "; the kernel's out-of-memory killer sends SIGKILL" if "signal 9)" in stdout.exit_string else ""
        print(f"{PREFIX}: {_ranks([pids[stdout.pid]], on)} failed: it ended without an error of its own after "
              f"{elapsed:.1f} s "
              f"(mpiexec: {stdout.exit_string or f'exit code {code}'}{oom})", file=sys.stderr)
    elif code != 0 and not failed:
        print(f"{PREFIX}: the job exited with code {code} after {elapsed:.1f} s (no rank reported an error"
              f"{_signal_hint(code)}{'; ' + early[0] if early else ''})", file=sys.stderr)
    elif code == 0 and early:  # mpiexec stopped the rest when a rank left with code 0
        print(f"{PREFIX}: the job did not finish: {early[0]}; mpiexec stopped {early[1]} and exited 0 "
              "(did a rank leave with os._exit or sys.exit before its peers were done?)", file=sys.stderr)
        code = 1
    if code != 0 and unseen and on is not None:
        print(f"{PREFIX}: {_ranks(unseen, on)} left nothing in the job's folder {folder}: did "
              f"{'it' if len(unseen) == 1 else 'they'} start, and does every host see that folder (--job-dir)?",
              file=sys.stderr)
    sys.stderr.flush()
    return code


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``-n/--np N [--hosts H:N,...|--hostfile F] [--timeout S] [--disco-groups G] -- command ...`` (for
    ``tvm-combiners launch``)."""
    parser.add_argument("-n", "--np", dest="np", type=int, default=None, metavar="N",
                        help="number of ranks (default with --hosts/--hostfile: every slot)")
    parser.add_argument("--hosts", default=None, metavar="H:N,...",
                        help="run on these hosts, N ranks a host (hydra's -hosts form), started over ssh")
    parser.add_argument("--hostfile", default=None, metavar="FILE", help="the hosts, one host[:N] a line")
    parser.add_argument("--launcher-exec", default=None, metavar="PROG",
                        help="start the ranks of other hosts with PROG instead of ssh (called as ssh is)")
    parser.add_argument("--job-dir", default=None, metavar="DIR",
                        help="where the job's folder goes (default: the current directory with hosts, which "
                             "every host must see; else the temporary folder)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="S",
                        help=f"seconds before every rank is killed (default {DEFAULT_TIMEOUT:g})")
    parser.add_argument("--disco-groups", type=int, default=None, metavar="G",
                        help="split the ranks into G groups of consecutive ranks for TVM's runtime.disco "
                             "collectives with in_group=True (G must divide N; default 1)")
    parser.add_argument("--no-prefix", action="store_true",
                        help="copy the ranks' stdout lines without their '[rank R] ' prefix (whole lines still)")
    # dest "argv", not "command": tvm-combiners' subparsers already store the subcommand in "command"
    parser.add_argument("argv", nargs=argparse.REMAINDER, metavar="command",
                        help="the command after '--'; python programs run as under python -m mpi4py")


def check_disco_groups(n: int, groups: int | None) -> None:
    """ValueError unless ``groups`` (None: not given) is a positive number of groups that divides ``n``."""
    if groups is None:
        return
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ValueError(f"{PREFIX}: --disco-groups must be a positive whole number of groups, got {groups!r}")
    group_size(groups, n, f"{PREFIX}: --disco-groups {groups}")


def resolve(args: argparse.Namespace) -> None:
    """Parsed ``launch`` arguments made whole: ``args.hosts`` a host list, ``args.np`` the number of
    ranks (every slot where -n is not given). ValueError names what is wrong."""
    args.hosts = job_hosts(args.hosts, args.hostfile)
    args.hostfile = None
    args.np = job_size(args.np, args.hosts)
    check_disco_groups(args.np, getattr(args, "disco_groups", None))


def main(args: argparse.Namespace) -> int:
    """Run the parsed ``launch`` arguments; 2 on a usage error, else the job's exit code."""
    try:
        resolve(args)
        return launch(args.np, args.argv, timeout=args.timeout, prefix=False if args.no_prefix else None,
                      hosts=args.hosts, launcher_exec=args.launcher_exec, job_dir=args.job_dir,
                      disco_groups=getattr(args, "disco_groups", None))
    except (ValueError, FileNotFoundError) as err:
        # as the CLI's other usage errors (and argparse's own for launch) read
        print(f"tvm-combiners: error: launch: {str(err).removeprefix(PREFIX + ': ')}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as err:
        why = str(err) or "SIGINT"
        print(f"{PREFIX}: interrupted ({why}): killed all {args.np} ranks", file=sys.stderr)
        return 128 + int(getattr(signal, why, signal.SIGINT))


if __name__ == "__main__":
    _parser = argparse.ArgumentParser(prog="python -m tvm_combiners.collectives.runtime.launcher", description=__doc__)
    add_arguments(_parser)
    sys.exit(main(_parser.parse_args()))
