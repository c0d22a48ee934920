"""The collective ops once, IR-neutral: names, attributes, validation, shape and dtype rules.

The Relax and Relay adapters only translate: they show the operand types of their IR as an
:class:`OperandTypes`, take the result type from :func:`infer_call_type` (the type rule of every
op) and store a :class:`CollectiveSpec` as the call's ``DictAttrs`` (:meth:`CollectiveSpec.attrs`);
:meth:`CollectiveSpec.from_attrs` reads it back, so the combiners of the next stage compare ops by
``spec.key()`` without knowing either IR.

Argument layout (the same in both IRs, so combiners read operands by position):

- ``allreduce(x)``, ``allgather(x)``, ``reduce_scatter(x)``: one tensor operand;
- ``send(x, token)``: the payload and the token it is ordered after (a fresh constant token
  when the user passes none); returns a token;
- ``recv(token)``: the token it is ordered after; shape and dtype are attributes;
- ``after_all((t0, t1, ...))``: one tuple of tokens; returns a token.

A token is a 0-d int32 tensor in both IRs (the runtime contract). Tokens only order side effects in
the IR; lowering drops them (``recv`` never hands one to the runtime).

World size at compile time: ``allgather`` multiplies and ``reduce_scatter`` divides the axis by the
group size, so both need it statically. ``group=None`` (all ranks) is accepted for them only with
``world_size=N``, which is stored as the explicit group ``[[0, ..., N-1]]``: the runtime then
rejects a launch with fewer ranks (C4) instead of writing past a buffer. ``allreduce`` keeps its
shape and accepts ``group=None`` alone (stored as ``""``, every rank at run time).
"""

from __future__ import annotations

import functools
import numbers
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: Reductions of allreduce and reduce_scatter, by the names the runtime functions take (contract.md),
#: in the order that numbers them: the native kernel's ``op_code`` and TVM's ``R.ccl`` ``op_type``
#: (its ReduceKind) are indices here.
REDUCTIONS = ("sum", "prod", "min", "max", "avg")
#: Op kinds, in the order the docs list them.
KINDS = ("allreduce", "allgather", "reduce_scatter", "send", "recv", "after_all")
COLLECTIVE_KINDS = ("allreduce", "allgather", "reduce_scatter")
P2P_KINDS = ("send", "recv")
#: Kinds with a side effect: never removed, merged or moved into a dataflow block.
IMPURE_KINDS = COLLECTIVE_KINDS + P2P_KINDS

RELAX_PREFIX = "relax.collectives."
RELAY_PREFIX = "collectives."
RUNTIME_PREFIX = "tvm_combiners."
#: Called before a collective whose operand shape is only known at run time (ranks may disagree).
AGREE_SHAPES = RUNTIME_PREFIX + "agree_shapes"
#: Set to 1 for the ranks (before they compile): every collective first checks that its group calls the same one.
CHECK_COLLECTIVES_ENV = "TVM_COMBINERS_CHECK_COLLECTIVES"


def checking_collectives() -> bool:
    """Whether this process runs with the collectives check on (read once, at import, by the runtime)."""
    return os.environ.get(CHECK_COLLECTIVES_ENV, "") not in ("", "0")

TOKEN_DTYPE = "int32"
TOKEN_SHAPE: tuple[int, ...] = ()
TOKEN_DESCRIPTION = "a token (a 0-d int32 tensor)"

#: dtypes MPI and NCCL both move, and reduce on the host path. float16 and bfloat16 reach MPI as
#: 2-byte words, which MPI cannot reduce: the runtime reduces them in float32 copies, rounding once.
INT_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
SUPPORTED_DTYPES = INT_DTYPES + FLOAT_DTYPES
#: MPI guarantees tags up to 32767; the runtime derives the tag from channel_id.
MAX_CHANNEL_ID = 32767

Groups = tuple[tuple[int, ...], ...]
Pairs = tuple[tuple[int, int], ...]


class CollectiveError(ValueError):
    """Bad input to a collective op: the message names the op, the attribute and the rule."""


def register_error_class(cls: type) -> type:
    """Let the error keep its class when raised inside a TVM pass or type inference (through the FFI)."""
    try:
        import tvm_ffi

        tvm_ffi.register_error(cls.__name__, cls)
    except ImportError:  # TVM before the tvm_ffi split (0.16: Relay builds)
        from tvm._ffi import register_error

        register_error(cls.__name__, cls)
    return cls


register_error_class(CollectiveError)


def bfloat16_words_function(kind: str) -> str:
    """The runtime function of an allreduce or reduce_scatter whose uint16 tensors hold bfloat16: how
    Relay hands bfloat16 over (TVM 0.16's lowering labels a bfloat16 buffer float32 in ``call_packed``)."""
    return f"{RUNTIME_PREFIX}{kind}_bfloat16_words"


def relax_op_name(kind: str) -> str:
    return RELAX_PREFIX + kind


def relay_op_name(kind: str) -> str:
    return RELAY_PREFIX + kind


def kind_of_op_name(name: str) -> str | None:
    """The op kind of a Relax or Relay op name, None for any other op."""
    for prefix in (RELAX_PREFIX, RELAY_PREFIX):
        if name.startswith(prefix) and name[len(prefix) :] in KINDS:
            return name[len(prefix) :]
    return None


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_list(value: Any) -> bool:
    return isinstance(value, (list, tuple)) or (type(value).__name__ == "ndarray" and getattr(value, "ndim", 0) >= 1)


# --------------------------------------------------------------------------- attribute checks


def check_reduction(kind: str, op: Any) -> str:
    if not isinstance(op, str) or op not in REDUCTIONS:
        raise CollectiveError(f"{kind}: op {op!r} is not a reduction; expected one of {', '.join(REDUCTIONS)}")
    return op


def check_dtype(kind: str, dtype: str, what: str = "x") -> str:
    if dtype not in SUPPORTED_DTYPES:
        subject = f"dtype {dtype} is" if what == "dtype" else f"{what} has dtype {dtype}, which is"
        raise CollectiveError(f"{kind}: {subject} not supported; expected one of {', '.join(SUPPORTED_DTYPES)}")
    return dtype


def check_reduction_dtype(kind: str, op: str, dtype: str) -> None:
    check_dtype(kind, dtype)
    if op == "avg" and dtype not in FLOAT_DTYPES:
        raise CollectiveError(f"{kind}: op 'avg' needs a floating-point dtype, got {dtype} (an integer mean would truncate)")


def check_axis(kind: str, axis: Any, ndim: int) -> int:
    """The axis, normalized to ``0 <= axis < ndim``."""
    if not _is_int(axis):
        raise CollectiveError(f"{kind}: axis must be an integer, got {axis!r}")
    if not -ndim <= axis < ndim:
        raise CollectiveError(
            f"{kind}: axis {axis} is out of range for a {ndim}-d operand; expected {-ndim} <= axis < {ndim}"
        )
    return int(axis) % ndim


def check_world_size(kind: str, world_size: Any) -> int | None:
    if world_size is None:
        return None
    if not _is_int(world_size) or world_size < 1:
        raise CollectiveError(f"{kind}: world_size must be a positive integer, got {world_size!r}")
    return world_size


def check_groups(kind: str, group: Any, world_size: int | None = None) -> Groups | None:
    """Canonical replica groups: validated, ordered by their smallest rank (order inside kept).

    None stays None (every rank) unless ``world_size`` makes it the explicit group of all ranks.
    Every rank 0..n-1 must be in exactly one group and all groups must have the same size (a 2-D
    ``replica_groups`` as in StableHLO), so the group size is one number.
    """
    world_size = check_world_size(kind, world_size)
    if group is None:
        return None if world_size is None else (tuple(range(int(world_size))),)
    if not _is_list(group):
        raise CollectiveError(f"{kind}: group must be a list of lists of ranks, got {group!r}")
    if len(group) == 0:
        raise CollectiveError(f"{kind}: group must hold at least one group of ranks, got {group!r}")
    where: dict[int, int] = {}
    groups: list[tuple[int, ...]] = []
    for i, members in enumerate(group):
        if not _is_list(members):
            raise CollectiveError(f"{kind}: group {i} must be a list of ranks, got {members!r}")
        if len(members) == 0:
            raise CollectiveError(f"{kind}: group {i} is empty; every group needs at least one rank")
        for r in members:
            if not _is_int(r) or r < 0:
                raise CollectiveError(f"{kind}: group {i} holds {r!r}; ranks must be integers >= 0")
            if r in where:
                other = where[r]
                place = f"twice in group {i}" if other == i else f"in groups {other} and {i}"
                raise CollectiveError(f"{kind}: group rank {r} appears {place}; every rank must be in exactly one group")
            where[r] = i
        if len(members) != len(group[0]):
            raise CollectiveError(
                f"{kind}: group sizes differ ({len(group[0])} ranks in group 0, {len(members)} in group {i}); "
                "every group must have the same number of ranks"
            )
        groups.append(tuple(int(r) for r in members))
    total = len(where)
    missing = sorted(set(range(total)) - set(where))
    if missing:
        raise CollectiveError(
            f"{kind}: group does not cover ranks 0..{total - 1} (missing {', '.join(map(str, missing))}); "
            "every rank must be in exactly one group"
        )
    if world_size is not None and int(world_size) != total:
        raise CollectiveError(f"{kind}: world_size {world_size} disagrees with group, which covers {total} ranks")
    return tuple(sorted(groups, key=min))


def check_pairs(kind: str, pairs: Any) -> Pairs:
    """source_target_pairs after StableHLO's C1-C3 (C4's upper bound is checked at run time)."""
    if not _is_list(pairs):
        raise CollectiveError(f"{kind}: source_target_pairs must be a list of [source, target] pairs, got {pairs!r}")
    out: list[tuple[int, int]] = []
    for i, pair in enumerate(pairs):
        if not _is_list(pair) or len(pair) != 2:
            raise CollectiveError(
                f"{kind}: source_target_pairs entry {i} is {pair!r}; each entry must be a [source, target] pair (C1)"
            )
        for r in pair:
            if not _is_int(r) or r < 0:
                raise CollectiveError(
                    f"{kind}: source_target_pairs entry {i} holds {r!r}; ranks must be integers >= 0 "
                    "(C4: the upper bound, the number of ranks, is checked at run time)"
                )
        out.append((int(pair[0]), int(pair[1])))
    for side, position, rule in (("source", 0, "C2"), ("target", 1, "C3")):
        seen: set[int] = set()
        for pair in out:
            if pair[position] in seen:
                raise CollectiveError(
                    f"{kind}: source_target_pairs {side} {pair[position]} appears more than once; "
                    f"{side}s must be unique ({rule})"
                )
            seen.add(pair[position])
    return tuple(sorted(out))  # a set of pairs: a send and its recv listing them in two orders still match


def check_channel_id(kind: str, channel_id: Any) -> int:
    if not _is_int(channel_id) or not 0 <= channel_id <= MAX_CHANNEL_ID:
        raise CollectiveError(
            f"{kind}: channel_id must be an integer in [0, {MAX_CHANNEL_ID}] (MPI's guaranteed tag range), "
            f"got {channel_id!r}"
        )
    return int(channel_id)


def check_host_transfer(kind: str, is_host_transfer: Any) -> bool:
    if not isinstance(is_host_transfer, bool):
        raise CollectiveError(
            f"{kind}: is_host_transfer must be a bool, got {is_host_transfer!r} "
            "(C5: it selects the channel type, DEVICE_TO_HOST when true, DEVICE_TO_DEVICE otherwise)"
        )
    return is_host_transfer


def check_recv_shape(shape: Any) -> tuple[int, ...]:
    if not _is_list(shape) or not all(_is_int(d) and d >= 0 for d in shape):
        raise CollectiveError(f"recv: shape must be a list of integers >= 0, got {shape!r}")
    return tuple(int(d) for d in shape)


def check_token(kind: str, what: str, shape: Sequence[Any] | None, dtype: str | None) -> None:
    """``shape``/``dtype`` of the argument's tensor type, None when it is no tensor at all."""
    if shape is None or dtype != TOKEN_DTYPE or len(shape) != 0:
        got = "a non-tensor" if shape is None else f"a tensor of shape {tuple(shape)} and dtype {dtype}"
        raise CollectiveError(f"{kind}: {what} must be {TOKEN_DESCRIPTION}, got {got}")


def check_tensor(kind: str, shape: Sequence[Any] | None, what: str = "x") -> None:
    if shape is None:
        raise CollectiveError(f"{kind}: {what} must be a tensor of known rank")


# --------------------------------------------------------------------------- encodings


def encode_groups(groups: Groups | None) -> str:
    return "" if groups is None else ";".join(",".join(map(str, g)) for g in groups)


class PairError(ValueError):
    """A source_target_pairs entry of integers that are not two ranks (StableHLO's C1)."""

    def __init__(self, entry: str) -> None:
        super().__init__(f"source_target_pairs entry {entry!r} is not a source,target pair")
        self.entry = entry  #: the entry's text, as the string holds it


def _decode_ranks(entry: str) -> tuple[int, ...]:
    return tuple(int(r) for r in entry.split(","))


def decode_groups(text: str) -> Groups | None:
    """``"0,2;1,3"`` -> ((0, 2), (1, 3)); ``""`` -> None (every rank).

    Only parses (ValueError for a rank that is no integer): the compiler checks the groups with
    :func:`check_groups`, the runtime against the job's ranks.
    """
    if text == "":
        return None
    return tuple(_decode_ranks(g) for g in text.split(";"))


def encode_pairs(pairs: Pairs) -> str:
    return ";".join(f"{s},{t}" for s, t in pairs)


def decode_pairs(text: str) -> Pairs:
    """``"0,1;1,0"`` -> ((0, 1), (1, 0)); ``""`` -> ().

    Entries are read in order; the first bad one raises ValueError (a rank that is no integer) or
    :class:`PairError` (not two ranks). Uniqueness (C2, C3) is left to the caller, as in
    :func:`decode_groups`.
    """
    if text == "":
        return ()
    out = []
    for entry in text.split(";"):
        ranks = _decode_ranks(entry)
        if len(ranks) != 2:
            raise PairError(entry)
        out.append((ranks[0], ranks[1]))
    return tuple(out)


# --------------------------------------------------------------------------- the spec


@dataclass(frozen=True)
class CollectiveSpec:
    """One op's kind and attributes: what both IRs store and what a combiner keys on.

    ``groups`` None means every rank (allreduce only); ``axis`` is normalized (>= 0); ``shape`` and
    ``dtype`` are set for recv only (its payload type is an attribute, there is no operand).
    """

    kind: str
    op: str | None = None
    axis: int | None = None
    groups: Groups | None = None
    pairs: Pairs | None = None
    channel_id: int | None = None
    is_host_transfer: bool = False
    shape: tuple[int, ...] | None = None
    dtype: str | None = None

    @property
    def group_size(self) -> int | None:
        """Ranks per group, None when the op runs over every rank (unknown at compile time)."""
        return None if self.groups is None else len(self.groups[0])

    @property
    def op_name_relax(self) -> str:
        return relax_op_name(self.kind)

    @property
    def op_name_relay(self) -> str:
        return relay_op_name(self.kind)

    @property
    def impure(self) -> bool:
        return self.kind in IMPURE_KINDS

    def attrs(self) -> dict[str, Any]:
        """The ``DictAttrs`` fields (strings and ints, so both IRs print, compare and hash them)."""
        kind = self.kind
        if kind == "allreduce":
            return {"op": self.op, "groups": encode_groups(self.groups)}
        if kind == "allgather":
            return {"axis": self.axis, "groups": encode_groups(self.groups)}
        if kind == "reduce_scatter":
            return {"op": self.op, "axis": self.axis, "groups": encode_groups(self.groups)}
        if kind in P2P_KINDS:
            out: dict[str, Any] = {
                "source_target_pairs": encode_pairs(self.pairs or ()),
                "channel_id": self.channel_id,
                "is_host_transfer": self.is_host_transfer,
            }
            if kind == "recv":
                out["shape"] = list(self.shape or ())
                out["dtype"] = self.dtype
            return out
        return {}

    @classmethod
    def from_attrs(cls, kind: str, attrs: Mapping[str, Any] | None) -> CollectiveSpec:
        """Read back :meth:`attrs` from either IR (values may be TVM strings and IntImms), checked by
        the rules the builders apply: a call built by hand or loaded from text reaches the passes and
        the runtime only with valid attributes (``op="foo"`` failed at run time; unequal groups ran)."""
        if kind not in KINDS:
            raise CollectiveError(f"unknown collective op kind {kind!r}; expected one of {', '.join(KINDS)}")

        def get(name: str, read: Any, what: str) -> Any:
            try:
                value = attrs[name] if attrs is not None else None
            except (KeyError, IndexError, RuntimeError):  # TVM 0.16's DictAttrs: an InternalError
                value = None
            if value is None:
                raise CollectiveError(f"{kind}: attribute {name!r} is missing")
            try:
                return read(value)
            except (TypeError, ValueError):
                raise CollectiveError(f"{kind}: attribute {name} {value!r} is not {what}") from None

        text, integer = (str, "a string"), (int, "an integer")
        if kind in COLLECTIVE_KINDS:  # the specs are cached: the combiners read many ops of equal attributes
            return _collective_spec(kind, get("op", *text) if kind != "allgather" else None,
                                    get("axis", *integer) if kind != "allreduce" else None, get("groups", *text))
        if kind in P2P_KINDS:
            recv = kind == "recv"
            return _p2p_spec(kind, get("source_target_pairs", *text), get("channel_id", *integer),
                             get("is_host_transfer", *integer),
                             get("shape", _int_tuple, "a list of integers") if recv else None,
                             get("dtype", *text) if recv else None)
        return cls(kind=kind)

    def key(self) -> tuple:
        """Everything but the operand that must agree for two ops to be combined."""
        return (self.kind, self.op, self.axis, self.groups, self.pairs, self.channel_id, self.is_host_transfer)

    def runtime_call(self) -> tuple[str, list[str | int]]:
        """The runtime function and its non-tensor arguments (contract.md), in order.

        Tensor arguments go around them: inputs first (``x``, none for recv), the output last.
        """
        name = RUNTIME_PREFIX + self.kind
        groups = encode_groups(self.groups)
        if self.kind == "allreduce":
            return name, [self.op, groups]
        if self.kind == "allgather":
            return name, [self.axis, groups]
        if self.kind == "reduce_scatter":
            return name, [self.op, self.axis, groups]
        if self.kind in P2P_KINDS:
            return name, [encode_pairs(self.pairs or ()), self.channel_id, int(self.is_host_transfer)]
        raise CollectiveError(f"{self.kind}: has no runtime function (it only orders tokens)")


# --------------------------------------------------------------------------- builders' rules


def allreduce_spec(op: Any, group: Any, world_size: Any = None) -> CollectiveSpec:
    return CollectiveSpec("allreduce", op=check_reduction("allreduce", op), groups=check_groups("allreduce", group, world_size))


def _sized_groups(kind: str, group: Any, world_size: Any) -> Groups:
    groups = check_groups(kind, group, world_size)
    if groups is None:
        raise CollectiveError(
            f"{kind}: group=None leaves the group size unknown at compile time; pass group=[[...]] or world_size=N"
        )
    return groups


def allgather_spec(axis: Any, ndim: int, group: Any, world_size: Any = None) -> CollectiveSpec:
    axis = check_axis("allgather", axis, ndim)
    return CollectiveSpec("allgather", axis=axis, groups=_sized_groups("allgather", group, world_size))


def reduce_scatter_spec(op: Any, axis: Any, ndim: int, group: Any, world_size: Any = None) -> CollectiveSpec:
    op = check_reduction("reduce_scatter", op)
    axis = check_axis("reduce_scatter", axis, ndim)
    return CollectiveSpec("reduce_scatter", op=op, axis=axis, groups=_sized_groups("reduce_scatter", group, world_size))


def send_spec(pairs: Any, channel_id: Any, is_host_transfer: Any) -> CollectiveSpec:
    return CollectiveSpec(
        "send",
        pairs=check_pairs("send", pairs),
        channel_id=check_channel_id("send", channel_id),
        is_host_transfer=check_host_transfer("send", is_host_transfer),
    )


def recv_spec(shape: Any, dtype: Any, pairs: Any, channel_id: Any, is_host_transfer: Any) -> CollectiveSpec:
    shape = check_recv_shape(shape)
    if not isinstance(dtype, str):
        raise CollectiveError(f"recv: dtype must be a string such as 'float32', got {dtype!r}")
    check_dtype("recv", dtype, what="dtype")
    return CollectiveSpec(
        "recv",
        pairs=check_pairs("recv", pairs),
        channel_id=check_channel_id("recv", channel_id),
        is_host_transfer=check_host_transfer("recv", is_host_transfer),
        shape=shape,
        dtype=dtype,
    )


def infer_type(spec: CollectiveSpec, shape: Sequence[Any] | None, dtype: str | None) -> tuple[tuple[Any, ...], str]:
    """Check the operand type of a one-operand op and return the result's (shape, dtype).

    ``shape`` holds ints for static extents and any other object for symbolic ones (kept as they
    are, except on the gathered/scattered axis, which must be static); None: not a tensor.
    """
    kind = spec.kind
    if kind == "recv":
        return tuple(spec.shape or ()), str(spec.dtype)
    if kind in ("send", "after_all"):
        return TOKEN_SHAPE, TOKEN_DTYPE
    check_tensor(kind, shape)
    assert shape is not None and dtype is not None
    if kind == "allreduce":
        check_reduction_dtype(kind, str(spec.op), dtype)
        return tuple(shape), dtype
    if kind == "reduce_scatter":
        check_reduction_dtype(kind, str(spec.op), dtype)
    else:
        check_dtype(kind, dtype)
    axis = check_axis(kind, spec.axis, len(shape))
    n = spec.group_size
    if n is None:  # the builders refuse this; a hand-written call reaches it
        raise CollectiveError(f"{kind}: groups is empty (all ranks), and the group size is needed to infer the "
                              "result's shape; name the ranks ('0,1') or build the op with world_size")
    extent = shape[axis]
    role = "gathered" if kind == "allgather" else "scattered"
    if not _is_int(extent):
        raise CollectiveError(f"{kind}: axis {axis} has the symbolic extent {extent}; the {role} axis must be static")
    if kind == "allgather":
        new = extent * n
    else:
        if extent % n != 0:
            raise CollectiveError(f"reduce_scatter: axis {axis} has extent {extent}, which is not divisible by the group size {n}")
        new = extent // n
    out = list(shape)
    out[axis] = new
    return tuple(out), dtype


@dataclass(frozen=True)
class OperandTypes:
    """How one IR shows its operand types to :func:`infer_call_type` (and to the builders).

    ``tensor`` and ``token`` raise :class:`CollectiveError` in the IR's own words for a type that
    is not what it must be (an unannotated Relay variable, a dynamic extent, an unknown rank), so the
    rule itself never looks at an IR type.
    """

    tensor: Callable[[str, str, Any], tuple[Sequence[Any], str]]  # (kind, what, type) -> (dims, dtype)
    token: Callable[[str, str, Any], None]  # (kind, what, type): raises unless a token type
    fields: Callable[[Any], Sequence[Any] | None]  # a tuple type's field types; None: no tuple type
    describe: Callable[[Any], str]  # a type, in messages


def infer_call_type(spec: CollectiveSpec, arg_types: Sequence[Any], types: OperandTypes) -> tuple[tuple[Any, ...], str]:
    """The type rule of every op: check the operand types of a call of ``spec`` (in the argument
    layout of the module docstring) and return the result's (shape, dtype), see :func:`infer_type`."""
    kind = spec.kind
    shape: Sequence[Any] | None = None
    dtype: str | None = None
    if kind == "after_all":
        fields = types.fields(arg_types[0])
        if fields is None:
            raise CollectiveError(f"after_all: its argument must be a tuple of tokens, got {types.describe(arg_types[0])}")
        for i, field in enumerate(fields):
            types.token(kind, f"argument {i}", field)
    elif kind == "recv":
        types.token(kind, "token", arg_types[0])
    elif kind == "send":
        _, payload_dtype = types.tensor(kind, "x", arg_types[0])
        check_dtype(kind, payload_dtype)
        types.token(kind, "token", arg_types[1])
    else:
        shape, dtype = types.tensor(kind, "x", arg_types[0])
    return infer_type(spec, shape, dtype)


def _int_tuple(values: Any) -> tuple[int, ...]:
    return tuple(int(v) for v in values)


def _decoded(kind: str, name: str, text: str, decode: Any) -> Any:
    try:
        return decode(text)
    except ValueError:
        raise CollectiveError(f"{kind}: attribute {name} {text!r} is not in its encoding ('0,1;2,3')") from None


@functools.lru_cache(maxsize=4096)
def _collective_spec(kind: str, op: str | None, axis: int | None, groups: str) -> CollectiveSpec:
    if op is not None:
        check_reduction(kind, op)
    decoded = _decoded(kind, "groups", groups, decode_groups)
    if decoded is not None:
        check_groups(kind, [list(g) for g in decoded])
    return CollectiveSpec(kind=kind, op=op, axis=axis, groups=decoded)


@functools.lru_cache(maxsize=4096)
def _p2p_spec(kind: str, pairs: str, channel_id: int, host: int, shape: tuple[int, ...] | None,
              dtype: str | None) -> CollectiveSpec:
    decoded = check_pairs(kind, [list(p) for p in _decoded(kind, "source_target_pairs", pairs, decode_pairs)])
    check_channel_id(kind, channel_id)
    if shape is not None:
        check_recv_shape(list(shape))
    if dtype is not None:
        check_dtype(kind, dtype, "dtype")
    return CollectiveSpec(kind=kind, pairs=decoded, channel_id=channel_id, is_host_transfer=bool(host),
                          shape=shape, dtype=dtype)
