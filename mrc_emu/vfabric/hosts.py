"""Driving the hosts' endpoints in virtual time: datagrams in, pumps, wakeups, frames out.

Why it exists: the transport is sans-IO, and here its driver is the event engine instead of a
worker's event loop (io/loop.py), with the same contract: a datagram goes to the QP its
destination QPN names (transport/mux.py HostMux.route) as `on_datagram(payload, src, sport, now,
tclass, port)` at its arrival time; an endpoint that was given something, or whose
`next_wakeup()` has come, is pumped (`pump(now, send)`, its frames into the host's NIC
queue), once per virtual instant it is due, in the order it became due; a wakeup not after its
last `now` means at once. No clock and no horizon are passed: in virtual time every frame's stamp
is `now`, and every endpoint has seen everything up to it. An endpoint that asks to be pumped
again at once many times without sending anything would hold virtual time still: that is a
driver-interface bug, raised as one (`SpinError`) instead of hanging.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .engine import Engine
from .fabric import VirtualFabric

SPIN_LIMIT = 1000  # pumps at one instant that sent nothing and asked for another at once


class SpinError(RuntimeError):
    """An endpoint keeps asking to be pumped at once and does nothing: virtual time cannot move."""


class _Task:
    """An endpoint as the driver schedules it."""

    __slots__ = ("endpoint", "host", "send", "queued", "wake_at", "spins")

    def __init__(self, endpoint: Any, host: str, send: Callable[[Any, Any], bool]) -> None:
        self.endpoint, self.host, self.send = endpoint, host, send
        self.queued = False  # a pump is scheduled at the current instant
        self.wake_at: int | None = None  # the wakeup scheduled (a later one supersedes none, an earlier one does)
        self.spins = 0


class HostDriver:
    """The endpoints of the hosts attached to `fabric`, run on `engine`. `watchers` are called
    with each endpoint a datagram was handed to, after it took it (progress, faults by progress)."""

    def __init__(self, engine: Engine, fabric: VirtualFabric) -> None:
        self.engine, self.fabric = engine, fabric
        self.muxes: dict[str, Any] = {}
        self.watchers: list[Callable[[Any], None]] = []
        self._tasks: dict[int, _Task] = {}
        self._senders: dict[str, Callable[[Any, Any], bool]] = {}
        self.pumps = 0

    def add_host(self, host: str, mux: Any) -> None:
        """A host's endpoints (a transport.mux.HostMux): datagrams for it go to the QP they name."""
        self.muxes[host] = mux
        self._senders[host] = self.fabric.sender(host)
        route, engine, wake, watchers = mux.route, self.engine, self._wake, self.watchers

        def deliver(payload: bytes, src: bytes, sport: int, tclass: int, port: int) -> None:
            endpoint = route(payload)
            if endpoint is None:
                return  # counted by the mux (unknown_qp)
            endpoint.on_datagram(payload, src, sport, engine.now, tclass, port)
            wake(endpoint)
            for watch in watchers:
                watch(endpoint)

        self.fabric.attach(host, deliver)

    def add_endpoint(self, endpoint: Any, host: str) -> None:
        """Drive `endpoint` (a QP or the MRC endpoint of `host`); it is pumped at once."""
        if id(endpoint) not in self._tasks:
            self._tasks[id(endpoint)] = _Task(endpoint, host, self._senders[host])
        self._wake(endpoint)

    def wake(self, endpoint: Any) -> None:
        """New work was given to `endpoint` (a WRITE posted, a controller's change): pump it now."""
        self._wake(endpoint)

    def _wake(self, endpoint: Any) -> None:
        task = self._tasks.get(id(endpoint))
        if task is not None and not task.queued:
            task.queued = True
            self.engine.at(self.engine.now, self._pump, task)

    def _pump(self, task: _Task) -> None:
        task.queued = False
        now = self.engine.now
        before = self.fabric.frames_sent
        task.endpoint.pump(now, task.send)
        self.pumps += 1
        wake = task.endpoint.next_wakeup()
        if wake is None:
            task.spins = 0
            return
        if wake <= now:
            if self.fabric.frames_sent == before:
                task.spins += 1
                if task.spins > SPIN_LIMIT:
                    raise SpinError(f"{type(task.endpoint).__name__} of {task.host} asked to be pumped at once "
                                    f"{SPIN_LIMIT} times at {now} ns and sent nothing")
            else:
                task.spins = 0
            task.queued = True
            self.engine.at(now, self._pump, task)
            return
        task.spins = 0
        if task.wake_at is None or task.wake_at <= now or wake < task.wake_at:
            task.wake_at = wake
            self.engine.at(wake, self._timer, (task, wake))

    def _timer(self, item: tuple[_Task, int]) -> None:
        task, due = item
        if task.wake_at != due:
            return  # superseded by an earlier wakeup, which pumped it
        task.wake_at = None
        if not task.queued:
            self._pump(task)
