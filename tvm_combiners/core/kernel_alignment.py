"""Zero-padding convolution kernels of different sizes so one convolution computes them all.

Along one spatial axis a branch with kernel ``k``, padding ``(before, after)`` and dilation ``d``
reads input rows ``i*s - before + r*d`` for ``r < k``. Padding its kernel with ``a`` zero taps in
front and enlarging the input padding to ``before + a*d`` reads the same rows with the same
weights, so the output is unchanged; the output length is unchanged when the padding after grows
by the number of zero taps behind times ``d``. A set of branches aligns when one shared
``(before, after)`` pair works for all of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

#: (kernel size, pad before, pad after, dilation, stride) along one spatial axis.
AxisKernel = tuple[int, int, int, int, int]


@dataclass(frozen=True)
class KernelAlignment:
    """Combined kernel sizes and paddings, and how many zero taps each branch gets per axis."""

    sizes: tuple[int, ...]
    padding: tuple[tuple[int, int], ...]  # per spatial axis: (before, after)
    weight_pads: tuple[tuple[tuple[int, int], ...], ...]  # per branch, per axis: (front, back)

    @property
    def pads_any(self) -> bool:
        return any(p != (0, 0) for branch in self.weight_pads for p in branch)


def align_kernels(kernels: Sequence[Sequence[AxisKernel]]) -> KernelAlignment | None:
    """Return a shared padding for all branches, or None when no zero padding can align them."""
    if not kernels:
        return None
    naxes = len(kernels[0])
    sizes: list[int] = []
    padding: list[tuple[int, int]] = []
    per_axis_pads: list[list[tuple[int, int]]] = []
    for axis in range(naxes):
        column = [branch[axis] for branch in kernels]
        dilation, stride = column[0][3], column[0][4]
        if any(c[3] != dilation or c[4] != stride for c in column):
            return None
        # The output length depends on before + after - dilation*(k-1); it must agree exactly.
        spans = {c[1] + c[2] - dilation * (c[0] - 1) for c in column}
        if len(spans) != 1:
            return None
        size = max(c[0] for c in column)
        before = max(c[1] for c in column)
        pads: list[tuple[int, int]] = []
        for k, b, _a, _, _ in column:
            shift, rem = divmod(before - b, dilation)
            if rem or shift > size - k:
                return None
            pads.append((shift, size - k - shift))
        after = column[0][2] + pads[0][1] * dilation
        sizes.append(size)
        padding.append((before, after))
        per_axis_pads.append(pads)
    weight_pads = tuple(tuple(per_axis_pads[ax][br] for ax in range(naxes)) for br in range(len(kernels)))
    return KernelAlignment(tuple(sizes), tuple(padding), weight_pads)
