"""What the sender knows about one EV, and what it weighs in the spray schedule.

Why it exists: the EV profile (ev.py) keeps each EV's state and turns what its EVs observed into
a spray schedule; the rule that weighs an EV against the others is its own thing, tested alone
(tests/test_ev_profile.py): loss, trims, ECN marks and delay, each judged against the EVs it
can be compared with, and a fabric trim's penalty fading with time as well as with deliveries.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ...api.events import EvState
from .rtt import RttEstimator


@dataclass
class EvStats:
    """What the sender knows about one EV."""

    index: int
    state: EvState = EvState.GOOD
    rtt: RttEstimator = field(default_factory=RttEstimator, repr=False)  # the EV's one RTT estimator
    loss: float = 0.0  # EWMA of the per-packet loss outcome (1 lost, 0 delivered)
    ecn: float = 0.0  # EWMA of the ECN echo per acknowledged packet
    trim: float = 0.0  # EWMA of fabric trims (1 per trim, decaying per packet delivered)
    faded_ns: int = -1  # when `trim` last faded with time (fade)
    ce_marks: int = 0  # CE-marked packets the responder reported
    trims: int = 0  # TRIM NACKs heard (fabric and last hop)
    packets_sent: int = 0
    packets_delivered: int = 0
    packets_lost: int = 0
    retransmits_sent: int = 0
    consecutive_losses: int = 0  # lost packets sent after the latest-sent one it delivered (len(lost_after))
    last_delivered_sent_ns: int = -1  # send time of the latest-sent packet known delivered on this EV
    last_heard_ns: int = -1  # when an ACK last said a packet of this EV arrived (it is alive, if queued)
    alive_sent_ns: int = -1  # send time of the latest witness probe answered (transport/witness.py)
    lost_after: list[int] = field(default_factory=list, repr=False)  # their send times
    probe_due_ns: int = 0
    probes_sent: int = 0

    def forget_losses_before(self, sent_ns: int) -> None:
        """The path worked for a packet (or probe) sent at `sent_ns`: losses of packets sent before
        it are no longer a run."""
        if self.lost_after:
            self.lost_after = [t for t in self.lost_after if t > sent_ns]
            self.consecutive_losses = len(self.lost_after)

    @property
    def srtt_ns(self) -> float:
        """Smoothed RTT (0: no sample yet)."""
        return self.rtt.srtt_ns

    @property
    def rttvar_ns(self) -> float:
        return self.rtt.rttvar_ns

    @property
    def min_rtt_ns(self) -> int:
        return self.rtt.min_rtt_ns

    def to_dict(self) -> dict:
        return {
            "ev": self.index, "state": self.state.name, "srtt_us": round(self.srtt_ns / 1e3, 1),
            "rttvar_us": round(self.rttvar_ns / 1e3, 1),
            "min_rtt_us": round(self.min_rtt_ns / 1e3, 1), "loss": round(self.loss, 4),
            "packets_sent": self.packets_sent, "packets_delivered": self.packets_delivered,
            "packets_lost": self.packets_lost, "retransmits_sent": self.retransmits_sent,
            "probes_sent": self.probes_sent, "ecn": round(self.ecn, 4), "ce_marks": self.ce_marks,
            "trims": self.trims,
        }


LOSS_GAIN = 1 / 32
ECN_GAIN = 1 / 16
TRIM_GAIN = 1 / 8  # one trim cuts the EV's weight to 1/(1 + 20/8), 0.29, at once
SCHEDULE_SLOTS_PER_EV = 8
DELAY_GAIN = 12.0  # each best-EV RTT of delay beyond the threshold divides an EV's weight by 1 + this
# this many of the best EV's RTTs over every plane's best cost weight too: no queue a plane's EVs share
# at the receiver (at most its trim threshold) comes near it; a slow EV among slow siblings does
CROSS_PLANE_RTTS = 2.0
# a plane whose best EV's smoothed RTT is r times the best plane's has its EVs' weights divided by
# 1 + this x (r - 1): the queues each plane's EVs share (the receiver's port on it, in an incast)
# are drawn together, gently. Without it nothing balanced the planes under two RTTs apart, and a
# 16-to-1 incast's two last hops random-walked apart (medians 28/42 KB in one run of three, their
# sum steady at 70 KB); at 1 the shift overshot where every link is full (pairs-nofault in virtual
# time: CE marks and trims where there were none, goodput 1.34 Gbit/s against 1.52)
PLANE_BALANCE_GAIN = 0.5
# the schedule is rebuilt this many of the EVs' smallest RTTs after it was last, even if no cycle
# of it ended: a QP sending a packet or two per RTT (one of 16 in an incast) ends a cycle of its
# 32 slots every few dozen RTTs, and its weights would stand still that long
REWEIGH_RTTS = 4
# a fabric trim's penalty halves every this many of the EV's smallest RTTs with no new sample: an
# EV that lost its share for one sends little and learns little, and kept it for tens of ms (a
# spine trim in the first round trip of a 16-to-1 incast held one plane's EVs of a QP at a third
# of their share; MRC's SKIP state, which a trim puts an EV into, is a while too, not for ever)
FADE_RTTS = 8


def fade(stats: EvStats, now: int) -> None:
    """Let an EV's fabric-trim EWMA fade with the time since it last did (FADE_RTTS). Not its ECN
    EWMA: a degraded link's port marks what little the EV still sends, and an ECN penalty that
    faded gave `gray-failure`'s degraded EV 0.107-0.111 of the packets, not 0.094-0.099."""
    base = stats.rtt.min_rtt_ns
    if stats.faded_ns >= 0 and base and now > stats.faded_ns and stats.trim:
        stats.trim *= 0.5 ** ((now - stats.faded_ns) / (FADE_RTTS * base))
    stats.faded_ns = max(stats.faded_ns, now)


def weight(stats: EvStats, best_srtt: float, least_ecn: float = 0.0, best_any: float = 0.0,
           delay_threshold_rtts: float = 0.5) -> float:
    """Spray weight: 1 for a clean EV, less with loss, trims, or ECN marks or delay above its
    plane's best EV's (`least_ecn`, `best_srtt`), or delay CROSS_PLANE_RTTS above `best_any`'s.

    Delay counts in the best EV's RTTs beyond `delay_threshold_rtts` (queues of a fraction of
    an RTT come and go on every path): an EV many RTTs slower (a degraded link, a long queue)
    gets 1 / (1 + DELAY_GAIN x those RTTs) of a clean one's share while it stays slow. In RTTs,
    not a fixed time, so it means the same at any RTT and under any time dilation."""
    srtt = stats.rtt.srtt_ns
    excess = max(0.0, srtt / best_srtt - 1.0 - delay_threshold_rtts) if srtt and best_srtt else 0.0
    if srtt and best_any:
        excess = max(excess, srtt / best_any - 1.0 - CROSS_PLANE_RTTS)
    ecn = max(0.0, stats.ecn - least_ecn)
    return 1.0 / ((1.0 + 20.0 * (stats.loss + stats.trim)) * (1.0 + 4.0 * ecn) * (1.0 + DELAY_GAIN * excess))


def spray_weights(evs: Mapping[int, EvStats], good: Sequence[int], planes: Mapping[int, int | None],
                  delay_threshold_rtts: float, now: int) -> list[float]:
    """The weights of the `good` EVs, in order, their trim penalties faded to `now`.

    Each EV's delay and ECN marks are judged against the best of its own plane (all where planes
    are unknown): a slow or hot link on one EV's way moves its share to its siblings. A queue all
    EVs of a plane share (the receiver's port, in an incast) moves only a little of the plane's
    share, by its best EV's delay against the best plane's (PLANE_BALANCE_GAIN), never by its
    marks: the plane that marked more lost its share and, sending little, kept its marks
    (docs/transport.md, Spraying)."""
    best: dict[int | None, float] = {}
    least: dict[int | None, float] = {}
    for k in good:
        stats, plane = evs[k], planes.get(k)
        fade(stats, now)
        srtt = stats.rtt.srtt_ns
        if srtt and (plane not in best or srtt < best[plane]):
            best[plane] = srtt
        least[plane] = min(least.get(plane, 1.0), stats.ecn)
    best_any = min(best.values(), default=0.0)
    balance = {plane: 1.0 + PLANE_BALANCE_GAIN * (srtt / best_any - 1.0)
               for plane, srtt in best.items()} if len(best) > 1 and None not in best else {}
    return [weight(evs[k], best.get(planes.get(k), 0.0), least[planes.get(k)], best_any, delay_threshold_rtts)
            / balance.get(planes.get(k), 1.0) for k in good]
