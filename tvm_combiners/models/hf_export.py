"""Export randomly initialised Hugging Face models (BERT, GPT-2, T5, ViT) to ONNX with ``torch.onnx.export``.

Tests and benchmarks use them to get "standard" transformers models without a model hub: each is
built from a config object with random weights, at sizes the caller chooses (the defaults are
tiny; the real models' sizes are in :data:`REAL_SIZES`). Needs torch and transformers (test-only
dependencies of the main environment).

    python -m tvm_combiners.models.hf_export OUT.onnx [--model bert|gpt2|t5|vit] [--layers 2 --hidden 64]
"""

from __future__ import annotations

import argparse
import os
from typing import Any

#: keyword arguments that make each export the published model's size (BERT-base, GPT-2 124M, T5-small, ViT-S/16)
REAL_SIZES: dict[str, dict[str, int]] = {
    "bert": {"layers": 12, "hidden": 768, "heads": 12, "vocab": 30522},
    "gpt2": {"layers": 12, "hidden": 768, "heads": 12, "vocab": 50257},
    "t5": {"layers": 6, "hidden": 512, "heads": 8, "vocab": 32128},
    "vit": {"layers": 12, "hidden": 384, "heads": 6, "image": 224},
}


def _export(model: Any, args: tuple, path: str | os.PathLike, inputs: list[str], outputs: list[str],
            axes: dict[str, dict[int, str]] | None) -> None:
    """``torch.onnx.export`` at opset 17 with the TorchScript exporter (``dynamo=False``), as every export here."""
    import torch

    torch.onnx.export(model, args, str(path), input_names=inputs, output_names=outputs, opset_version=17,
                      dynamo=False, dynamic_axes=axes)


def export_bert(path: str | os.PathLike, layers: int = 2, hidden: int = 64, heads: int = 4, vocab: int = 500,
                seq: int = 16, dynamic: bool = True, seed: int = 0) -> None:
    """``BertModel``: inputs ``input_ids``, ``attention_mask`` (batch, seq); outputs
    ``last_hidden_state``, ``pooler_output``."""
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
    _export(model, (ids, torch.ones_like(ids)), path, ["input_ids", "attention_mask"],
            ["last_hidden_state", "pooler_output"], axes)


def export_gpt2(path: str | os.PathLike, layers: int = 2, hidden: int = 64, heads: int = 4, vocab: int = 500,
                seq: int = 16, dynamic: bool = True, seed: int = 0) -> None:
    """``GPT2Model`` without its key/value cache: inputs ``input_ids``, ``attention_mask`` (batch,
    seq); output ``last_hidden_state``. It has GPT-2's 1024 positions."""
    problem = export_problem(layers, hidden, heads, vocab, seq)
    if problem:
        raise ValueError(f"export_gpt2: {problem}")
    import torch
    import transformers

    class Wrapper(torch.nn.Module):
        """Positional (input_ids, attention_mask) in, the last hidden state out, no cache."""

        def __init__(self, model: torch.nn.Module) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):  # noqa: ANN001
            return self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state

    config = transformers.GPT2Config(vocab_size=vocab, n_embd=hidden, n_layer=layers, n_head=heads,
                                     n_positions=max(1024, seq), bos_token_id=vocab - 1, eos_token_id=vocab - 1)
    torch.manual_seed(seed)
    model = Wrapper(transformers.GPT2Model(config).eval())
    ids = torch.randint(0, vocab, (1, seq))
    axes = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}} if dynamic else None
    _export(model, (ids, torch.ones_like(ids)), path, ["input_ids", "attention_mask"], ["last_hidden_state"], axes)


def export_t5(path: str | os.PathLike, layers: int = 2, hidden: int = 64, heads: int = 4, vocab: int = 500,
              seq: int = 16, decoder: bool = True, dynamic: bool = True, seed: int = 0) -> None:
    """``T5Model`` (``decoder=False``: ``T5EncoderModel``): inputs ``input_ids``, ``attention_mask``
    (batch, seq) and with the decoder ``decoder_input_ids`` (batch, decoder_seq); outputs
    ``last_hidden_state`` (the decoder's, with it) and, with the decoder, ``encoder_last_hidden_state``.
    Encoder and decoder have ``layers`` layers each, key/value width ``hidden // heads`` and feed-forward
    width ``4 * hidden`` (T5-small's 2048 at hidden 512); T5 has relative positions: any length runs."""
    problem = export_problem(layers, hidden, heads, vocab, seq)
    if problem:
        raise ValueError(f"export_t5: {problem}")
    import torch
    import transformers

    class Wrapper(torch.nn.Module):
        """Positional inputs in, plain tensors out, no cache."""

        def __init__(self, model: torch.nn.Module) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, decoder_input_ids=None):  # noqa: ANN001
            if decoder_input_ids is None:
                return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids,
                             use_cache=False)
            return out.last_hidden_state, out.encoder_last_hidden_state

    config = transformers.T5Config(vocab_size=vocab, d_model=hidden, d_kv=hidden // heads, d_ff=4 * hidden,
                                   num_layers=layers, num_decoder_layers=layers, num_heads=heads)
    torch.manual_seed(seed)
    ids = torch.randint(0, vocab, (1, seq))
    names = ["input_ids", "attention_mask"]
    axes = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}
    if decoder:
        model = Wrapper(transformers.T5Model(config).eval())
        args: tuple = (ids, torch.ones_like(ids), torch.randint(0, vocab, (1, seq)))
        names.append("decoder_input_ids")
        axes["decoder_input_ids"] = {0: "batch", 1: "decoder_seq"}
        outputs = ["last_hidden_state", "encoder_last_hidden_state"]
    else:
        model = Wrapper(transformers.T5EncoderModel(config).eval())
        args = (ids, torch.ones_like(ids))
        outputs = ["last_hidden_state"]
    _export(model, args, path, names, outputs, axes if dynamic else None)


def export_vit(path: str | os.PathLike, layers: int = 2, hidden: int = 64, heads: int = 4, image: int = 32,
               patch: int = 16, dynamic: bool = True, seed: int = 0) -> None:
    """``ViTModel`` (feed-forward width ``4 * hidden``: ViT-S/16's 1536 at hidden 384): input
    ``pixel_values`` (batch, 3, image, image), outputs ``last_hidden_state`` (the class token and one
    token per ``patch`` square) and ``pooler_output``. The position embeddings fix the image size."""
    problem = export_problem(layers, hidden, heads, 1, image // patch)
    if problem:
        raise ValueError(f"export_vit: {problem.replace('seq', 'image // patch')}")
    import torch
    import transformers

    class Wrapper(torch.nn.Module):
        """Pixels in, plain tensors out."""

        def __init__(self, model: torch.nn.Module) -> None:
            super().__init__()
            self.model = model

        def forward(self, pixel_values):  # noqa: ANN001
            out = self.model(pixel_values=pixel_values)
            return out.last_hidden_state, out.pooler_output

    config = transformers.ViTConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                                    intermediate_size=4 * hidden, image_size=image, patch_size=patch)
    torch.manual_seed(seed)
    model = Wrapper(transformers.ViTModel(config).eval())
    axes = {"pixel_values": {0: "batch"}} if dynamic else None
    _export(model, (torch.randn(1, 3, image, image),), path, ["pixel_values"], ["last_hidden_state", "pooler_output"],
            axes)


EXPORTS = {"bert": export_bert, "gpt2": export_gpt2, "t5": export_t5, "vit": export_vit}


def export_problem(layers: int, hidden: int, heads: int, vocab: int, seq: int) -> str | None:
    """What makes these sizes no model (None when they make one): transformers fails on them deep in
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
    parser.add_argument("--model", choices=list(EXPORTS), default="bert")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=500)
    parser.add_argument("--seq", type=int, default=16)
    parser.add_argument("--image", type=int, default=32, help="ViT's image side (16x16 patches)")
    args = parser.parse_args()
    vit = args.model == "vit"
    problem = export_problem(args.layers, args.hidden, args.heads, 1 if vit else args.vocab,
                             args.image // 16 if vit else args.seq)
    if problem:
        parser.error(problem.replace("seq", "image // 16") if vit else problem)
    if vit:
        export_vit(args.path, args.layers, args.hidden, args.heads, args.image)
    else:
        EXPORTS[args.model](args.path, args.layers, args.hidden, args.heads, args.vocab, args.seq)


if __name__ == "__main__":
    main()
