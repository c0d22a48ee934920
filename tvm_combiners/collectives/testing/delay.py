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
import os
import re
import select
import struct
import threading
import time
from collections.abc import Sequence

_TUNSETIFF = 0x400454CA
_IFF_TUN, _IFF_NO_PI = 0x0001, 0x1000
MTU = 65535
_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


def parse_delay(text: str) -> float:
    """``250us``, ``1ms``, ``0.5ms`` or ``1s`` in seconds; ValueError naming the rule otherwise."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(us|ms|s)", text) if isinstance(text, str) else None
    if match is None or not 0 < float(match.group(1)) * _UNITS[match.group(2)] <= 10:
        raise ValueError(f"SimulatedCluster: delay {text!r} is not a time above 0 and up to 10 s, such as 250us or 1ms")
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
    """Carries packets between TUN devices, the i-th added being the node at ``addresses[i]``."""

    def __init__(self, addresses: Sequence[str], delay: float) -> None:
        self.addresses, self.delay = list(addresses), delay
        self.fds: list[int] = []
        self._route: dict[bytes, int] = {}
        self._wake_r, self._wake_w = os.pipe()
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="cluster-delay", daemon=True)

    def add(self, name: str) -> None:
        """Make the next node's TUN device ``name`` (the hub holds it from now on)."""
        self.fds.append(open_tun(name))

    def start(self) -> None:
        self._route = {bytes(int(p) for p in a.split(".")): fd for a, fd in zip(self.addresses, self.fds)}
        self._thread.start()

    def close(self) -> None:
        """Stop the thread and close the devices (which removes them)."""
        self._stop = True
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        for fd in (*self.fds, self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds = []

    def _loop(self) -> None:
        due: list[tuple[float, int, int, bytes]] = []  # (when, order, destination fd, packet)
        order = itertools.count()
        watched = [*self.fds, self._wake_r]
        while not self._stop:
            wait = max(0.0, due[0][0] - time.monotonic()) if due else 1.0
            try:
                ready, _, _ = select.select(watched, [], [], wait)
            except OSError:  # a device closed under us: the cluster is going down
                return
            arrived = time.monotonic()
            for fd in ready:
                if fd == self._wake_r:
                    continue
                try:
                    packet = os.read(fd, MTU + 64)
                except OSError:
                    return
                target = self._route.get(packet[16:20]) if len(packet) >= 20 and packet[0] >> 4 == 4 else None
                if target is not None:
                    heapq.heappush(due, (arrived + self.delay, next(order), target, packet))
            now = time.monotonic()
            while due and due[0][0] <= now:
                _, _, target, packet = heapq.heappop(due)
                with contextlib.suppress(OSError):  # a full queue drops the packet, as a link would
                    os.write(target, packet)
