"""Failures the differential fuzzer (tests/fuzz) found, minimized into hand-written modules.

Each test names the fuzz finding it pins (see /work/notes/fuzz_findings.md for the log) and
asserts the correct behaviour: op counts and equal outputs against the unoptimized module.
"""

import numpy as np
from helpers import R, assert_same_outputs, make_module, ops, random_inputs
from tvm import relax

from tvm_combiners.relax import CombineParallelMatmul

F32 = "float32"


def _const(shape, seed):
    return relax.const(np.random.default_rng(seed).standard_normal(shape).astype(F32))


def test_layer_norm_inputs_over_the_same_operands_in_another_order_stay_apart():
    """Fuzz finding 1 (pre-fix code): ``layer_norm(a, a, b)`` beside ``layer_norm(a, b, a)``.

    Both have the operand set {a, b} in the same first-seen order, so a key built from the
    deduplicated operands made them one input and the second matmul read the first one's input.
    """

    def body(bb, base, a, b):
        first = bb.emit(R.add(base, bb.emit(R.nn.layer_norm(a, a, b, axes=[-1]))))
        second = bb.emit(R.add(base, bb.emit(R.nn.layer_norm(a, b, a, axes=[-1]))))
        again = bb.emit(R.add(base, bb.emit(R.nn.layer_norm(a, a, b, axes=[-1]))))  # equal to ``first``
        return [bb.emit(R.matmul(x, _const((6, n), n))) for x, n in ((first, 2), (second, 3), (again, 4))]

    mod = make_module({"base": ((3, 6), F32), "a": ((6,), F32), "b": ((6,), F32)}, body)
    new = CombineParallelMatmul()(mod)
    assert ops(mod, "matmul") == 3 and ops(new, "matmul") == 2  # only the two equal inputs combine
    assert_same_outputs(mod, new, random_inputs(mod), atol=1e-4)

