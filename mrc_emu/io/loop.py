"""One worker's event loop: the sockets of many hosts, one timer heap, and a measure of its own lag.

Why it exists: on a 2-core machine a process per host means a process waits tens of
milliseconds for the CPU, and every timer shorter than that fires late and blames the
network. Here a fixed pool of workers each serves many hosts: one epoll over all their
receive sockets, one heap of the endpoints' wakeups, a bounded amount of sending per turn so
that receiving is never starved. And the loop knows when it is itself the bottleneck:

- every datagram is taken with the kernel's arrival stamp (SO_TIMESTAMPNS) and handed to the
  transport at that time, so an ACK that waited in a socket for the worker does not lengthen
  an RTT sample;
- it measures its lag (how late it serves a due wakeup, how long a datagram waited in a
  socket), the CPU it got and the time it waited for one (/proc/self/schedstat);
- it publishes a *horizon*: the time up to which it has read every datagram that arrived at
  its sockets and sent what they caused. Timers in the transport decide at
  min(now, every worker's horizon): a loss timer never fires on a packet whose ACK is still
  in a socket that a starved worker has not read yet. (Conservative synchronisation, as in
  parallel discrete-event simulation: nothing is decided beyond what every part has seen.)

It never enters a namespace and never builds a socket: the runtime gives it sockets made in
each host's namespace. It never decides anything about the transport itself.
"""

from __future__ import annotations

import errno
import heapq
import mmap
import select
import socket
import struct
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

try:  # batched receive with the kernel's arrival stamps (optional; see _sockio.c)
    from . import _sockio
except ImportError:  # pragma: no cover - the extension was not built
    _sockio = None

RECV_BATCH = 8  # datagrams per recvmmsg: larger batches measured slower here
RECV_BUDGET = 32  # datagrams per socket per turn, so a busy responder acknowledges every 32 packets
PUMPS_PER_TURN = 8  # endpoints pumped per turn (each sends at most its burst), then receive again
IDLE_WAKE_NS = 500_000  # an idle worker still wakes this often to publish its horizon
_INT64 = struct.Struct("q")
FOREVER = 1 << 62


class Clock:
    """The transport's clock: monotonic nanoseconds, `dilation` times slower than wall time.

    Under time dilation K every interval the transport sees is the wall interval / K, so its
    timers last K times longer in wall time and the machine has K times the CPU per emulated
    microsecond (DieCast, NSDI 2008). Kernel arrival stamps (CLOCK_REALTIME) map onto it."""

    def __init__(self, dilation: float = 1.0) -> None:
        if dilation < 1.0:
            raise ValueError(f"time dilation {dilation}: must be at least 1")
        self.dilation = dilation
        self.origin = time.monotonic_ns()
        self._real_offset = 0
        self.resync()

    def resync(self) -> None:
        """Measure CLOCK_REALTIME - CLOCK_MONOTONIC again (NTP may slew the former)."""
        a = time.monotonic_ns()
        r = time.time_ns()
        b = time.monotonic_ns()
        self._real_offset = r - (a + b) // 2

    def now(self) -> int:
        if self.dilation == 1.0:
            return time.monotonic_ns()
        return self.origin + int((time.monotonic_ns() - self.origin) / self.dilation)

    def from_monotonic(self, mono_ns: int) -> int:
        if self.dilation == 1.0:
            return mono_ns
        return self.origin + int((mono_ns - self.origin) / self.dilation)

    def from_realtime(self, real_ns: int) -> int:
        return self.from_monotonic(real_ns - self._real_offset)


class Horizon:
    """Shared memory, one slot per worker: the clock time up to which that worker has read every
    datagram that arrived at its sockets. Made before the workers are forked."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._map = mmap.mmap(-1, 8 * max(1, workers))

    def publish(self, index: int, t: int) -> None:
        _INT64.pack_into(self._map, 8 * index, t)

    def min(self) -> int:
        return min(_INT64.unpack_from(self._map, 8 * i)[0] for i in range(self.workers))

    def close(self) -> None:
        self._map.close()


class LagMeter:
    """A histogram of lags in log2 buckets of microseconds (cheap enough for every event)."""

    BUCKETS = 32

    def __init__(self) -> None:
        self.counts = [0] * self.BUCKETS
        self.max_ns = 0
        self.n = 0

    def record(self, lag_ns: int) -> None:
        if lag_ns < 0:
            lag_ns = 0
        us = lag_ns // 1000
        self.counts[min(self.BUCKETS - 1, us.bit_length())] += 1
        self.n += 1
        if lag_ns > self.max_ns:
            self.max_ns = lag_ns

    def merge(self, other: LagMeter) -> None:
        self.counts = [a + b for a, b in zip(self.counts, other.counts)]
        self.n += other.n
        self.max_ns = max(self.max_ns, other.max_ns)

    def percentile_us(self, p: float) -> float:
        """The upper edge of the bucket holding the p-th percentile (an upper bound)."""
        if not self.n:
            return 0.0
        rank = p / 100 * self.n
        seen = 0
        for bucket, count in enumerate(self.counts):
            seen += count
            if seen >= rank:
                return float((1 << bucket) - 1) if bucket else 0.0
        return self.max_ns / 1000

    def to_dict(self) -> dict:
        return {"counts": self.counts, "max_ns": self.max_ns, "n": self.n}

    @classmethod
    def from_dict(cls, d: dict) -> LagMeter:
        m = cls()
        m.counts, m.max_ns, m.n = list(d["counts"]), d["max_ns"], d["n"]
        return m


def schedstat() -> tuple[int, int]:
    """(ns on a CPU, ns waiting on a run queue) of this process's main thread, from the kernel."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            run, wait, _ = f.read().split()
        return int(run), int(wait)
    except (OSError, ValueError):
        return int(time.process_time_ns()), 0


class Port:
    """One host's sockets in a worker: a raw IPv6 socket that sends whole frames and a UDP socket
    on [address]:4791 that receives; `endpoint` is everything of that host (its QPs)."""

    def __init__(self, host: str, send_sock: socket.socket, recv_sock: socket.socket, endpoint: Any) -> None:
        self.host = host
        self.send_sock = send_sock
        self.recv_sock = recv_sock
        self.endpoint = endpoint
        self.fd = recv_sock.fileno()
        recv_sock.setblocking(False)
        self.stamped = False
        if _sockio is not None:
            try:
                _sockio.enable_stamps(self.fd)
                self.stamped = True
            except OSError:
                pass
        self.send_errors = 0
        self.frames_sent = 0
        self.datagrams = 0
        self._addr: dict[str, tuple[str, int]] = {}
        self._packed: dict[str, bytes] = {}
        self._sendto = send_sock.sendto
        self.wake_at: int | None = None  # the wakeup in the heap for this port, if any
        self.queued = False  # in the loop's queue of ports to pump

    def send(self, frame: bytes | bytearray, path: Any) -> bool:
        addr = self._addr.get(path.first_hop)
        if addr is None:
            addr = self._addr[path.first_hop] = (path.first_hop, 0)
        try:
            self._sendto(frame, addr)
            self.frames_sent += 1
            return True
        except OSError as e:
            self.send_errors += 1
            if e.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH, errno.ENETDOWN, errno.EINVAL):
                return False  # the host's own port of that plane is down
            if e.errno in (errno.ENOBUFS, errno.EAGAIN):
                return True  # dropped at the host, like a full NIC queue: loss recovery handles it
            raise

    def receive(self, clock: Clock, budget: int, lag: LagMeter) -> tuple[int, int | None]:
        """Hand up to `budget` waiting datagrams to the endpoint, each at its arrival time.
        Returns (how many, the arrival time of the last one if more may be waiting, else None)."""
        endpoint = self.endpoint
        n = 0
        last_arrival = None
        if self.stamped:
            fd = self.fd
            while n < budget:
                batch = _sockio.recv_batch(fd, min(RECV_BATCH, budget - n))
                if not batch:
                    return n, None
                seen = clock.now()
                for payload, src, sport, real_ns, _tclass in batch:
                    at = clock.from_realtime(real_ns) if real_ns else seen
                    if at > seen:
                        at = seen
                    lag.record(int((seen - at) * clock.dilation))
                    endpoint.on_datagram(payload, src, sport, at)
                    last_arrival = at
                n += len(batch)
                self.datagrams += len(batch)
            return n, last_arrival
        recv = self.recv_sock.recvfrom
        packed = self._packed
        while n < budget:
            try:
                data, addr = recv(65535)
            except BlockingIOError:
                return n, None
            src = packed.get(addr[0])
            if src is None:
                src = packed[addr[0]] = socket.inet_pton(socket.AF_INET6, addr[0])
            at = clock.now()
            endpoint.on_datagram(data, src, addr[1], at)
            last_arrival = at
            n += 1
            self.datagrams += 1
        return n, last_arrival


@dataclass
class LoopStats:
    """What a worker measured about itself over one run."""

    wall_ns: int = 0
    cpu_ns: int = 0
    runqueue_wait_ns: int = 0
    turns: int = 0
    datagrams: int = 0
    frames_sent: int = 0
    timer_lag: LagMeter | None = None  # how late due wakeups were served
    socket_lag: LagMeter | None = None  # how long datagrams waited in a socket

    def to_dict(self) -> dict:
        return {"wall_ns": self.wall_ns, "cpu_ns": self.cpu_ns, "runqueue_wait_ns": self.runqueue_wait_ns,
                "turns": self.turns, "datagrams": self.datagrams, "frames_sent": self.frames_sent,
                "timer_lag": self.timer_lag.to_dict() if self.timer_lag else None,
                "socket_lag": self.socket_lag.to_dict() if self.socket_lag else None}


class EventLoop:
    """Drives the endpoints of many ports: receive, pump what is due, sleep until the next wakeup.

    An endpoint (see io.Endpoint) takes `on_datagram(payload, src, sport, now)`, sends on
    `pump(now, send, clock, horizon)` and says when it next needs pumping with `next_wakeup()`.
    """

    def __init__(self, clock: Clock, horizon: Horizon | None = None, index: int = 0) -> None:
        self.clock = clock
        self.horizon = horizon
        self.index = index
        self.ports: list[Port] = []
        self._by_fd: dict[int, Port] = {}
        self._epoll = select.epoll()
        self._controls: dict[int, Callable[[], None]] = {}
        self._heap: list[tuple[int, int, Port]] = []
        self._ready: deque[Port] = deque()
        self.timer_lag = LagMeter()
        self.socket_lag = LagMeter()
        self.stats = LoopStats(timer_lag=self.timer_lag, socket_lag=self.socket_lag)
        self._published = 0

    def add(self, port: Port) -> None:
        self.ports.append(port)
        self._by_fd[port.fd] = port
        self._epoll.register(port.fd, select.EPOLLIN)
        self.schedule(port)

    def add_control(self, fd: int, on_readable: Callable[[], None]) -> None:
        """A file descriptor (the parent's pipe) whose readiness runs `on_readable` in the loop."""
        self._controls[fd] = on_readable
        self._epoll.register(fd, select.EPOLLIN)

    def schedule(self, port: Port) -> None:
        """Pump `port` on the next turn (after new work was given to its endpoint)."""
        if not port.queued:
            port.queued = True
            self._ready.append(port)

    def global_horizon(self, mine: int) -> int:
        if self.horizon is None:
            return mine
        self.horizon.publish(self.index, mine)
        return self.horizon.min()

    def run(self, stop: Callable[[], bool], tick: Callable[[int], None] | None = None,
            tick_ns: int = 1_000_000) -> LoopStats:
        clock = self.clock
        start_wall = time.monotonic_ns()
        run0, wait0 = schedstat()
        next_tick = clock.now() + tick_ns
        timeout = 0.0
        ready, heap = self._ready, self._heap
        by_fd, controls = self._by_fd, self._controls
        while not stop():
            events = self._epoll.poll(timeout)
            polled = clock.now()
            mine = polled  # every socket not reported readable was empty when poll returned
            for fd, _ in events:
                port = by_fd.get(fd)
                if port is None:
                    controls[fd]()
                    continue
                got, behind = port.receive(clock, RECV_BUDGET, self.socket_lag)
                if behind is not None:
                    mine = min(mine, behind)  # more waits in this socket: read up to `behind` only
                if got:
                    self.schedule(port)
            now = clock.now()
            while heap and heap[0][0] <= now:
                due, _, port = heapq.heappop(heap)
                if port.wake_at != due:
                    continue  # superseded by a later schedule
                port.wake_at = None
                self.timer_lag.record(int((now - due) * clock.dilation))
                self.schedule(port)
            horizon = self.global_horizon(mine)
            for _ in range(min(PUMPS_PER_TURN, len(ready))):
                port = ready.popleft()
                port.queued = False
                now = clock.now()
                port.endpoint.pump(now, port.send, clock.now, min(now, horizon))
                self._arm(port, now)
            now = clock.now()
            if tick is not None and now >= next_tick:
                tick(now)
                next_tick = now + tick_ns
            self.stats.turns += 1
            if ready or events:
                timeout = 0.0
                continue
            wake = heap[0][0] if heap else now + IDLE_WAKE_NS
            wake = min(wake, now + IDLE_WAKE_NS, next_tick if tick is not None else wake)
            timeout = max(0.0, (wake - now) * clock.dilation / 1e9)
            self.global_horizon(clock.now())  # idle: everything that arrived has been read
        if self.horizon is not None:
            self.horizon.publish(self.index, FOREVER)  # a worker that stopped holds nobody back
        run1, wait1 = schedstat()
        self.stats.wall_ns = time.monotonic_ns() - start_wall
        self.stats.cpu_ns, self.stats.runqueue_wait_ns = run1 - run0, wait1 - wait0
        self.stats.datagrams = sum(p.datagrams for p in self.ports)
        self.stats.frames_sent = sum(p.frames_sent for p in self.ports)
        return self.stats

    def _arm(self, port: Port, now: int) -> None:
        wake = port.endpoint.next_wakeup()
        if wake is None:
            return
        if wake <= now:
            self.schedule(port)
            return
        if port.wake_at is None or wake < port.wake_at:
            port.wake_at = wake
            heapq.heappush(self._heap, (wake, id(port), port))

    def close(self) -> None:
        self._epoll.close()
