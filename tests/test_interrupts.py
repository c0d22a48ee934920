"""Ctrl-C ends a job as "interrupted" (exit 130) in every stage, whatever TVM's FFI made of it."""

from __future__ import annotations

import os
import signal

import pytest
from test_cli_errors import parallel_matmuls

from tvm_combiners.compile.interrupts import keep_interrupts


def _ffi_call() -> None:
    """A Ctrl-C inside a Python callback, come back out of TVM's C++ as its FFI returns it."""
    try:
        os.kill(os.getpid(), signal.SIGINT)
    except KeyboardInterrupt as err:
        raise RuntimeError("KeyboardInterrupt") from err


def test_an_interrupt_inside_tvm_stays_an_interrupt():
    with pytest.raises(KeyboardInterrupt):
        with keep_interrupts():
            _ffi_call()
    with pytest.raises(KeyboardInterrupt):  # caught on the way (a schedule rule declining, a failed build)
        with keep_interrupts():
            try:
                _ffi_call()
            except RuntimeError:
                pass
    with pytest.raises(RuntimeError, match="^other$"):  # any other error as it was
        with keep_interrupts():
            raise RuntimeError("other")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # nohup's ignored SIGINT stays ignored
    try:
        with keep_interrupts():
            os.kill(os.getpid(), signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.mark.parametrize("caught", [False, True], ids=["raised through TVM", "caught by the schedule rule"])
def test_ctrl_c_while_compiling_ends_the_job_interrupted(caught, monkeypatch, tmp_path, capsys):
    """Ctrl-C inside the CPU schedule rule (a Python callback of TVM's pass): it was reported as
    "TVM cannot compile the baseline module" (exit 2), or lost where the rule declined (exit 0)."""
    from tvm_combiners.compile.schedules import CPUMatmul

    def interrupted(self, func, target, fuse_epilogue):
        if caught:
            _ffi_call()  # a RuntimeError: the rule declines the function and the compile goes on
        os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(CPUMatmul, "_schedule", interrupted)
    path = parallel_matmuls(tmp_path / "p.onnx")
    assert main_run(str(path)) == 130
    assert capsys.readouterr().err.splitlines()[-1] == "tvm-combiners: error: interrupted"


def main_run(path: str) -> int:
    from tvm_combiners.app.cli import main

    return main(["run", path, "--ir", "relax", "--batch", "2", "--repeat", "1"])
