"""Collectives on host (numpy) buffers over MPI: the CPU path and the GPU path's host staging share them.

Each ``*_np`` function checks its shapes against the group, reduces what MPI cannot (float16,
bool, NaN-propagating max/min) in a wider copy, and writes the preallocated output.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..spec import REDUCTIONS
from .comm import Group, mpi

# dtypes MPI reduces natively; others (bool, float16, bfloat16, ...) are reduced in float32/int64
# copies: float16 summed in float16 overflowed where the mean fits (avg of 40000 on 2 ranks: inf), and
# MPI has no bfloat16 at all (MPI_SUM on its 16-bit words would add integers). The float32 result is
# rounded once to the dtype (ml_dtypes' cast: to nearest even), so every rank gets the same bits.
_NATIVE = {np.dtype(n) for n in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                                 "float32", "float64")}
#: MPI op per reduction, filled by :func:`mpi_op`: the allreduce fast path looks one up without a call.
MPI_OPS: dict[str, Any] = {}
_nan_ops: dict[tuple[str, np.dtype], Any] = {}


def builtin_reduction(op: str, dtype: np.dtype) -> bool:
    """Whether MPI's own reduction gives ``op``'s result on ``dtype``: not float min and max, where
    MPI keeps or drops a NaN depending on which rank's value it sees first (float16 on 2 ranks: two
    different results of one allreduce); StableHLO's minimum and maximum, like numpy's, propagate it."""
    return dtype in _NATIVE and (dtype.kind != "f" or op not in ("min", "max"))


def _nan_propagating(op: str, dtype: np.dtype) -> Any:
    """An MPI reduction for float min or max that propagates NaN (numpy's minimum / maximum)."""
    found = _nan_ops.get((op, dtype))
    if found is None:
        fn = np.minimum if op == "min" else np.maximum

        def reduce(inbuf: Any, inoutbuf: Any, _datatype: Any) -> None:
            acc = np.frombuffer(inoutbuf, dtype)
            fn(np.frombuffer(inbuf, dtype), acc, out=acc)

        # not commutative: MPI then applies it in rank order on every rank; as commutative, each rank
        # kept its own of two values that compare equal (-0.0 and 0.0): different bits per rank
        found = _nan_ops[(op, dtype)] = mpi().Op.Create(reduce, commute=False)
    return found


def mpi_op(op: str, name: str) -> Any:
    """The MPI reduction for ``op`` (avg reduces with SUM and divides afterwards)."""
    found = MPI_OPS.get(op)
    if found is None:
        if op not in REDUCTIONS:
            raise ValueError(f"{name}: unknown reduction {op!r}: expected one of {', '.join(REDUCTIONS)}")
        MPI = mpi()
        found = MPI_OPS[op] = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX, "avg": MPI.SUM}[op]
    return found


def check_shape(name: str, what: str, got: tuple[int, ...], want: tuple[int, ...]) -> None:
    if tuple(got) != tuple(want):
        raise ValueError(f"{name}: {what} has shape {tuple(got)}, expected {tuple(want)}")


def _norm_axis(name: str, axis: int, ndim: int) -> int:
    axis = int(axis)
    if not -ndim <= axis < ndim:
        raise ValueError(f"{name}: axis {axis} is out of range for a {ndim}-d tensor")
    return axis + ndim if axis < 0 else axis


def _reduce(name: str, comm: Any, op: str, send: np.ndarray, recv: np.ndarray, size: int, block: bool) -> None:
    """Allreduce (block=False) or Reduce_scatter_block (block=True), then avg's division."""
    mop = mpi_op(op, name)
    dtype = recv.dtype
    if op == "avg" and dtype.kind != "f" and "float" not in dtype.name:
        raise ValueError(f"{name}: reduction 'avg' needs a float dtype, got {dtype.name}")
    wide = dtype if dtype in _NATIVE else np.dtype(np.float32 if "float" in dtype.name else np.int64)
    if not builtin_reduction(op, wide):
        mop = _nan_propagating(op, wide)
    call = comm.Reduce_scatter_block if block else comm.Allreduce
    if wide == dtype:
        call(send, recv, mop)
        if op == "avg":
            recv /= size
        return
    acc = np.empty(recv.shape, wide)
    call(np.ascontiguousarray(send, dtype=wide), acc, mop)
    if op == "avg":
        acc /= size
    recv[...] = acc.astype(dtype) if dtype.kind != "b" else acc != 0


def allreduce_np(name: str, grp: Group, x: np.ndarray, op: str, out: np.ndarray) -> None:
    check_shape(name, "out", out.shape, x.shape)
    _reduce(name, grp.comm, op, x, out, grp.size, block=False)


def gathered_shape(name: str, shape: tuple[int, ...], axis: int, size: int) -> tuple[int, tuple[int, ...]]:
    """(axis, out's shape) of an allgather of ``shape`` over ``size`` members (checked on every device)."""
    axis = _norm_axis(name, axis, len(shape))
    return axis, shape[:axis] + (shape[axis] * size,) + shape[axis + 1:]


def scattered_shape(name: str, shape: tuple[int, ...], axis: int, size: int) -> tuple[int, tuple[int, ...]]:
    """(axis, out's shape) of a reduce_scatter of ``shape`` over ``size`` members (checked on every device)."""
    axis = _norm_axis(name, axis, len(shape))
    if shape[axis] % size:
        raise ValueError(f"{name}: axis {axis} has extent {shape[axis]}, not divisible by the group size {size}")
    return axis, shape[:axis] + (shape[axis] // size,) + shape[axis + 1:]


def allgather_np(name: str, grp: Group, x: np.ndarray, axis: int, out: np.ndarray) -> None:
    """Concatenate every group member's ``x`` along ``axis`` in group order."""
    MPI = mpi()
    g, shape = grp.size, x.shape
    axis, want = gathered_shape(name, shape, axis, g)
    check_shape(name, "out", out.shape, want)
    if math.prod(shape[:axis]) == 1:  # the gathered blocks are contiguous in out: gather in place
        grp.comm.Allgather([x, MPI.BYTE], [out, MPI.BYTE])
        return
    blocks = np.empty((g,) + shape, x.dtype)
    grp.comm.Allgather([x, MPI.BYTE], [blocks, MPI.BYTE])
    np.copyto(out.reshape(shape[:axis] + (g, shape[axis]) + shape[axis + 1:]), np.moveaxis(blocks, 0, axis))


def reduce_scatter_np(name: str, grp: Group, x: np.ndarray, op: str, axis: int, out: np.ndarray) -> None:
    """Reduce ``x`` over the group; the member at position i keeps chunk i along ``axis``."""
    g, shape = grp.size, x.shape
    axis, want = scattered_shape(name, shape, axis, g)
    chunk = want[axis]
    check_shape(name, "out", out.shape, want)
    if math.prod(shape[:axis]) != 1:  # bring the chunks to the front so that each is contiguous
        x = np.ascontiguousarray(np.moveaxis(x.reshape(shape[:axis] + (g, chunk) + shape[axis + 1:]), axis, 0))
    _reduce(name, grp.comm, op, x, out, g, block=True)


def broadcast_np(name: str, grp: Group, x: np.ndarray, out: np.ndarray) -> None:
    """Every member's ``out`` becomes the ``x`` of the group's first member."""
    check_shape(name, "out", out.shape, x.shape)
    if grp.position == 0:
        np.copyto(out, x)
    grp.comm.Bcast([out, mpi().BYTE], root=0)


def scatter_np(name: str, grp: Group, x: np.ndarray, out: np.ndarray) -> None:
    """The group's first member sends ``x[i]`` to the member at position i."""
    check_shape(name, "x", x.shape[:1], (grp.size,))
    check_shape(name, "out", out.shape, x.shape[1:])
    MPI = mpi()
    grp.comm.Scatter([x, MPI.BYTE] if grp.position == 0 else None, [out, MPI.BYTE], root=0)
