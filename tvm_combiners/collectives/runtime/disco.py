"""TVM's ``R.ccl`` built-ins re-registered onto this runtime, so ``R.ccl`` modules run outside disco.

Relax legalizes ``R.ccl.allreduce`` to ``call_dps_packed("runtime.disco.allreduce", x,
ShapeTuple([kind]), in_group)``, ``R.ccl.allgather`` to ``runtime.disco.allgather(x, in_group)`` and
``R.ccl.broadcast_from_worker0`` to ``runtime.disco.broadcast_from_worker0(x, in_group)``, the output
passed last (checked in TVM 0.27 and 0.16).  Outside a disco session there is one group, all ranks,
so ``in_group`` selects nothing; worker 0 is rank 0.

Each call first checks that every rank gives an operand of one shape (one small allreduce): a
legalized ``R.ccl`` op does not say whether its shape was symbolic, and MPI takes ranks whose
shapes differ but whose byte counts agree, each reading the others' data in its own layout.
Under ``TVM_COMBINERS_CHECK_COLLECTIVES=1`` each also checks that every rank calls the same
collective (:func:`~.functions.same_call`), as the package's own ops do.
"""

from __future__ import annotations

from typing import Any

from ..spec import REDUCTIONS
from . import functions, host_collectives, tensors
from .comm import Group, group


def _gpu() -> Any:
    from . import nccl

    return nccl


def _out(name: str, rest: tuple[Any, ...]) -> Any:
    """The output from ``(in_group, out)`` (TVM 0.27) or ``(out,)`` (TVM 0.16)."""
    if len(rest) not in (1, 2):
        raise TypeError(f"{name}: expected (..., [in_group,] out), got {len(rest)} trailing arguments")
    return rest[-1]


def _checked(name: str, what: str, x: Any) -> Group:
    """The group of all ranks, once every rank gives ``x`` of one shape (and, in check mode, calls ``what``)."""
    grp = group("", name)
    if functions._CHECK:  # first: its message is of a fixed size, whatever the ranks' numbers of axes
        functions.same_call(name, grp, functions.describe(x, what, grp))
    functions.same_shape(name, what.split()[0], grp, x)
    return grp


def allreduce(x: Any, kind: Any, *rest: Any) -> None:
    name = "runtime.disco.allreduce"
    out = _out(name, rest)
    code = int(kind[0])
    if not 0 <= code < len(REDUCTIONS):  # R.ccl's op_type is an index into REDUCTIONS
        raise ValueError(f"{name}: unknown reduction code {code}: expected 0-{len(REDUCTIONS) - 1} "
                         f"({', '.join(REDUCTIONS)})")
    reduction = REDUCTIONS[code]
    grp = _checked(name, f"allreduce {reduction}", x)
    if tensors.is_host(x):
        host_collectives.allreduce_np(name, grp, tensors.host_view(x), reduction, tensors.host_view(out))
    else:
        _gpu().allreduce(name, "", grp, x, reduction, out)


def allgather(x: Any, *rest: Any) -> None:
    name = "runtime.disco.allgather"
    out = _out(name, rest)
    grp = _checked(name, "allgather axis 0", x)
    if tensors.is_host(x):
        host_collectives.allgather_np(name, grp, tensors.host_view(x), 0, tensors.host_view(out))
    else:
        _gpu().allgather(name, "", grp, x, 0, out)


def broadcast_from_worker0(x: Any, *rest: Any) -> None:
    name = "runtime.disco.broadcast_from_worker0"
    out = _out(name, rest)
    grp = _checked(name, "broadcast_from_worker0", x)
    if tensors.is_host(x):
        host_collectives.broadcast_np(name, grp, tensors.host_view(x), tensors.host_view(out))
    else:
        _gpu().broadcast(name, "", grp, x, out)


def scatter_from_worker0(x: Any, *rest: Any) -> None:
    name = "runtime.disco.scatter_from_worker0"
    out = _out(name, rest)
    grp = _checked(name, "scatter_from_worker0", x)
    if tensors.is_host(x):
        host_collectives.scatter_np(name, grp, tensors.host_view(x), tensors.host_view(out))
    else:
        staged = tensors.host_view(out) if tensors.is_host(out) else None
        host_out = staged if staged is not None else out.numpy()
        host_collectives.scatter_np(name, grp, tensors.host_copy(x), host_out)
        if staged is None:
            out.copyfrom(host_out)


OVERRIDES = {
    "runtime.disco.allreduce": allreduce,
    "runtime.disco.allgather": allgather,
    "runtime.disco.broadcast_from_worker0": broadcast_from_worker0,
    "runtime.disco.scatter_from_worker0": scatter_from_worker0,
}


def register_overrides() -> None:
    """Replace TVM's disco built-ins in this process (override=True; idempotent)."""
    for fname, func in OVERRIDES.items():
        tensors.register(fname, func)
