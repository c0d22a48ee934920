"""llvm code is compiled for this machine's CPU: a bare ``llvm`` would mean baseline x86-64 (SSE2)."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_combiners.compile.relax_runner import compile_module, make_target, run_vm


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


def test_an_unknown_mcpu_is_one_clear_error(monkeypatch):
    from tvm_combiners.compile.host import HostTargetError

    monkeypatch.setenv("TVM_COMBINERS_MCPU", "skylake-avx513")
    with pytest.raises(HostTargetError, match=r"^TVM_COMBINERS_MCPU='skylake-avx513' is not a CPU this TVM's LLVM "
                                              r"knows \(for example generic, haswell, znver3, skylake-avx512, "):
        make_target("llvm")


def test_a_cpu_with_extensions_this_machine_lacks_is_refused(monkeypatch):
    from tvm_combiners.compile.host import HostTargetError, missing_on_host

    other = next((cpu for cpu in ("znver3", "sapphirerapids") if missing_on_host(cpu)), None)
    if other is None:
        pytest.skip("this machine runs the code of both znver3 and sapphirerapids")
    monkeypatch.setenv("TVM_COMBINERS_MCPU", other)
    with pytest.raises(HostTargetError, match=f"^TVM_COMBINERS_MCPU='{other}': this machine's CPU lacks "
                                              f"{', '.join(missing_on_host(other))}, so code compiled for it would "
                                              "stop with an illegal instruction here$"):
        make_target("llvm")
    assert str(make_target("llvm", other).attrs["mcpu"]) == other  # compiling for it, not running here, is fine


def test_the_cli_says_it_in_one_line(monkeypatch, capsys):
    from tvm_combiners.app.cli import main

    monkeypatch.setenv("TVM_COMBINERS_MCPU", "bogus")
    assert main(["run", "--ir", "relax"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tvm-combiners: error: TVM_COMBINERS_MCPU='bogus' is not a CPU") and err.count("\n") == 1


def test_extensions_this_machine_does_not_report_are_turned_off():
    """LLVM names the CPU model; a hypervisor may hide some of its extensions: those are left out."""
    from tvm_combiners.compile.host import host_flags, missing_on_host

    if host_flags() is None:
        pytest.skip("no /proc/cpuinfo")
    hidden = [f"-{f}" for f in missing_on_host(tvm.target.codegen.llvm_get_system_cpu())]
    assert [str(a) for a in make_target("llvm").attrs.get("mattr", [])] == hidden
