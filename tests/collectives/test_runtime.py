"""The collectives runtime on 2, 3 and 4 ranks: every function and reduction against numpy.

Few launches, many checks each (CI has 2 cores and MPICH busy-polls): ``progs/runtime_prog.py``
runs everything on every rank and saves what it got; the expected values are recomputed here from
the same deterministic inputs.  Every launch has its own timeout.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import pytest
from test_ops_multirank import launch_prog

from tvm_combiners.collectives.runtime import launch
from tvm_combiners.collectives.runtime.launcher import RANK_MAIN, find_mpiexec, rank_command, rank_error
from tvm_combiners.collectives.runtime.nccl import choose_path, gpu_identity

PROG = Path(__file__).parent / "progs" / "runtime_prog.py"
_spec = importlib.util.spec_from_file_location("runtime_prog", PROG)
prog = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(prog)


def _run(n: int, mode: str, out: Path, timeout: float, **env: str) -> subprocess.CompletedProcess:
    return launch_prog(PROG, n, [str(out), mode], timeout, **env)


def _members(groups: str, n: int, rank: int) -> list[int]:
    if not groups:
        return list(range(n))
    return next([int(r) for r in g.split(",")] for g in groups.split(";") if str(rank) in g.split(","))


def _reduce(op: str, arrays: list[np.ndarray]) -> np.ndarray:
    stack = np.stack(arrays)
    if op == "avg":
        return (stack.sum(0) / len(arrays)).astype(stack.dtype)
    return {"sum": np.sum, "prod": np.prod, "min": np.min, "max": np.max}[op](stack, axis=0).astype(stack.dtype)


def _source(pairs: str, rank: int) -> int | None:
    return next((int(s) for s, t in (p.split(",") for p in pairs.split(";")) if int(t) == rank), None)


def expected(key: str, n: int, rank: int) -> np.ndarray:
    """What ``key`` must hold on ``rank`` of an ``n``-rank job, from numpy alone."""
    kind, *fields = key.split("|")
    data = prog.data
    if kind == "allreduce":
        groups, dtype, op, shape, salt = fields
        shape = ast.literal_eval(shape)
        return _reduce(op, [data(m, shape, dtype, int(salt)) for m in _members(groups, n, rank)])
    if kind == "allgather":
        groups, axis, salt = fields
        return np.concatenate([data(m, (2, 3, 4), "float32", int(salt)) for m in _members(groups, n, rank)],
                              axis=int(axis))
    if kind == "reduce_scatter":
        groups, op, axis, salt = fields
        members = _members(groups, n, rank)
        shape = [2, 3, 5]
        shape[int(axis)] = 12
        total = _reduce(op, [data(m, tuple(shape), "float32", int(salt)) for m in members])
        return np.split(total, len(members), axis=int(axis))[members.index(rank)]
    if kind == "token":
        return np.array(0, "int32")
    if kind == "p2p":
        _, pairs, salt, *variant = fields
        shape, dtype = {(): (prog.BIG, "float32"), ("int32",): ((3,), "int32"), ("small",): ((4,), "float32"),
                        ("scalar",): ((), "float64")}[tuple(variant)]
        src = _source(pairs, rank)
        return np.zeros(shape, dtype) if src is None else data(src, shape, dtype, int(salt))
    if kind == "staged_allreduce":
        return _reduce("max", [data(m, (2, 6), "float32", int(fields[0])) for m in range(n)])
    if kind == "staged_allgather":
        return np.concatenate([data(m, (2, 6), "float32", int(fields[0])) for m in range(n)], axis=1)
    if kind == "ccl":
        op, salt = fields[:2]  # a third field names bfloat16 inputs, saved as float32 (small integers: exact)
        inputs = [data(m, (4, 3), "float32", int(salt)) for m in range(n)]
        if op == "allgather":
            return np.concatenate(inputs, axis=0)
        if op == "broadcast":
            return inputs[0]
        return _reduce(op, inputs)
    raise AssertionError(f"unknown result {key}")


def expected_errors(n: int) -> dict[str, str]:
    c4 = f"but the job has {n} ranks (C4: every rank must be in [0, {n}))"
    return {
        "allreduce_c4": f"tvm_combiners.allreduce: groups '0;{n}' names rank {n}, {c4}",
        "allgather_c4": f"tvm_combiners.allgather: groups '{n + 1}' names rank {n + 1}, {c4}",
        "reduce_scatter_c4": f"tvm_combiners.reduce_scatter: groups '0,{n}' names rank {n}, {c4}",
        "send_c4": f"tvm_combiners.send: source_target_pairs '0,{n}' names rank {n}, {c4}",
        "recv_c4": f"tvm_combiners.recv: source_target_pairs '{n},0' names rank {n}, {c4}",
        "unknown_op": "tvm_combiners.allreduce: unknown reduction 'mean': expected one of sum, prod, min, max, avg",
        "missing_rank": ("tvm_combiners.allreduce: groups '0' leave out rank"
                         + ("s " if n > 2 else " ") + ", ".join(str(r) for r in range(1, n))
                         + ": every rank must be in exactly one group"),
        "int_avg": "tvm_combiners.allreduce: reduction 'avg' needs a float dtype, got int32",
        "scatter_divisible": (f"tvm_combiners.reduce_scatter: axis 0 has extent {n + 1}, "
                              f"not divisible by the group size {n}"),
        "axis_range": "tvm_combiners.allgather: axis 3 is out of range for a 1-d tensor",
        "c2": "tvm_combiners.send: source_target_pairs '0,1;0,1' uses source 0 twice: sources must be unique (C2)",
    }


@pytest.mark.parametrize("n", [2, 3, 4])
def test_every_function_on_n_ranks(n: int, tmp_path: Path) -> None:
    proc = _run(n, "all", tmp_path, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    # host staging (the cuda fallback) is announced once per job, by the group's first rank
    assert proc.stderr.count("collectives on cuda tensors use host-staged MPI") == 1, proc.stderr
    keys = None
    for rank in range(n):
        got = np.load(tmp_path / f"rank{rank}.npz")
        keys = keys or set(got.files)
        assert set(got.files) == keys  # every rank ran every case
        for key in got.files:
            want = expected(key, n, rank)
            assert got[key].dtype == want.dtype and got[key].shape == want.shape, key
            tol = 1e-3 if got[key].dtype == np.float16 else 1e-6
            np.testing.assert_allclose(got[key], want, rtol=tol, err_msg=f"{key} on rank {rank}")
        assert json.loads((tmp_path / f"rank{rank}.json").read_text()) == expected_errors(n)
    assert sum(k.endswith("|bfloat16") for k in keys) == 3  # R.ccl in bfloat16 ran (numpy views via ml_dtypes)
    kinds = {k.split("|")[0] for k in keys}
    assert kinds == {"allreduce", "allgather", "reduce_scatter", "token", "p2p", "staged_allreduce",
                     "staged_allgather", "ccl"}
    ops = {k.split("|")[3] for k in keys if k.startswith("allreduce")}
    assert ops == set(prog.REDUCTIONS)
    assert {k.split("|")[1] for k in keys if k.startswith("p2p")} == {"swap", "ring", "back", "partial", "drain"}


def test_failing_rank_ends_the_job_and_is_named(tmp_path: Path) -> None:
    """The failure ends the job, long before its timeout (generous: two ranks importing TVM on a
    loaded 2-core machine took over 45 s)."""
    start = time.monotonic()
    proc = _run(2, "fail", tmp_path, timeout=240)
    elapsed = time.monotonic() - start
    assert proc.returncode not in (0, 124), proc.stderr[-2000:]
    assert elapsed < 160, f"the job took {elapsed:.0f} s: the failure did not end it"
    error = "ValueError: tvm_combiners.send: source_target_pairs '1,5' names rank 5, but the job has 2 ranks"
    assert f"[rank 1] {error}" in proc.stderr, proc.stderr
    assert f"tvm-combiners launch: rank 1 failed: {error}" in proc.stderr, proc.stderr
    assert "rank 0 failed" not in proc.stderr


def test_ranks_that_disagree_on_a_symbolic_shape_all_raise(tmp_path: Path) -> None:
    """MPI does not notice an allgather whose ranks give different sizes: the larger ranks' results
    kept garbage and the job exited 0. Compiled collectives of a run-time shape compare shapes first,
    and so does every R.ccl op the runtime serves (its shape may have been symbolic)."""
    n = 2
    proc = _run(n, "shapes", tmp_path, timeout=200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = prog.data
    inputs = [data(m, (3, 2 * n), "float32", 7) for m in range(n)]
    for rank in range(n):
        got = np.load(tmp_path / f"rank{rank}.npz")
        np.testing.assert_array_equal(got["allreduce"], inputs[0] + inputs[1])
        np.testing.assert_array_equal(got["allgather"], np.concatenate(inputs, axis=1))
        np.testing.assert_array_equal(got["reduce_scatter"], np.split(inputs[0] + inputs[1], n, axis=1)[rank])
        errors = json.loads((tmp_path / f"rank{rank}.json").read_text())
        ccl = {f"ccl_{kind}": errors.pop(f"ccl_{kind}") for kind in ("allreduce", "allgather")}
        assert errors == {kind: f"ValueError: tvm_combiners.{kind}: the ranks give x of different shapes (extents "
                                f"(3..4, 4) across the group; rank {rank} gives ({3 + rank}, 4)): {kind} needs the "
                                "same shape on every rank" for kind in ("allreduce", "allgather", "reduce_scatter")}
        # TVM's own R.ccl ops over (rows, cols): (2, 3) on rank 0, (3, 2) on rank 1, the same bytes
        ccl_inputs = [data(m, (3, 2), "float32", 8) for m in range(n)]
        np.testing.assert_array_equal(got["ccl_allreduce"], ccl_inputs[0] + ccl_inputs[1])
        np.testing.assert_array_equal(got["ccl_allgather"], np.concatenate(ccl_inputs))
        assert ccl == {f"ccl_{kind}": f"ValueError: runtime.disco.{kind}: the ranks give x of different shapes "
                                      f"(extents (2..3, 2..3) across the group; rank {rank} gives "
                                      f"({2 + rank}, {3 - rank})): {kind} needs the same shape on every rank"
                       for kind in ("allreduce", "allgather")}


@pytest.mark.parametrize("check", [False, True])
def test_ranks_calling_different_collectives_are_caught_when_asked(check: bool, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Sum on rank 0, prod on rank 1: MPI returns a value on both; a send of (4, 2) lands in a recv of
    (2, 4) (the same bytes). TVM_COMBINERS_CHECK_COLLECTIVES names the calls and the shapes."""
    monkeypatch.setenv("TVM_COMBINERS_CHECK_COLLECTIVES", "1" if check else "0")
    proc = _run(2, "mismatch", tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sent = prog.data(0, (4, 2), "float32", 2)
    if not check:  # the silent cases the check exists for: no error on either rank
        assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0.npz", "rank1.npz"]
        got = np.load(tmp_path / "rank1.npz")
        np.testing.assert_array_equal(got["p2p"], sent.reshape(2, 4))
        blocks = [prog.data(r, (2,), "float32", 4) for r in range(2)]
        np.testing.assert_array_equal(got["groups"], np.concatenate(blocks))  # rank 1 asked for (1, 0)
        return
    rule = ("every rank must call the same collectives in the same order (modules whose compute differs per "
            "rank may combine differently: combine one module for every rank)")
    for rank in range(2):
        errors = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert errors.pop("out") == (
            "tvm_combiners.allreduce: the ranks of the group call different collectives here "
            f"(rank 0: allreduce sum of (3,) float32 in group (0,1); rank 1: allreduce prod of (3,) float32 in "
            f"group (0,1)): {rule}")
        assert errors.pop("ccl") == (  # TVM's own R.ccl op, served by the runtime
            "runtime.disco.allreduce: the ranks of the group call different collectives here "
            f"(rank 0: allreduce sum of (3,) float32 in group (0,1); rank 1: allreduce prod of (3,) float32 in "
            f"group (0,1)): {rule}")
        assert errors.pop("groups") == (  # rank 1 lists the group in the other order: its blocks' order
            "tvm_combiners.allgather: the ranks of the group call different collectives here "
            f"(rank 0: allgather axis 0 of (2,) float32 in group (0,1); rank 1: allgather axis 0 of (2,) float32 "
            f"in group (1,0)): {rule}")
        assert errors == ({} if rank == 0 else {
            "p2p": "tvm_combiners.recv: channel 5 from rank 0 sent float32 (4, 2), but the recv expects float32 "
                   "(2, 4): the send's shape or dtype differs from the recv's"})
    np.testing.assert_array_equal(np.load(tmp_path / "rank0.npz")["p2p"], np.zeros((2, 4)))  # no target: zeros


def test_a_recv_placed_before_its_send_gives_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Relay without OrderSendRecv may put a rank's recv before the send its peer waits for: it blocked
    forever outside ``launch``. Each recv now raises after TVM_COMBINERS_RECV_TIMEOUT s."""
    monkeypatch.setenv("TVM_COMBINERS_RECV_TIMEOUT", "2")
    proc = _run(2, "recv_first", tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in range(2):
        peer = 1 - rank
        error = json.loads((tmp_path / f"rank{rank}.json").read_text())["error"]
        assert error == (f"TimeoutError: tvm_combiners.recv: channel 3: nothing came from rank {peer} in 2 s: a recv placed before "
                         "the send it waits for never returns (run OrderSendRecv before building); if rank "
                         f"{peer} is only slow, raise TVM_COMBINERS_RECV_TIMEOUT")
        got = np.load(tmp_path / f"rank{rank}.npz")["out"]
        np.testing.assert_array_equal(got, prog.data(peer, (2,), "float32", 3))


def test_hung_rank_is_killed_by_the_timeout(tmp_path: Path) -> None:
    start = time.monotonic()
    proc = _run(2, "hang", tmp_path, timeout=6)
    elapsed = time.monotonic() - start
    assert proc.returncode == 124
    assert elapsed < 50, f"the timeout took {elapsed:.0f} s to end the job"  # ranks start in seconds each
    assert "tvm-combiners launch: timed out after 6 s: killed all 2 ranks" in proc.stderr, proc.stderr
    assert f"{tmp_path} hang" not in _processes(), "a rank outlived the timeout"


@pytest.mark.parametrize("mode, error", [
    ("sigkill", "rank 1 failed: it ended without an error of its own after"),
    ("segfault", "rank 1 failed: Fatal Python error: Segmentation fault"),
])
def test_a_rank_that_dies_is_reported(mode: str, error: str, tmp_path: Path) -> None:
    """sigkill: rank 1 dies of SIGKILL (the out-of-memory killer's signal) while rank 0 waits in a
    barrier; the job said "no rank reported an error" and named no rank."""
    proc = _run(2, mode, tmp_path, timeout=60)
    assert proc.returncode not in (0, 124)
    assert f"tvm-combiners launch: {error}" in proc.stderr, proc.stderr
    if mode == "sigkill":
        assert (" s (mpiexec: Killed (signal 9); the kernel's out-of-memory killer sends SIGKILL)\n"
                in proc.stderr), proc.stderr
        assert "rank 0 failed" not in proc.stderr and "no rank reported an error" not in proc.stderr


def test_a_send_the_exit_still_waits_for_is_named_at_the_timeout(tmp_path: Path) -> None:
    """Every rank ended its program; rank 0 waits at exit for a 1 MiB send rank 1 never received
    (up to the drain's timeout), past launch's. It was blamed on "a process a rank started and
    left running" (no rank started one)."""
    (tmp_path / "prog.py").write_text(
        "import numpy as np\n"
        "from tvm_combiners.collectives.runtime import functions as F, rank\n"
        f"if rank() == 0:\n{_UNRECEIVED}")
    # 45 s: two ranks importing TVM on a loaded 2-core machine may take half of that to end their programs
    proc = subprocess.run([sys.executable, "-m", "tvm_combiners.collectives.runtime.launcher", "-n", "2", "--timeout",
                           "45", "--", "python", "prog.py"], cwd=tmp_path, capture_output=True, text=True, timeout=150,
                          env={**os.environ, "TVM_COMBINERS_SEND_DRAIN_TIMEOUT": "600"})
    assert proc.returncode == 124, proc.stderr[-3000:]
    assert ("tvm-combiners launch: timed out after 45 s: killed all 2 ranks (every rank ended its program, exit code "
            "0, but rank 0 waited at exit for sends nobody has received yet (channel 5 from rank 0 to rank 1), for up "
            "to 600 s (TVM_COMBINERS_SEND_DRAIN_TIMEOUT): did a recv never come?)\n") in proc.stderr, proc.stderr[-3000:]


@pytest.mark.parametrize("mode", ["os_exit", "fork_os_exit"])
def test_a_rank_that_leaves_with_os_exit_fails_the_job(mode: str, tmp_path: Path) -> None:
    """mpiexec stopped rank 0 in its barrier and exited 0: the job passed though no rank finished.
    ``fork_os_exit``: rank 0's forked worker left through os._exit, and marked rank 0 as ended."""
    proc = _run(2, mode, tmp_path, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip().endswith(
        "tvm-combiners launch: the job did not finish: rank 1 ended its program, exit code 0, while rank 0 had not; "
        "mpiexec stopped rank 0 and exited 0 (did a rank leave with os._exit or sys.exit before its peers were "
        "done?)"), proc.stderr
    assert not list(tmp_path.glob("*.passed"))


def test_a_rank_that_leaves_with_sys_exit_is_named_at_the_timeout(tmp_path: Path) -> None:
    proc = _run(3, "sys_exit", tmp_path, timeout=6)
    assert proc.returncode == 124
    assert ("tvm-combiners launch: timed out after 6 s: killed all 3 ranks (rank 1 ended its program, exit code 0, "
            "while ranks 0, 2 had not: did ranks 0, 2 wait in a collective or recv that the others left "
            "without?)") in proc.stderr, proc.stderr


def test_ranks_that_all_end_with_os_exit_pass(tmp_path: Path) -> None:
    """Programs that skip MPI's finalization with os._exit(0) at their end are not failures.

    MPICH's mpiexec stops the other ranks when one leaves without finalizing, and a rank between
    the last barrier and its own os._exit can be stopped first (CI, 2026-11-25): then the launcher
    must name it, and a retry must pass."""
    stopped = re.compile(r"tvm-combiners launch: the job did not finish: rank (\d) ended its program, exit code 0, "
                         r"while rank (\d) had not; mpiexec stopped rank \2 and exited 0")
    for attempt in range(3):
        out = tmp_path / str(attempt)
        out.mkdir()
        proc = _run(2, "all_os_exit", out, timeout=60)
        if proc.returncode == 0:
            assert "tvm-combiners launch" not in proc.stderr
            assert sorted(p.name for p in out.glob("*.passed")) == ["rank0.passed", "rank1.passed"]
            return
        assert proc.returncode == 1 and stopped.search(proc.stderr), proc.stderr
    pytest.fail("every attempt had a rank stopped by mpiexec")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_launcher_ends_every_rank(sig: signal.Signals, tmp_path: Path) -> None:
    """The ranks run in a session of their own: a SIGTERM to the launcher left them busy-polling."""
    cmd = [sys.executable, "-m", "tvm_combiners.collectives.runtime.launcher", "-n", "2", "--timeout", "120", "--",
           "python", str(PROG), str(tmp_path), "hang"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    rank = f"{sys.executable} {RANK_MAIN} {PROG} {tmp_path} hang"  # a rank's command line (not mpiexec's)
    deadline = time.monotonic() + 60
    while _processes().splitlines().count(rank) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _processes().splitlines().count(rank) == 2, "the ranks did not start"
    time.sleep(1)  # both ranks in MPI's barrier
    proc.send_signal(sig)
    try:
        _, stderr = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:  # seen once (SIGINT, 2026-11-27, not reproduced): say who held on
        alive = "the launcher still ran" if proc.poll() is None else f"the launcher had exited ({proc.returncode})"
        ps = subprocess.run(["ps", "-ww", "-eo", "pid,ppid,stat,args"], capture_output=True, text=True).stdout
        left = [line.strip() for line in ps.splitlines() if str(tmp_path) in line]
        proc.kill()
        for line in left:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(line.split()[0]), signal.SIGKILL)
        pytest.fail(f"no end 60 s after {sig.name}: {alive}; processes of the job: {left}")
    assert proc.returncode == 128 + sig
    assert stderr.strip().endswith(f"tvm-combiners launch: interrupted ({sig.name}): killed all 2 ranks"), stderr
    assert "Traceback" not in stderr
    assert rank not in _processes().splitlines(), "a rank outlived the launcher"


def test_a_sighup_ignored_by_whoever_started_the_launcher_stays_ignored(tmp_path: Path) -> None:
    """Under nohup the job must outlive its terminal: here it runs on until its timeout."""
    cmd = [sys.executable, "-m", "tvm_combiners.collectives.runtime.launcher", "-n", "2", "--timeout", "8", "--",
           "python", str(PROG), str(tmp_path), "hang"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    time.sleep(3)
    proc.send_signal(signal.SIGHUP)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 124 and "timed out after 8 s" in stderr, stderr


def test_a_bare_python_needs_no_python_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``-- python prog.py`` runs this interpreter: where only python3 is on PATH it was refused."""
    monkeypatch.setenv("PATH", str(tmp_path))  # no python here; mpiexec sits beside this interpreter
    assert launch(2, ["python", "-c", "pass"], timeout=60) == 0


def _processes() -> str:
    """Every process's command line, whole (``ps`` cuts lines at the terminal's width without ``-ww``)."""
    return subprocess.run(["ps", "-ww", "-eo", "args"], capture_output=True, text=True).stdout


def test_cuda_tensors_on_two_ranks(tmp_path: Path) -> None:
    import tvm

    if not tvm.cuda(0).exist:
        pytest.skip("no CUDA GPU here")
    proc = _run(2, "cuda", tmp_path, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    data = prog.data
    for rank in range(2):
        got = np.load(tmp_path / f"rank{rank}.npz")
        for op in prog.REDUCTIONS:
            want = _reduce(op, [data(m, (3, 4), "float32", 1) for m in range(2)])
            np.testing.assert_allclose(got[f"allreduce|{op}"], want, rtol=1e-6)
        np.testing.assert_array_equal(got["allgather"], np.concatenate([data(m, (2, 4), "float32", 2)
                                                                        for m in range(2)], axis=1))
        total = data(0, (12, 2), "float32", 3) + data(1, (12, 2), "float32", 3)
        np.testing.assert_array_equal(got["reduce_scatter"], np.split(total, 2)[rank])
        np.testing.assert_array_equal(got["p2p"], data(1 - rank, (5,), "float32", 4))
        for op in ("min", "max"):
            np.testing.assert_array_equal(got[f"nan|{op}"], [np.nan, np.nan])
        assert got["empty"].shape == (0, 4)


# --- no launch needed -------------------------------------------------------------------------------
def test_a_recv_whose_cancel_came_too_late_keeps_its_message(monkeypatch: pytest.MonkeyPatch) -> None:
    """Review: a message matched while the timed-out recv was being cancelled was in the buffer, but
    the recv raised 'nothing came' and the next recv of the channel got the message after it."""
    from tvm_combiners.collectives.runtime import functions

    class Status:
        cancelled = False

        def Is_cancelled(self) -> bool:
            return self.cancelled

    class Request:
        def Test(self, status: Status) -> bool:
            return False

        def Cancel(self) -> None:
            pass

        def Wait(self, status: Status) -> None:
            status.cancelled = self.cancel_wins

    class World:
        def Irecv(self, buf, source, tag):
            return request

    class MPI:
        BYTE, COMM_WORLD = None, World()

    monkeypatch.setattr(functions, "mpi", lambda: MPI)
    monkeypatch.setattr(functions, "_recv_timeout", [0.01])
    request = Request()
    request.cancel_wins = False
    functions._receive("r", 3, 1, 3, np.zeros(2), Status())  # returns: the message is this recv's
    request.cancel_wins = True
    with pytest.raises(TimeoutError, match="^r: channel 3: nothing came from rank 1 in 0.01 s"):
        functions._receive("r", 3, 1, 3, np.zeros(2), Status())


def test_a_check_header_keeps_the_dtype_of_a_long_shape() -> None:
    """Review: the header was cut to 96 bytes with the dtype last, so (1,)*31 + (4,) float32 and int32
    said the same (and have the same byte count)."""
    from tvm_combiners.collectives.runtime import functions

    shape = (1,) * 31 + (4,)
    rows = [functions._text_row(functions._payload_text(np.zeros(shape, dtype)), functions._HEADER_BYTES)
            for dtype in ("float32", "int32")]
    assert functions._row_text(rows[0]) == "float32 " + str(shape) and not np.array_equal(*rows)


def test_runtime_timeouts_from_the_environment_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    from tvm_combiners.collectives.runtime import functions

    monkeypatch.delenv("TVM_COMBINERS_RECV_TIMEOUT", raising=False)
    assert functions._seconds("TVM_COMBINERS_RECV_TIMEOUT", 300) == 300
    monkeypatch.setenv("TVM_COMBINERS_RECV_TIMEOUT", "2.5")
    assert functions._seconds("TVM_COMBINERS_RECV_TIMEOUT", 300) == 2.5
    for bad in ("abc", "0", "-1", "inf", "nan"):
        monkeypatch.setenv("TVM_COMBINERS_RECV_TIMEOUT", bad)
        with pytest.raises(ValueError, match=re.escape(
                f"TVM_COMBINERS_RECV_TIMEOUT must be a positive number of seconds, got {bad!r}")):
            functions._seconds("TVM_COMBINERS_RECV_TIMEOUT", 300)
    # review: a recv posted before the value was read stayed posted, and took a later message
    posted: list[int] = []

    class MPI:
        BYTE = None

        class COMM_WORLD:
            Irecv = staticmethod(lambda *args: posted.append(1))

    monkeypatch.setattr(functions, "mpi", lambda: MPI)
    monkeypatch.setattr(functions, "_recv_timeout", [])
    with pytest.raises(ValueError, match="^TVM_COMBINERS_RECV_TIMEOUT must be"):
        functions._receive("r", 3, 1, 3, np.zeros(2), None)
    assert posted == []


def test_launch_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match=r"^tvm-combiners launch: the number of ranks must be a positive integer, got 0$"):
        launch(0, ["python", "x.py"])
    with pytest.raises(ValueError, match=r"^tvm-combiners launch: no command to run: give it after '--'"):
        launch(2, ["--"])
    for bad in (-1, 0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=rf"^tvm-combiners launch: the timeout must be a positive, finite number of "
                                             rf"seconds, got {bad:g}$"):
            launch(2, ["python", "x.py"], timeout=bad)
    with pytest.raises(ValueError, match=r"^tvm-combiners launch: command not found: 'no_such_command_xyz' "):
        launch(2, ["no_such_command_xyz"])
    for argv in (["python", "-"], ["python", "-u"], ["python"]):  # rank 1 waited on its stdin until the timeout
        with pytest.raises(ValueError, match=r"reads its program from stdin, which only rank 0 gets \(the others "
                                             r"would wait for it forever\): put the program in a file$"):
            launch(2, argv)


def test_a_traceback_a_rank_handled_fails_nothing(tmp_path: Path) -> None:
    """Review finding (2026-11-25): a rank that printed a traceback it had handled was reported as
    failed ("rank 0 failed: KeyError ...") by a job that exited 0."""
    (tmp_path / "prog.py").write_text("import traceback\ntry:\n    raise KeyError('handled')\n"
                                      "except KeyError:\n    traceback.print_exc()\n")
    proc = subprocess.run([sys.executable, "-m", "tvm_combiners.collectives.runtime.launcher", "-n", "2", "--timeout",
                           "60", "--", "python", "prog.py"], cwd=tmp_path, capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0 and "KeyError: 'handled'" in proc.stderr and "failed" not in proc.stderr, proc.stderr


def test_launch_cli_usage_errors() -> None:
    cmd = [sys.executable, "-m", "tvm_combiners.collectives.runtime.launcher", "-n", "2", "--"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("tvm-combiners: error: launch: no command to run: give it after '--', "
                                   "e.g. -n 2 -- python prog.py")
    proc = subprocess.run([*cmd[:4], "0", "--", "python", "x.py"], capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stderr.strip()) == (
        2, "tvm-combiners: error: launch: the number of ranks must be a positive integer, got 0")



def test_missing_mpiexec_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"^tvm-combiners launch: mpiexec not found beside .*python nor on PATH"):
        find_mpiexec()


def test_exit_statuses_as_python_gives_them() -> None:
    """``sys.exit(not ok)`` wrote 'False' into a rank's marker, and launch read no marker: a false failure."""
    from tvm_combiners.collectives.runtime.rank_main import exit_status

    assert [exit_status(c) for c in (None, 0, 3, False, True, "a message")] == [0, 0, 3, 0, 1, 1]


def test_python_commands_run_under_mpi4py() -> None:
    exe, main = sys.executable, RANK_MAIN
    assert rank_command(["python", "prog.py", "-v"]) == [exe, main, "prog.py", "-v"]
    assert rank_command(["python3", "-u", "-X", "dev", "prog.py"]) == [exe, "-u", "-X", "dev", main, "prog.py"]
    assert rank_command(["python", "-m", "pkg.mod", "a"]) == [exe, main, "-m", "pkg.mod", "a"]
    assert rank_command(["python", "-c", "print(1)"]) == [exe, main, "-c", "print(1)"]
    assert rank_command(["python", "-m", "mpi4py", "p.py"]) == [exe, main, "p.py"]
    assert rank_command(["/opt/py/bin/python3.11", "p.py"]) == ["/opt/py/bin/python3.11", main, "p.py"]
    assert rank_command(["./a.out", "python"]) == ["./a.out", "python"]


def test_ranks_find_the_programs_modules_as_under_python_m_mpi4py(tmp_path: Path) -> None:
    """rank_main.py runs by path: its own folder (comm.py, nccl.py...) must not shadow the program's imports."""
    (tmp_path / "comm.py").write_text("WHERE = 'cwd'\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "comm.py").write_text("WHERE = 'script dir'\n")
    (tmp_path / "sub" / "prog.py").write_text("import sys, comm\nassert comm.WHERE == 'script dir', comm.WHERE\n")
    (tmp_path / "mod.py").write_text("import comm\nassert comm.WHERE == 'cwd', comm.WHERE\n")
    for argv in (["python", "sub/prog.py"], ["python", "-m", "mod"], ["python", "-c", "import mod"]):
        proc = subprocess.run([sys.executable, "-m", "tvm_combiners.collectives.runtime.launcher", "-n", "1",
                               "--timeout", "60", "--", *argv], cwd=tmp_path, capture_output=True, text=True,
                              timeout=90)
        assert proc.returncode == 0, (argv, proc.stderr)


def test_a_programs_own_mpi_messages_never_meet_the_runtimes(tmp_path: Path) -> None:
    """Review finding (2026-11-25): the runtime sent on ``COMM_WORLD`` with tag = channel id, so a
    program's own ``COMM_WORLD.Send`` (tag 0) before a transfer on channel 0 swapped the payloads,
    silently. The runtime's tags count down from MPI's largest now."""
    (tmp_path / "prog.py").write_text(
        "import numpy as np\n"
        "from mpi4py import MPI\n"
        "from tvm_combiners.collectives.runtime import functions as F, rank\n"
        "me, world = rank(), MPI.COMM_WORLD\n"
        "if me == 0:\n"
        "    world.Send(np.full(3, -1, 'float32'), dest=1)  # tag 0, as mpi4py's default\n"
        "    F.send_np('send', '0,1', 0, np.arange(1, 4, dtype='float32'))\n"
        "    F.drain_sends()\n"
        "else:\n"
        "    got, mine = np.zeros(3, 'float32'), np.zeros(3, 'float32')\n"
        "    F.recv_np('recv', '0,1', 0, got)\n"
        "    world.Recv(mine, source=0)\n"
        "    assert got.tolist() == [1, 2, 3] and mine.tolist() == [-1, -1, -1], (got, mine)\n"
        "    print('ok', flush=True)\n")
    proc = subprocess.run([sys.executable, "-m", "tvm_combiners.collectives.runtime.launcher", "-n", "2", "--timeout",
                           "60", "--", "python", "prog.py"], cwd=tmp_path, capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr


def test_rank_error_reads_traceback_or_abort() -> None:
    text = "warning: x\nTraceback (most recent call last):\n  File \"p.py\", line 3\n    f()\nKeyError: 'k'\nAbort(1) on node 1"
    assert rank_error(text) == "KeyError: 'k'"
    assert rank_error("Abort(1) on node 1 (rank 1 in comm 0): application called MPI_Abort") == (
        "Abort(1) on node 1 (rank 1 in comm 0): application called MPI_Abort")
    assert rank_error("Fatal Python error: Segmentation fault\n\nCurrent thread 0x1:\n") == (
        "Fatal Python error: Segmentation fault")
    assert rank_error("just a warning\n") is None
    # TVM 0.16 loses an error raised in compiled code (an empty "TVMError:"): the runtime's own line
    # stands in for it, and only then (review: a caught error was reported for a rank that exited 0,
    # and hid a later crash)
    said = "tvm_combiners: a runtime function raised TimeoutError: tvm_combiners.recv: channel 2: nothing came\n"
    lost = "Traceback (most recent call last):\n  File x\ntvm._ffi.base.TVMError: Traceback (most recent call last):\n" \
           "  0: tvm::runtime::GraphExecutor::Run()\n\nTVMError: \n"
    assert rank_error(said + lost) == "TimeoutError: tvm_combiners.recv: channel 2: nothing came"
    assert rank_error(said) is None
    assert rank_error(said + "Traceback (most recent call last):\n  File x\nValueError: the real crash\n") == (
        "ValueError: the real crash")
    # what the rank wrote down beats what its stderr still shows (a handled traceback; the last lines
    # may be lost), but not the runtime's line for an error TVM 0.16 lost
    assert rank_error(text, "sends never received after 2 s: channel 5 from rank 0 to rank 1") == (
        "sends never received after 2 s: channel 5 from rank 0 to rank 1")
    assert rank_error(said + lost, "TVMError:") == "TimeoutError: tvm_combiners.recv: channel 2: nothing came"
    assert rank_error("", "ValueError: x") == "ValueError: x"
    # under rank_main every uncaught exception is recorded: a traceback it did not record was handled
    assert rank_error(text, None, records_errors=True) == "Abort(1) on node 1"
    assert rank_error("Traceback (most recent call last):\n  File x\nKeyError: 'k'\n", None, True) is None
    assert rank_error("Fatal Python error: Aborted\n", None, True) == "Fatal Python error: Aborted"


def test_each_rank_runs_on_its_own_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every rank ran on GPU 0, so NCCL refused every group and collectives always went through host memory."""
    from tvm_combiners.compile import host

    for var in host.LOCAL_RANK_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(host, "gpu_count", lambda: 4)
    assert host.rank_gpu() == 0  # one process
    for local, gpu in ((1, 1), (3, 3), (5, 1)):
        monkeypatch.setenv("MPI_LOCALRANKID", str(local))
        assert host.rank_gpu() == gpu
    monkeypatch.setattr(host, "gpu_count", lambda: 0)
    assert host.rank_gpu() == 0
    proc = subprocess.run([sys.executable, "-m", "tvm_combiners.app.cli", "launch", "-n", "2", "--", sys.executable, "-c",
                           "from tvm_combiners.compile.host import local_rank; from mpi4py import MPI; "
                           "assert local_rank() == MPI.COMM_WORLD.Get_rank(), local_rank()"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_gpu_path_selection() -> None:
    gpu0, gpu1 = ("host-a", "0"), ("host-a", "1")
    assert choose_path([(gpu0, None), (gpu1, None)]) is None
    assert choose_path([(gpu0, None), (("host-b", "0"), None)]) is None  # same index, other machine
    assert choose_path([(gpu0, None), (gpu1, None), (gpu0, None)]) == (
        "group members 0 and 2 share GPU 0 on host-a: NCCL refuses two ranks on one GPU")
    assert choose_path([(gpu0, None), (gpu1, "ImportError: no nccl")]) == (
        "nccl4py is not usable on group member 1 (ImportError: no nccl)")
    # CUDA_VISIBLE_DEVICES maps each rank's device 0 to different physical GPUs
    assert gpu_identity(0, "h", "3,5") == ("h", "3")
    assert gpu_identity(1, "h", "3,5") == ("h", "5")
    assert gpu_identity(2, "h", "") == ("h", "2")


class _FakeCudaTensor:
    """Just enough of a TVM cuda tensor for the NCCL dispatch (no GPU needed)."""

    def __init__(self, shape: tuple[int, ...], dtype: str = "float32", ptr: int = 0x1000) -> None:
        self.shape, self.dtype, self._ptr, self.synced = shape, dtype, ptr, None

    def data_ptr(self) -> int:  # a method, as on tvm.runtime.Tensor
        return self._ptr

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, 0)

    @property
    def device(self) -> _FakeCudaTensor:
        return self

    def sync(self, stream: int) -> None:
        self.synced = stream

    def numpy(self) -> np.ndarray:
        assert self.synced == 77, "staged before TVM's stream finished the tensor"
        return np.zeros(self.shape, self.dtype)

    def copyfrom(self, value: np.ndarray) -> None:
        self.copied = value


def test_cuda_dispatch_uses_nccl_on_the_stream_or_stages(monkeypatch: pytest.MonkeyPatch) -> None:
    """Which call NCCL gets (buffers, op, stream), and what falls back to host staging."""
    from tvm_combiners.collectives.runtime import comm, nccl, tensors

    calls: list[tuple] = []

    class Comm:
        def allreduce(self, send, recv, op, stream):
            calls.append(("allreduce", send.__cuda_array_interface__["data"][0],
                          recv.__cuda_array_interface__["data"][0], op, stream))

        def allgather(self, send, recv, stream):
            calls.append(("allgather", recv.__cuda_array_interface__["shape"], stream))

        def reduce_scatter(self, send, recv, op, stream):
            calls.append(("reduce_scatter", recv.__cuda_array_interface__["typestr"], op, stream))

    class Core:
        SUM, PROD, MIN, MAX, AVG = range(5)

    monkeypatch.setattr(nccl, "nccl_group", lambda groups, grp, device: nccl.NcclGroup(Core, Comm()))
    monkeypatch.setattr(tensors, "current_stream", lambda t: 77)
    staged: list[str] = []
    monkeypatch.setattr(nccl, "allgather_np", lambda *a: staged.append("allgather"))
    monkeypatch.setattr(nccl, "reduce_scatter_np", lambda *a: staged.append("reduce_scatter"))
    monkeypatch.setattr(nccl, "allreduce_np", lambda *a: staged.append("allreduce"))
    grp = comm.Group(comm=None, members=(0, 1), position=0)
    x, out = _FakeCudaTensor((4, 6), ptr=0x10), _FakeCudaTensor((4, 6), ptr=0x20)
    nccl.allreduce("n", "", grp, x, "avg", out)
    nccl.allreduce("n", "", grp, _FakeCudaTensor((3,), "int32"), "max", _FakeCudaTensor((3,), "int32"))
    nccl.allgather("n", "", grp, x, 0, _FakeCudaTensor((8, 6)))
    nccl.allgather("n", "", grp, _FakeCudaTensor((1, 4, 6)), 1, _FakeCudaTensor((1, 8, 6)))
    nccl.allgather("n", "", grp, _FakeCudaTensor((2,), "float16"), 0, _FakeCudaTensor((4,), "float16"))
    nccl.reduce_scatter("n", "", grp, x, "sum", 0, _FakeCudaTensor((2, 6)))
    assert calls == [("allreduce", 0x10, 0x20, Core.AVG, 77), ("allreduce", 0x1000, 0x1000, Core.MAX, 77),
                     ("allgather", (8, 6), 77), ("allgather", (1, 8, 6), 77), ("allgather", (4,), 77),
                     ("reduce_scatter", "<f4", Core.SUM, 77)]
    # not NCCL's: a non-leading axis, a dtype NCCL lacks, avg on integers; float min/max (NCCL's
    # fminf drops a NaN), float16 arithmetic (NCCL's is in half precision), empty tensors
    nccl.allgather("n", "", grp, x, 1, _FakeCudaTensor((4, 12)))
    nccl.reduce_scatter("n", "", grp, x, "sum", 1, _FakeCudaTensor((4, 3)))
    nccl.allreduce("n", "", grp, _FakeCudaTensor((3,), "int16"), "sum", _FakeCudaTensor((3,), "int16"))
    nccl.allreduce("n", "", grp, _FakeCudaTensor((3,), "int32"), "avg", _FakeCudaTensor((3,), "int32"))
    for op in ("min", "max"):
        nccl.allreduce("n", "", grp, x, op, out)
    for op in ("sum", "avg"):
        nccl.allreduce("n", "", grp, _FakeCudaTensor((3,), "float16"), op, _FakeCudaTensor((3,), "float16"))
    nccl.reduce_scatter("n", "", grp, _FakeCudaTensor((0, 4)), "sum", 0, _FakeCudaTensor((0, 4)))
    assert staged == ["allgather", "reduce_scatter", "allreduce", "allreduce", "allreduce", "allreduce",
                      "allreduce", "allreduce", "reduce_scatter"]
    assert len(calls) == 6
    # an out of the wrong shape is refused as on the host path (NCCL would fill part of a larger one)
    with pytest.raises(ValueError, match=re.escape("n: out has shape (8, 6), expected (4, 6)")):
        nccl.allreduce("n", "", grp, x, "sum", _FakeCudaTensor((8, 6)))
    with pytest.raises(ValueError, match=re.escape("n: out has shape (16, 6), expected (8, 6)")):
        nccl.allgather("n", "", grp, x, 0, _FakeCudaTensor((16, 6)))
    assert len(calls) == 6


def test_ranks_are_not_all_pinned_to_the_first_core(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """TVM's pool pinned each rank's main thread to the pool's first core: every rank on core 0. And a
    launching process whose own pool had started (a test, a benchmark, a job that compiled first)
    handed its pin to every rank."""
    import tvm

    from tvm_combiners.compile.host import START_CORES

    prog = tmp_path / "affinity.py"
    prog.write_text("import os, sys, tvm\nfrom mpi4py import MPI\ntvm.get_global_func('runtime.NumThreads')()\n"
                    "open(f'{sys.argv[1]}/rank{MPI.COMM_WORLD.Get_rank()}', 'w').write(repr(sorted(os.sched_getaffinity(0))))\n")
    monkeypatch.delenv("TVM_BIND_THREADS", raising=False)  # the ranks' pools would pin: launch must say no
    tvm.get_global_func("runtime.NumThreads")()
    start = sorted(START_CORES)
    os.sched_setaffinity(0, {start[0]})  # as TVM's pool pins the thread that starts it
    try:
        assert launch(2, ["python", str(prog), str(tmp_path)], timeout=120) == 0
    finally:
        os.sched_setaffinity(0, START_CORES)
    assert [ast.literal_eval((tmp_path / f"rank{r}").read_text()) for r in range(2)] == [start, start]


def test_ranks_share_the_cores_between_their_thread_pools() -> None:
    from tvm_combiners.collectives.runtime.launcher import rank_environment
    from tvm_combiners.compile.host import usable_cores

    cores = usable_cores()
    assert rank_environment(2, {})["TVM_NUM_THREADS"] == str(max(1, cores // 2))
    assert rank_environment(cores * 4, {})["TVM_NUM_THREADS"] == "1"
    assert rank_environment(2, {"TVM_NUM_THREADS": "7", "X": "y"}) == {"TVM_NUM_THREADS": "7", "X": "y",
                                                                      "PYTHONFAULTHANDLER": "1", "TVM_BIND_THREADS": "0"}
    assert rank_environment(2, {"TVM_BIND_THREADS": "1"})["TVM_BIND_THREADS"] == "1"
    assert rank_environment(2, {"PYTHONFAULTHANDLER": ""})["PYTHONFAULTHANDLER"] == ""  # the user's own is kept


def test_data_ptr_reads_a_real_tensor():
    # NCCL gets raw pointers: on TVM 0.27 ``data_ptr`` is a method (an attribute read broke the cuda path)
    import tvm

    from tvm_combiners.collectives.runtime import tensors

    t = tvm.runtime.tensor(np.arange(6, dtype="float32"))
    assert tensors.data_ptr(t) == np.from_dlpack(t).ctypes.data


def test_native_allreduce_splits_a_count_mpi_cannot_hold(tmp_path: Path) -> None:
    """MPI counts are ints, and the kernel cast its count to int32: 2^32 + 3 elements reduced 3 and
    reported success. It now calls MPI once per chunk; built here with 3-element chunks, 10 elements
    of a view that starts at a byte offset take four calls. Float min and max stay generic (NaN)."""
    prog = tmp_path / "chunks.py"
    prog.write_text(
        "import sys, numpy as np, tvm\n"
        "from tvm_combiners.collectives.runtime import native, rank\n"
        "from tvm_combiners.collectives.runtime.comm import mpi\n"
        "assert native.prepare(), native._unavailable\nnative._CHUNK = 3\n"
        "kernel = native._build(mpi())['allreduce']\n"
        "r, out = rank(), {}\n"
        "for dt in ('int64', 'float32', 'uint8'):\n"
        "    for op in ('sum', 'max', 'avg') if dt == 'float32' else ('sum', 'max'):\n"
        "        whole = tvm.runtime.tensor((np.arange(12) * (r + 1)).astype(dt))\n"
        "        x = whole._create_view((10,), dt, relative_byte_offset=2 * np.dtype(dt).itemsize)\n"
        "        o = tvm.runtime.tensor(np.zeros(10, dt))\n"
        "        kernel(x, o, 10, native.DTYPES.index(dt), native.OPS.index(op))\n"
        "        out[f'{dt}_{op}'] = o.numpy()\n"
        "np.savez(f'{sys.argv[1]}/rank{r}.npz', **out)\n")
    assert launch(2, ["python", str(prog), str(tmp_path)], timeout=120) == 0
    xs = [np.arange(2, 12) * (r + 1) for r in range(2)]
    for r in range(2):
        got = np.load(tmp_path / f"rank{r}.npz")
        assert sorted(got.files) == sorted(["int64_sum", "int64_max", "float32_sum", "float32_max", "float32_avg",
                                            "uint8_sum", "uint8_max"])
        for name in got.files:
            dt, op = name.split("_")
            want = {"sum": xs[0] + xs[1], "max": np.maximum(*xs), "avg": (xs[0] + xs[1]) / 2}[op].astype(dt)
            np.testing.assert_array_equal(got[name], want, err_msg=f"rank {r} {name}")
    from tvm_combiners.collectives.runtime import native

    assert native.codes("min", "float32") is None and native.codes("max", "float64") is None
    assert native.codes("min", "int32") == (2, 2) or not native.ENABLED


def test_float_min_and_max_give_every_rank_the_same_bits(tmp_path: Path) -> None:
    """-0.0 and 0.0 compare equal: with the NaN-propagating reduction declared commutative, each rank
    kept its own (rank 0 [-0, 0], rank 1 [0, -0]: 1/x was -inf on one replica, +inf on the other)."""
    prog = tmp_path / "zeros.py"
    prog.write_text(
        "import sys, numpy as np\n"
        "from tvm_combiners.collectives.runtime import rank\n"
        "from tvm_combiners.collectives.runtime.comm import group\n"
        "from tvm_combiners.collectives.runtime.functions import allreduce_np\n"
        "r, out = rank(), {}\n"
        "x = np.array([-0.0, 0.0, np.nan, 1.0] if rank() == 0 else [0.0, -0.0, 2.0, -np.nan])\n"
        "for dt in ('float16', 'float32', 'float64'):\n"
        "    for op in ('min', 'max'):\n"
        "        o = np.empty(4, dt)\n"
        "        allreduce_np('t', group('', 't'), x.astype(dt), op, o)\n"
        "        out[f'{dt}_{op}'] = o\n"
        "np.savez(f'{sys.argv[1]}/rank{r}.npz', **out)\n")
    assert launch(2, ["python", str(prog), str(tmp_path)], timeout=120) == 0
    got = [np.load(tmp_path / f"rank{r}.npz") for r in range(2)]
    for name in got[0].files:
        assert got[0][name].tobytes() == got[1][name].tobytes(), name
        assert np.isnan(got[0][name][2]) and np.isnan(got[0][name][3]), name  # NaN from either rank


def test_check_mode_on_one_rank_only_is_named_not_misread(tmp_path: Path) -> None:
    """TVM_COMBINERS_CHECK_COLLECTIVES set on rank 0 only (``launch`` gives every rank one environment,
    a user's own mpiexec may not): rank 1 took rank 0's 1024-byte shape header for a 1024-byte payload
    (exit 0), and rank 0 read rank 1's payload as a header and then waited in a Probe without limit.
    Each recv now names the mismatch, takes what was sent, and the channel then works; a recv of
    fewer than 4 bytes cannot tell a header's start: it says so, and the channel is a message behind
    (that small message, never received, is dropped at exit: MPI completed its send eagerly)."""
    proc = _run(2, "mixed_check", tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    env = "TVM_COMBINERS_CHECK_COLLECTIVES"
    tiny = json.loads((tmp_path / "rank1.json").read_text()).pop("12|mixed")
    assert tiny.startswith("ValueError: tvm_combiners.recv: channel 12 from rank 0: ") and tiny.endswith(
        f"(the send's payload is larger than the 3-byte recv buffer, or {env} is set on rank 0 but not on this "
        "rank (then the channel is a message behind: set it on every rank))"), tiny
    np.testing.assert_array_equal(np.load(tmp_path / "rank1.npz")["12|same"], prog.data(0, (3,), "int8", 24))
    for receiver, sender, channels in ((1, 0, (6, 7, 8, 11)), (0, 1, (9, 10))):
        errors = json.loads((tmp_path / f"rank{receiver}.json").read_text())
        errors.pop("12|mixed", None)
        here, there = ("this rank", "rank 1") if receiver == 0 else ("rank 0", "this rank")
        want = {f"{c}|mixed": f"ValueError: tvm_combiners.recv: channel {c} from rank {sender}: {env} is set on "
                              f"{here} but not on {there}: set it on every rank (a check header would be read "
                              "as a payload)" for c in channels}
        assert errors == want
        got = np.load(tmp_path / f"rank{receiver}.npz")
        assert sorted(set(got.files) - {"12|same"}) == sorted(f"{c}|same" for c in channels)
        for c in channels:
            size = {6: 8, 7: 256, 8: 512, 9: 8, 10: 256, 11: 1}[c]
            np.testing.assert_array_equal(got[f"{c}|same"], prog.data(sender, (size,), "float32", 2 * c + 1))


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for a parent to reap it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("session", ["own session", "the rank's session"])
def test_a_process_a_rank_left_running_is_named_and_killed_at_the_timeout(session: str, tmp_path: Path) -> None:
    """Every rank ended its program with 0, but a child rank 0 left running held the output, mpiexec
    waited, and the timeout blamed a hung rank; the child, its parent gone, was no descendant of
    the job any more and outlived it (in a session of its own or not)."""
    (tmp_path / "prog.py").write_text(
        "import subprocess, sys\nfrom mpi4py import MPI\n"
        "if MPI.COMM_WORLD.Get_rank() == 0:\n"
        f"    child = subprocess.Popen(['sleep', '60'], start_new_session={session == 'own session'})\n"
        "    open('child.pid', 'w').write(str(child.pid))\n")
    try:
        proc = subprocess.run([sys.executable, "-m", "tvm_combiners.collectives.runtime.launcher", "-n", "2",
                               "--timeout", "10", "--", "python", "prog.py"], cwd=tmp_path, capture_output=True,
                              text=True, timeout=60)
        child = int((tmp_path / "child.pid").read_text())
        assert not _alive(child), "the process rank 0 started outlived the job"
    finally:
        if (tmp_path / "child.pid").exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int((tmp_path / "child.pid").read_text()), signal.SIGKILL)
    assert proc.returncode == 124
    assert ("timed out after 10 s: killed all 2 ranks and 1 process they started (every rank ended its program, "
            "exit code 0, but mpiexec waited on: a process a rank started and left running holds the job's "
            "output?)") in proc.stderr, proc.stderr


def test_a_bad_drain_timeout_fails_the_first_send_not_the_exit(tmp_path: Path) -> None:
    """Review: TVM_COMBINERS_SEND_DRAIN_TIMEOUT=abc raised inside atexit, and the program exited 0."""
    prog = ("import numpy as np\n"
            "from tvm_combiners.collectives.runtime import functions as F\n"
            "try:\n"
            "    F.send_np('send', '0,0', 0, np.ones(3, 'float32'))\n"
            "except ValueError as err:\n"
            "    print(err, flush=True)\n"
            "    raise SystemExit(3)\n")
    env = {**os.environ, "TVM_COMBINERS_SEND_DRAIN_TIMEOUT": "abc"}
    proc = subprocess.run([sys.executable, "-c", prog], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env=env)
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout == "TVM_COMBINERS_SEND_DRAIN_TIMEOUT must be a positive number of seconds, got 'abc'\n"


def _launch_two(folder: Path, drain_s: str) -> subprocess.CompletedProcess:
    """``folder``/prog.py on 2 ranks under the launcher (the job's timeout 90 s, a hard limit of 150 s),
    with ``TVM_COMBINERS_SEND_DRAIN_TIMEOUT`` set to ``drain_s``."""
    return subprocess.run([sys.executable, "-m", "tvm_combiners.collectives.runtime.launcher", "-n", "2", "--timeout",
                           "90", "--", "python", "prog.py"], cwd=folder, capture_output=True, text=True, timeout=150,
                          env={**os.environ, "TVM_COMBINERS_SEND_DRAIN_TIMEOUT": drain_s})


def test_a_sender_far_ahead_of_its_receiver_ends_the_job_cleanly(tmp_path: Path) -> None:
    """300 small sends posted before rank 1 received any: every one arrived, in order, yet with
    synchronous sends (Issend) MPICH left ~235 of them unacknowledged once rank 1 stopped calling
    MPI, and the job failed at exit ("sends never received")."""
    (tmp_path / "prog.py").write_text(
        "import numpy as np\n"
        "from mpi4py import MPI\n"
        "from tvm_combiners.collectives.runtime import functions as F, rank\n"
        "if rank() == 0:\n"
        "    for i in range(300):\n"
        "        F.send_np('send', '0,1', 5, np.full(4, i, 'float32'))\n"
        "MPI.COMM_WORLD.Barrier()\n"
        "if rank() == 1:\n"
        "    out, got = np.empty(4, 'float32'), []\n"
        "    for _ in range(300):\n"
        "        F.recv_np('recv', '0,1', 5, out)\n"
        "        got.append(int(out[0]))\n"
        "    print('in order' if got == list(range(300)) else f'out of order: {got}', flush=True)\n")
    proc = _launch_two(tmp_path, "10")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout == "[rank 1] in order\n"  # whole lines, named by their rank


def test_a_large_send_nobody_receives_fails_the_job_naming_it(tmp_path: Path) -> None:
    """A 1 MiB send (past MPI's eager limit) that rank 1 never receives: the exit drain names it.
    Rank 1 stays past the drain timeout (leaving first, MPICH's finalize may end the job on its own)."""
    (tmp_path / "prog.py").write_text(
        "import time\n"
        "import numpy as np\n"
        "from tvm_combiners.collectives.runtime import functions as F, rank\n"
        "if rank() == 0:\n"
        "    F.send_np('send', '0,1', 5, np.zeros(1 << 18, 'float32'))\n"
        "else:\n"
        "    time.sleep(20)\n")
    proc = _launch_two(tmp_path, "2")
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert ("tvm-combiners launch: rank 0 failed: sends never received after 2 s: channel 5 from rank 0 to rank 1\n"
            in proc.stderr), proc.stderr[-3000:]


_UNRECEIVED = "    F.send_np('send', '0,1', 5, np.zeros(1 << 18, 'float32'))\n"  # 1 MiB nobody receives


@pytest.mark.parametrize("failure, error", [
    ("lose_stderr()\nif rank() == 1:\n    raise ValueError('only in the file')\n",
     "rank 1 failed: ValueError: only in the file"),
    (f"lose_stderr()\nif rank() == 0:\n{_UNRECEIVED}else:\n    time.sleep(20)\n",
     "rank 0 failed: sends never received after 2 s: channel 5 from rank 0 to rank 1"),
    # the first reason stays: the drain's abort over the send the exception left behind wrote over it (review)
    (f"lose_stderr()\nif rank() == 0:\n{_UNRECEIVED}    raise ValueError('the real error')\ntime.sleep(20)\n",
     "rank 0 failed: ValueError: the real error"),
    # a traceback handled earlier is not taken for the lost reason (review: it was reported instead)
    ("try:\n    import does_not_exist\nexcept ImportError:\n    traceback.print_exc()\nlose_stderr()\n"
     f"if rank() == 0:\n{_UNRECEIVED}else:\n    time.sleep(20)\n",
     "rank 0 failed: sends never received after 2 s: channel 5 from rank 0 to rank 1"),
    ("lose_stderr()\nif rank() == 1:\n    sys.exit('stopped: no input')\n", "rank 1 failed: stopped: no input"),
], ids=["exception", "unreceived_send", "exception_then_drain", "handled_traceback_before", "sys_exit_message"])
def test_a_failure_whose_stderr_is_lost_is_still_named(failure: str, error: str, tmp_path: Path) -> None:
    """MPI_Abort may end the job before mpiexec forwards a rank's last stderr lines (CI, 2026-11-26: a send
    nobody received was reported as 'no rank reported an error'); each rank also writes its reason down.
    ``lose_stderr()``: from there on nothing of the rank's stderr reaches launch."""
    (tmp_path / "prog.py").write_text(
        "import os, sys, time, traceback\nimport numpy as np\n"
        "from tvm_combiners.collectives.runtime import functions as F, rank\n"
        "def lose_stderr():\n    sys.stderr.flush()\n    os.dup2(os.open(os.devnull, os.O_WRONLY), 2)\n" + failure)
    proc = _launch_two(tmp_path, "2")
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "tvm-combiners launch: rank" not in proc.stderr.replace(f"tvm-combiners launch: {error}\n", ""), (
        proc.stderr[-3000:])  # the other rank, stopped by the abort, is not named
    assert f"tvm-combiners launch: {error}\n" in proc.stderr, proc.stderr[-3000:]


@pytest.mark.parametrize("source, line", [
    ("raise ValueError('a\\nb')", "ValueError: a"),
    ("compile('x = (', 'prog.py', 'exec')", "SyntaxError: '(' was never closed"),
    ("raise KeyError('k')", "KeyError: 'k'"),
])
def test_a_recorded_exception_is_the_line_its_traceback_ends_with(source: str, line: str) -> None:
    from tvm_combiners.collectives.runtime.rank_main import _exception_line
    try:
        exec(source)
    except BaseException as exc:  # noqa: BLE001 - the exception under test
        assert _exception_line(exc) == line
        traceback_text = "".join(traceback.format_exception(exc))
        assert rank_error(traceback_text) == line  # what launch reads from stderr, where it comes through
    else:
        raise AssertionError(f"{source} raised nothing")


def test_launch_streams_a_ranks_stderr_in_blocks_keeping_its_start_and_end(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank writing 768 MiB to stderr took launch from 563 MB to 2.9 GB: each poll read all that was
    new in one piece and every rank's text was kept whole. Here 40 MiB, under a 2-MiB-block reader."""
    import tracemalloc

    line = b"x" * 1023 + b"\n"
    with open(tmp_path / "rank.0", "wb") as f:
        f.write(b"first line\n")
        for _ in range(40):
            f.write(line * 1024)
        f.write(b"Traceback (most recent call last):\n  File \"prog.py\", line 1\nValueError: the end\n")

    class Count:  # launch's own stderr: counts what it is given, keeps nothing
        lines = 0

        def write(self, text: str) -> None:
            Count.lines += text.count("\n")

        def flush(self) -> None:
            pass

    monkeypatch.setattr(sys, "stderr", Count())
    from tvm_combiners.collectives.runtime.launcher import _Tail

    tail = _Tail(tmp_path, 1)
    tracemalloc.start()
    tail.start()
    (text,) = tail.finish()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert Count.lines == 1 + 40 * 1024 + 3
    assert peak < 16 * 2**20, f"{peak / 2**20:.0f} MiB held while copying 40 MiB"
    assert len(text) < 2 * 2**20 and text.startswith("first line\n")
    assert rank_error(text) == "ValueError: the end"


def test_launch_copies_each_ranks_stdout_in_whole_lines_named_by_rank(tmp_path: Path) -> None:
    """Two ranks printing long lines in many small writes at once: every line reaches stdout whole,
    prefixed with its rank, each rank's in its own order; ``--no-prefix`` drops the prefix only."""
    (tmp_path / "prog.py").write_text(
        "import sys\n"
        "from mpi4py import MPI\n"
        "r = MPI.COMM_WORLD.Get_rank()\n"
        "MPI.COMM_WORLD.Barrier()\n"
        "for i in range(200):\n"
        "    for part in (f'rank {r} ', f'line {i} ', 'x' * 300, '\\n'):\n"
        "        sys.stdout.write(part)\n"
        "        sys.stdout.flush()\n"
        "sys.stdout.write(f'rank {r} last, no newline')\n")
    for flags, lead in (([], "[rank {r}] "), (["--no-prefix"], "")):
        proc = subprocess.run([sys.executable, "-m", "tvm_combiners.collectives.runtime.launcher", "-n", "2", *flags,
                               "--timeout", "60", "--", "python", "prog.py"], cwd=tmp_path, capture_output=True,
                              text=True, timeout=90)
        assert proc.returncode == 0, proc.stderr
        lines = proc.stdout.splitlines()
        for r in (0, 1):
            mine = [line for line in lines if line.startswith(lead.format(r=r) + f"rank {r} ")]
            assert mine == [lead.format(r=r) + f"rank {r} line {i} " + "x" * 300 for i in range(200)] + [
                lead.format(r=r) + f"rank {r} last, no newline"]
        assert len(lines) == 402
