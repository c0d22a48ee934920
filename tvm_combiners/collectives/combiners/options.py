"""Options and reports shared by the Relax and Relay combiner passes (validated once, here)."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from .keys import DEFAULT_THRESHOLD_BYTES, DEFAULT_THRESHOLD_COUNT, PASS_KINDS, pass_kind_of_key

#: ``max_op_bytes="auto"``: the largest op worth packing. Packing copies every byte once or twice
#: (the pack; the unpack in Relay, and in Relax of the results it cannot read in place) to save one
#: collective's latency (~5 us on CPU MPI, ~10 us on NCCL): on CPU that pays only for small ops
#: (break-even between 64 and 128 KiB an op: ``bench_collective_combiners.py``, docs/benchmarks.md);
#: GPU copies run at TB/s, so much larger ops still gain.
AUTO_MAX_OP_BYTES_CPU = 64 << 10
AUTO_MAX_OP_BYTES_GPU = 8 << 20


@dataclass(frozen=True)
class CombineReport:
    """One combined collective, handed to ``on_combine``.

    ``kind``: allreduce, allgather, reduce_scatter, send_recv (or ``ccl.allreduce`` /
    ``ccl.allgather`` for TVM's own ops); ``num_ops``: ops (transfers, for send_recv) it replaces;
    ``nbytes``: payload bytes per rank; ``key``: what they agreed on.
    """

    kind: str
    num_ops: int
    nbytes: int
    key: Hashable

    def describe(self) -> str:
        return f"{self.num_ops} x {self.kind} -> 1 ({self.nbytes} bytes)"


#: Pass name -> the op families it combines.
PASS_FAMILIES: dict[str, tuple[str, ...]] = {
    "AllReduceCombiner": ("allreduce",),
    "AllGatherCombiner": ("allgather",),
    "ReduceScatterCombiner": ("reduce_scatter",),
    "SendRecvCombiner": ("send_recv",),
    "CombineCollectives": PASS_KINDS,
    "BroadcastScatterCombiner": ("broadcast_from_worker0", "scatter_from_worker0"),  # R.ccl's, from LowerDistIR
}


@dataclass(frozen=True)
class CombinerOptions:
    pass_name: str
    families: tuple[str, ...]
    threshold_bytes: int
    threshold_count: int
    combine_by_dim: bool
    on_combine: Callable[[CombineReport], Any] | None
    max_op_bytes: int | str | None = "auto"

    def op_cap(self) -> int | None:
        """The largest op to combine (None: no cap); ``auto`` reads the target being compiled for."""
        if self.max_op_bytes != "auto":
            return self.max_op_bytes  # type: ignore[return-value]
        try:
            import tvm

            target = tvm.target.Target.current(allow_none=True)
        except Exception:  # noqa: BLE001 - no target context: assume the CPU
            target = None
        gpu = target is not None and "gpu" in [str(k) for k in target.keys]
        return AUTO_MAX_OP_BYTES_GPU if gpu else AUTO_MAX_OP_BYTES_CPU

    @property
    def enabled(self) -> bool:
        return self.threshold_bytes > 0 and self.threshold_count >= 2  # a group needs two ops

    def combines(self, family: str, key: Hashable) -> bool:
        """Whether this pass combines an op of ``family`` and ``key`` (sends and recvs: send_recv)."""
        kind = "send_recv" if family in ("send", "recv") else pass_kind_of_key(key)
        return kind in self.families

    def report(self, kind: str, num_ops: int, nbytes: int, key: Hashable) -> None:
        if self.on_combine is not None:
            self.on_combine(CombineReport(kind, num_ops, nbytes, key))


def make_options(
    pass_name: str,
    threshold_bytes: Any = DEFAULT_THRESHOLD_BYTES,
    threshold_count: Any = DEFAULT_THRESHOLD_COUNT,
    on_combine: Any = None,
    combine_by_dim: Any = True,
    max_op_bytes: Any = "auto",
) -> CombinerOptions:
    """Validated options; every message names the pass, the option and the rule."""
    for name, value in (("threshold_bytes", threshold_bytes), ("threshold_count", threshold_count)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{pass_name}: {name} must be an int (<= 0 disables the pass), got {type(value).__name__} {value!r}")
    if not isinstance(combine_by_dim, bool):
        raise TypeError(f"{pass_name}: combine_by_dim must be a bool, got {type(combine_by_dim).__name__} {combine_by_dim!r}")
    if on_combine is not None and not callable(on_combine):
        raise TypeError(f"{pass_name}: on_combine must be callable or None, got {type(on_combine).__name__}")
    if max_op_bytes != "auto" and max_op_bytes is not None and (
            isinstance(max_op_bytes, bool) or not isinstance(max_op_bytes, int) or max_op_bytes <= 0):
        raise TypeError(f"{pass_name}: max_op_bytes must be 'auto', None (no cap) or an int > 0, got {max_op_bytes!r}")
    return CombinerOptions(pass_name, PASS_FAMILIES[pass_name], threshold_bytes, threshold_count, combine_by_dim,
                           on_combine, max_op_bytes)
