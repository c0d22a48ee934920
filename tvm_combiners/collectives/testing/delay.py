"""Link latency for the simulated cluster: each node's ``eth0`` is a TUN device, and one thread
carries every IP packet between them, each ``delay`` seconds after it left.

Why a thread and not ``tc``: the kernels of this project's machines have no ``netem`` and no
``fq`` (the qdiscs that delay packets) and no tc classifier to steer them; a TUN device hands
the packets a node sends to a process, which can hold them. The thread lives in the process
that made the cluster; closing its devices (at the end, or when that process dies) removes them
from the nodes.

The hub routes by destination address (IPv4 only: MPI and ``ip`` here speak nothing else; the
rest, and packets to no node, are dropped), keeps each destination's packets in order, and
writes them to that node's device when they are due. The devices' MTU is 64 KiB, so a 1 Gbit/s
link moves about 2,000 packets a second through it.
"""

from __future__ import annotations

import contextlib
import fcntl
import heapq
import itertools
import math
import os
import re
import select
import struct
import threading
import time
from collections.abc import Callable, Sequence

_TUNSETIFF = 0x400454CA
_IFF_TUN, _IFF_NO_PI = 0x0001, 0x1000
MTU = 65535
_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


def parse_delay(text: str) -> float:
    """``250us``, ``1ms``, ``0.5ms`` or ``1s`` in seconds; ValueError naming the rule otherwise."""
    match = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)(us|ms|s)", text) if isinstance(text, str) else None
    if match is None or not 1e-6 <= float(match.group(1)) * _UNITS[match.group(2)] <= 10:
        raise ValueError(f"SimulatedCluster: delay {text!r} is not a time from 1us to 10s, such as 250us or 1ms")
    return float(match.group(1)) * _UNITS[match.group(2)]


def open_tun(name: str) -> int:
    """A TUN device ``name`` (no packet header), its file descriptor; it lives while the fd is open."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_CLOEXEC)
    try:
        fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH", name.encode(), _IFF_TUN | _IFF_NO_PI))
    except OSError:
        os.close(fd)
        raise
    return fd


class DelayHub:
    """Carries packets between TUN devices, the i-th added being the node at ``addresses[i]``.

    ``failed`` says why the thread stopped carrying them, if it did (the nodes' link is then down).
    """

    def __init__(self, addresses: Sequence[str], delay: float) -> None:
        self.addresses, self.delay = list(addresses), delay
        self.fds: list[int] = []
        self.failed: str | None = None
        self._route: dict[bytes, int] = {}
        self._wake_r, self._wake_w = os.pipe()
        self._stop = False
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="cluster-delay", daemon=True)

    def add(self, name: str) -> None:
        """Make the next node's TUN device ``name`` (the hub holds it from now on)."""
        self.fds.append(open_tun(name))

    def start(self) -> None:
        self._route = {bytes(int(p) for p in a.split(".")): fd for a, fd in zip(self.addresses, self.fds)}
        self._thread.start()

    def close(self) -> None:
        """Stop the thread and close the devices (which removes them); a second call does nothing."""
        if self._closed:
            return
        self._closed = True
        self._stop = True
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        if self._thread.is_alive():  # still writing: its descriptors stay open (the process's end closes them)
            return
        for fd in (*self.fds, self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds = []

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as err:  # noqa: BLE001 - said through ``failed``: the thread has no caller
            self.failed = f"{type(err).__name__}: {err}"

    def _loop(self) -> None:
        due: list[tuple[float, int, int, bytes]] = []  # (when, order, destination fd, packet)
        order = itertools.count()
        wait = _waiter([*self.fds, self._wake_r])
        while not self._stop:
            ready = wait(max(0.0, due[0][0] - time.monotonic()) if due else 1.0)
            arrived = time.monotonic()
            for fd in ready:
                if fd == self._wake_r:
                    continue
                try:
                    packet = os.read(fd, MTU + 64)
                except OSError as err:
                    raise OSError(f"reading node {self.fds.index(fd)}'s device: {err}") from None
                target = self._route.get(packet[16:20]) if len(packet) >= 20 and packet[0] >> 4 == 4 else None
                if target is not None:
                    heapq.heappush(due, (arrived + self.delay, next(order), target, packet))
            now = time.monotonic()
            while due and due[0][0] <= now:
                _, _, target, packet = heapq.heappop(due)
                with contextlib.suppress(OSError):  # a packet the node cannot take is dropped, as a link would
                    os.write(target, packet)


def _waiter(fds: list[int]) -> Callable[[float], list[int]]:
    """A wait for any of ``fds`` to be readable, at most the given seconds: select's, which keeps
    microseconds, where every descriptor is below its limit; else poll's, to the millisecond."""
    if max(fds) < 1024:
        return lambda seconds: select.select(fds, [], [], seconds)[0]
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    return lambda seconds: [fd for fd, _ in poller.poll(math.ceil(seconds * 1000))]
