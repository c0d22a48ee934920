"""Process start-up: TVM's import without torch.

Importing TVM 0.27 imports torch where it is installed: tvm-ffi's package initialization does (to
dodge a symbol clash on Windows), and so does ``tvm.relax.base_py_module`` (for its torch interop).
That is ~3 s of a core per process (more than TVM's own import), paid by every CLI run and every
rank that imports TVM, for nothing this package uses. :func:`keep_torch_out_of_tvm_import` makes
those two modules' own imports of torch find none; any other import of torch (a user's, an export's)
gets torch as usual, but TVM's torch interop stays off in that process (tvm-ffi's fast DLPack exchange
with torch tensors, its CUDA-stream patch, ``BasePyModule``'s conversions): the CLI and the examples
hand TVM no torch tensors. A user's program under ``launch`` is not affected. Nothing here imports TVM.
"""

from __future__ import annotations

import sys
from typing import Any

#: The modules whose import-time imports of torch are left out.
IMPORTERS = frozenset({"tvm_ffi", "tvm.relax.base_py_module"})


class _TorchOutOfTvmImport:
    """A meta path finder that refuses torch to :data:`IMPORTERS` while their module code runs."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name != "torch" and not name.startswith("torch."):
            return None
        frame = sys._getframe(1)
        while frame is not None:
            if frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") in IMPORTERS:
                raise ModuleNotFoundError(f"No module named {name!r} (left out of TVM's import by tvm_combiners)",
                                          name=name)
            frame = frame.f_back
        return None


def keep_torch_out_of_tvm_import() -> None:
    """Install the finder (once) before TVM is imported; a no-op where TVM was imported already."""
    if "tvm_ffi" in sys.modules or any(isinstance(f, _TorchOutOfTvmImport) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _TorchOutOfTvmImport())
