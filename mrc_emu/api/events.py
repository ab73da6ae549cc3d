"""EV events (mrc_ctl.h c:933-989): a bounded queue of EV state changes, with drop counts.

Why it exists: a controller learns that an EV went ASSUMED_BAD or back to GOOD from events, not
by polling every EV. One record per state change whose new state is in the profile's
ev_event_mask; a change whose state is masked is not queued at all. The queue is bounded: an
event arriving when it is full is dropped and counted, and the count is reported with the next
event read (the header's drop_count: the exact number of events lost since the previous delivery
with EV_EVENT_PRECISE_DROP_CNT, else a 0/1 flag). The queue itself never overruns. It must never
touch the system.
"""

from __future__ import annotations

import errno
from collections import deque
from dataclasses import dataclass
from enum import IntFlag

from .errors import MrcApiError


class EvState(IntFlag):
    """enum mrc_ctl_ev_state (c:482-487)."""

    GOOD = 1 << 0
    ASSUMED_BAD = 1 << 1  # the device saw this EV fail: probed, no data, until it is GOOD again
    DENIED = 1 << 2       # the controller forbade it: no data, no probes, until the controller allows it
    UNKNOWN = 1 << 31     # a query's answer for an UNPOPULATED slot (the header does not define it further)

    @property
    def carries_data(self) -> bool:
        """Only a GOOD EV carries data: never a DENIED one, nor an ASSUMED_BAD or UNKNOWN one."""
        return self == EvState.GOOD


SETTABLE_STATES = (EvState.GOOD, EvState.ASSUMED_BAD, EvState.DENIED)  # what an entry's `state` may be


@dataclass(frozen=True)
class EvEvent:
    """struct mrc_ctl_ev_event: which profile, which EV (value, port), the new state, events lost before it."""

    profile_id: int
    ev: bytes
    port: int
    state: EvState
    drop_count: int = 0


class EvEventQueue:
    """The event queue (mrc_ctl's event CQ) of one controller: `post()` from state changes, `poll()` to read."""

    def __init__(self, capacity: int = 64, precise_drop_count: bool = True):
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise MrcApiError(f"capacity: {capacity!r} is not a positive event count")
        self.capacity = capacity
        self.precise_drop_count = precise_drop_count  # opt_attr EV_EVENT_PRECISE_DROP_CNT
        self._events: deque[EvEvent] = deque()
        self._dropped = 0  # events lost since the previous delivery

    def __len__(self) -> int:
        return len(self._events)

    def post(self, profile_id: int, event_mask: int, ev: bytes, port: int, state: EvState) -> bool:
        """Queue the change to `state` if the mask selects it; False if masked or dropped (queue full)."""
        if not int(event_mask) & int(state):
            return False
        if len(self._events) >= self.capacity:
            self._dropped += 1
            return False
        self._events.append(EvEvent(profile_id, bytes(ev), port, EvState(state)))
        return True

    def poll(self, max_events: int) -> list[EvEvent]:
        """Up to `max_events` events, oldest first; the first carries the drops since the previous delivery."""
        if isinstance(max_events, bool) or not isinstance(max_events, int) or max_events < 1:
            raise MrcApiError(f"max_events: {max_events!r} is not a positive event count", errno.EINVAL)
        out = []
        while self._events and len(out) < max_events:
            event = self._events.popleft()
            if self._dropped:
                drops = self._dropped if self.precise_drop_count else 1
                event = EvEvent(event.profile_id, event.ev, event.port, event.state, drops)
                self._dropped = 0
            out.append(event)
        return out
