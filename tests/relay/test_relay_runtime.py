"""The collectives runtime under TVM 0.16 on 3 ranks: te.extern + call_packed, and R.ccl via the VM.

One launch (CI has 2 cores); ``tests/collectives/progs/relay_runtime_prog.py`` saves every rank's
results and they are compared here with numpy.  The main environment's tests cover every function
and pattern in depth; this checks what differs in TVM 0.16: DLTensor views from compiled code (int8,
float16, 0-d tensors) and ``runtime.disco.*`` called without ``in_group``.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

PROG = Path(__file__).parents[1] / "collectives" / "progs" / "relay_runtime_prog.py"
_spec = importlib.util.spec_from_file_location("relay_runtime_prog", PROG)
prog = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(prog)
N = 3


def test_runtime_under_tvm_016_on_three_ranks(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "tvm_combiners.collectives.runtime.launcher", "-n", str(N), "--timeout", "240",
           "--", "python", str(PROG), str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=270)
    assert proc.returncode == 0, proc.stderr[-4000:]
    d = prog.data
    for rank in range(N):
        got = np.load(tmp_path / f"rank{rank}.npz")
        want = {
            "allreduce_f16_max": np.max([d(r, (3, 4), "float16", 0) for r in range(N)], axis=0),
            "allreduce_i8_sum": np.sum([d(r, (5,), "int8", 1) for r in range(N)], axis=0).astype("int8"),
            "allreduce_f64_avg_0d": np.mean([d(r, (), "float64", 2) for r in range(N)]),
            "allgather_axis1": np.concatenate([d(r, (2, 3), "int32", 3) for r in range(N)], axis=1),
            "reduce_scatter_axis1": np.split(sum(d(r, (2, 4 * N), "float32", 4) for r in range(N)), N, axis=1)[rank],
            "ring_int8": d((rank - 1) % N, (6,), "int8", 99),
            "token": np.array(0, "int32"),
        }
        ccl_in = [d(r, (4, 3), "float32", 7) for r in range(N)]
        for kind, fn in (("sum", np.sum), ("prod", np.prod), ("min", np.min), ("max", np.max), ("avg", np.mean)):
            want[f"ccl_{kind}"] = fn(ccl_in, axis=0).astype("float32")
        want["ccl_allgather"] = np.concatenate(ccl_in)
        want["ccl_broadcast"] = ccl_in[0]
        assert set(got.files) == set(want)
        for key, value in want.items():
            assert got[key].dtype == value.dtype and got[key].shape == value.shape, (rank, key)
            np.testing.assert_allclose(got[key], value, rtol=1e-6, err_msg=f"{key} on rank {rank}")


def test_an_error_in_compiled_code_is_reported_with_its_message(tmp_path: Path) -> None:
    """TVM 0.16's graph executor replaces a Python error raised in compiled code with an empty
    ``TVMError:``: a recv placed before its send (no OrderSendRecv) failed both ranks with no word
    of why. The rank says it on stderr, and launch reports that line."""
    prog = tmp_path / "recv_first.py"
    prog.write_text(
        "import numpy as np, tvm\nfrom tvm import relay\nfrom tvm.contrib import graph_executor\n"
        "import tvm_combiners.collectives.runtime\nfrom tvm_combiners.collectives import relay as C\n"
        "x = relay.var('x', shape=(4,), dtype='float32')\npairs = [[0, 1], [1, 0]]\n"
        "r = C.recv((4,), 'float32', pairs, channel_id=2)\ns = C.send(relay.add(x, r), pairs, channel_id=2)\n"
        "mod = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], relay.Tuple([r, s]))))\n"
        "with tvm.transform.PassContext(opt_level=3):\n"
        "    lib = relay.build(mod, target='llvm -mtriple=x86_64-linux-gnu')\n"
        "g = graph_executor.GraphModule(lib['default'](tvm.cpu()))\ng.set_input('x', np.ones(4, 'float32'))\ng.run()\n")
    cmd = [sys.executable, "-m", "tvm_combiners.collectives.runtime.launcher", "-n", "2", "--timeout", "120",
           "--", "python", str(prog)]
    env = {**os.environ, "TVM_COMBINERS_RECV_TIMEOUT": "2"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=150, env=env)
    assert proc.returncode not in (0, 124), proc.stderr[-3000:]
    # the first rank whose recv gives up ends the job: the other, reaching its recv later (an uneven
    # relay.build on a loaded machine), may be stopped before its own gives up
    reported = [rank for rank in range(2) if
                (f"tvm-combiners launch: rank {rank} failed: TimeoutError: tvm_combiners.recv: channel 2: nothing came "
                 f"from rank {1 - rank} in 2 s: a recv placed before the send it waits for never returns") in proc.stderr]
    assert reported, proc.stderr[-3000:]
