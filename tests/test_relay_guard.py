"""Where TVM has no Relay, tvm_combiners.relay says which environment to use."""

import importlib

import pytest


def test_relay_import_error_names_the_environment():
    try:
        import tvm.relay  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("this TVM has Relay")
    with pytest.raises(ImportError, match=r"tvm_combiners.relay needs a TVM build with Relay .*\.venv-relay"):
        importlib.import_module("tvm_combiners.relay")
