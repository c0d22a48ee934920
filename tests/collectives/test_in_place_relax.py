"""Kernels reading and writing combined buffers in place (``compile.in_place``), one rank: results
against the uncombined program, and what is left of packing and views in the lowered module."""

from __future__ import annotations

import numpy as np
import tvm
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tvm import relax
from tvm.script import tirx as T

import tvm_combiners.collectives.runtime  # noqa: F401 - registers the runtime functions
from tvm_combiners.collectives import relax as CR
from tvm_combiners.collectives.relax import combiners as CB
from tvm_combiners.compile.in_place import InPlaceCombinedBuffers, at_offsets

TWO, ONE = relax.const(2.0, "float32"), relax.const(1.0, "float32")


def _program(shapes, body, dataflow: bool = False) -> tvm.IRModule:
    """``main(x0, ...)``: each ``x_i`` through a kernel (``2 * x_i``) unless ``body`` says otherwise."""
    xs = [relax.Var(f"x{i}", relax.TensorType(s, "float32")) for i, s in enumerate(shapes)]
    bb = relax.BlockBuilder()
    with bb.function("main", xs, pure=False):
        if dataflow:
            with bb.dataflow():
                made = [bb.emit_output(relax.op.multiply(relax.op.add(x, ONE), TWO)) for x in xs]
        else:
            made = [bb.emit(relax.op.multiply(x, TWO)) for x in xs]
        bb.emit_func_output(relax.Tuple(body(bb, xs, made)))
    return bb.get()


def _inputs(shapes, salt: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(salt)
    return [rng.integers(-4, 5, size=s).astype("float32") for s in shapes]


def _run(mod: tvm.IRModule, inputs) -> list[np.ndarray]:
    ex = tvm.compile(mod, target="llvm", relax_pipeline=CR.pipeline("llvm"))
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](*[tvm.runtime.tensor(a) for a in inputs])
    return [t.numpy() for t in out]


def _lowered(mod: tvm.IRModule) -> tuple[list[str], str]:
    """The kernels ``main`` calls once lowered, by name, and its text."""
    low = CR.pipeline("llvm")(mod)
    called: list[str] = []

    def visit(e):
        if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.GlobalVar):
            called.append(e.op.name_hint)

    relax.analysis.post_order_visit(low["main"].body, visit)
    return called, low["main"].script()


def _views(text: str) -> int:
    """Views made in lowered ``main`` (``R.memory.view`` becomes this runtime call)."""
    return text.count("runtime.TVMTensorCreateView")


def _check(mod, shapes, salt=0) -> tuple[list[str], str]:
    """Combined and compiled, ``mod`` gives the uncombined program's results; returns :func:`_lowered`."""
    new = CB.CombineCollectives()(mod)
    inputs = _inputs(shapes, salt)
    for got, want in zip(_run(new, inputs), _run(mod, inputs), strict=True):
        np.testing.assert_array_equal(got, want)
    return _lowered(new)


SHAPES = [(16,), (4, 16), (32,), (2, 8)]  # byte offsets 0, 64, 320, 448: all aligned


def test_producers_and_consumers_use_the_buffer_itself():
    """Every operand made by a kernel, every result read by a kernel: no pack kernel, no view, no
    unpack; the producers write into the buffer, the consumers read it."""
    called, text = _check(_program(SHAPES, lambda bb, xs, made: [bb.emit(relax.op.add(bb.emit(CR.allreduce(m)), ONE))
                                                                  for m in made]), SHAPES)
    assert not [c for c in called if c.startswith(("pack", "unpack"))]
    assert _views(text) == 0 and "ensure_zero_offset" not in text
    assert sum(c.endswith("_in_place") for c in called) == 2 * len(SHAPES)


def test_producers_fused_in_a_dataflow_block():
    called, _ = _check(_program(SHAPES, lambda bb, xs, made: [bb.emit(relax.op.subtract(bb.emit(CR.allreduce(m)), ONE))
                                                               for m in made], dataflow=True), SHAPES, salt=1)
    assert not [c for c in called if c.startswith(("pack", "unpack"))]


def test_an_operand_no_kernel_makes_keeps_the_pack():
    """A parameter among the operands: the pack kernel copies them all (producers are chained into
    the buffer only when every operand is made by one); results are still read in place."""
    def body(bb, xs, made):
        return [bb.emit(relax.op.add(bb.emit(CR.allreduce(v)), ONE)) for v in [xs[0], *made[1:]]]

    called, text = _check(_program(SHAPES, body), SHAPES, salt=2)
    assert called.count("pack_allreduce") == 1
    assert _views(text) == 0


def test_results_read_elsewhere_keep_their_views():
    """A result also returned from the function stays a view for that use; its kernel reads the
    buffer. An operand read by another kernel too is packed."""
    def body(bb, xs, made):
        rs = [bb.emit(CR.allreduce(m)) for m in made]
        return [rs[0], *[bb.emit(relax.op.add(r, ONE)) for r in rs], bb.emit(relax.op.add(made[2], ONE))]

    called, text = _check(_program(SHAPES, body), SHAPES, salt=3)
    assert called.count("pack_allreduce") == 1
    assert _views(text) == 1


def test_unaligned_runs_are_packed_and_copied():
    """Runs off a 64-byte boundary (offsets 0, 64, 76, 140): the pack kernel and the unpack kernel
    copy them; the aligned results are still read in place."""
    shapes = [(16,), (3,), (16,), (13,)]
    called, text = _check(_program(shapes, lambda bb, xs, made: [bb.emit(relax.op.add(bb.emit(CR.allreduce(m)), ONE))
                                                                  for m in made]), shapes, salt=4)
    assert called.count("pack_allreduce") == 1 and called.count("unpack_allreduce") == 1
    assert _views(text) == 0


def test_chained_combined_ops():
    """The kernels between two combined allreduces read the first buffer and write the second."""
    def body(bb, xs, made):
        first = [bb.emit(CR.allreduce(m)) for m in made]
        second = [bb.emit(CR.allreduce(bb.emit(relax.op.multiply(r, TWO)))) for r in first]
        return [bb.emit(relax.op.add(r, ONE)) for r in second]

    called, text = _check(_program(SHAPES, body), SHAPES, salt=5)
    assert not [c for c in called if c.startswith(("pack", "unpack"))]
    assert _views(text) == 0


def test_other_collectives():
    """An allgather over one rank (its results are runs of the buffer) between kernels."""
    def body(bb, xs, made):
        got = [bb.emit(CR.allgather(m, group=[[0]])) for m in made]
        return [bb.emit(relax.op.add(g, ONE)) for g in got]

    called, _ = _check(_program(SHAPES, body), SHAPES, salt=6)
    assert not [c for c in called if c.startswith(("pack", "unpack"))]


def test_a_consumer_of_two_outputs():
    """``split`` of a combined result: a kernel of two outputs reads the buffer in place."""
    def body(bb, xs, made):
        rs = [bb.emit(CR.allreduce(m)) for m in made]
        parts = bb.emit(relax.op.split(rs[2], 2))
        return [bb.emit(relax.TupleGetItem(parts, 0)), bb.emit(relax.TupleGetItem(parts, 1)), *rs[:2], rs[3]]

    called, _ = _check(_program(SHAPES, body), SHAPES, salt=8)
    assert "split_in_place" in called


def test_a_kernel_output_read_through_a_view_and_combined():
    """``y`` is read through a view of it by one kernel and allreduced: once that kernel reads ``y``
    itself, ``y`` is still read twice, so its producer keeps its own output (and the pack stays)."""
    shapes = [(32,), (16,)]

    def body(bb, xs, made):
        at = relax.prim_value(tvm.tirx.IntImm("int64", 64))
        seen = bb.emit(relax.op.memory.ensure_zero_offset(bb.emit(relax.op.memory.view(made[0], relax.ShapeExpr([16]), "float32", at))))
        return [bb.emit(relax.op.add(seen, ONE)), *[bb.emit(relax.op.add(bb.emit(CR.allreduce(m)), ONE)) for m in made]]

    called, _ = _check(_program(shapes, body), shapes, salt=9)
    assert called.count("pack_allreduce") == 1 and "add_in_place" in called


def test_a_view_of_a_parameter_is_left_alone():
    """A parameter may be a view with an offset of its own, which a kernel's parameter refuses:
    only buffers the function allocates are read in place."""
    buf = relax.Var("buf", relax.TensorType((64,), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [buf], pure=False):
        at = relax.prim_value(tvm.tirx.IntImm("int64", 64))
        seen = bb.emit(relax.op.memory.ensure_zero_offset(bb.emit(relax.op.memory.view(buf, relax.ShapeExpr([16]), "float32", at))))
        bb.emit_func_output(relax.Tuple([bb.emit(relax.op.add(seen, ONE))]))
    called, _ = _lowered(bb.get())
    assert called == ["add"]
    ex = tvm.compile(bb.get(), target="llvm", relax_pipeline=CR.pipeline("llvm"))
    whole = tvm.runtime.tensor(np.arange(128, dtype="float32"))
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](whole._create_view((64,), "float32", 256))[0].numpy()
    np.testing.assert_array_equal(got, np.arange(80, 96, dtype="float32") + 1)


def test_kernels_no_call_is_left_to_are_dropped():
    mod = CB.CombineCollectives()(_program(SHAPES, lambda bb, xs, made: [bb.emit(relax.op.add(bb.emit(CR.allreduce(m)), ONE))
                                                                          for m in made]))
    names = {gv.name_hint for gv in CR.pipeline("llvm")(mod).get_global_vars()}
    assert "pack_allreduce" not in names and "add" not in names and {"add_in_place", "multiply_in_place"} <= names


@T.prim_func(private=True, s_tir=True)
def _triple_matched(a: T.Buffer((16,), "float32"), b: T.Buffer((16,), "float32")):
    with T.sblock("root"):
        whole = T.match_buffer(a[0:16], (16,))
        for i in range(16):
            with T.sblock("c"):
                vi = T.axis.remap("S", [i])
                b[vi] = whole[vi] * T.float32(3)


def test_a_kernel_matching_buffers_in_its_root_block_keeps_its_parameters():
    """A root block that matches buffers could name a replaced parameter before its declaration:
    that kernel keeps its own output (so the pack stays) and its own input (so the view stays), and
    no variant made for the chain it ended is left behind."""
    xs = [relax.Var(f"x{i}", relax.TensorType((16,), "float32")) for i in range(2)]
    ty = relax.TensorType((16,), "float32")
    bb = relax.BlockBuilder()
    matched = bb.add_func(_triple_matched, "triple_matched")
    with bb.function("main", xs, pure=False):
        made = [bb.emit(relax.call_tir(matched, [xs[0]], ty)), bb.emit(relax.op.multiply(xs[1], TWO))]
        rs = [bb.emit(CR.allreduce(m)) for m in made]
        bb.emit_func_output(relax.Tuple([bb.emit(relax.call_tir(matched, [rs[0]], ty)), bb.emit(relax.op.add(rs[1], ONE))]))
    called, _ = _check(bb.get(), [(16,), (16,)], salt=10)
    assert called.count("triple_matched") == 2 and "pack_allreduce" in called
    names = {gv.name_hint for gv in CR.pipeline("llvm")(CB.CombineCollectives()(bb.get())).get_global_vars()}
    assert not {n for n in names if n.endswith("_in_place")} - set(called)


def test_nothing_to_do_leaves_the_module():
    mod = _program(SHAPES, lambda bb, xs, made: made)
    with tvm.target.Target("llvm"):
        lowered = tvm.transform.Sequential([relax.transform.LegalizeOps(), relax.transform.ToNonDataflow()])(mod)
    assert InPlaceCombinedBuffers()(lowered).same_as(lowered)


def test_a_kernel_at_an_offset_of_a_flat_buffer():
    """``at_offsets`` on a scheduled, vectorized kernel: it reads its input and writes its output at
    element offsets of two flat buffers."""
    @T.prim_func(private=True, s_tir=True)
    def add_one(a: T.Buffer((4, 16), "float32"), b: T.Buffer((4, 16), "float32")):
        for i, j in T.grid(4, 16):
            with T.sblock("c"):
                vi, vj = T.axis.remap("SS", [i, j])
                b[vi, vj] = a[vi, vj] + T.float32(1)

    sch = tvm.s_tir.Schedule(add_one)
    sch.vectorize(sch.get_loops(sch.get_sblock("c"))[1])
    func = at_offsets(sch.mod["main"].with_attr("layout_free_buffers", [0, 1]), [0, 1], [(256, "float32"), (128, "float32")], 1)
    assert [p.name for p in func.params] == ["a_flat", "a_at", "b_at", "b_flat"]
    assert list(func.attrs["layout_free_buffers"]) == []  # the replaced parameters are flat buffers now
    ex = tvm.compile(tvm.IRModule({"f": func.with_attr("global_symbol", "f")}), target="llvm")
    src, dst = np.arange(256, dtype="float32"), np.zeros(128, "float32")
    out = tvm.runtime.tensor(dst)
    ex["f"](tvm.runtime.tensor(src), 48, 32, out)
    want = dst.copy()
    want[32:96] = src[48:112] + 1
    np.testing.assert_array_equal(out.numpy(), want)


def test_many_small_members():
    """The case the pass exists for: 64 small allreduces between kernels, each result correct."""
    shapes = [(16,)] * 64
    called, _ = _check(_program(shapes, lambda bb, xs, made: [bb.emit(relax.op.add(bb.emit(CR.allreduce(m)), ONE))
                                                               for m in made]), shapes, salt=7)
    assert not [c for c in called if c.startswith(("pack", "unpack"))]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from([(16,), (2, 16), (32,), (4, 8), (5,)]), st.integers(0, 2), st.integers(0, 3)),
                min_size=2, max_size=8), st.booleans())
def test_generated_members(members, twice):
    """Random members: each operand made by a kernel, a parameter, or a kernel's output read
    elsewhere too; each result read by a kernel, returned, both, or by two kernels; ``twice``:
    the kernels' outputs allreduced again. Results equal the uncombined program's."""
    shapes = [shape for shape, _, _ in members]

    def body(bb, xs, made):
        outs, operands = [], []
        for (_, source, _), x, m in zip(members, xs, made):
            operands.append(x if source == 1 else m)
            if source == 2:
                outs.append(bb.emit(relax.op.subtract(m, ONE)))
        for rnd in range(2 if twice else 1):
            results = [bb.emit(CR.allreduce(v)) for v in operands]
            operands = []
            for (_, _, use), r in zip(members, results):
                made_here = bb.emit(relax.op.add(r, ONE if rnd else TWO))
                operands.append(made_here)
                if use in (1, 2):
                    outs.append(r)
                if use == 3:
                    outs.append(bb.emit(relax.op.multiply(r, r)))
        return outs + operands

    _check(_program(shapes, body), shapes, salt=len(members))
