"""A cluster of N hosts on one machine: network namespaces with hostnames of their own, one link.

    python -m tvm_combiners.collectives.testing --nodes 2 --ranks-per-node 2 [--rate 1gbit] \\
        -- python prog.py

Each node is a network namespace (``<id>-node<i>``) holding one end of a veth pair whose other end
is on a bridge of the cluster's own (with ``delay``, a TUN device instead: below); node ``i`` has
the address ``10.213.0.<10+i>`` there, and ``nodeI`` resolves to it inside every node (``ip netns
exec`` puts ``/etc/netns/<namespace>/hosts`` over ``/etc/hosts``). Commands run on a node in a UTS namespace named after it, so MPICH sees hosts
of their own and talks TCP between them, as across machines (:data:`NODE_ENV`: UCX, MPICH's network
layer here, would otherwise reach the other node's ranks through this machine's shared memory,
which no namespace hides, and no byte would cross the link). ``rate`` limits each node's egress
with ``tc``'s token bucket (``tbf``). ``delay`` gives the link latency: each node's ``eth0`` is then
a TUN device, and a thread of the process that made the cluster carries every packet between the
nodes that much after it left (:mod:`.delay`: this kernel has no ``netem``). ``launch`` reaches the
nodes through :attr:`launcher`, a script called as ssh is.

The cluster touches only what it creates: its namespaces, veths (or TUN devices), bridge and
``/etc/netns`` entries, named after the process that made them, and removed when it ends (also on
an error, Ctrl-C or SIGTERM); a cluster whose process died is removed by the next one (its TUN
devices went with the process). It needs root and iproute2's ``ip`` with util-linux's ``unshare``
(and ``/dev/net/tun`` for ``delay``); where they are missing :class:`ClusterUnavailable` says which.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from ...compile.interrupts import terminate_as_interrupt
from .delay import MTU, DelayHub, parse_delay

PREFIX = "tvc"  # every name the cluster gives starts with it, then the owner's pid
SUBNET = "10.213.0"
NETNS_ETC = Path("/etc/netns")
_OWNED = re.compile(rf"{PREFIX}(\d+)[a-z]")
_count = itertools.count()
#: The environment of every command run on a node: MPICH's UCX netmod finds two processes on one machine by
#: neither hostname nor network namespace, and then moves their data through shared memory (measured:
#: 16 MiB sent at 8-10 Gbit/s under a 1 Gbit/s ``tbf``, 15 kB through the node's eth0); with TCP only it
#: crosses the veth (0.9 Gbit/s). Ranks on one node still share memory through MPICH's own shm.
NODE_ENV = {"UCX_TLS": "tcp,self"}


class ClusterUnavailable(RuntimeError):
    """This machine cannot make the cluster (not root, a tool missing, namespaces refused)."""


def _run(*argv: str) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise ClusterUnavailable(f"{' '.join(argv)}: {(proc.stderr or proc.stdout).strip() or f'exit {proc.returncode}'}")
    return proc.stdout


def unavailable_reason() -> str | None:
    """Why this machine cannot make a cluster, or None."""
    if os.geteuid() != 0:
        return "the simulated cluster needs root (network namespaces)"
    missing = [tool for tool in ("ip", "unshare") if shutil.which(tool) is None]
    if missing:
        return f"the simulated cluster needs {' and '.join(missing)} (iproute2, util-linux)"
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale() -> list[str]:
    """Remove what clusters of processes no longer alive left behind; returns the names removed."""
    removed = []
    for ns in _run("ip", "netns", "list").split():
        owner = _OWNED.match(ns)
        if owner and "-node" in ns and not _alive(int(owner.group(1))):
            _quiet("ip", "netns", "delete", ns)
            shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)
            removed.append(ns)
    for line in _run("ip", "-o", "link", "show").splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        owner = _OWNED.match(name)
        if owner and not _alive(int(owner.group(1))):
            _quiet("ip", "link", "delete", name)
            removed.append(name)
    for folder in Path(tempfile.gettempdir()).glob(f"{PREFIX}*-*"):  # the launcher scripts' folders
        owner = _OWNED.match(folder.name)
        if owner and not _alive(int(owner.group(1))):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(str(folder))
    with contextlib.suppress(OSError):
        NETNS_ETC.rmdir()  # only where empty: a folder someone else uses stays
    return removed


def _job(argv: Sequence[str], timeout: float | None = None, capture: bool = False) -> subprocess.CompletedProcess:
    """``argv`` (a launch started on a node) to its end. Interrupted, or past ``timeout``, the launch
    gets SIGTERM and time to end its ranks (a SIGKILL would leave mpiexec and them running), then
    SIGKILL; the interrupt or ``subprocess.TimeoutExpired`` propagates."""
    pipe = subprocess.PIPE if capture else None
    with subprocess.Popen(list(argv), stdout=pipe, stderr=pipe, text=True) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except BaseException:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.communicate(timeout=60)
            except BaseException:
                proc.kill()
            raise
    return subprocess.CompletedProcess(list(argv), proc.returncode, out, err)


def _quiet(*argv: str) -> None:
    subprocess.run(argv, capture_output=True, timeout=60)


class SimulatedCluster:
    """``nodes`` hosts (``node0`` ...) on this machine; use as a context manager."""

    def __init__(self, nodes: int = 2, rate: str | None = None, delay: str | None = None) -> None:
        if not isinstance(nodes, int) or not 1 <= nodes <= 200:
            raise ValueError(f"SimulatedCluster: nodes must be an integer from 1 to 200, got {nodes!r}")
        if rate is not None and not re.fullmatch(r"\d+(\.\d+)?([kmg]?bit|[kmg]?bps)", rate):
            raise ValueError(f"SimulatedCluster: rate {rate!r} is not a tc rate such as 1gbit or 100mbit")
        self.nodes, self.rate, self.delay = nodes, rate, delay
        self._delay_s = None if delay is None else parse_delay(delay)
        self._hub: DelayHub | None = None
        self.id = f"{PREFIX}{os.getpid()}{'abcdefghijklmnopqrstuvwxyz'[next(_count) % 26]}"
        self.bridge = f"{self.id}b"
        self.names = [f"node{i}" for i in range(nodes)]
        self.namespaces = [f"{self.id}-node{i}" for i in range(nodes)]
        self.addresses = [f"{SUBNET}.{10 + i}" for i in range(nodes)]
        self._folder: str | None = None
        self._interrupts: contextlib.ExitStack | None = None

    @property
    def launcher(self) -> str:
        """A script that runs a command on a node, called as ssh is: ``[options] HOST COMMAND...``."""
        if self._folder is None:
            raise RuntimeError("SimulatedCluster: the cluster is not up")
        return str(Path(self._folder) / "enter-node")

    def hosts(self, ranks_per_node: int = 1) -> str:
        """``node0:K,node1:K,...``: launch's ``--hosts``."""
        return ",".join(f"{name}:{ranks_per_node}" for name in self.names)

    def on_node(self, node: int, argv: Sequence[str]) -> list[str]:
        """``argv`` run on node ``node`` (its network, its hostname)."""
        return ["ip", "netns", "exec", self.namespaces[node], "env", *(f"{k}={v}" for k, v in NODE_ENV.items()),
                "unshare", "--uts", "sh", "-c",
                'hostname "$0" && exec "$@"', self.names[node], *argv]

    def launch_command(self, argv: Sequence[str], ranks_per_node: int = 1, timeout: float = 300,
                       python: str = sys.executable, prefix: bool = True) -> list[str]:
        """``tvm-combiners launch`` started on node0 with ``ranks_per_node`` ranks on every node
        (``prefix=False``: the ranks' lines without ``[rank R]``)."""
        return self.on_node(0, [python, "-m", "tvm_combiners.app.cli", "launch", "--hosts", self.hosts(ranks_per_node),
                                "--launcher-exec", self.launcher, "--timeout", f"{timeout:g}",
                                *([] if prefix else ["--no-prefix"]), "--", *argv])

    def run(self, argv: Sequence[str], ranks_per_node: int = 1, timeout: float = 300) -> subprocess.CompletedProcess:
        """``argv`` under ``launch`` across every node (:meth:`launch_command`), its output captured; the
        launcher's own timeout ends the job, this one (a minute later) only a launcher that hangs."""
        done = _job(self.launch_command(argv, ranks_per_node, timeout), timeout + 60, capture=True)
        self.check_link()
        return done

    def check_link(self) -> None:
        """Raise if the delayed link's thread stopped carrying packets (the nodes were cut off)."""
        if self._hub is not None and self._hub.failed is not None:
            raise RuntimeError(f"SimulatedCluster: the delayed link stopped: {self._hub.failed}")

    def __enter__(self) -> SimulatedCluster:
        reason = unavailable_reason()
        if reason is not None:
            raise ClusterUnavailable(reason)
        self._interrupts = contextlib.ExitStack()
        self._interrupts.enter_context(terminate_as_interrupt())  # SIGTERM tears the cluster down too
        try:
            remove_stale()
            self._up()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        failed = None
        if self._hub is not None:
            self._hub.close()
            failed, self._hub = self._hub.failed, None
        for ns in self.namespaces:
            _quiet("ip", "netns", "delete", ns)
            shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)
        for i in range(self.nodes):  # a veth may outlive its namespace's deletion
            _quiet("ip", "link", "delete", f"{self.id}v{i}")
        _quiet("ip", "link", "delete", self.bridge)
        with contextlib.suppress(OSError):
            NETNS_ETC.rmdir()
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None
        if self._interrupts is not None:
            self._interrupts.close()
            self._interrupts = None
        if failed is not None and kind is None:
            raise RuntimeError(f"SimulatedCluster: the delayed link stopped: {failed}")

    def _up(self) -> None:
        if self._delay_s is None:
            _run("ip", "link", "add", self.bridge, "type", "bridge")
            _run("ip", "link", "set", self.bridge, "up")
        else:
            self._hub = DelayHub(self.addresses, self._delay_s)
        hosts = "127.0.0.1 localhost\n" + "".join(f"{a} {n}\n" for a, n in zip(self.addresses, self.names))
        for i, (ns, address) in enumerate(zip(self.namespaces, self.addresses)):
            link = f"{self.id}v{i}"  # the node's end is eth0: a veth's peer, or this TUN device renamed
            _run("ip", "netns", "add", ns)
            if self._delay_s is None:
                _run("ip", "link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", ns)
                _run("ip", "link", "set", link, "master", self.bridge, "up")
            else:  # made here, then moved: the device stays this process's, in the node's network
                try:
                    self._hub.add(link)
                except OSError as err:
                    raise ClusterUnavailable(f"SimulatedCluster: cannot make TUN device {link} for delay "
                                             f"(/dev/net/tun): {err}") from None
                _run("ip", "link", "set", link, "netns", ns)
                _run("ip", "-n", ns, "link", "set", link, "name", "eth0")
                _run("ip", "-n", ns, "link", "set", "eth0", "mtu", str(MTU))
            _run("ip", "-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
            _run("ip", "-n", ns, "link", "set", "eth0", "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            if self.rate is not None:
                _run("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", self.rate,
                     "burst", "256kb", "latency", "50ms")
            (NETNS_ETC / ns).mkdir(parents=True, exist_ok=True)
            (NETNS_ETC / ns / "hosts").write_text(hosts)
        if self._hub is not None:
            self._hub.start()
        self._folder = tempfile.mkdtemp(prefix=f"{self.id}-")
        cases = "".join(f'  {n}) ns={ns} ;;\n' for n, ns in zip(self.names, self.namespaces))
        script = Path(self.launcher)
        script.write_text(f"""#!/bin/sh
# ssh's calling form: [options] HOST COMMAND...; the command runs on the simulated node HOST
while [ $# -gt 0 ]; do
  case "$1" in
    -[bcDEeFIiJLlmOopQRSWw]) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
host=$1
shift
case "$host" in
{cases}  *) echo "no simulated host $host (hosts: {' '.join(self.names)})" >&2; exit 255 ;;
esac
exec ip netns exec "$ns" env {' '.join(f"{k}={v}" for k, v in NODE_ENV.items())} unshare --uts sh -c 'hostname "$0" && exec sh -c "$1"' "$host" "$*"
""")
        script.chmod(0o755)

    def leftovers(self) -> list[str]:
        """What of this cluster still exists (empty once it is down)."""
        found = [ns for ns in _run("ip", "netns", "list").split() if ns.startswith(self.id)]
        found += [line.split(":")[1].strip().split("@")[0] for line in _run("ip", "-o", "link", "show").splitlines()
                  if ":" in line and line.split(":")[1].strip().startswith(self.id)]
        found += [str(NETNS_ETC / ns) for ns in self.namespaces if (NETNS_ETC / ns).exists()]
        return found


def launch_across(nodes: int, argv: Sequence[str], ranks_per_node: int = 1, rate: str | None = None,
                  timeout: float = 600, prefix: bool = True, delay: str | None = None) -> int:
    """Run ``argv`` under launch on a simulated cluster made for it; the job's exit code."""
    with SimulatedCluster(nodes, rate, delay) as cluster:
        code = _job(cluster.launch_command(argv, ranks_per_node, timeout, prefix=prefix)).returncode
        cluster.check_link()
        return code


def add_cluster_options(parser: argparse.ArgumentParser) -> None:
    """A benchmark's ``--nodes N [--rate R] [--delay D]``: its ranks on N simulated hosts."""
    parser.add_argument("--nodes", type=int, default=None, metavar="N",
                        help="run the ranks on N simulated hosts, one rank each (root; TCP between them)")
    parser.add_argument("--rate", default=None, metavar="R", help="with --nodes: each host's bandwidth (tc, e.g. 1gbit)")
    parser.add_argument("--delay", default=None, metavar="D",
                        help="with --nodes: the link's one-way latency (e.g. 250us or 1ms)")


def cluster_options_error(nodes: int | None, rate: str | None, delay: str | None) -> str | None:
    """What is wrong with a benchmark's ``--nodes/--rate/--delay`` (:func:`add_cluster_options`), or
    None: checked before anything runs or prints."""
    if nodes is None:
        return "--rate and --delay need --nodes 2" if rate is not None or delay is not None else None
    if nodes != 2:
        return f"--nodes must be 2 (one rank on each), got {nodes}"
    try:
        SimulatedCluster(2, rate, delay)
    except ValueError as err:
        return str(err)
    return None


def launch_two_ranks(argv: Sequence[str], nodes: int | None = None, rate: str | None = None,
                     timeout: float = 900, delay: str | None = None) -> int:
    """A benchmark's 2 ranks, rank 0 printing its table: on this host, or one on each of 2 simulated
    hosts (``nodes`` 2, each host's egress limited to ``rate``, the link ``delay`` long)."""
    if (error := cluster_options_error(nodes, rate, delay)) is not None:
        raise SystemExit(error)
    if nodes is None:
        from ..runtime import launch

        return launch(2, list(argv), timeout=timeout, prefix=False)
    link = ", ".join(part for part in (f"tbf {rate}" if rate else "no rate limit",
                                       f"{delay} one-way latency" if delay else "") if part)
    print(f"# 2 simulated hosts, one rank each, {link}", flush=True)
    try:
        return launch_across(2, argv, 1, rate, timeout, prefix=False, delay=delay)
    except (ClusterUnavailable, ValueError) as err:
        raise SystemExit(str(err)) from None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tvm_combiners.collectives.testing",
                                     description="Run a command under launch on a simulated cluster, then remove it.")
    parser.add_argument("--nodes", type=int, default=2, help="simulated hosts (default 2)")
    parser.add_argument("--ranks-per-node", type=int, default=1, help="ranks on each host (default 1)")
    parser.add_argument("--rate", default=None, help="each host's bandwidth, as tc gives it (e.g. 1gbit)")
    parser.add_argument("--delay", default=None, help="the link's one-way latency (e.g. 250us or 1ms)")
    parser.add_argument("--timeout", type=float, default=600, help="the job's timeout in seconds (default 600)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="after '--': the command each rank runs")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command after '--'")
    try:
        return launch_across(args.nodes, command, args.ranks_per_node, args.rate, args.timeout, delay=args.delay)
    except (ClusterUnavailable, ValueError) as err:
        print(f"{parser.prog}: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{parser.prog}: interrupted: the cluster is removed", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
