"""Congestion control profiles: how many bytes a QP may have in flight.

Why it exists: spraying spreads load, it does not limit it. A CC profile turns delay, ECN
echoes and losses into a window (bytes in flight). The default is an NSCC-like delay-based
window after UET's `uet-1.0-nscc`; its equations are in docs/transport.md. `fixed` keeps
the window constant (for baselines and tests).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class CcProfile(Protocol):
    name: str
    cwnd: float

    def on_ack(self, now: int, acked_bytes: int, rtt_ns: int | None, ecn: bool) -> None: ...
    def on_loss(self, now: int) -> None: ...


@dataclass
class NsccParams:
    base_rtt_ns: int = 0  # 0: learn it (the smallest RTT seen)
    target_delay_ns: int = 2_000_000  # queueing delay above base_rtt the window aims at
    max_cwnd: int = 2 * 1024 * 1024  # bytes
    min_cwnd: int = 4096
    initial_cwnd: int = 512 * 1024
    eta: float = 0.15  # proportional increase gain
    gamma: float = 0.8  # multiplicative decrease gain
    fi: float = 1.0  # fair increase, MTUs per RTT
    max_md_jump: float = 0.5  # largest fraction a single decrease removes


class Nscc:
    """Delay-driven window: grow while the delay is below target, shrink in proportion above it.

    Per ACK covering `acked` bytes with RTT sample r (delay d = r - base_rtt):
      d <= target and no ECN:  cwnd += eta * acked * (target - d) / target  +  fi * mtu * acked / cwnd
      d >  target or ECN:      once per RTT, cwnd *= max(1 - gamma * (d - target) / d, 1 - max_md_jump)
    A loss shrinks the window by max_md_jump, once per RTT, when the delay shows a queue
    (d > target/2): a loss without queueing is a lossy or failing path, which the spray
    weights and EV states handle, not congestion. cwnd stays in [min_cwnd, max_cwnd].
    """

    name = "nscc"

    def __init__(self, params: NsccParams | None = None, mtu: int = 4096) -> None:
        self.p = params or NsccParams()
        self.mtu = mtu
        self.cwnd = float(min(self.p.initial_cwnd, self.p.max_cwnd))
        self.base_rtt = self.p.base_rtt_ns
        self.srtt = 0.0
        self._hold_until = 0  # no second decrease within one RTT
        self.decreases = 0

    def _decrease(self, now: int, factor: float) -> None:
        if now < self._hold_until:
            return
        self.cwnd = max(self.p.min_cwnd, self.cwnd * factor)
        self._hold_until = now + int(self.srtt or self.p.target_delay_ns)
        self.decreases += 1

    def on_ack(self, now: int, acked_bytes: int, rtt_ns: int | None, ecn: bool) -> None:
        p = self.p
        if rtt_ns is not None and rtt_ns > 0:
            if self.p.base_rtt_ns == 0 and (self.base_rtt == 0 or rtt_ns < self.base_rtt):
                self.base_rtt = rtt_ns
            self.srtt = rtt_ns if not self.srtt else self.srtt + (rtt_ns - self.srtt) / 8
        delay = max(0.0, (self.srtt or 0.0) - self.base_rtt)
        if ecn or delay > p.target_delay_ns:
            factor = 1 - p.max_md_jump
            if delay > p.target_delay_ns:
                factor = max(1 - p.gamma * (delay - p.target_delay_ns) / delay, factor)
            self._decrease(now, factor)
            return
        if acked_bytes:
            grow = p.eta * acked_bytes * (p.target_delay_ns - delay) / p.target_delay_ns
            grow += p.fi * self.mtu * acked_bytes / self.cwnd
            self.cwnd = min(p.max_cwnd, self.cwnd + grow)

    def on_loss(self, now: int) -> None:
        if self.srtt and self.srtt - self.base_rtt > self.p.target_delay_ns / 2:
            self._decrease(now, 1 - self.p.max_md_jump)


class FixedWindow:
    """A constant window (no congestion control): for baselines and tests."""

    name = "fixed"

    def __init__(self, cwnd: int) -> None:
        self.cwnd = float(cwnd)

    def on_ack(self, now: int, acked_bytes: int, rtt_ns: int | None, ecn: bool) -> None:
        pass

    def on_loss(self, now: int) -> None:
        pass


CC_PROFILES = ("nscc", "fixed")


def make_cc(name: str, mtu: int, params: NsccParams | None = None, window: int = 512 * 1024) -> CcProfile:
    if name == "nscc":
        return Nscc(params, mtu)
    if name == "fixed":
        return FixedWindow(window)
    raise ValueError(f"unknown CC profile {name!r} (known: {', '.join(CC_PROFILES)})")
