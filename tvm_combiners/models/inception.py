"""GoogLeNet's inception blocks 3a..5b as an ONNX model with random weights.

The channel table is the one in the GoogLeNet paper (Szegedy et al., 2014, table 1). Each block
has four branches reading one input: a 1x1 convolution, 1x1 -> 3x3, 1x1 -> 5x5, and 3x3 max pool
-> 1x1; the three leading 1x1 convolutions are what parallel-op combiners merge (54 convolutions
become 36). Built with onnx.helper so both TVM frontends import the same model.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

#: name, (1x1, 3x3 reduce, 3x3, 5x5 reduce, 5x5, pool projection); a max pool precedes 4a and 5a.
BLOCKS = [
    ("3a", (64, 96, 128, 16, 32, 32)),
    ("3b", (128, 128, 192, 32, 96, 64)),
    ("4a", (192, 96, 208, 16, 48, 64)),
    ("4b", (160, 112, 224, 24, 64, 64)),
    ("4c", (128, 128, 256, 24, 64, 64)),
    ("4d", (112, 144, 288, 32, 64, 64)),
    ("4e", (256, 160, 320, 32, 128, 128)),
    ("5a", (256, 160, 320, 32, 128, 128)),
    ("5b", (384, 192, 384, 48, 128, 128)),
]


def inception_model(size: int = 28, seed: int = 0) -> onnx.ModelProto:
    """Inception 3a..5b on a ``[1, 192, size, size]`` input (``size`` 28 as in the paper)."""
    rng = np.random.default_rng(seed)
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []

    def conv(x: str, cin: int, cout: int, k: int, name: str) -> str:
        w = (rng.standard_normal((cout, cin, k, k)) * np.sqrt(2.0 / (cin * k * k))).astype(np.float32)
        b = (rng.standard_normal(cout) * 0.1).astype(np.float32)
        inits.extend([numpy_helper.from_array(w, f"{name}_w"), numpy_helper.from_array(b, f"{name}_b")])
        nodes.append(helper.make_node("Conv", [x, f"{name}_w", f"{name}_b"], [f"{name}_conv"],
                                      kernel_shape=[k, k], pads=[k // 2] * 4))
        nodes.append(helper.make_node("Relu", [f"{name}_conv"], [name]))
        return name

    def max_pool(x: str, stride: int, name: str) -> str:
        nodes.append(helper.make_node("MaxPool", [x], [name], kernel_shape=[3, 3], strides=[stride] * 2, pads=[1] * 4))
        return name

    x, channels = "input", 192
    for name, (c1, r3, c3, r5, c5, pp) in BLOCKS:
        if name in ("4a", "5a"):
            x = max_pool(x, 2, f"pool_{name}")
        b1 = conv(x, channels, c1, 1, f"{name}_1x1")
        b2 = conv(conv(x, channels, r3, 1, f"{name}_3x3r"), r3, c3, 3, f"{name}_3x3")
        b3 = conv(conv(x, channels, r5, 1, f"{name}_5x5r"), r5, c5, 5, f"{name}_5x5")
        b4 = conv(max_pool(x, 1, f"{name}_pool"), channels, pp, 1, f"{name}_proj")
        nodes.append(helper.make_node("Concat", [b1, b2, b3, b4], [f"{name}_out"], axis=1))
        x, channels = f"{name}_out", c1 + c3 + c5 + pp
    final = math.ceil(math.ceil(size / 2) / 2)  # two 3x3 stride-2 pools with padding 1
    graph = helper.make_graph(
        nodes, "inception_3a_5b",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 192, size, size])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, channels, final, final])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def main() -> None:
    import sys

    onnx.save(inception_model(), sys.argv[1])


if __name__ == "__main__":
    main()
