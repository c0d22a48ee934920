"""Default CPU schedules: every form they schedule computes what numpy does, others keep their loops."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tvm
from cpu_matrix import cpus
from helpers import check_scheduled, make_module
from tvm import relax
from tvm.script import tirx as T

from tvm_combiners.compile.host import cpu_features
from tvm_combiners.compile.pipelines import cpu_pipeline, fusion_passes
from tvm_combiners.compile.relax_runner import compile_module, make_target, run_vm
from tvm_combiners.compile.schedules import CPUGemv, CPUMatmul, default_schedules

R = relax.op
F32 = "float32"


def _gelu(x: np.ndarray) -> np.ndarray:
    from math import erf

    return 0.5 * x * (1.0 + np.vectorize(erf)(x / np.sqrt(2.0)))


# name -> (params, relax body, numpy of the same inputs, sizes of symbolic dims)
FORMS = {
    "matmul bias gelu": (
        {"x": ((1, 20, 64), F32), "w": ((64, 48), F32), "b": ((48,), F32)},
        lambda bb, x, w, b: bb.emit(R.nn.gelu(bb.emit(R.add(bb.emit(R.matmul(x, w)), b)))),
        lambda x, w, b: _gelu(x @ w + b), {},
    ),
    "deep k, relu": (  # K in blocks of 256, C's column block waiting in a local buffer
        {"x": ((1, 12, 512), F32), "w": ((512, 32), F32), "b": ((32,), F32)},
        lambda bb, x, w, b: bb.emit(R.nn.relu(bb.emit(R.add(bb.emit(R.matmul(x, w)), b)))),
        lambda x, w, b: np.maximum(x @ w + b, 0), {},
    ),
    "batched": (
        {"a": ((2, 3, 12, 8), F32), "b": ((2, 3, 8, 32), F32)},
        lambda bb, a, b: bb.emit(R.matmul(a, b)),
        lambda a, b: a @ b, {},
    ),
    "symbolic rows": (
        {"x": (("n", 24), F32), "w": ((24, 16), F32)},
        lambda bb, x, w: bb.emit(R.multiply(bb.emit(R.matmul(x, w)), relax.const(0.5, F32))),
        lambda x, w: (x @ w) * 0.5, {"n": 7},
    ),
    "odd rows": (
        {"x": ((5, 3, 16), F32), "w": ((16, 8), F32)},
        lambda bb, x, w: bb.emit(R.matmul(x, w)),
        lambda x, w: x @ w, {},
    ),
    "one row, bias (a classifier)": (  # CPUGemv's: CPUMatmul has no rows to tile
        {"x": ((1, 64), F32), "w": ((64, 48), F32), "b": ((48,), F32)},
        lambda bb, x, w, b: bb.emit(R.add(bb.emit(R.matmul(x, w)), b)),
        lambda x, w, b: x @ w + b, {},
    ),
    "width no vector divides": (  # 7: no vector of 4, 8 or 16 lanes divides it
        {"x": ((8, 16), F32), "w": ((16, 7), F32)},
        lambda bb, x, w: bb.emit(R.matmul(x, w)),
        lambda x, w: x @ w, {},
    ),
}
SCHEDULED = {"matmul bias gelu": True, "deep k, relu": True, "batched": True, "symbolic rows": True, "odd rows": True,
             "one row, bias (a classifier)": True, "width no vector divides": False}


def _module(name: str) -> tvm.IRModule:
    params, body, _, _ = FORMS[name]
    return make_module({k: (tuple(tvm.tirx.Var(d, "int64") if isinstance(d, str) else d for d in shape), dtype)
                        for k, (shape, dtype) in params.items()}, body)


def _inputs(name: str) -> list[np.ndarray]:
    params, _, _, sizes = FORMS[name]
    rng = np.random.default_rng(0)
    return [rng.standard_normal([sizes.get(d, d) for d in shape]).astype(dtype) for shape, dtype in params.values()]


def _float_lanes(cpu: str) -> int:
    """float32 lanes of the CPU's widest vector registers, from LLVM's features of it."""
    features = cpu_features(cpu)
    return 16 if "avx512f" in features else 8 if "avx" in features else 4


def _fused(mod: tvm.IRModule, *then: tvm.transform.Pass, cpu: str | None = None) -> tvm.IRModule:
    """``mod`` fused as the llvm pipeline fuses it (for ``cpu``, this machine's by default), then ``then``."""
    target = make_target("llvm", cpu)
    with target:
        return tvm.transform.Sequential([*fusion_passes(target), *then])(mod)


def _gemm_function(mod: tvm.IRModule) -> tvm.tirx.PrimFunc:
    (func,) = [f for gv, f in _fused(mod).functions_items() if "matmul" in gv.name_hint]
    return func


def _scheduled(mod: tvm.IRModule, cpu: str | None = None) -> dict[str, bool]:
    """Each fused function that reads a matmul: did the default schedules schedule it?"""
    return {gv.name_hint: bool(f.attrs.get("tirx.is_scheduled", False))
            for gv, f in _fused(mod, default_schedules(), cpu=cpu).functions_items()
            if isinstance(f, tvm.tirx.PrimFunc) and "matmul" in gv.name_hint}


@pytest.mark.parametrize("name", FORMS)
def test_each_form_computes_what_numpy_and_the_naive_loops_do(name):
    mod, inputs = _module(name), _inputs(name)
    scheduled = run_vm(compile_module(mod, "llvm"), inputs)[0]
    naive = run_vm(compile_module(mod, "llvm", cpu_pipeline(make_target("llvm"), schedules=False)), inputs)[0]
    want = FORMS[name][2](*inputs)
    np.testing.assert_allclose(scheduled, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(scheduled, naive, rtol=1e-5, atol=1e-6)
    assert list(_scheduled(mod).values()) == [SCHEDULED[name]]


def test_the_epilogue_is_computed_per_tile_in_parallel_and_vectorized():
    sch = CPUMatmul().apply(_gemm_function(_module("matmul bias gelu")), make_target("llvm"), False)
    assert sch is not None
    text = sch.mod.script()
    assert text.count("T.parallel(") == 1 and "T.vectorized(" in text and 'scope="local"' in text
    tile = [sch.get(loop) for loop in sch.get_loops(sch.get_sblock("matmul_update"))[:2]]  # batch x columns, rows
    assert tile[0].kind == tvm.tirx.ForKind.PARALLEL
    # bias and GELU's stages inlined into its last step, computed on each tile
    assert [n for n in re.findall(r'T\.sblock\("(\w+)"\)', text) if not n.startswith(("root", "matmul"))] == [
        "T_multiply_2"]
    loops = [sch.get(loop) for loop in sch.get_loops(sch.get_sblock("T_multiply_2"))[:2]]
    assert all(a.same_as(b) for a, b in zip(loops, tile))


@pytest.mark.parametrize("cpu", cpus())
def test_every_form_is_scheduled_for_every_cpu(cpu):
    """4-, 8- and 16-wide float vectors: a width the widest vector does not divide takes a narrower one."""
    assert {name: list(_scheduled(_module(name), cpu).values()) for name in FORMS} == \
        {name: [scheduled] for name, scheduled in SCHEDULED.items()}


@pytest.mark.parametrize("cpu", cpus())
@pytest.mark.parametrize("depth, k_block", [(64, None), (256, None), (512, 256), (384, 192), (320, None)],
                         ids=["shallow", "256", "blocks of 256", "blocks of 192", "no block divides"])
def test_k_is_blocked_where_a_block_divides_it(depth, k_block, cpu):
    """A (16, depth) x (depth, 32) GEMM: tiles of 4 rows by two of the CPU's vectors where two divide
    the 32 columns (one where only one does); K in blocks of 256 or 192 where one divides K and it
    exceeds 256 (a 256-deep column block of B fits L1 whole)."""
    mod = make_module({"x": ((16, depth), F32), "w": ((depth, 32), F32)},
                      lambda bb, x, w: bb.emit(R.add(bb.emit(R.matmul(x, w)), relax.const(1.0, F32))))
    target = make_target("llvm", cpu)
    sch = CPUMatmul().apply(_gemm_function(mod), target, False)
    lanes = _float_lanes(cpu)
    tile = 2 * lanes if 32 % (2 * lanes) == 0 else lanes
    # column blocks (parallel), [K blocks], row tiles, K (in a block), tile rows, tile columns
    extents = [32 // tile, 4, depth, 4, tile] if k_block is None else [32 // tile, depth // k_block, 4, k_block, 4, tile]
    loops = [sch.get(loop) for loop in sch.get_loops(sch.get_sblock("matmul_update"))]
    assert [int(loop.extent) for loop in loops] == extents and loops[0].kind == tvm.tirx.ForKind.PARALLEL
    assert loops[-1].kind == tvm.tirx.ForKind.VECTORIZED
    epilogue = [sch.get(loop) for loop in sch.get_loops(sch.get_sblock("T_add"))]
    shared = 1 if k_block else 2  # on the column block, or on each tile
    assert all(a.same_as(b) for a, b in zip(epilogue[:shared], loops)) and not epilogue[shared].same_as(loops[shared])


@pytest.mark.parametrize("cpu", cpus())
def test_a_width_only_a_narrower_vector_divides_takes_it(cpu):
    """8 columns: two SSE vectors a tile, one AVX2 vector, or half an AVX-512 one (instead of no schedule)."""
    sch = CPUMatmul().apply(_gemm_function(_module("odd rows")), make_target("llvm", cpu), False)
    inner = sch.get(sch.get_loops(sch.get_sblock("matmul_update"))[-1])
    assert inner.kind == tvm.tirx.ForKind.VECTORIZED and int(inner.extent) == 8


@pytest.mark.parametrize("cpu", cpus())
def test_a_one_row_gemm_is_column_blocks_of_vectors_in_parallel(cpu):
    func = _gemm_function(_module("one row, bias (a classifier)"))
    assert CPUMatmul().apply(func, make_target("llvm", cpu), False) is None  # no row loop to tile
    sch = CPUGemv().apply(func, make_target("llvm", cpu), False)
    lanes = _float_lanes(cpu)
    lanes = lanes if 48 % lanes == 0 else lanes // 2
    tile = lanes * next(v for v in (4, 2, 1) if (48 // lanes) % v == 0)
    *_, blocks, k, columns = [sch.get(loop) for loop in sch.get_loops(sch.get_sblock("matmul_update"))]
    assert (int(blocks.extent), int(k.extent), int(columns.extent)) == (48 // tile, 64, tile)
    assert columns.kind == tvm.tirx.ForKind.VECTORIZED and 'sblock("T_add")' not in sch.mod.script()  # bias on the block
    assert CPUGemv().apply(_gemm_function(_module("odd rows")), make_target("llvm", cpu), False) is None


@T.prim_func(s_tir=True)
def _transposed_weight(a: T.Buffer((16, 32), "float32"), b: T.Buffer((24, 32), "float32"),
                       c: T.Buffer((16, 24), "float32")):
    for i, j, k in T.grid(16, 24, 32):
        with T.sblock("matmul"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                c[vi, vj] = T.float32(0)
            c[vi, vj] = c[vi, vj] + a[vi, vk] * b[vj, vk]


@T.prim_func(s_tir=True)
def _row_sum(a: T.Buffer((16, 32), "float32"), c: T.Buffer((16,), "float32")):
    for i, k in T.grid(16, 32):
        with T.sblock("sum"):
            vi, vk = T.axis.remap("SR", [i, k])
            with T.init():
                c[vi] = T.float32(0)
            c[vi] = c[vi] + a[vi, vk]


@pytest.mark.parametrize("func", [_transposed_weight, _row_sum], ids=["weight rows are j", "a plain reduction"])
def test_other_forms_are_declined(func):
    assert CPUMatmul().apply(func, make_target("llvm"), False) is None


def test_cuda_is_left_to_tvms_own_rules():
    func = _gemm_function(_module("batched"))
    assert CPUMatmul().apply(func, make_target("llvm"), False) is not None
    assert CPUMatmul().apply(func, make_target("cuda"), False) is None


def test_every_gemm_of_the_default_bert_is_scheduled_and_a_tuning_database_leaves_the_rest_to_them():
    from tvm.s_tir import meta_schedule as ms

    from tvm_combiners.models import import_relax, load_onnx, prepare_onnx
    from tvm_combiners.models.loader import default_model_path

    mod = import_relax(prepare_onnx(load_onnx(default_model_path()), 1, 16))[0]
    scheduled = {name: done for name, done in _scheduled(mod).items() if "weight_prepack" not in name}
    assert len(scheduled) == 6 and all(scheduled.values()), scheduled  # QKV, scores, context, out, two FFN
    # the four whose B is a weight read it repacked (scores and context multiply activations)
    assert sorted(name.endswith("_prepacked") for name in scheduled) == [False] * 2 + [True] * 4, scheduled
    target = make_target("llvm")
    database = ms.database.MemoryDatabase()  # no records: what a tuned build leaves untuned gets the defaults
    with target, database:
        lowered = cpu_pipeline(target, database=database)(mod)
    scheduled = {gv.name_hint: bool(f.attrs.get("tirx.is_scheduled", False))
                 for gv, f in lowered.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}
    assert scheduled["layer_norm"] and scheduled["softmax"]  # CPUReduction (not over a leading axis: the next test)
    assert sum(v for k, v in scheduled.items() if "matmul" in k and "weight_prepack" not in k) == 6


@pytest.mark.parametrize("body, want", [
    (lambda bb, x: bb.emit(R.nn.softmax(x, axis=0)), lambda x: np.exp(x) / np.exp(x).sum(axis=0)),
    (lambda bb, x: bb.emit(R.subtract(x, bb.emit(R.mean(x, axis=[0], keepdims=True)))), lambda x: x - x.mean(axis=0)),
], ids=["softmax over rows", "mean over rows"])
def test_reductions_over_a_leading_axis_keep_their_loops(body, want):
    """dlight's CPU reduction rule made every thread recompute these into one shared buffer (146 ms
    instead of 3 ms for a (128, 512) softmax over axis 0, and a data race): no reduction rule runs."""
    mod = make_module({"x": ((64, 48), F32)}, body)
    x = np.random.default_rng(0).standard_normal((64, 48)).astype(F32)
    np.testing.assert_allclose(run_vm(compile_module(mod, "llvm"), [x])[0], want(x), rtol=1e-5, atol=1e-6)
    assert not any(f.attrs.get("tirx.is_scheduled", False) for _, f in _fused(mod, default_schedules()).functions_items()
                   if isinstance(f, tvm.tirx.PrimFunc))


@T.prim_func(s_tir=True)
def _minus_first_column(a: T.Buffer((64, 32), "float32"), b: T.Buffer((32, 64), "float32"),
                        d: T.Buffer((64, 64), "float32")):
    c = T.sblock_alloc_buffer((64, 64))
    for i, j, k in T.grid(64, 64, 32):
        with T.sblock("matmul"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                c[vi, vj] = T.float32(0)
            c[vi, vj] = c[vi, vj] + a[vi, vk] * b[vk, vj]
    for i, j in T.grid(64, 64):
        with T.sblock("epilogue"):
            vi, vj = T.axis.remap("SS", [i, j])
            d[vi, vj] = c[vi, vj] - c[vi, 0]


def test_an_epilogue_reading_another_tile_stays_after_the_gemm():
    """Column 0 is on another tile: the epilogue cannot move onto each tile (TVM refuses with a
    ValueError, which escaped and failed the compile), so the GEMM is scheduled alone."""
    target = make_target("llvm")
    sch = CPUMatmul().apply(_minus_first_column, target, False)
    assert sch is not None and len(sch.get_loops(sch.get_sblock("epilogue"))) == 2  # still its own loop nest
    with target:
        mod = default_schedules()(tvm.IRModule({"main": _minus_first_column}))
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((64, 32)).astype(F32), rng.standard_normal((32, 64)).astype(F32)
    out = tvm.runtime.tensor(np.zeros((64, 64), F32))
    tvm.compile(mod, target=target)["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(b), out)
    c = a @ b
    np.testing.assert_allclose(out.numpy(), c - c[:, :1], rtol=1e-4, atol=1e-4)


@T.prim_func(s_tir=True)
def _threads(a: T.Buffer((64,), "float32"), b: T.Buffer((64,), "float32"), c: T.Buffer((64,), "float32"),
             s: T.Buffer((), "float32"), z: T.Buffer((), "float32")):
    for _t in T.parallel(4):  # every thread copies all of a: the same writes from every thread
        for i in range(64):
            with T.sblock("whole"):
                vi = T.axis.spatial(64, i)
                b[vi] = a[vi]
    for k in T.parallel(64):  # the sum split across threads: a race on s
        with T.sblock("sum"):
            vk = T.axis.reduce(64, k)
            with T.init():
                s[()] = T.float32(0)
            s[()] = s[()] + a[vk]
    for i in T.parallel(64):  # each thread its own elements
        with T.sblock("own"):
            vi = T.axis.spatial(64, i)
            c[vi] = a[vi] * T.float32(2)
    for _t in T.parallel(4):  # one instance, no iterators: every thread writes z
        with T.sblock("scalar"):
            z[()] = a[0]


def test_blocks_every_thread_would_run_whole_or_reduce_together_are_found():
    from tvm_combiners.compile.schedules.common import shared_by_threads

    assert shared_by_threads(_threads) == ["whole", "sum", "scalar"]


def _relu_backward() -> tvm.IRModule:
    """A ReLU's backward after a GEMM, as TVM's Gradient writes it: ``where(x < 0, 0, dy @ w)``."""
    zero = relax.const(np.float32(0))
    return make_module({"dy": ((2, 16, 128), F32), "w": ((128, 256), F32), "x": ((2, 16, 256), F32)},
                       lambda bb, dy, w, x: bb.emit(R.where(bb.emit(R.less(x, zero)), zero,
                                                            bb.emit(R.matmul(dy, w)))))


def test_an_epilogue_reading_an_input_is_computed_on_each_tile_not_by_every_thread():
    """``x < 0`` reads no output of the GEMM: moved under the parallel tile loop as it is, it and the
    ``where`` after it would keep their whole domain, every thread computing every element from GEMM
    results other threads have not written yet (wrong gradients with 2 threads, right with 1). It is
    inlined into the ``where``, which moves onto each tile."""
    from tvm_combiners.compile.schedules.common import shared_by_threads

    mod = _relu_backward()
    func = _gemm_function(mod)
    target = make_target("llvm")
    sch = CPUMatmul().apply(func, target, False)
    assert sch is not None and shared_by_threads(sch.mod["main"]) == []
    tile = sch.get(sch.get_loops(sch.get_sblock("matmul_update"))[0])
    assert tile.kind == tvm.tirx.ForKind.PARALLEL
    assert sch.get(sch.get_loops(sch.get_sblock("T_where"))[0]).same_as(tile)
    assert "T_less" not in sch.mod.script()  # inlined into the where
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(s).astype(F32) for s in ((2, 16, 128), (128, 256), (2, 16, 256))]
    got = run_vm(compile_module(mod, "llvm"), inputs)[0]
    np.testing.assert_allclose(got, np.where(inputs[2] < 0, 0, inputs[0] @ inputs[1]), rtol=1e-5, atol=1e-5)


def test_a_tuned_function_keeps_its_schedule_and_the_rest_gets_the_defaults():
    from tvm.s_tir import meta_schedule as ms

    from tvm_combiners.compile.tuning import measure, targets

    mod = make_module({"x": ((8, 16), F32), "w": ((16, 32), F32), "y": ((4, 16), F32), "v": ((16, 16), F32)},
                      lambda bb, x, w, y, v: [bb.emit(R.matmul(x, w)), bb.emit(R.matmul(y, v))])
    target = targets.tuning_target(make_target("llvm"))
    database = ms.database.MemoryDatabase()
    (task,) = [t for t in ms.relax_integration.extract_tasks(measure.fused(mod, target), target)
               if "matmul1" in t.task_name]  # the (4, 16) x (16, 16) one gets a "tuned" record
    tuned = task.dispatched[0]
    sch = tvm.s_tir.Schedule(tuned)
    sch.annotate(sch.get_loops(sch.get_sblock("matmul"))[0], "tuned_here", 1)
    database.commit_tuning_record(ms.database.TuningRecord(
        sch.trace, database.commit_workload(tuned), [1e-3], target, ms.arg_info.ArgInfo.from_prim_func(tuned["main"])))
    with target, database:
        lowered = cpu_pipeline(target, database=database)(mod)
    scripts = {gv.name_hint: f.script() for gv, f in lowered.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}
    assert "tuned_here" in scripts[task.task_name] and 'scope="local"' not in scripts[task.task_name]
    (other,) = [s for name, s in scripts.items() if name != task.task_name]
    assert "tuned_here" not in other and 'scope="local"' in other and "T.parallel" in other


@pytest.mark.parametrize("dtype, tolerance, approximated", [
    ("float32", 4e-7, True),  # TOPI's fast_erf: |error| 3.2e-7 on this grid (libm's erff: 5e-8)
    ("float16", 5e-4, True),  # computed in float32 and rounded to float16 (half an ulp near 1 is 2.4e-4)
    ("float64", 1e-15, False),  # TVM's legalization: libm
])
def test_erf_is_a_vectorizable_approximation_on_llvm(dtype, tolerance, approximated):
    """GELU's erf was one libm call per element: 7.6 ms of MiniLM-L3's FFNs (590k elements), 0.28 ms approximated."""
    import math

    mod = make_module({"x": ((4096,), dtype)}, lambda bb, x: bb.emit(relax.op.erf(x)))
    x = np.linspace(-7, 7, 4096).astype(dtype)
    (y,) = run_vm(compile_module(mod, "llvm"), [x])
    exact = np.vectorize(math.erf)(x.astype(np.float64))
    assert np.abs(y.astype(np.float64) - exact).max() <= tolerance
    legalized = str(_fused(mod))
    assert ("T.erf(" not in legalized) is approximated
    cuda = make_target("cuda")
    with cuda:
        assert "T.erf(" in str(tvm.transform.Sequential(fusion_passes(cuda))(mod))  # cuda: TVM's own, a device intrinsic


@pytest.mark.parametrize("dtype, tolerance, approximated", [
    ("float32", 3e-7, True),  # relative, where sigmoid is above 1e-30 (|error| 8.4e-8 on this grid)
    ("float16", 5e-4, True),  # absolute: computed in float32 and rounded to float16
    ("float64", 1e-15, False),  # TVM's legalization: libm
])
def test_sigmoid_is_a_vectorizable_approximation_on_llvm_that_keeps_nan(dtype, tolerance, approximated):
    """TVM's sigmoid calls libm's expf once per element (SiLU after every convolution of EfficientNet-B0)."""
    mod = make_module({"x": ((4101,), dtype)}, lambda bb, x: bb.emit(relax.op.sigmoid(x)))
    x = np.concatenate([np.linspace(-100, 100, 4096), [np.nan, np.inf, -np.inf, 88.8, -88.8]]).astype(dtype)
    (y,) = run_vm(compile_module(mod, "llvm"), [x])
    exact = 1 / (1 + np.exp(-x[:-5].astype(np.float64)))
    error = np.abs(y[:-5].astype(np.float64) - exact)
    if dtype == "float32":
        error = (error / exact)[exact > 1e-30]
    assert error.max() <= tolerance
    assert np.isnan(y[-5]) and y[-4] == 1 and y[-3] == 0
    np.testing.assert_allclose(y[-2:].astype(np.float64), [1.0, 0.0], atol=1e-30)
    legalized = str(_fused(mod))
    assert ("T.sigmoid(" not in legalized and "T.exp(" not in legalized) is approximated
    cuda = make_target("cuda")
    with cuda:
        assert "T.sigmoid(" in str(tvm.transform.Sequential(fusion_passes(cuda))(mod))  # cuda: TVM's own


@pytest.mark.parametrize("dtype, tolerance, approximated", [
    ("float32", 1e-6, True),  # relative, on every probability above 1e-30
    ("float16", 1e-3, True),  # absolute: computed in float32 and rounded to float16
    ("float64", 1e-15, False),  # TVM's legalization: libm
])
def test_softmax_is_a_vectorizable_approximation_on_llvm_that_keeps_nan(dtype, tolerance, approximated):
    """TVM's softmax calls libm's expf once per element (2.24 ms of MiniLM-L3's ~15 ms): rows of
    attention scores over a wide range, one row with NaN, one with -inf, one with +inf."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((3, 8, 128)) * np.array([1.0, 10.0, 40.0])[:, None, None]).astype(dtype)
    x[0, 0, 5], x[0, 1, :64], x[0, 2, 7] = np.nan, -np.inf, np.inf
    mod = make_module({"x": (x.shape, dtype)}, lambda bb, x: bb.emit(relax.op.nn.softmax(x, axis=-1)))
    (y,) = run_vm(compile_module(mod, "llvm"), [x])
    with np.errstate(invalid="ignore"):  # inf - inf in the +inf row: NaN, as it should be
        shifted = (x - x.max(-1, keepdims=True)).astype(np.float64)  # the input's rounding: not the approximation's
    exact = np.exp(shifted)
    exact /= exact.sum(-1, keepdims=True)
    assert np.isnan(y[0, 0]).all() and np.isnan(y[0, 2]).all() == np.isnan(exact[0, 2]).all()
    rows = np.ones(y.shape[:2], bool)
    rows[0, 0] = rows[0, 2] = False  # NaN rows: NaN in numpy too
    error = np.abs(y[rows].astype(np.float64) - exact[rows])
    if dtype == "float32":
        error = (error / exact[rows])[exact[rows] > 1e-30]
    assert error.max() <= tolerance
    assert (y[0, 1, :64] == 0).all()
    legalized = str(_fused(mod))
    assert ("T.exp(" not in legalized) is approximated
    assert all(f.attrs.get("tirx.is_scheduled", False) for f in _fused(mod, default_schedules()).functions.values()
               if isinstance(f, tvm.tirx.PrimFunc))


def _constant_shapes(func: relax.Function) -> list[tuple[int, ...]]:
    shapes: list[tuple[int, ...]] = []
    relax.analysis.post_order_visit(func, lambda e: shapes.append(tuple(e.value.shape))
                                    if isinstance(e, tvm.ir.expr.GenericConst) else None)
    return shapes


@pytest.mark.parametrize("x_shape, w_shape", [((16, 512), (512, 64)), ((2, 3, 12, 8), (2, 3, 8, 32))],
                         ids=["2-d, K blocked", "batched"])
def test_a_constant_b_is_read_as_column_panels_repacked_at_compile_time(x_shape, w_shape):
    """B[..., K, N] -> [..., N / width, K, width] for every CPU, width the tile's (two of the CPU's
    vectors where two divide N): each tile reads its panel contiguously. Computed right here."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal(w_shape).astype(F32)
    mod = make_module({"x": (x_shape, F32)}, lambda bb, x: bb.emit(R.nn.relu(bb.emit(R.matmul(x, relax.const(w))))))
    *batch, k, n = w_shape
    for cpu in cpus():
        lanes = _float_lanes(cpu)
        width = 2 * lanes if n % (2 * lanes) == 0 else lanes
        lowered = _fused(mod, default_schedules(), cpu=cpu)
        assert _constant_shapes(lowered["main"]) == [(*batch, n // width, k, width)], cpu
        assert not any(f.attrs and "tvm_combiners.constant_params" in f.attrs for f in lowered.functions.values())
    x = rng.standard_normal(x_shape).astype(F32)
    check_scheduled(mod, np.maximum(x @ w, 0), [x])


def test_a_b_passed_in_keeps_its_layout():
    """A weight the caller passes (not a constant) would be repacked on every call: it is read as it is."""
    mod = make_module({"x": ((16, 512), F32), "w": ((512, 64), F32)}, lambda bb, x, w: bb.emit(R.matmul(x, w)))
    lowered = _fused(mod, default_schedules())
    assert not [gv.name_hint for gv in lowered.functions if "prepack" in gv.name_hint]  # no repack split off
    assert _constant_shapes(lowered["main"]) == []
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((16, 512)).astype(F32), rng.standard_normal((512, 64)).astype(F32)
    check_scheduled(mod, x @ w, [x, w])



@pytest.mark.parametrize("params, body, want", [
    ({"x": ((0,), F32)}, lambda bb, x: bb.emit(R.multiply(x, relax.const(2.0, F32))), lambda x: 2 * x),
    ({"x": ((4, 0), F32), "w": ((0, 8), F32)}, lambda bb, x, w: bb.emit(R.matmul(x, w)), lambda x, w: x @ w),
    ({"x": ((0, 16), F32), "w": ((16, 8), F32)}, lambda bb, x, w: bb.emit(R.nn.relu(bb.emit(R.matmul(x, w)))),
     lambda x, w: np.maximum(x @ w, 0)),
    ({"x": ((3, 0), F32)}, lambda bb, x: bb.emit(R.sum(x, axis=[1])), lambda x: x.sum(axis=1)),
], ids=["elementwise", "gemm of depth 0", "gemm of no rows", "sum of nothing"])
def test_empty_tensors_compile_and_compute_what_numpy_does(params, body, want):
    """Kernels of empty tensors keep their loops (nothing to compute; a vectorized loop of extent 0
    does not compile)."""
    mod = make_module(params, body)
    inputs = [np.ones(shape, dtype) for shape, dtype in params.values()]
    got = run_vm(compile_module(mod, "llvm"), inputs)[0]
    np.testing.assert_array_equal(got, want(*inputs))
