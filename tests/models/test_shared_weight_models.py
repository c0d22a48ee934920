"""Shared-weight combining on torch-exported models, checked against onnxruntime (issue 12)."""

import numpy as np
import onnx
import pytest

from tvm_combiners.compile.relax_runner import compile_module, count_ops, run_vm
from tvm_combiners.models import import_relax, run_onnxruntime
from tvm_combiners.relax import CombineParallelMatmul, CombineParallelOps

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    from tvm_combiners.models.rnn_export import export_siamese, export_unrolled_rnn

    folder = tmp_path_factory.mktemp("shared_weight")
    export_unrolled_rnn(folder / "rnn.onnx", steps=6)
    export_siamese(folder / "siamese.onnx")
    return {"rnn": onnx.load(folder / "rnn.onnx"), "siamese": onnx.load(folder / "siamese.onnx")}


@pytest.mark.parametrize("kind, before, after", [("rnn", 12, 7), ("siamese", 4, 2)])
def test_combined_model_matches_onnxruntime(exported, kind, before, after):
    model = exported[kind]
    rng = np.random.default_rng(0)
    inputs = {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype("float32")
              for i in model.graph.input}
    mod, _ = import_relax(model)
    combined = CombineParallelOps()(mod)
    assert count_ops(mod)["matmul"] == before and count_ops(combined)["matmul"] == after
    assert count_ops(CombineParallelMatmul()(mod))["matmul"] == before  # no shared input: only ours finds these
    expected = run_onnxruntime(model, inputs)
    got = run_vm(compile_module(combined, "llvm"), list(inputs.values()))
    for e, g in zip(expected, got, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)
