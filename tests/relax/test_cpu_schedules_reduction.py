"""Default CPU schedules of row reductions (softmax, layer norm, sum/mean/max over the last axis):
they compute what numpy and TVM's naive loops do, are scheduled one row at a time with vectors
along the row, and reductions over other axes keep their loops."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from cpu_matrix import cpus, runnable_cpus
from helpers import check_scheduled, make_module
from tvm import relax

from tvm_combiners.compile.host import cpu_features
from tvm_combiners.compile.pipelines import fusion_passes
from tvm_combiners.compile.relax_runner import compile_module, make_target, run_vm
from tvm_combiners.compile.schedules import CPUReduction, default_schedules

R = relax.op
F32 = "float32"
VECTORIZED, PARALLEL = tvm.tirx.ForKind.VECTORIZED, tvm.tirx.ForKind.PARALLEL


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _layer_norm(x: np.ndarray, g: np.ndarray, b: np.ndarray) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-5) * g + b


# name -> (params, relax body, numpy of float64 inputs, the width of its row, whether it runs in parallel)
FORMS = {
    "softmax": ({"x": ((2, 4, 16, 64), F32)}, lambda bb, x: bb.emit(R.nn.softmax(x, axis=-1)), _softmax, 64, False),
    "softmax, large": ({"x": ((16, 64, 128), F32)}, lambda bb, x: bb.emit(R.nn.softmax(x, axis=-1)), _softmax, 128,
                       True),
    "softmax then scale": ({"x": ((4, 32, 48), F32)},
                           lambda bb, x: bb.emit(R.multiply(bb.emit(R.nn.softmax(x, axis=-1)), relax.const(3.0))),
                           lambda x: 3 * _softmax(x), 48, False),
    "layer norm": ({"x": ((2, 16, 96), F32), "g": ((96,), F32), "b": ((96,), F32)},
                   lambda bb, x, g, b: bb.emit(R.nn.layer_norm(x, g, b, axes=[-1])), _layer_norm, 96, False),
    "product, then sum (a fused prologue)": ({"x": ((1, 32, 64), F32), "y": ((1, 32, 1), F32)},
                                              lambda bb, x, y: bb.emit(R.sum(bb.emit(R.multiply(x, y)), axis=-1)),
                                              lambda x, y: (x * y).sum(-1), 64, False),
    "exp, then sum (a prologue of libm calls)": ({"x": ((4, 64), F32)},
                                                  lambda bb, x: bb.emit(R.sum(bb.emit(R.exp(x)), axis=-1)),
                                                  lambda x: np.exp(x).sum(-1), 64, False),
    "x - mean (keepdims, broadcast back)": ({"x": ((8, 64), F32)},
                                             lambda bb, x: bb.emit(R.subtract(x, bb.emit(R.mean(x, axis=-1,
                                                                                                 keepdims=True)))),
                                             lambda x: x - x.mean(-1, keepdims=True), 64, False),
    "rms norm": ({"x": ((4, 80), F32), "g": ((80,), F32)}, lambda bb, x, g: bb.emit(R.nn.rms_norm(x, g, axes=[-1])),
                 lambda x, g: x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5) * g, 80, False),
    "mean, keepdims": ({"x": ((6, 80), F32)}, lambda bb, x: bb.emit(R.mean(x, axis=-1, keepdims=True)),
                       lambda x: x.mean(-1, keepdims=True), 80, False),
    "sum": ({"x": ((3, 5, 32), F32)}, lambda bb, x: bb.emit(R.sum(x, axis=-1)), lambda x: x.sum(-1), 32, False),
    "max": ({"x": ((4, 64), F32)}, lambda bb, x: bb.emit(R.max(x, axis=-1)), lambda x: x.max(-1), 64, False),
    "sum of 30 (no vector divides)": ({"x": ((8, 30), F32)}, lambda bb, x: bb.emit(R.sum(x, axis=-1)),
                                      lambda x: x.sum(-1), 30, False),
}

# name -> (params, relax body, numpy, sizes of symbolic dimensions): the rule declines these
DECLINED = {
    "sum over a middle axis": ({"x": ((2, 16, 8), F32)}, lambda bb, x: bb.emit(R.sum(x, axis=1)),
                               lambda x: x.sum(1), {}),
    "mean over the last two axes": ({"x": ((3, 8, 16), F32)}, lambda bb, x: bb.emit(R.mean(x, axis=[-2, -1])),
                                    lambda x: x.mean((-2, -1)), {}),
    "softmax over a symbolic row count": ({"x": ((tvm.tirx.Var("n", "int64"), 32), F32)},
                                          lambda bb, x: bb.emit(R.nn.softmax(x, axis=-1)), _softmax, {"n": 5}),
}


def _fused(mod: tvm.IRModule, *then: tvm.transform.Pass, cpu: str | None = None) -> tvm.IRModule:
    target = make_target("llvm", cpu)
    with target:
        return tvm.transform.Sequential([*fusion_passes(target), *then])(mod)


def _functions(mod: tvm.IRModule, *then: tvm.transform.Pass, cpu: str | None = None) -> list[tvm.tirx.PrimFunc]:
    return [f for f in _fused(mod, *then, cpu=cpu).functions.values() if isinstance(f, tvm.tirx.PrimFunc)]


def _reduction(mod: tvm.IRModule, cpu: str | None = None) -> tvm.tirx.PrimFunc:
    """The one fused (unscheduled) function of ``mod`` with a reduction."""
    (func,) = [f for f in _functions(mod, cpu=cpu) if "T.init()" in f.script()]
    return func


def _inputs(mod: tvm.IRModule, sizes: dict[str, int] | None = None) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    shapes = [[int(d) if isinstance(d, tvm.tirx.IntImm) else sizes[str(d)] for d in p.ty.shape.values]
              for p in mod["main"].params]
    return [(3 * rng.standard_normal(shape)).astype(F32) for shape in shapes]


def _check(mod: tvm.IRModule, reference: object, inputs: list[np.ndarray], cpu: str | None = None) -> None:
    """Scheduled and naive builds equal numpy (relative to the largest output) and each other."""
    want = reference(*[a.astype(np.float64) for a in inputs])
    check_scheduled(mod, want, inputs, cpu)


def _lanes(cpu: str | None, width: int) -> int | None:
    """float32 lanes of the CPU's widest vector that divides ``width`` (LLVM's features of it)."""
    features = cpu_features(cpu) if cpu else cpu_features(str(make_target("llvm").attrs["mcpu"]))
    widest = 16 if "avx512f" in features else 8 if "avx" in features else 4
    return next((lanes for lanes in (widest, widest // 2, widest // 4) if lanes >= 4 and width % lanes == 0), None)


def _loops(sch: tvm.s_tir.Schedule) -> dict[str, list]:
    """Each block's loops, by the block's name."""
    blocks, todo = {}, list(sch.get_child_blocks(sch.get_sblock("root")))
    while todo:
        block = todo.pop()
        blocks[sch.get(block).name_hint] = [sch.get(loop) for loop in sch.get_loops(block)]
    return blocks


def _assert_row_schedule(name: str, cpu: str | None = None) -> None:
    """One row loop over every stage (in parallel where the form is large), each reduction a vector
    of partial results along the row where a vector of the CPU divides it; scalar where none does."""
    params, body, _, width, parallel = FORMS[name]
    sch = CPUReduction().apply(_reduction(make_module(params, body), cpu), make_target("llvm", cpu), False)
    assert sch is not None, name
    loops = _loops(sch)
    outer = {loops_[0].loop_var.name for loops_ in loops.values()}
    assert len(outer) == 1, name  # every stage computed at the same row loop
    assert any(ls[0].kind == PARALLEL for ls in loops.values()) is parallel, name
    lanes = _lanes(cpu, width)
    partial = [ls for block, ls in loops.items() if block.endswith("_rf_update")]
    if lanes is None or lanes == width:
        assert not partial, name
        return
    assert partial and all(ls[-1].kind == VECTORIZED and int(ls[-1].extent) == lanes for ls in partial), name
    assert all(ls[-2].kind == tvm.tirx.ForKind.SERIAL for ls in partial), name  # the row, in steps of a vector


@pytest.mark.parametrize("name", FORMS)
def test_each_form_computes_what_numpy_and_the_naive_loops_do(name):
    params, body, reference, _, _ = FORMS[name]
    mod = make_module(params, body)
    _check(mod, reference, _inputs(mod))
    assert [bool(f.attrs.get("tirx.is_scheduled", False)) for f in _functions(mod, default_schedules())
            if "T.init()" in f.script() or "_rf" in f.script()] == [True]
    _assert_row_schedule(name)


def test_elementwise_stages_along_the_row_are_vectorized_and_the_epilogue_folded_in():
    """The divide (with the scale folded in) in vectors, and the exp too: on llvm softmax legalizes to
    fast_exp, vector arithmetic (libm's expf would stay scalar: LLVM splits a vector of them into one
    call a lane)."""
    params, body, *_ = FORMS["softmax then scale"]
    sch = CPUReduction().apply(_reduction(make_module(params, body)), make_target("llvm"), False)
    loops = _loops(sch)
    assert loops["T_divide"][-1].kind == VECTORIZED
    assert loops["T_where"][-1].kind == VECTORIZED and "T.exp(" not in sch.mod.script()
    assert "T_multiply" not in loops and "* T.float32(3.0)" in sch.mod.script()
    assert "T.parallel(" not in sch.mod.script()  # 128 rows of 48: one thread


def test_a_fused_prologue_is_computed_in_the_reduction_that_reads_it():
    params, body, *_ = FORMS["product, then sum (a fused prologue)"]
    func = _reduction(make_module(params, body))
    sch = CPUReduction().apply(func, make_target("llvm"), False)
    loops = _loops(sch)
    assert "T_multiply" not in loops  # read by the sum alone: computed in it, as it reads each element
    (update,) = [ls for block, ls in loops.items() if block.endswith("_rf_update")]
    assert update[-1].kind == VECTORIZED and " * " in sch.mod.script()


@pytest.mark.parametrize("cpu", cpus())
def test_every_form_is_scheduled_for_every_cpu_with_its_vectors(cpu):
    for name in FORMS:
        _assert_row_schedule(name, cpu)
    for name, (params, body, _, _) in DECLINED.items():
        assert CPUReduction().apply(_reduction(make_module(params, body), cpu), make_target("llvm", cpu),
                                    False) is None, name


@pytest.mark.parametrize("name", DECLINED)
def test_declined_reductions_keep_their_loops_and_compute_right(name):
    params, body, reference, sizes = DECLINED[name]
    mod = make_module(params, body)
    assert CPUReduction().apply(_reduction(mod), make_target("llvm"), False) is None
    inputs = _inputs(mod, sizes)
    got = run_vm(compile_module(mod, "llvm"), inputs)[0]
    np.testing.assert_allclose(got.astype(np.float64), reference(*[a.astype(np.float64) for a in inputs]),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cpu", runnable_cpus())
def test_an_attention_block_computes_what_numpy_does_on_every_cpu_this_host_runs(cpu):
    """Layer norm, then a softmax of its scores, then a mean of each row, built for each CPU."""
    params = {"x": ((1, 16, 32), F32), "g": ((32,), F32), "b": ((32,), F32)}

    def body(bb, x, g, b):  # noqa: ANN001, ANN202
        y = bb.emit(R.nn.layer_norm(x, g, b, axes=[-1]))
        scores = bb.emit(R.matmul(y, bb.emit(R.permute_dims(y, [0, 2, 1]))))
        return bb.emit(R.mean(bb.emit(R.nn.softmax(scores, axis=-1)), axis=-1))

    def reference(x, g, b):  # noqa: ANN001, ANN202
        y = _layer_norm(x, g, b)
        return _softmax(y @ y.transpose(0, 2, 1)).mean(-1)

    mod = make_module(params, body)
    _check(mod, reference, _inputs(mod), cpu=cpu)


def test_a_softmax_its_epilogue_reads_twice_is_scheduled_and_computes_right():
    """torch's exported attention: where(isnan(softmax), 0, softmax). The isnan stays a stage of the
    row (inlined into the softmax's last stage, the where would read a buffer nothing writes)."""
    mod = make_module({"x": ((1, 4, 16, 32), F32)},
                      lambda bb, x: bb.emit(R.where(bb.emit(R.isnan(s := bb.emit(R.nn.softmax(x, axis=-1)))),
                                                    relax.const(0.0, F32), s)))
    assert CPUReduction().apply(_reduction(mod), make_target("llvm"), False) is not None
    x = _inputs(mod)[0]
    x[0, 0, 0, :3] = np.nan  # a row of NaNs stays NaN-free: every NaN becomes 0
    got = run_vm(compile_module(mod, "llvm"), [x])[0]
    want = _softmax(x.astype(np.float64))
    np.testing.assert_allclose(got, np.where(np.isnan(want), 0, want), rtol=1e-5, atol=1e-7)
