"""The collective ops of Relax (apache-tvm 0.27) and their combiners: ``from tvm_combiners.collectives import relax as C``.

:mod:`.ops` builds, registers, type-checks and lowers the ops; :mod:`.combiners` holds the passes
that merge many small ones into few large ones (they build the ops, so they import :mod:`.ops`);
:mod:`.distributed` compiles modules sharded with TVM's ``relax.distributed`` for ranks
(:func:`~.distributed.distributed_pipeline`), with :mod:`.dist_combiners` combining their parameter
transfers.
"""

from .combiners import (
    AllGatherCombiner,
    AllReduceCombiner,
    CombineCollectives,
    ReduceScatterCombiner,
    SendRecvCombiner,
)
from .distributed import distributed_pipeline
from .ops import (
    OrderSendRecv,
    after_all,
    allgather,
    allreduce,
    info,
    is_collective,
    pipeline,
    recv,
    reduce_scatter,
    send,
    token,
)

__all__ = [
    "distributed_pipeline",
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
    "pipeline",
]
