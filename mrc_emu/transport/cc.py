"""Congestion control profiles: how many bytes a QP may have in flight.

Why it exists: spraying spreads load, it does not limit it. A CC profile turns delay, ECN
echoes, trims and losses into a window (bytes in flight). It is fed events by the requester
and its recovery, and owns nothing else: no RTT estimator (each event carries the EV's srtt
from that EV's one estimator, rtt.py), no packet table, no clock.

Events (the unit is bytes on one EV; the requester batches the packets of one EV that one
ACK or one send burst covers into one event, which keeps the per-packet cost of the data path
down without changing any window arithmetic below, linear in bytes):
  on_sent     bytes left on an EV
  on_acked    bytes newly acknowledged, with the RTT sample of that EV from this ACK (None if
              none: Karn's rule) and the EV's srtt after it, and whether the ACK echoed ECN CE
  on_lost     bytes declared lost by a loss rule or a NAK; `congestion` is False when the loss
              is one of a run on a failing path (the EV states handle that, not the window)
  on_trimmed  bytes a switch trimmed (the header arrived, the payload did not): a full queue
  on_timeout  bytes given up on by the ACK timeout
Profiles register by name (`register`); `CC_PROFILES` maps the names to them, `make_cc` builds
one. The default `nscc` is an NSCC-like delay-based window after UET's `uet-1.0-nscc` (its
equations are in docs/transport.md); `fixed` keeps the window constant (baselines, tests).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar


class CongestionControl(ABC):
    """A window in bytes, moved by per-packet (per-EV batch) events. Times are ns."""

    name: ClassVar[str]
    cwnd: float
    decreases: int = 0  # how many times the window was cut (a profile that cuts counts them)

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

    def on_cnp(self, now: int) -> None:  # noqa: B027 - a hook with a default: only rate-based profiles react
        """A DCQCN congestion notification packet arrived for this QP (default: ignored)."""


CC_PROFILES: dict[str, Callable[..., CongestionControl]] = {}  # name -> factory(mtu=..., **options)


def register(cls: type[CongestionControl]) -> type[CongestionControl]:
    """Class decorator: make a profile available by its `name` (CLI `--cc`, TransferSpec.cc)."""
    if cls.name in CC_PROFILES:
        raise ValueError(f"CC profile {cls.name!r} registered twice")
    CC_PROFILES[cls.name] = cls
    return cls


def profile_names() -> list[str]:
    return list(CC_PROFILES)


def make_cc(name: str, mtu: int, **options) -> CongestionControl:
    """The profile registered as `name` for packets of `mtu` payload bytes (options: the profile's own)."""
    factory = CC_PROFILES.get(name)
    if factory is None:
        raise ValueError(f"unknown CC profile {name!r} (known: {', '.join(CC_PROFILES)})")
    return factory(mtu=mtu, **options)


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


@register
class Nscc(CongestionControl):
    """Delay-driven window: grow while the delay is below target, shrink in proportion above it.

    Per acknowledgement of `acked` bytes on an EV whose srtt is s (delay d = s - base_rtt):
      d <= target and no ECN:  cwnd += eta * acked * (target - d) / target  +  fi * mtu * acked / cwnd
      d >  target or ECN:      once per RTT, cwnd *= max(1 - gamma * (d - target) / d, 1 - max_md_jump)
    A loss or an ACK timeout shrinks the window by max_md_jump, once per RTT, when it looks like
    congestion and the EV's delay shows a queue (d > target/2): a loss without queueing is a
    lossy or failing path, which the spray weights and EV states handle. A trim is a queue that
    overflowed: it shrinks the window as an ECN mark does. cwnd stays in [min_cwnd, max_cwnd].
    """

    name = "nscc"

    def __init__(self, params: NsccParams | None = None, mtu: int = 4096) -> None:
        self.p = params or NsccParams()
        self.mtu = mtu
        self.cwnd = float(min(self.p.initial_cwnd, self.p.max_cwnd))
        self.base_rtt = self.p.base_rtt_ns
        self._hold_until = 0  # no second decrease within one RTT
        self.decreases = 0

    def _decrease(self, now: int, factor: float, srtt_ns: float) -> None:
        if now < self._hold_until:
            return
        self.cwnd = max(self.p.min_cwnd, self.cwnd * factor)
        self._hold_until = now + int(srtt_ns or self.p.target_delay_ns)
        self.decreases += 1

    def on_sent(self, now: int, ev: int, nbytes: int) -> None:
        pass  # the window limits what the requester has in flight; sending itself changes nothing

    def on_acked(self, now: int, ev: int, nbytes: int, rtt_ns: int | None, srtt_ns: float, ecn: bool) -> None:
        p = self.p
        if rtt_ns is not None and rtt_ns > 0 and p.base_rtt_ns == 0 and (self.base_rtt == 0 or rtt_ns < self.base_rtt):
            self.base_rtt = rtt_ns
        delay = max(0.0, srtt_ns - self.base_rtt) if srtt_ns else 0.0
        if ecn or delay > p.target_delay_ns:
            factor = 1 - p.max_md_jump
            if delay > p.target_delay_ns:
                factor = max(1 - p.gamma * (delay - p.target_delay_ns) / delay, factor)
            self._decrease(now, factor, srtt_ns)
            return
        if nbytes:
            grow = p.eta * nbytes * (p.target_delay_ns - delay) / p.target_delay_ns
            grow += p.fi * self.mtu * nbytes / self.cwnd
            self.cwnd = min(p.max_cwnd, self.cwnd + grow)

    def on_lost(self, now: int, ev: int, nbytes: int, srtt_ns: float, congestion: bool) -> None:
        if congestion and srtt_ns and srtt_ns - self.base_rtt > self.p.target_delay_ns / 2:
            self._decrease(now, 1 - self.p.max_md_jump, srtt_ns)

    def on_trimmed(self, now: int, ev: int, nbytes: int, srtt_ns: float, last_hop: bool = False) -> None:
        self._decrease(now, 1 - self.p.max_md_jump, srtt_ns)

    def on_timeout(self, now: int, ev: int, nbytes: int, srtt_ns: float, congestion: bool) -> None:
        self.on_lost(now, ev, nbytes, srtt_ns, congestion)


@register
class FixedWindow(CongestionControl):
    """A constant window (no congestion control): for baselines and tests."""

    name = "fixed"

    def __init__(self, window: int = 512 * 1024, mtu: int = 4096) -> None:
        self.cwnd = float(window)

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
