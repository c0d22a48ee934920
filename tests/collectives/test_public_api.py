"""The names issue 9 and 10 promise, importable where users look for them."""

import tvm

from tvm_combiners.collectives import relax as C
from tvm_combiners.collectives.relax import combiners

PASSES = ("AllReduceCombiner", "AllGatherCombiner", "ReduceScatterCombiner", "SendRecvCombiner", "CombineCollectives")


def test_ops_and_combiners_from_collectives_relax():
    for name in ("allreduce", "allgather", "reduce_scatter", "send", "recv", "after_all", "OrderSendRecv", *PASSES):
        assert name in C.__all__ and hasattr(C, name)
    for name in PASSES:
        assert getattr(C, name) is getattr(combiners, name)
        made = getattr(C, name)()
        assert isinstance(made, tvm.transform.Pass) and made.info.name == name
