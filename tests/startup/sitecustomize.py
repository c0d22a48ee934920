"""Started in every Python process the tests start (conftest puts this folder on PYTHONPATH).

The test environment has torch (the model exports use it), and importing TVM imports it too, ~2 s of a
core per process: tvm-ffi's package initialization imports it first thing (to dodge a symbol clash on
Windows) and ``tvm.relax.base_py_module`` for its torch interop, which nothing here uses. Every rank
of each multi-rank test and each CLI run paid that. Here those two modules' own imports of torch find
none; any other import of it (an export, a test) gets torch.
"""

import sys

_IMPORTERS = frozenset({"tvm_ffi", "tvm.relax.base_py_module"})


class _NoTorchForTvm:
    """A meta path finder that refuses torch to :data:`_IMPORTERS` while they are being imported."""

    def find_spec(self, name, path=None, target=None):  # noqa: ANN001, ANN201 - importlib's protocol
        if name != "torch" and not name.startswith("torch."):
            return None
        frame = sys._getframe(1)
        while frame is not None:
            if frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") in _IMPORTERS:
                raise ModuleNotFoundError(f"No module named {name!r} (left out of TVM's import in the tests)",
                                          name=name)
            frame = frame.f_back
        return None


sys.meta_path.insert(0, _NoTorchForTvm())
