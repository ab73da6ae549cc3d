"""The `fixed` CC profile: a constant window, no congestion control (baselines, tests, comparisons).

It must never move its window: a comparison against it is a comparison against no CC at all.
"""

from __future__ import annotations

from .base import CongestionControl


class FixedWindow(CongestionControl):
    """A constant window (no congestion control): for baselines and tests."""

    name = "fixed"

    def __init__(self, window: int = 512 * 1024, mtu: int = 4096, link_rate_bps: float | None = None,
                 base_rtt_ns: int | None = None) -> None:
        self.cwnd = float(window)  # the same on any link

    def on_sent(self, now: int, ev: int, nbytes: int) -> None:
        pass

    def on_acked(self, now: int, ev: int, nbytes: int, rtt_ns: int | None, srtt_ns: float, ecn: bool) -> None:
        pass

    def on_lost(self, now: int, ev: int, nbytes: int, srtt_ns: float, congestion: bool) -> None:
        pass

    def on_trimmed(self, now: int, ev: int, nbytes: int, srtt_ns: float, last_hop: bool = False) -> None:
        pass

    def on_timeout(self, now: int, ev: int, nbytes: int, srtt_ns: float, congestion: bool) -> None:
        pass
