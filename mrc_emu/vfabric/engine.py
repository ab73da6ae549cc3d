"""The event engine: a heap of timestamped events, run in time order, ties in the order scheduled.

Why it exists: everything in the virtual fabric happens at a virtual time in nanoseconds (a
frame leaves a port, arrives at a node, a QP's timer falls due) and must happen in one order
only, the same in every run: events are (time_ns, seq, action, argument), seq a counter that
breaks ties by scheduling order, so neither the heap's internals nor object identities ever
decide what comes first. It knows no clock but its own `now`.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

Action = Callable[[Any], None]


class Engine:
    """Runs scheduled actions in (time, scheduling order); `now` is the time of the one running."""

    def __init__(self) -> None:
        self.now = 0
        self.events = 0  # actions run so far
        self._heap: list[tuple[int, int, Action, Any]] = []
        self._seq = 0
        self.stopped = False

    def at(self, time_ns: int, action: Action, argument: Any = None) -> None:
        """Run `action(argument)` at `time_ns` (not before now: time never goes back)."""
        if time_ns < self.now:
            raise ValueError(f"an event at {time_ns} ns is in the past (now {self.now} ns)")
        self._seq += 1
        heapq.heappush(self._heap, (time_ns, self._seq, action, argument))

    def after(self, delay_ns: int, action: Action, argument: Any = None) -> None:
        self.at(self.now + delay_ns, action, argument)

    def stop(self) -> None:
        """End `run` once the running action returns."""
        self.stopped = True

    @property
    def pending(self) -> int:
        return len(self._heap)

    def next_time(self) -> int | None:
        return self._heap[0][0] if self._heap else None

    def run(self, until_ns: int | None = None) -> bool:
        """Run events until `stop()`, until none is left, or until the next one is later than
        `until_ns` (then now = until_ns). True if stopped, False otherwise."""
        heap, pop = self._heap, heapq.heappop
        self.stopped = False
        while heap:
            if until_ns is not None and heap[0][0] > until_ns:
                self.now = max(self.now, until_ns)
                return False
            time_ns, _, action, argument = pop(heap)
            self.now = time_ns
            self.events += 1
            action(argument)
            if self.stopped:
                return True
        return False
