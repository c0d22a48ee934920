"""Input shapes by name (``--input-shapes``) and real input data (``--inputs``), as tvmc takes them."""

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tvm_combiners.app.cli import main
from tvm_combiners.app.usage import UsageError, parse_input_shapes
from tvm_combiners.models import example_inputs, prepare_onnx, run_onnxruntime
from tvm_combiners.models.loader import ModelError


def _model(path=None):
    """x [n, 8] and an image-like y [n, 2, h, w]: two sibling matmuls on x, y only summed."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
             for n, s in [("w1", (8, 16)), ("w2", (8, 4))]]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["y1"]), helper.make_node("MatMul", ["x", "w2"], ["y2"]),
             helper.make_node("ReduceSum", ["y"], ["s"], keepdims=0)]
    graph = helper.make_graph(nodes, "inputs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8]),
                                                helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 2, "h", "w"])],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, shape)
                               for o, shape in (("y1", ["n", 16]), ("y2", ["n", 4]), ("s", []))],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # onnx >= 1.17 writes IR 10+, which older onnxruntime builds reject
    if path is None:
        return model
    onnx.save(model, str(path))
    return path


def test_parse_input_shapes_takes_both_forms_and_names_with_colons():
    assert parse_input_shapes("x:3x8,y:3x2x5x7") == {"x": (3, 8), "y": (3, 2, 5, 7)}
    assert parse_input_shapes("x:[3, 8] y:[3,2,5,7]") == {"x": (3, 8), "y": (3, 2, 5, 7)}
    assert parse_input_shapes("input:0:[1,3]") == {"input:0": (1, 3)}


@pytest.mark.parametrize("text, message", [
    ("x:3xq", "argument --input-shapes: 'x:3xq' is not NAME:DIMxDIM... or NAME:[DIM,DIM,...] (e.g. input_ids:1x128 "
              "or pixel_values:[1,3,224,224])"),
    ("x:3,x:4", "argument --input-shapes: input 'x' is given twice"),
    ("x:0x8", "argument --input-shapes: input 'x': every size must be positive, got 0x8"),
])
def test_parse_input_shapes_refuses_with_one_line(text, message):
    with pytest.raises(UsageError) as info:
        parse_input_shapes(text)
    assert str(info.value) == message


def test_prepare_onnx_sizes_named_inputs_and_their_named_axes_elsewhere():
    model = prepare_onnx(_model(), batch=1, seq=4, shapes={"y": (3, 2, 5, 7)})
    shapes = {name: a.shape for name, a in example_inputs(model, 1, 4).items()}
    assert shapes == {"x": (3, 8), "y": (3, 2, 5, 7)}  # x's axis "n" follows y's


@pytest.mark.parametrize("shapes, problem", [
    ({"q": (1, 8)}, "the input shapes name 'q', but the model has no input of that name (its inputs: x, y)"),
    ({"x": (1, 8, 1)}, "input 'x' has 2 axes, its shape given has 3 (1x8x1)"),
    ({"x": (1, 9)}, "input 'x': axis 1 is fixed at 8 in the model, the shape given says 9"),
    ({"x": (2, 8), "y": (3, 2, 1, 1)}, "input 'y': axis 0 ('n') is given 3, another input's axis of that name 2"),
])
def test_prepare_onnx_refuses_shapes_the_model_cannot_take(shapes, problem):
    with pytest.raises(ModelError) as info:
        prepare_onnx(_model(), shapes=shapes)
    assert info.value.problem == problem


def _run(capsys, *args):
    code = main(["run", *args, "--repeat", "1", "--json"])
    out, err = capsys.readouterr()
    return code, json.loads(out), err


def test_cli_runs_at_the_shapes_given_and_says_so(capsys, tmp_path):
    path = _model(tmp_path / "m.onnx")
    code, report, err = _run(capsys, str(path), "--input-shapes", "y:[2,2,3,5]", "--seq", "6")
    assert code == 0, err
    assert report["inputs"] == {"x": [2, 8], "y": [2, 2, 3, 5]} and report["inputs_file"] is None
    assert (report["batch"], report["seq"]) == (None, None)  # y's shape sized x's n: --batch 1 and --seq 6 sized nothing
    assert len(report["groups"]) == 1 and all(v["max_abs_diff"] <= 1e-5 for v in report["variants"])
    assert "[tvm-combiners] preparing (y 2x2x3x5; batch 1, seq 6)" in err


def test_json_reports_no_batch_or_seq_where_the_shapes_given_sized_every_input(capsys, tmp_path):
    path = _model(tmp_path / "m.onnx")
    # 4 and 3 stand in the shapes, but the user's shapes put them there, not --batch/--seq
    code, report, err = _run(capsys, str(path), "--input-shapes", "x:4x8,y:4x2x3x3", "--batch", "4", "--seq", "3")
    assert code == 0, err
    assert report["inputs"] == {"x": [4, 8], "y": [4, 2, 3, 3]}
    assert (report["batch"], report["seq"]) == (None, None)


def test_cli_runs_on_the_data_given_and_compares_it_with_onnxruntime(capsys, tmp_path):
    path = _model(tmp_path / "m.onnx")
    rng = np.random.default_rng(1)
    data = {"x": rng.standard_normal((5, 8)).astype(np.float32), "y": rng.standard_normal((5, 2, 3, 3)).astype(np.float32)}
    np.savez(tmp_path / "in.npz", **data)
    code, report, err = _run(capsys, str(path), "--inputs", str(tmp_path / "in.npz"))
    assert code == 0, err
    assert report["inputs"] == {"x": [5, 8], "y": [5, 2, 3, 3]} and report["inputs_file"] == str(tmp_path / "in.npz")
    assert (report["batch"], report["seq"]) == (None, None)
    expected = run_onnxruntime(prepare_onnx(_model(), shapes={k: v.shape for k, v in data.items()}), data)
    np.testing.assert_allclose(expected[0], data["x"] @ numpy_helper.to_array(_model().graph.initializer[0]), rtol=1e-5)
    assert all(v["max_abs_diff"] <= 1e-5 for v in report["variants"])


@pytest.mark.parametrize("arrays, shapes, line", [
    ({"x": (5, 8)}, None, "in.npz: inputs: {npz}: no array for input 'y' (the model's inputs: x, y)"),
    ({"x": (5, 8), "y": (5, 2, 3, 3), "z": (1,)}, None,
     "in.npz: inputs: {npz}: 'z' is no input of the model (the model's inputs: x, y)"),
    ({"x": (5, 8), "y": (5, 2, 3, 3)}, "x:4x8", "in.npz: inputs: input 'x': the array given has shape (5, 8), the "
                                                "input shapes say (4, 8)"),
])
def test_cli_refuses_data_that_does_not_fit_with_one_line(capsys, tmp_path, arrays, shapes, line):
    path = _model(tmp_path / "m.onnx")
    npz = tmp_path / "in.npz"
    np.savez(npz, **{k: np.zeros(s, np.float32) for k, s in arrays.items()})
    extra = ["--input-shapes", shapes] if shapes else []
    code = main(["run", str(path), "--inputs", str(npz), *extra, "--repeat", "1"])
    err = capsys.readouterr().err
    assert code == 2
    want = line.replace("in.npz: inputs:", f"{path}: inputs:", 1).format(npz=npz)
    assert err.splitlines()[-1] == f"tvm-combiners: error: {want}"


def test_cli_refuses_data_of_another_dtype(capsys, tmp_path):
    path = _model(tmp_path / "m.onnx")
    np.savez(tmp_path / "in.npz", x=np.zeros((2, 8), np.float64), y=np.zeros((2, 2, 3, 3), np.float32))
    code = main(["run", str(path), "--inputs", str(tmp_path / "in.npz"), "--repeat", "1"])
    assert code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"tvm-combiners: error: {path}: inputs: input 'x' is float32 in the model, the array given is float64")


def test_cli_refuses_a_bad_shape_string_before_loading_anything(capsys, tmp_path):
    code = main(["run", str(tmp_path / "missing.onnx"), "--input-shapes", "x:8xz"])
    assert code == 2
    assert capsys.readouterr().err.splitlines() == [
        "tvm-combiners: error: --input-shapes: 'x:8xz' is not NAME:DIMxDIM... or NAME:[DIM,DIM,...] "
        "(e.g. input_ids:1x128 or pixel_values:[1,3,224,224])"]


def test_a_slow_step_says_how_long_it_took(capsys, tmp_path, monkeypatch):
    from tvm_combiners.app.job import run as job_run

    monkeypatch.setattr(job_run, "SLOW_STEP_S", 0.0)  # every step counts as slow
    path = _model(tmp_path / "m.onnx")
    code, _, err = _run(capsys, str(path), "--input-shapes", "y:[2,2,3,5]")
    assert code == 0, err
    lines = err.splitlines()
    for step in ("loading", "preparing", "running onnxruntime", "importing into", "combining", "compiling baseline",
                 "running combined", "timing onnxruntime"):
        started = next(i for i, line in enumerate(lines) if line.startswith(f"[tvm-combiners] {step}"))
        took = lines[started].removeprefix("[tvm-combiners] ") + ": "
        assert any(line.startswith(f"[tvm-combiners] {took}") and line.endswith(" s") for line in lines[started + 1:]), (
            step, lines)
    assert any(line.startswith("[tvm-combiners] timing the modules: ") for line in lines), lines
