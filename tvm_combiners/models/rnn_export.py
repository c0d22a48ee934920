"""Export an unrolled Elman RNN and a siamese encoder to ONNX with ``torch.onnx.export``.

Models where sibling MatMuls read one *weight* with different inputs (the input projections of
every time step; the two towers of a siamese pair), for the shared-weight combiners' tests and
benchmarks. Needs torch (a test-only dependency of the main environment).

    python -m tvm_combiners.models.rnn_export OUT.onnx [--kind rnn|siamese]
"""

from __future__ import annotations

import argparse
import os


def export_unrolled_rnn(path: str | os.PathLike, steps: int = 6, features: int = 16, hidden: int = 32,
                        batch: int = 2, seed: int = 0) -> None:
    """``h_t = tanh(x_t W_ih + b + h_{t-1} W_hh)`` unrolled over ``steps``; input ``x`` (batch, steps, features)."""
    import torch

    class UnrolledRNN(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w_ih = torch.nn.Parameter(torch.randn(features, hidden) * 0.3)
            self.w_hh = torch.nn.Parameter(torch.randn(hidden, hidden) * 0.3)
            self.bias = torch.nn.Parameter(torch.randn(hidden) * 0.1)

        def forward(self, x):  # noqa: ANN001
            h = torch.zeros(x.shape[0], hidden)
            outputs = []
            for t in range(steps):
                h = torch.tanh(x[:, t] @ self.w_ih + self.bias + h @ self.w_hh)
                outputs.append(h)
            return torch.stack(outputs, 1)

    torch.manual_seed(seed)
    x = torch.randn(batch, steps, features)
    torch.onnx.export(UnrolledRNN().eval(), (x,), str(path), input_names=["x"], output_names=["h"], opset_version=17,
                      dynamo=False)


def export_siamese(path: str | os.PathLike, features: int = 16, hidden: int = 32, batch: int = 3,
                   seed: int = 0) -> None:
    """Two inputs through one two-layer encoder, then their cosine similarity."""
    import torch

    torch.manual_seed(seed)
    encoder = torch.nn.Sequential(torch.nn.Linear(features, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, hidden))

    class Siamese(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = encoder

        def forward(self, a, b):  # noqa: ANN001
            return torch.nn.functional.cosine_similarity(self.encoder(a), self.encoder(b), dim=-1)

    a, b = torch.randn(batch, features), torch.randn(batch, features)
    torch.onnx.export(Siamese().eval(), (a, b), str(path), input_names=["a", "b"], output_names=["similarity"],
                      opset_version=17, dynamo=False)


def main() -> None:
    import warnings

    warnings.filterwarnings("ignore")
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("path")
    parser.add_argument("--kind", choices=["rnn", "siamese"], default="rnn")
    args = parser.parse_args()
    (export_unrolled_rnn if args.kind == "rnn" else export_siamese)(args.path)


if __name__ == "__main__":
    main()
