"""Zero-copy numpy views of TVM tensors and global-function registration, for TVM 0.27 and 0.16.

TVM 0.27 (tvm_ffi) hands packed functions ``tvm.runtime.Tensor`` objects, which numpy reads through
DLPack without a copy.  TVM 0.16 hands ``tvm.nd.NDArray`` views of the DLTensor that compiled code
passed (``te.extern`` + ``call_packed``); numpy 1.x marks DLPack imports read-only, so there the view
is built from the DLTensor's data pointer instead.  Both views alias the tensor's memory.

bfloat16, which numpy lacks, is ml_dtypes' numpy dtype of that name (both TVMs depend on ml_dtypes).
TVM 0.27 exports it through DLPack as bfloat16, which ``np.from_dlpack`` refuses: the view is then
built from the tensor's address.  TVM 0.16's ``numpy()`` returns a bfloat16 tensor's uint16 words,
and its TIR lowering hands ``call_packed`` a bfloat16 buffer labelled float32 (its BF16 legalization
rewrites the typed zero that carries the buffer's dtype): Relay therefore hands bfloat16 over as
uint16 words (see ``collectives/relay/ops.py``), which :func:`bfloat16_words` reads back.
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

from .comm import mpi
from .rank_main import LOST_ERROR_PREFIX

CPU, CUDA, CUDA_HOST = 1, 2, 3
BFLOAT16 = np.dtype(ml_dtypes.bfloat16)

try:
    import tvm_ffi

    NEW_FFI = True
except ImportError:  # TVM <= 0.19: tvm.register_func, tvm.nd.NDArray
    tvm_ffi = None
    NEW_FFI = False


def register(name: str, func: Callable[..., Any]) -> None:
    """Register (or re-register) a global packed function in either TVM generation.

    TVM's libraries register their own functions (``runtime.disco.*`` among them) when they load,
    and abort the process if the name is taken: load them first, then override.
    """
    import tvm

    if NEW_FFI:
        tvm_ffi.register_global_func(name, func, override=True)
    else:
        tvm.register_func(name, _saying_errors(func), override=True)


def _saying_errors(func: Callable[..., Any]) -> Callable[..., Any]:
    """TVM 0.16 keeps a Python error raised inside compiled code as an object its graph executor then
    replaces with an empty ``TVMError:`` (a recv's timeout, a C4 violation: no message at all), so the
    error is printed on stderr before it is raised."""

    @functools.wraps(func)
    def call(*args: Any) -> Any:
        try:
            return func(*args)
        except Exception as err:
            print(f"{LOST_ERROR_PREFIX}{type(err).__name__}: {err}", file=sys.stderr, flush=True)
            raise

    return call


_dtypes: dict[Any, np.dtype] = {}


def _legacy_view(t: Any) -> np.ndarray:
    handle = t.handle.contents
    code = handle.dtype
    key = (code.type_code, code.bits, code.lanes)
    dtype = _dtypes.get(key)
    if dtype is None:
        dtype = _dtypes[key] = np.dtype(str(code))
    return _view_at(handle.data + handle.byte_offset, t.shape, dtype)


def _view_at(address: int, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A writable numpy view of ``shape`` elements of ``dtype`` at ``address`` (no copy)."""
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes == 0:
        return np.empty(shape, dtype)
    return np.frombuffer(mpi().buffer.fromaddress(address, nbytes), dtype).reshape(shape)


def _dlpack_view(t: Any) -> np.ndarray:
    try:
        return np.from_dlpack(t)
    except (BufferError, RuntimeError, TypeError):  # a dtype DLPack-to-numpy lacks: bfloat16, float8_*
        return _address_view(t)


def _address_view(t: Any) -> np.ndarray:
    """A view built from the tensor's address, in ml_dtypes' numpy dtype of the same name."""
    try:
        dtype = np.dtype(str(t.dtype))
    except TypeError as err:
        raise TypeError(f"tvm_combiners: a {t.dtype} tensor has no numpy view here ({err})") from None
    return _view_at(data_ptr(t), tuple(int(d) for d in t.shape), dtype)


# host_view(t): a writable numpy view of a CPU tensor (no copy); bound directly, it sits on the hot path.
host_view: Callable[[Any], np.ndarray] = _dlpack_view if NEW_FFI else _legacy_view


def device_type(t: Any) -> int:
    """DLPack device type: 1 cpu, 2 cuda, 3 cuda host memory."""
    return t.__dlpack_device__()[0]


def is_host(t: Any) -> bool:
    return t.__dlpack_device__()[0] in (CPU, CUDA_HOST)


def data_ptr(t: Any) -> int:
    """Address of the tensor's first element (device memory for cuda tensors)."""
    if NEW_FFI:
        return int(t.data_ptr())
    handle = t.handle.contents
    return int(handle.data) + int(handle.byte_offset)


def np_dtype(t: Any) -> np.dtype:
    return np.dtype(str(t.dtype))


def current_stream(t: Any) -> int:
    """TVM's current stream for the tensor's device (0, the default stream, on TVM without tvm_ffi)."""
    if NEW_FFI:
        return int(tvm_ffi.get_raw_stream(t.device))
    return 0


def host_copy(t: Any) -> np.ndarray:
    """A device tensor on the host, after the kernels on TVM's current stream that produce it: the
    copy runs on the legacy default stream, which does not wait for a non-blocking stream (torch's).
    In the tensor's own dtype: TVM 0.16's ``numpy()`` gives bfloat16 as uint16 words."""
    stream = current_stream(t)
    if stream:
        t.device.sync(stream)
    copy = t.numpy()
    want = np_dtype(t)
    return copy if copy.dtype == want else copy.view(want)


def bfloat16_words(words: np.ndarray) -> np.ndarray:
    """uint16 words that hold bfloat16 values, read as bfloat16 (a view, no copy)."""
    if words.dtype != np.uint16:
        raise TypeError(f"tvm_combiners: bfloat16 words must be a uint16 tensor, got {words.dtype}")
    return words.view(BFLOAT16)
