"""`tvm-combiners run` in the Relay environment: the default IR, what --ir relax says, Relay import
failures and bad input as one line (never a traceback), --json. Tiny models only (fast)."""

import json

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper

from tvm_combiners.app.cli import main

ERROR = "tvm-combiners: error: "


def _save(graph, path, opset=17):
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def parallel_matmuls(path, widths=(16, 4)):
    """x @ w1 + b1 and x @ w2 + b2: two sibling dense ops the combiner merges."""
    rng = np.random.default_rng(0)
    n1, n2 = widths
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
             for n, s in [("w1", (8, n1)), ("b1", (n1,)), ("w2", (8, n2)), ("b2", (n2,))]]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["m1"]), helper.make_node("Add", ["m1", "b1"], ["y1"]),
             helper.make_node("MatMul", ["x", "w2"], ["m2"]), helper.make_node("Add", ["m2", "b2"], ["y2"])]
    graph = helper.make_graph(nodes, "parallel", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                              [helper.make_tensor_value_info("y1", TensorProto.FLOAT, ["batch", n1]),
                               helper.make_tensor_value_info("y2", TensorProto.FLOAT, ["batch", n2])], inits)
    return _save(graph, path)


def _run(capsys, *argv):
    code = main(["run", *map(str, argv), "--repeat", "1"])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith(ERROR)]
    assert len(errors) <= 1, err
    return code, out, errors[0][len(ERROR):] if errors else None


def test_default_ir_is_relay_here(capsys, tmp_path):
    code, out, error = _run(capsys, parallel_matmuls(tmp_path / "p.onnx"))
    assert (code, error) == (0, None)
    assert " ir relay " in out and "combined groups: 1" in out


def test_relax_here_says_what_to_use(capsys):
    assert _run(capsys, "--ir", "relax") == (
        2, "", f"--ir relax needs apache-tvm >= 0.27 (with tvm_ffi); this environment has TVM {tvm.__version__} "
               "(No module named 'tvm_ffi'): use --ir relay here, or the main environment (.venv/bin/tvm-combiners)")


def test_op_relay_does_not_support(capsys, tmp_path):
    graph = helper.make_graph([helper.make_node("Det", ["x"], ["y"])], "det",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch"])])
    path = _save(graph, tmp_path / "det.onnx")
    assert _run(capsys, path) == (2, "", f"{path}: import: TVM's Relay ONNX frontend does not support the op Det")


def test_relay_import_failure(capsys, tmp_path):
    """Pad with mode 'wrap': onnxruntime (and Relax) run it, Relay's converter rejects the attribute."""
    graph = helper.make_graph([helper.make_node("Pad", ["x", "pads"], ["y"], mode="wrap")], "pad",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 6])],
                              [numpy_helper.from_array(np.array([0, 1, 0, 1], np.int64), "pads")])
    path = _save(graph, tmp_path / "pad.onnx", opset=19)
    assert _run(capsys, path) == (2, "", f"{path}: import: TVM's Relay ONNX frontend cannot import the model: "
                                         "Value wrap in attribute \"mode\" is invalid for operator Pad.")


def test_bad_files(capsys, tmp_path):
    text = tmp_path / "notes.onnx"
    text.write_text("hello, this is not a model\n")
    assert _run(capsys, text) == (2, "", f"{text}: load: not an ONNX file (27 bytes; protobuf: Error parsing message "
                                         "with type 'onnx.ModelProto': Wire format was corrupt)")
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    assert _run(capsys, empty) == (2, "", f"{empty}: load: empty file (0 bytes), not an ONNX model")


def test_seq_beyond_the_position_embeddings(capsys, tmp_path):
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np.float32), "pos.position_embeddings"),
             numpy_helper.from_array(np.array(1, np.int64), "one"), numpy_helper.from_array(np.array(0, np.int64), "zero")]
    nodes = [helper.make_node("Shape", ["input_ids"], ["shape"]),
             helper.make_node("Gather", ["shape", "one"], ["length"], axis=0),
             helper.make_node("Range", ["zero", "length", "one"], ["positions"]),
             helper.make_node("Gather", ["pos.position_embeddings", "positions"], ["y"])]
    graph = helper.make_graph(nodes, "positions",
                              [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["sequence", 8])], inits)
    path = _save(graph, tmp_path / "pos.onnx")
    assert _run(capsys, path, "--seq", "40") == (
        2, "", f"{path}: prepare: seq 40 is beyond the model's 16 positions (position embedding table "
               "'pos.position_embeddings')")


def test_json_report(capsys, tmp_path):
    path = parallel_matmuls(tmp_path / "p.onnx")
    assert main(["run", str(path), "--json", "--batch", "2", "--repeat", "1"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["ok"], doc["ir"], doc["batch"], doc["executed"]) == (True, "relay", 2, True)
    assert [v["ops"]["dense"] for v in doc["variants"]] == [2, 1]
    assert all(v["max_abs_diff"] <= 1e-5 for v in doc["variants"])
    assert doc["groups"] == ["2 x dense -> add: input (2, 8), weights (16, 8), (4, 8), widths [16, 4]"]


def test_equal_widths_stack_by_default_and_concatenate_on_request(capsys, tmp_path):
    path = parallel_matmuls(tmp_path / "p.onnx", widths=(16, 16))
    docs = {}
    for form in ("stack", "concat"):
        assert main(["run", str(path), "--json", "--batch", "2", "--repeat", "1", "--combine-as", form]) == 0
        docs[form] = json.loads(capsys.readouterr().out)
        assert docs[form]["combine_as"] == form and all(v["max_abs_diff"] <= 1e-5 for v in docs[form]["variants"])
    assert [v["ops"] for v in docs["stack"]["variants"]][1] == {"dense": 0, "batch_matmul": 1, "matmul": 0, "conv2d": 0}
    assert docs["stack"]["groups"] == ["2 x dense -> add: input (2, 8), weights 2 x (16, 8), stacked [16, 16]"]
    assert docs["concat"]["groups"] == ["2 x dense -> add: input (2, 8), weights 2 x (16, 8), widths [16, 16]"]
    assert main(["run", str(path), "--json", "--batch", "2", "--repeat", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["combine_as"] == "stack"  # the default


def test_cuda_is_refused_before_any_work(capsys):
    if tvm.runtime.enabled("cuda"):
        pytest.skip("this Relay build has CUDA")
    assert main(["run", "--target", "cuda"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"{ERROR}this Relay build of TVM has no CUDA code generation: use --ir relax for cuda"]  # nothing loaded


def test_dynamic_image_sizes_are_fixed_for_relay(capsys, tmp_path):
    """Relay cannot allocate unknown sizes: every dynamic axis after the batch gets --seq."""
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "image",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, "h", "w"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3, "h", "w"])])
    path = _save(graph, tmp_path / "image.onnx")
    code, out, error = _run(capsys, path, "--seq", "8", "--json")
    assert (code, error) == (0, None)
    assert [v["max_abs_diff"] for v in json.loads(out)["variants"]] == [0.0, 0.0]


def test_tune_says_it_needs_relax(capsys, tmp_path):
    code, out, error = _run(capsys, parallel_matmuls(tmp_path / "p.onnx"), "--tune", "4")
    assert code == 2 and out == ""
    assert error == "--tune uses MetaSchedule over Relax: run it with --ir relax (the main environment)"
