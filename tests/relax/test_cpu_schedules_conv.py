"""Default CPU schedules of CNN functions: convolutions, pools and injective functions compute what
numpy and TVM's naive loops do, are scheduled where the rules say and keep their loops elsewhere."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tvm
from cpu_matrix import cpus, runnable_cpus
from helpers import check_scheduled, make_module
from tvm import relax

from tvm_combiners.compile.host import cpu_features
from tvm_combiners.compile.pipelines import fusion_passes
from tvm_combiners.compile.relax_runner import compile_module, make_target, run_vm
from tvm_combiners.compile.schedules import CPUConv2D, CPUInjective, CPUPool, default_schedules

R = relax.op
F32 = "float32"


def conv2d_numpy(x: np.ndarray, w: np.ndarray, stride: int = 1, padding: int | tuple = 0, dilation: int = 1,
                 groups: int = 1) -> np.ndarray:
    """NCHW x OIHW in float64; ``padding`` an int or (top, left, bottom, right)."""
    top, left, bottom, right = (padding,) * 4 if isinstance(padding, int) else padding
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (top, bottom), (left, right)))
    outs, group_in, kh, kw = w.shape
    oh = (xp.shape[2] - dilation * (kh - 1) - 1) // stride + 1
    ow = (xp.shape[3] - dilation * (kw - 1) - 1) // stride + 1
    out = np.zeros((x.shape[0], outs, oh, ow))
    group_out = outs // groups
    for g in range(groups):
        xs, ws = xp[:, g * group_in:(g + 1) * group_in], w[g * group_out:(g + 1) * group_out].astype(np.float64)
        for i in range(kh):
            for j in range(kw):
                patch = xs[:, :, i * dilation:i * dilation + stride * (oh - 1) + 1:stride,
                           j * dilation:j * dilation + stride * (ow - 1) + 1:stride]
                out[:, g * group_out:(g + 1) * group_out] += np.einsum("nchw,oc->nohw", patch, ws[:, :, i, j])
    return out


def pool_numpy(x: np.ndarray, kernel: int, stride: int, padding: int, kind: str, layout: str = "NCHW") -> np.ndarray:
    """Max or average (padding not counted) over ``kernel`` x ``kernel`` windows, in float64."""
    a = x.astype(np.float64) if layout == "NCHW" else x.astype(np.float64).transpose(0, 3, 1, 2)
    a = np.pad(a, ((0, 0), (0, 0), (padding, padding), (padding, padding)), constant_values=np.nan)
    oh, ow = ((a.shape[2] - kernel) // stride + 1, (a.shape[3] - kernel) // stride + 1)
    windows = np.stack([a[:, :, i:i + stride * (oh - 1) + 1:stride, j:j + stride * (ow - 1) + 1:stride]
                        for i in range(kernel) for j in range(kernel)])
    out = np.nanmax(windows, axis=0) if kind == "max" else np.nanmean(windows, axis=0)
    return out if layout == "NCHW" else out.transpose(0, 2, 3, 1)


NHWC = {"data_layout": "NHWC", "kernel_layout": "HWIO", "out_layout": "NHWC"}
# from NCHW and OIHW to each layout, and back
PERMUTATIONS = {"NCHW": (0, 1, 2, 3), "NHWC": (0, 2, 3, 1), "OIHW": (0, 1, 2, 3), "HWIO": (2, 3, 1, 0),
                "OHWI": (0, 2, 3, 1)}


def _to(layout: str, shape: tuple) -> tuple:
    return tuple(shape[i] for i in PERMUTATIONS[layout])


def _from(layout: str, a: np.ndarray) -> np.ndarray:
    return a.transpose(np.argsort(PERMUTATIONS[layout]))


def _layouts(attrs: dict) -> tuple[str, str]:
    return attrs.get("data_layout", "NCHW"), attrs.get("kernel_layout", "OIHW")


# name -> (input shape, weight shape, conv2d attributes, epilogue, the form the rule takes or None)
CONVS = {
    "3x3, bias relu": ((1, 8, 10, 10), (32, 8, 3, 3), {"padding": 1}, "bias relu", "channels"),
    "stride 2": ((1, 8, 11, 11), (16, 8, 3, 3), {"strides": 2, "padding": 1}, "bias relu", "channels"),
    "dilation 2": ((1, 8, 12, 12), (16, 8, 3, 3), {"dilation": 2, "padding": 2}, "none", "channels"),
    "1x1, batch 2, residual": ((2, 16, 7, 7), (32, 16, 1, 1), {}, "residual relu", "channels"),
    "1x3, uneven padding": ((1, 8, 9, 12), (16, 8, 1, 3), {"padding": (0, 1, 0, 1)}, "none", "channels"),
    "7x7 stride 2 from 3 channels": ((1, 3, 20, 20), (16, 3, 7, 7), {"strides": 2, "padding": 3}, "bias relu",
                                     "channels"),
    "2 groups": ((1, 16, 8, 8), (32, 8, 3, 3), {"groups": 2, "padding": 1}, "bias relu", "channels"),
    "6 outputs (no vector divides)": ((1, 16, 8, 8), (6, 16, 3, 3), {"padding": 1}, "bias relu", "width"),
    # SiLU reads the convolution twice, z * sigmoid(z): sigmoid is inlined into multiply first, which
    # then reads z twice at one index and is computed on the tile
    "3x3, silu": ((1, 8, 8, 8), (16, 8, 3, 3), {"padding": 1}, "silu", "channels"),
    "depthwise": ((1, 16, 12, 12), (16, 1, 3, 3), {"groups": 16, "padding": 1}, "bias relu", "depthwise"),
    "depthwise 5x5 stride 2, silu": ((1, 32, 15, 15), (32, 1, 5, 5), {"groups": 32, "strides": 2, "padding": 2},
                                     "silu", "depthwise"),
    "depthwise 5x5, 48 channels": ((1, 48, 10, 10), (48, 1, 5, 5), {"groups": 48, "padding": 2}, "bias relu",
                                   "depthwise"),
    "depthwise, odd width": ((1, 16, 9, 13), (16, 1, 3, 3), {"groups": 16, "padding": 1}, "silu", "depthwise"),
    "depthwise stride 2, no padding": ((1, 16, 9, 9), (16, 1, 3, 3), {"groups": 16, "strides": 2}, "none",
                                       "depthwise"),
    "depthwise, dilation 2": ((1, 16, 10, 10), (16, 1, 3, 3), {"groups": 16, "dilation": 2, "padding": 2}, "none",
                              "depthwise"),
    # stride 1 and rows of 64 or more: vectors along the row, the input read as it is
    "depthwise, wide rows": ((1, 8, 4, 64), (8, 1, 3, 3), {"groups": 8, "padding": 1}, "silu", "width"),
    # no vector divides 6 channels; a multiplier of 2 reads each input channel for two outputs
    "depthwise, 6 channels": ((1, 6, 8, 8), (6, 1, 3, 3), {"groups": 6, "padding": 1}, "bias relu", None),
    "depthwise x2, stride 2": ((1, 8, 9, 9), (16, 1, 3, 3), {"groups": 8, "strides": 2}, "none", None),
    # NHWC (shapes above in NCHW and OIHW, transposed to the layouts named)
    "NHWC x HWIO 3x3, bias relu": ((1, 8, 10, 10), (32, 8, 3, 3), {"padding": 1, **NHWC}, "bias relu", "channels"),
    "NHWC x OHWI, stride 2, dilation 2": ((1, 8, 13, 13), (16, 8, 3, 3), {"strides": 2, "dilation": 2, "padding": 2,
                                                                        **NHWC, "kernel_layout": "OHWI"}, "none",
                                          "channels"),
    "NHWC x OIHW, 1x1 residual": ((2, 16, 7, 7), (32, 16, 1, 1), {**NHWC, "kernel_layout": "OIHW"}, "residual relu",
                                  "channels"),
    "NHWC, 2 groups": ((1, 16, 8, 8), (32, 8, 3, 3), {"groups": 2, "padding": 1, **NHWC}, "bias relu", "channels"),
    "NHWC depthwise 5x5 stride 2, silu": ((1, 32, 15, 15), (32, 1, 5, 5), {"groups": 32, "strides": 2, "padding": 2,
                                                                         **NHWC}, "silu", "depthwise"),
    "NHWC, 6 outputs (no vector divides)": ((1, 16, 8, 8), (6, 16, 3, 3), {"padding": 1, **NHWC}, "none", None),
}


def _conv_module(name: str) -> tvm.IRModule:
    shape, weight, attrs, epilogue, _ = CONVS[name]
    data, kernel = _layouts(attrs)
    params = {"x": (_to(data, shape), F32), "w": (_to(kernel, weight), F32)}
    out_shape = tuple(conv2d_numpy(np.zeros(shape), np.zeros(weight), attrs.get("strides", 1), attrs.get("padding", 0),
                                   attrs.get("dilation", 1), attrs.get("groups", 1)).shape)
    if epilogue == "bias relu":
        params["b"] = (_to(data, (1, weight[0], 1, 1)), F32)
    elif epilogue == "residual relu":
        params["r"] = (_to(data, out_shape), F32)

    def body(bb, x, w, *other):  # noqa: ANN001, ANN202
        y = bb.emit(R.nn.conv2d(x, w, **attrs))
        if epilogue == "silu":
            return bb.emit(R.multiply(y, bb.emit(R.sigmoid(y))))
        return bb.emit(R.nn.relu(bb.emit(R.add(y, other[0])))) if other else y

    return make_module(params, body)


def _conv_numpy(name: str, x: np.ndarray, w: np.ndarray, *other: np.ndarray) -> np.ndarray:
    _, _, attrs, epilogue, _ = CONVS[name]
    data, kernel = _layouts(attrs)
    y = conv2d_numpy(_from(data, x), _from(kernel, w), attrs.get("strides", 1), attrs.get("padding", 0),
                     attrs.get("dilation", 1), attrs.get("groups", 1))
    if epilogue == "silu":
        y = y / (1 + np.exp(-y))
    elif other:
        y = np.maximum(y + _from(data, other[0]), 0)
    return _from(data, y) if data == "NCHW" else y.transpose(PERMUTATIONS[data])


def _inputs(mod: tvm.IRModule, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal([int(d) for d in p.ty.shape.values]).astype(str(p.ty.dtype)) for p in mod["main"].params]


def _fused(mod: tvm.IRModule, *then: tvm.transform.Pass, cpu: str | None = None) -> tvm.IRModule:
    target = make_target("llvm", cpu)
    with target:
        return tvm.transform.Sequential([*fusion_passes(target), *then])(mod)


def _function(mod: tvm.IRModule, word: str, cpu: str | None = None) -> tvm.tirx.PrimFunc:
    """The one fused (unscheduled) function whose name has ``word``."""
    (func,) = [f for gv, f in _fused(mod, cpu=cpu).functions_items() if word in gv.name_hint]
    return func


def _scheduled(mod: tvm.IRModule, word: str, cpu: str | None = None) -> list[bool]:
    """Whether the default schedules scheduled each function whose name has ``word`` (the weight
    repacking split off a convolution is not one of them)."""
    return [bool(f.attrs.get("tirx.is_scheduled", False))
            for gv, f in _fused(mod, default_schedules(), cpu=cpu).functions_items()
            if isinstance(f, tvm.tirx.PrimFunc) and word in gv.name_hint and "weight_prepack" not in gv.name_hint]


def _lanes(cpu: str | None, width: int) -> int:
    """float32 lanes of the CPU's widest vector that divides ``width`` (LLVM's features of it)."""
    features = cpu_features(cpu) if cpu else cpu_features(str(make_target("llvm").attrs["mcpu"]))
    widest = 16 if "avx512f" in features else 8 if "avx" in features else 4
    return next(lanes for lanes in (widest, widest // 2, widest // 4) if lanes >= 4 and width % lanes == 0)


def _update(sch: tvm.s_tir.Schedule) -> str:
    """The name of the scheduled reduction's update block."""
    (name,) = [n for n in re.findall(r'T\.sblock\("(\w+)"\)', sch.mod.script()) if n.endswith("_update")]
    return name


def _loops(sch: tvm.s_tir.Schedule, block: str) -> list:
    return [sch.get(loop) for loop in sch.get_loops(sch.get_sblock(block))]


@pytest.mark.parametrize("name", CONVS)
def test_each_conv_computes_what_numpy_and_the_naive_loops_do(name):
    mod = _conv_module(name)
    inputs = _inputs(mod)
    check_scheduled(mod, _conv_numpy(name, *inputs), inputs)
    assert _scheduled(mod, "conv2d") == [CONVS[name][4] is not None]


@pytest.mark.parametrize("cpu", cpus())
def test_every_conv_is_scheduled_for_every_cpu_with_its_vectors(cpu):
    """Channel tiles of two of the CPU's vectors where two divide a group's outputs (one where one
    does), one vector of channels in depthwise convolutions; declined forms the same on every CPU."""
    target = make_target("llvm", cpu)
    for name, (_, weight, attrs, _, form) in CONVS.items():
        mod = _conv_module(name)
        assert _scheduled(mod, "conv2d", cpu) == [form is not None], name
        if form not in ("channels", "depthwise"):
            continue
        sch = CPUConv2D().apply(_function(mod, "conv2d", cpu), target, False)
        per_group = weight[0] // attrs.get("groups", 1)
        if form == "depthwise":
            tile = _lanes(cpu, weight[0])
        else:
            lanes = _lanes(cpu, per_group)
            tile = 2 * lanes if per_group % (2 * lanes) == 0 else lanes
        loops = _loops(sch, _update(sch))
        assert loops[0].kind == tvm.tirx.ForKind.PARALLEL, name
        assert loops[-1].kind == tvm.tirx.ForKind.VECTORIZED and int(loops[-1].extent) == tile, name
        assert loops[-2].kind == tvm.tirx.ForKind.UNROLLED, name  # the row segment, one register each


def test_the_channel_tile_accumulates_in_registers_with_the_weight_repacked_and_the_epilogue_on_it():
    target = make_target("llvm")
    sch = CPUConv2D().apply(_function(_conv_module("3x3, bias relu"), "conv2d"), target, False)
    text = sch.mod.script()
    assert text.count("meta_schedule.layout_rewrite_preproc") == 1 and 'scope="local"' in text
    assert 'sblock("T_add")' not in text and "T.max(" in text  # bias and relu computed as the tile leaves its registers
    (store,) = [n for n in re.findall(r'T\.sblock\("(\w+)"\)', text) if n.endswith("_local")]
    assert _loops(sch, store)[-1].kind == tvm.tirx.ForKind.VECTORIZED  # the row segment stored whole
    (packed,) = [b for b in sch.mod["main"].body.block.alloc_buffers if b.name == "w_global"]
    tile = int(packed.shape[-1])
    assert [int(d) for d in packed.shape] == [32 // tile, 8, 3, 3, tile]


@pytest.mark.parametrize("name", ["3x3, silu", "depthwise 5x5 stride 2, silu"])
def test_silu_is_computed_on_the_tile_as_it_leaves_the_registers(name):
    """SiLU's stages (sigmoid is several on llvm: the fast exp, add, divide, the NaN select) are all
    inlined into the store of the tile: no block but the convolution's own remains."""
    func = _function(_conv_module(name), "conv2d")
    assert len(re.findall(r'T\.sblock\("', func.script())) > 6  # the epilogue's stages, before scheduling
    sch = CPUConv2D().apply(func, make_target("llvm"), False)
    blocks = re.findall(r'T\.sblock\("(\w+)"\)', sch.mod.script())
    assert [b for b in blocks if b != "root" and "conv2d_nchw" not in b and b not in ("w_global", "pad_temp",
                                                                                    "pad_temp_global")] == []
    assert "T.exp(" not in sch.mod.script()  # the approximated exp: vector arithmetic, no libm call


def test_a_depthwise_tap_of_a_channel_vector_is_one_load_of_the_input_packed_with_its_padding():
    """The padded input packed as [N, C / lanes, H, W, lanes] in one pass, the weight as [C / lanes, 1, KH, KW, lanes]."""
    sch = CPUConv2D().apply(_function(_conv_module("depthwise 5x5 stride 2, silu"), "conv2d"), make_target("llvm"),
                            False)
    buffers = {b.name: [int(d) for d in b.shape] for b in sch.mod["main"].body.block.alloc_buffers}
    lanes = _lanes(None, 32)
    assert buffers["pad_temp_global"] == [1, 32 // lanes, 19, 19, lanes]
    assert buffers["w_global"] == [32 // lanes, 1, 5, 5, lanes]
    assert 'sblock("pad_temp")' not in sch.mod.script()  # the padding computed in the packing pass


def test_the_row_form_vectorizes_along_the_output_row():
    """6 outputs: no vector divides them; a vector divides the 8-wide rows."""
    sch = CPUConv2D().apply(_function(_conv_module("6 outputs (no vector divides)"), "conv2d"), make_target("llvm"),
                            False)
    loops = _loops(sch, "conv2d_nchw_update")
    assert loops[0].kind == tvm.tirx.ForKind.PARALLEL
    assert loops[-1].kind == tvm.tirx.ForKind.VECTORIZED and int(loops[-1].extent) == 8
    assert "w_global" not in sch.mod.script()


def test_a_wide_depthwise_convolution_of_stride_1_reads_its_rows_as_they_are():
    sch = CPUConv2D().apply(_function(_conv_module("depthwise, wide rows"), "conv2d"), make_target("llvm"), False)
    loops = _loops(sch, "group_conv2d_nchw_update")
    assert loops[0].kind == tvm.tirx.ForKind.PARALLEL and loops[-1].kind == tvm.tirx.ForKind.VECTORIZED
    assert "pad_temp_global" not in sch.mod.script() and "w_global" not in sch.mod.script()


def test_a_constant_weight_is_repacked_at_compile_time():
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((32, 8, 3, 3)).astype(F32)
    mod = make_module({"x": ((1, 8, 10, 10), F32)},
                      lambda bb, x: bb.emit(R.nn.relu(bb.emit(R.nn.conv2d(x, relax.const(weight), padding=1)))))
    lowered = _fused(mod, default_schedules())
    assert "weight_prepack" not in str(lowered["main"]) and "prepacked" in str(lowered["main"])
    x = rng.standard_normal((1, 8, 10, 10)).astype(F32)
    check_scheduled(mod, np.maximum(conv2d_numpy(x, weight, padding=1), 0), [x])


@pytest.mark.parametrize("form", ["int8 x int8 -> int32", "symbolic batch"])
def test_other_convolutions_keep_their_loops_and_compute_right(form):
    rng = np.random.default_rng(0)
    if form == "int8 x int8 -> int32":  # mixed dtypes: declined, TVM's loops
        mod = make_module({"x": ((1, 8, 6, 6), "int8"), "w": ((16, 8, 3, 3), "int8")},
                          lambda bb, x, w: bb.emit(R.nn.conv2d(x, w, padding=1, out_dtype="int32")))
        inputs = [rng.integers(-128, 128, s).astype("int8") for s in ((1, 8, 6, 6), (16, 8, 3, 3))]
        want = conv2d_numpy(*inputs, padding=1)
    else:
        mod = make_module({"x": ((tvm.tirx.Var("n", "int64"), 8, 6, 6), F32), "w": ((16, 8, 3, 3), F32)},
                          lambda bb, x, w: bb.emit(R.nn.conv2d(x, w, padding=1)))
        inputs = [rng.standard_normal((2, 8, 6, 6)).astype(F32), rng.standard_normal((16, 8, 3, 3)).astype(F32)]
        want = conv2d_numpy(*inputs, padding=1)
    assert _scheduled(mod, "conv2d") == [False]
    got = run_vm(compile_module(mod, "llvm"), inputs)[0]
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=1e-5, atol=1e-4)


def conv2d_transpose_numpy(x: np.ndarray, w: np.ndarray, stride: int, padding: int, output_padding: int = 0
                           ) -> np.ndarray:
    """NCHW x IOHW, in float64: each input element scatters its weighted kernel into the output."""
    n, _, h, width = x.shape
    _, outs, kh, kw = w.shape
    full = np.zeros((n, outs, (h - 1) * stride + kh + output_padding, (width - 1) * stride + kw + output_padding))
    for i in range(kh):
        for j in range(kw):
            full[:, :, i:i + stride * (h - 1) + 1:stride, j:j + stride * (width - 1) + 1:stride] += np.einsum(
                "nchw,co->nohw", x.astype(np.float64), w[:, :, i, j].astype(np.float64))
    oh, ow = full.shape[2] - 2 * padding, full.shape[3] - 2 * padding
    return full[:, :, padding:padding + oh, padding:padding + ow]


# name -> (input shape, IOHW weight shape, stride, padding, output padding)
TRANSPOSED = {
    "2x2 stride 2 (an FPN's upsampling)": ((1, 16, 6, 6), (16, 16, 2, 2), 2, 0, 0),
    "3x3 stride 2, padding 1, output padding 1": ((1, 8, 5, 5), (8, 16, 3, 3), 2, 1, 1),
}


@pytest.mark.parametrize("constant", [False, True], ids=["weight input", "constant weight"])
@pytest.mark.parametrize("name", TRANSPOSED)
def test_conv2d_transpose_is_scheduled_as_a_convolution_with_its_kernel_computed_once(name, constant):
    """LegalizeOps writes conv2d_transpose as a convolution of the zero-stuffed input with the flipped,
    transposed kernel; the rule's repack computes that kernel, so a constant one is computed at compile time."""
    shape, weight_shape, stride, padding, output_padding = TRANSPOSED[name]
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal(shape).astype(F32), rng.standard_normal(weight_shape).astype(F32)
    attrs = {"strides": stride, "padding": padding, "output_padding": output_padding}
    if constant:
        mod = make_module({"x": (shape, F32)}, lambda bb, x: bb.emit(R.nn.conv2d_transpose(x, relax.const(w), **attrs)))
        inputs = [x]
        assert "prepacked" in str(_fused(mod, default_schedules())["main"])
    else:
        mod = make_module({"x": (shape, F32), "w": (weight_shape, F32)},
                          lambda bb, x, w: bb.emit(R.nn.conv2d_transpose(x, w, **attrs)))
        inputs = [x, w]
    check_scheduled(mod, conv2d_transpose_numpy(x, w, stride, padding, output_padding), inputs)
    assert _scheduled(mod, "conv2d_transpose") == [True]


# name -> (input shape, pool attributes, numpy arguments (kernel, stride, padding, kind, layout), scheduled)
POOLS = {
    "max 3x3 stride 1": ((1, 8, 14, 14), {"pool_size": 3, "strides": 1, "padding": 1}, (3, 1, 1, "max", "NCHW"), True),
    "avg 3x3 stride 1": ((1, 8, 14, 14), {"pool_size": 3, "strides": 1, "padding": 1}, (3, 1, 1, "avg", "NCHW"), True),
    "max NHWC stride 2": ((1, 10, 10, 32), {"pool_size": 2, "strides": 2, "layout": "NHWC"}, (2, 2, 0, "max", "NHWC"),
                          True),
    "max stride 2 (declined)": ((1, 8, 15, 15), {"pool_size": 3, "strides": 2, "padding": 1},
                                (3, 2, 1, "max", "NCHW"), False),
}


@pytest.mark.parametrize("name", POOLS)
def test_each_pool_computes_what_numpy_and_the_naive_loops_do(name):
    shape, attrs, reference, scheduled = POOLS[name]
    op = R.nn.max_pool2d if reference[3] == "max" else R.nn.avg_pool2d
    mod = make_module({"x": (shape, F32)}, lambda bb, x: bb.emit(op(x, **attrs)))
    inputs = _inputs(mod)
    check_scheduled(mod, pool_numpy(inputs[0], *reference), inputs)
    assert _scheduled(mod, "pool") == [scheduled]
    if scheduled:
        sch = CPUPool().apply(_function(mod, "pool"), make_target("llvm"), False)
        assert _loops(sch, _update(sch))[-1].kind == tvm.tirx.ForKind.VECTORIZED


@pytest.mark.parametrize("cpu", cpus())
def test_every_pool_is_scheduled_for_every_cpu(cpu):
    for name, (shape, attrs, reference, scheduled) in POOLS.items():
        op = R.nn.max_pool2d if reference[3] == "max" else R.nn.avg_pool2d
        mod = make_module({"x": (shape, F32)}, lambda bb, x, op=op, attrs=attrs: bb.emit(op(x, **attrs)))
        assert _scheduled(mod, "pool", cpu) == [scheduled], name


# name -> (params, relax body, numpy, whether its loop nest runs in parallel)
INJECTIVE = {
    "bias add relu": ({"x": ((1, 64, 64, 64), F32), "b": ((1, 64, 1, 1), F32)},
                      lambda bb, x, b: bb.emit(R.nn.relu(bb.emit(R.add(x, b)))), lambda x, b: np.maximum(x + b, 0), True),
    "transpose": ({"x": ((4, 64, 33), F32)}, lambda bb, x: bb.emit(R.permute_dims(x, [0, 2, 1])),
                  lambda x: x.transpose(0, 2, 1), False),
    "concat": ({"x": ((1, 16, 7, 7), F32), "y": ((1, 8, 7, 7), F32)},
               lambda bb, x, y: bb.emit(R.concat([x, y], axis=1)), lambda x, y: np.concatenate([x, y], 1), False),
    "tiny exp": ({"x": ((3, 5), F32)}, lambda bb, x: bb.emit(R.exp(x)), np.exp, False),
}


@pytest.mark.parametrize("name", INJECTIVE)
def test_each_injective_function_computes_what_numpy_and_the_naive_loops_do(name):
    params, body, reference, parallel = INJECTIVE[name]
    mod = make_module(params, body)
    inputs = _inputs(mod)
    check_scheduled(mod, reference(*[a.astype(np.float64) for a in inputs]), inputs)
    ((gv, func),) = [(gv, f) for gv, f in _fused(mod).functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert _scheduled(mod, gv.name_hint) == [True]
    text = CPUInjective().apply(func, make_target("llvm"), False).mod.script()
    assert ("T.parallel(" in text) is parallel  # small loop nests stay on one thread


def test_reductions_are_no_injective_function():
    mod = make_module({"x": ((8, 32), F32)}, lambda bb, x: bb.emit(R.sum(x, axis=1)))
    assert CPUInjective().apply(_function(mod, "sum"), make_target("llvm"), False) is None


@pytest.mark.parametrize("cpu", runnable_cpus())
def test_a_small_cnn_computes_what_numpy_does_on_every_cpu_this_host_runs(cpu):
    """A conv in channel tiles, a strided grouped one, a pool, a residual add and a depthwise one
    with SiLU, built for each CPU."""
    rng = np.random.default_rng(1)
    w1, w2 = rng.standard_normal((16, 8, 3, 3)).astype(F32), rng.standard_normal((16, 8, 3, 3)).astype(F32)
    w3 = rng.standard_normal((16, 1, 3, 3)).astype(F32)

    def body(bb, x):  # noqa: ANN001, ANN202
        y = bb.emit(R.nn.relu(bb.emit(R.nn.conv2d(x, relax.const(w1), padding=1))))
        z = bb.emit(R.nn.conv2d(y, relax.const(w2), strides=2, padding=1, groups=2))
        s = bb.emit(R.add(bb.emit(R.nn.max_pool2d(z, 3, 1, 1)), z))
        d = bb.emit(R.nn.conv2d(s, relax.const(w3), strides=2, padding=1, groups=16))
        return bb.emit(R.multiply(d, bb.emit(R.sigmoid(d))))

    mod = make_module({"x": ((1, 8, 12, 12), F32)}, body)
    x = rng.standard_normal((1, 8, 12, 12)).astype(F32)
    z = conv2d_numpy(np.maximum(conv2d_numpy(x, w1, padding=1), 0), w2, 2, 1, 1, 2)
    d = conv2d_numpy(pool_numpy(z, 3, 1, 1, "max") + z, w3, 2, 1, 1, 16)
    check_scheduled(mod, d * (0.5 + 0.5 * np.tanh(d / 2)), [x], cpu=cpu)  # d * sigmoid(d), without overflow


def test_a_module_with_a_function_without_blocks_keeps_its_repack_inside_the_kernel():
    """TVM's split of weight repacks fails on a PrimFunc without blocks (the collectives' runtime
    calls): such a module keeps the repack in the convolution's kernel, and computes the same."""
    from tvm.s_tir import dlight

    from tvm_combiners.compile.schedules import cpu_rules, hoist_weight_repacks

    weight = np.random.default_rng(1).standard_normal((16, 8, 3, 3)).astype(F32)
    mod = make_module({"x": ((1, 8, 6, 6), F32)}, lambda bb, x: bb.emit(R.nn.conv2d(x, relax.const(weight), padding=1)))
    scheduled = _fused(mod, dlight.ApplyDefaultSchedule(*cpu_rules()))
    assert "prepacked" in str(hoist_weight_repacks()(scheduled)["main"])  # split off and folded
    scheduled["no_blocks"] = tvm.tirx.PrimFunc([], tvm.tirx.Evaluate(0))
    kept = hoist_weight_repacks()(scheduled)
    assert kept.same_as(scheduled) and "prepacked" not in str(kept["main"])
