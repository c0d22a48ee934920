"""What may combine and how the combined buffer is laid out, once for both IRs.

A combiner is a key (ops with equal keys may share one collective) and a pack plan (where each op's
data lies in the one flat buffer the combined collective moves). The Relax and Relay adapters
only read these and emit IR.

Layouts (``n`` = group size, op ``i`` has operand shape ``P_i x A_i x Q_i`` around its axis):

- allreduce, send/recv: every operand flattened, one after the other; each result is a
  contiguous slice of the reduced (received) buffer.
- reduce_scatter: the input is ``n`` blocks, one per destination rank; block ``r`` holds, op after
  op, the chunk ``r`` of each operand (``x_i[:, r*C_i:(r+1)*C_i, :]``, ``C_i = A_i / n``). One
  reduce_scatter along axis 0 hands rank ``r`` exactly block ``r``: every result is a contiguous
  slice of it. Exact on any axis, so ``combine_by_dim=False`` needs no transposes.
- allgather: operands flattened one after the other (one block per rank); after one gather along
  axis 0 the result of op ``i`` is, per rank ``r``, the slice of block ``r``: the unpack reorders
  ``(n, P_i, A_i, Q_i) -> (P_i, n, A_i, Q_i)``. Exact on any axis, again without transposes.

Mixed dtypes share a buffer only where bytes move unchanged (allgather, send/recv): the buffer is
then ``uint8`` and each segment starts at a multiple of 8 bytes, so every op's data stays aligned.
A reduction never mixes dtypes (the key holds the dtype). bfloat16 never shares a buffer with
another dtype either: a combined op of bfloat16 stays bfloat16, which the runtime reduces in
float32 and Relay hands over as words it knows to be bfloat16 (a uint8 buffer would hide it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass

from ..spec import SUPPORTED_DTYPES, CollectiveSpec

#: XLA's GPU defaults (30 MiB + 7 bytes, 256 ops per combined collective).
DEFAULT_THRESHOLD_BYTES = 30 * 2**20 + 7
DEFAULT_THRESHOLD_COUNT = 256
#: Segments of a mixed-dtype buffer start at multiples of this many bytes.
ALIGN_BYTES = 8

PASS_KINDS = ("allreduce", "allgather", "reduce_scatter", "send_recv")


def itemsize(dtype: str) -> int:
    """Bytes per element of a supported collective dtype (``float16``, ``bfloat16`` .. ``float64``, ints)."""
    if dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"collective combiners: dtype {dtype} cannot be packed; expected one of {', '.join(SUPPORTED_DTYPES)}")
    return int(dtype.lstrip("abcdefghijklmnopqrstuvwxyz")) // 8  # the bits after the name


def _apart(dtype: str | None) -> tuple[str, ...]:
    """What a moving op's key adds so that bfloat16 combines only with bfloat16 (module docstring)."""
    return (dtype,) if dtype == "bfloat16" else ()


def collective_key(spec: CollectiveSpec, dtype: str, combine_by_dim: bool = True) -> Hashable:
    """Key of an allreduce, allgather or reduce_scatter of ``dtype``: equal keys may combine.

    Reduction, groups and (for reductions) the dtype always matter; the axis only with
    ``combine_by_dim`` (the layouts above are exact on any axis). Allgather moves bytes unchanged,
    so mixed dtypes share one gather.
    """
    if spec.kind == "allreduce":
        return ("allreduce", spec.op, spec.groups, dtype)
    if spec.kind == "allgather":
        return ("allgather", spec.groups, spec.axis if combine_by_dim else None, *_apart(dtype))
    if spec.kind == "reduce_scatter":
        return ("reduce_scatter", spec.op, spec.groups, dtype, spec.axis if combine_by_dim else None)
    raise ValueError(f"collective_key: {spec.kind} is not an allreduce, allgather or reduce_scatter")


def ccl_key(op_name: str, attrs: dict, dtype: str) -> Hashable:
    """Key of TVM's own ``R.ccl.allreduce`` / ``R.ccl.allgather`` (gather along axis 0)."""
    if op_name == "ccl.allreduce":
        return ("ccl.allreduce", str(attrs["op_type"]), bool(attrs["in_group"]), dtype)
    return ("ccl.allgather", int(attrs["num_workers"]), bool(attrs["in_group"]), *_apart(dtype))


def transfer_key(spec: CollectiveSpec, dtype: str | None = None) -> Hashable:
    """Key of a send or recv of ``dtype``: transfers with the same pairs and channel type may travel
    as one (bfloat16 only with bfloat16)."""
    return ("transfer", spec.pairs, spec.is_host_transfer, *_apart(dtype))


def pass_kind_of_key(key: Hashable) -> str:
    """Which public pass combines ops of this key (``CombineCollectives`` selects by it)."""
    head = key[0]  # type: ignore[index]
    if head == "transfer":
        return "send_recv"
    return str(head).removeprefix("ccl.")


@dataclass(frozen=True)
class Segment:
    """One op's place in the combined buffer.

    ``shape``/``dtype``: the operand (payload); ``axis`` the gathered/scattered axis (0 otherwise);
    ``outer``, ``extent``, ``inner``: ``P``, ``A``, ``Q`` around it; ``offset``: start within one
    rank's block in elements of ``dtype`` (a byte offset / itemsize); ``chunk``: the elements of
    this op in one block; ``result_shape``: the op's own result.
    """

    shape: tuple[int, ...]
    dtype: str
    axis: int
    outer: int
    extent: int
    inner: int
    offset: int
    chunk: int
    result_shape: tuple[int, ...]

    @property
    def size(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class PackPlan:
    """The layout of one combined collective (see the module docstring).

    ``flat_dtype``: the buffer's dtype (``uint8`` when dtypes mix); ``block``: elements of
    ``flat_dtype`` per rank block; ``blocks_in``/``blocks_out``: blocks in the packed input and
    in the combined result (reduce_scatter: n -> 1, allgather: 1 -> n, others 1 -> 1).
    """

    kind: str
    flat_dtype: str
    block: int
    blocks_in: int
    blocks_out: int
    segments: tuple[Segment, ...]

    @property
    def in_len(self) -> int:
        return self.block * self.blocks_in

    @property
    def out_len(self) -> int:
        return self.block * self.blocks_out

    @property
    def mixed(self) -> bool:
        return self.flat_dtype == "uint8" and any(s.dtype != "uint8" for s in self.segments)

    def stride(self, seg: Segment) -> int:
        """One rank block, in elements of ``seg.dtype``."""
        return self.block * itemsize(self.flat_dtype) // itemsize(seg.dtype)

    def run_offset(self, seg: Segment) -> int | None:
        """The byte offset of ``seg``'s result in the combined result, where that result is one run
        of it; None where the ranks' blocks interleave it (an allgather over several ranks)."""
        return seg.offset * itemsize(seg.dtype) if self.blocks_out == 1 else None

    def operand_offset(self, seg: Segment) -> int | None:
        """The byte offset of ``seg``'s operand in the packed input, where it is one run of it;
        None where it is split over the ranks' blocks (a reduce_scatter over several ranks)."""
        return seg.offset * itemsize(seg.dtype) if self.blocks_in == 1 else None

    @property
    def total_bytes(self) -> int:
        return sum(s.size * itemsize(s.dtype) for s in self.segments)


def plan_pack(kind: str, operands: Sequence[tuple[Sequence[int], str, int]], group_size: int = 1) -> PackPlan:
    """Plan one combined op of ``kind`` (allreduce, allgather, reduce_scatter, send_recv).

    ``operands``: per op ``(shape, dtype, axis)`` with static ints; ``group_size``: ranks per
    group (allgather, reduce_scatter).
    """
    n = group_size if kind in ("allgather", "reduce_scatter") else 1
    dtypes = {dtype for _, dtype, _ in operands}
    mixed = len(dtypes) > 1
    if mixed and kind in ("allreduce", "reduce_scatter"):
        raise ValueError(f"{kind}: combined ops must share one dtype (got {', '.join(sorted(dtypes))}); a reduction never mixes")
    flat_dtype = "uint8" if mixed else next(iter(dtypes))
    segments: list[Segment] = []
    cursor = 0  # bytes into one block
    for shape, dtype, axis in operands:
        shape = tuple(int(d) for d in shape)
        axis = axis if shape else 0
        outer, extent, inner = (math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1 :])) if shape else (1, 1, 1)
        size = math.prod(shape)
        if kind == "reduce_scatter":
            if extent % n:
                raise ValueError(f"reduce_scatter: axis {axis} of extent {extent} is not divisible by the group size {n}")
            chunk = size // n
            result = shape[:axis] + (extent // n,) + shape[axis + 1 :]
        elif kind == "allgather":
            chunk = size
            result = shape[:axis] + (extent * n,) + shape[axis + 1 :] if shape else (n,)
        else:
            chunk, result = size, shape
        width = itemsize(dtype)
        if mixed:
            cursor = -(-cursor // ALIGN_BYTES) * ALIGN_BYTES
        segments.append(Segment(shape, dtype, axis, outer, extent, inner, cursor // width, chunk, result))
        cursor += chunk * width
    if mixed:
        cursor = -(-cursor // ALIGN_BYTES) * ALIGN_BYTES
    block = cursor // itemsize(flat_dtype)
    blocks_in, blocks_out = {"reduce_scatter": (n, 1), "allgather": (1, n)}.get(kind, (1, 1))
    return PackPlan(kind, flat_dtype, block, blocks_in, blocks_out, tuple(segments))


def renumber_channels(used: Sequence[int], count: int) -> list[int]:
    """``count`` fresh channel ids, the smallest ones no op uses, in program order.

    Every rank runs the same program, so assigning them in program order renumbers consistently
    on every rank without any communication.
    """
    from ..spec import MAX_CHANNEL_ID

    taken = set(used)
    fresh: list[int] = []
    candidate = 0
    while len(fresh) < count:
        if candidate > MAX_CHANNEL_ID:
            raise ValueError(f"SendRecvCombiner: no free channel_id left in [0, {MAX_CHANNEL_ID}] for a combined transfer")
        if candidate not in taken:
            fresh.append(candidate)
        candidate += 1
    return fresh


class ChannelBook:
    """A module's channel ids: fresh ones for combined transfers, and the ones shared by functions.

    Fresh ids are the smallest unused ones, handed out in program order: every rank runs the same
    program and the passes are deterministic, so every rank renumbers alike without talking. A
    channel that two functions use (``main`` sending on 0 around a call to a function that also
    sends and receives on 0) pairs its messages across them first in, first out, which neither
    function's matching sees: moving one function's transfer to a fresh channel would hand the
    other's recv a different payload, so transfers on a shared channel never combine.
    """

    def __init__(self, per_function: Callable[[], Iterable[Iterable[int]]]) -> None:
        """``per_function`` gives each function's channel ids when first needed (Relax walks the
        module only then; Relay reads its one walk of the module's transfers)."""
        self._read = per_function
        self._books: tuple[set[int], frozenset[int]] | None = None

    def _book(self) -> tuple[set[int], frozenset[int]]:
        if self._books is None:
            used: set[int] = set()
            shared: set[int] = set()
            for channels in self._read():
                mine = set(channels)
                shared |= used & mine
                used |= mine
            self._books = used, frozenset(shared)
        return self._books

    @property
    def shared(self) -> frozenset[int]:
        return self._book()[1]

    def take(self) -> int:
        used = self._book()[0]
        (channel,) = renumber_channels(sorted(used), 1)
        used.add(channel)
        return channel
