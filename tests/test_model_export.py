"""The exported architectures are the published ones (their parameter counts), their ONNX files compute what
torch does, and loading them takes what newer exporters write."""

from __future__ import annotations

import io

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tvm_combiners.models import ModelError, load_onnx, prepare_onnx, run_onnxruntime


def _params(module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize("kind, image, count", [
    ("resnet50", 224, 25_557_032),        # torchvision's resnet50
    ("vgg16", 224, 138_357_544),          # torchvision's vgg16
    ("inception-v3", 299, 23_834_568),    # torchvision's inception_v3 (27,161,264) less its aux classifier
    ("efficientnet-b0", 224, 5_288_548),  # torchvision's efficientnet_b0
])
def test_cnn_architectures_have_the_published_parameter_counts(kind, image, count):
    torch = pytest.importorskip("torch")
    from tvm_combiners.models.cnn_export import build

    with torch.device("meta"):  # shapes only: no memory, no initialisation
        assert _params(build(kind, image)) == count


def test_vit_s16_has_vit_small_parameter_count():
    """timm's vit_small_patch16_224 has 22,050,664 parameters with its 1000-class head (385,000); ViTModel
    has no head but a pooler (384 x 384 + 384)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from tvm_combiners.models.hf_export import REAL_SIZES

    sizes = REAL_SIZES["vit"]
    config = transformers.ViTConfig(hidden_size=sizes["hidden"], num_hidden_layers=sizes["layers"],
                                    num_attention_heads=sizes["heads"], intermediate_size=4 * sizes["hidden"],
                                    image_size=sizes["image"], patch_size=16)
    with torch.device("meta"):
        assert _params(transformers.ViTModel(config)) == 22_050_664 - 385_000 + 384 * 384 + 384


@pytest.mark.slow
@pytest.mark.parametrize("kind, image", [("vgg-mini", 32), ("inception-v3", 75), ("efficientnet-b0", 32)])
def test_cnn_exports_compute_what_torch_does_and_vary_with_the_input(kind, image, tmp_path):
    """onnxruntime on the file equals torch on the module; two images give different logits, spread
    over the classes (calibrated BatchNorm, or VGG's He initialisation: no constant or vanishing output)."""
    torch = pytest.importorskip("torch")
    from tvm_combiners.models.cnn_export import build, calibrate, export_cnn

    export_cnn(tmp_path / "m.onnx", kind, image, seed=3)
    torch.manual_seed(3)
    module = build(kind, image)
    calibrate(module, image)
    x = np.random.default_rng(0).standard_normal((2, 3, image, image)).astype(np.float32)
    with torch.no_grad():
        expected = module(torch.from_numpy(x)).numpy()
    got = run_onnxruntime(onnx.load(tmp_path / "m.onnx"), {"input": x})[0]
    scale = np.abs(expected).max()
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-4 * scale)
    assert np.abs(got[0] - got[1]).max() > 0.05 * scale and got.std(axis=1).min() > 0.05 * scale


@pytest.mark.slow
def test_vit_export_computes_what_torch_does(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from tvm_combiners.models.hf_export import export_vit

    export_vit(tmp_path / "vit.onnx", layers=1, hidden=32, heads=2, image=32, seed=1)
    model = load_onnx(tmp_path / "vit.onnx")
    assert [(i.name, [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim]) for i in model.graph.input] \
        == [("pixel_values", ["batch", 3, 32, 32])]
    torch.manual_seed(1)
    config = transformers.ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=128,
                                    image_size=32, patch_size=16)
    vit = transformers.ViTModel(config).eval()
    x = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)
    with torch.no_grad():
        out = vit(pixel_values=torch.from_numpy(x))
    hidden, pooled = run_onnxruntime(model, {"pixel_values": x})
    assert hidden.shape == (2, 5, 32)  # the class token and 2 x 2 patches
    np.testing.assert_allclose(hidden, out.last_hidden_state.numpy(), atol=1e-4)
    np.testing.assert_allclose(pooled, out.pooler_output.numpy(), atol=1e-4)
    with pytest.raises(ValueError, match=r"^export_vit: hidden 32 must be a multiple of heads 3$"):
        export_vit(tmp_path / "x.onnx", hidden=32, heads=3)


def _add_model(ir_version: int, dims: list, s_dims: list | None = None, s_type: int = TensorProto.FLOAT
               ) -> onnx.ModelProto:
    """y = x + s (``s`` a scalar unless ``s_dims``); an int64 ``s`` is a model onnxruntime refuses."""
    graph = helper.make_graph([helper.make_node("Add", ["x", "s"], ["y"])], "add",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims),
                               helper.make_tensor_value_info("s", s_type, s_dims or [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=ir_version)


def test_a_newer_ir_version_than_the_checker_knows_loads(tmp_path):
    """silero-vad's ONNX files are IR version 10; the Relay environment's onnx (<1.16) checks up to 9 and
    refused them in the load stage ("ir_version 10 is higher than the checker's (9)"), though
    onnxruntime and TVM read them. The rest of the model is still checked."""
    path = tmp_path / "new.onnx"
    onnx.save(_add_model(onnx.IR_VERSION + 1, [2]), path)
    assert load_onnx(path).ir_version == onnx.IR_VERSION + 1
    broken = _add_model(onnx.IR_VERSION + 1, [2])
    broken.graph.node[0].input[1] = "nowhere"
    onnx.save(broken, path)
    with pytest.raises(ModelError, match="invalid ONNX model: .*nowhere"):
        load_onnx(path)


def test_onnxruntime_rejecting_the_model_names_the_sizes_it_was_given():
    """The message said "at batch 1, seq 128" where the input shapes given, not batch and seq, sized the model."""
    with pytest.raises(ModelError, match=r" rejects the model at x 3, s scalar: "):
        prepare_onnx(_add_model(8, ["n"], s_type=TensorProto.INT64), 1, 128, {"x": (3,), "s": ()})
    with pytest.raises(ModelError, match=r" rejects the model at x 3, batch 1, seq 128: "):
        prepare_onnx(_add_model(8, ["n"], ["m"], TensorProto.INT64), 1, 128, {"x": (3,)})
    with pytest.raises(ModelError, match=r" rejects the model: "):  # static: nothing was sized
        prepare_onnx(_add_model(8, [3], s_type=TensorProto.INT64), 1, 128)


@pytest.mark.slow
def test_a_scalar_input_runs_and_its_size_is_said(tmp_path):
    """A scalar input (silero-vad's ``sr``) was said as "sr " in the progress line."""
    from tvm_combiners.app.job import run_job

    onnx.save(_add_model(8, [4]), tmp_path / "add.onnx")
    log = io.StringIO()
    report = run_job(str(tmp_path / "add.onnx"), repeat=1, log=log, inputs={
        "x": np.arange(4, dtype=np.float32), "s": np.array(2.5, dtype=np.float32)})
    assert "preparing (x 4, s scalar; batch 1, seq 128)" in log.getvalue()
    assert report.inputs == {"x": [4], "s": []} and report.variants[0].max_abs_diff == 0
