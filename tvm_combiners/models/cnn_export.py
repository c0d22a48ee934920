"""Export ResNet-50- and GoogLeNet-shaped CNNs to ONNX with ``torch.onnx.export``.

The layer tables are the papers' (He et al., 2015, table 1: ResNet-50's bottleneck stages, the
stride on the 3x3 convolution as torchvision's; Szegedy et al., 2014, table 1: GoogLeNet's
inception blocks 3a..5b, each convolution followed by BatchNorm and ReLU as torchvision's). The
weights are random; the BatchNorm statistics are calibrated on a few random batches in train mode,
so the eval-mode export (where the exporter folds each BatchNorm into its convolution) computes
outputs that vary with the input instead of being constant. Needs torch (a test-only dependency
of the main environment).

    python -m tvm_combiners.models.cnn_export OUT.onnx [--kind resnet50|googlenet|resnet-mini] [--image 224]
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from .inception import BLOCKS as GOOGLENET_BLOCKS  # the paper's table, kept once

#: ResNet-50: bottleneck blocks per stage (widths 64, 128, 256, 512; 4x as many output channels).
RESNET50_STAGES = (3, 4, 6, 3)
KINDS = ("resnet50", "googlenet", "resnet-mini")


def _conv_bn_relu(cin: int, cout: int, kernel: int, stride: int = 1, relu: bool = True) -> Any:
    import torch.nn as nn

    layers = [nn.Conv2d(cin, cout, kernel, stride, kernel // 2, bias=False), nn.BatchNorm2d(cout, momentum=None)]
    return nn.Sequential(*layers, nn.ReLU()) if relu else nn.Sequential(*layers)


def resnet(stages: tuple[int, ...] = RESNET50_STAGES, width: int = 64, classes: int = 1000) -> Any:
    """A ResNet of bottleneck blocks (1x1 -> 3x3 -> 1x1, 4x expansion): ResNet-50 by default."""
    import torch.nn as nn

    class Bottleneck(nn.Module):
        def __init__(self, cin: int, mid: int, stride: int) -> None:
            super().__init__()
            self.body = nn.Sequential(_conv_bn_relu(cin, mid, 1), _conv_bn_relu(mid, mid, 3, stride),
                                      _conv_bn_relu(mid, mid * 4, 1, relu=False))
            self.shortcut = (_conv_bn_relu(cin, mid * 4, 1, stride, relu=False)
                             if stride != 1 or cin != mid * 4 else nn.Identity())
            self.relu = nn.ReLU()

        def forward(self, x):  # noqa: ANN001
            return self.relu(self.body(x) + self.shortcut(x))

    layers: list[nn.Module] = [_conv_bn_relu(3, width, 7, 2), nn.MaxPool2d(3, 2, 1)]
    cin = width
    for stage, blocks in enumerate(stages):
        mid = width * 2 ** stage
        for block in range(blocks):
            layers.append(Bottleneck(cin, mid, 2 if block == 0 and stage > 0 else 1))
            cin = mid * 4
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes))


def googlenet(classes: int = 1000) -> Any:
    """GoogLeNet (without its auxiliary classifiers): the stem, inception 3a..5b, average pool, FC."""
    import torch
    import torch.nn as nn

    class Inception(nn.Module):
        def __init__(self, cin: int, c1: int, r3: int, c3: int, r5: int, c5: int, pp: int) -> None:
            super().__init__()
            self.b1 = _conv_bn_relu(cin, c1, 1)
            self.b2 = nn.Sequential(_conv_bn_relu(cin, r3, 1), _conv_bn_relu(r3, c3, 3))
            self.b3 = nn.Sequential(_conv_bn_relu(cin, r5, 1), _conv_bn_relu(r5, c5, 5))
            self.b4 = nn.Sequential(nn.MaxPool2d(3, 1, 1), _conv_bn_relu(cin, pp, 1))

        def forward(self, x):  # noqa: ANN001
            return torch.cat([self.b1(x), self.b2(x), self.b3(x), self.b4(x)], 1)

    layers: list[nn.Module] = [_conv_bn_relu(3, 64, 7, 2), nn.MaxPool2d(3, 2, 1), _conv_bn_relu(64, 64, 1),
                               _conv_bn_relu(64, 192, 3), nn.MaxPool2d(3, 2, 1)]
    cin = 192
    for name, table in GOOGLENET_BLOCKS:
        if name in ("4a", "5a"):
            layers.append(nn.MaxPool2d(3, 2, 1))
        layers.append(Inception(cin, *table))
        cin = table[0] + table[2] + table[4] + table[5]
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.4), nn.Linear(cin, classes))


def build(kind: str) -> Any:
    """The torch module of ``kind`` (one of :data:`KINDS`), randomly initialised."""
    if kind == "resnet50":
        return resnet()
    if kind == "googlenet":
        return googlenet()
    if kind == "resnet-mini":  # one block a stage, a quarter of the width: for smoke runs
        return resnet((1, 1, 1, 1), 16, 10)
    raise ValueError(f"unknown CNN {kind!r}: one of {', '.join(KINDS)}")


def calibrate(model: Any, image: int, batches: int = 4, batch: int = 2) -> None:
    """Each BatchNorm's running statistics from ``batches`` random batches (a cumulative average:
    the layers have ``momentum=None``), so that eval mode normalises activations as trained."""
    import torch

    model.train()
    with torch.no_grad():
        for _ in range(batches):
            model(torch.randn(batch, 3, image, image))
    model.eval()


def export_cnn(path: str | os.PathLike, kind: str = "resnet50", image: int = 224, seed: int = 0) -> None:
    """``kind`` on a ``[batch, 3, image, image]`` input named ``input`` (dynamic batch), output ``logits``."""
    if image < 32:
        raise ValueError(f"export_cnn: image {image} is below 32 (the stem and pools divide it by 32)")
    import torch

    torch.manual_seed(seed)
    model = build(kind)
    calibrate(model, image)
    x = torch.randn(1, 3, image, image)
    torch.onnx.export(model, (x,), str(path), input_names=["input"], output_names=["logits"], opset_version=17,
                      dynamo=False, dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}})


def main() -> None:
    import warnings

    warnings.filterwarnings("ignore")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path")
    parser.add_argument("--kind", default="resnet50", choices=KINDS)
    parser.add_argument("--image", type=int, default=224, help="input height and width (default 224)")
    args = parser.parse_args()
    if args.image < 32:
        parser.error("--image must be at least 32")
    export_cnn(args.path, args.kind, args.image)


if __name__ == "__main__":
    main()
