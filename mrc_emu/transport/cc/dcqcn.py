"""DCQCN's reaction point: RoCEv2's deployed congestion control (CC profile `dcqcn`), the baseline.

Why it exists: the baseline QP (RoCEv2 RC) must react to congestion as deployed NICs do, so that
MRC/NSCC is compared with DCQCN and not with no congestion control at all. DCQCN is rate-based:
a CNP from the responder (sent for CE-marked arrivals, at most one per interval) cuts the
sending rate by α/2 and raises α; with no CNP, α decays every K, and the rate climbs back
towards its target in fast recovery, additive and hyper increase, stepped by a timer and a byte
counter. The paper model, as uet-htsim's dcqcn.cpp implements it (../shared/ref/FABRIC-CC.md §4),
with the increase timer and steps of HPCC's NIC model (rdma-hw.cc's attribute defaults): the
paper's 55 us timer is less than one packet time of a 400 Mbit/s emulated link, and it climbed
back between two CNPs (docs/transport.md says what was measured).

What it must never do: keep a clock. Its timers run on the `now` of every call (`advance`); a
long quiet spell is caught up at the next call, and the requester asks `next_timer` when it is
waiting to send, so a paced QP's rate climbs even when no ACK arrives. Its window is one BDP of
the fabric when that is known: a go-back-N QP resends all it has in flight after one loss.
"""

from __future__ import annotations

from dataclasses import dataclass

from .base import CongestionControl

DEFAULT_LINE_RATE_BPS = 10e9  # no link rate known: above anything one QP pushes through this emulator
DEFAULT_WINDOW = 2 * 1024 * 1024  # bytes, when the fabric's BDP is unknown: large, so that the rate limits the QP
MIN_WINDOW_PACKETS = 2  # a BDP window is never below this many full packets


@dataclass
class DcqcnParams:
    """DCQCN RP parameters (the paper model's names; times in ns, rates in bit/s). None: derived
    from the line rate (R_AI = line/20, R_HAI = line/10 as uet-htsim; min rate = line/100).
    The increase timer and steps are HPCC's attribute defaults (FABRIC-CC.md §4), the rest
    uet-htsim's; `uet_htsim()` is uet-htsim's choice throughout."""

    line_rate_bps: float | None = None  # None: the link rate given to the profile, else DEFAULT_LINE_RATE_BPS
    g: float = 1 / 256  # α gain
    alpha_timer_ns: int = 55_000  # K: α decays once per K without a CNP
    increase_timer_ns: int = 1_500_000  # T: one increase event per T (HPCC's default; uet-htsim: 55 us)
    byte_counter: int = 10_000_000  # B: one increase event per B bytes sent
    fast_recovery_steps: int = 5  # F
    rate_ai_bps: float | None = 5e6  # R_AI (HPCC's default; uet-htsim: line/20)
    rate_hai_bps: float | None = 50e6  # R_HAI (HPCC's default; uet-htsim: line/10)
    min_rate_bps: float | None = None  # floor of the rate (a NIC's RPG_MIN_RATE; the paper model has none)
    window: int | None = None  # bytes in flight; None: one BDP (line rate x base RTT) if both are known, else DEFAULT_WINDOW

    @classmethod
    def uet_htsim(cls, **overrides) -> DcqcnParams:
        """The paper model's increase as uet-htsim's dcqcn.cpp runs it: T = 55 us, R_AI = line/20,
        R_HAI = line/10 (for a fabric whose RTT is a few microseconds)."""
        return cls(**{"increase_timer_ns": 55_000, "rate_ai_bps": None, "rate_hai_bps": None, **overrides})


def bdp_window(line_rate_bps: float | None, base_rtt_ns: int | None, mtu: int) -> int:
    """The QP's window: one BDP of the fabric (at least MIN_WINDOW_PACKETS packets), or
    DEFAULT_WINDOW when the line rate or the base RTT is unknown."""
    if line_rate_bps is None or base_rtt_ns is None:
        return DEFAULT_WINDOW
    return max(MIN_WINDOW_PACKETS * mtu, int(line_rate_bps * base_rtt_ns / 8e9))


class Dcqcn(CongestionControl):
    """Rate RC towards target RT (bit/s), α, the timer count T and byte count BC:

      CNP:             RT = RC; RC = RC (1 - α/2); α = (1 - g) α + g; T = BC = 0; timers restart
      every K, no CNP: α = (1 - g) α
      increase event (T++ every T_inc, BC++ every B bytes), F = fast_recovery_steps:
        max(T, BC) <= F:  fast recovery     RC = (RT + RC) / 2
        min(T, BC) >  F:  hyper increase    RT += (min(T, BC) - F) R_HAI; RC = (RT + RC) / 2
        otherwise:        additive increase RT += R_AI; RC = (RT + RC) / 2
      RC and RT never above the line rate, RC never below the minimum rate.
    Before the first CNP the QP sends at line rate with α = 1, and the timers are not running
    (a NIC's rate limiter starts with the first CNP).
    """

    name = "dcqcn"

    def __init__(self, params: DcqcnParams | None = None, mtu: int = 4096, link_rate_bps: float | None = None,
                 base_rtt_ns: int | None = None, **options) -> None:
        """`link_rate_bps`: the QP's line rate (None: unknown); `base_rtt_ns`: the fabric's
        unloaded RTT, for the window (one BDP); `options`: DcqcnParams fields."""
        p = params or DcqcnParams()
        for key, value in options.items():
            if not hasattr(p, key):
                raise TypeError(f"dcqcn has no parameter {key!r}")
            setattr(p, key, value)
        self.p = p
        self.mtu = mtu
        self.line_known = p.line_rate_bps is not None or link_rate_bps is not None
        self.line = float(p.line_rate_bps or link_rate_bps or DEFAULT_LINE_RATE_BPS)
        self.rate_ai = p.rate_ai_bps if p.rate_ai_bps is not None else self.line / 20
        self.rate_hai = p.rate_hai_bps if p.rate_hai_bps is not None else self.line / 10
        self.min_rate = p.min_rate_bps if p.min_rate_bps is not None else self.line / 100
        self.cwnd = float(p.window if p.window is not None else bdp_window(self.line if self.line_known else None,
                                                                            base_rtt_ns, mtu))
        self.rc = self.rt = self.line
        self.alpha = 1.0
        self.t_count = self.bc_count = 0
        self.bytes_counted = 0
        self.next_alpha_at: int | None = None  # None: no CNP yet, the timers are not running
        self.next_increase_at: int | None = None
        self.cnps = 0
        self.decreases = 0

    @property
    def pacing_rate_bps(self) -> float | None:
        """RC; None while a QP whose line rate nobody gave is at that (default) line rate."""
        if not self.line_known and self.rc >= self.line:
            return None
        return self.rc

    # ---- time ----------------------------------------------------------------------------

    def advance(self, now: int) -> None:
        """Run the α and increase timers, in time order, up to `now`."""
        if self.next_alpha_at is None:
            return
        p = self.p
        keep = 1 - p.g
        while True:
            if self.rc >= self.line and self.rt >= self.line:  # nothing left to climb: jump the timers
                if now >= self.next_alpha_at:
                    k = (now - self.next_alpha_at) // p.alpha_timer_ns + 1
                    self.alpha *= keep ** k
                    self.next_alpha_at += k * p.alpha_timer_ns
                if now >= self.next_increase_at:
                    k = (now - self.next_increase_at) // p.increase_timer_ns + 1
                    self.t_count += k
                    self.next_increase_at += k * p.increase_timer_ns
                return
            if self.next_alpha_at <= self.next_increase_at:
                if self.next_alpha_at > now:
                    return
                self.alpha *= keep
                self.next_alpha_at += p.alpha_timer_ns
            else:
                if self.next_increase_at > now:
                    return
                self.t_count += 1
                self._increase()
                self.next_increase_at += p.increase_timer_ns

    def next_timer(self) -> int | None:
        """When the rate next climbs (None: it is at the line rate, or no CNP came yet)."""
        if self.next_increase_at is None or (self.rc >= self.line and self.rt >= self.line):
            return None
        return self.next_increase_at

    def _increase(self) -> None:
        f = self.p.fast_recovery_steps
        t, bc = self.t_count, self.bc_count
        if max(t, bc) > f:
            if min(t, bc) > f:
                self.rt += (min(t, bc) - f) * self.rate_hai
            else:
                self.rt += self.rate_ai
            if self.rt > self.line:
                self.rt = self.line
        self.rc = (self.rt + self.rc) / 2
        if self.rc > self.line:
            self.rc = self.line

    # ---- events --------------------------------------------------------------------------

    def on_cnp(self, now: int) -> None:
        self.advance(now)
        p = self.p
        self.rt = self.rc
        self.rc = max(self.min_rate, self.rc * (1 - self.alpha / 2))
        self.alpha = (1 - p.g) * self.alpha + p.g
        self.t_count = self.bc_count = 0
        self.bytes_counted = 0
        self.next_alpha_at = now + p.alpha_timer_ns
        self.next_increase_at = now + p.increase_timer_ns
        self.cnps += 1
        self.decreases += 1

    def on_sent(self, now: int, ev: int, nbytes: int) -> None:
        if self.next_alpha_at is None:
            return
        self.advance(now)
        self.bytes_counted += nbytes
        while self.bytes_counted >= self.p.byte_counter:
            self.bytes_counted -= self.p.byte_counter
            self.bc_count += 1
            self._increase()

    def on_acked(self, now: int, ev: int, nbytes: int, rtt_ns: int | None, srtt_ns: float, ecn: bool) -> None:
        self.advance(now)  # DCQCN hears congestion from CNPs only

    def on_lost(self, now: int, ev: int, nbytes: int, srtt_ns: float, congestion: bool) -> None:
        self.advance(now)  # RoCE assumes a lossless fabric: a loss is recovery's, not the rate's

    def on_trimmed(self, now: int, ev: int, nbytes: int, srtt_ns: float, last_hop: bool = False) -> None:
        self.advance(now)

    def on_timeout(self, now: int, ev: int, nbytes: int, srtt_ns: float, congestion: bool) -> None:
        self.advance(now)
