"""The fuzzer's VM runner: ``?`` modules run in a child, and every way a run can fail is one error."""

from __future__ import annotations

import os
import stat

import numpy as np
import pytest
import tvm
import vm_run
from tvm import relay


def _module(rows: object, body: str = "add") -> tvm.IRModule:
    x, y = relay.var("x", shape=(rows, 6)), relay.var("y", shape=(rows, 6))
    out = relay.Tuple([relay.add(x, y), relay.Tuple([relay.nn.relu(x)])]) if body == "add" else relay.nn.relu(x)
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x, y], out)))


def test_any_dim_module_runs_in_a_child_and_returns_every_output() -> None:
    x, y = np.arange(18, dtype="float32").reshape(3, 6) - 9, np.ones((3, 6), "float32")
    mod = _module(relay.Any())
    assert vm_run.has_any_dim(mod) and not vm_run.has_any_dim(_module(3))
    for m in (mod, _module(3)):  # the child's answer and this process's are the same arrays
        add, relu = vm_run.run_main(m, [x, y])
        np.testing.assert_array_equal(add, x + y)
        np.testing.assert_array_equal(relu, np.maximum(x, 0))


def test_a_failing_run_in_the_child_is_one_line_naming_the_check() -> None:
    with pytest.raises(vm_run.VMRunError, match=r"^TVMError: Assert fail: .*Incompatible broadcast type shape_p0\[0\] and shape_p1\[0\]$"):
        vm_run.run_main(_module(relay.Any()), [np.ones((3, 6), "float32"), np.ones((2, 6), "float32")])


def test_a_child_killed_by_a_signal_is_an_error_with_its_message(tmp_path, monkeypatch) -> None:
    aborting = tmp_path / "aborting_python"
    aborting.write_text("#!/bin/sh\necho \"terminate called\" >&2\necho \"  what():  unknown type = 0\" >&2\n"
                        "kill -ABRT $$\n")
    aborting.chmod(aborting.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(vm_run.sys, "executable", os.fspath(aborting))
    with pytest.raises(vm_run.VMRunError, match=r"^the VM process died of signal 6: what\(\):  unknown type = 0$"):
        vm_run.run_main(_module(relay.Any()), [np.ones((3, 6), "float32")] * 2)


def test_tvm_016_matmul_shape_function_ignores_transpose_a_over_any_rows() -> None:
    """Why the fuzzer builds no ``nn.matmul(transpose_a=True)`` over ``?`` rows (build_relay.py).

    If TVM fixes it, this fails: the generator can then emit the form again.
    """
    x = relay.var("x", shape=(relay.Any(), 6))
    y = relay.nn.relu(relay.nn.matmul(relay.transpose(x), relay.const(np.ones((6, 2), "float32")), transpose_a=True))
    mod = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], y)))
    (out,) = vm_run.run_main(mod, [np.ones((3, 6), "float32")])
    assert out.shape == (2, 2)  # the right answer has shape (3, 2)
