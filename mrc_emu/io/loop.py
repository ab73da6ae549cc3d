"""One worker's event loop: the sockets of many hosts, one timer heap, and a measure of its own lag.

Why it exists: on a 2-core machine a process per host means a process waits tens of
milliseconds for the CPU, and every timer shorter than that fires late and blames the
network. Here a fixed pool of workers each serves many hosts: one epoll over all their
receive sockets, one heap of the endpoints' wakeups, a bounded amount of sending per turn so
that receiving is never starved. And the loop knows when it is itself the bottleneck:

- every datagram is taken with the kernel's arrival stamp (SO_TIMESTAMPNS) and handed to the
  transport at that time, so an ACK that waited in a socket for the worker does not lengthen
  an RTT sample (without _sockio it is timed when read, and the run's emulation block says so);
- it measures its lag (how late it serves a due wakeup, how long a datagram waited in a
  socket), the CPU it got and the time it waited for one (/proc/thread-self/schedstat);
- it publishes a *horizon*: the time up to which it has read every datagram that arrived at
  its sockets and sent what they caused. Timers in the transport decide at
  min(now, every worker's horizon): a loss timer never fires on a packet whose ACK is still
  in a socket that a starved worker has not read yet. (Conservative synchronisation, as in
  parallel discrete-event simulation: nothing is decided beyond what every part has seen.)
  Two things hold it further back: a datagram the kernel handed over late (held in a per-CPU
  backlog past the moment its socket was taken as read: the worker's own horizon, by twice the
  lateness), and an answer that left late (an ACK of a responder whose worker was off the CPU:
  its recipient reads it with a kernel stamp that much later than the network alone would give,
  so every worker's decisions, by the lag, until all have read past the moment it left).

It never enters a namespace and never builds a socket: the runtime gives it sockets made in
each host's namespace. It never decides anything about the transport itself.
"""

from __future__ import annotations

import heapq
import select
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .clock import FOREVER, Clock, Horizon, LagMeter, schedstat
from .port import Port, _sockio  # noqa: F401  (_sockio: whether the C receive is built, for tests)

__all__ = ["Clock", "EventLoop", "Horizon", "LagMeter", "LoopStats", "Port", "schedstat"]

RECV_BUDGET = 32  # datagrams per socket per turn, so a busy responder acknowledges every 32 packets
RECV_PER_TURN = 256  # datagrams per turn over all sockets, then the due endpoints get their turn
TURN_NS = 1_000_000  # pump due endpoints (each sends at most its burst, 32) for this long, then receive again
IDLE_WAKE_NS = 500_000  # an idle worker still wakes this often to publish its horizon
SLACK_HALF_LIFE_NS = 1_000_000_000  # the horizon's kernel slack halves after this long without a late datagram
# An answer later than this holds every decision back by its lag (_answered). Below it, none: all
# packets an ACK covers wait for it alike, so only the ACK timeout (16.8 ms) could mistake an
# answer's lag for the network's, and not one this much smaller; holding the loss rules back by
# a busy responder's usual few hundred microseconds would slow the response to real failures.
ANSWER_LAG_FLOOR_NS = 1_000_000


class _Task:
    """An endpoint as the loop schedules it: its send function and its pending wakeup."""

    __slots__ = ("endpoint", "send", "first", "wake_at", "queued", "owed_since")

    def __init__(self, endpoint: Any, send: Callable[[bytes, Any], bool], first: bool) -> None:
        self.endpoint = endpoint
        self.send = send
        self.first = first  # an answering endpoint: pumped before the others each turn
        self.wake_at: int | None = None
        self.queued = False
        # the oldest datagram (or due timer) this endpoint has been given and not yet answered
        # in a pump: until then, what it caused has not left, and the horizon stays behind it
        self.owed_since: int | None = None


@dataclass
class LoopStats:
    """What a worker measured about itself over one run."""

    wall_ns: int = 0
    cpu_ns: int = 0
    runqueue_wait_ns: int = 0
    turns: int = 0
    datagrams: int = 0
    frames_sent: int = 0
    late_datagrams: int = 0  # read after the horizon had passed their arrival (Port.late)
    late_max_ns: int = 0
    slack_max_ns: int = 0  # the most the horizon was held back for them
    answer_lag_max_ns: int = 0  # the latest an answer left, by which every worker's decisions were held back
    # hosts whose port read without the kernel's arrival stamps (Port.stamped: the Python receive
    # path), and datagrams timed when read rather than on arrival (all of theirs, and any the C path
    # got without a stamp): those arrival times include the worker's own lag
    python_receive: list[str] = field(default_factory=list)
    unstamped_datagrams: int = 0
    truncated_datagrams: int = 0  # dropped on receipt, cut short (Port.truncated): the emulator's losses
    timer_lag: LagMeter | None = None  # how late what was due (a datagram's arrival, a timer) was answered
    socket_lag: LagMeter | None = None  # how long datagrams waited in a socket

    def to_dict(self) -> dict:
        return {"wall_ns": self.wall_ns, "cpu_ns": self.cpu_ns, "runqueue_wait_ns": self.runqueue_wait_ns,
                "late_datagrams": self.late_datagrams, "late_max_ns": self.late_max_ns, "slack_max_ns": self.slack_max_ns,
                "answer_lag_max_ns": self.answer_lag_max_ns, "python_receive": list(self.python_receive),
                "unstamped_datagrams": self.unstamped_datagrams, "truncated_datagrams": self.truncated_datagrams,
                "turns": self.turns, "datagrams": self.datagrams, "frames_sent": self.frames_sent,
                "timer_lag": self.timer_lag.to_dict() if self.timer_lag else None,
                "socket_lag": self.socket_lag.to_dict() if self.socket_lag else None}


class EventLoop:
    """Drives the endpoints of many ports: receive, pump what is due, sleep until the next wakeup.

    Each turn reads at most RECV_PER_TURN datagrams (RECV_BUDGET per socket) and pumps due
    endpoints for at most TURN_NS, so that no socket waits long behind a busy sender and no sender
    behind a flood of datagrams. An endpoint takes `on_datagram(payload, src, sport, now, tclass)`,
    sends on `pump(now, send, clock, horizon)` and says when it next needs pumping with
    `next_wakeup()` (a time not after its last `now`: at once).
    """

    def __init__(self, clock: Clock, horizon: Horizon | None = None, index: int = 0) -> None:
        self.clock = clock
        self.horizon = horizon
        self.index = index
        self.ports: list[Port] = []
        self._by_fd: dict[int, Port] = {}
        self._tasks: dict[int, _Task] = {}  # by id(endpoint)
        self._epoll = select.epoll()
        self._controls: dict[int, Callable[[], None]] = {}
        self._heap: list[tuple[int, int, _Task]] = []
        self._ready: deque[_Task] = deque()
        self._answer: deque[_Task] = deque()  # ready answering endpoints (responders): served first
        self._behind: set[Port] = set()  # readable ports not read to the end
        self.timer_lag = LagMeter()
        self.socket_lag = LagMeter()
        self.stats = LoopStats(timer_lag=self.timer_lag, socket_lag=self.socket_lag)
        self._measured_from: tuple[int, ...] | None = None  # wall, cpu, wait, datagrams, frames, late, unstamped, truncated
        self.measuring = False
        self.slack_ns = 0  # how far behind what it has read the horizon is published (_horizon)
        self._slack_since = 0
        # answers that left late, as (lag, sent by) with lags decreasing: the first is the answer lag
        # published, until every worker has read past the time it was sent (_answered)
        self._late_answers: deque[tuple[int, int]] = deque()

    def measure(self, on: bool) -> None:
        """Measure the loop from now (on) until now (off): the run itself, not its set-up (making
        source bytes) or its end (hashing the placed ones), which block the loop on purpose."""
        if on and not self.measuring:
            self.measuring = True
            run, wait = schedstat()
            self._measured_from = (time.monotonic_ns(), run, wait, self._datagrams(), self._frames(),
                                   sum(p.late for p in self.ports), sum(p.unstamped for p in self.ports),
                                   self._truncated())
            self.stats.late_max_ns = 0
            self.stats.answer_lag_max_ns = 0
            self.timer_lag.reset()
            self.socket_lag.reset()
        elif not on and self.measuring:
            self.measuring = False
            wall0, run0, wait0, d0, f0, late0, unstamped0, truncated0 = self._measured_from
            run, wait = schedstat()
            self.stats.wall_ns = time.monotonic_ns() - wall0
            self.stats.cpu_ns, self.stats.runqueue_wait_ns = run - run0, wait - wait0
            self.stats.datagrams, self.stats.frames_sent = self._datagrams() - d0, self._frames() - f0
            self.stats.late_datagrams = sum(p.late for p in self.ports) - late0
            self.stats.unstamped_datagrams = sum(p.unstamped for p in self.ports) - unstamped0
            self.stats.truncated_datagrams = self._truncated() - truncated0
            self.stats.python_receive = sorted(p.host for p in self.ports if not p.stamped)

    def _datagrams(self) -> int:
        return sum(p.datagrams for p in self.ports)

    def _frames(self) -> int:
        return sum(p.frames_sent for p in self.ports)

    def _truncated(self) -> int:
        return sum(n for p in self.ports for n in p.truncated.values())

    def add_port(self, port: Port) -> None:
        self.ports.append(port)
        self._by_fd[port.fd] = port
        port.read_through = self.clock.now()
        self._epoll.register(port.fd, select.EPOLLIN)

    def add_endpoint(self, endpoint: Any, port: Port, first: bool = False) -> None:
        """Drive `endpoint` (a QP of the port's host), sending through the port; pumped at once.

        `first`: an endpoint that only answers (a responder: its pump sends ACKs, a few short
        frames): every turn pumps all such endpoints that are due before any other. A requester's
        pump sends a burst of data (about a millisecond of sendto here); were ACKs queued behind
        the bursts of 64 requesters, they would wait for tens of milliseconds, and every
        requester's clock with them."""
        task = self._tasks.get(id(endpoint))
        if task is None:
            task = self._tasks[id(endpoint)] = _Task(endpoint, port.send, first)
        self._queue(task)

    def add_control(self, fd: int, on_readable: Callable[[], None]) -> None:
        """A file descriptor (the parent's pipe) whose readiness runs `on_readable` in the loop."""
        self._controls[fd] = on_readable
        self._epoll.register(fd, select.EPOLLIN)

    def wake(self, endpoint: Any, since: int | None = None) -> None:
        """Pump `endpoint` on a coming turn: new work was given, or (`since`: its arrival time) a
        datagram reached it, whose consequences are owed until then."""
        task = self._tasks.get(id(endpoint))
        if task is not None:
            if since is not None and (task.owed_since is None or since < task.owed_since):
                task.owed_since = since
            self._queue(task)

    def _queue(self, task: _Task) -> None:
        if not task.queued:
            task.queued = True
            (self._answer if task.first else self._ready).append(task)

    def _horizon(self, mine: int, now: int) -> int:
        """Publish how far this worker has read and answered, less the kernel slack: a datagram
        the kernel once held back by g (Port.late) says the next may be held as long, so the
        horizon stays 2 g behind, halving each SLACK_HALF_LIFE_NS without another. Beside it goes
        the lag of its latest late answer not yet read past by every worker (_answered); returns
        what decisions are judged at (Horizon.min)."""
        if self.horizon is None:
            return mine
        if self.slack_ns and now - self._slack_since >= SLACK_HALF_LIFE_NS:
            self.slack_ns //= 2
            self._slack_since = now
        late = self._late_answers
        if late:
            read = self.horizon.slowest()
            while late and late[0][1] <= read:
                late.popleft()  # every worker has read past it: whatever that answer was, it was read
        self.horizon.publish(self.index, mine - self.slack_ns, late[0][0] if late else 0)
        return self.horizon.min()

    def _answered(self, lag: int, sent_by: int) -> None:
        """An answer (an ACK, a NAK, a returned probe) left `lag` late, by `sent_by`.

        Its recipient will read it with a kernel stamp `lag` later than the network alone would
        have given it, so until every worker has read past `sent_by`, what any of them has read
        through (by kernel stamps) says nothing about it: Horizon.min() is held back by `lag`.
        A sliding maximum: an earlier answer that was less late is covered by this one."""
        late = self._late_answers
        while late and late[-1][0] <= lag:
            late.pop()
        late.append((lag, sent_by))
        if self.measuring:
            self.stats.answer_lag_max_ns = max(self.stats.answer_lag_max_ns, int(lag * self.clock.dilation))

    def _late(self, gap: int, now: int) -> None:
        """A port was handed a datagram `gap` late: widen the slack, and count the gap if measuring."""
        if self.measuring:
            self.stats.late_max_ns = max(self.stats.late_max_ns, int(gap * self.clock.dilation))
        if 2 * gap > self.slack_ns:
            self.slack_ns = 2 * gap
            self.stats.slack_max_ns = max(self.stats.slack_max_ns, int(self.slack_ns * self.clock.dilation))
        self._slack_since = now

    def run(self, stop: Callable[[], bool], tick: Callable[[int], None] | None = None,
            tick_ns: int = 1_000_000) -> LoopStats:
        clock = self.clock
        next_tick = clock.now() + tick_ns
        timeout = 0.0
        ready, answer, heap, behind = self._ready, self._answer, self._heap, self._behind
        by_fd, controls, wake = self._by_fd, self._controls, self.wake
        rotate = 0
        idle = LagMeter()  # what arrives while not measuring is not counted
        while not stop():
            socket_lag = self.socket_lag if self.measuring else idle
            if timeout > 0:
                self._epoll.poll(timeout)  # sleep until something is readable, or the next wakeup
            # the time is read before sockets are looked at: a datagram that arrives meanwhile is
            # seen now or counted as unread (the horizon must never run ahead of what was read)
            polled = clock.now()
            events = self._epoll.poll(0)
            readable = []
            for fd, _ in events:
                port = by_fd.get(fd)
                if port is None:
                    controls[fd]()
                else:
                    readable.append(port)
            # a port not readable when epoll returned has nothing waiting: read through `polled`;
            # only the ports left behind (readable, not read to the end) hold the horizon back
            readable_set = set(readable)
            behind.intersection_update(readable_set)
            budget = RECV_PER_TURN
            if readable:
                rotate = (rotate + 1) % len(readable)
                for port in readable[rotate:] + readable[:rotate]:
                    if budget <= 0:
                        behind.add(port)  # left for the next turn: read only as far as before
                        continue
                    allowed = min(RECV_BUDGET, budget)
                    got = port.receive(clock, allowed, socket_lag, wake)
                    budget -= got
                    if port.late_gap_ns:
                        self._late(port.late_gap_ns, polled)
                        port.late_gap_ns = 0
                    if got >= allowed:  # stopped by its budget, not by an empty socket: more may wait
                        behind.add(port)
                    else:
                        behind.discard(port)
            now = clock.now()
            while heap and heap[0][0] <= now:
                due, _, task = heapq.heappop(heap)
                if task.wake_at != due:
                    continue  # superseded by a later schedule
                task.wake_at = None
                wake(task.endpoint, due)
            # the horizon: read through `polled`, except sockets left behind, and not past what an
            # endpoint was given and has not answered yet
            mine = polled
            for port in behind:
                if port.read_through < mine:
                    mine = port.read_through
            for queue in (answer, ready):
                for task in queue:
                    if task.owed_since is not None and task.owed_since < mine:
                        mine = task.owed_since
            horizon = self._horizon(mine, polled)
            lag = self.timer_lag if self.measuring else idle
            for _ in range(len(answer)):  # every answering endpoint due now, once
                self._serve(answer.popleft(), horizon, lag)
            turn_ends = time.monotonic_ns() + TURN_NS
            for _ in range(len(ready)):  # each endpoint due now at most once per turn
                self._serve(ready.popleft(), horizon, lag)
                if time.monotonic_ns() >= turn_ends:
                    break
            now = clock.now()
            if tick is not None and now >= next_tick:
                tick(now)
                next_tick = now + tick_ns
            self.stats.turns += 1
            if ready or answer or behind or budget <= 0:
                timeout = 0.0
                continue
            wake_at = heap[0][0] if heap else now + IDLE_WAKE_NS
            wake_at = min(wake_at, now + IDLE_WAKE_NS, next_tick if tick is not None else wake_at)
            timeout = max(0.0, (wake_at - now) * clock.dilation / 1e9)
        if self.horizon is not None:
            self.horizon.publish(self.index, FOREVER)  # a worker that stopped holds nobody back
        self.measure(False)
        return self.stats

    def _serve(self, task: _Task, horizon: int, lag: LagMeter) -> None:
        """Pump one endpoint; the loop's lag is how late it answered what it was owed."""
        task.queued = False
        now = self.clock.now()
        owed_since = task.owed_since
        if owed_since is not None:
            lag.record(int((now - owed_since) * self.clock.dilation))
            task.owed_since = None
        task.endpoint.pump(now, task.send, self.clock.now, min(now, horizon))
        if task.first and owed_since is not None and now - owed_since >= ANSWER_LAG_FLOOR_NS and self.horizon is not None:
            self._answered(now - owed_since, self.clock.now())
        self._arm(task, now)

    def _arm(self, task: _Task, now: int) -> None:
        wake = task.endpoint.next_wakeup()
        if wake is None:
            return
        if wake <= now:
            self._queue(task)
            return
        if task.wake_at is None or wake < task.wake_at:
            task.wake_at = wake
            heapq.heappush(self._heap, (wake, id(task), task))

    def close(self) -> None:
        self._epoll.close()
