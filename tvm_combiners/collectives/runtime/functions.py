"""The runtime's global packed functions (the contract with the IR side), on MPI for host tensors.

Every function takes TVM tensors, writes its preallocated output (passed last, destination-passing
style) and returns nothing.  Host tensors go straight to MPI as numpy views of their memory; cuda
tensors go to ``nccl.py`` (NCCL, or host-staged MPI where NCCL cannot run).  The numpy-level
functions (``*_np``, in :mod:`.host_collectives`) are shared by both paths.
"""

from __future__ import annotations

import atexit
import math
import os
import sys
import time
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

from ..spec import (
    AGREE_SHAPES,
    CHECK_COLLECTIVES_ENV,
    RUNTIME_PREFIX,
    bfloat16_words_function,
    checking_collectives,
    register_error_class,
)
from . import comm as _comm
from . import tensors
from .comm import Group, _routes, group, mpi, route
from .host_collectives import (
    MPI_OPS,
    allgather_np,
    allreduce_np,
    builtin_reduction,
    reduce_scatter_np,
)
from .rank_main import ABORT_PREFIX, record_error, record_waiting

# --- point to point -------------------------------------------------------------------------------
# A send copies its payload and posts an Isend: it never waits for the receiver, so no order of sends
# and recvs in the program can deadlock on a send.  Finished sends are dropped on every later call;
# whatever is left is completed at exit (bounded, so a recv that never comes fails the job loudly).
# MPI completes a small Isend with no receiver (1 KiB, not 8 KiB), so only a larger one nobody
# receives fails the job.  Not Issend: MPICH delivers its acknowledgements only while the receiver
# keeps calling MPI, so a sender far ahead of a receiver that then stopped would keep sends pending
# for good, and a job whose every message arrived would fail at exit.
#: ``TVM_COMBINERS_CHECK_COLLECTIVES=1``: every collective first checks that its whole group calls the
#: same one, and every recv that its send sent the shape and dtype it expects.
_CHECK = checking_collectives()
_CALL_BYTES = 256  # how much of each rank's description a mismatch report shows


_HEADER_BYTES = 1024  # a p2p check header: the dtype and every extent of a tensor of up to ~40 dims
# A header starts with this, so that a rank without check mode knows one it was sent, and one with it
# knows a payload sent without one (CHECK_COLLECTIVES_ENV set on some ranks only: a user's own mpiexec).
_HEADER_MAGIC = b"tvm_combiners check header\0"


def _shape_text(x: Any) -> str:
    return str(tuple(int(d) for d in x.shape))


def describe(x: Any, detail: str, grp: Group) -> str:
    """What a collective call computes, for :func:`same_call`: the call, its operand's shape and
    dtype, and this rank's group in its order (the order of an allgather's blocks)."""
    return f"{detail} of {_shape_text(x)} {x.dtype} in group ({','.join(map(str, grp.members))})"


def _payload_text(x: Any) -> str:
    """What a check-mode send says of its payload: the dtype first, so that a cut never drops it."""
    return f"{x.dtype} {_shape_text(x)}"


def _header_row(x: Any) -> np.ndarray:
    return _text_row(_HEADER_MAGIC.decode() + _payload_text(x), _HEADER_BYTES)


def _text_row(text: str, size: int = _CALL_BYTES) -> np.ndarray:
    """``text`` as a fixed-size row of bytes, cut to ``size``, for a message of known size."""
    row = np.zeros(size, np.uint8)
    raw = text.encode()[:size]
    row[:len(raw)] = np.frombuffer(raw, np.uint8)
    return row


def _row_text(row: np.ndarray) -> str:
    return bytes(row).rstrip(bytes(1)).decode(errors="replace")


_pending: list[tuple[Any, np.ndarray, int, int]] = []  # (request, payload, channel, target)
_drain_registered = False
_status: list[Any] = []  # one reused MPI.Status (the runtime is single-threaded)
DRAIN_TIMEOUT_ENV = "TVM_COMBINERS_SEND_DRAIN_TIMEOUT"
RECV_TIMEOUT_ENV = "TVM_COMBINERS_RECV_TIMEOUT"
# A recv polls this long, yielding the core between polls, then sleeps between polls: long enough for
# a large transfer (each side's polls move it on: 16 MiB took 4-6 ms here), short beside a peer's compute.
_SPIN_S = 0.05
_recv_timeout: list[float] = []  # read once


def _seconds(env: str, default: float) -> float:
    """A positive number of seconds from the environment variable ``env``."""
    text = os.environ.get(env, "")
    try:
        value = float(text) if text else default
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise ValueError(f"{env} must be a positive number of seconds, got {text!r}")
    return value


def _reap() -> None:
    """Forget the sends that completed, in one MPI call: a sender far ahead of its receiver keeps its
    large sends pending, and a ``Test`` each, on every send, was quadratic in Python."""
    done = mpi().Request.Testsome([p[0] for p in _pending])
    if done:
        finished = set(done)
        _pending[:] = [p for i, p in enumerate(_pending) if i not in finished]


def _stuck(me: int) -> str:
    return "; ".join(dict.fromkeys(f"channel {p[2]} from rank {me} to rank {p[3]}" for p in _pending))


def drain_sends(timeout: float | None = None) -> None:
    """Complete every pending send; after ``timeout`` s say which are stuck and abort the job."""
    if timeout is None:
        timeout = _seconds(DRAIN_TIMEOUT_ENV, 60)
    deadline = time.monotonic() + timeout
    me, said = _comm.rank(), False
    while _pending:
        _reap()
        if not _pending:
            if said:
                record_waiting(None)
            return
        if not said:  # launch's timeout may come first: it names these then
            record_waiting(f"sends nobody has received yet ({_stuck(me)}), for up to {timeout:g} s "
                           f"({DRAIN_TIMEOUT_ENV})")
            said = True
        if time.monotonic() > deadline:
            _abort(f"sends never received after {timeout:g} s: {_stuck(me)}")
        time.sleep(0.001)


def send_np(name: str, pairs: str, channel_id: int, payload: np.ndarray) -> None:
    """Post a non-blocking send of ``payload`` (already a private copy) if this rank is a source."""
    global _drain_registered
    peer = _routes.get(pairs) or route(pairs, name)
    if _pending:
        _reap()
    if peer.target is None:
        return
    if not _drain_registered:  # the timeout is read now: a bad value raised inside atexit, and the job exited 0
        atexit.register(drain_sends, _seconds(DRAIN_TIMEOUT_ENV, 60))
        _drain_registered = True
    MPI = mpi()
    tag = _comm.tag(channel_id)
    if _CHECK:  # the payload is bytes to MPI: say its shape first (messages of one tag keep their order)
        header = _header_row(payload)
        _pending.append((MPI.COMM_WORLD.Isend([header, MPI.BYTE], peer.target, tag), header, channel_id, peer.target))
    request = MPI.COMM_WORLD.Isend([payload, MPI.BYTE], peer.target, tag)
    _pending.append((request, payload, channel_id, peer.target))


def _wait(ready: Callable[[], bool], cancelled: Callable[[], bool], timed_out: Callable[[float], Exception],
          spin_s: float = _SPIN_S) -> None:
    """Poll ``ready()`` until it holds, for ``TVM_COMBINERS_RECV_TIMEOUT`` s (300) at most (each wait of a
    recv: a check-mode recv waits for its header, then its payload); then raise ``timed_out(timeout)``
    unless ``cancelled()`` says the awaited message came after all. A recv placed before the send it
    waits for (Relay without ``OrderSendRecv``: its lowering sees one op at a time) blocked forever
    outside ``launch``; now each rank so placed raises.

    For ``spin_s`` the wait polls, and gives the core to any other runnable process between polls
    (``sched_yield``): ranks may outnumber cores, and the peer this rank waits for may need this very
    core. A wait longer than that is waiting for a peer that computes: it sleeps between polls, and
    leaves the core to others (each sleep adds ~50 us to its latency, and a transfer that each side's
    polls move on slows down: the first phase is long enough for large ones)."""
    if ready():
        return
    timeout, start = _recv_timeout_s(), time.monotonic()
    while not ready():
        waited = time.monotonic() - start
        if waited > timeout:
            if not cancelled():
                return
            raise timed_out(timeout)
        if waited > spin_s:
            time.sleep(0.00005)
        else:
            os.sched_yield()


def _recv_timeout_s() -> float:
    if not _recv_timeout:
        _recv_timeout.append(_seconds(RECV_TIMEOUT_ENV, 300))
    return _recv_timeout[0]


def _nothing_came(name: str, channel_id: int, source: int) -> Callable[[float], Exception]:
    return lambda timeout: TimeoutError(
        f"{name}: channel {channel_id}: nothing came from rank {source} in {timeout:g} s: a recv placed before the "
        f"send it waits for never returns (run OrderSendRecv before building); if rank {source} is only slow, "
        f"raise {RECV_TIMEOUT_ENV}")


def _await(name: str, channel_id: int, source: int, request: Any, status: Any, spin_s: float = _SPIN_S) -> None:
    """Wait for a posted recv of ``source`` (see :func:`_wait`); a timed-out one is cancelled."""

    def cancelled() -> bool:
        request.Cancel()
        request.Wait(status)
        return status.Is_cancelled()  # False: it came while being cancelled, and it is this recv's

    _wait(lambda: request.Test(status), cancelled, _nothing_came(name, channel_id, source), spin_s)


def _receive(name: str, channel_id: int, source: int, tag: int, buf: np.ndarray, status: Any) -> None:
    """Receive the next message of ``tag`` from ``source`` into ``buf`` (see :func:`_wait`)."""
    _recv_timeout_s()  # a bad value raises before a recv is posted (a posted one would take a later message)
    MPI = mpi()
    _await(name, channel_id, source, MPI.COMM_WORLD.Irecv([buf, MPI.BYTE], source, tag), status)


def _next_size(name: str, channel_id: int, source: int, tag: int, status: Any) -> int:
    """The byte count of the next message of ``tag`` from ``source``, once it has come."""
    MPI = mpi()
    _wait(lambda: MPI.COMM_WORLD.Iprobe(source, tag, status), lambda: True, _nothing_came(name, channel_id, source))
    return status.Get_count(MPI.BYTE)


def _discard_next(name: str, channel_id: int, source: int, tag: int, status: Any) -> None:
    """Take the next message of ``tag`` from ``source`` and drop it, so that its sender is not left waiting."""
    size = _next_size(name, channel_id, source, tag, status)
    _receive(name, channel_id, source, tag, np.empty(size, np.uint8), status)


def _is_header(buf: np.ndarray, shortest: int = 4) -> bool:
    """Whether ``buf`` starts with a check-mode header, or is a cut-off start of one at least
    ``shortest`` bytes long (a recv that MPI cut short keeps the header's first bytes)."""
    raw = buf.reshape(-1).view(np.uint8)
    n = min(raw.size, len(_HEADER_MAGIC))
    return n >= shortest and bytes(raw[:n]) == _HEADER_MAGIC[:n]


def _mode_error(name: str, channel_id: int, source: int, checking_here: bool) -> ValueError:
    here, there = ("this rank", f"rank {source}") if checking_here else (f"rank {source}", "this rank")
    return ValueError(f"{name}: channel {channel_id} from rank {source}: {CHECK_COLLECTIVES_ENV} is set on {here} "
                      f"but not on {there}: set it on every rank (a check header would be read as a payload)")


def _check_header(name: str, channel_id: int, source: int, tag: int, out: np.ndarray) -> None:
    """Check mode: compare what the send says it sent with ``out``. The byte count alone lets a send
    of symbolic shape ``(n, m)`` = (4, 2) land in a (2, 4) recv. On a mismatch the payload is still
    taken, so that its sender is not left waiting."""
    status = _status[0]
    size = _next_size(name, channel_id, source, tag, status)
    first = np.empty(size, np.uint8)
    _receive(name, channel_id, source, tag, first, status)
    if size != _HEADER_BYTES or not _is_header(first):  # the payload itself: its sender does not check
        raise _mode_error(name, channel_id, source, True)
    want = _header_row(out)  # cut as the send's was
    if np.array_equal(first, want):
        return
    sent, want = (_row_text(row[len(_HEADER_MAGIC):]) for row in (first, want))
    _discard_next(name, channel_id, source, tag, status)
    raise ValueError(f"{name}: channel {channel_id} from rank {source} sent {sent}, but the recv expects {want}: "
                     "the send's shape or dtype differs from the recv's")


def _truncated(name: str, channel_id: int, source: int, tag: int, out: np.ndarray, status: Any,
               error: str) -> ValueError:
    """The error for a message larger than ``out`` (MPI's ``error``): a check header this rank does
    not expect (taken, so that its payload is not read as the next message), or a payload too large."""
    if not _CHECK and _is_header(out):
        _discard_next(name, channel_id, source, tag, status)
        return _mode_error(name, channel_id, source, False)
    maybe = ""
    if not _CHECK and _is_header(out, shortest=0):  # under 4 bytes: too short to tell
        maybe = (f", or {CHECK_COLLECTIVES_ENV} is set on rank {source} but not on this rank (then the "
                 "channel is a message behind: set it on every rank)")
    return ValueError(f"{name}: channel {channel_id} from rank {source}: {error} "
                      f"(the send's payload is larger than the {out.nbytes}-byte recv buffer{maybe})")


def _check_count(name: str, channel_id: int, source: int, tag: int, out: np.ndarray, got: int, status: Any) -> None:
    """Raise unless the message that arrived in ``out`` filled it (``got`` bytes)."""
    if got == _HEADER_BYTES and not _CHECK and _is_header(out):  # the peer checks, this rank does not
        _discard_next(name, channel_id, source, tag, status)
        raise _mode_error(name, channel_id, source, False)
    if got != out.nbytes:
        raise ValueError(f"{name}: channel {channel_id} from rank {source} brought {got} bytes, "
                         f"expected {out.nbytes}: the send's shape or dtype differs from the recv's")


def recv_np(name: str, pairs: str, channel_id: int, out: np.ndarray) -> None:
    """Block until this rank's payload arrived in ``out``; zeros if this rank is no target."""
    peer = _routes.get(pairs) or route(pairs, name)
    if peer.source is not None:
        MPI = mpi()
        if not _status:
            _status.append(MPI.Status())
        status, tag = _status[0], _comm.tag(channel_id)
        if _CHECK:
            _check_header(name, channel_id, peer.source, tag, out)
        try:
            _receive(name, channel_id, peer.source, tag, out, status)
        except MPI.Exception as err:
            raise _truncated(name, channel_id, peer.source, tag, out, status, err.Get_error_string()) from None
        _check_count(name, channel_id, peer.source, tag, out, status.Get_count(MPI.BYTE), status)
    else:
        out[...] = 0
    if _pending:
        _reap()


def finish_native_recv(recv_request: int, send_request: int, out: np.ndarray, source: int, target: int,
                       channel_id: int, recv_code: int, send_code: int, got: int) -> None:
    """Finish a native recv (:mod:`.native`) that did not simply succeed in its polls: wait for what is
    left of its recv (of ``source``, -1 for none) and of the send it completes (to ``target``), within
    one recv timeout, then raise what the generic recv raises (MPI's error ``recv_code``, a byte
    count ``got`` that is not ``out``'s, nothing come in time).

    The send's payload is the program's own tensor, which MPI reads until the send completes: an
    error never leaves while the send is pending, and a send still pending at the timeout (its
    target never received it) ends the job, as the exit drain does, rather than let MPI read memory
    the program may have freed by then."""
    name = "tvm_combiners.recv"
    MPI = mpi()
    if not _status:
        _status.append(MPI.Status())
    status, tag = _status[0], _comm.tag(channel_id)
    errors: list[Exception] = [MPI.Exception(recv_code)] if recv_code else []
    waiting = source >= 0 and got < 0 and not recv_code
    receiving = MPI.Request.fromhandle(recv_request & 0xFFFFFFFF)  # a C int, as mpi4py takes it: unsigned
    sending = MPI.Request.fromhandle(send_request & 0xFFFFFFFF)
    if send_code:  # the send completed, with an error; the recv, still posted into out, is taken back first
        if waiting:
            receiving.Cancel()
            receiving.Wait(status)
        raise RuntimeError(f"{name}: channel {channel_id}: the send to rank {target}: {MPI.Get_error_string(send_code)}")
    received = [not waiting]

    def ready() -> bool:
        if not received[0]:
            try:
                received[0] = receiving.Test(status)
            except MPI.Exception as err:  # a message larger than out: completed, with its error
                errors.append(err)
                received[0] = True
        return received[0] and sending.Test()

    def cancelled() -> bool:
        came = received[0]
        if not came:
            receiving.Cancel()
            receiving.Wait(status)
            came = not status.Is_cancelled()  # it came while being cancelled: this recv's
        if not sending.Test():
            _abort(f"{name}: channel {channel_id}: rank {target} has not taken this rank's send in "
                   f"{_recv_timeout_s():g} s, and MPI may still read its payload (if rank {target} is only slow, "
                   f"raise {RECV_TIMEOUT_ENV})")
        return not came

    _wait(ready, cancelled, _nothing_came(name, channel_id, source), spin_s=0)
    if waiting and not errors:
        got = status.Get_count(MPI.BYTE)
    if errors:
        raise _truncated(name, channel_id, source, tag, out, status, errors[0].Get_error_string()) from None
    if source >= 0:
        _check_count(name, channel_id, source, tag, out, got, status)
    if _pending:
        _reap()


def _abort(why: str) -> None:
    """End the whole job, naming ``why`` (for launch too: this rank's stderr may not reach it)."""
    record_error(why)
    print(f"{ABORT_PREFIX}{why}", file=sys.stderr, flush=True)
    mpi().COMM_WORLD.Abort(1)


# --- the registered functions ---------------------------------------------------------------------
_view = tensors.host_view
_groups = _comm._groups


def same_call(name: str, grp: Group, call: str) -> None:
    """Raise on every rank of the group unless every member is calling ``call`` (:func:`describe`:
    kind, reduction, axis, shape, dtype, group) here: one small allreduce, and an allgather of
    descriptions when they differ.

    The collective combiners decide from each rank's own module: ranks whose modules link their
    collectives by different dependences (compute that differs per rank) may get different combined
    sequences, and MPI then hangs, fails on a size, or reduces mismatched data silently (sum with
    max, or two different tensors of one size). Opt-in: it doubles a small collective's latency.
    """
    digest = zlib.crc32(call.encode())
    own = np.array([digest, -digest], np.int64)
    seen = np.empty_like(own)
    grp.comm.Allreduce(own, seen, mpi().MAX)
    if seen[0] == -seen[1]:
        return
    every = np.empty((grp.size, _CALL_BYTES), np.uint8)
    # each names itself: ranks that list the group in different orders disagree on who is where
    grp.comm.Allgather(_text_row(f"rank {_comm.rank()}: {call}"), every)
    calls = "; ".join(_row_text(row) for row in every)
    raise RuntimeError(f"{name}: the ranks of the group call different collectives here ({calls}): every rank "
                       "must call the same collectives in the same order (modules whose compute differs per "
                       "rank may combine differently: combine one module for every rank)")


def _gpu() -> Any:
    from . import nccl

    return nccl


def allreduce(x: Any, op: str, groups: str, out: Any) -> None:
    name = "tvm_combiners.allreduce"
    grp = _groups.get(groups) or group(groups, name)
    if _CHECK:
        same_call(name, grp, describe(x, f"allreduce {op}", grp))
    if x.__dlpack_device__()[0] == tensors.CPU:
        xv, ov = _view(x), _view(out)
        mop = MPI_OPS.get(op)
        if mop is not None and op != "avg" and builtin_reduction(op, xv.dtype) and xv.shape == ov.shape:
            grp.comm.Allreduce(xv, ov, mop)  # the common case, kept short: it is latency-bound
        else:
            allreduce_np(name, grp, xv, op, ov)
    elif tensors.is_host(x):
        allreduce_np(name, grp, _view(x), op, _view(out))
    else:
        _gpu().allreduce(name, groups, grp, x, op, out)


def _on_bfloat16_words(x: Any, out: Any, collective_np: Callable[[np.ndarray, np.ndarray], None]) -> None:
    """``collective_np`` on uint16 tensors read as bfloat16: through host memory for cuda tensors,
    which NCCL would otherwise reduce as integers."""
    if tensors.is_host(x):
        collective_np(tensors.bfloat16_words(_view(x)), tensors.bfloat16_words(_view(out)))
    else:
        _gpu().on_host(x, out, lambda host, result: collective_np(tensors.bfloat16_words(host),
                                                                   tensors.bfloat16_words(result)))


def allreduce_bfloat16_words(x: Any, op: str, groups: str, out: Any) -> None:
    """:func:`allreduce` of uint16 tensors that hold bfloat16 (Relay's lowering, see
    ``collectives/relay/ops.py``): reduced as bfloat16, in float32."""
    name = "tvm_combiners.allreduce"
    grp = _groups.get(groups) or group(groups, name)
    if _CHECK:
        same_call(name, grp, describe(x, f"allreduce {op} of bfloat16 words", grp))
    _on_bfloat16_words(x, out, lambda xv, ov: allreduce_np(name, grp, xv, op, ov))


def reduce_scatter_bfloat16_words(x: Any, op: str, axis: int, groups: str, out: Any) -> None:
    """:func:`reduce_scatter` of uint16 tensors that hold bfloat16, as :func:`allreduce_bfloat16_words`."""
    name = "tvm_combiners.reduce_scatter"
    grp = _groups.get(groups) or group(groups, name)
    if _CHECK:
        same_call(name, grp, describe(x, f"reduce_scatter {op} axis {axis} of bfloat16 words", grp))
    _on_bfloat16_words(x, out, lambda xv, ov: reduce_scatter_np(name, grp, xv, op, axis, ov))


def allgather(x: Any, axis: int, groups: str, out: Any) -> None:
    name = "tvm_combiners.allgather"
    grp = _groups.get(groups) or group(groups, name)
    if _CHECK:
        same_call(name, grp, describe(x, f"allgather axis {axis}", grp))
    if tensors.is_host(x):
        allgather_np(name, grp, _view(x), axis, _view(out))
    else:
        _gpu().allgather(name, groups, grp, x, axis, out)


def reduce_scatter(x: Any, op: str, axis: int, groups: str, out: Any) -> None:
    name = "tvm_combiners.reduce_scatter"
    grp = _groups.get(groups) or group(groups, name)
    if _CHECK:
        same_call(name, grp, describe(x, f"reduce_scatter {op} axis {axis}", grp))
    if tensors.is_host(x):
        reduce_scatter_np(name, grp, _view(x), op, axis, _view(out))
    else:
        _gpu().reduce_scatter(name, groups, grp, x, op, axis, out)


def agree_shapes(x: Any, kind: str, groups: str) -> None:
    """Raise on every rank of the group unless all of them give the collective ``x`` of one shape.

    Compiled code calls this before a collective whose operand's shape is only known at run time:
    MPI itself does not notice ranks that disagree (an allgather then fills the tail of the larger
    ranks' results with whatever the smaller ones had, and exits 0).
    """
    name = RUNTIME_PREFIX + kind
    same_shape(name, kind, _groups.get(groups) or group(groups, name), x)


def same_shape(name: str, kind: str, grp: Group, x: Any) -> None:
    """:func:`agree_shapes` on a group: one small allreduce of the extents and their negatives gives
    every rank the largest and smallest extent per axis (the number of axes is the module's own)."""
    shape = tuple(int(d) for d in x.shape)
    own = np.array([*shape, *(-d for d in shape)], np.int64)
    seen = np.empty_like(own)
    grp.comm.Allreduce(own, seen, mpi().MAX)
    high, low = seen[:len(shape)], -seen[len(shape):]
    if (high != low).any():
        span = ", ".join(f"{lo}" if lo == hi else f"{lo}..{hi}" for lo, hi in zip(low.tolist(), high.tolist()))
        raise ValueError(f"{name}: the ranks give x of different shapes (extents ({span}) across the group; "
                         f"rank {_comm.rank()} gives {shape}): {kind} needs the same shape on every rank")


def _write_token(token_out: Any) -> None:
    if tensors.is_host(token_out):
        _view(token_out)[...] = 0
    else:
        token_out.copyfrom(np.zeros(tuple(token_out.shape), tensors.np_dtype(token_out)))


def send(x: Any, pairs: str, channel_id: int, is_host_transfer: int, token_out: Any = None) -> None:
    """Non-blocking send; cuda payloads are staged through host memory (NCCL's send would block the stream).
    ``token_out`` (the IR's token; None for a caller that has none) gets zeros."""
    name = "tvm_combiners.send"
    if (_routes.get(pairs) or route(pairs, name)).target is not None:
        payload = np.array(_view(x)) if tensors.is_host(x) else tensors.host_copy(x)
    else:
        payload = np.empty(0, np.uint8)
    send_np(name, pairs, channel_id, payload)
    if token_out is not None:
        _write_token(token_out)


def recv(pairs: str, channel_id: int, is_host_transfer: int, out: Any) -> None:
    name = "tvm_combiners.recv"
    if tensors.is_host(out):
        recv_np(name, pairs, channel_id, _view(out))
        return
    staged = np.empty(tuple(out.shape), tensors.np_dtype(out))
    recv_np(name, pairs, channel_id, staged)
    out.copyfrom(staged)


FUNCTIONS = {
    "tvm_combiners.allreduce": allreduce,
    "tvm_combiners.allgather": allgather,
    "tvm_combiners.reduce_scatter": reduce_scatter,
    "tvm_combiners.send": send,
    "tvm_combiners.recv": recv,
    AGREE_SHAPES: agree_shapes,
    bfloat16_words_function("allreduce"): allreduce_bfloat16_words,
    bfloat16_words_function("reduce_scatter"): reduce_scatter_bfloat16_words,
}


def register_all() -> None:
    """Register the contract's functions (idempotent: re-registration overrides)."""
    for fname, func in FUNCTIONS.items():
        tensors.register(fname, func)
    register_error_class(TimeoutError)  # a recv's deadline reached compiled callers as RuntimeError
