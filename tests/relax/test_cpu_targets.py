"""Every CPU of the matrix computes what numpy does: 8-bit products accumulated in int32, float32,
float16, for matmul (dense's form too), batch matmul and conv2d, through this package's llvm pipeline."""

from __future__ import annotations

import pytest
import tvm
from cpu_matrix import conv2d_reference, cpus, numpy_mismatches, runnable_cpus
from helpers import make_module
from tvm import relax

from tvm_combiners.compile.pipelines import fusion_passes
from tvm_combiners.compile.relax_runner import compile_module, make_target, run_vm
from tvm_combiners.compile.schedules import default_schedules

R = relax.op

# name -> (data shape, weight shape, relax op, numpy of float64 operands)
OPS = {
    "dense": ((4, 64), (48, 64), lambda x, w, o: R.matmul(x, R.permute_dims(w), out_dtype=o), lambda a, b: a @ b.T),
    "matmul, 16 columns": ((3, 40), (40, 16), lambda x, w, o: R.matmul(x, w, out_dtype=o), lambda a, b: a @ b),
    "batch matmul": ((2, 4, 64), (2, 64, 32), lambda x, w, o: R.matmul(x, w, out_dtype=o), lambda a, b: a @ b),
    "conv2d 3x3, 4 channels": ((1, 8, 8, 8), (4, 8, 3, 3),
                               lambda x, w, o: R.nn.conv2d(x, w, padding=1, out_dtype=o), lambda a, b: conv2d_reference(a, b, 1)),
    "conv2d 1x1": ((1, 16, 8, 8), (32, 16, 1, 1),
                   lambda x, w, o: R.nn.conv2d(x, w, out_dtype=o), lambda a, b: conv2d_reference(a, b, 0)),
}
# (data, weight, output) dtypes -> tolerance relative to the largest output (0: exact)
DTYPES = {
    ("int8", "int8", "int32"): 0, ("uint8", "int8", "int32"): 0, ("uint8", "uint8", "int32"): 0,
    ("float32", "float32", "float32"): 1e-6,
    ("float16", "float16", "float16"): 5e-3,  # float16 sums of up to 72 products (11-bit mantissa)
}


def _module(op: str, dtypes: tuple[str, str, str]) -> tvm.IRModule:
    data, weight, body, _ = OPS[op]
    return make_module({"x": (data, dtypes[0]), "w": (weight, dtypes[1])},
                       lambda bb, x, w: bb.emit(body(x, w, dtypes[2])))


@pytest.mark.parametrize("cpu", runnable_cpus())
def test_every_op_and_dtype_equals_numpy(cpu):
    def run(op, dtypes, a, b):
        return run_vm(compile_module(_module(op, dtypes), "llvm", cpu=cpu), [a, b])[0]

    assert not numpy_mismatches(OPS, DTYPES, run)


@pytest.mark.parametrize("cpu", cpus())
def test_every_cpu_compiles_each_op_with_its_gemms_scheduled(cpu):
    """On any host: each CPU's build vectorizes its matmuls for the CPU's own registers."""
    target = make_target("llvm", cpu)
    assert str(target.attrs["mcpu"]) == cpu and "mattr" not in target.attrs  # TVM 0.27 leaves nothing out
    for op in ("dense", "batch matmul"):
        for dtypes in DTYPES:
            executable = compile_module(_module(op, dtypes), "llvm", cpu=cpu)
            assert executable is not None
            with target:
                fused = tvm.transform.Sequential([*fusion_passes(target), default_schedules()])(_module(op, dtypes))
            gemms = [f for gv, f in fused.functions_items() if "matmul" in gv.name_hint]
            assert gemms and all(f.attrs.get("tirx.is_scheduled", False) for f in gemms), (op, dtypes)
