"""The collectives runtime: MPI for host tensors, NCCL for cuda tensors, and the N-rank launcher.

Importing it registers the global packed functions that the Relax and Relay ops lower to
(``tvm_combiners.allreduce``, ``.allgather``, ``.reduce_scatter``, ``.send``, ``.recv``) and
re-registers TVM's ``runtime.disco.*`` built-ins so that ``R.ccl`` modules run on it too.  MPI starts
on the first call; nothing else needs calling first.
"""

from .comm import rank, world_size
from .disco import register_overrides
from .functions import register_all
from .native import register_fallback

register_all()
register_fallback()
register_overrides()


def __getattr__(name: str):
    # imported on first use: ``python -m tvm_combiners.collectives.runtime.launcher`` must not find its
    # own module imported already (runpy warns about that)
    if name == "launch":
        from .launcher import launch

        return launch
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["launch", "rank", "world_size"]
