"""IR-neutral random programs of collectives and transfers, for the collective combiners' fuzzers.

Three silent wrong results in the combiners came from programs the hand-written cases lacked: a
channel's transfers left open across collectives, so that moving a group member reordered the
channel's sends. The programs drawn here keep 1-3 channels of 2-4 transfers open across other
steps, mix payload types and host transfers on a channel, and let sends read collective results
and collectives read recvs. A :class:`Program` is resolved once here, in program order, into
plain :class:`Op` s; the Relax builder (``tests/fuzz/build_collectives_relax.py``) and the Relay
one (``tests/relay/fuzz/``) only map each op to a call. One rank (world size 1): every collective
is exact, so outputs compare bitwise. Both environments import this file (it needs no TVM).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import strategies as st

#: Value types (shape, dtype). Inputs are small integers, so every dtype stays exact.
TYPES: tuple[tuple[tuple[int, ...], str], ...] = (
    ((4,), "float32"),
    ((2, 3), "int32"),
    ((3,), "float32"),
    ((2, 2), "float16"),
)
#: Channel ids a program draws from (distinct per program; 100+ are far from any a pass creates).
CHANNEL_IDS = (1, 2, 7, 11, 100, 101)
REDUCTIONS = ("sum", "max", "min", "sum")  # sum twice: more allreduces share a key
#: The pass settings both IRs fuzz, by name: the combiners each runs, in order, with their options
#: (each alone, all of them, thresholds that split groups, a size cap, two in a row).
PASS_SETTINGS: dict[str, tuple[tuple[str, dict[str, object]], ...]] = {
    "AllReduceCombiner": (("AllReduceCombiner", {}),),
    "AllGatherCombiner": (("AllGatherCombiner", {}),),
    "ReduceScatterCombiner": (("ReduceScatterCombiner", {}),),
    "SendRecvCombiner": (("SendRecvCombiner", {}),),
    "CombineCollectives": (("CombineCollectives", {}),),
    "CombineCollectives(count=3,any_dim)": (("CombineCollectives", {"threshold_count": 3, "combine_by_dim": False}),),
    "CombineCollectives(bytes=24)": (("CombineCollectives", {"threshold_bytes": 24, "threshold_count": 2}),),
    "CombineCollectives(max_op_bytes=16)": (("CombineCollectives", {"max_op_bytes": 16}),),
    "AllReduce+SendRecv": (("AllReduceCombiner", {}), ("SendRecvCombiner", {})),
}


#: Settings whose second run must leave their output unchanged. Others may merge more on a second
#: run, by design: a cap (count, bytes, max_op_bytes) closes groups early; with ``combine_by_dim``,
#: combined allgathers are 1-D along axis 0, so groups of different dims merge; and in
#: ``CombineCollectives`` a later family's combining can free a group of an earlier one (measured on
#: programs of 10-45 steps: 1 in 150 with ``combine_by_dim=False``).
IDEMPOTENT = frozenset({"AllReduceCombiner", "SendRecvCombiner", "AllReduce+SendRecv"})


def setting_passes(combiners: Any, name: str) -> list[Any]:
    """The passes of setting ``name``, from an IR's combiners module (run them in a Sequential)."""
    return [getattr(combiners, combiner)(**options) for combiner, options in PASS_SETTINGS[name]]


@dataclass(frozen=True)
class Transfer:
    type: int  # index into TYPES
    host: bool


@dataclass(frozen=True)
class Channel:
    id: int
    transfers: tuple[Transfer, ...]


@dataclass(frozen=True)
class Program:
    """What hypothesis draws and shrinks: parameter types, channels, and raw steps.

    A step is ``(code, i, j)``: ``code`` picks the kind of step, ``i`` and ``j`` its operands and
    attributes; :func:`resolve` interprets them (a send when every channel is done becomes a
    collective, so every draw is a valid program).
    """

    params: tuple[int, ...]  # indices into TYPES
    channels: tuple[Channel, ...]
    steps: tuple[tuple[int, int, int], ...]


@dataclass(frozen=True)
class Op:
    """One resolved step. Values are numbered: parameters first, then one per op, in order."""

    kind: str  # allreduce | allgather | reduce_scatter | add | offset | send | recv
    args: tuple[int, ...]  # value ids read (a recv's optional token: the id of its matched send)
    type: int | None  # index into TYPES of the result; None for a send (its value is a token)
    reduce: str = "sum"  # allreduce, reduce_scatter
    axis: int = 0  # allgather, reduce_scatter
    channel: int = 0  # send, recv
    host: bool = False  # send, recv
    constant: int = 0  # offset: the result is args[0] + constant (a payload no other value has)
    native: bool = False  # allreduce, allgather on axis 0: the IR's own op where it has one (Relax: R.ccl)


@dataclass(frozen=True)
class Resolved:
    params: tuple[int, ...]
    ops: tuple[Op, ...]
    outputs: tuple[int, ...]  # value ids: every tensor an op made


def resolve(program: Program) -> Resolved:
    """Interpret a program's steps in order; open transfers are closed at the end, round robin."""
    types: list[int | None] = list(program.params)
    ops: list[Op] = []
    sent = {c.id: [] for c in program.channels}  # channel -> its sends' value ids, in order
    received = {c.id: 0 for c in program.channels}
    transfers = {c.id: c.transfers for c in program.channels}

    def emit(op: Op) -> int:
        ops.append(op)
        types.append(op.type)
        return len(types) - 1

    def pick(i: int, type_: int | None = None) -> int:
        """A value of ``type_`` (any tensor if None); three in four are among the latest three, so
        chains form (a send reading the collective just made, a collective of a fresh value)."""
        ids = [v for v, t in enumerate(types) if t is not None and (type_ is None or t == type_)]
        return ids[-1 - (i // 4) % min(3, len(ids))] if i % 4 else ids[(i // 4) % len(ids)]

    def send(channel: int, i: int, j: int) -> None:
        t = transfers[channel][len(sent[channel])]
        v = pick(i, t.type)
        if j % 2:  # a payload of its own, so a swapped pair of sends shows in the outputs
            v = emit(Op("offset", (v,), t.type, constant=10 + len(ops) % 50))
        sent[channel].append(emit(Op("send", (v,), None, channel=channel, host=t.host)))

    def recv(channel: int, j: int) -> None:
        k = received[channel]
        t = transfers[channel][k]
        token = (sent[channel][k],) if j % 3 == 0 else ()
        emit(Op("recv", token, t.type, channel=channel, host=t.host))
        received[channel] += 1

    for code, i, j in program.steps:
        can_send = [c for c in sent if len(sent[c]) < len(transfers[c])]
        can_recv = [c for c in sent if received[c] < len(sent[c])]
        if code < 3 and can_send:
            send(can_send[i % len(can_send)], i // 7, j)
        elif code < 5 and can_recv:
            recv(can_recv[i % len(can_recv)], j)
        else:
            x = pick(i)
            t = types[x]
            shape = TYPES[t][0]
            if code <= 7:  # a transfer step with nothing to transfer, too: allreduces are what groups most
                if j % 3 == 0:  # of a value made just here: the group cannot move above this point
                    x = emit(Op("offset", (x,), t, constant=1 + j % 9))
                emit(Op("allreduce", (x,), t, reduce=REDUCTIONS[j % 4], native=i % 5 == 1))
            elif code <= 9:
                emit(Op("allgather", (x,), t, axis=j % len(shape), native=j % len(shape) == 0 and i % 3 == 1))
            elif code <= 11:
                emit(Op("reduce_scatter", (x,), t, reduce=REDUCTIONS[j % 2], axis=j % len(shape)))
            elif code == 12:
                emit(Op("add", (x, pick(j, t)), t))
            else:
                emit(Op("offset", (x,), t, constant=1 + j % 9))
    while any(len(sent[c]) < len(transfers[c]) or received[c] < len(transfers[c]) for c in sent):
        for c in sent:
            if len(sent[c]) < len(transfers[c]):
                send(c, 1, 1)
            if received[c] < len(sent[c]):
                recv(c, 1)
    outputs = tuple(v for v in range(len(program.params), len(types)) if types[v] is not None)
    return Resolved(program.params, tuple(ops), outputs)


def random_inputs(program: Resolved, seed: int | None = None) -> list[np.ndarray]:
    """Small integers in every dtype: sums, maxima and offsets stay exact. The seed defaults to the
    program's length, so both IRs' fuzzers feed a program the same inputs."""
    rng = np.random.default_rng(len(program.ops) if seed is None else seed)
    return [rng.integers(1, 4, size=TYPES[t][0]).astype(TYPES[t][1]) for t in program.params]


def reference(program: Resolved, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """What the program computes on one rank: every collective over one rank returns its operand,
    and a channel delivers its payloads first in, first out."""
    values: list[np.ndarray | None] = list(inputs)
    queues: dict[int, list[np.ndarray]] = {}
    for op in program.ops:
        args = [values[a] for a in op.args]
        if op.kind == "send":
            queues.setdefault(op.channel, []).append(args[0])
            values.append(None)
        elif op.kind == "recv":
            values.append(queues[op.channel].pop(0))
        elif op.kind == "add":
            values.append(args[0] + args[1])
        elif op.kind == "offset":
            values.append(args[0] + args[0].dtype.type(op.constant))
        else:
            values.append(args[0])
    return [values[v] for v in program.outputs]


def assert_outputs_equal(program: Resolved, got: list[np.ndarray], want: list[np.ndarray], what: str) -> None:
    """Bitwise, output by output, shape and dtype first (a changed dtype is a wrong result too).
    Outputs past the program's are an IR's own (Relay's joint token of unread sends)."""
    assert len(got) == len(want), f"{what}: {len(got)} outputs vs {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        where = f"{what}, output {i} " + (f"(value {program.outputs[i]})" if i < len(program.outputs) else "(past the program's)")
        assert (g.shape, g.dtype) == (w.shape, w.dtype), f"{where}: {g.shape} {g.dtype} vs {w.shape} {w.dtype}"
        np.testing.assert_array_equal(g, w, err_msg=where)


@st.composite
def programs(draw: st.DrawFn) -> Program:
    """1-3 channels of 2-4 transfers (a third of them of mixed types, a quarter host), 4-24 steps."""
    used = draw(st.lists(st.integers(0, len(TYPES) - 1), min_size=1, max_size=2, unique=True))  # few: groups form
    params = tuple(draw(st.lists(st.sampled_from(used), min_size=2, max_size=4)))
    ids = draw(st.lists(st.sampled_from(CHANNEL_IDS), min_size=1, max_size=3, unique=True))
    channels = []
    for cid in ids:
        mixed = draw(st.integers(0, 2)) == 0
        first = draw(st.sampled_from(params))
        count = draw(st.integers(2, 4))
        kinds = [draw(st.sampled_from(params)) if mixed else first for _ in range(count)]
        hosts = [draw(st.integers(0, 3)) == 0 for _ in range(count)]
        channels.append(Channel(cid, tuple(Transfer(k, h) for k, h in zip(kinds, hosts))))
    steps = draw(st.lists(st.tuples(st.integers(0, 13), st.integers(0, 99), st.integers(0, 99)), min_size=4, max_size=24))
    return Program(params, tuple(channels), tuple(steps))
