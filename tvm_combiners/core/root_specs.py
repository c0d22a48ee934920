"""Per-family rules: when a matmul or conv2d can be a combined root, and how it concatenates.

Adapters read attributes off their IR and call these; the rules themselves exist once.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from .graph import Dim, RootInfo


def matmul_root(
    family: str,
    data: Sequence[Dim] | None,
    weight: Sequence[Dim] | None,
    out: Sequence[Dim] | None,
    weight_transposed: bool,
    key: Hashable,
) -> RootInfo | None:
    """``data @ weight`` (weight ``[..., K, N]``, or ``[..., N, K]`` when transposed).

    Branches concatenate weights along N and split the output's last axis. ``family`` is
    ``matmul``/``dense`` for 2-D weights and ``batch_matmul`` for batched ones of equal batch.
    """
    if data is None or weight is None or out is None or len(data) < 1 or len(weight) < 2:
        return None
    if (len(weight) == 2) != (family != "batch_matmul"):
        return None
    n_axis, k_axis = (len(weight) - 2, len(weight) - 1) if weight_transposed else (len(weight) - 1, len(weight) - 2)
    if data[-1] != weight[k_axis]:
        return None
    full_key = (family, key, weight_transposed, weight[k_axis], tuple(weight[:-2]), len(data))
    stack = None
    if family != "batch_matmul" and len(data) >= 2:
        stack = "new"  # [..., M, K] x [K, N] branches become one [n, ..., M, N] broadcast matmul
    elif family == "batch_matmul" and len(weight) == len(data) == 3 and weight[0] == data[0] == 1:
        stack = "batch"
    return RootInfo(family, 0, 1, full_key, len(out) - 1, n_axis, weight[n_axis], stack=stack)


def conv2d_root(
    data_layout: str,
    kernel_layout: str,
    out_layout: str,
    weight: Sequence[Dim] | None,
    out: Sequence[Dim] | None,
    padding: Sequence[int],
    strides: Sequence[int],
    dilation: Sequence[int],
    groups: int,
    key: Hashable,
) -> RootInfo | None:
    """A plain 2-D convolution (groups == 1, unpacked layouts); ``padding`` is 1, 2 or 4 ints.

    Output channels concatenate; kernels of different sizes are aligned later by zero padding,
    so the key holds only what must match exactly (layouts, strides, dilation, input channels).
    """
    if groups != 1 or weight is None or out is None:
        return None
    if sorted(data_layout) != sorted("NCHW") or sorted(out_layout) != sorted("NCHW") or sorted(kernel_layout) != sorted("OIHW"):
        return None  # packed layouts (NCHW4c, ...) are left alone
    h, w = kernel_layout.index("H"), kernel_layout.index("W")
    if w < h:
        # WHIO, OIWH: TVM 0.27 lowers these kernels as if H came first (its types say otherwise), so
        # a 3x1 branch is already wrong, and padding a correct 1x1 sibling into it would make that wrong too
        return None
    kh, kw = weight[h], weight[w]
    if not isinstance(kh, int) or not isinstance(kw, int) or not isinstance(weight[kernel_layout.index("O")], int):
        return None
    pad = [int(p) for p in padding]
    top, left, bottom, right = pad * 4 if len(pad) == 1 else pad * 2 if len(pad) == 2 else pad
    (sh, sw), (dh, dw) = strides, dilation
    full_key = ("conv2d", key, data_layout, kernel_layout, out_layout, (sh, sw), (dh, dw), weight[kernel_layout.index("I")])
    return RootInfo(
        "conv2d", 0, 1, full_key,
        out_axis=out_layout.index("C"),
        weight_axis=kernel_layout.index("O"),
        width=weight[kernel_layout.index("O")],
        kernel=((kh, top, bottom, dh, sh), (kw, left, right, dw, sw)),
        kernel_axes=(h, w),
    )
