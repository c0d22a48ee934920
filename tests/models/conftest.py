import pytest

from tvm_combiners.models import default_model_path, prepare_onnx


@pytest.fixture(scope="session")
def minilm():
    """paraphrase-MiniLM-L3-v2, prepared for batch 1, sequence 128."""
    return prepare_onnx(default_model_path(), 1, 128)


@pytest.fixture(scope="session")
def hf_bert_path(tmp_path_factory):
    """A randomly initialised transformers BertModel (2 layers, hidden 64) exported by torch.onnx.export."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")

    class Wrapper(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):
            out = self.model(input_ids=input_ids, attention_mask=attention_mask)
            return out.last_hidden_state, out.pooler_output

    config = transformers.BertConfig(vocab_size=500, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=128, max_position_embeddings=64)
    torch.manual_seed(0)
    model = Wrapper(transformers.BertModel(config).eval())
    ids = torch.randint(0, 500, (1, 16))
    mask = torch.ones(1, 16, dtype=torch.int64)
    path = tmp_path_factory.mktemp("bert") / "bert.onnx"
    torch.onnx.export(model, (ids, mask), str(path), input_names=["input_ids", "attention_mask"],
                      output_names=["last_hidden_state", "pooler_output"], opset_version=17, dynamo=False,
                      dynamic_axes={"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}})
    return path
