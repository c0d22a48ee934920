"""TVM's ``runtime.disco.*`` built-ins re-registered onto this runtime, so that ``R.ccl`` modules and
modules lowered by ``relax.distributed`` run on ranks outside a disco session.

A rank is a disco worker: its worker id is its rank, the number of workers the job's size.  Disco splits
its workers into ``num_groups`` equal runs of consecutive workers; here that number comes from
``TVM_COMBINERS_DISCO_GROUPS`` (``launch --disco-groups G``, default 1), and a collective called with
``in_group=True`` runs on its group's sub-communicator, with ``False`` on every rank.  "Worker 0" of a
rooted collective (broadcast, scatter, gather) is the group's first rank in group, rank 0 otherwise.

What TVM calls, and with what (checked in TVM 0.27 and 0.16, the output passed last):

- ``R.ccl.allreduce`` -> ``allreduce(x, Shape([kind]), in_group, out)``, ``R.ccl.allgather`` ->
  ``allgather(x, in_group, out)``, ``R.ccl.broadcast_from_worker0`` / ``scatter_from_worker0`` ->
  ``(x, in_group, out)``; TVM 0.16 leaves ``in_group`` out;
- replicated-to-sharded redistribution -> ``worker_id()`` (a one-element Shape);
- disco's own: ``worker_rank()``, ``world_size()``, ``gather_to_worker0(x, in_group, out)``,
  ``recv_from_worker0(buf)``, ``send_to_worker(buf, receiver)``, ``recv_from_worker(buf, sender)``,
  ``send_to_next_group(buf)``, ``recv_from_prev_group(buf)``.

As in disco, gather and scatter move flat blocks (only element counts must agree), the buffer a non-root
rank gives for the root's side may be None, and point-to-point transfers are matched in order per pair
of ranks.  Sends never block (a private copy, as the package's own sends); a recv waits
``TVM_COMBINERS_RECV_TIMEOUT`` seconds at most.

Each collective first checks that every rank of its group gives a buffer of one shape (one small
allreduce): a legalized ``R.ccl`` op does not say whether its shape was symbolic, and MPI takes ranks
whose shapes differ but whose byte counts agree.  Under ``TVM_COMBINERS_CHECK_COLLECTIVES=1`` each also
checks that every rank calls the same collective (:func:`~.functions.same_call`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ..spec import REDUCTIONS
from . import comm, functions, host_collectives, tensors
from .comm import Group, group, mpi

PREFIX = "runtime.disco."


def _gpu() -> Any:
    from . import nccl

    return nccl


def _trailing(name: str, rest: tuple[Any, ...]) -> tuple[bool, Any]:
    """``(in_group, out)`` from ``(in_group, out)`` (TVM 0.27) or ``(out,)`` (TVM 0.16: no groups)."""
    if len(rest) not in (1, 2):
        raise TypeError(f"{name}: expected (..., [in_group,] out), got {len(rest)} trailing arguments")
    return (bool(int(rest[0])) if len(rest) == 2 else False), rest[-1]


def _groups(name: str, in_group: bool) -> str:
    """The ``groups`` string a collective runs on: the job's disco groups in group, every rank otherwise.
    The job's grouping is checked either way, so a bad one fails every rank at its first collective."""
    grouped = comm.disco_groups(name)
    return grouped if in_group else ""


def _checked(name: str, what: str, x: Any, in_group: bool) -> tuple[str, Group]:
    """The groups string and group of a collective, once every member gives ``x`` of one shape (and, in
    check mode, calls ``what``)."""
    groups = _groups(name, in_group)
    grp = group(groups, name)
    if functions._CHECK:  # first: its message is of a fixed size, whatever the ranks' numbers of axes
        functions.same_call(name, grp, functions.describe(x, what, grp))
    functions.same_shape(name, what.split()[0], grp, x)
    return groups, grp


def _rooted(name: str, what: str, t: Any, in_group: bool, root_value: int) -> tuple[str, Group, int]:
    """The groups string and group of a collective rooted at the group's first member, once every member gives ``t`` of one
    shape; and the root's ``root_value`` (the size of a buffer only the root gives), now known to every
    member, so that a bad root buffer fails every member alike instead of leaving them waiting."""
    groups = _groups(name, in_group)
    grp = group(groups, name)
    kind = name.removeprefix(PREFIX)
    if functions._CHECK:
        functions.same_call(name, grp, functions.describe(t, kind, grp))
    shape = tuple(int(d) for d in t.shape)
    own = np.array([*shape, *(-d for d in shape), root_value if grp.position == 0 else _NO_ROOT], np.int64)
    seen = np.empty_like(own)
    grp.comm.Allreduce(own, seen, mpi().MAX)
    high, low = seen[:len(shape)], -seen[len(shape):-1]
    if (high != low).any():
        span = ", ".join(f"{lo}" if lo == hi else f"{lo}..{hi}" for lo, hi in zip(low.tolist(), high.tolist()))
        raise ValueError(f"{name}: the ranks give {what} of different shapes (extents ({span}) across the group; "
                         f"rank {comm.rank()} gives {shape}): {kind} needs the same shape on every rank")
    return groups, grp, int(seen[-1])


_NO_ROOT = -(1 << 62)  # what non-roots add to the root's value (MAX keeps the root's)


def _size_text(count: int) -> str:
    return "None" if count < 0 else f"{count} elements"


def _numel(t: Any) -> int:
    return math.prod(int(d) for d in t.shape)


def _flat(t: np.ndarray) -> np.ndarray:
    return t.reshape(-1)


def _on_host(out: Any, write: Callable[[np.ndarray], None]) -> None:
    """``write`` into ``out``'s memory, or into a host copy copied back (cuda: host-staged)."""
    if tensors.is_host(out):
        write(tensors.host_view(out))
        return
    staged = np.empty(tuple(int(d) for d in out.shape), tensors.np_dtype(out))
    write(staged)
    out.copyfrom(staged)


def _host(x: Any) -> np.ndarray:
    return tensors.host_view(x) if tensors.is_host(x) else tensors.host_copy(x)


# --- collectives ------------------------------------------------------------------------------------------

def allreduce(x: Any, kind: Any, *rest: Any) -> None:
    name = PREFIX + "allreduce"
    in_group, out = _trailing(name, rest)
    code = int(kind[0])
    if not 0 <= code < len(REDUCTIONS):  # R.ccl's op_type is an index into REDUCTIONS
        raise ValueError(f"{name}: unknown reduction code {code}: expected 0-{len(REDUCTIONS) - 1} "
                         f"({', '.join(REDUCTIONS)})")
    reduction = REDUCTIONS[code]
    groups, grp = _checked(name, f"allreduce {reduction}", x, in_group)
    if tensors.is_host(x):
        host_collectives.allreduce_np(name, grp, tensors.host_view(x), reduction, tensors.host_view(out))
    else:
        _gpu().allreduce(name, groups, grp, x, reduction, out)


def allgather(x: Any, *rest: Any) -> None:
    """Every member's ``x``, in group order, as one flat sequence in ``out`` (axis 0 of ``R.ccl``'s)."""
    name = PREFIX + "allgather"
    in_group, out = _trailing(name, rest)
    groups, grp = _checked(name, "allgather axis 0", x, in_group)
    if _numel(out) != grp.size * _numel(x):
        raise ValueError(f"{name}: out has {_numel(out)} elements, expected {grp.size} x {_numel(x)} "
                         f"(the group's {grp.size} operands of shape {tuple(int(d) for d in x.shape)})")
    if tensors.is_host(x) and tensors.is_host(out):
        MPI = mpi()
        grp.comm.Allgather([tensors.host_view(x), MPI.BYTE], [tensors.host_view(out), MPI.BYTE])
    else:
        _gpu().allgather(name, groups, grp, x, 0, out)


def broadcast_from_worker0(x: Any, *rest: Any) -> None:
    """``out`` of every member becomes the ``x`` of the group's first (``x`` may be None elsewhere)."""
    name = PREFIX + "broadcast_from_worker0"
    in_group, out = _trailing(name, rest)
    groups, grp, sent = _rooted(name, "out", out, in_group, -1 if x is None else _numel(x))
    if sent != _numel(out):
        raise ValueError(f"{name}: worker 0 of the group gives x of {_size_text(sent)}, but out has {_numel(out)}")
    root = grp.position == 0
    if tensors.is_host(out) and (not root or tensors.is_host(x)):
        view = tensors.host_view(out)
        if root:
            np.copyto(_flat(view), _flat(tensors.host_view(x)))
        grp.comm.Bcast([view, mpi().BYTE], root=0)
    elif x is not None and not tensors.is_host(out) and not tensors.is_host(x):
        _gpu().broadcast(name, groups, grp, x, out)
    else:  # host and cuda mixed, or a cuda out with no x: through host memory
        def write(view: np.ndarray) -> None:
            if root:
                np.copyto(_flat(view), _flat(_host(x)))
            grp.comm.Bcast([view, mpi().BYTE], root=0)

        _on_host(out, write)


def scatter_from_worker0(x: Any, *rest: Any) -> None:
    """The group's first member splits ``x`` into equal flat blocks; the member at position i gets block i."""
    name = PREFIX + "scatter_from_worker0"
    in_group, out = _trailing(name, rest)
    _, grp, sent = _rooted(name, "out", out, in_group, -1 if x is None else _numel(x))
    if sent != grp.size * _numel(out):
        raise ValueError(f"{name}: worker 0 of the group gives x of {_size_text(sent)}, expected "
                         f"{grp.size} x {_numel(out)} (one block of out's {_numel(out)} per member)")
    root = grp.position == 0
    MPI = mpi()
    send = [_host(x), MPI.BYTE] if root else None
    _on_host(out, lambda view: grp.comm.Scatter(send, [view, MPI.BYTE], root=0))


def gather_to_worker0(x: Any, *rest: Any) -> None:
    """The group's first member gets every member's ``x``, in group order, as flat blocks of ``out``
    (``out`` may be None elsewhere, and is left alone there)."""
    name = PREFIX + "gather_to_worker0"
    in_group, out = _trailing(name, rest)
    _, grp, room = _rooted(name, "x", x, in_group, -1 if out is None else _numel(out))
    if room != grp.size * _numel(x):
        raise ValueError(f"{name}: worker 0 of the group gives out of {_size_text(room)}, expected "
                         f"{grp.size} x {_numel(x)} (one block of x per member)")
    root = grp.position == 0
    MPI = mpi()
    sent = [np.ascontiguousarray(_host(x)), MPI.BYTE]
    if root:
        _on_host(out, lambda view: grp.comm.Gather(sent, [view, MPI.BYTE], root=0))
    else:
        grp.comm.Gather(sent, None, root=0)


# --- worker identity --------------------------------------------------------------------------------------

def worker_id() -> Any:
    """This worker's id as a one-element Shape (what replicated-to-sharded redistribution slices by)."""
    if tensors.NEW_FFI:
        return tensors.tvm_ffi.Shape([comm.rank()])
    import tvm

    return tvm.runtime.ShapeTuple([comm.rank()])


def worker_rank() -> int:
    return comm.rank()


def world_size() -> int:
    return comm.world_size()


# --- point to point ---------------------------------------------------------------------------------------
# Every disco transfer travels on one channel of the package's point-to-point layer, far from the channels
# compiled modules number from 0: MPI keeps the order of messages between two ranks on one channel, as
# NCCL does on a stream.

def channel() -> int:
    """The channel of disco's transfers (its tag is the MPI's upper bound minus it)."""
    return min(1 << 20, comm.tag(0) // 2)


def _peer(name: str, peer: int, what: str, verb: str) -> int:
    me, size = comm.rank(), comm.world_size()
    peer = int(peer)
    if not 0 <= peer < size:
        raise ValueError(f"{name}: {what} {peer} is not a worker: the job has {size} rank{'s' if size != 1 else ''} "
                         f"(workers 0-{size - 1})")
    if peer == me:
        raise ValueError(f"{name}: {what} {peer} is this worker itself: a worker cannot {verb} itself")
    return peer


def _send(name: str, buffer: Any, receiver: int) -> None:
    payload = np.array(tensors.host_view(buffer)) if tensors.is_host(buffer) else tensors.host_copy(buffer)
    functions.send_np(name, f"{comm.rank()},{receiver}", channel(), payload)


def _recv(name: str, buffer: Any, sender: int) -> None:
    pairs = f"{sender},{comm.rank()}"
    _on_host(buffer, lambda view: functions.recv_np(name, pairs, channel(), view))


def send_to_worker(buffer: Any, receiver_id: int) -> None:
    name = PREFIX + "send_to_worker"
    _send(name, buffer, _peer(name, receiver_id, "receiver", "send to"))


def recv_from_worker(buffer: Any, sender_id: int) -> None:
    name = PREFIX + "recv_from_worker"
    _recv(name, buffer, _peer(name, sender_id, "sender", "receive from"))


def recv_from_worker0(buffer: Any) -> None:
    """What worker 0 sent this worker with ``send_to_worker``; worker 0 itself may not call it (as in TVM)."""
    name = PREFIX + "recv_from_worker0"
    if comm.rank() == 0:
        raise ValueError(f"{name}: worker 0 called it: only workers 1-{comm.world_size() - 1} receive from worker 0")
    _recv(name, buffer, 0)


def send_to_next_group(buffer: Any) -> None:
    """To the worker at the same position in the next group; the last group has none."""
    name = PREFIX + "send_to_next_group"
    per, size = comm.job_disco_group_size(name), comm.world_size()
    receiver = comm.rank() + per
    if receiver >= size:
        raise ValueError(f"{name}: worker {comm.rank()} is in the last of {size // per} groups: "
                         "there is no next group to send to")
    _send(name, buffer, receiver)


def recv_from_prev_group(buffer: Any) -> None:
    """From the worker at the same position in the previous group; the first group has none."""
    name = PREFIX + "recv_from_prev_group"
    sender = comm.rank() - comm.job_disco_group_size(name)
    if sender < 0:
        raise ValueError(f"{name}: worker {comm.rank()} is in the first group: there is no previous group "
                         "to receive from")
    _recv(name, buffer, sender)


OVERRIDES: dict[str, Callable[..., Any]] = {
    PREFIX + f.__name__: f
    for f in (allreduce, allgather, broadcast_from_worker0, scatter_from_worker0, gather_to_worker0,
              worker_id, worker_rank, world_size, recv_from_worker0, send_to_worker, recv_from_worker,
              send_to_next_group, recv_from_prev_group)
}


def register_overrides() -> None:
    """Replace TVM's disco built-ins in this process (override=True; idempotent)."""
    for fname, func in OVERRIDES.items():
        tensors.register(fname, func)
