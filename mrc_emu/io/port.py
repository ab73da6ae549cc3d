"""One host's sockets in a worker: sending frames, receiving datagrams at their arrival times.

Why it exists: the event loop (loop.py) serves many hosts; each is a `Port`, a raw IPv6 socket
that sends whole frames and a UDP socket on [address]:4791 that receives, made in the host's
namespace by the runtime. A port reads its socket in batches with the kernel's arrival stamps
(SO_TIMESTAMPNS, _sockio.c), traffic classes (IPV6_RECVTCLASS: ECN, trimmed DSCPs) and arrival
interfaces (IPV6_RECVPKTINFO: the host's NIC, hence its 1-based port, `ports_by_ifindex`), hands
each datagram to the QP it names at that time, knows how far
it has read (`read_through`, what the horizon is made of) and notices datagrams the kernel
handed over after that (`late`).
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

from .clock import Clock, LagMeter
from .sockets import SocketLink

try:  # batched receive with the kernel's arrival stamps (optional; see _sockio.c)
    from . import _sockio
except ImportError:  # pragma: no cover - the extension was not built
    _sockio = None

RECV_BATCH = 8  # datagrams per recvmmsg: larger batches measured slower here


class Port:
    """One host's sockets in a worker: a raw IPv6 socket that sends whole frames and a UDP socket
    on [address]:4791 that receives. `mux` routes a datagram to the endpoint (QP) it names:
    `mux.route(payload)` gives the endpoint or None. `ports_by_ifindex`: the host's interface
    index -> its 1-based port (the NIC of plane p is port p + 1); a datagram from elsewhere: 0."""

    def __init__(self, host: str, send_sock: socket.socket, recv_sock: socket.socket, mux: Any,
                 ports_by_ifindex: dict[int, int] | None = None) -> None:
        self.host = host
        self.mux = mux
        self.ports_by_ifindex = dict(ports_by_ifindex or {})
        self.fd = recv_sock.fileno()
        # the kernel's arrival stamps (the C receive path); without them an arrival time is when
        # the worker read the datagram, its own lag included (experiments/emulation.py says so)
        self.stamped = False
        if _sockio is not None:
            try:
                _sockio.enable_stamps(self.fd)
                self.stamped = True
            except OSError:
                pass
        self.link = SocketLink(send_sock, recv_sock, ports_by_ifindex=self.ports_by_ifindex)  # sending, plain receiving
        self.send = self.link.send
        self.datagrams = 0
        self.read_through = 0  # every datagram that arrived before this (clock) time has been read
        # datagrams stamped before `read_through` when read: the kernel held them (a per-CPU
        # backlog) past the moment the socket was taken as read; the horizon had run ahead of them
        self.late = 0
        self.late_gap_ns = 0  # the largest lateness since the loop last took it (EventLoop._late)
        self.unstamped = 0  # datagrams timed when read, not by the kernel: all of them without `stamped`
        # datagrams the C receive dropped as truncated: longer than its slots, or their control data
        # (stamp, traffic class, port) cut short ("truncated", "control_truncated": _sockio.recv_batch)
        self.truncated: dict[str, int] = {}

    @property
    def frames_sent(self) -> int:
        return self.link.frames_sent

    @property
    def errors(self) -> dict[str, int]:
        return self.link.errors

    def receive(self, clock: Clock, budget: int, lag: LagMeter, woke: Callable[[Any, int], None]) -> int:
        """Hand up to `budget` waiting datagrams to the endpoints they name, each at its arrival
        time; `woke(endpoint, arrival)` for each. Moves `read_through` as far as it knows. How many."""
        route = self.mux.route
        n = 0
        if self.stamped:
            fd, record, dilation, port_of, truncated = self.fd, lag.record, clock.dilation, self.ports_by_ifindex.get, self.truncated
            # undilated, the clock is CLOCK_REALTIME less a constant: one addition per datagram
            real_to_clock = clock.from_realtime(0) if dilation == 1.0 else None
            while n < budget:
                started = clock.now()
                batch = _sockio.recv_batch(fd, min(RECV_BATCH, budget - n), truncated)
                if not batch:
                    self.read_through = started  # empty when looked at: everything before is read
                    return n
                seen = clock.now()
                # consecutive datagrams for one endpoint wake it once, at the earliest of their arrivals
                # (what waking it for each would leave behind: it is queued once, owed since the earliest)
                owing, owed_since = None, 0
                for payload, src, sport, real_ns, tclass, ifindex in batch:
                    if not real_ns:
                        at = seen
                        self.unstamped += 1
                    else:
                        at = real_ns + real_to_clock if real_to_clock is not None else clock.from_realtime(real_ns)
                        if at > seen:
                            at = seen
                    if at < self.read_through:
                        self.late += 1
                        if self.read_through - at > self.late_gap_ns:
                            self.late_gap_ns = self.read_through - at
                    record(int((seen - at) * dilation))
                    endpoint = route(payload)
                    if endpoint is not None:
                        endpoint.on_datagram(payload, src, sport, at, tclass, port_of(ifindex, 0))
                        if endpoint is not owing:
                            if owing is not None:
                                woke(owing, owed_since)
                            owing, owed_since = endpoint, at
                        elif at < owed_since:
                            owed_since = at
                if owing is not None:
                    woke(owing, owed_since)
                self.read_through = at  # a socket is a queue: all that came before is read
                n += len(batch)
                self.datagrams += len(batch)
            return n
        # without the C extension: the link's own receive, one datagram per call, stamped when read
        started = clock.now()
        n = self.link.receive(_Routed(route, woke), clock.now, budget)
        if n < budget:
            self.read_through = started  # emptied: everything that came before the first look is read
        self.datagrams += n
        self.unstamped += n
        return n


class _Routed:
    """A port's QPs as one endpoint: SocketLink.receive hands each datagram to the QP it names."""

    __slots__ = ("route", "woke")

    def __init__(self, route: Callable[[Any], Any], woke: Callable[[Any, int], None]) -> None:
        self.route, self.woke = route, woke

    def on_datagram(self, payload: bytes | memoryview, src: bytes, sport: int, now: int, tclass: int = 0,
                    port: int = 0) -> None:
        endpoint = self.route(payload)
        if endpoint is not None:
            endpoint.on_datagram(payload, src, sport, now, tclass, port)
            self.woke(endpoint, now)
