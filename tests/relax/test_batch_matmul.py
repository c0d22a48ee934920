"""CombineParallelBatchMatmul: batched weights of equal batch, with followers."""

import numpy as np
from helpers import R, assert_same_outputs, make_module, ops, random_inputs
from tvm import relax

from tvm_combiners.relax import CombineParallelBatchMatmul, CombineParallelMatmul

F32 = "float32"


def test_batched_weights_combine_with_bias():
    def body(bb, x, w0, w1, w2):
        outs = []
        for i, w in enumerate((w0, w1, w2)):
            y = bb.emit(R.matmul(x, w))
            bias = relax.const(np.arange(w.ty.shape.values[-1].value, dtype=F32) * (i + 1))
            outs.append(bb.emit(R.nn.relu(bb.emit(R.add(y, bias)))))
        return outs

    mod = make_module({"x": ((4, 3, 8), F32), "w0": ((4, 8, 2), F32), "w1": ((4, 8, 5), F32),
                       "w2": ((4, 8, 3), F32)}, body)
    for combine in (CombineParallelBatchMatmul(), CombineParallelMatmul()):  # TVM's CombineParallelMatmul does too
        new = combine(mod)
        assert ops(new, "matmul") == 1 and ops(new, "add") == 1 and ops(new, "nn.relu") == 1
        assert_same_outputs(mod, new, random_inputs(mod))


def test_rhs_batched_as_tvms_combine_parallel_matmul():
    """TVM's own test_rhs_batched, smaller: of (2, K, N), (K, N), (2, K, N), (3, 4, K, N) weights over
    one 2-D input, the two of batch 2 combine (CombineParallelMatmul left all four)."""
    def body(bb, x, w0, w1, w2, w3):
        return [bb.emit(R.matmul(x, w)) for w in (w0, w1, w2, w3)]

    mod = make_module({"x": ((16, 8), F32), "w0": ((2, 8, 8), F32), "w1": ((8, 8), F32), "w2": ((2, 8, 8), F32),
                       "w3": ((3, 4, 8, 8), F32)}, body)
    seen = []
    new = CombineParallelMatmul(on_combine=seen.append)(mod)
    assert ops(new, "matmul") == 3 and [(c.family, c.weight_shapes) for c in seen] == [("batch_matmul", ((2, 8, 8),) * 2)]
    assert_same_outputs(mod, new, random_inputs(mod))


def test_different_batch_not_combined():
    def body(bb, x, w0, w1):
        return [bb.emit(R.matmul(x, w0)), bb.emit(R.matmul(x, w1))]

    mod = make_module({"x": ((4, 3, 8), F32), "w0": ((4, 8, 2), F32), "w1": ((1, 8, 2), F32)}, body)
    assert ops(CombineParallelBatchMatmul()(mod), "matmul") == 2
