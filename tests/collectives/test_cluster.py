"""launch across hosts: hosts and hostfiles, and whole jobs on a simulated cluster of 2 nodes x 2 ranks.

The cluster (``tvm_combiners.collectives.testing``) is two network namespaces with hostnames of
their own, so MPICH places ranks on two hosts and talks TCP between them; it needs root and ``ip``,
and its tests skip naming what is missing. Every test checks every rank's result.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from test_ops_multirank import check_ranks

from tvm_combiners.collectives.testing import ClusterUnavailable, SimulatedCluster
from tvm_combiners.collectives.testing.cluster import unavailable_reason

PROGS = Path(__file__).parent / "progs"
TIMEOUT_S = 300


def _run(cluster: SimulatedCluster, argv: list[str], timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess:
    return cluster.run(argv, 2, timeout)  # 2 nodes x 2 ranks


def test_the_runtimes_launch_is_the_function_after_the_launcher_module_is_imported() -> None:
    code = ("import inspect, tvm_combiners.collectives.testing, tvm_combiners.collectives.runtime.launcher\n"
            "from tvm_combiners.collectives.runtime import launch\nassert inspect.isfunction(launch), launch")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_hosts_and_hostfiles_are_read_as_hydra_reads_them(tmp_path: Path) -> None:
    from tvm_combiners.collectives.runtime.launcher import host_of_rank, job_hosts, parse_hosts, read_hostfile

    assert parse_hosts("a:2,b:2") == [("a", 2), ("b", 2)]
    assert parse_hosts("a, b:3") == [("a", 1), ("b", 3)]
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# the cluster\nnode-1:2\n\nnode-2   # one slot\n")
    assert read_hostfile(hostfile) == [("node-1", 2), ("node-2", 1)]
    hosts = [("a", 2), ("b", 1)]
    assert [host_of_rank(hosts, r) for r in range(5)] == ["a", "a", "b", "a", "a"]
    for spec, error in (("a:0", "host 'a' has '0' slots: give a positive whole number"),
                        ("a:x", "host 'a' has 'x' slots"), ("a b:2", "'a b:2' is not a host name"),
                        ("a,b,a:2", "names a twice"), (",", "names no host")):
        with pytest.raises(ValueError, match=error):
            parse_hosts(spec)
    hostfile.write_text("a\nb c\n")
    with pytest.raises(ValueError, match=f"hostfile '{hostfile}' line 2: 'b c' is not a host name"):
        read_hostfile(hostfile)
    with pytest.raises(ValueError, match="--hosts or --hostfile, not both"):
        job_hosts("a", hostfile)
    with pytest.raises(ValueError, match="No such file"):
        read_hostfile(tmp_path / "missing")


def test_launch_usage_errors_name_the_host_option(tmp_path: Path) -> None:
    def launch(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "tvm_combiners.app.cli", "launch", *args, "--", "true"],
                              capture_output=True, text=True, timeout=60)

    for args, line in ((["--hosts", "a:0"], "launch: --hosts 'a:0': host 'a' has '0' slots: give a positive whole number"),
                       ([], "launch: give the number of ranks (-n N), or hosts whose slots make it"),
                       (["--hosts", "a", "--launcher-exec", str(tmp_path / "none")],
                        f"launch: launcher '{tmp_path / 'none'}' is not an executable path, nor on PATH"),
                       (["--hosts", "a", "--job-dir", str(tmp_path / "none")],
                        f"launch: the job's folder goes in '{tmp_path / 'none'}', which is not a writable directory")):
        proc = launch(*args)
        assert proc.returncode == 2 and proc.stderr.strip() == f"tvm-combiners: error: {line}", (args, proc.stderr)


def test_ranks_run_on_both_nodes_with_their_local_ranks(cluster: SimulatedCluster, tmp_path: Path) -> None:
    prog = tmp_path / "where.py"
    prog.write_text("import socket\nfrom mpi4py import MPI\nfrom tvm_combiners.compile.host import local_rank\n"
                    "c = MPI.COMM_WORLD\n"
                    "print(c.rank, socket.gethostname(), local_rank(), c.allreduce(c.rank + 1), flush=True)\n")
    proc = _run(cluster, [sys.executable, str(prog)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = sorted(proc.stdout.splitlines())
    assert lines == [f"[rank {r}] {r} node{r // 2} {r % 2} 10" for r in range(4)], proc.stdout


def test_every_collective_on_two_nodes_relax(cluster: SimulatedCluster, tmp_path: Path) -> None:
    proc = _run(cluster, [sys.executable, "-m", "tvm_combiners.collectives.selfcheck", "--ir", "relax",
                          "--out", str(tmp_path)])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    check_ranks(4, tmp_path, ("",), allreduce_runs=1)


def test_combiners_keep_results_on_two_nodes_relax(cluster: SimulatedCluster, tmp_path: Path) -> None:
    proc = _run(cluster, [sys.executable, str(PROGS / "combiners_relax_prog.py"), str(tmp_path)])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4)]
    assert [r["world_size"] for r in reports] == [4] * 4
    assert len({r["checks"] for r in reports}) == 1 and reports[0]["checks"] > 150


def test_a_rank_that_dies_on_the_second_node_ends_the_job_naming_host_and_rank(cluster: SimulatedCluster,
                                                                                tmp_path: Path) -> None:
    prog = tmp_path / "dies.py"
    prog.write_text("from mpi4py import MPI\nc = MPI.COMM_WORLD\n"
                    "if c.rank == 3:\n    raise RuntimeError('rank 3 gives up')\nc.allreduce(1)\n")
    proc = _run(cluster, [sys.executable, str(prog)], timeout=120)
    assert proc.returncode != 0
    assert "tvm-combiners launch: rank 3 on node1 failed: RuntimeError: rank 3 gives up" in proc.stderr, proc.stderr


def test_a_hung_rank_on_the_second_node_is_killed_with_every_other(cluster: SimulatedCluster, tmp_path: Path) -> None:
    prog = tmp_path / "hangs.py"
    prog.write_text("import time\nfrom mpi4py import MPI\nc = MPI.COMM_WORLD\n"
                    "if c.rank == 2:\n    time.sleep(3600)\nc.allreduce(1)\n")
    proc = _run(cluster, [sys.executable, str(prog)], timeout=20)
    assert proc.returncode == 124, proc.stderr[-3000:]
    assert "timed out after 20 s: killed all 4 ranks" in proc.stderr
    assert _processes_running(str(prog).encode()) == []


def _cmdline(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _processes_running(marker: bytes) -> list[str]:
    return [pid for pid in os.listdir("/proc") if pid.isdigit() and marker in _cmdline(pid)]


def test_ctrl_c_on_the_cluster_cli_ends_every_rank_and_removes_the_cluster(tmp_path: Path) -> None:
    """The launch on node0 gets SIGTERM (not SIGKILL) and ends its ranks; nothing is left running."""
    if (reason := unavailable_reason()) is not None:
        pytest.skip(reason)
    prog = tmp_path / "waits.py"
    prog.write_text("import time\nfrom mpi4py import MPI\nMPI.COMM_WORLD.Barrier()\nprint('up', flush=True)\n"
                    "time.sleep(600)\n")
    owner = subprocess.Popen([sys.executable, "-m", "tvm_combiners.collectives.testing", "--nodes", "2", "--delay",
                              "1ms", "--", sys.executable, str(prog)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, cwd=tmp_path)
    try:
        assert owner.stdout.readline().strip().endswith("up")  # a rank is past MPI's start
        owner.send_signal(signal.SIGINT)
        _, err = owner.communicate(timeout=120)
    finally:
        if owner.poll() is None:
            owner.kill()
    assert owner.returncode == 130, err[-3000:]
    assert "interrupted: the cluster is removed" in err
    assert _processes_running(str(prog).encode()) == []
    assert not any(tmp_path.glob(".tvm-combiners-launch-*"))  # the launch's own folder went with it
    assert not [ns for ns in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
                if ns.startswith(f"tvc{owner.pid}")]


def test_what_a_dead_owner_left_in_the_temporary_folder_goes_with_the_next_cluster() -> None:
    if (reason := unavailable_reason()) is not None:
        pytest.skip(reason)
    from tvm_combiners.collectives.testing.cluster import remove_stale

    dead = subprocess.Popen(["true"])
    dead.wait()  # its pid names a process no longer alive
    left = Path(tempfile.gettempdir()) / f"tvc{dead.pid}a-launcher"
    left.mkdir()
    (left / "enter-node").write_text("#!/bin/sh\n")
    mine = Path(tempfile.mkdtemp(prefix=f"tvc{os.getpid()}z-"))  # a live owner's stays
    try:
        assert str(left) in remove_stale()
        assert not left.exists() and mine.exists()
    finally:
        shutil.rmtree(left, ignore_errors=True)
        shutil.rmtree(mine, ignore_errors=True)


def test_a_delayed_link_that_stops_says_why_and_closes_once() -> None:
    from tvm_combiners.collectives.testing.delay import DelayHub

    hub = DelayHub(["10.213.0.10"], 0.001)
    unused = next(fd for fd in range(900, 1000) if not _is_open(fd))
    hub.fds.append(unused)  # not a descriptor: the thread's first wait fails
    hub.start()
    hub._thread.join(10)
    assert hub.failed is not None and hub.failed.startswith("OSError"), hub.failed
    hub.close()
    r, w = os.pipe()  # may reuse the numbers the hub closed: a second close must not touch them
    try:
        hub.close()
        os.write(w, b"a")
        assert os.read(r, 1) == b"a"
    finally:
        os.close(r)
        os.close(w)


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def test_the_cluster_limits_bandwidth_and_leaves_nothing_behind(tmp_path: Path) -> None:
    try:
        with SimulatedCluster(nodes=2, rate="100mbit") as made:
            shown = subprocess.run(["ip", "netns", "exec", made.namespaces[1], "tc", "qdisc", "show", "dev", "eth0"],
                                   capture_output=True, text=True, timeout=30).stdout
            assert "tbf" in shown and "100Mbit" in shown, shown
            hostname = subprocess.run(made.on_node(1, ["hostname"]), capture_output=True, text=True, timeout=30)
            assert hostname.stdout.strip() == "node1"
            assert made.leftovers()
    except ClusterUnavailable as err:
        pytest.skip(str(err))
    assert made.leftovers() == []
    with pytest.raises(ValueError, match="rate '1 gbit' is not a tc rate"):
        SimulatedCluster(rate="1 gbit")


_ECHO = """
import socket, sys, time
if sys.argv[1] == "serve":
    s = socket.create_server(("0.0.0.0", 47123))
    c, _ = s.accept()
    while data := c.recv(1 << 20):
        c.sendall(data)
else:
    for _ in range(200):  # the server may not listen yet
        try:
            c = socket.create_connection(("node1", 47123), timeout=10)
            break
        except OSError:
            time.sleep(0.05)
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for size in (100, 100, 100, 1 << 20):
        msg = bytes(i % 251 for i in range(size))
        start = time.perf_counter()
        c.sendall(msg)
        got = b""
        while len(got) < size:
            got += c.recv(1 << 20)
        print(size, time.perf_counter() - start, got == msg, flush=True)
"""


def test_the_cluster_delays_its_link_and_leaves_nothing_behind(tmp_path: Path) -> None:
    """Every packet between the nodes waits the delay (a round trip at least twice it), arrives
    whole and in order (a 1 MiB echo), and MPI runs across the link (every rank's allreduce)."""
    echo = tmp_path / "echo.py"
    echo.write_text(_ECHO)
    try:
        with SimulatedCluster(nodes=2, rate="100mbit", delay="2ms") as made:
            server = subprocess.Popen(made.on_node(1, [sys.executable, str(echo), "serve"]))
            try:
                client = subprocess.run(made.on_node(0, [sys.executable, str(echo), "call"]), capture_output=True,
                                        text=True, timeout=120)
            finally:
                server.kill()
                server.wait()
            rows = [line.split() for line in client.stdout.splitlines()]
            assert [(r[0], r[2]) for r in rows] == [("100", "True")] * 3 + [(str(1 << 20), "True")], client.stderr
            assert min(float(r[1]) for r in rows) >= 2 * 0.002, rows
            prog = tmp_path / "sum.py"
            prog.write_text("from mpi4py import MPI\nc = MPI.COMM_WORLD\nprint(c.rank, c.allreduce(c.rank + 1))\n")
            proc = made.run([sys.executable, str(prog)], 1, TIMEOUT_S)
            assert proc.returncode == 0, proc.stderr[-3000:]
            assert sorted(proc.stdout.splitlines()) == ["[rank 0] 0 3", "[rank 1] 1 3"], proc.stdout
            assert made.leftovers()
    except ClusterUnavailable as err:
        pytest.skip(str(err))
    assert made.leftovers() == []
    with pytest.raises(ValueError, match=r"delay '2 ms' is not a time from 1us to 10s, such as 250us or 1ms"):
        SimulatedCluster(delay="2 ms")


@pytest.mark.slow
@pytest.mark.parametrize("script,rows,link", [("bench_collectives.py", 16, []),
                                              ("bench_collective_combiners.py", 3, ["--delay", "250us"])])
def test_the_collective_benchmarks_run_across_two_simulated_hosts(script: str, rows: int, link: list[str]) -> None:
    if (reason := unavailable_reason()) is not None:
        pytest.skip(reason)
    bench = Path(__file__).parents[2] / "benchmarks" / script
    # no rate limit: at 1 Gbit/s the link alone takes minutes of the suite (16 MiB cases); tbf on a
    # node's link is tested above
    smoke = "--smoke" if script == "bench_collective_combiners.py" else "--quick"
    proc = subprocess.run([sys.executable, str(bench), smoke, "--nodes", "2", *link],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0] == "# 2 simulated hosts, one rank each, no rate limit" + (", 250us one-way latency" if link else "")
    table = [line for line in lines if re.match(r"(allreduce|allgather|reduce_scatter|send/recv|\d+ x )", line)]
    assert len(table) >= rows, proc.stdout
