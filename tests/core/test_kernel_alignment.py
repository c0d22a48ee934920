"""Zero-padding kernels: checked against a direct 1-D convolution in numpy, exhaustively."""

import itertools

import numpy as np

from tvm_combiners.core.kernel_alignment import align_kernels


def conv1d(x, w, before, after, dilation, stride):
    padded = np.concatenate([np.zeros(before), x, np.zeros(after)])
    span = dilation * (len(w) - 1) + 1
    return np.array([
        sum(padded[i + r * dilation] * w[r] for r in range(len(w)))
        for i in range(0, len(padded) - span + 1, stride)
    ])


def test_every_alignment_found_is_exact_and_every_miss_is_real():
    rng = np.random.default_rng(0)
    x = rng.standard_normal(9)
    configs = [(k, b, a) for k in (1, 2, 3, 5) for b in range(4) for a in range(4)]
    found = 0
    for dilation, stride in itertools.product((1, 2), (1, 2)):
        for (k1, b1, a1), (k2, b2, a2) in itertools.combinations(configs, 2):
            result = align_kernels([[(k1, b1, a1, dilation, stride)], [(k2, b2, a2, dilation, stride)]])
            if result is None:
                continue
            found += 1
            (before, after), size = result.padding[0], result.sizes[0]
            for (k, b, a), pads in zip(((k1, b1, a1), (k2, b2, a2)), result.weight_pads):
                w = rng.standard_normal(k)
                padded_w = np.pad(w, pads[0])
                assert len(padded_w) == size
                np.testing.assert_allclose(conv1d(x, padded_w, before, after, dilation, stride),
                                           conv1d(x, w, b, a, dilation, stride), atol=1e-12)
    assert found > 100


def test_same_padding_kernels_align_centered():
    result = align_kernels([[(1, 0, 0, 1, 1)] * 2, [(3, 1, 1, 1, 1)] * 2, [(5, 2, 2, 1, 1)] * 2])
    assert result.sizes == (5, 5)
    assert result.padding == ((2, 2), (2, 2))
    assert result.weight_pads == (((2, 2), (2, 2)), ((1, 1), (1, 1)), ((0, 0), (0, 0)))


def test_rejections():
    assert align_kernels([[(1, 0, 0, 1, 1)], [(3, 0, 0, 1, 1)]]) is None  # output sizes differ
    assert align_kernels([[(1, 0, 0, 1, 1)], [(1, 0, 0, 1, 2)]]) is None  # strides differ
    assert align_kernels([[(1, 3, 0, 1, 1)], [(3, 0, 5, 1, 1)]]) is None  # tap outside the window
    assert align_kernels([]) is None
