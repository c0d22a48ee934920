"""What orders units besides the variables they read: in-place writes, opaque calls, symbolic dims.

OrderSendRecv and the combiners move bindings; each case below was moved across something it
depends on without a variable saying so, and computed the wrong result or built an ill-formed
module. One rank (allreduce is the identity, a self pair sends to itself), compared with the
module before the pass.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import tvm_ffi
from tvm import relax, tirx
from tvm.script import tirx as T

import tvm_combiners.collectives.runtime  # noqa: F401 - registers the runtime functions
from tvm_combiners.collectives import relax as CR
from tvm_combiners.collectives.dependences import UnitAccess, unit_dependences
from tvm_combiners.collectives.relax import combiners as CB

_spec = importlib.util.spec_from_file_location("combiners_cases", Path(__file__).parent / "progs" / "combiners_cases.py")
C = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("combiners_cases", C)
_spec.loader.exec_module(C)

SELF = [[0, 0]]
F4 = relax.TensorType((4,), "float32")


@T.prim_func(private=True, s_tir=True)
def add_ten(a: T.Buffer((4,), "float32")):
    with T.sblock("root"):
        for i in range(4):
            with T.sblock("b"):
                vi = T.axis.spatial(4, i)
                a[vi] = a[vi] + T.float32(10)


def _fill(out):
    out.copyfrom(np.full(tuple(out.shape), 7.0, "float32"))


tvm_ffi.register_global_func("tvm_combiners.test.fill", _fill, override=True)
tvm_ffi.register_global_func("tvm_combiners.test.fill_tuple", lambda t: _fill(t[0]), override=True)


def _module(body, n_params: int = 1) -> relax.Function:
    xs = [relax.Var(f"x{i}", F4) for i in range(n_params)]
    bb = relax.BlockBuilder()
    gv = bb.add_func(add_ten, "add_ten")
    p = relax.Var("p", F4)
    with bb.function("bump", [p]):  # a function of the module that writes its argument in place
        bb.emit_func_output(bb.emit(relax.call_tir_inplace(gv, [p], [0], F4)))
    with bb.function("main", xs, pure=False):
        bb.emit_func_output(relax.Tuple(body(bb, gv, *xs)))
    return bb.get()


def _in_place(bb, gv, x):
    return bb.emit(relax.call_tir_inplace(gv, [x], [0], F4))


def _through_a_tuple(bb, gv, x):
    field = bb.emit(relax.TupleGetItem(bb.emit(relax.Tuple([x])), 0))
    return bb.emit(relax.call_tir_inplace(gv, [field], [0], F4))


def _in_a_function(bb, _gv, x):
    return bb.emit(relax.Call(bb.get().get_global_var("bump"), [x]))


WRITES = [_in_place, _through_a_tuple, _in_a_function]


def _results(mod, *args) -> list[np.ndarray]:
    return C.compile_and_run(mod, [np.asarray(a, "float32") for a in args])


def _assert_same(before, after, *args) -> None:
    relax.analysis.well_formed(after)
    for a, b in zip(_results(before, *args), _results(after, *args), strict=True):
        np.testing.assert_array_equal(b, a)


def test_core_orders_writes_after_earlier_readers_and_before_later_ones():
    units = [UnitAccess(defines=("x",)),
             UnitAccess(reads=("x",), defines=("a",)),
             UnitAccess(reads=("x",), defines=("y",), writes=("x",), aliases=("x",)),  # y is x, written
             UnitAccess(reads=("y",), defines=("z",)),
             UnitAccess(reads=("x",)),
             UnitAccess(reads=("z",), writes=("y",))]  # writes x through its other name
    assert unit_dependences(units) == [set(), {0}, {0, 1}, {2}, {0, 2}, {1, 2, 3, 4}]


@pytest.mark.parametrize("write", WRITES)
def test_order_send_recv_keeps_a_send_after_the_in_place_kernel_it_sends(write):
    def body(bb, gv, x0):
        r = bb.emit(CR.recv((4,), "float32", SELF, channel_id=0))  # written before its send
        x = bb.emit(relax.op.multiply(x0, relax.const(2.0, "float32")))
        a = bb.emit(relax.op.add(x, relax.const(0.0, "float32")))  # the last read of x before the write
        y = write(bb, gv, x)
        bb.emit(CR.send(y, SELF, channel_id=0))
        return [r, a]

    mod = _module(body)
    r, a = _results(mod, np.arange(4))
    np.testing.assert_array_equal(a, [0, 2, 4, 6])  # read before x was written
    np.testing.assert_array_equal(r, [10, 12, 14, 16])  # what was sent: x after the write


@pytest.mark.parametrize("in_tuple", [False, True])
def test_order_send_recv_keeps_a_send_after_an_opaque_call_that_fills_its_buffer(in_tuple):
    def body(bb, _gv, _x):
        r = bb.emit(CR.recv((4,), "float32", SELF, channel_id=0))
        buf = bb.emit(relax.op.zeros((4,), "float32"))
        arg = bb.emit(relax.Tuple([buf])) if in_tuple else buf
        fill = "tvm_combiners.test.fill_tuple" if in_tuple else "tvm_combiners.test.fill"
        bb.emit(relax.Call(relax.ExternFunc(fill), [arg], ty_args=[relax.ObjectType()]))
        bb.emit(CR.send(buf, SELF, channel_id=0))
        return [r, buf]

    r, buf = _results(_module(body), np.zeros(4))
    np.testing.assert_array_equal(r, [7] * 4)
    np.testing.assert_array_equal(buf, [7] * 4)


@pytest.mark.parametrize("write", WRITES)
def test_a_combined_collective_never_reads_a_tensor_after_its_in_place_write(write):
    def body(bb, gv, x0):
        x = bb.emit(relax.op.multiply(x0, relax.const(1.0, "float32")))
        a = bb.emit(CR.allreduce(x))  # reads x before the write
        y = write(bb, gv, x)
        b = bb.emit(CR.allreduce(bb.emit(relax.op.add(y, relax.const(1.0, "float32")))))
        return [a, b]

    mod = _module(body)
    new = CB.AllReduceCombiner()(mod)
    assert C.count_ops(new, ("collectives.allreduce",)) == 2  # joining them would move the read of x past the write
    _assert_same(mod, new, np.arange(4))
    np.testing.assert_array_equal(_results(new, np.arange(4))[0], np.arange(4))


@pytest.mark.parametrize("pass_factory", [CR.OrderSendRecv, CB.AllReduceCombiner])
def test_a_symbolic_dim_is_read_after_the_match_cast_that_defines_it(pass_factory):
    m = tirx.Var("m", "int64")

    def body(bb, _gv, x):
        c = bb.emit(CR.allreduce(x))
        r = bb.emit(CR.recv((), "float32", SELF, channel_id=0))
        y = bb.match_cast(c, relax.TensorType([m], "float32"))  # defines m
        w = bb.emit(relax.op.zeros(relax.ShapeExpr([m]), "float32"))  # reads m, and no variable of the cast
        s = bb.emit(relax.op.sum(w))
        bb.emit(CR.send(s, SELF, channel_id=0))
        return [c, y, r, bb.emit(CR.allreduce(s))]

    mod = _module(body)
    new = pass_factory()(mod)
    if pass_factory is CR.OrderSendRecv:
        assert not new.same_as(mod)  # the send (and the cast it needs) moved up to its recv
    else:
        assert new.same_as(mod)  # the second allreduce needs m, so the first one's result: no join
    _assert_same(mod, new, np.ones(4))


def test_a_combiner_alone_keeps_a_collective_after_the_recv_it_reads():
    def body(bb, _gv, x):
        a = bb.emit(CR.allreduce(x))
        bb.emit(CR.send(a, SELF, channel_id=0))
        r = bb.emit(CR.recv((4,), "float32", SELF, channel_id=0))  # no token: only the match orders it
        return [a, bb.emit(CR.allreduce(r))]

    mod = _module(body)
    new = CB.AllReduceCombiner()(mod)  # send_recv not enabled: the match still orders the allreduces
    assert C.count_ops(new, ("collectives.allreduce",)) == 2
    _assert_same(mod, new, np.arange(4))


def test_a_send_of_symbolic_shape_is_matched_and_its_neighbours_combine():
    n = tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType([n], "float32"))
    y = relax.Var("y", F4)
    bb = relax.BlockBuilder()
    with bb.function("main", [x, y], pure=False):
        a = bb.emit(CR.allreduce(y))
        t = bb.emit(CR.send(x, SELF, channel_id=0))
        r = bb.emit(CR.recv((4,), "float32", SELF, channel_id=0, token=t))
        bb.emit_func_output(relax.Tuple([a, bb.emit(CR.allreduce(r))]))
    mod = bb.get()
    for pass_factory in (CB.SendRecvCombiner, CB.CombineCollectives):
        new = pass_factory()(mod)  # was: "channel_id 0 in combiner has 0 send(s) and 1 recv(s)"
        assert C.count_ops(new, ("collectives.send",)) == 1
        _assert_same(mod, new, np.arange(4), np.ones(4))
