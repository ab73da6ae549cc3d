"""MRC's loss rules: a packet is lost when packets sent sufficiently later arrived, on any EV.

Why it exists: a QP sprays over paths whose RTTs differ (a plane's queue, a degraded link, a
spine further away) and each path may reorder a little (a kernel's per-CPU backlog, a switch's
priority class), so neither "a later packet on the same path arrived" nor one QP-wide timer
says whether a packet is lost. These rules are RACK (RFC 8985) per path and across paths, each
threshold taken from the EVs' own RTT estimators:

- **later acknowledged** (on every ACK): packet P on EV e is lost once a delivered packet sent
  on the same EV more than e's reorder window after P arrived: a path that delivered a packet
  sent that much later did not merely reorder P. The window is a quarter of e's smallest RTT or
  twice its variation, whichever is more. It reads send times only, not the time now: an ACK the
  emulator read late does not make P look later. Only the same EV: across EVs the queues differ
  and change faster than an RTT estimate follows.
- **in time** (a timer, across EVs): P, sent before the newest delivered packet on any EV, is
  lost once its own EV's srtt and four of its RTT variations (TCP's RTO; at least its window)
  and the responder's ACK delay passed since it left, or since its EV last delivered anything,
  whichever is later: an EV that keeps delivering is draining a queue that grew faster than its
  RTT estimate (an incast's start, a burst of the QP's own), and its later packets judge P by
  rule 1; an EV that went quiet while others deliver (dead, blackholed) is judged by its own
  RTT, so a slow EV is not taken for a dead one.
- **tail** (a timer): a packet sent after the newest delivered one is judged by neither rule
  above, so the newest packet in flight (the QP's last, or the last of a window that went
  quiet) is lost once two of the QP's largest RTTs and the responder's ACK delay passed since
  it left: a tail loss probe's timeout. Its resend, on another EV, is the probe: once
  acknowledged it is the newest delivered packet, and rule 1 judges everything sent before it.
  Only that one packet: a queue that grows faster than the RTT estimate (a shaped link filling)
  then costs at most one spurious resend per timeout, not a window's worth.

The ACK timeout stays the last resort (recovery.py). Timers are judged at the time up to which
the emulation has seen everything (`Recovery.decide_at`), and what that puts off is re-examined
as soon as it passes.

What it must never do: read a clock or change an EV's state itself (losses go to
`Recovery.lose`, which tells the EV profile, whose own rule marks a failing path), or judge a
packet by another EV's send times (their queues are not its queue).
"""

from __future__ import annotations

from typing import Protocol

from .config import QpConfig
from .multipath.ev import EvProfile, EvStats
from .sent import PyPkt, SentPackets


class Recovery(Protocol):
    """What the rules read and call of a QP's recovery (recovery.Recovery)."""

    config: QpConfig
    profile: EvProfile
    sent: SentPackets
    rack_sent_ns: int  # the latest send time of any packet known delivered

    def decide_at(self, now: int) -> int: ...
    def put_off(self, deadline: int, now: int) -> None: ...
    def lose(self, pkt: PyPkt, now: int, why: str) -> None: ...
    def largest_srtt(self) -> float: ...

LATER_ACKED = "packets sent after it on its EV were acknowledged"
NOT_IN_TIME = "not acknowledged within its EV's RTT while later packets were"
TAIL = "nothing sent after it was acknowledged (tail)"
REORDER_RTT_FRACTION = 4  # the reorder window: a quarter of the EV's smallest RTT (RACK's reo_wnd) ...
REORDER_RTTVAR = 2  # ... or twice its RTT variation, whichever is larger
NO_SAMPLE_FACTOR = 2  # an EV without an RTT sample is taken as this many times the largest one known
TAIL_RTTS = 2  # the tail timer: this many of the QP's largest RTTs, and the responder's ACK delay
TIMER_RTTVAR = 4  # rule 2: an EV's srtt and this many of its RTT variations (TCP's RTO), or its window


def window(stats: EvStats, floor_ns: int) -> int:
    """How far an EV may reorder its own packets: its reorder window (ns)."""
    rtt = stats.rtt
    return max(floor_ns, rtt.min_rtt_ns // REORDER_RTT_FRACTION, int(REORDER_RTTVAR * rtt.rttvar_ns))


def expected_rtt(rec: Recovery, ev: int) -> float | None:
    """The RTT a packet on `ev` is expected to take: its srtt, or, before its first sample, a
    multiple of the largest srtt the QP knows (None: no EV has a sample yet)."""
    srtt = rec.profile.evs[ev].rtt.srtt_ns
    if srtt:
        return srtt
    largest = rec.largest_srtt()
    return NO_SAMPLE_FACTOR * largest if largest else None


def later_acked(rec: Recovery, now: int) -> None:
    """Rule 1, on every ACK: each EV's oldest packets that a packet sent on the same EV more than
    its reorder window later passed. Only the same EV: across EVs the queues differ and change
    faster than any RTT estimate follows (an incast's ports fill in a few packets' time), and
    judging one EV's packets by another's deliveries declared hundreds of queued packets lost
    (pairs-nofault: 3,636 spurious resends of 11,941 packets, 344 false EV events); across EVs
    the timer (rule 2) judges, by each EV's own RTT and variation."""
    sent = rec.sent
    floor = rec.config.reorder_floor_ns
    for ev, stats in rec.profile.evs.items():
        delivered = stats.last_delivered_sent_ns
        if delivered < 0 or ev not in sent.by_ev:
            continue
        limit = window(stats, floor)
        while (pkt := sent.front(ev)) is not None and delivered - pkt.sent_ns > limit:
            sent.by_ev[ev].popleft()
            rec.lose(pkt, now, LATER_ACKED)


def deadline(rec: Recovery, ev: int, pkt: PyPkt) -> int | None:
    """When `pkt`, on `ev` and not yet acknowledged, is taken as lost by a timer rule (None: no
    rule applies, or no RTT is known yet; the ACK timeout alone then)."""
    mine = expected_rtt(rec, ev)
    if mine is None:
        return None
    if pkt.sent_ns < rec.rack_sent_ns:  # something sent after it arrived, on some EV: its EV's timer
        stats = rec.profile.evs[ev]
        # from when it left, or when its EV last delivered anything, whichever is later: an EV that
        # keeps delivering is draining a queue, and its later packets judge this one (rule 1)
        start = max(pkt.sent_ns, stats.last_heard_ns)
        # and the responder's ACK delay: arrived after the ACK that carried the later packet, it
        # waits for the next one, which may be held that long
        slack = max(TIMER_RTTVAR * stats.rtt.rttvar_ns, window(stats, rec.config.reorder_floor_ns))
        return start + int(mine + slack) + rec.config.ack_delay_ns
    if pkt.psn != newest(rec.sent) or rec.sent.retx:
        return None  # not the tail (the probe's acknowledgement judges it by rule 1), or a probe waits to go
    return pkt.sent_ns + int(TAIL_RTTS * max(mine, rec.largest_srtt())) + rec.config.ack_delay_ns


def newest(sent: SentPackets) -> int | None:
    """The PSN of the packet in flight sent last (`flight` is in order of the latest sends)."""
    return next(reversed(sent.flight), None)


def timer_losses(rec: Recovery, now: int) -> None:
    """Rules 2 and 3: each EV's oldest packets whose deadline passed, as far as the emulation has
    seen (`decide_at`); a deadline not yet reached there is put off and looked at again."""
    sent = rec.sent
    known = rec.decide_at(now)
    for ev in sent.by_ev:
        while (pkt := sent.front(ev)) is not None:
            due = deadline(rec, ev, pkt)
            if due is None:
                break
            if known < due:
                rec.put_off(due, now)
                break
            sent.by_ev[ev].popleft()
            rec.lose(pkt, now, NOT_IN_TIME if pkt.sent_ns < rec.rack_sent_ns else TAIL)
    tail = newest(sent)
    if tail is not None:  # the newest packet is not always an EV's oldest: its own tail timer
        pkt = sent.pkts[tail]
        due = deadline(rec, pkt.ev, pkt)
        if due is not None and known >= due:
            rec.lose(pkt, now, TAIL)  # its stale by_ev entry is skipped by front() later
        elif due is not None:
            rec.put_off(due, now)


def next_deadline(rec: Recovery) -> int | None:
    """When a timer rule would next declare a packet lost, if nothing arrives meanwhile."""
    deadlines = []
    for ev in rec.sent.by_ev:
        pkt = rec.sent.front(ev)
        if pkt is not None and (due := deadline(rec, ev, pkt)) is not None:
            deadlines.append(due)
    tail = newest(rec.sent)
    if tail is not None and (due := deadline(rec, rec.sent.pkts[tail].ev, rec.sent.pkts[tail])) is not None:
        deadlines.append(due)
    return min(deadlines) if deadlines else None
