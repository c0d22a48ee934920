"""Build and run a fuzzed Relay module on the VM, in this process or, for ``?`` shapes, in a child.

TVM 0.16's VM can abort the whole process (``terminate called after throwing InternalError``,
``unknown type = 0`` in ``RunLoop``) on some modules over ``?`` dims, the unoptimized ones
included: one such module would end a fuzz session without a verdict or the spec that caused it.
A child process turns the abort into an ordinary failure the fuzzer can judge and shrink.

    python vm_run.py MODULE.json INPUTS.npz OUTPUTS.npz   (the child's side)
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from typing import Any

import numpy as np
import tvm
from tvm import relay

from tvm_combiners.compile.relay_runner import make_target

CHILD_TIMEOUT_S = 600


class VMRunError(RuntimeError):
    """The module did not build or run; the message says how (an exception's text, or the signal)."""


def vm_compile(mod: tvm.IRModule) -> Any:
    # x86's AlterOpLayout for dense assumes 2-D data (TVM 0.16): 3-D activations would not build
    with tvm.transform.PassContext(opt_level=3, disabled_pass=["AlterOpLayout"]):
        return relay.vm.compile(mod, target=make_target("llvm"))


def _flat(value: Any) -> list[np.ndarray]:
    if hasattr(value, "numpy"):
        return [value.numpy()]
    return [array for item in value for array in _flat(item)]


def _run_here(mod: tvm.IRModule, inputs: list[np.ndarray]) -> list[np.ndarray]:
    try:
        exe = vm_compile(relay.transform.InferType()(mod))
        vm = tvm.runtime.vm.VirtualMachine(exe, tvm.cpu())
        return _flat(vm.invoke("main", *[tvm.nd.array(a) for a in inputs]))
    except Exception as err:  # noqa: BLE001 - the caller judges any failure against the reference
        last = str(err).strip().splitlines()[-1] if str(err).strip() else ""
        raise VMRunError(last if last.startswith(type(err).__name__) else f"{type(err).__name__}: {last}") from err


def has_any_dim(mod: tvm.IRModule) -> bool:
    return any(isinstance(d, tvm.tir.Any) for p in mod["main"].params for d in p.type_annotation.shape)


def run_main(mod: tvm.IRModule, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """``main``'s outputs, flattened; raises :class:`VMRunError` if the module cannot build or run."""
    if not has_any_dim(mod):
        return _run_here(mod, inputs)
    with tempfile.TemporaryDirectory() as tmp:
        paths = [os.path.join(tmp, name) for name in ("module.json", "inputs.npz", "outputs.npz")]
        with open(paths[0], "w") as f:
            f.write(tvm.ir.save_json(mod))
        np.savez(paths[1], *inputs)
        try:
            child = subprocess.run([sys.executable, __file__, *paths], capture_output=True, text=True,
                                   timeout=CHILD_TIMEOUT_S)
        except subprocess.TimeoutExpired as err:
            raise VMRunError(f"the VM ran past {CHILD_TIMEOUT_S} s") from err
        if child.returncode < 0:
            said = [line for line in child.stderr.splitlines() if "what():" in line] or ["no message"]
            raise VMRunError(f"the VM process died of signal {-child.returncode}: {said[0].strip()}")
        if child.returncode:
            raise VMRunError(child.stderr.strip().splitlines()[-1] if child.stderr.strip() else "no message")
        with np.load(paths[2]) as saved:
            return [saved[f"arr_{i}"] for i in range(len(saved.files))]


def _child(module_path: str, inputs_path: str, outputs_path: str) -> None:
    with open(module_path) as f:
        mod = tvm.ir.load_json(f.read())
    with np.load(inputs_path) as saved:
        inputs = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    try:
        outputs = _run_here(mod, inputs)
    except VMRunError as err:
        sys.exit(str(err))  # one line on stderr, exit status 1
    np.savez(outputs_path, *outputs)


if __name__ == "__main__":
    _child(*sys.argv[1:])
