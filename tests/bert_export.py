"""Export a small randomly initialised transformers BertModel to ONNX (needs torch + transformers).

Used by the main environment's tests directly and by the Relay environment's tests through the
main environment's Python (the Relay environment has no torch): ``python bert_export.py OUT.onnx``.
"""

import sys


def export_bert(path: str) -> None:
    import torch
    import transformers

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
    torch.onnx.export(model, (ids, mask), path, input_names=["input_ids", "attention_mask"],
                      output_names=["last_hidden_state", "pooler_output"], opset_version=17, dynamo=False,
                      dynamic_axes={"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}})


if __name__ == "__main__":
    import warnings

    warnings.filterwarnings("ignore")
    export_bert(sys.argv[1])
