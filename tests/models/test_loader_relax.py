"""The loader and the Relax combiners on real models, compared with onnxruntime."""

import re

import numpy as np
import onnx
import pytest
import tvm.relax.frontend.onnx  # noqa: F401
from tvm import relax

from tvm_combiners.compile.relax_runner import compile_module, count_ops, cuda_source, run_vm
from tvm_combiners.models import (
    ModelError,
    default_model_path,
    example_inputs,
    import_relax,
    input_specs,
    load_onnx,
    position_limit,
    prepare_onnx,
    run_onnxruntime,
)
from tvm_combiners.relax import CombineParallelOps

pytestmark = pytest.mark.slow


def max_diff(outputs, reference):
    assert len(outputs) == len(reference)
    return max(float(np.max(np.abs(o.astype(np.float64) - r))) for o, r in zip(outputs, reference))


def test_default_model_is_found():
    path = default_model_path()
    assert path.name == "paraphrase-MiniLM-L3-v2.onnx" and path.is_file()


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nope\.onnx: ONNX model not found$"):
        prepare_onnx(tmp_path / "nope.onnx")


def test_broken_file_is_a_model_error_naming_it(tmp_path):
    path = tmp_path / "half.onnx"
    path.write_bytes(default_model_path().read_bytes()[:1000])
    with pytest.raises(ModelError) as info:
        load_onnx(path)
    assert info.value.path == str(path) and info.value.problem.startswith("truncated or corrupt ONNX file (1000 bytes")


def test_position_limit_of_minilm():
    raw = onnx.load(str(default_model_path()))
    assert position_limit(raw) == (512, "model.0.auto_model.embeddings.position_embeddings.weight")
    with pytest.raises(ModelError, match=r"^<model>: seq 513 is beyond the model's 512 positions"):
        prepare_onnx(raw, 1, 513)


def test_prepare_fixes_sizes_and_keeps_matmuls(minilm):
    assert input_specs(minilm) == {"input_ids": ([1, 128], "int64"), "attention_mask": ([1, 128], "int64")}
    assert sum(n.op_type == "MatMul" for n in minilm.graph.node) == 24
    assert not any(n.op_type in ("Gemm", "ConstantOfShape", "Shape") for n in minilm.graph.node)


@pytest.mark.parametrize("params_as_inputs", [False, True])
def test_minilm_qkv_combined_and_equal_to_onnxruntime(minilm, params_as_inputs):
    mod, params = import_relax(minilm, params_as_inputs=params_as_inputs)
    groups = []
    new = CombineParallelOps(on_combine=groups.append)(mod)
    assert count_ops(mod)["matmul"] == 24 and count_ops(new)["matmul"] == 18
    assert [g.widths for g in groups] == [(384, 384, 384)] * 3
    assert all(g.follower_ops == ("add",) for g in groups)  # the biases came along
    inputs = example_inputs(minilm)
    reference = run_onnxruntime(minilm, inputs)
    outputs = run_vm(compile_module(new), list(inputs.values()), params=params.get("main", []))
    assert max_diff(outputs, reference) <= 1e-4


def test_minilm_with_symbolic_batch_and_sequence():
    model = prepare_onnx(default_model_path(), batch=None, seq=None)
    mod, _ = import_relax(model)
    new = CombineParallelOps()(mod)
    assert count_ops(new)["matmul"] == 18
    executable = compile_module(new)
    for batch, seq in [(1, 16), (2, 40)]:
        inputs = example_inputs(model, batch, seq)
        assert max_diff(run_vm(executable, list(inputs.values())), run_onnxruntime(model, inputs)) <= 1e-4


def test_torch_exported_bert_needs_preparation_and_then_combines(hf_bert_path):
    raw = onnx.load(str(hf_bert_path))
    with pytest.raises(Exception, match="broadcast_to expects"):
        relax.frontend.onnx.from_onnx(raw, shape_dict={"input_ids": [1, 16], "attention_mask": [1, 16]})
    model = prepare_onnx(hf_bert_path, 1, 16)
    mod, _ = import_relax(model)
    groups = []
    new = CombineParallelOps(on_combine=groups.append)(mod)
    assert len(groups) == 2 and all(g.widths == (64, 64, 64) for g in groups)  # Q, K, V of both layers
    assert count_ops(mod)["matmul"] - count_ops(new)["matmul"] == 4
    inputs = example_inputs(model, 1, 16)
    reference = run_onnxruntime(model, inputs)
    for m in (mod, new):
        assert max_diff(run_vm(compile_module(m), list(inputs.values())), reference) <= 1e-4


def test_minilm_compiles_for_cuda(minilm):
    mod, _ = import_relax(minilm)
    executable = compile_module(CombineParallelOps()(mod), "cuda")
    assert cuda_source(executable).count("__global__") >= 18  # at least one kernel per matmul


def test_googlenet_inception_blocks_54_to_36_convolutions():
    from tvm_combiners.models.inception import inception_model

    model = prepare_onnx(inception_model(size=14), batch=1, seq=None)
    mod, _ = import_relax(model)
    assert count_ops(relax.transform.CombineParallelMatmul()(mod))["nn.conv2d"] == 54  # TVM's Relax: no conv combiner
    groups = []
    new = CombineParallelOps(on_combine=groups.append)(mod)
    assert count_ops(mod)["nn.conv2d"] == 54 and count_ops(new)["nn.conv2d"] == 36
    assert len(groups) == 9 and all(g.family == "conv2d" and len(g.roots) == 3 for g in groups)
    inputs = example_inputs(model)
    assert max_diff(run_vm(compile_module(new), list(inputs.values())), run_onnxruntime(model, inputs)) <= 1e-4


def test_generated_ids_stay_inside_a_table_read_through_a_cast():
    """ids cast to int32 before their Gather: the bound was 1000, and onnxruntime failed on row 850 of 10."""
    from onnx import TensorProto, helper

    table = helper.make_tensor("table", TensorProto.FLOAT, [10, 4], np.arange(40, dtype=np.float32))
    nodes = [helper.make_node("Cast", ["ids"], ["ids32"], to=TensorProto.INT32),
             helper.make_node("Unsqueeze", ["ids32", "axes"], ["ids3"]),
             helper.make_node("Gather", ["table", "ids3"], ["out"])]
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [2])
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["b", "s"])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)], [table, axes])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    ids = example_inputs(model, batch=4, seq=64)["ids"]
    assert ids.shape == (4, 64) and ids.dtype == np.int64 and ids.min() >= 0 and ids.max() == 9
    assert run_onnxruntime(model, {"ids": ids})[0].shape == (4, 64, 1, 4)


def _two_input_model(dims_a, dims_b, dtype_b=None, perm=None):
    from onnx import TensorProto, helper

    b_type = dtype_b or TensorProto.FLOAT
    nodes = [helper.make_node("Cast", ["b"], ["bc"], to=TensorProto.FLOAT),
             helper.make_node("Transpose", ["bc"], ["bf"], perm=perm) if perm else helper.make_node("Identity", ["bc"], ["bf"]),
             helper.make_node("Add", ["a", "bf"], ["out"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("a", TensorProto.FLOAT, dims_a),
                                           helper.make_tensor_value_info("b", b_type, dims_b)],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_named_dims_get_one_size_wherever_they_stand():
    """Review: axis 0 was the batch and every later axis the sequence, so b ``[seq_len, batch, 16]``
    beside a ``[batch, seq_len, 16]`` was fed (1, 8, 16) (a broadcast into another problem) and
    ``--batch 2`` made onnxruntime reject a valid model."""
    model = prepare_onnx(_two_input_model(["batch", "seq_len", 16], ["seq_len", "batch", 16], perm=[1, 0, 2]),
                         batch=2, seq=8)
    assert {k: v[0] for k, v in input_specs(model).items()} == {"a": [2, 8, 16], "b": [8, 2, 16]}
    anonymous = prepare_onnx(_two_input_model(["n", "m"], ["m"]), batch=2, seq=8)  # no word: the first place decides
    assert {k: v[0] for k, v in input_specs(anonymous).items()} == {"a": [2, 8], "b": [8]}
    # kept symbolic (batch=None, seq=None), the inputs made for it follow the same names (helper-51:
    # b was fed (2, 8, 16) and onnxruntime failed; a lone [seq_len, batch] had its sizes swapped)
    symbolic = prepare_onnx(_two_input_model(["batch", "seq_len", 16], ["seq_len", "batch", 16], perm=[1, 0, 2]),
                            batch=None, seq=None)
    inputs = example_inputs(symbolic, batch=2, seq=8)
    assert {k: v.shape for k, v in inputs.items()} == {"a": (2, 8, 16), "b": (8, 2, 16)}
    assert run_onnxruntime(symbolic, inputs)[0].shape == (2, 8, 16)
    assert {k: v.shape for k, v in example_inputs(_two_input_model(["n", "m"], ["m"]), 2, 8).items()} == {
        "a": (2, 8), "b": (8,)}


def test_bool_inputs_hold_both_values_and_non_tensor_inputs_are_refused(tmp_path):
    from onnx import TensorProto, helper

    flags = example_inputs(_two_input_model([4, 64], [4, 64], TensorProto.BOOL))["b"]
    assert flags.dtype == np.bool_ and flags.any() and not flags.all()  # was all True: a Where took one side
    graph = helper.make_graph([helper.make_node("SequenceAt", ["s", "zero"], ["y"])], "g",
                              [helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
                              [onnx.numpy_helper.from_array(np.array(0, np.int64), "zero")])
    path = tmp_path / "seq.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), path)
    with pytest.raises(ModelError, match="input 's' is a sequence, not a tensor: the job generates tensor inputs only"):
        prepare_onnx(path)  # was exit 1, 'KeyError: 0 (a bug in tvm-combiners)'
    graph = helper.make_graph([helper.make_node("SequenceConstruct", ["x", "x"], ["s"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, [2])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), path)
    with pytest.raises(ModelError, match="output 's' is a sequence, not a tensor: TVM flattens it"):
        prepare_onnx(path)  # was exit 2 blaming the run: '3 outputs but 2 reference outputs'


def test_ids_gathered_along_another_axis_stay_inside_that_axis():
    """Review: the bound came from the table's first dim whatever the Gather's axis (850 in a 5-wide axis)."""
    from onnx import TensorProto, helper

    table = helper.make_tensor("table", TensorProto.FLOAT, [300, 5], np.arange(1500, dtype=np.float32))
    graph = helper.make_graph([helper.make_node("Gather", ["table", "ids"], ["out"], axis=1)], "g",
                              [helper.make_tensor_value_info("ids", TensorProto.INT64, ["b", "s"])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)], [table])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    ids = example_inputs(model, batch=2, seq=64)["ids"]
    assert ids.min() >= 0 and ids.max() == 4
    assert run_onnxruntime(model, {"ids": ids})[0].shape == (300, 2, 64)


def test_onnxruntime_messages_keep_the_line_that_says_what():
    from tvm_combiners.models.loader import first_line

    err = RuntimeError("[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : Got invalid dimensions for input: x for the "
                       "following indices\n index: 1 Got: 8 Expected: 0\n Please fix either the inputs/outputs or the model.")
    assert first_line(err) == "Got invalid dimensions for input: x for the following indices index: 1 Got: 8 Expected: 0"


def test_torch_named_axes_are_not_read_by_their_inputs_name():
    """torch names the axes of ``token_type_ids`` ``token_type_ids_dynamic_axes_1`` and ``_2``: "token"
    in the input's own name made the batch axis the sequence ((8, 8) beside input_ids (1, 8); review)."""
    model = _two_input_model(["input_ids_dynamic_axes_1", "input_ids_dynamic_axes_2"],
                             ["b_position_ids_dynamic_axes_1", "b_position_ids_dynamic_axes_2"])
    model.graph.input[1].name = "b_position_ids"
    model.graph.node[0].input[0] = "b_position_ids"
    prepared = prepare_onnx(model, batch=2, seq=8)
    assert {k: v[0] for k, v in input_specs(prepared).items()} == {"a": [2, 8], "b_position_ids": [2, 8]}


def test_an_input_name_is_stripped_only_before_an_axis_number():
    """Review: input 's' with dims ["seq", "batch", 4]: stripping the input's name left "eq", which
    matched nothing, so axis 0 took the batch: (2, 2, 4) ran for --batch 2 --seq 5."""
    model = _two_input_model([5, 2, 4], ["seq", "batch", 4])
    model.graph.input[1].name = "s"
    model.graph.node[0].input[0] = "s"
    prepared = prepare_onnx(model, batch=2, seq=5)
    assert {k: v[0] for k, v in input_specs(prepared).items()} == {"a": [5, 2, 4], "s": [5, 2, 4]}
    # the whole name before a separator still goes: "position" in position_ids_dim_0 says nothing
    model = _two_input_model([2, 5], ["position_ids_dim_0", "position_ids_dim_1"])
    model.graph.input[1].name = "position_ids"
    model.graph.node[0].input[0] = "position_ids"
    prepared = prepare_onnx(model, batch=2, seq=5)
    assert input_specs(prepared)["position_ids"][0] == [2, 5]  # was [5, 5] for a moment (review)


def test_inputs_of_types_numpy_lacks_are_refused_by_name():
    """Review: a bfloat16 input was fed float32, and the job blamed onnxruntime ("Numpy_type 256")."""
    from onnx import TensorProto

    model = _two_input_model([2, 3], [2, 3], dtype_b=TensorProto.BFLOAT16)
    with pytest.raises(ModelError, match=re.escape("input 'b' is bfloat16: the job generates inputs of numpy's own "
                                                   "types only (bool, int8, ")):
        prepare_onnx(model)


def test_a_fixed_zero_dim_is_fed_zero_and_the_job_runs(tmp_path, capsys):
    """A fixed 0 dim was fed ``--seq`` (onnxruntime then refused the model); fed its 0, the
    combiners crashed (exit 1: a Reshape of [1, 1, 0, 16] to [1, 1, 16]). Now both run."""
    from onnx import TensorProto, helper, numpy_helper

    from tvm_combiners.app.cli import main

    weights = [numpy_helper.from_array(np.ones((16, 16), np.float32) * k, f"w{k}") for k in (1, 2)]
    graph = helper.make_graph([helper.make_node("MatMul", ["x", f"w{k}"], [f"y{k}"]) for k in (1, 2)], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 0, 16])],
                              [helper.make_tensor_value_info(f"y{k}", TensorProto.FLOAT, [1, 0, 16]) for k in (1, 2)],
                              weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    assert example_inputs(model)["x"].shape == (1, 0, 16)
    onnx.save(model, tmp_path / "zero.onnx")
    assert main(["run", str(tmp_path / "zero.onnx"), "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "inputs x (1, 0, 16)" in out and "combined groups: 0" in out


def test_hf_export_fits_runs_defaults_and_refuses_sizes_that_make_no_bert(hf_bert_path, tmp_path):
    """Its default model had 64 positions, so `tvm-combiners run` (seq 128) refused it; heads that do
    not divide hidden, or a size of 0, ended in transformers' tracebacks, and 0 layers exported a
    model of embeddings alone (helper-51)."""
    from tvm_combiners.models.hf_export import export_bert

    assert position_limit(load_onnx(hf_bert_path))[0] == 512
    for sizes, problem in (({"heads": 5}, "hidden 64 must be a multiple of heads 5"),
                           ({"layers": 0}, "layers must be at least 1, got 0"),
                           ({"vocab": 0}, "vocab must be at least 1, got 0")):
        with pytest.raises(ValueError, match=f"^export_bert: {problem}$"):
            export_bert(tmp_path / "x.onnx", **sizes)
    assert not (tmp_path / "x.onnx").exists()


def test_generated_masks_pad_each_batch_item_along_its_sequence(tmp_path):
    """Each item keeps at least one position, and items and seeds differ; a time-major mask is
    padded along axis 0 (padding axis 1 left a batch item fully masked); an exporter's -1 size is
    an unnamed dynamic axis (it reached the name rules as an int: AttributeError, helper-52)."""
    from onnx import TensorProto, helper

    def one_input(name, dims, dtype=TensorProto.INT64):
        graph = helper.make_graph([helper.make_node("Identity", [name], ["y"])], "g",
                                  [helper.make_tensor_value_info(name, dtype, dims)],
                                  [helper.make_tensor_value_info("y", dtype, None)])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)

    batch_major = one_input("attention_mask", ["batch", "seq_len"])
    masks = [example_inputs(batch_major, batch=8, seq=16, seed=s)["attention_mask"] for s in range(20)]
    assert all(m.shape == (8, 16) and m.any(axis=1).all() and not m.all(axis=1).any() for m in masks)
    assert len({m.sum(axis=1).tobytes() for m in masks}) > 1 and any(len(set(m.sum(axis=1))) > 1 for m in masks)
    time_major = example_inputs(one_input("attention_mask", ["seq_len", "batch"]), batch=8, seq=16)["attention_mask"]
    assert time_major.shape == (16, 8) and time_major.any(axis=0).all() and not time_major.all(axis=0).any()
    assert example_inputs(one_input("x", [-1, 4], TensorProto.FLOAT), batch=2, seq=8)["x"].shape == (2, 4)


@pytest.mark.slow
@pytest.mark.parametrize("batch, seq, sizes", [(None, 16, "input_ids (batch, 16)"), (2, None, "input_ids (2, seq)")])
def test_a_dynamic_axis_tvm_cannot_import_is_said_in_one_line(batch, seq, sizes, tmp_path):
    """A transformers-exported BERT with a dynamic batch or sequence: a raw TypeError about
    ``relax.concat`` (or a ValueError about ``and``/``or``) came out of TVM's frontend."""
    from tvm_combiners.models import import_relax, prepare_onnx
    from tvm_combiners.models.hf_export import export_bert

    export_bert(tmp_path / "bert.onnx", layers=1, hidden=32, heads=2, vocab=100, seq=16, dynamic=True)
    with pytest.raises(ValueError) as info:
        import_relax(prepare_onnx(tmp_path / "bert.onnx", batch, seq))
    line = str(info.value)
    assert "\n" not in line and line.startswith(f"the dynamic input sizes {sizes}, ")
    assert " are more than TVM's Relax ONNX frontend imports here: fix them (prepare_onnx's batch and seq) [" in line
