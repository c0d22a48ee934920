"""Float32 weights to float16 and back: the default model (67 MB) fits a 64 MiB carry as 34.6 MB.

The graph stays the same; the weights come back rounded, which changes no latency and no check
(every output is compared with onnxruntime running the same rounded model).
"""

import sys

import numpy as np
import onnx
from onnx import numpy_helper


def convert(direction: str, src: str, dst: str) -> None:
    frm, to, dtype = ((onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, np.float16) if direction == "f16"
                      else (onnx.TensorProto.FLOAT16, onnx.TensorProto.FLOAT, np.float32))
    model = onnx.load(src)
    if direction == "f16" and any(t.data_type == to for t in model.graph.initializer):
        raise SystemExit(f"{src} already holds float16 weights: they would come back as float32")
    for t in model.graph.initializer:
        if t.data_type == frm and (direction == "f32" or np.prod(t.dims) > 64):
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(dtype), t.name))
    onnx.save(model, dst)


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] not in ("f16", "f32"):
        raise SystemExit("usage: model_weights.py f16|f32 SRC.onnx DST.onnx")
    convert(*sys.argv[1:])
