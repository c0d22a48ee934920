"""The collective ops of Relay (TVM builds that still have Relay) and their combiners: ``from tvm_combiners.collectives import relay as C``.

:mod:`.ops` builds, registers, type-checks and lowers the ops; :mod:`.combiners` holds the passes
that merge many small ones into few large ones (they build the ops, so they import :mod:`.ops`).
"""

from .combiners import (
    AllGatherCombiner,
    AllReduceCombiner,
    CombineCollectives,
    ReduceScatterCombiner,
    SendRecvCombiner,
)
from .ops import (
    OrderSendRecv,
    after_all,
    allgather,
    allreduce,
    info,
    is_collective,
    recv,
    reduce_scatter,
    send,
    token,
)

__all__ = [
    "allreduce",
    "allgather",
    "reduce_scatter",
    "send",
    "recv",
    "after_all",
    "token",
    "info",
    "is_collective",
    "OrderSendRecv",
    "AllReduceCombiner",
    "AllGatherCombiner",
    "ReduceScatterCombiner",
    "SendRecvCombiner",
    "CombineCollectives",
]
