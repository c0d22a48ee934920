"""Collectives on cuda tensors: NCCL through nccl4py, or host-staged MPI where NCCL cannot run.

One NCCL communicator per replica group, bootstrapped over that group's MPI communicator (rank 0
makes the unique id, MPI broadcasts it) and driven on TVM's current CUDA stream, so the collective
is ordered after the kernels that produced its input.  NCCL refuses two ranks on one GPU, and
nccl4py may be missing: then the group's ranks copy to host, use MPI and copy back, and the group's
first rank says so once on stderr.  The choice is made from every member's facts gathered over MPI,
so all members always take the same path (a split decision would deadlock).

NCCL serves a reduction only where it computes what the host path does (:func:`_nccl_reduces`);
the rest is staged, as are empty tensors. Float ``avg`` is NCCL's own: it scales each input by
1/n before summing, so with a group size that is not a power of two it may differ from the host
path's sum-then-divide in the last bit (as any two summation orders do).
"""

from __future__ import annotations

import math
import os
import socket
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from . import tensors
from .comm import Group
from .host_collectives import (
    allgather_np,
    allreduce_np,
    broadcast_np,
    builtin_reduction,
    check_shape,
    gathered_shape,
    reduce_scatter_np,
    scattered_shape,
)

# dtypes NCCL reduces and moves that a CUDA Array Interface can name; anything else (int16, bool, ...)
# is staged through host memory. bfloat16 is named by its name (see _Array).
NCCL_DTYPES = frozenset({"int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "bfloat16", "float32",
                         "float64"})


def gpu_identity(device_id: int, host: str | None = None, visible: str | None = None) -> tuple[str, str]:
    """(host, physical GPU) of a device index: its PCI bus id, as NCCL itself tells GPUs apart (one
    rank may name a GPU by index and another by UUID in CUDA_VISIBLE_DEVICES); without cuda.core,
    the CUDA_VISIBLE_DEVICES entry."""
    host = socket.gethostname() if host is None else host
    if visible is None:
        try:
            from cuda.core import Device

            return host, str(Device(device_id).pci_bus_id)
        except Exception:  # noqa: BLE001 - no cuda.core, no driver: the environment's names
            pass
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") if visible is None else visible
    if visible:
        entries = [v.strip() for v in visible.split(",") if v.strip()]
        if 0 <= device_id < len(entries):
            return host, entries[device_id]
    return host, str(device_id)


def choose_path(members: list[tuple[tuple[str, str], str | None]]) -> str | None:
    """None when NCCL can serve the group, else why the group is staged through host MPI.

    ``members`` holds, in group order, each member's (host, GPU) and its nccl4py import error.
    """
    for position, (_, error) in enumerate(members):
        if error:
            return f"nccl4py is not usable on group member {position} ({error})"
    seen: dict[tuple[str, str], int] = {}
    for position, (gpu, _) in enumerate(members):
        if gpu in seen:
            return (f"group members {seen[gpu]} and {position} share GPU {gpu[1]} on {gpu[0]}: "
                    "NCCL refuses two ranks on one GPU")
        seen[gpu] = position
    return None


def _import_nccl() -> tuple[Any, str | None]:
    try:
        import nccl.core as nccl_core
    except Exception as err:  # ImportError, or a missing libnccl / CUDA driver
        return None, f"{type(err).__name__}: {err}"
    return nccl_core, None


class _Array:
    """A CUDA Array Interface view of a TVM cuda tensor (no copy, no stream synchronisation)."""

    def __init__(self, t: Any, shape: tuple[int, ...] | None = None) -> None:
        dtype = tensors.np_dtype(t)
        self.__cuda_array_interface__ = {
            "shape": tuple(t.shape) if shape is None else shape,
            # cuda.core reads typestr with numpy.dtype() and nccl4py maps the name "bfloat16" to
            # ncclBfloat16; bfloat16's own typestr, "<V2", names no type
            "typestr": dtype.name if dtype == tensors.BFLOAT16 else dtype.str,
            "data": (tensors.data_ptr(t), False),
            "strides": None,
            "version": 3,
            "stream": None,
        }


class NcclGroup:
    """An NCCL communicator for one replica group."""

    def __init__(self, nccl_core: Any, comm: Any) -> None:
        self.nccl = nccl_core
        self.comm = comm
        self.ops = {"sum": nccl_core.SUM, "prod": nccl_core.PROD, "min": nccl_core.MIN, "max": nccl_core.MAX,
                    "avg": nccl_core.AVG}


_groups: dict[str, NcclGroup | None] = {}
_said: set[str] = set()


def nccl_group(groups: str, grp: Group, device_id: int) -> NcclGroup | None:
    """The group's NCCL communicator, or None for host staging; collective over the group on first use."""
    if groups in _groups:
        return _groups[groups]
    nccl_core, error = _import_nccl()
    members = grp.comm.allgather((gpu_identity(device_id), error))
    reason = choose_path(members)
    found: NcclGroup | None = None
    if reason is None:
        from cuda.core import Device

        Device(device_id).set_current()
        uid = nccl_core.get_unique_id() if grp.position == 0 else None
        uid_bytes = grp.comm.bcast(bytes(uid) if uid is not None else None, root=0)
        comm = nccl_core.Communicator.init(grp.size, grp.position, nccl_core.UniqueId.from_bytes(uid_bytes))
        found = NcclGroup(nccl_core, comm)
    elif grp.position == 0 and reason not in _said:
        _said.add(reason)
        print(f"tvm_combiners: {reason}; collectives on cuda tensors use host-staged MPI", file=sys.stderr, flush=True)
    _groups[groups] = found
    return found


def on_host(x: Any, out: Any, collective_np: Callable[[np.ndarray, np.ndarray], None]) -> None:
    """Host-staged MPI: ``collective_np(host copy of x, host result)``, then the result into ``out``."""
    staged = np.empty(tuple(out.shape), tensors.np_dtype(out))
    collective_np(tensors.host_copy(x), staged)
    out.copyfrom(staged)


def _leading(shape: tuple[int, ...], axis: int) -> bool:
    """The blocks along ``axis`` are contiguous: every dim before it has extent 1."""
    axis = axis + len(shape) if axis < 0 else axis
    return 0 <= axis < len(shape) and int(np.prod(shape[:axis])) == 1


def _nccl_for(groups: str, grp: Group, x: Any) -> NcclGroup | None:
    """The group's communicator where NCCL may move ``x``; None stages it (also an empty ``x``: NCCL
    refuses a reduce_scatter of fewer elements than ranks, and a NULL buffer)."""
    group_ = nccl_group(groups, grp, x.__dlpack_device__()[1])
    if group_ is None or str(x.dtype) not in NCCL_DTYPES or math.prod(tuple(x.shape)) == 0:
        return None
    return group_


def _nccl_reduces(ng: NcclGroup, op: str, x: Any) -> bool:
    """NCCL computes the host path's result: where the host path uses MPI's own reduction. Not float
    min/max (NCCL's fminf/fmaxf drop a NaN, as MPI's MIN/MAX do), not float16 (NCCL adds and
    multiplies in half precision: 60000 + 60000 - 60000 is inf; the host path reduces in float32),
    not avg on integers (refused). bfloat16 sum, prod and avg are NCCL's own (ncclBfloat16): it
    reduces in float and rounds each step to bfloat16, whose range is float32's, so nothing
    overflows that fits; beyond 2 ranks it may differ from the host path's one rounding in the
    last bit, as any two summation orders do."""
    dtype = tensors.np_dtype(x)
    if dtype == tensors.BFLOAT16:
        return op in ("sum", "prod", "avg")
    return op in ng.ops and builtin_reduction(op, dtype) and (op != "avg" or dtype.kind == "f")


def allreduce(name: str, groups: str, grp: Group, x: Any, op: str, out: Any) -> None:
    ng = _nccl_for(groups, grp, x)
    if ng is None or not _nccl_reduces(ng, op, x):
        on_host(x, out, lambda host, result: allreduce_np(name, grp, host, op, result))
        return
    check_shape(name, "out", tuple(out.shape), tuple(x.shape))
    ng.comm.allreduce(_Array(x), _Array(out), ng.ops[op], stream=tensors.current_stream(x))


def allgather(name: str, groups: str, grp: Group, x: Any, axis: int, out: Any) -> None:
    ng = _nccl_for(groups, grp, x)
    if ng is None or not _leading(tuple(x.shape), int(axis)):
        on_host(x, out, lambda host, result: allgather_np(name, grp, host, axis, result))
        return
    check_shape(name, "out", tuple(out.shape), gathered_shape(name, tuple(x.shape), axis, grp.size)[1])
    ng.comm.allgather(_Array(x), _Array(out), stream=tensors.current_stream(x))


def reduce_scatter(name: str, groups: str, grp: Group, x: Any, op: str, axis: int, out: Any) -> None:
    ng = _nccl_for(groups, grp, x)
    if (ng is None or not _nccl_reduces(ng, op, x) or not _leading(tuple(x.shape), int(axis))
            or tuple(x.shape)[int(axis)] % grp.size):
        on_host(x, out, lambda host, result: reduce_scatter_np(name, grp, host, op, axis, result))
        return
    check_shape(name, "out", tuple(out.shape), scattered_shape(name, tuple(x.shape), axis, grp.size)[1])
    ng.comm.reduce_scatter(_Array(x), _Array(out), ng.ops[op], stream=tensors.current_stream(x))


def broadcast(name: str, groups: str, grp: Group, x: Any, out: Any) -> None:
    ng = _nccl_for(groups, grp, x)
    if ng is None:
        on_host(x, out, lambda host, result: broadcast_np(name, grp, host, result))
        return
    check_shape(name, "out", tuple(out.shape), tuple(x.shape))
    ng.comm.broadcast(_Array(x), _Array(out), 0, stream=tensors.current_stream(x))
