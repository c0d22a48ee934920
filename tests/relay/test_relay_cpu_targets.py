"""TVM 0.16 on every CPU of the matrix: 8-bit products accumulated in int32 (QNN's too), float32 and
float16 equal numpy; AMX is left out of the target and 8-bit products are widened where TVM's int8
kernels would saturate (no VNNI), checked in the generated code of each CPU on any host."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from cpu_matrix import conv2d_reference, cpus, numpy_mismatches, operand, runnable_cpus
from tvm import relay

from tvm_combiners.compile.host import cpu_features
from tvm_combiners.compile.relay_runner import build, for_target, int8_dot_products_are_exact, make_target, run_graph


def _conv2d(d, w, o):
    size = int(w.type_annotation.shape[2])
    return relay.nn.conv2d(d, w, padding=(size // 2, size // 2), kernel_size=(size, size),
                           channels=int(w.type_annotation.shape[0]), out_dtype=o)


# name -> (data shape, weight shape, relay op, numpy of float64 operands)
OPS = {
    "dense": ((4, 64), (48, 64), lambda d, w, o: relay.nn.dense(d, w, out_dtype=o), lambda a, b: a @ b.T),
    "dense, 16 units": ((3, 40), (16, 40), lambda d, w, o: relay.nn.dense(d, w, out_dtype=o), lambda a, b: a @ b.T),
    "matmul": ((4, 64), (64, 32), lambda d, w, o: relay.nn.matmul(d, w, out_dtype=o), lambda a, b: a @ b),
    "batch_matmul": ((2, 4, 64), (2, 32, 64), lambda d, w, o: relay.nn.batch_matmul(d, w, out_dtype=o),
                     lambda a, b: a @ b.transpose(0, 2, 1)),
    "conv2d 3x3, 4 channels": ((1, 8, 8, 8), (4, 8, 3, 3), _conv2d, lambda a, b: conv2d_reference(a, b, 1)),
    "conv2d 3x3, 16 channels": ((1, 16, 8, 8), (16, 16, 3, 3), _conv2d, lambda a, b: conv2d_reference(a, b, 1)),
    "conv2d 1x1": ((1, 16, 8, 8), (32, 16, 1, 1), _conv2d, lambda a, b: conv2d_reference(a, b, 0)),
}
# (data, weight, output) dtypes -> tolerance relative to the largest output (0: exact)
DTYPES = {
    ("uint8", "int8", "int32"): 0, ("int8", "int8", "int32"): 0,
    ("float32", "float32", "float32"): 1e-6,
    ("float16", "float16", "float16"): 1e-2,  # float16 sums of up to 144 products, each add rounded to 11 bits
}
AMX = ("tdpbusd", "tdpbssd", "tileloadd", "ldtilecfg")


def _module(op: str, dtypes: tuple[str, str, str]) -> tvm.IRModule:
    data, weight, body, _ = OPS[op]
    d, w = relay.var("d", shape=data, dtype=dtypes[0]), relay.var("w", shape=weight, dtype=dtypes[1])
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([d, w], body(d, w, dtypes[2]))))


@pytest.mark.parametrize("cpu", runnable_cpus())
def test_every_op_and_dtype_equals_numpy(cpu):
    def run(op, dtypes, a, b):
        return run_graph(build(_module(op, dtypes), {"w": b}, cpu=cpu), {"d": a})[0]

    assert not numpy_mismatches(OPS, DTYPES, run)


@pytest.mark.parametrize("cpu", runnable_cpus())
def test_quantized_dense_and_conv2d_equal_numpy(cpu):
    """QNN ops lower to int8 products inside relay.build: they are lowered (and widened) first."""
    rng = np.random.default_rng(1)
    a, b = operand(rng, (4, 64), "int8"), operand(rng, (48, 64), "int8")
    d, w = relay.var("d", shape=a.shape, dtype="int8"), relay.var("w", shape=b.shape, dtype="int8")
    zero, scale = relay.const(3, "int32"), relay.const(0.5, "float32")
    dense = relay.qnn.op.dense(d, w, zero, relay.const(-2, "int32"), scale, scale, units=48, out_dtype="int32")
    mod = tvm.IRModule.from_expr(relay.Function([d, w], dense))
    (got,) = run_graph(build(mod, {"w": b}, cpu=cpu), {"d": a})
    np.testing.assert_array_equal(got, (a.astype(np.int64) - 3) @ (b.astype(np.int64) + 2).T)


@pytest.mark.parametrize("cpu", cpus())
def test_each_cpus_code_has_no_amx_and_no_saturating_int8_products(cpu):
    """On any host: the generated x86 code of an int8 dense and conv2d for each CPU."""
    target = make_target("llvm", cpu)
    features = cpu_features(cpu)
    assert ("mattr" in target.attrs) == ("amx-int8" in features)  # AMX, and only it, is left out
    vnni = "avx512vnni" in features or "avxvnni" in features
    assert int8_dot_products_are_exact(target) == (vnni or "sse4.2" not in features)
    for op in ("dense", "conv2d 3x3, 16 channels"):
        mod = _module(op, ("uint8", "int8", "int32"))
        widened = for_target(mod, target)
        assert ('cast(%d, dtype="int32")' in widened.astext()) == (not int8_dot_products_are_exact(target))
        b = np.ones([int(d) for d in mod["main"].params[1].type_annotation.shape], "int8")
        asm = build(mod, {"w": b}, cpu=cpu).get_lib().get_source("asm")
        assert not [i for i in AMX if i in asm], op
        assert "vpmaddubsw" not in asm and "pmaddubsw" not in asm, op  # its 16-bit sums saturate
        assert ("vpdpbusd" in asm) == (vnni and "avx512bw" in features or op.startswith("conv") and vnni), op
