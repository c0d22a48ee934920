"""Pipeline-parallel MiniLM-L3: the cut (what crosses each stage boundary, stages chained in one
process equal onnxruntime) and the whole example on 2 ranks through ``tvm-combiners launch``."""

import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("tvm_ffi")

from tvm_combiners.app.examples import pipeline_bert as P  # noqa: E402
from tvm_combiners.app.examples.report import oversubscription  # noqa: E402

SCRIPT_DIR = os.path.dirname(sys.executable)
EXE = shutil.which("tvm-combiners", path=SCRIPT_DIR)


@pytest.fixture(scope="module")
def minilm():
    from tvm_combiners.models import default_model_path, import_relax, prepare_onnx

    model = prepare_onnx(default_model_path(), batch=1, seq=16)
    mod, _ = import_relax(model)
    return model, mod


@pytest.mark.parametrize("stages,layers", [(2, [[0], [1, 2]]), (3, [[0], [1], [2]])])
def test_cut_between_layers_hands_on_hidden_state_and_masks(minilm, stages, layers):
    _, mod = minilm
    func = mod["main"]
    plan = P.plan_stages(func, stages)
    assert [P._layers_of(func, s) for s in plan] == layers
    n = len(func.body.blocks[0].bindings)
    assert sorted(i for s in plan for i in s.bindings) == list(range(n))  # every binding exactly once
    assert [p.name for p in plan[0].inputs] == ["input_ids", "attention_mask"]
    for s in plan[1:]:
        # the outputs pass the inputs through; layers read the extended mask and the hidden state
        assert P.tensor_types(s.inputs) == [((1, 16), "int64"), ((1, 16), "int64"), ((1, 1, 1, 16), "float32"),
                                            ((1, 16, 384), "float32")]
        assert [v.name for v in s.inputs[:2]] == ["input_ids", "attention_mask"]
    assert plan[-1].outputs == []


def test_stages_chained_in_one_process_equal_onnxruntime(minilm):
    import tvm
    from tvm import relax

    from tvm_combiners.models import example_inputs, run_onnxruntime

    model, mod = minilm
    plan = P.plan_stages(mod["main"], 3)
    stage_mod, _ = P.build_stage_functions(mod, plan)
    ex = tvm.compile(stage_mod, target=tvm.target.Target({"kind": "llvm", "opt-level": 0}))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    inputs = example_inputs(model, batch=1, seq=16, seed=3)
    values = [tvm.runtime.tensor(inputs[p.name]) for p in mod["main"].params]
    for s in range(3):
        values = list(vm[f"stage{s}"](*values))
    for got, want in zip(values, run_onnxruntime(model, inputs)):
        np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-4)


def test_too_many_stages_is_refused(minilm):
    with pytest.raises(ValueError, match=r"pipeline-bert: 4 stages for 3 layers: need 1 <= stages <= layers"):
        P.plan_stages(minilm[1]["main"], 4)


def test_micro_batches_past_the_channel_ids_are_refused_before_building(minilm):
    """4 tensors cross each hop: 3 stages x 4097 micro-batches would need channel id 32,768."""
    with pytest.raises(ValueError, match=re.escape("4097 micro-batches need 32776 channel ids (one per tensor per hop), "
                                                   "more than the 32768 MPI guarantees")):
        P.build_pipeline(minilm[1], 3, 4097)


def test_pipeline_on_2_ranks_equals_onnxruntime_and_combines_per_micro_batch():
    cmd = [EXE, "launch", "-n", "2", "--timeout", "240", "--example", "pipeline-bert", "--json", "--",
           "--opt-level", "0", "--micro-batches", "3", "--repeat", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["ok"] and report["failures"] == [], report["failures"]
    assert [s["layers"] for s in report["stages"]] == [[0], [1, 2]]
    assert all(s["stage_ms"] > 0 for s in report["stages"])  # each timed alone, the other rank asleep
    assert report["oversubscribed"] == oversubscription(2)
    unc, comb = report["variants"]["uncombined"], report["variants"]["combined"]
    # 3 micro-batches x 4 tensors over the one hop; combined: one transfer per micro-batch
    assert (unc["sends"], unc["recvs"]) == (12, 12)
    assert (comb["sends"], comb["recvs"]) == (3, 3)
    assert unc["send_bytes"] == [64, 128, 24576]  # the extended mask, ids and mask (int64), the hidden state
    assert comb["send_bytes"] == [2 * 128 + 64 + 24576]
    assert len(comb["notes"]) == 3  # one combined transfer per micro-batch
    for v in (unc, comb):
        assert max(v["max_abs_diff_vs_onnxruntime"].values()) <= 1e-4
        assert v["max_abs_diff_vs_uncombined"] == 0.0
        assert v["pipeline_ms"] > 0


def test_json_error_document_when_the_job_times_out():
    # killed ranks make MPICH print its BAD TERMINATION banner: on stderr, stdout stays one document
    cmd = [EXE, "launch", "-n", "2", "--timeout", "5", "--example", "pipeline-bert", "--json", "--", "--opt-level", "0"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 124
    assert json.loads(proc.stdout) == {"ok": False, "error": {
        "file": None, "stage": "launch", "bad_input": False, "exit_code": 124,
        "message": "launch --example pipeline-bert: the job timed out after 5 s (exit code 124) before rank 0 wrote its report"}}
    assert "tvm-combiners launch: timed out after 5 s: killed all 2 ranks" in proc.stderr


def test_model_limits_are_read_from_the_onnx_graph():
    assert P.model_limits() == (3, 512)  # MiniLM-L3: what launch checks -n and --seq against


def test_a_failed_equality_exits_non_zero_with_the_report():
    # one stage, nothing to send; a tolerance of 0 against onnxruntime cannot hold in float32
    cmd = [EXE, "launch", "-n", "1", "--timeout", "120", "--example", "pipeline-bert", "--json", "--",
           "--opt-level", "0", "--micro-batches", "2", "--repeat", "1", "--atol", "0"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 1, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["ok"] is False and report["ranks"] == 1
    assert [f.split(" by ")[0] for f in report["failures"]] == ["uncombined: last stage differs from onnxruntime",
                                                                "combined: last stage differs from onnxruntime"]
    diff = max(report["variants"]["uncombined"]["max_abs_diff_vs_onnxruntime"].values())
    assert 0 < diff <= 1e-4  # only the tolerance made it fail
    assert "[pipeline-bert] FAILED: uncombined: last stage differs from onnxruntime" in proc.stderr
