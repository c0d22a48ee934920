"""Tensor-parallel MiniLM-L3: the encoder built from the ONNX initializers equals onnxruntime, TVM
places its parameters as annotated, and the example on 2 ranks (TP 2) and 4 ranks (TP 2 x DP 2)
through ``tvm-combiners launch`` matches onnxruntime on every rank with half the sharded weights each."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("tvm_ffi")
pytest.importorskip("mpi4py")

import tvm  # noqa: E402
from tvm import relax  # noqa: E402

from tvm_combiners.app.examples import tp_bert as T  # noqa: E402
from tvm_combiners.collectives.relax.distributed import InGroup, ShardingError, distributed_passes, shard_inputs  # noqa: E402
from tvm_combiners.relax import CombineParallelOps  # noqa: E402

EXE = shutil.which("tvm-combiners", path=os.path.dirname(sys.executable))


@pytest.fixture(scope="module")
def weights():
    from tvm_combiners.models import default_model_path, load_onnx

    return T.minilm_weights(load_onnx(default_model_path()))


def test_the_unsharded_encoder_equals_onnxruntime(weights):
    from tvm_combiners.models import default_model_path, example_inputs, prepare_onnx, run_onnxruntime

    assert (weights.heads, weights.hidden, len(weights.layers)) == (12, 384, 3)
    model = prepare_onnx(default_model_path(), batch=2, seq=8)
    inputs = example_inputs(model, batch=2, seq=8, seed=4)
    ex = tvm.compile(T.build_encoder(weights, 2, 8, None), target=tvm.target.Target({"kind": "llvm", "opt-level": 0}))
    args = [inputs["input_ids"], inputs["attention_mask"], *(a for _, a, _ in T.parameters(weights))]
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](*(tvm.runtime.tensor(a) for a in args))
    for out, want in zip(got, run_onnxruntime(model, inputs)[2:]):  # hidden states, pooled embedding
        np.testing.assert_allclose(out.numpy(), want, rtol=0, atol=1e-5)


def test_qkv_merge_per_layer_and_tvm_places_parameters_as_annotated(weights):
    notes = []
    mod = CombineParallelOps(on_combine=notes.append)(T.build_encoder(weights, 1, 8, 2))
    assert [c.describe().split(":")[0] for c in notes] == ["3 x batch_matmul -> add"] * 3  # Q/K/V and biases
    lowered = tvm.transform.Sequential(distributed_passes("llvm"))(mod)
    assert T.count_ops(lowered, "ccl.allreduce")["ccl.allreduce"] == 6  # attention output and second FFN, 3 layers
    plan = {s.name: s for s in shard_inputs(lowered).inputs["main"]}
    for name, array, placement in T.parameters(weights):
        assert plan[name].placement == placement, name
        assert plan[name].local_bytes * (2 if placement != "R" else 1) == array.nbytes, name
    assert plan["l0_q"].local_shape == (6, 384, 32)  # 6 of the 12 heads


def test_in_group_groups_allreduces_and_refuses_a_transfer_from_worker_0():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4,), "float32"))
    with bb.function("main", [x]):
        bb.emit_func_output(bb.emit(relax.op.ccl.allreduce(x, "max", False)))
    (call,) = [b.value for b in InGroup()(bb.get())["main"].body.blocks[0].bindings]
    assert (str(call.attrs.op_type), bool(call.attrs.in_group)) == ("max", True)
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        bb.emit_func_output(bb.emit(relax.op.ccl.broadcast_from_worker0(x)))
    with pytest.raises(ShardingError, match=r"^tvm_combiners\.InGroup: R\.ccl\.broadcast_from_worker0 of x in function "
                                            r"'main' would run across every rank"):
        InGroup()(bb.get())


def _launch(n: int, *options: str) -> dict:
    cmd = [EXE, "launch", "-n", str(n), "--timeout", "240", "--example", "tp-bert", "--json", "--",
           "--opt-level", "0", "--seq", "8", "--repeat", "1", *options]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def _check(report: dict, ranks: int, tp: int) -> None:
    assert report["ok"] and report["failures"] == [], report["failures"]
    assert (report["ranks"], report["tp"], report["dp"], report["heads_per_rank"]) == (ranks, tp, ranks // tp, 12 // tp)
    assert report["allreduces"] == 6 and len(report["combined"]) == 3
    assert [r["group"] for r in report["per_rank"]] == [r // tp for r in range(ranks)]
    for r in report["per_rank"]:
        assert max(r["vs_onnxruntime"].values()) <= 1e-4, r
        held = r["held"]
        assert held["sharded"] * tp == held["sharded_full"] == 21_265_920, held  # per layer Q/K/V/O, both FFN matmuls, 4 biases
        assert r["sharded_ms"] > 0
    assert report["unsharded_ms"] > 0


def test_tensor_parallel_on_2_ranks_matches_onnxruntime_with_half_the_weights_each():
    _check(_launch(2), 2, 2)


def test_tensor_parallel_2_x_data_parallel_2_on_4_ranks():
    """Each group of 2 runs its own batch rows: an allreduce across all 4 would mix the groups' rows."""
    _check(_launch(4, "--tp", "2", "--batch", "1"), 4, 2)


@pytest.mark.parametrize("n,options,line", [
    (4, ["--tp", "3"], "--tp 3 does not divide the 4 ranks"),
    (5, [], "--tp 5 must divide the model's 12 heads and 1536 FFN columns"),
])
def test_bad_options_are_one_line_before_any_rank_starts(n, options, line):
    proc = subprocess.run([EXE, "launch", "-n", str(n), "--example", "tp-bert", "--", *options],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr == f"tvm-combiners: error: launch --example tp-bert: {line}\n"
