"""Congestion control profiles: how many bytes a QP may have in flight, and how fast it may send.

Why it exists: spraying spreads load, it does not limit it. A CC profile turns delay, ECN
echoes, trims, CNPs and losses into a window (bytes in flight) and, for a rate-based profile,
a pacing rate. It is fed events by the requester and its recovery, and owns nothing else: no
RTT estimator (each event carries the EV's srtt from that EV's one estimator, rtt.py, and the
RTT sample of this ACK), no packet table, no clock (time comes with every event, and
`advance(now)` lets a profile's own timers run when the requester pumps).

Events (the unit is bytes on one EV; the requester batches the packets of one EV that one
ACK covers into one event, which keeps the per-packet cost of the data path down; a profile
takes one event as one UEC OnACK of that many bytes):
  on_sent     one packet's bytes left on an EV, at its send time (both send loops, C and Python,
              call it per packet: a profile's timers run to each packet's stamp)
  on_acked    bytes newly acknowledged, with the RTT sample of that EV from this ACK (None if
              none: Karn's rule), the EV's srtt after it, and whether the ACK says a packet of
              that EV among those it newly acknowledges arrived CE-marked
  on_lost     bytes declared lost by a loss rule or a NAK; `congestion` is False when the loss
              is one of a run on a failing path (the EV states handle that, not the window)
  on_trimmed  a TRIM NACK: a switch trimmed the bytes (the header arrived, the payload did
              not); `last_hop` when the port that trimmed faces the destination host
  on_timeout  bytes given up on by the ACK timeout
  on_cnp      a DCQCN congestion notification packet arrived for this QP (default: nothing)
A profile answers `cwnd` (bytes), `pacing_rate_bps` (None: the window alone limits) and
`next_timer()` (when its own timers next change what it allows; None: never by themselves).
Profiles are found by name in registry.py; this module is what every profile implements, and it
must never import a profile or the registry (they import it).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar


class CongestionControl(ABC):
    """A window in bytes (and optionally a pacing rate), moved by per-packet (per-EV batch)
    events. Times are ns, rates bit/s."""

    name: ClassVar[str]
    cwnd: float
    decreases: int = 0  # how many times the window (or rate) was cut (a profile that cuts counts them)

    @property
    def pacing_rate_bps(self) -> float | None:
        """The rate the requester sends at most (None: no pacing, the window alone limits)."""
        return None

    def advance(self, now: int) -> None:
        """Let the profile's own timers run up to `now` (the requester calls it as it pumps)."""
        return None  # a window-only profile has no timers

    def next_timer(self) -> int | None:
        """When the profile's timers next change what it allows (None: not by themselves)."""
        return None

    @abstractmethod
    def on_sent(self, now: int, ev: int, nbytes: int) -> None: ...

    @abstractmethod
    def on_acked(self, now: int, ev: int, nbytes: int, rtt_ns: int | None, srtt_ns: float, ecn: bool) -> None: ...

    @abstractmethod
    def on_lost(self, now: int, ev: int, nbytes: int, srtt_ns: float, congestion: bool) -> None: ...

    @abstractmethod
    def on_trimmed(self, now: int, ev: int, nbytes: int, srtt_ns: float, last_hop: bool = False) -> None: ...

    @abstractmethod
    def on_timeout(self, now: int, ev: int, nbytes: int, srtt_ns: float, congestion: bool) -> None: ...

    def on_cnp(self, now: int) -> None:
        """A CNP arrived for this QP (only a DCQCN-like profile reacts)."""
        return None  # a window profile hears congestion from ECN echoes, trims and losses instead
