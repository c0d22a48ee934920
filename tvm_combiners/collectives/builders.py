"""The collective op builders, written once for both IRs.

Argument checking, spec construction and type checking are the same for Relax and Relay; only a
handful of IR primitives differ (what an expression is, its type's dims and dtype, how a call,
a tuple and a fresh token are made). Each IR module supplies those as an :class:`IRAdapter` and
takes its public builders from :func:`make_builders`, so the two cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from . import spec as S


@dataclass(frozen=True)
class IRAdapter:
    """The IR primitives the builders need; everything else about a builder is IR-neutral."""

    ir_name: str  # the IR's name in messages: "Relax", "Relay"
    expr_type: type  # what counts as an IR expression (relax.Expr, relay.Expr)
    type_of: Callable[[Any], Any]  # an expression's type, inferred if need be
    types: S.OperandTypes  # the IR's types as the type rule sees them (also the ops' type inference)
    call: Callable[[S.CollectiveSpec, Sequence[Any]], Any]  # the op call of a spec
    tuple: Callable[[list[Any]], Any]  # an IR tuple of expressions
    token: Callable[[], Any]  # a fresh token


def make_builders(ad: IRAdapter, module: str) -> tuple[Callable[..., Any], ...]:
    """``(allreduce, allgather, reduce_scatter, send, recv, after_all)`` for the IR of ``ad``.

    ``module`` is the IR module that exposes them (their ``__module__``, for help() and pickling).
    """

    def token_arg(kind: str, tok: Any) -> Any:
        if tok is None:
            return ad.token()
        if not isinstance(tok, ad.expr_type):
            raise S.CollectiveError(f"{kind}: token must be {S.TOKEN_DESCRIPTION}, got {tok!r}")
        ad.types.token(kind, "token", ad.type_of(tok))
        return tok

    def operand(kind: str, x: Any) -> tuple[Sequence[Any], str]:
        if not isinstance(x, ad.expr_type):
            raise S.CollectiveError(f"{kind}: x must be a {ad.ir_name} expression holding a tensor, got {x!r}")
        return ad.types.tensor(kind, "x", ad.type_of(x))

    def allreduce(x: Any, op: str = "sum", group: Any = None, *, world_size: int | None = None) -> Any:
        """Reduce ``x`` elementwise over the ranks of each group; every rank gets the result."""
        spec = S.allreduce_spec(op, group, world_size)
        shape, dtype = operand("allreduce", x)
        S.infer_type(spec, shape, dtype)
        return ad.call(spec, [x])

    def allgather(x: Any, axis: int = 0, group: Any = None, *, world_size: int | None = None) -> Any:
        """Concatenate ``x`` of every rank of the group along ``axis``, in the group's rank order."""
        shape, dtype = operand("allgather", x)
        spec = S.allgather_spec(axis, len(shape), group, world_size)
        S.infer_type(spec, shape, dtype)
        return ad.call(spec, [x])

    def reduce_scatter(x: Any, op: str = "sum", axis: int = 0, group: Any = None, *, world_size: int | None = None) -> Any:
        """Reduce ``x`` over the group; the rank at position i of its group keeps chunk i along ``axis``."""
        shape, dtype = operand("reduce_scatter", x)
        spec = S.reduce_scatter_spec(op, axis, len(shape), group, world_size)
        S.infer_type(spec, shape, dtype)
        return ad.call(spec, [x])

    def send(x: Any, source_target_pairs: Any, channel_id: int = 0, is_host_transfer: bool = False, token: Any = None) -> Any:
        """Send ``x`` from each source to its target (StableHLO send); returns a token."""
        spec = S.send_spec(source_target_pairs, channel_id, is_host_transfer)
        _, dtype = operand("send", x)
        S.check_dtype("send", dtype)
        tok = token_arg("send", token)
        return ad.call(spec, [x, tok])

    def recv(shape: Sequence[int], dtype: str, source_target_pairs: Any, channel_id: int = 0,
             is_host_transfer: bool = False, token: Any = None) -> Any:
        """Receive a ``shape``/``dtype`` payload from this rank's source; zeros on a rank no pair targets."""
        spec = S.recv_spec(shape, dtype, source_target_pairs, channel_id, is_host_transfer)
        tok = token_arg("recv", token)
        return ad.call(spec, [tok])

    def after_all(*tokens: Any) -> Any:
        """One token that comes after all ``tokens``."""
        for i, t in enumerate(tokens):
            if not isinstance(t, ad.expr_type):
                raise S.CollectiveError(f"after_all: argument {i} must be {S.TOKEN_DESCRIPTION}, got {t!r}")
            ad.types.token("after_all", f"argument {i}", ad.type_of(t))
        return ad.call(S.CollectiveSpec("after_all"), [ad.tuple(list(tokens))])

    out = (allreduce, allgather, reduce_scatter, send, recv, after_all)
    for f in out:
        f.__module__ = module
        f.__qualname__ = f.__name__
    return out
