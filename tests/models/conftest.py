import pytest

from tvm_combiners.models import default_model_path, prepare_onnx


@pytest.fixture(scope="session")
def minilm():
    """paraphrase-MiniLM-L3-v2, prepared for batch 1, sequence 128."""
    return prepare_onnx(default_model_path(), 1, 128)


@pytest.fixture(scope="session")
def hf_bert_path(tmp_path_factory):
    """A randomly initialised transformers BertModel (2 layers, hidden 64) exported by torch.onnx.export."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tvm_combiners.models.hf_export import export_bert

    path = tmp_path_factory.mktemp("bert") / "bert.onnx"
    export_bert(str(path))
    return path
