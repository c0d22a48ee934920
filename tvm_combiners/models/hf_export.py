"""Export a randomly initialised Hugging Face ``BertModel`` to ONNX with ``torch.onnx.export``.

Tests and benchmarks use it to get a "standard" transformers BERT without a model hub. Needs
torch and transformers (test-only dependencies of the main environment).

    python -m tvm_combiners.models.hf_export OUT.onnx [--layers 2 --hidden 64]
"""

from __future__ import annotations

import argparse
import os


def export_bert(path: str | os.PathLike, layers: int = 2, hidden: int = 64, heads: int = 4, vocab: int = 500,
                seq: int = 16, dynamic: bool = True, seed: int = 0) -> None:
    problem = export_problem(layers, hidden, heads, vocab, seq)
    if problem:
        raise ValueError(f"export_bert: {problem}")
    import torch
    import transformers

    class Wrapper(torch.nn.Module):
        """Positional (input_ids, attention_mask) in, plain tensors out: what the exporter wants."""

        def __init__(self, model: torch.nn.Module) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):  # noqa: ANN001
            out = self.model(input_ids=input_ids, attention_mask=attention_mask)
            return out.last_hidden_state, out.pooler_output

    config = transformers.BertConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                                     num_attention_heads=heads, intermediate_size=4 * hidden,
                                     max_position_embeddings=max(512, seq))  # BERT's: `run`'s seq 128 fits
    torch.manual_seed(seed)
    model = Wrapper(transformers.BertModel(config).eval())
    ids = torch.randint(0, vocab, (1, seq))
    axes = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}} if dynamic else None
    torch.onnx.export(model, (ids, torch.ones_like(ids)), str(path), input_names=["input_ids", "attention_mask"],
                      output_names=["last_hidden_state", "pooler_output"], opset_version=17, dynamo=False,
                      dynamic_axes=axes)


def export_problem(layers: int, hidden: int, heads: int, vocab: int, seq: int) -> str | None:
    """What makes these sizes no BERT (None when they make one): transformers fails on them deep in
    its code, or (no layers) exports a model that is only embeddings."""
    for name, value in (("layers", layers), ("hidden", hidden), ("heads", heads), ("vocab", vocab), ("seq", seq)):
        if value < 1:
            return f"{name} must be at least 1, got {value}"
    if hidden % heads:
        return f"hidden {hidden} must be a multiple of heads {heads}"
    return None


def main() -> None:
    import warnings

    warnings.filterwarnings("ignore")
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("path")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=500)
    parser.add_argument("--seq", type=int, default=16)
    args = parser.parse_args()
    problem = export_problem(args.layers, args.hidden, args.heads, args.vocab, args.seq)
    if problem:
        parser.error(problem)
    export_bert(args.path, args.layers, args.hidden, args.heads, args.vocab, args.seq)


if __name__ == "__main__":
    main()
