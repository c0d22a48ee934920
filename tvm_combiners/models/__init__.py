"""Model loading: the default BERT, ONNX preparation and import into Relax or Relay."""

from .loader import (
    default_model_path,
    example_inputs,
    import_relax,
    import_relay,
    input_specs,
    prepare_onnx,
    run_onnxruntime,
)

__all__ = [
    "default_model_path",
    "example_inputs",
    "import_relax",
    "import_relay",
    "input_specs",
    "prepare_onnx",
    "run_onnxruntime",
]
