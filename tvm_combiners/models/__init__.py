"""Model loading: the default BERT, ONNX preparation and import into Relax or Relay."""

from .loader import (
    ModelError,
    ModelNotFoundError,
    default_model_path,
    example_inputs,
    import_relax,
    import_relay,
    input_specs,
    load_onnx,
    position_limit,
    prepare_onnx,
    run_onnxruntime,
    time_onnxruntime,
)

__all__ = [
    "ModelError",
    "ModelNotFoundError",
    "default_model_path",
    "example_inputs",
    "import_relax",
    "import_relay",
    "input_specs",
    "load_onnx",
    "position_limit",
    "prepare_onnx",
    "run_onnxruntime",
    "time_onnxruntime",
]
