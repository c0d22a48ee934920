"""Relay passes of tvm_combiners (TVM builds that still have Relay: upstream <= 0.19, hhb-tvm).

Importing this package where TVM has no Relay (apache-tvm >= 0.20) raises an ImportError that
names the environment to use.
"""

try:
    from tvm import relay as _relay  # noqa: F401
except ImportError as _err:  # apache-tvm 0.27 has Relax only
    import tvm as _tvm

    raise ImportError(
        f"tvm_combiners.relay needs a TVM build with Relay (upstream <= 0.19 or hhb-tvm, as in the .venv-relay "
        f"environment: make test-relay); this TVM {_tvm.__version__} has Relax only, use tvm_combiners.relax"
    ) from _err

from .passes import (  # noqa: E402
    CombineParallelBatchMatmul,
    CombineParallelConv2D,
    CombineParallelDense,
    CombineParallelOps,
    CombineSharedWeightDense,
)

__all__ = ["CombineParallelBatchMatmul", "CombineParallelConv2D", "CombineParallelDense", "CombineParallelOps",
           "CombineSharedWeightDense"]
