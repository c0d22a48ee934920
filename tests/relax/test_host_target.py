"""llvm code is compiled for this machine's CPU: a bare ``llvm`` would mean baseline x86-64 (SSE2)."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from tvm_combiners.relax.runner import compile_module, make_target, run_vm


def _matmul() -> tvm.IRModule:
    bb = relax.BlockBuilder()
    x, w = relax.Var("x", relax.TensorType((4, 8), "float32")), relax.Var("w", relax.TensorType((8, 3), "float32"))
    with bb.function("main", [x, w]):
        bb.emit_func_output(bb.emit(relax.op.matmul(x, w)))
    return bb.get()


def test_llvm_target_names_the_host_cpu():
    target = make_target("llvm")
    assert str(target.attrs["mcpu"]) == tvm.target.codegen.llvm_get_system_cpu()
    assert str(make_target("cuda").host.attrs["mcpu"]) == str(target.attrs["mcpu"])


def test_mcpu_can_be_overridden_for_portable_code(monkeypatch):
    monkeypatch.setenv("TVM_COMBINERS_MCPU", "generic")
    assert str(make_target("llvm").attrs["mcpu"]) == "generic"
    x = np.arange(32, dtype="float32").reshape(4, 8)
    w = np.ones((8, 3), "float32")
    (got,) = run_vm(compile_module(_matmul(), "llvm"), [x, w])
    np.testing.assert_allclose(got, x @ w)
