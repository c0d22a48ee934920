"""The native kernels (runtime/native.py) on 2, 3 and 4 ranks: every rank's results equal numpy.

One launch per rank count (CI has 2 cores): ``progs/native_prog.py`` builds one module with every op
the kernels serve (dtypes, groups in other orders and split, axes that need a transpose, pairs
where a rank has no source, a 1 MiB payload, a channel used twice, a 0-d payload), runs it with
each kernel's calls counted, then compiled for the generic path and served by the generic functions
under the kernels' names (a module compiled in another process), and compares all three. The
launcher runs it as ``python -m mpi4py``, so a failing rank ends the job; the timeout bounds a hung
one.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from test_ops_multirank import launch_prog

PROG = Path(__file__).parent / "progs" / "native_prog.py"
_spec = importlib.util.spec_from_file_location("native_prog", PROG)
prog = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(prog)


def _run(n: int, mode: str, out: Path, timeout: float, **env: str) -> subprocess.CompletedProcess:
    return launch_prog(PROG, n, [str(out), mode], timeout, **env)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_native_kernels_equal_numpy_on_n_ranks(n: int, tmp_path: Path) -> None:
    proc = _run(n, "all", tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    calls: Counter = Counter()
    for case in prog.cases(n):
        calls.update(case.native)
    for rank in range(n):
        got = np.load(tmp_path / f"rank{rank}.npz")
        want = prog.expected(n, rank)
        assert sorted(got.files) == sorted(want)
        for name, ref in want.items():
            value = got[name]
            assert value.dtype == ref.dtype and value.shape == ref.shape, (rank, name, value.dtype, value.shape)
            np.testing.assert_array_equal(value, ref, err_msg=f"rank {rank} {name}")
        report = json.loads((tmp_path / f"rank{rank}.json").read_text())
        # each op called its kernel, and nothing took the generic path
        assert report["native"] == {kind: calls[kind] for kind in report["native"]}, report
        assert report["generic"] == 0
        # the generic path, and the generic functions serving the kernels' names, give the same bits
        assert report["generic_differs"] == [] and report["fallback_differs"] == []
        assert report["fallback_calls"] == sum(calls.values())


def test_the_cases_cover_what_they_claim() -> None:
    """The reference itself: results differ between ranks, a rank without a source gets zeros, and
    every kernel has a case (a test that cannot fail is no test)."""
    want = [prog.expected(3, r) for r in range(3)]
    assert not np.array_equal(want[0]["arg0_float32_avg"], want[1]["ar_int8_sum"].astype("float32"))
    assert np.count_nonzero(want[2]["p2p_swap"]) == 0 and np.count_nonzero(want[1]["p2p_swap"]) > 0
    assert np.count_nonzero(want[1]["p2p_one_way"]) == 0 and np.count_nonzero(want[2]["p2p_one_way"]) > 0
    assert not np.array_equal(want[0]["rs0_1_max_int16"], want[1]["rs0_1_max_int16"])
    kinds = set().union(*(c.native for c in prog.cases(3)))
    assert kinds == {"allreduce", "allreduce_group", "allgather", "reduce_scatter", "send", "recv"}


@pytest.mark.parametrize("native", ["1", "0"])
def test_a_payload_of_another_size_raises_as_the_generic_recv_does(native: str, tmp_path: Path) -> None:
    """A send of a symbolic extent: rank r gives 3 + r floats to a recv of 4 on the next rank. Rank 1
    gets 12 bytes, rank 0 a message MPI truncates; natively as generically, with the same words."""
    proc = _run(3, "sizes", tmp_path, timeout=200, TVM_COMBINERS_NATIVE=native)
    assert proc.returncode == 0, proc.stderr[-3000:]
    errors = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(3)]
    assert errors[0]["error"].startswith("ValueError: tvm_combiners.recv: channel 3 from rank 2: Message truncated")
    assert errors[0]["error"].endswith("(the send's payload is larger than the 16-byte recv buffer)")
    assert errors[1] == {"error": "ValueError: tvm_combiners.recv: channel 3 from rank 0 brought 12 bytes, expected 16: "
                                  "the send's shape or dtype differs from the recv's"}
    assert errors[2] == {}
    np.testing.assert_array_equal(np.load(tmp_path / "rank2.npz")["out"], prog.data(1, (4,), "float32", 1))


def test_a_native_recv_times_out_and_a_send_never_taken_ends_the_job(tmp_path: Path) -> None:
    """Rank 1 calls nothing. Rank 0's recv raises after TVM_COMBINERS_RECV_TIMEOUT s, as the generic
    one does; its 1 MiB send, never taken, ends the job (MPI may still read the payload)."""
    proc = _run(2, "timeouts", tmp_path, timeout=120, TVM_COMBINERS_RECV_TIMEOUT="2")
    assert proc.returncode not in (0, 124), proc.stderr[-3000:]
    report = json.loads((tmp_path / "rank0.json").read_text())
    assert report["small"] == ("TimeoutError: tvm_combiners.recv: channel 4: nothing came from rank 1 in 2 s: a recv "
                               "placed before the send it waits for never returns (run OrderSendRecv before building); "
                               "if rank 1 is only slow, raise TVM_COMBINERS_RECV_TIMEOUT")
    assert 2 <= report["seconds"] < 30
    error = ("tvm_combiners.recv: channel 5: rank 1 has not taken this rank's send in 2 s, and MPI may still read its "
             "payload (if rank 1 is only slow, raise TVM_COMBINERS_RECV_TIMEOUT)")
    assert f"tvm-combiners launch: rank 0 failed: {error}" in proc.stderr, proc.stderr[-3000:]
