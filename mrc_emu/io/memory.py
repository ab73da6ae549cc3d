"""An in-memory network: frames between endpoints in virtual time, with per-EV faults.

Why it exists: the transport must be testable without root, fast and reproducibly. A
`MemoryNetwork` carries the frames a requester or responder hands out to the endpoint whose
address they are for, after the delay, loss, reordering, duplication, serialisation rate or
death injected on the frame's EV, and runs the endpoints in virtual time. Congestion signals
too: data frames CE-marked or trimmed on an EV at a given rate, as a switch port does it
(docs/wire-format.md), so that the endpoints' ECN echo, TRIM NACK and CNP run without root. Every frame is
opened as the destination's kernel would (decapsulation, UDP checksum), so only valid
datagrams reach an endpoint, with the 1-based port it arrives at (that of the path's plane, as
on the fabric: docs/transport.md). Its randomness is its own seeded generator (or one passed in):
a run is reproducible from the seed.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from ..transport.multipath.paths import Endpoint, Path
from ..wire import format as fmt
from ..wire.decoder import open_frame
from ..wire.format import DropReason

_DATA_OPCODES = (fmt.Opcode.RDMA_WRITE_ONLY, fmt.Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE)


@dataclass
class EvFault:
    """What happens to frames on one EV (both directions: a fault on a link hits both)."""

    loss: float = 0.0  # probability a frame is dropped
    duplicate: float = 0.0  # probability a frame is delivered twice
    reorder: float = 0.0  # probability a frame is held back by up to `reorder_ns`
    reorder_ns: int = 200_000
    delay_ns: int = 10_000  # one-way delay
    rate_bps: float | None = None  # serialisation rate of the EV (None: infinite)
    dead: bool = False
    busy_until: int = 0
    # what a congested switch port does to data frames (opcode WRITE; control is never touched):
    ce: float = 0.0  # probability an ECT data frame arrives CE-marked
    trim: float = 0.0  # probability a data frame arrives trimmed to its first `trim_bytes` bytes of UDP payload
    trim_bytes: int = fmt.TRIMMED_LEN
    trim_last_hop: bool = False  # the trimming port faces the destination (DSCP_TRIMMED_LASTHOP)


def _congest(f: EvFault, rng, payload: bytes, tclass: int, marked: int, trimmed: int) -> tuple[int, int, bytes, int]:
    """A data frame through a congested port: CE on an ECT one (both IPv6 headers; the socket sees
    the inner), and/or trimmed as the destination's socket receives it (the UDP payload cut, the
    DSCP rewritten, the ECN bits kept; lengths and checksum are the switch's business)."""
    if f.ce and tclass & fmt.ECN_MASK and rng.random() < f.ce:
        tclass |= fmt.ECN_CE
        marked += 1
    if f.trim and rng.random() < f.trim and len(payload) > f.trim_bytes:
        dscp = fmt.DSCP_TRIMMED_LASTHOP if f.trim_last_hop else fmt.DSCP_TRIMMED
        payload, tclass = payload[:f.trim_bytes], dscp << 2 | (tclass & fmt.ECN_MASK)
        trimmed += 1
    return marked, trimmed, payload, tclass


@dataclass(order=True)
class _Arrival:
    time: int
    seq: int
    endpoint: Endpoint = field(compare=False)
    payload: bytes = field(compare=False)
    src: bytes = field(compare=False)
    sport: int = field(compare=False)
    tclass: int = field(compare=False, default=0)
    port: int = field(compare=False, default=0)  # the destination's 1-based port it arrives at (0: unknown)


class MemoryNetwork:
    """Frames between endpoints in virtual time (ns). `seed` seeds the network's own random
    generator; `rng` replaces it (anything with random() and randrange())."""

    def __init__(self, seed: int = 0, rng: random.Random | None = None) -> None:
        self.rng = rng if rng is not None else random.Random(seed)
        self.now = 0
        self.faults: dict[int, EvFault] = {}
        self.endpoints: dict[bytes, Endpoint] = {}
        self._heap: list[_Arrival] = []
        self._seq = 0
        self.frames_sent = 0
        self.frames_dropped = 0
        self.frames_ce = 0  # data frames CE-marked by an EV's `ce`
        self.frames_trimmed = 0  # data frames trimmed by an EV's `trim`
        self.dropped_invalid: dict[DropReason, int] = {}

    def attach(self, endpoint: Endpoint) -> None:
        self.endpoints[endpoint.address] = endpoint

    def fault(self, ev: int) -> EvFault:
        return self.faults.setdefault(ev, EvFault())

    def send(self, frame: bytes | bytearray, path: Path) -> bool:
        self.frames_sent += 1
        data = bytes(frame)  # templates reuse their buffer
        f = self.fault(path.ev)
        if f.dead or (f.loss and self.rng.random() < f.loss):
            self.frames_dropped += 1
            return True  # it left; the network lost it
        delay = f.delay_ns
        if f.reorder and self.rng.random() < f.reorder:
            delay += self.rng.randrange(f.reorder_ns)
        if f.rate_bps:
            start = max(self.now, f.busy_until)
            f.busy_until = start + int(len(data) * 8e9 / f.rate_bps)
            delay += f.busy_until - self.now
        opened = open_frame(data)
        if isinstance(opened, DropReason):
            self.dropped_invalid[opened] = self.dropped_invalid.get(opened, 0) + 1
            return True
        endpoint = self.endpoints.get(opened.dst)
        if endpoint is None:
            self.frames_dropped += 1
            return True
        payload, tclass = bytes(opened.payload), opened.tclass
        if (f.ce or f.trim) and payload[:1] and payload[0] in _DATA_OPCODES and not fmt.is_trimmed(tclass):
            self.frames_ce, self.frames_trimmed, payload, tclass = _congest(f, self.rng, payload, tclass,
                                                                             self.frames_ce, self.frames_trimmed)
        copies = 2 if f.duplicate and self.rng.random() < f.duplicate else 1
        for copy in range(copies):
            self._seq += 1
            heapq.heappush(self._heap, _Arrival(self.now + delay + copy * 1000, self._seq, endpoint,
                                                payload, opened.src, opened.sport, tclass,
                                                0 if path.plane is None else path.plane + 1))
        return True

    def run(self, endpoints: list[Endpoint], done: Callable[[], bool], limit_ns: int = 60_000_000_000) -> bool:
        """Advance virtual time until `done()`; False if nothing is left to happen or time ran out."""
        for endpoint in endpoints:
            self.attach(endpoint)
        while True:
            for endpoint in endpoints:
                endpoint.pump(self.now, self.send)
            if done():
                return True
            wakeups = [w for w in (e.next_wakeup() for e in endpoints) if w is not None]
            if self._heap:
                wakeups.append(self._heap[0].time)
            if not wakeups:
                return False
            self.now = max(self.now, min(wakeups))
            if self.now > limit_ns:
                return False
            while self._heap and self._heap[0].time <= self.now:
                a = heapq.heappop(self._heap)
                a.endpoint.on_datagram(a.payload, a.src, a.sport, self.now, a.tclass, a.port)


class MemoryHost:
    """All the endpoints of one host (a transport.mux.HostMux: QPs and the host's MRC endpoint at
    QPN 0x2) as one endpoint of the in-memory network, as a worker's Port serves them."""

    def __init__(self, mux) -> None:
        self.mux = mux
        self.address = mux.address

    def on_datagram(self, payload: bytes, src: bytes, sport: int, now: int, tclass: int = 0, port: int = 0) -> None:
        endpoint = self.mux.route(payload)
        if endpoint is not None:
            endpoint.on_datagram(payload, src, sport, now, tclass, port)

    def pump(self, now: int, send, clock=None, horizon=None) -> None:
        for endpoint in list(self.mux.by_qpn.values()):
            endpoint.pump(now, send)

    def next_wakeup(self) -> int | None:
        wakes = [w for w in (e.next_wakeup() for e in self.mux.by_qpn.values()) if w is not None]
        return min(wakes) if wakes else None
