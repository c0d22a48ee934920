"""Send-before-recv ordering, IR-neutral: the core of both adapters' ``OrderSendRecv`` passes.

Every rank runs the same program, and a recv blocks until its payload arrived while a send never
waits (contract.md). So a program deadlocks exactly when some recv runs before the send it is
matched with: ``y = recv(ch 0); t = send(x, ch 0)`` blocks every rank in recv. Sends and recvs of
one channel match in program order (the k-th send with the k-th recv, as MPI matches messages of
one tag). The fix is an order in which every matched send comes before its recv: add the edge
send_k -> recv_k to the data dependences, keep sends (and recvs) of one channel and other opaque
side effects in their order, and sort topologically, as close to the program order as possible.
A cycle means no order exists (a send's payload needs a recv that cannot complete before it):
that is reported, never left to hang at run time.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .spec import CollectiveError, Pairs, encode_pairs, register_error_class


@register_error_class
class SendRecvOrderError(CollectiveError):
    """Sends and recvs that no order can run without waiting forever, or that cannot match."""


#: (dims, dtype) of a send's or recv's tensor: None for a dim whose extent is symbolic, dims None
#: where even the rank is unknown, dtype None where unknown.
Payload = tuple[tuple[int | None, ...] | None, str | None]


def payload(dims: Sequence[Any] | None, dtype: str | None) -> Payload:
    """The payload of a tensor type: static extents as ints, any other extent as None."""
    return (None if dims is None else tuple(d if isinstance(d, int) else None for d in dims),
            None if dtype is None else str(dtype))


def _differ(a: Payload, b: Payload) -> bool:
    """Provably different tensors: dtypes, ranks, or an extent both name (a symbolic extent is
    compared at run time, where the recv checks the byte count it got)."""
    (da, ta), (db, tb) = a, b
    if ta is not None and tb is not None and ta != tb:
        return True
    if da is None or db is None:
        return False
    return len(da) != len(db) or any(x is not None and y is not None and x != y for x, y in zip(da, db))


def _describe(p: Payload) -> str:
    dims, dtype = p
    extents = ["?" if d is None else str(d) for d in dims or ()]
    shape = "(?)" if dims is None else f"({extents[0]},)" if len(extents) == 1 else f"({', '.join(extents)})"
    return f"shape {shape} {dtype or '?'}"


@dataclass(frozen=True)
class OrderNode:
    """One unit of a region, in program order.

    ``kind``: "send", "recv", "effect" (an opaque side effect whose order is kept) or "other".
    ``deps``: indices of earlier units it reads. ``payload``: what a send or recv moves, as
    :func:`payload` gives it, for the match check.
    """

    kind: str
    deps: tuple[int, ...] = ()
    channel_id: int | None = None
    pairs: Pairs | None = None
    payload: Payload | None = None
    #: Where a send or recv stands among those of its channel (default: its index). Relay, whose
    #: executors pick any topological order, sorts sends by how many recvs of the channel they read.
    seq: tuple[int, ...] | None = None


@dataclass(frozen=True)
class OrderPlan:
    order: list[int]
    #: Per channel, its (send index, recv index) transfers in the order MPI matches them (the k-th
    #: send with the k-th recv): a reordering must keep the pairing (two sends of one channel
    #: swapped hand each recv the other's payload).
    channels: list[list[tuple[int, int]]]

    @property
    def changed(self) -> bool:
        return self.order != sorted(self.order)

    @property
    def matches(self) -> list[tuple[int, int]]:
        """(send index, recv index) of every transfer."""
        return [pair for pairs in self.channels for pair in pairs]

    @property
    def chains(self) -> list[tuple[int, int]]:
        """(earlier, later) consecutive sends, then recvs, of one channel."""
        return channel_chains(self.channels)


def channel_chains(channels: Sequence[Sequence[tuple[int, int]]]) -> list[tuple[int, int]]:
    """(earlier, later) consecutive sends of each channel, then consecutive recvs."""
    sends = [(a[0], b[0]) for pairs in channels for a, b in zip(pairs, pairs[1:])]
    return sends + [(a[1], b[1]) for pairs in channels for a, b in zip(pairs, pairs[1:])]


def _ordinal(k: int) -> str:
    return f"#{k}"


def plan_send_recv_order(nodes: Sequence[OrderNode], where: str) -> OrderPlan:
    """A deadlock-free order of ``nodes`` (indices) and the send/recv matches; raises if none exists."""
    sends: dict[int, list[int]] = {}
    recvs: dict[int, list[int]] = {}
    effects: list[int] = []
    for i, node in enumerate(nodes):
        if node.kind == "send":
            sends.setdefault(int(node.channel_id or 0), []).append(i)
        elif node.kind == "recv":
            recvs.setdefault(int(node.channel_id or 0), []).append(i)
        elif node.kind == "effect":
            effects.append(i)
    for members in [*sends.values(), *recvs.values()]:
        members.sort(key=lambda i: (nodes[i].seq or (), i))
    channels: list[list[tuple[int, int]]] = []
    for channel in sorted(set(sends) | set(recvs)):
        s_list, r_list = sends.get(channel, []), recvs.get(channel, [])
        if len(s_list) != len(r_list):
            raise SendRecvOrderError(
                f"OrderSendRecv: channel_id {channel} in {where} has {len(s_list)} send(s) and {len(r_list)} recv(s); "
                "every send needs one recv of the same channel in the same function "
                "(the k-th send of a channel is matched with its k-th recv)"
            )
        for k, (s, r) in enumerate(zip(s_list, r_list)):
            sp, rp = nodes[s].pairs or (), nodes[r].pairs or ()
            if sp != rp:
                raise SendRecvOrderError(
                    f"OrderSendRecv: send {_ordinal(k)} and recv {_ordinal(k)} of channel_id {channel} in {where} name "
                    f"different source_target_pairs ({encode_pairs(sp)!r} vs {encode_pairs(rp)!r}); "
                    "a send and its recv must name the same pairs"
                )
            a, b = nodes[s].payload, nodes[r].payload
            if a is not None and b is not None and _differ(a, b):
                raise SendRecvOrderError(
                    f"OrderSendRecv: send {_ordinal(k)} of channel_id {channel} in {where} moves {_describe(a)} "
                    f"but its recv expects {_describe(b)}"
                )
        channels.append(list(zip(s_list, r_list)))

    # Same-channel self-dependence gets its own message: the common mistake.
    ancestors: list[int] = []
    for node in nodes:
        bits = 0
        for d in node.deps:
            bits |= ancestors[d] | (1 << d)
        ancestors.append(bits)
    for channel, s_list in sends.items():
        r_list = recvs[channel]
        for k, s in enumerate(s_list):
            for j in range(k, len(r_list)):
                if ancestors[s] >> r_list[j] & 1:
                    raise SendRecvOrderError(
                        f"OrderSendRecv: in {where}, the payload of send {_ordinal(k)} on channel_id {channel} depends on "
                        f"recv {_ordinal(j)} of the same channel, which cannot complete before that send: "
                        "every rank would wait forever"
                    )

    preds: list[set[int]] = [set(node.deps) for node in nodes]
    matches = [pair for pairs in channels for pair in pairs]
    for a, b in channel_chains(channels) + list(zip(effects, effects[1:])) + matches:
        preds[b].add(a)
    users: list[list[int]] = [[] for _ in nodes]
    for i, p in enumerate(preds):
        for d in p:
            users[d].append(i)
    topo = _topological(preds, users, list(range(len(nodes))))
    if len(topo) != len(nodes):
        stuck = sorted(
            {int(nodes[i].channel_id or 0) for i in set(range(len(nodes))) - set(topo) if nodes[i].kind in ("send", "recv")}
        )
        raise SendRecvOrderError(
            f"OrderSendRecv: in {where}, sends and recvs on channel_id(s) {', '.join(map(str, stuck))} form a cycle "
            "(a send's payload needs a recv whose own send needs it): every rank would wait forever"
        )
    # A unit is due where the earliest unit that needs it stood: a send (and what it reads) moves
    # up to just before its recv instead of the recv sinking down to the send.
    due = list(range(len(nodes)))
    for i in reversed(topo):
        for u in users[i]:
            due[i] = min(due[i], due[u])
    order = _topological(preds, users, due)
    return OrderPlan(order=order, channels=channels)


def _topological(preds: list[set[int]], users: list[list[int]], priority: list[int]) -> list[int]:
    """Kahn's algorithm, always taking the ready unit of lowest (priority, index)."""
    pending = [len(p) for p in preds]
    ready = [(priority[i], i) for i, n in enumerate(pending) if n == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        _, i = heapq.heappop(ready)
        order.append(i)
        for u in users[i]:
            pending[u] -= 1
            if pending[u] == 0:
                heapq.heappush(ready, (priority[u], u))
    return order


def index_order(deps: Sequence[Sequence[int]]) -> list[int] | None:
    """A topological order of units with ``deps`` (any indices), lowest ready index first: the
    program order wherever the dependences allow it. None on a cycle."""
    preds = [set(d) for d in deps]
    users: list[list[int]] = [[] for _ in preds]
    for i, p in enumerate(preds):
        for d in p:
            users[d].append(i)
    order = _topological(preds, users, list(range(len(preds))))
    return order if len(order) == len(preds) else None


def is_deadlock_free(plan: OrderPlan) -> bool:
    """Whether the program order (indices ascending) already runs every matched send first."""
    return all(s < r for s, r in plan.matches)
