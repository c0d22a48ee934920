"""Export ImageNet CNNs (ResNet-50, GoogLeNet, VGG16, Inception-v3, EfficientNet-B0) to ONNX with ``torch.onnx.export``.

The layer tables are the papers' (He et al., 2015, table 1: ResNet-50's bottleneck stages, the
stride on the 3x3 convolution as torchvision's; Szegedy et al., 2014, table 1: GoogLeNet's
inception blocks 3a..5b; Simonyan and Zisserman, 2014, table 1 column D: VGG16; Szegedy et al.,
2015, figures 5-7: Inception-v3's blocks at torchvision's widths, without the auxiliary classifier;
Tan and Le, 2019, table 1: EfficientNet-B0's MBConv stages with squeeze-excite and SiLU). Every
convolution but VGG's is followed by BatchNorm and an activation, as in torchvision.

The weights are random; the BatchNorm statistics are calibrated on a few random batches in train
mode, so the eval-mode export (where the exporter folds each BatchNorm into its convolution)
computes outputs that vary with the input instead of being constant. VGG16 has no BatchNorm: its
layers get He initialisation, which keeps the activations' scale through its 16 layers. Needs
torch (a test-only dependency of the main environment).

    python -m tvm_combiners.models.cnn_export OUT.onnx [--kind resnet50|googlenet|vgg16|...] [--image 224]
"""

from __future__ import annotations

import argparse
import functools
import os
from typing import Any

from .inception import BLOCKS as GOOGLENET_BLOCKS  # the paper's table, kept once

#: ResNet-50: bottleneck blocks per stage (widths 64, 128, 256, 512; 4x as many output channels).
RESNET50_STAGES = (3, 4, 6, 3)

#: VGG16 (configuration D): 3x3 convolutions of these widths, "M" a 2x2 max pool.
VGG16 = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")

# Inception blocks as data: a block is its branches, concatenated on channels; a branch is a chain
# of steps. A step is a convolution ``(out, kh, kw[, stride[, pad]])`` (padding "same" at stride 1,
# none at stride 2, unless given), a pool named in :func:`_pool`, or a list of convolutions on one input
# whose outputs concatenate (Inception-v3's 1x3 / 3x1 forks).


def _v3_a(pool: int) -> tuple:
    return (((64, 1, 1),), ((48, 1, 1), (64, 5, 5)), ((64, 1, 1), (96, 3, 3), (96, 3, 3)), ("avg", (pool, 1, 1)))


def _v3_c(c7: int) -> tuple:
    return (((192, 1, 1),), ((c7, 1, 1), (c7, 1, 7), (192, 7, 1)),
            ((c7, 1, 1), (c7, 7, 1), (c7, 1, 7), (c7, 7, 1), (192, 1, 7)), ("avg", (192, 1, 1)))


_V3_B = (((384, 3, 3, 2),), ((64, 1, 1), (96, 3, 3), (96, 3, 3, 2)), ("max",))
_V3_D = (((192, 1, 1), (320, 3, 3, 2)), ((192, 1, 1), (192, 1, 7), (192, 7, 1), (192, 3, 3, 2)), ("max",))
_V3_E = (((320, 1, 1),), ((384, 1, 1), [(384, 1, 3), (384, 3, 1)]),
         ((448, 1, 1), (384, 3, 3), [(384, 1, 3), (384, 3, 1)]), ("avg", (192, 1, 1)))
#: Inception-v3's stem on a 299x299 image (to 35x35x192), then Mixed_5b..7c (to 8x8x2048).
INCEPTION_V3_STEM = ((32, 3, 3, 2), (32, 3, 3, 1, 0), (64, 3, 3), "max", (80, 1, 1), (192, 3, 3, 1, 0), "max")
INCEPTION_V3_BLOCKS = (_v3_a(32), _v3_a(64), _v3_a(64), _V3_B, _v3_c(128), _v3_c(160), _v3_c(160), _v3_c(192),
                       _V3_D, _V3_E, _V3_E)

#: EfficientNet-B0's MBConv stages: expansion, kernel, stride of the first layer, output channels, layers.
EFFICIENTNET_B0 = ((1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3), (6, 5, 1, 112, 3),
                   (6, 5, 2, 192, 4), (6, 3, 1, 320, 1))

#: The smallest image each kind takes (Inception-v3's valid convolutions and pools need 75).
MIN_IMAGE = {"inception-v3": 75}
KINDS = ("resnet50", "googlenet", "vgg16", "inception-v3", "efficientnet-b0", "resnet-mini", "vgg-mini")


def _conv_bn(cin: int, cout: int, kernel: int | tuple[int, int], stride: int = 1, act: str | None = "relu",
             pad: int | tuple[int, int] | None = None, groups: int = 1, eps: float = 1e-5) -> Any:
    """Convolution (no bias), BatchNorm and ``act`` (relu, silu or None); ``pad`` None: half the kernel."""
    import torch.nn as nn

    kh, kw = (kernel, kernel) if isinstance(kernel, int) else kernel
    pad = (kh // 2, kw // 2) if pad is None else pad
    layers = [nn.Conv2d(cin, cout, (kh, kw), stride, pad, groups=groups, bias=False),
              nn.BatchNorm2d(cout, eps=eps, momentum=None)]
    if act is not None:
        layers.append({"relu": nn.ReLU, "silu": nn.SiLU}[act]())
    return nn.Sequential(*layers)


def resnet(stages: tuple[int, ...] = RESNET50_STAGES, width: int = 64, classes: int = 1000) -> Any:
    """A ResNet of bottleneck blocks (1x1 -> 3x3 -> 1x1, 4x expansion): ResNet-50 by default."""
    import torch.nn as nn

    class Bottleneck(nn.Module):
        def __init__(self, cin: int, mid: int, stride: int) -> None:
            super().__init__()
            self.body = nn.Sequential(_conv_bn(cin, mid, 1), _conv_bn(mid, mid, 3, stride),
                                      _conv_bn(mid, mid * 4, 1, act=None))
            self.shortcut = (_conv_bn(cin, mid * 4, 1, stride, act=None)
                             if stride != 1 or cin != mid * 4 else nn.Identity())
            self.relu = nn.ReLU()

        def forward(self, x):  # noqa: ANN001
            return self.relu(self.body(x) + self.shortcut(x))

    layers: list[nn.Module] = [_conv_bn(3, width, 7, 2), nn.MaxPool2d(3, 2, 1)]
    cin = width
    for stage, blocks in enumerate(stages):
        mid = width * 2 ** stage
        for block in range(blocks):
            layers.append(Bottleneck(cin, mid, 2 if block == 0 and stage > 0 else 1))
            cin = mid * 4
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes))


def _pool(name: str) -> Any:
    import torch.nn as nn

    # "max": Inception-v3's reduction (3x3, stride 2, no padding); the others keep the size
    return {"max": lambda: nn.MaxPool2d(3, 2), "max-same": lambda: nn.MaxPool2d(3, 1, 1),
            "avg": lambda: nn.AvgPool2d(3, 1, 1)}[name]()


def _chain(cin: int, steps: Any, eps: float) -> tuple[Any, int]:
    """A branch (see the block tables above) as a module, and its output channels."""
    import torch.nn as nn

    layers = []
    for step in steps:
        if isinstance(step, str):
            layers.append(_pool(step))
        elif isinstance(step, list):  # a fork: each convolution on the same input, concatenated
            fork = [_chain(cin, [conv], eps) for conv in step]
            layers.append(_concat([m for m, _ in fork]))
            cin = sum(c for _, c in fork)
        else:
            out, kh, kw, *rest = step
            stride = rest[0] if rest else 1
            pad = rest[1] if len(rest) > 1 else ((kh // 2, kw // 2) if stride == 1 else 0)
            layers.append(_conv_bn(cin, out, (kh, kw), stride, pad=pad, eps=eps))
            cin = out
    return (layers[0] if len(layers) == 1 else nn.Sequential(*layers)), cin


def _block(cin: int, branches: Any, eps: float) -> tuple[Any, int]:
    """An inception block: its branches on one input, concatenated; and its output channels."""
    chains = [_chain(cin, branch, eps) for branch in branches]
    return _concat([m for m, _ in chains]), sum(c for _, c in chains)


@functools.cache
def _concat_class() -> Any:
    import torch
    import torch.nn as nn

    class Concat(nn.Module):
        """Parallel modules on one input, their outputs concatenated on channels."""

        def __init__(self, branches: list) -> None:
            super().__init__()
            self.branches = nn.ModuleList(branches)

        def forward(self, x):  # noqa: ANN001
            return torch.cat([b(x) for b in self.branches], 1)

    return Concat


def _concat(branches: list) -> Any:
    return _concat_class()(branches)


def googlenet(classes: int = 1000) -> Any:
    """GoogLeNet (without its auxiliary classifiers): the stem, inception 3a..5b, average pool, FC."""
    import torch.nn as nn

    layers: list[nn.Module] = [_conv_bn(3, 64, 7, 2), nn.MaxPool2d(3, 2, 1), _conv_bn(64, 64, 1),
                               _conv_bn(64, 192, 3), nn.MaxPool2d(3, 2, 1)]
    cin = 192
    for name, (c1, r3, c3, r5, c5, pp) in GOOGLENET_BLOCKS:
        if name in ("4a", "5a"):
            layers.append(nn.MaxPool2d(3, 2, 1))
        block, cin = _block(cin, (((c1, 1, 1),), ((r3, 1, 1), (c3, 3, 3)), ((r5, 1, 1), (c5, 5, 5)),
                                  ("max-same", (pp, 1, 1))), 1e-5)
        layers.append(block)
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.4), nn.Linear(cin, classes))


def inception_v3(classes: int = 1000) -> Any:
    """Inception-v3 without its auxiliary classifier (BatchNorm eps 1e-3, as torchvision's)."""
    import torch.nn as nn

    stem, cin = _chain(3, INCEPTION_V3_STEM, 1e-3)
    layers = [stem]
    for branches in INCEPTION_V3_BLOCKS:
        block, cin = _block(cin, branches, 1e-3)
        layers.append(block)
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.5), nn.Linear(cin, classes))


def vgg(config: tuple = VGG16, image: int = 224, hidden: int = 4096, classes: int = 1000) -> Any:
    """VGG: 3x3 convolutions with ReLU and max pools, then three fully connected layers on the
    ``image / 32`` square feature map (7x7 at 224, where torchvision's adaptive pool is the identity)."""
    import torch.nn as nn

    layers: list[nn.Module] = []
    cin = 3
    for width in config:
        if width == "M":
            layers.append(nn.MaxPool2d(2, 2))
        else:
            layers += [nn.Conv2d(cin, width, 3, padding=1), nn.ReLU()]
            cin = width
    side = image // 2 ** config.count("M")
    model = nn.Sequential(*layers, nn.Flatten(), nn.Linear(cin * side * side, hidden), nn.ReLU(), nn.Dropout(),
                          nn.Linear(hidden, hidden), nn.ReLU(), nn.Dropout(), nn.Linear(hidden, classes))
    for layer in model:  # He initialisation: no BatchNorm rescales VGG's activations
        if isinstance(layer, (nn.Conv2d, nn.Linear)):
            nn.init.kaiming_normal_(layer.weight, nonlinearity="relu")
            nn.init.zeros_(layer.bias)
    return model


def efficientnet(stages: tuple = EFFICIENTNET_B0, classes: int = 1000) -> Any:
    """EfficientNet of MBConv blocks (1x1 expansion, depthwise convolution, squeeze-excite to a quarter
    of the block's input channels, 1x1 projection, residual where the shape allows): B0 by default."""
    import torch.nn as nn

    class MBConv(nn.Module):
        def __init__(self, cin: int, expand: int, kernel: int, stride: int, cout: int) -> None:
            super().__init__()
            mid, squeeze = cin * expand, max(1, cin // 4)
            self.expand = _conv_bn(cin, mid, 1, act="silu", eps=1e-3) if expand != 1 else nn.Identity()
            self.depthwise = _conv_bn(mid, mid, kernel, stride, act="silu", groups=mid, eps=1e-3)
            self.excite = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(mid, squeeze, 1), nn.SiLU(),
                                        nn.Conv2d(squeeze, mid, 1), nn.Sigmoid())
            self.project = _conv_bn(mid, cout, 1, act=None, eps=1e-3)
            self.residual = stride == 1 and cin == cout

        def forward(self, x):  # noqa: ANN001
            y = self.depthwise(self.expand(x))
            y = self.project(y * self.excite(y))
            return x + y if self.residual else y

    layers: list[nn.Module] = [_conv_bn(3, 32, 3, 2, act="silu", eps=1e-3)]
    cin = 32
    for expand, kernel, stride, cout, count in stages:
        for i in range(count):
            layers.append(MBConv(cin, expand, kernel, stride if i == 0 else 1, cout))
            cin = cout
    return nn.Sequential(*layers, _conv_bn(cin, 1280, 1, act="silu", eps=1e-3), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Dropout(0.2), nn.Linear(1280, classes))


def build(kind: str, image: int = 224) -> Any:
    """The torch module of ``kind`` (one of :data:`KINDS`), randomly initialised; VGG's classifier
    is sized for ``image``."""
    if kind == "resnet50":
        return resnet()
    if kind == "googlenet":
        return googlenet()
    if kind == "vgg16":
        return vgg(image=image)
    if kind == "inception-v3":
        return inception_v3()
    if kind == "efficientnet-b0":
        return efficientnet()
    if kind == "resnet-mini":  # one block a stage, a quarter of the width: for smoke runs
        return resnet((1, 1, 1, 1), 16, 10)
    if kind == "vgg-mini":  # VGG16's layers at an eighth of the width: for smoke runs
        return vgg(tuple(w if w == "M" else w // 8 for w in VGG16), image, 256, 10)
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
    least = MIN_IMAGE.get(kind, 32)
    if image < least:
        raise ValueError(f"export_cnn: image {image} is below {least}, the smallest {kind} takes")
    import torch

    torch.manual_seed(seed)
    model = build(kind, image)
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
    least = MIN_IMAGE.get(args.kind, 32)
    if args.image < least:
        parser.error(f"--image must be at least {least} for {args.kind}")
    export_cnn(args.path, args.kind, args.image)


if __name__ == "__main__":
    main()
