"""What the main job needs from an IR, and the two IRs that provide it.

The job talks to Relax and Relay only through :class:`Backend`; a backend's module is imported
when its IR is chosen, so either environment runs the job with the IR it has.
"""

from __future__ import annotations

import importlib
import importlib.util

from ...errors import first_line
from .base import IRS, Backend

#: IR -> the module of its backend.
BACKENDS = {"relax": "tvm_combiners.app.backends.relax", "relay": "tvm_combiners.app.backends.relay"}


def ir_problem(ir: str) -> str | None:
    """Why ``ir`` cannot run in this environment (None when it can), with what to use instead.

    Importing the IR's package is the test: it fails exactly where a job would.
    """
    if ir not in IRS:
        return f"unknown IR {ir!r}: expected 'relax' or 'relay'"
    try:
        if ir == "relax" and importlib.util.find_spec("tvm_ffi") is None:  # TVM < 0.27: say why plainly
            raise ModuleNotFoundError("No module named 'tvm_ffi'")
        importlib.import_module(BACKENDS[ir])
    except Exception as err:  # ImportError mostly; an old TVM may fail in other ways on import
        try:
            import tvm

            version = f"TVM {tvm.__version__}"
        except ImportError:
            version = "no TVM"
        if ir == "relax":
            return (f"--ir relax needs apache-tvm >= 0.27 (with tvm_ffi); this environment has {version} "
                    f"({first_line(err)}): use --ir relay here, or the main environment (.venv/bin/tvm-combiners)")
        return (f"--ir relay needs a TVM build with Relay (upstream <= 0.19 or hhb-tvm); this environment has "
                f"{version} without it: use --ir relax here, or the Relay environment (.venv-relay/bin/tvm-combiners)")
    return None


def backend(ir: str) -> Backend:
    """The backend of ``ir`` (check :func:`ir_problem` first: importing it fails where the IR is missing)."""
    if ir == "relax":
        from .relax import RelaxBackend

        return RelaxBackend()
    from .relay import RelayBackend

    return RelayBackend()
