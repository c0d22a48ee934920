"""Relax passes of tvm_combiners (apache-tvm >= 0.27)."""

from .passes import (
    CombineParallelBatchMatmul,
    CombineParallelConv2D,
    CombineParallelMatmul,
    CombineParallelOps,
)

__all__ = ["CombineParallelBatchMatmul", "CombineParallelConv2D", "CombineParallelMatmul", "CombineParallelOps"]
