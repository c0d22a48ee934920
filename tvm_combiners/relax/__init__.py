"""Relax passes of tvm_combiners (apache-tvm >= 0.27)."""

from .passes import (
    CombineParallelBatchMatmul,
    CombineParallelConv2D,
    CombineParallelMatmul,
    CombineParallelOps,
    CombineSharedWeightMatmul,
)

__all__ = ["CombineParallelBatchMatmul", "CombineParallelConv2D", "CombineParallelMatmul", "CombineParallelOps",
           "CombineSharedWeightMatmul"]
