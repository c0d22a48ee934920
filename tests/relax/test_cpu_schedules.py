"""Default CPU schedules: every form they schedule computes what numpy does, others keep their loops."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from helpers import make_module
from tvm import relax
from tvm.script import tirx as T

from tvm_combiners.relax.cpu_schedules import CPUMatmul, cpu_pipeline, default_schedules, fusion_passes
from tvm_combiners.relax.runner import compile_module, make_target, run_vm

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
    "width no vector divides": (
        {"x": ((8, 16), F32), "w": ((16, 12), F32)},
        lambda bb, x, w: bb.emit(R.matmul(x, w)),
        lambda x, w: x @ w, {},
    ),
}
SCHEDULED = {"matmul bias gelu": True, "batched": True, "symbolic rows": True, "odd rows": True,
             "width no vector divides": False}


def _module(name: str) -> tvm.IRModule:
    params, body, _, _ = FORMS[name]
    return make_module({k: (tuple(tvm.tirx.Var(d, "int64") if isinstance(d, str) else d for d in shape), dtype)
                        for k, (shape, dtype) in params.items()}, body)


def _inputs(name: str) -> list[np.ndarray]:
    params, _, _, sizes = FORMS[name]
    rng = np.random.default_rng(0)
    return [rng.standard_normal([sizes.get(d, d) for d in shape]).astype(dtype) for shape, dtype in params.values()]


def _scheduled(mod: tvm.IRModule) -> dict[str, bool]:
    """Each fused function that reads a matmul: did the default schedules schedule it?"""
    target = make_target("llvm")
    with target:
        mod = tvm.transform.Sequential([*relax.pipeline.library_dispatch_passes(target), *fusion_passes(),
                                        default_schedules()])(mod)
    return {gv.name_hint: bool(f.attrs.get("tirx.is_scheduled", False)) for gv, f in mod.functions_items()
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
    target = make_target("llvm")
    with target:
        mod = tvm.transform.Sequential([*relax.pipeline.library_dispatch_passes(target), *fusion_passes()])(
            _module("matmul bias gelu"))
    (func,) = [f for gv, f in mod.functions_items() if "matmul" in gv.name_hint]
    sch = CPUMatmul().apply(func, target, False)
    assert sch is not None
    text = sch.mod.script()
    assert text.count("T.parallel(") == 1 and "T.vectorized(" in text and 'scope="local"' in text
    outer = sch.get(sch.get_loops(sch.get_sblock("matmul_update"))[0])
    for block in ("T_add", "compute", "T_multiply_2"):  # bias, gelu's erf, its last step: under the same loop
        assert sch.get(sch.get_loops(sch.get_sblock(block))[0]).same_as(outer)


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


@T.prim_func(s_tir=True)
def _plain_matmul(a: T.Buffer((16, 32), "float32"), b: T.Buffer((32, 24), "float32"),
                  c: T.Buffer((16, 24), "float32")):
    for i, j, k in T.grid(16, 24, 32):
        with T.sblock("matmul"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                c[vi, vj] = T.float32(0)
            c[vi, vj] = c[vi, vj] + a[vi, vk] * b[vk, vj]


def test_cuda_is_left_to_tvms_own_rules():
    assert CPUMatmul().apply(_plain_matmul, make_target("llvm"), False) is not None
    assert CPUMatmul().apply(_plain_matmul, make_target("cuda"), False) is None


def test_every_gemm_of_the_default_bert_is_scheduled_and_a_tuning_database_leaves_the_rest_to_them():
    from tvm.s_tir import meta_schedule as ms

    from tvm_combiners.models import import_relax, load_onnx, prepare_onnx
    from tvm_combiners.models.loader import default_model_path

    mod = import_relax(prepare_onnx(load_onnx(default_model_path()), 1, 16))[0]
    scheduled = _scheduled(mod)
    assert len(scheduled) == 6 and all(scheduled.values()), scheduled  # QKV, scores, context, out, two FFN
    target = make_target("llvm")
    database = ms.database.MemoryDatabase()  # no records: what a tuned build leaves untuned gets the defaults
    with target, database:
        lowered = cpu_pipeline(target, database=database)(mod)
    scheduled = {gv.name_hint: bool(f.attrs.get("tirx.is_scheduled", False))
                 for gv, f in lowered.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}
    assert scheduled["layer_norm"] and scheduled["softmax"]  # dlight's CPU reduction rule
    assert sum(v for k, v in scheduled.items() if "matmul" in k) == 6


@T.prim_func(s_tir=True)
def _scaled_row_sum(a: T.Buffer((2, 16, 128), "float32"), d: T.Buffer((2, 16, 1), "float32"),
                    out: T.Buffer((2, 16, 1), "float32")):
    scaled = T.sblock_alloc_buffer((2, 16, 128))
    for i0, i1, i2 in T.grid(2, 16, 128):
        with T.sblock("scaled"):
            v0, v1, v2 = T.axis.remap("SSS", [i0, i1, i2])
            scaled[v0, v1, v2] = a[v0, v1, v2] / d[v0, v1, 0]
    for i0, i1, i2, k in T.grid(2, 16, 1, 128):
        with T.sblock("red"):
            v0, v1, v2, vk = T.axis.remap("SSSR", [i0, i1, i2, k])
            with T.init():
                out[v0, v1, v2] = T.float32(0)
            out[v0, v1, v2] = out[v0, v1, v2] + scaled[v0, v1, vk]


def test_a_dlight_rule_that_fails_declines_instead():
    """dlight's CPU GEMV asserts on this reduction (a training step's gradient has it), where it should decline."""
    target = make_target("llvm")
    with target:
        mod = default_schedules()(tvm.IRModule({"main": _scaled_row_sum}))
    a = np.random.default_rng(0).standard_normal((2, 16, 128)).astype(F32)
    d = np.full((2, 16, 1), 4.0, F32)
    out = tvm.runtime.tensor(np.zeros((2, 16, 1), F32))
    tvm.compile(mod, target=target)["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(d), out)
    np.testing.assert_allclose(out.numpy(), (a / d).sum(axis=2, keepdims=True), rtol=1e-5)
