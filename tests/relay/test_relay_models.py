"""The Relay passes on real models: MiniLM and a torch-exported BERT, against onnxruntime."""

import subprocess
from pathlib import Path

import numpy as np
import pytest

from tvm_combiners.app.cli import main
from tvm_combiners.compile.relay_runner import build, count_ops, relays_own_passes, run_graph, run_vm
from tvm_combiners.models import default_model_path, example_inputs, import_relay, prepare_onnx, run_onnxruntime
from tvm_combiners.relay import CombineParallelOps

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def max_diff(outputs, reference):
    assert len(outputs) == len(reference)
    return max(float(np.max(np.abs(o.astype(np.float64) - r))) for o, r in zip(outputs, reference))


@pytest.fixture(scope="module")
def minilm():
    return prepare_onnx(default_model_path(), 1, 128)


def test_minilm_24_to_18_graph_executor_and_vm(minilm):
    mod, params = import_relay(minilm)
    assert count_ops(mod)["nn.batch_matmul"] == 24
    assert count_ops(relays_own_passes(mod))["nn.batch_matmul"] == 24  # Relay's own passes: nothing
    groups = []
    new = CombineParallelOps(on_combine=groups.append)(mod)
    assert count_ops(new)["nn.batch_matmul"] == 18
    assert [g.widths for g in groups] == [(384, 384, 384)] * 3
    inputs = example_inputs(minilm)
    reference = run_onnxruntime(minilm, inputs)
    assert max_diff(run_graph(build(new, params), inputs), reference) <= 1e-4
    assert max_diff(run_vm(new, params, inputs), reference) <= 1e-4


def test_minilm_with_params_as_inputs(minilm):
    mod, params = import_relay(minilm, params_as_inputs=True)
    assert params  # weights are function parameters now
    new = CombineParallelOps()(mod)
    assert count_ops(new)["nn.batch_matmul"] == 18
    assert count_ops(new)["concatenate"] >= 3  # parameter weights concatenate in the graph
    inputs = example_inputs(minilm)
    assert max_diff(run_graph(build(new, params), inputs), run_onnxruntime(minilm, inputs)) <= 1e-4


def test_torch_exported_bert(tmp_path):
    main_python = ROOT / ".venv" / "bin" / "python"
    if not main_python.exists():
        pytest.skip("the main environment (.venv, with torch) is needed to export the BERT")
    path = tmp_path / "bert.onnx"
    subprocess.run([str(main_python), "-m", "tvm_combiners.models.hf_export", str(path)], check=True, timeout=600)
    model = prepare_onnx(path, 1, 16)
    mod, params = import_relay(model)
    groups = []
    new = CombineParallelOps(on_combine=groups.append)(mod)
    assert len(groups) == 2 and all(g.widths == (64, 64, 64) for g in groups)
    inputs = example_inputs(model, 1, 16)
    reference = run_onnxruntime(model, inputs)
    assert max_diff(run_graph(build(mod, params), inputs), reference) <= 1e-4
    assert max_diff(run_graph(build(new, params), inputs), reference) <= 1e-4


def test_googlenet_inception_blocks_match_relays_own_conv_combiner():
    from tvm_combiners.models.inception import inception_model

    model = prepare_onnx(inception_model(size=14), batch=1, seq=None)
    mod, params = import_relay(model)
    new = CombineParallelOps()(mod)
    assert count_ops(mod)["nn.conv2d"] == 54
    assert count_ops(new)["nn.conv2d"] == count_ops(relays_own_passes(mod))["nn.conv2d"] == 36
    inputs = example_inputs(model)
    assert max_diff(run_graph(build(new, params), inputs), run_onnxruntime(model, inputs)) <= 1e-4


def test_cli_relay(capsys):
    assert main(["run", "--ir", "relay", "--repeat", "1", "--seq", "32"]) == 0
    out = capsys.readouterr().out
    assert "ir relay" in out and "combined groups: 3" in out
    combined = next(line for line in out.splitlines() if line.startswith("combined "))
    assert combined.split()[1] == "18" and float(combined.split()[-1]) <= 1e-4


def test_cli_relay_cuda_is_a_clear_error(capsys):
    assert main(["run", "--ir", "relay", "--target", "cuda", "--repeat", "1", "--seq", "16"]) == 2
    assert "this Relay build of TVM has no CUDA code generation: use --ir relax for cuda" in capsys.readouterr().err
