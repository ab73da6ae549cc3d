"""NSCC, UEC 1.0 §3.6.13: MRC's congestion control (CC profile `nscc`, OCP's "uet-1.0-nscc").

Why it exists: MRC's window must follow the algorithm UEC specifies, with the parameters OCP's
`mrc_ctl_cc_nscc_cfg` names, so that an incast or congestion result here describes NSCC and no
other algorithm. The window reacts to the combination of ECN and queueing delay (the four-case
table: delay alone grows it fairly, ECN alone leaves it to the EV logic, both cut it), grows in
batches, cuts at most once per base RTT, and collapses to what was delivered (quick adapt) after
a trim. Where UEC's pseudo-code and UEC's own simulator (uet-htsim's uec.cpp) differ, it does what
the simulator does, so that a result here compares with the simulator's; docs/transport.md has
the equations and lists each such place, ../shared/ref/NSCC.md the facts behind them.

What it must never do: keep its own clock or RTT estimator (time and samples come with each
event; the requester has already taken the responder's service time out of the sample and
applied Karn's rule), or look at packets: it sees bytes per EV, as base.py's events give them.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from .base import CongestionControl

DEFAULT_MAX_CWND = 2 * 1024 * 1024  # no link rate known (unshaped fabric): the window the emulator never fills
DEFAULT_BASE_RTT_NS = 500_000  # no base RTT known: about one QP's srtt under load on this emulator (0.45 ms)
QA_THRESHOLD_OFF = 0xFFFF_FFFF  # "very large" (u32 ns): with trimming, only a trim arms quick adapt
REFERENCE_BDP = 150_000  # bytes: 100 Gb/s x 12 us, the operating point UEC's constants are written for
REFERENCE_DELAY_NS = 12_000
FAST_INCREASE_DELAY_NS = 1_000  # a delay under this counts as "about zero" (uet-htsim's choice)
DELAY_GAIN = 0.0125  # avg_delay: EWMA gain per MTU of acknowledged bytes (uet-htsim's gain per ACK)


@dataclass
class NsccParams:
    """The fields of OCP's `mrc_ctl_cc_nscc_cfg` (times in ns, sizes in bytes). A field left
    None is derived from the link rate, base RTT and MTU by `derive` (NSCC.md §1)."""

    disable_qa: bool = False
    adjust_bytes_threshold: int | None = None  # 8 MTU: fulfil the batched increase after this many bytes ...
    adjust_period_threshold: int | None = None  # ... or after this long (base_rtt); also eta's period
    base_rtt: int | None = None  # config_base_rtt: the fabric's longest unloaded RTT
    eta: float | None = None  # bytes added once per adjust period: 0.15 MTU a
    fi: float | None = None  # fair increase, bytes per window acknowledged: 5 MTU a
    fi_scale: float | None = None  # fast increase, bytes per byte acknowledged: 0.25 a
    gamma: float = 0.8  # multiplicative decrease gain
    max_md_jump: float = 0.5  # one cut keeps at least this fraction of the window
    max_cwnd: int | None = None  # MaxWnd = 1.5 BDP, also the initial window
    qa_gate: int = 3  # quick adapt only if less than max_wnd >> qa_gate was delivered in its period
    qa_threshold: int | None = None  # a delay above this arms quick adapt: 4 target (no trimming), else off
    target_delay: int | None = None  # target queueing delay: 0.75 base_rtt (trimming), 1.0 base_rtt (none)

    def derive(self, mtu: int, link_rate_bps: float | None = None, trimming: bool = True,
               scale_rate_bps: float | None = None) -> tuple[NsccParams, float]:
        """Every field given, with the BDP the scaling came from: BDP = `scale_rate_bps` (else the
        link rate) x base RTT, or, with no link rate, max_cwnd / 1.5 (max_cwnd then defaulting to
        DEFAULT_MAX_CWND). MaxWnd's default is 1.5 BDP at the link rate."""
        base_rtt = self.base_rtt if self.base_rtt is not None else DEFAULT_BASE_RTT_NS
        if link_rate_bps:
            bdp = (scale_rate_bps or link_rate_bps) / 8 * base_rtt / 1e9
            max_cwnd = self.max_cwnd if self.max_cwnd is not None else max_wnd_for(link_rate_bps, base_rtt)
        else:
            max_cwnd = self.max_cwnd if self.max_cwnd is not None else DEFAULT_MAX_CWND
            bdp = max_cwnd / 1.5
        scaling_a = bdp / REFERENCE_BDP
        target = self.target_delay if self.target_delay is not None else int((0.75 if trimming else 1.0) * base_rtt)
        given = {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}
        derived = {
            "adjust_bytes_threshold": 8 * mtu, "adjust_period_threshold": base_rtt, "base_rtt": base_rtt,
            "eta": 0.15 * mtu * scaling_a, "fi": 5 * mtu * scaling_a, "fi_scale": 0.25 * scaling_a,
            "max_cwnd": max_cwnd, "qa_threshold": QA_THRESHOLD_OFF if trimming else 4 * target, "target_delay": target,
        }
        return replace(self, **{**derived, **given}), bdp


def max_wnd_for(link_rate_bps: float, base_rtt_ns: int) -> int:
    """UEC's MaxWnd: 1.5 BDP of a link at this rate and base RTT, bytes."""
    return int(1.5 * link_rate_bps / 8 * base_rtt_ns / 1e9)


class Nscc(CongestionControl):
    """NSCC's per-CCC state (UEC Table 3-77) and its events. Per ACK of n bytes with ECN echo M
    and queueing delay d = rtt - base_rtt (OnACK):

    | M | d vs target | action                                            |
    |---|-------------|---------------------------------------------------|
    | 0 | <           | proportional increase (or fast increase near d=0) |
    | 0 | >=          | fair increase                                     |
    | 1 | <           | none (path imbalance: the EV logic's business)    |
    | 1 | >=          | multiplicative decrease (once per base RTT)       |

    Increases are batched into inc_bytes and applied by fulfill_adjustment; decreases at once.
    Quick adapt, armed by a trim (or a delay above qa_threshold), sets the window to what was
    delivered in the last base_rtt + target. A trim, loss or timeout also takes its bytes off.
    """

    name = "nscc"

    def __init__(self, params: NsccParams | None = None, mtu: int = 4096, link_rate_bps: float | None = None,
                 base_rtt_ns: int | None = None, *, trimming: bool = True, rccc: bool = False,
                 scale_rate_bps: float | None = None, base_rtt_floor_ns: int = 0, unseen_ns: int = 0,
                 **ocp) -> None:
        """`link_rate_bps`/`base_rtt_ns`: the slower end's link and config_base_rtt (None: unknown);
        `trimming`: whether the fabric trims (target and qa_threshold follow); `rccc`: receiver
        credit CC on, so a last-hop trim leaves the window alone; `scale_rate_bps`: the rate UEC's
        scaling factor a (and so alpha, fi, eta, fi_scale) is taken from, where it is not
        `link_rate_bps` (a multi-plane NIC: one plane's link, as uet-htsim's initNsccParams takes
        its link speed, while MaxWnd covers the NIC); `base_rtt_floor_ns`: no RTT sample takes
        base_rtt below this (a full packet's and its ACK's serialisation over the path, which no
        switch port skips; an emulated port's token bucket lets an idle path's first frame through
        unserialised, and a QP whose base_rtt fell to such an 8 us sample read every later delay
        360 us too long and cut deeper than its peers); `unseen_ns`: the serialisation every RTT
        sample lacks, added to each (a token-bucket port passes a frame through an idle hop at once,
        where a switch port takes its serialisation: a sample over a path with one busy port lacks
        every other hop's, so delay = sample - base_rtt read 275 us short of the queue on the
        `incast` fabric, and NSCC held the queue that much above its target); `ocp`: NsccParams
        fields."""
        params = replace(params or NsccParams(), **ocp)
        if base_rtt_ns is not None and params.base_rtt is None:
            params = replace(params, base_rtt=base_rtt_ns)
        self.p, bdp = params.derive(mtu, link_rate_bps, trimming, scale_rate_bps)
        self.mtu = mtu
        self.link_rate_bps = link_rate_bps
        self.rccc = rccc
        # with a link rate and no max_cwnd given, a new base RTT rescales max_wnd (UEC update_base_rtt);
        # a max_cwnd given explicitly, or no link rate, stays as it is (UEC leaves that case open)
        self._rescale = bool(link_rate_bps) and params.max_cwnd is None
        self.alpha = 4.0 * (bdp / REFERENCE_BDP) * mtu / REFERENCE_DELAY_NS  # 4 a b MTU / target, b = target / 12 us
        self.decreases = 0
        # Table 3-77
        self.cwnd = float(self.p.max_cwnd)
        self.max_wnd = float(self.p.max_cwnd)
        self.base_rtt = self.p.base_rtt
        self.base_rtt_floor = base_rtt_floor_ns
        self.unseen = unseen_ns
        self.inflight = 0
        self.saved_cwnd = 0.0
        self.achieved_bytes = self.received_bytes = self.fi_count = 0
        self.bytes_to_ignore = self.bytes_ignored = 0
        self.inc_bytes = 0.0
        self.trigger_qa = self.increase_mode = False
        self.qa_endtime = 0
        self.last_adjust_time: int | None = None  # "now" at creation: set by the first event
        self.last_dec_time: int | None = None
        self.avg_delay = 0.0

    def _begin(self, now: int) -> None:
        self.last_adjust_time = self.last_dec_time = now

    # ---- events --------------------------------------------------------------------------

    def on_sent(self, now: int, ev: int, nbytes: int) -> None:
        if self.last_adjust_time is None:
            self._begin(now)
        self.inflight += nbytes

    def on_acked(self, now: int, ev: int, nbytes: int, rtt_ns: int | None, srtt_ns: float, ecn: bool, *,
                 rcv_cwnd_pend: int = 0, restore_cwnd: bool = False) -> None:
        """OnACK (SPEC 3.6.13.5) for n = `nbytes`, M = `ecn`, delay = `rtt_ns` - base_rtt, or
        avg_delay when `rtt_ns` is None (no valid sample: uet-htsim's rule; UEC's stops there).
        `rcv_cwnd_pend` (0..127) and `restore_cwnd`: the destination's flow-control penalty
        (MRC's ACKs carry none; kept for UEC's rule and its test vector)."""
        if self.last_adjust_time is None:
            self._begin(now)
        n = nbytes
        # inflight never below zero here: an ACK of a packet already declared lost must not leave a debt
        self.inflight = self.inflight - n if self.inflight > n else 0
        self.bytes_ignored += n
        self.received_bytes += n
        self.achieved_bytes += n
        rcv_limit = (rcv_cwnd_pend or restore_cwnd) and self._apply_cwnd_penalty(n, rcv_cwnd_pend, restore_cwnd)
        if rtt_ns is None or rtt_ns <= 0:
            # no valid sample: UEC returns here; uet-htsim decides on the average instead (uec.cpp
            # processAck), so a marked ACK without a sample can still cut and an unmarked one grow
            delay = self.avg_delay
        else:
            rtt_ns += self.unseen  # the RTT a path of serialising ports would have given
            if (lower := max(rtt_ns, self.base_rtt_floor)) < self.base_rtt:
                self._update_base_rtt(lower)
            delay = max(0, rtt_ns - self.base_rtt)
            self._update_delay(delay, n)
        p = self.p
        # (quick adapt is called only where it can act: its ignore phase, or after its period)
        if (not p.disable_qa and ((ecn and self.bytes_ignored < self.bytes_to_ignore) or now > self.qa_endtime)
                and self._quick_adapt(now, False, ecn, delay)):
            return
        if not ecn:
            if not rcv_limit:
                if delay < p.target_delay:
                    self._proportional_increase(n, delay)
                else:
                    self.inc_bytes += p.fi * n  # fair increase
        elif delay >= p.target_delay:
            self._multiplicative_decrease(now)
        if now - self.last_adjust_time >= p.adjust_period_threshold or self.received_bytes > p.adjust_bytes_threshold:
            self._fulfill_adjustment(now)

    def on_trimmed(self, now: int, ev: int, nbytes: int, srtt_ns: float, last_hop: bool = False) -> None:
        """OnNACK with UET_TRIMMED, or UET_TRIMMED_LASTHOP (`last_hop`): with RCCC off a last-hop
        trim is a trim like any other; with it on, it moves nothing but the counters."""
        if self.last_adjust_time is None:
            self._begin(now)
        self.inflight = self.inflight - nbytes if self.inflight > nbytes else 0
        self._update_delay(self.p.base_rtt, self.mtu)  # config_base_rtt: a trim reads as a full queue
        self.bytes_ignored += nbytes
        if last_hop and self.rccc:
            return
        self.trigger_qa = True
        if not self._quick_adapt(now, True, True, 0):
            self._take_off(nbytes)

    def on_lost(self, now: int, ev: int, nbytes: int, srtt_ns: float, congestion: bool) -> None:
        """OnInferredLoss: the bytes leave the window. A loss that is one of a run on a failing
        EV (`congestion` False) is the EV states' business: counters only."""
        if self.last_adjust_time is None:
            self._begin(now)
        self.inflight = self.inflight - nbytes if self.inflight > nbytes else 0
        self.bytes_ignored += nbytes
        if congestion:
            self._take_off(nbytes)

    def on_timeout(self, now: int, ev: int, nbytes: int, srtt_ns: float, congestion: bool) -> None:
        """An ACK timeout (RTO) cuts as an inferred loss does."""
        self.on_lost(now, ev, nbytes, srtt_ns, congestion)

    # ---- UEC's functions (SPEC 3.6.13.6) ------------------------------------------------

    def _take_off(self, nbytes: int) -> None:
        self.cwnd = max(self.cwnd - nbytes, float(self.mtu))
        self.decreases += 1

    def _apply_cwnd_penalty(self, n: int, pend: int, restore: bool) -> bool:
        if pend > 0:
            if not self.saved_cwnd:
                self.saved_cwnd = self.cwnd
            self.cwnd = max(float(self.mtu), min(self.cwnd, self.inflight) - ((pend * n) >> 7))
            return True
        if restore and self.saved_cwnd > 0:
            self.cwnd, self.saved_cwnd = self.saved_cwnd, 0.0
        return False

    def _update_base_rtt(self, rtt: int) -> None:
        """A sample below base_rtt is the new base_rtt (the caller checked). max_wnd never falls
        under one packet: an idle shaped port passes a frame within its TBF bucket unserialized
        (RTT samples of 5-25 us on the incast fabric), and UEC's rescale would leave a window no
        packet fits in."""
        self.base_rtt = rtt
        if self._rescale:
            self.max_wnd = max(1.5 * self.link_rate_bps / 8 * rtt / 1e9, float(self.mtu))
            if self.cwnd > self.max_wnd:
                self.cwnd = self.max_wnd

    def _update_delay(self, delay: float, nbytes: int) -> None:
        packets = nbytes / self.mtu
        gain = DELAY_GAIN if packets <= 1 else 1 - (1 - DELAY_GAIN) ** packets
        self.avg_delay += gain * (delay - self.avg_delay)

    def _quick_adapt(self, now: int, is_loss: bool, ecn: bool, qdelay: float) -> bool:
        p = self.p
        if p.disable_qa:
            return False
        fired = False
        if self.bytes_ignored < self.bytes_to_ignore and ecn:
            fired = True  # the ignore phase: marks on what was in flight at the last quick adapt
        elif now > self.qa_endtime:  # uet-htsim's `>` (UEC's `>=`): an event at the period's end is in it
            if (self.qa_endtime != 0 and (self.trigger_qa or is_loss or qdelay > p.qa_threshold)
                    and self.achieved_bytes < self.max_wnd / (1 << p.qa_gate)):
                self.cwnd = float(max(self.achieved_bytes, self.mtu))
                self.bytes_to_ignore, self.bytes_ignored = self.inflight, 0
                self.trigger_qa = False
                self.decreases += 1
                fired = True
            self.achieved_bytes = 0
            self.qa_endtime = now + self.base_rtt + p.target_delay
        if fired:
            self.inc_bytes = 0.0
            self.received_bytes = 0
        return fired

    def _fast_increase(self, n: int, delay: float) -> None:
        if delay < FAST_INCREASE_DELAY_NS:
            self.fi_count += n
            if self.fi_count > self.cwnd or self.increase_mode:
                self.cwnd = min(self.cwnd + n * self.p.fi_scale, self.max_wnd)
                self.increase_mode = True
                return
        else:
            self.fi_count = 0
        self.increase_mode = False

    def _proportional_increase(self, n: int, delay: float) -> None:
        self._fast_increase(n, delay)
        if not self.increase_mode:
            self.inc_bytes += self.alpha * n * (self.p.target_delay - delay)

    def _multiplicative_decrease(self, now: int) -> None:
        """At most one cut per base_rtt, the current one (the smallest sample so far), as UEC and
        uet-htsim (uec.cpp multiplicative_decrease: now - last_dec_time > _base_rtt) both say."""
        self.increase_mode = False
        self.fi_count = 0
        avg, target = self.avg_delay, self.p.target_delay
        if avg > target and now - self.last_dec_time > self.base_rtt:
            factor = max(1 - self.p.gamma * (avg - target) / avg, self.p.max_md_jump)
            self.cwnd = max(float(self.mtu), self.cwnd * factor)
            self.last_dec_time = now
            self.decreases += 1

    def _fulfill_adjustment(self, now: int) -> None:
        self.cwnd += self.inc_bytes / self.cwnd
        if now - self.last_adjust_time >= self.p.adjust_period_threshold:
            self.cwnd += self.p.eta
            self.last_adjust_time = now
        if self.cwnd > self.max_wnd:
            self.cwnd = self.max_wnd
        self.inc_bytes = 0.0
        self.received_bytes = 0
