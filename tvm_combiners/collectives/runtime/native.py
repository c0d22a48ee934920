"""A native allreduce over all ranks for host tensors: a kernel, JIT-compiled in this process, that
calls ``MPI_Allreduce`` itself.

Why: a small allreduce is latency-bound, and the generic path goes from the VM back into Python
(FFI callback, numpy views, mpi4py's argument parsing): ~3x raw MPI on 4 bytes.  The VM calls this
kernel like any compiled function, with no Python in between.

Why it is safe: the kernel is compiled only after MPI has started and libmpi's symbols were made
global, so the JIT finds ``MPI_Allreduce`` (an unresolved symbol would crash the process), and only
where MPI handles are plain integers (MPICH's ABI), so that they can be written into the code.  The
IR names dtypes and reductions by position in :data:`DTYPES` and :data:`OPS`, never by MPI handle, so
a module compiled in one process runs in any other.  Until the kernel exists there (a module compiled
elsewhere), the name is served by the generic Python path, which builds the kernel on its first
call so that virtual machines created afterwards call it directly.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

import numpy as np

from ..spec import REDUCTIONS, checking_collectives
from . import tensors
from .comm import mpi

NAME = "tvm_combiners.native.allreduce"
#: Reductions and dtypes by position: the IR's ``op_code`` and ``dtype_code``.
OPS = REDUCTIONS
DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float32", "float64")
_MPI_TYPES = ("INT8_T", "INT16_T", "INT32_T", "INT64_T", "UINT8_T", "UINT16_T", "UINT32_T", "UINT64_T",
              "FLOAT", "DOUBLE")
_ARR_DATA, _ARR_BYTE_OFFSET = 1, 8  # TVM's struct field kinds of a DLTensor
_CHUNK = 1 << 30  # elements per MPI_Allreduce call (its count is an int)

#: ``TVM_COMBINERS_NATIVE=0`` (or setting this False before compiling) keeps every allreduce generic; so
#: does the collectives check (``TVM_COMBINERS_CHECK_COLLECTIVES=1``), which lives in the generic path.
ENABLED = os.environ.get("TVM_COMBINERS_NATIVE", "1") != "0" and not checking_collectives()
_kernel: Any = None  # the compiled module (kept alive: the registry holds a function of it)
_unavailable: str | None = None  # why there is no native kernel in this process, once known


def codes(op: str, dtype: str) -> tuple[int, int] | None:
    """(op_code, dtype_code) of an allreduce the kernel can run, None otherwise."""
    if not ENABLED or op not in OPS or dtype not in DTYPES or (op == "avg" and not dtype.startswith("float")):
        return None
    if op in ("min", "max") and dtype.startswith("float"):
        return None  # MPI_MIN / MPI_MAX may drop a NaN: the generic path propagates it
    return OPS.index(op), DTYPES.index(dtype)


def _promote_libmpi() -> None:
    """Make libmpi's symbols global (mpi4py loads it locally), so that JIT code resolves them."""
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "/libmpi.so" in line}
    if not paths:
        raise OSError("libmpi is not loaded in this process")
    for path in sorted(paths):
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL | getattr(ctypes, "RTLD_NOLOAD", 4))


def _build(MPI: Any) -> Any:
    import tvm
    from tvm.script import tirx as T

    comm = MPI._handleof(MPI.COMM_WORLD)
    size = MPI.COMM_WORLD.Get_size()
    types = [MPI._handleof(getattr(MPI, name)) for name in _MPI_TYPES]
    sizes = [np.dtype(name).itemsize for name in DTYPES]
    ops = [MPI._handleof(getattr(MPI, name)) for name in ("SUM", "PROD", "MIN", "MAX", "SUM")]

    def pick(code: Any, handles: list[int]) -> Any:
        expr = T.int32(handles[-1])
        for i in range(len(handles) - 2, -1, -1):
            expr = T.Select(code == i, T.int32(handles[i]), expr)
        return expr

    def chunk_start(base: Any, k: Any, dtype_code: Any) -> Any:
        """Chunk ``k``'s address (a function: a local inside the script's loop becomes a buffer)."""
        return T.handle_add_byte_offset(base, k * _CHUNK * T.Cast("int64", pick(dtype_code, sizes)))

    f32, f64, avg = DTYPES.index("float32"), DTYPES.index("float64"), OPS.index("avg")

    @T.prim_func
    def allreduce(x: T.handle, out: T.handle, count: T.int64, dtype_code: T.int32, op_code: T.int32) -> None:
        T.func_attr({"global_symbol": "allreduce"})
        src = T.handle_add_byte_offset(T.tvm_struct_get(x, 0, _ARR_DATA, "handle"),
                                       T.tvm_struct_get(x, 0, _ARR_BYTE_OFFSET, "int64"))
        dst = T.handle_add_byte_offset(T.tvm_struct_get(out, 0, _ARR_DATA, "handle"),
                                       T.tvm_struct_get(out, 0, _ARR_BYTE_OFFSET, "int64"))
        # MPI counts are ints: more elements than fit one (2^31 - 1; a count cast to int32 reduced
        # count mod 2^32 elements and reported success) go in several calls
        for k in range((count + _CHUNK - 1) // _CHUNK):
            assert T.call_extern("int32", "MPI_Allreduce",
                                 chunk_start(src, k, dtype_code), chunk_start(dst, k, dtype_code),
                                 T.Cast("int32", T.min(count - k * _CHUNK, _CHUNK)), pick(dtype_code, types),
                                 pick(op_code, ops), T.int32(comm)) == 0, "tvm_combiners.allreduce: MPI_Allreduce failed"
        if op_code == avg:
            if dtype_code == f32:
                out32 = T.decl_buffer((count,), "float32", data=dst)
                for i in range(count):
                    out32[i] = out32[i] / T.float32(size)
            elif dtype_code == f64:
                out64 = T.decl_buffer((count,), "float64", data=dst)
                for i in range(count):
                    out64[i] = out64[i] / T.float64(size)

    from ...compile.relax_runner import make_target

    target = make_target("llvm")  # this CPU, as every llvm module: the avg loop vectorizes for it
    with tvm.transform.PassContext(opt_level=3), target:
        return tvm.compile(tvm.IRModule({"allreduce": allreduce}), target=target)


def prepare() -> bool:
    """Build and register the native kernel in this process (once); False where it cannot run."""
    global _kernel, _unavailable
    if _kernel is not None:
        return True
    if _unavailable is not None:
        return False
    try:
        MPI = mpi()
        if any(MPI._sizeof(cls) != 4 for cls in (MPI.Comm, MPI.Datatype, MPI.Op)):
            raise OSError(f"MPI handles are not plain integers in {MPI.Get_library_version().splitlines()[0]}")
        _promote_libmpi()
        kernel = _build(MPI)
    except Exception as err:  # noqa: BLE001 - any failure leaves the generic path, which always works
        _unavailable = f"{type(err).__name__}: {err}"
        return False
    _kernel = kernel
    tensors.register(NAME, kernel["allreduce"])
    return True


def _generic(x: Any, out: Any, count: int, dtype_code: int, op_code: int) -> None:
    """The name's first owner: the Python path, which also builds the kernel for later VMs."""
    from .functions import allreduce

    allreduce(x, OPS[op_code], "", out)
    if _kernel is None and _unavailable is None:
        prepare()


def register_fallback() -> None:
    if _kernel is None:
        tensors.register(NAME, _generic)
