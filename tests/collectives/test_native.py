"""The native lowering (relax/ops.py, runtime/native.py) without ranks: which runtime function each
collective compiles to, when a send and its recv stay generic, and how a recv waits."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_combiners.collectives import relax as C
from tvm_combiners.collectives.runtime import functions, native

pytestmark = pytest.mark.skipif(not native.prepare(), reason=f"no native kernels here: {native._unavailable}")

SWAP = [[0, 1], [1, 0]]


def _bytecode(mod: tvm.IRModule) -> str:
    return tvm.compile(mod, target="llvm", relax_pipeline=C.pipeline("llvm")).as_text()


def _calls(bytecode: str, function: str = "main") -> list[tuple[str, list[str]]]:
    """(name, arguments) of each call in one function's VM bytecode, in order."""
    body = bytecode.split(f"@{function}:", 1)[1].split("\n\n", 1)[0]
    return [(m.group(1), m.group(2).split(", ")) for m in re.finditer(r"call\s+(\S+) in: ([^\n]*?) dst:", body)]


def _names(bytecode: str, function: str = "main") -> list[str]:
    return [name for name, _ in _calls(bytecode, function) if name.startswith("tvm_combiners.")]


def _module(build, shape=(4, 6), dtype="float32") -> tvm.IRModule:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, dtype))
    with bb.function("main", [x], pure=False):
        bb.emit_func_output(build(bb, x))
    return bb.get()


@pytest.mark.parametrize("build,dtype,want", [
    (lambda bb, x: bb.emit(C.allreduce(x, "sum")), "float32", ["native.allreduce"]),
    (lambda bb, x: bb.emit(C.allreduce(x, "avg", group=[[1, 0]])), "float64", ["native.allreduce_group"]),
    (lambda bb, x: bb.emit(C.allreduce(x, "max")), "int8", ["native.allreduce"]),
    (lambda bb, x: bb.emit(C.allgather(x, 0, world_size=2)), "float16", ["native.allgather"]),
    (lambda bb, x: bb.emit(C.reduce_scatter(x, "prod", 0, group=[[1, 0]])), "uint32", ["native.reduce_scatter"]),
    # what MPI does not compute as the generic path does stays generic
    (lambda bb, x: bb.emit(C.allreduce(x, "sum")), "float16", ["allreduce"]),
    (lambda bb, x: bb.emit(C.allreduce(x, "max")), "float32", ["allreduce"]),
    (lambda bb, x: bb.emit(C.reduce_scatter(x, "min", 0, world_size=2)), "float64", ["reduce_scatter"]),
])
def test_each_collective_compiles_to_its_kernel_or_stays_generic(build, dtype: str, want: list[str]) -> None:
    assert _names(_bytecode(_module(build, dtype=dtype))) == [f"tvm_combiners.{w}" for w in want]


def test_a_gathered_or_scattered_axis_after_others_is_moved_by_one_kernel() -> None:
    """Each rank's block is contiguous only along the leading axis: otherwise the allgather lands in a
    (group, ...) buffer and one generated kernel moves the blocks, and a reduce_scatter's chunks are
    first made contiguous. Axis 1 of a (1, 6) is contiguous already."""
    for build in (lambda bb, x: bb.emit(C.allgather(x, 1, world_size=2)),
                  lambda bb, x: bb.emit(C.reduce_scatter(x, "sum", 1, world_size=2))):
        calls = [name for name, _ in _calls(_bytecode(_module(build)))]
        assert len([c for c in calls if c.startswith("tvm_combiners.native.")]) == 1
        assert any(c.endswith("_blocks") for c in calls), calls
        calls = [name for name, _ in _calls(_bytecode(_module(build, shape=(1, 6))))]
        assert not any(c.endswith("_blocks") for c in calls), calls


def _swap(bb, x, channel=1, between=None):
    token = bb.emit(C.send(x, SWAP, channel_id=channel))
    if between is not None:
        between(bb, x)
    return bb.emit(C.recv(tuple(int(d) for d in x.ty.shape.values), str(x.ty.dtype), SWAP, channel_id=channel,
                          token=token))


def test_a_native_recv_holds_its_sends_payload_and_request() -> None:
    """The send hands MPI the payload itself and returns its request; the matched recv takes both,
    so the payload stays allocated (and its last use) until the send completed. No token is made."""
    every = _calls(_bytecode(_module(_swap)))
    calls = [(n, a) for n, a in every if n.startswith("tvm_combiners.")]
    assert [n for n, _ in calls] == ["tvm_combiners.native.send", "tvm_combiners.native.recv"]
    (_, send_args), (_, recv_args) = calls
    assert recv_args[0] == send_args[0] == "%0"  # x, the function's parameter
    assert [n for n, _ in every].count("vm.builtin.alloc_storage") == 1  # the recv's result alone


def test_a_payload_that_may_be_written_before_its_recv_stays_generic() -> None:
    """MPI reads a native send's payload until the recv completes it: a call that may write it in
    place in between (an opaque packed function given it) leaves that channel to the generic send,
    which copies. A mere reader does not."""
    def writes(bb, x):
        bb.emit(relax.Call(relax.ExternFunc("user.scale_in_place"), [x], ty_args=[relax.ObjectType()]))

    def reads(bb, x):
        bb.emit(relax.op.add(x, x))

    assert _names(_bytecode(_module(lambda bb, x: _swap(bb, x, between=writes)))) == [
        "tvm_combiners.send", "tvm_combiners.recv"]
    assert _names(_bytecode(_module(lambda bb, x: _swap(bb, x, between=reads)))) == [
        "tvm_combiners.native.send", "tvm_combiners.native.recv"]


def test_a_channel_two_functions_use_stays_generic_in_both() -> None:
    """A function's recv completes its own send only, while MPI pairs a channel's messages across
    functions: such channels keep the generic send, which never waits. Other channels go native."""
    bb = relax.BlockBuilder()
    for name, channel in (("f", 3), ("g", 3), ("h", 4)):
        x = relax.Var("x", relax.TensorType((4,), "float32"))
        with bb.function(name, [x], pure=False):
            bb.emit_func_output(_swap(bb, x, channel))
    text = _bytecode(bb.get())
    assert _names(text, "f") == _names(text, "g") == ["tvm_combiners.send", "tvm_combiners.recv"]
    assert _names(text, "h") == ["tvm_combiners.native.send", "tvm_combiners.native.recv"]


def test_native_off_keeps_every_op_generic(monkeypatch: pytest.MonkeyPatch) -> None:
    """TVM_COMBINERS_NATIVE=0 (and check mode, which sets the same flag) compiles the generic calls."""
    monkeypatch.setattr(native, "ENABLED", False)

    def every(bb, x):
        bb.emit(C.allreduce(x, "sum", group=[[1, 0]]))
        bb.emit(C.allgather(x, 0, world_size=2))
        return _swap(bb, x)

    assert _names(_bytecode(_module(every))) == ["tvm_combiners.allreduce", "tvm_combiners.allgather",
                                                 "tvm_combiners.send", "tvm_combiners.recv"]


def test_group_keys_and_texts() -> None:
    keys = {native.group_key(g) for g in ("0,1", "1,0", "0;1", "0,2;1,3")}
    assert len(keys) == 4 and all(0 < k < 1 << 63 for k in keys)
    assert native.group_key("") == 0 and native.group_key("1,0") == native.group_key("1,0")
    assert bytes(native.text_bytes("0,1")) == b"0,1\0"
    assert native.codes("max", "float32") is None and native.codes("sum", "float16") is None
    assert native.codes("avg", "int32") is None and native.codes("prod", "uint64") == (1, 7)


def test_a_recv_yields_the_core_while_it_polls_then_sleeps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ranks may share cores: a recv that spun without yielding kept the core its peer needed for a
    whole time slice. It now yields between polls for the first part of a wait, then sleeps."""
    clock = [0.0]
    events: list[str] = []
    monkeypatch.setattr(functions.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(functions.os, "sched_yield", lambda: (events.append("yield"), clock.__setitem__(0, clock[0] + 0.01)))
    monkeypatch.setattr(functions.time, "sleep", lambda s: (events.append("sleep"), clock.__setitem__(0, clock[0] + s)))
    monkeypatch.setattr(functions, "_recv_timeout", [300.0])
    polls = iter(range(10))
    functions._wait(lambda: next(polls) == 8, lambda: True, TimeoutError)
    spun = int(functions._SPIN_S / 0.01)
    assert events[:spun] == ["yield"] * spun and set(events[spun + 1:]) == {"sleep"}, events


def test_the_kernels_serve_a_module_compiled_without_them() -> None:
    """Every kernel name has a generic implementation of the same arguments for a process where the
    kernels are not built (a module compiled elsewhere)."""
    assert sorted(native._GENERIC) == sorted(native.NAMES)
    x = tvm.runtime.tensor(np.arange(3, dtype="float32"))
    out = tvm.runtime.tensor(np.zeros(3, "float32"))
    native._GENERIC["allreduce_group"](x, out, 3, 8, 0, native.group_key("0"), tvm.runtime.tensor(native.text_bytes("0")))
    np.testing.assert_array_equal(out.numpy(), [0, 1, 2])  # a world of one rank here
