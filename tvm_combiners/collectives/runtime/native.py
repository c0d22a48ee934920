"""Native collectives for host tensors: kernels, JIT-compiled in this process, that call MPI themselves.

Why: a small collective is latency-bound, and the generic path goes from the VM back into Python
(FFI callback, numpy views, mpi4py's argument parsing): 3-5x raw MPI on 4 bytes, and a send copied
its payload.  The VM calls these kernels like any compiled function, with no Python in between.

One TIR module holds every kernel; what they share is written once (:func:`_kernels`' macros: a
tensor's address, the communicator of a group, MPI's error check, the route of a rank in
``source_target_pairs``, the wait).  Each kernel's arguments, tensors first (outputs after inputs),
then scalars:

==================  ==================================================================================
``allreduce``        x, out, count, dtype_code, op_code (every rank)
``allreduce_group``  x, out, count, dtype_code, op_code, group_key, groups
``allgather``        x, out, nbytes, group_key, groups (out: the group's blocks in group order)
``reduce_scatter``   x, out, count, dtype_code, op_code, group_key, groups (x: the blocks in order)
``send``             x, pairs, npairs, nbytes, channel_id; returns the request
``recv``             x, pairs, out, npairs, nbytes, channel_id, request
==================  ==================================================================================

``count`` is out's element count, ``nbytes`` a byte count; dtypes and reductions go by position in
:data:`DTYPES` and :data:`OPS`, groups by a key (:func:`group_key`) and their text (``groups``, the
runtime's encoding, NUL-terminated uint8), pairs as an int32 tensor of ``npairs`` (source, target)
rows: the IR names nothing that belongs to one process, so a module compiled in one runs in any.

Communicators: MPICH's are ints. Each groups string's communicator is made (``Comm.Split``, by the
generic path's own :func:`~.comm.group`, so both paths share it) on the first call that needs it;
the kernels then find it by key in a table in this process's memory, whose address is compiled
into them.

Send and recv: ``send`` posts ``MPI_Isend`` on x itself (no copy) and returns the request (an int:
nothing to allocate); the recv matched with it in the same function receives the request and x, so
that x stays allocated and unwritten while MPI may read it (the IR's last use of x is the recv),
posts its own ``MPI_Irecv`` and then completes both.  A rank that is no target gets zeros.  Every
rank posts its recv before waiting for its send, so ranks that all run one program cannot
deadlock; unlike the generic send, a large send therefore completes by its recv (collective-permute
semantics: StableHLO's, and MPI_Sendrecv's).  Which sends qualify is the IR side's decision.

A recv polls (``MPI_Test``, yielding the core every few polls: ranks may share cores) as long as
the generic recv's first phase; past that, or on any error or a byte count that differs, it hands
its requests to the generic path's Python code, which waits out the recv timeout and raises its
errors with its messages (a send still pending then ends the job: MPI may still read its payload).

Why it is safe: the kernels are compiled only after MPI has started and libmpi's symbols were made
global, so the JIT finds MPI's functions (an unresolved symbol would crash the process), and only
where MPI handles are plain integers (MPICH's ABI) and the MPI-4 large-count functions exist (counts
above 2^31 go in one call).  Until the kernels exist in a process (a module compiled elsewhere), the
names are served by the generic Python path, which builds them on its first call so that virtual
machines created afterwards call them directly.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
from typing import Any

import numpy as np

from ..spec import REDUCTIONS, checking_collectives
from . import tensors
from .comm import mpi

_PREFIX = "tvm_combiners.native."
#: The kernels' global function names.
NAMES = {kind: _PREFIX + kind for kind in ("allreduce", "allreduce_group", "allgather", "reduce_scatter", "send",
                                           "recv")}
NAME = NAMES["allreduce"]
#: Reductions and dtypes by position: the IR's ``op_code`` and ``dtype_code``. Only dtypes MPI reduces
#: itself: float16 and bfloat16 (MPI has no bfloat16, and MPI_SUM on its words would add integers) are
#: reduced by the generic path, in float32; allgather, send and recv move any dtype's bytes natively.
OPS = REDUCTIONS
DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float32", "float64")
_MPI_TYPES = ("INT8_T", "INT16_T", "INT32_T", "INT64_T", "UINT8_T", "UINT16_T", "UINT32_T", "UINT64_T",
              "FLOAT", "DOUBLE")
_ARR_DATA, _ARR_BYTE_OFFSET = 1, 8  # TVM's struct field kinds of a DLTensor
_LARGE_COUNT = ("MPI_Allreduce_c", "MPI_Allgather_c", "MPI_Reduce_scatter_block_c", "MPI_Isend_c", "MPI_Irecv_c",
                "MPI_Get_count_c")
# Python functions the kernels call, off their fast path only
_GROUP_FN, _ERROR_FN, _PAIRS_FN, _WAIT_FN = (_PREFIX + n for n in ("group", "error", "pairs_error", "recv_wait"))
#: Kinds by position, as the kernels name them to those Python functions.
_KINDS = ("allreduce", "allgather", "reduce_scatter", "send", "recv")
# A recv yields the core every this many polls (a native poll takes ~0.1 us: a peer sharing the core gets
# it within microseconds; a yield on every poll made it a syscall-bound loop on a loaded machine).
_YIELD_EVERY = 16
_TABLE = 1024  # groups strings the kernels can look up in one process (one more raises)

#: ``TVM_COMBINERS_NATIVE=0`` (or setting this False before compiling) keeps every collective generic; so
#: does the collectives check (``TVM_COMBINERS_CHECK_COLLECTIVES=1``), which lives in the generic path.
ENABLED = os.environ.get("TVM_COMBINERS_NATIVE", "1") != "0" and not checking_collectives()
_kernel: Any = None  # the compiled module (kept alive: the registry holds functions of it)
_unavailable: str | None = None  # why there are no native kernels in this process, once known
# The groups table the kernels scan: [entries, key 0, communicator 0, key 1, ...]. Its address is
# compiled into them, so it lives as long as the process.
_table = np.zeros(1 + 2 * _TABLE, np.int64)
_keys: dict[int, str] = {}  # key -> groups string, to refuse a key two strings share


def codes(op: str, dtype: str) -> tuple[int, int] | None:
    """(op_code, dtype_code) of a reduction the kernels can run, None otherwise."""
    if not ENABLED or op not in OPS or dtype not in DTYPES or (op == "avg" and not dtype.startswith("float")):
        return None
    if op in ("min", "max") and dtype.startswith("float"):
        return None  # MPI_MIN / MPI_MAX may drop a NaN: the generic path propagates it
    return OPS.index(op), DTYPES.index(dtype)


def group_key(groups: str) -> int:
    """The kernels' key for a groups string: 63 bits of its hash (0 is every rank, without groups)."""
    if not groups:
        return 0
    return int.from_bytes(hashlib.blake2b(groups.encode(), digest_size=8).digest(), "little") >> 1 or 1


def text_bytes(text: str) -> np.ndarray:
    """``text`` as the kernels take a groups string: NUL-terminated uint8."""
    return np.frombuffer(text.encode() + b"\0", np.uint8)


def _promote_libmpi() -> list[str]:
    """Make libmpi's symbols global (mpi4py loads it locally), so that JIT code resolves them."""
    with open("/proc/self/maps") as maps:
        paths = sorted({line.split()[-1] for line in maps if "/libmpi.so" in line})
    if not paths:
        raise OSError("libmpi is not loaded in this process")
    for path in paths:
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL | getattr(ctypes, "RTLD_NOLOAD", 4))
    return paths


def _int32(handle: int) -> int:
    """An MPICH handle as the C int it is (mpi4py may give it sign-extended to 64 bits)."""
    handle &= 0xFFFFFFFF
    return handle - (1 << 32) if handle & 0x80000000 else handle


def _kernels(MPI: Any) -> Any:
    """The TIR module of every kernel, with this process's MPI handles and table address compiled in."""
    import tvm
    from tvm.script import tirx as T

    world = _int32(MPI._handleof(MPI.COMM_WORLD))
    me, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    byte, request_null = _int32(MPI._handleof(MPI.BYTE)), _int32(MPI._handleof(MPI.REQUEST_NULL))
    tag_ub = int(MPI.COMM_WORLD.Get_attr(MPI.TAG_UB))
    status_ints = MPI._sizeof(MPI.Status) // 4
    types = [_int32(MPI._handleof(getattr(MPI, name))) for name in _MPI_TYPES]
    ops = [_int32(MPI._handleof(getattr(MPI, name))) for name in ("SUM", "PROD", "MIN", "MAX", "SUM")]
    f32, f64, avg = DTYPES.index("float32"), DTYPES.index("float64"), OPS.index("avg")
    table_at = int(_table.ctypes.data)
    from .functions import _SPIN_S  # the recv's polls, as long as the generic recv's

    spin_ns = int(_SPIN_S * 1e9)
    yield_every = _YIELD_EVERY
    kind = {k: i for i, k in enumerate(_KINDS)}

    def pick(code: Any, handles: list[int]) -> Any:
        expr = T.int32(handles[-1])
        for i in range(len(handles) - 2, -1, -1):
            expr = T.Select(code == i, T.int32(handles[i]), expr)
        return expr

    def addr(t: Any) -> Any:
        """A tensor's first element (its data pointer plus its byte offset)."""
        return T.handle_add_byte_offset(T.tvm_struct_get(t, 0, _ARR_DATA, "handle"),
                                        T.tvm_struct_get(t, 0, _ARR_BYTE_OFFSET, "int64"))

    @T.macro
    def check(rc: Any, kind_code: int) -> None:
        """MPI's return code: an error raises in Python with MPI's own message (rare: keep it off the path)."""
        if rc != 0:
            T.evaluate(T.call_packed(_ERROR_FN, kind_code, rc))

    @T.macro
    def find_comm(comm: Any, key: Any, groups: Any, kind_code: int) -> None:
        """``comm[0]``: this rank's communicator for ``key``; the first call for a key makes it (Python)."""
        table = T.decl_buffer((1 + 2 * _TABLE,), "int64", data=T.reinterpret("handle", T.uint64(table_at)))
        found = T.decl_buffer((1,), "int64")
        found[0] = T.int64(-1)
        for attempt in range(2):
            if found[0] < 0:
                if attempt == 1:
                    T.evaluate(T.call_packed(_GROUP_FN, kind_code, key, addr(groups)))
                for i in range(table[0]):
                    if table[1 + 2 * i] == key:
                        found[0] = table[2 + 2 * i]
        comm[0] = T.Cast("int32", found[0])  # an MPICH handle is a C int (the table holds its bits, unsigned)

    @T.macro
    def divide(dst: Any, count: Any, dtype_code: Any, op_code: Any, comm: Any) -> None:
        """avg: the sum divided by the group size."""
        if op_code == avg:
            n = T.decl_buffer((1,), "int32")
            n[0] = size
            if comm != world:
                T.evaluate(T.call_extern("int32", "MPI_Comm_size", comm, T.address_of(n[0])))
            if dtype_code == f32:
                out32 = T.decl_buffer((count,), "float32", data=dst)
                for i in range(count):
                    out32[i] = out32[i] / T.Cast("float32", n[0])
            elif dtype_code == f64:
                out64 = T.decl_buffer((count,), "float64", data=dst)
                for i in range(count):
                    out64[i] = out64[i] / T.Cast("float64", n[0])

    @T.macro
    def reduce(x: Any, out: Any, count: Any, dtype_code: Any, op_code: Any, comm: Any) -> None:
        check(T.call_extern("int32", "MPI_Allreduce_c", addr(x), addr(out), count, pick(dtype_code, types),
                            pick(op_code, ops), comm), kind["allreduce"])
        divide(addr(out), count, dtype_code, op_code, comm)

    @T.macro
    def route(peers: Any, pairs: Any, npairs: Any, kind_code: int) -> None:
        """``peers``: the rank this one receives from and the one it sends to, -1 where none. A rank
        outside the job (StableHLO's C4) raises in Python, with the generic path's message."""
        p = T.decl_buffer((2 * npairs,), "int32", data=addr(pairs))
        bad = T.decl_buffer((1,), "int32")
        peers[0] = -1
        peers[1] = -1
        bad[0] = 0
        for i in range(2 * npairs):
            if p[i] < 0 or p[i] >= size:
                bad[0] = 1
        for i in range(npairs):
            if p[2 * i + 1] == me:
                peers[0] = p[2 * i]
            if p[2 * i] == me:
                peers[1] = p[2 * i + 1]
        if bad[0] != 0:
            T.evaluate(T.call_packed(_PAIRS_FN, kind_code, addr(pairs), npairs))

    @T.macro
    def now(ts: Any, slot: int) -> None:
        T.evaluate(T.call_extern("int32", "clock_gettime", 1, T.address_of(ts[slot])))  # CLOCK_MONOTONIC

    @T.prim_func
    def allreduce(x: T.handle, out: T.handle, count: T.int64, dtype_code: T.int32, op_code: T.int32) -> None:
        T.func_attr({"global_symbol": "allreduce"})
        reduce(x, out, count, dtype_code, op_code, world)

    @T.prim_func
    def allreduce_group(x: T.handle, out: T.handle, count: T.int64, dtype_code: T.int32, op_code: T.int32,
                        key: T.int64, groups: T.handle) -> None:
        T.func_attr({"global_symbol": "allreduce_group"})
        comm = T.decl_buffer((1,), "int32")
        find_comm(comm, key, groups, kind["allreduce"])
        reduce(x, out, count, dtype_code, op_code, comm[0])

    @T.prim_func
    def allgather(x: T.handle, out: T.handle, nbytes: T.int64, key: T.int64, groups: T.handle) -> None:
        T.func_attr({"global_symbol": "allgather"})
        comm = T.decl_buffer((1,), "int32")
        find_comm(comm, key, groups, kind["allgather"])
        check(T.call_extern("int32", "MPI_Allgather_c", addr(x), nbytes, byte, addr(out), nbytes, byte, comm[0]),
              kind["allgather"])

    @T.prim_func
    def reduce_scatter(x: T.handle, out: T.handle, count: T.int64, dtype_code: T.int32, op_code: T.int32,
                       key: T.int64, groups: T.handle) -> None:
        T.func_attr({"global_symbol": "reduce_scatter"})
        comm = T.decl_buffer((1,), "int32")
        find_comm(comm, key, groups, kind["reduce_scatter"])
        check(T.call_extern("int32", "MPI_Reduce_scatter_block_c", addr(x), addr(out), count,
                            pick(dtype_code, types), pick(op_code, ops), comm[0]), kind["reduce_scatter"])
        divide(addr(out), count, dtype_code, op_code, comm[0])

    @T.prim_func
    def send(x: T.handle, pairs: T.handle, npairs: T.int32, nbytes: T.int64, channel_id: T.int32) -> T.int32:
        T.func_attr({"global_symbol": "send"})
        peers = T.decl_buffer((2,), "int32")  # source, target
        route(peers, pairs, npairs, kind["send"])
        req = T.decl_buffer((1,), "int32")
        req[0] = request_null
        if peers[1] >= 0:
            check(T.call_extern("int32", "MPI_Isend_c", addr(x), nbytes, byte, peers[1], tag_ub - channel_id, world,
                                T.address_of(req[0])), kind["send"])
        T.Return(req[0])

    @T.prim_func
    def recv(x: T.handle, pairs: T.handle, out: T.handle, npairs: T.int32, nbytes: T.int64, channel_id: T.int32,
             request: T.int32) -> None:
        T.func_attr({"global_symbol": "recv"})
        peers = T.decl_buffer((2,), "int32")  # source, target
        route(peers, pairs, npairs, kind["recv"])
        reqs = T.decl_buffer((2,), "int32")  # the recv's request, the send's
        flags = T.decl_buffer((4,), "int32")  # recv done, send done, their MPI return codes
        status = T.decl_buffer((status_ints,), "int32")
        ignored = T.decl_buffer((status_ints,), "int32")
        got = T.decl_buffer((1,), "int64")
        ts = T.decl_buffer((4,), "int64")  # start, now: (seconds, nanoseconds) each
        polls = T.decl_buffer((1,), "int32")
        polls[0] = 0
        reqs[0] = request_null
        reqs[1] = request
        got[0] = T.int64(-1)
        if peers[0] >= 0:
            check(T.call_extern("int32", "MPI_Irecv_c", addr(out), nbytes, byte, peers[0], tag_ub - channel_id, world,
                                T.address_of(reqs[0])), kind["recv"])
        else:
            T.evaluate(T.call_extern("handle", "memset", addr(out), 0, nbytes))  # no source: zeros
        flags[0] = T.Cast("int32", peers[0] < 0)
        flags[1] = T.Cast("int32", reqs[1] == request_null)
        flags[2] = 0
        flags[3] = 0
        now(ts, 0)
        ts[2] = ts[0]
        ts[3] = ts[1]
        # poll both (the recv is posted: a peer's send to this rank can complete), and every few polls give
        # the core to whoever else wants it: ranks may share cores, and the peer may be waiting for it
        while ((flags[0] == 0 or flags[1] == 0) and flags[2] == 0 and flags[3] == 0
               and (ts[2] - ts[0]) * 1000000000 + ts[3] - ts[1] < spin_ns):
            if flags[0] == 0:
                flags[2] = T.call_extern("int32", "MPI_Test", T.address_of(reqs[0]), T.address_of(flags[0]),
                                         T.address_of(status[0]))
                if flags[0] != 0 and flags[2] == 0:
                    T.evaluate(T.call_extern("int32", "MPI_Get_count_c", T.address_of(status[0]), byte,
                                             T.address_of(got[0])))
            if flags[1] == 0:
                flags[3] = T.call_extern("int32", "MPI_Test", T.address_of(reqs[1]), T.address_of(flags[1]),
                                         T.address_of(ignored[0]))
            if flags[0] == 0 or flags[1] == 0:
                polls[0] = polls[0] + 1
                if polls[0] % yield_every == 0:
                    T.evaluate(T.call_extern("int32", "sched_yield"))
                now(ts, 2)
        if (flags[0] == 0 or flags[1] == 0 or flags[2] != 0 or flags[3] != 0
                or (peers[0] >= 0 and got[0] != nbytes)):
            # still waiting, an error, or a size that differs: the generic recv's code finishes it
            T.evaluate(T.call_packed(_WAIT_FN, reqs[0], reqs[1], addr(out), nbytes, peers[0], peers[1], channel_id,
                                     flags[2], flags[3], got[0]))

    return tvm.IRModule({"allreduce": allreduce, "allreduce_group": allreduce_group, "allgather": allgather,
                         "reduce_scatter": reduce_scatter, "send": send, "recv": recv})


def _build(MPI: Any) -> Any:
    import tvm

    from ...compile.relax_runner import make_target

    target = make_target("llvm")  # this CPU, as every llvm module: the avg loops vectorize for it
    with tvm.transform.PassContext(opt_level=3), target:
        return tvm.compile(_kernels(MPI), target=target)


def prepare() -> bool:
    """Build and register the native kernels in this process (once); False where they cannot run."""
    global _kernel, _unavailable
    if _kernel is not None:
        return True
    if _unavailable is not None:
        return False
    try:
        MPI = mpi()
        if any(MPI._sizeof(cls) != 4 for cls in (MPI.Comm, MPI.Datatype, MPI.Op, MPI.Request)):
            raise OSError(f"MPI handles are not plain integers in {MPI.Get_library_version().splitlines()[0]}")
        libs = [ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL | getattr(ctypes, "RTLD_NOLOAD", 4))
                for path in _promote_libmpi()]
        missing = [f for f in _LARGE_COUNT if not any(hasattr(lib, f) for lib in libs)]
        if missing:  # an MPI before MPI-4: the JIT would not resolve them (and crash the process)
            raise OSError(f"libmpi has no {', '.join(missing)}")
        for name, func in _CALLBACKS.items():  # before any kernel can call them
            tensors.register(name, func)
        kernel = _build(MPI)
    except Exception as err:  # noqa: BLE001 - any failure leaves the generic path, which always works
        _unavailable = f"{type(err).__name__}: {err}"
        return False
    _kernel = kernel
    for kind, name in NAMES.items():
        tensors.register(name, kernel[kind])
    return True


# --- what the kernels call in Python: off their fast path -----------------------------------------


def _name(kind_code: int) -> str:
    return f"tvm_combiners.{_KINDS[kind_code]}"


def _on_group(kind_code: int, key: int, text: Any) -> None:
    """A kernel's first call for a groups string: its communicator (the generic path's, made now if
    this is the job's first use: collective), entered in the table the kernels scan."""
    from .comm import _groups, group

    groups = ctypes.string_at(text).decode()
    name = _name(kind_code)
    grp = _groups.get(groups) or group(groups, name)  # C4, every rank in one group: its errors
    if _keys.setdefault(key, groups) != groups:
        raise RuntimeError(f"{name}: groups {groups!r} and {_keys[key]!r} have one key: set TVM_COMBINERS_NATIVE=0")
    used = int(_table[0])
    if used >= _TABLE:
        raise RuntimeError(f"{name}: more than {_TABLE} groups strings in one process: set TVM_COMBINERS_NATIVE=0")
    _table[1 + 2 * used], _table[2 + 2 * used] = key, mpi()._handleof(grp.comm) & 0xFFFFFFFF  # >= 0: found
    _table[0] = used + 1


def _on_error(kind_code: int, code: int) -> None:
    raise RuntimeError(f"{_name(kind_code)}: {mpi().Get_error_string(code)}")


def _pairs_text(address: Any, npairs: int) -> str:
    from ..spec import encode_pairs

    flat = np.ctypeslib.as_array(ctypes.cast(address, ctypes.POINTER(ctypes.c_int32)), (2 * npairs,)).tolist()
    return encode_pairs(tuple(zip(flat[0::2], flat[1::2])))


def _on_pairs(kind_code: int, address: Any, npairs: int) -> None:
    """A rank outside the job in source_target_pairs: the generic path's check raises its error."""
    from .comm import route

    name, text = _name(kind_code), _pairs_text(address, npairs)
    route(text, name)
    raise RuntimeError(f"{name}: source_target_pairs {text!r} were refused natively but not by the runtime")


def _on_recv_wait(recv_request: int, send_request: int, out: Any, nbytes: int, source: int, target: int,
                  channel_id: int, recv_code: int, send_code: int, got: int) -> None:
    """A native recv that did not simply succeed: still waiting after its polls, an MPI error, or a
    byte count that differs. The generic recv's code finishes it, with its timeout and its errors."""
    from .functions import finish_native_recv

    view = tensors._view_at(int(out.value or 0) if out is not None else 0, (int(nbytes),), np.dtype(np.uint8))
    finish_native_recv(recv_request, send_request, view, source, target, channel_id, recv_code, send_code, got)


_CALLBACKS = {_GROUP_FN: _on_group, _ERROR_FN: _on_error, _PAIRS_FN: _on_pairs, _WAIT_FN: _on_recv_wait}


# --- the generic path under the kernels' names: modules compiled in another process ---------------


def _text(t: Any) -> str:
    """A NUL-terminated uint8 tensor as text."""
    return bytes(tensors.host_view(t)).split(b"\0", 1)[0].decode()


def _bytes(t: Any) -> np.ndarray:
    return tensors.host_view(t).reshape(-1).view(np.uint8)


def _later() -> None:
    """After a generic call: build the kernels for the virtual machines created from now on."""
    if _kernel is None and _unavailable is None:
        prepare()


def _generic_allreduce(x: Any, out: Any, count: int, dtype_code: int, op_code: int) -> None:
    from .functions import allreduce

    allreduce(x, OPS[op_code], "", out)
    _later()


def _generic_allreduce_group(x: Any, out: Any, count: int, dtype_code: int, op_code: int, key: int,
                             groups: Any) -> None:
    from .functions import allreduce

    allreduce(x, OPS[op_code], _text(groups), out)
    _later()


def _generic_allgather(x: Any, out: Any, nbytes: int, key: int, groups: Any) -> None:
    from .comm import _groups, group
    from .host_collectives import allgather_np

    text = _text(groups)
    grp = _groups.get(text) or group(text, _name(1))
    allgather_np(_name(1), grp, _bytes(x).reshape(1, -1), 0, _bytes(out).reshape(grp.size, -1))
    _later()


def _generic_reduce_scatter(x: Any, out: Any, count: int, dtype_code: int, op_code: int, key: int,
                            groups: Any) -> None:
    from .comm import _groups, group
    from .host_collectives import reduce_scatter_np

    text = _text(groups)
    grp = _groups.get(text) or group(text, _name(2))
    reduce_scatter_np(_name(2), grp, tensors.host_view(x).reshape(-1), OPS[op_code], 0,
                      tensors.host_view(out).reshape(-1))
    _later()


def _pairs_of(pairs: Any, npairs: int) -> str:
    from ..spec import encode_pairs

    flat = tensors.host_view(pairs).reshape(-1).tolist()[:2 * npairs]
    return encode_pairs(tuple(zip(flat[0::2], flat[1::2])))


def _generic_send(x: Any, pairs: Any, npairs: int, nbytes: int, channel_id: int) -> int:
    from .functions import send

    send(x, _pairs_of(pairs, npairs), channel_id, 0)  # a private copy: its recv waits for nothing
    return _int32(mpi()._handleof(mpi().REQUEST_NULL))


def _generic_recv(x: Any, pairs: Any, out: Any, npairs: int, nbytes: int, channel_id: int, request: int) -> None:
    from .functions import recv

    recv(_pairs_of(pairs, npairs), channel_id, 0, out)
    _later()


_GENERIC = {"allreduce": _generic_allreduce, "allreduce_group": _generic_allreduce_group,
            "allgather": _generic_allgather, "reduce_scatter": _generic_reduce_scatter, "send": _generic_send,
            "recv": _generic_recv}


def register_fallback() -> None:
    """Give every kernel name its generic implementation until the kernels exist in this process."""
    if _kernel is None:
        for kind, name in NAMES.items():
            tensors.register(name, _GENERIC[kind])
