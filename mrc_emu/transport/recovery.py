"""Loss recovery of a requester: the sent-packet table, delivery from ACKs, loss rules, timers.

Why it exists: which packets are out, which arrived and which are lost is the heart of a
reliable transport, and it must be testable alone, with synthetic packets and hand-made
ACKs (tests/test_recovery.py). `SentPackets` is the table of packets sent and not known
delivered (the C send loop records into the same object). `Recovery` reads ACKs into it
(cumulative PSN and SACK bitmap), applies the loss rules (loss.py: RACK across EVs), runs the
ACK timeout and the retry budget, and tells the EV profile and the congestion control what it
learned. How lost packets are found and resent is a policy: `Selective` (MRC) or `GoBackN`
(RoCEv2 RC).
No clock and no sockets: time comes in as `now` (ns), frames go out through the requester.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from ..wire.format import AckPacket, Syndrome, TrimNackPacket
from . import loss
from .cc.base import CongestionControl
from .config import PSN_MOD, QpConfig, RecoveryMode, psn_abs
from .ledger import Ledger
from .multipath.ev import EvProfile
from .sent import PyPkt, SentPackets

ACK_TIMEOUT = "ACK timeout"  # the last resort: no loss rule found it
SEQUENCE_NAK = "PSN sequence NAK"  # go-back-N: the responder saw a gap
# An RTT sample (less the responder's service time) shorter than this is no sample: the service
# time's rounding (1/1024) outweighs so short an RTT. Taken as 1 us, it pulled the CC's base RTT down.
MIN_RTT_SAMPLE_NS = 1_000


def rtt_sample(heard: int, sent_ns: int, left_ns: int) -> int | None:
    """The RTT of a packet whose send began at `left_ns` and was done at `sent_ns` (one system call
    sends a batch, and the kernel forwards each frame inside it), acknowledged at `heard`: taken
    from `left_ns`, so it is never short (a sample under the truth would pull NSCC's base RTT,
    a minimum, down for good: from the end of a 16-frame sendmmsg it read 3 us for a 1 ms path),
    and only while the send's own span is at most half of it (the sample is then within 2x the
    truth; a span that long is the emulator's, not the network's). None: no sample."""
    rtt = heard - left_ns
    if rtt < MIN_RTT_SAMPLE_NS or 2 * (sent_ns - left_ns) > rtt:
        return None
    return rtt


class Recovery:
    """What a requester knows of its packets' fate, and what it does about the lost ones."""

    def __init__(self, config: QpConfig, profile: EvProfile, cc: CongestionControl, start_psn: int = 0) -> None:
        self.config = config
        self.profile = profile
        self.cc = cc
        self.sent = SentPackets(profile.indexes)
        self.policy: RecoveryPolicy = GoBackN() if config.recovery is RecoveryMode.GO_BACK_N else Selective()
        self.una = start_psn  # lowest PSN not known delivered (the responder's expected PSN)
        self.next_psn = start_psn  # the next new PSN (the sender advances it)
        self.sacked = 0  # bit (W-1-i) <=> PSN una+i known delivered
        self.rack_sent_ns = -1  # latest send time of any packet known delivered (RACK's reference)
        self.bytes_acked = 0
        self.timeouts = 0
        self.lost_by: dict[str, int] = {}  # packets declared lost, by the rule that found them (ACK_TIMEOUT too)
        self.duplicates_acked = 0
        self.trims = 0  # TRIM NACKs for known packets
        self.trims_resent = 0  # ... whose packet left flight to be resent at once
        self.ledger = Ledger()  # progress gaps and loss repairs, for the fault figures
        self._window_mask = (1 << config.window) - 1
        # The driver's horizon: the time up to which every datagram that reached the sockets of
        # the emulation has been read (None: the driver's `now` is the horizon, as in virtual
        # time). Time-driven loss decisions are taken at min(now, horizon), so a timer never
        # fires on a packet whose ACK still waits, unread, behind a starved emulator process.
        self.horizon: int | None = None
        self.deferred = 0  # timer decisions put off because the emulation had not seen that far
        self.witness = None  # the requester's witness probes (witness.py), which decide path failures
        self._last_deferred = -1

    def decide_at(self, now: int) -> int:
        """The time up to which the network's effects are known: what timers are judged at."""
        horizon = self.horizon
        return now if horizon is None or horizon >= now else horizon

    def put_off(self, deadline: int, now: int) -> None:
        """A timer not yet due at the horizon: count it once if it was due at `now` already."""
        if deadline <= now and deadline != self._last_deferred:
            self.deferred += 1
            self._last_deferred = deadline

    # ---- ACKs ----------------------------------------------------------------------------

    def cumulative(self, ack: AckPacket) -> int:
        """The PSN every PSN up to which has arrived: an ACK's own, one before a PSN sequence
        NAK's (the NAK names the PSN the responder expects, IBA's and rdma_rxe's meaning)."""
        cum = psn_abs(ack.psn, self.una)
        return cum - 1 if ack.syndrome == Syndrome.NAK_PSN_SEQUENCE else cum

    def in_range(self, ack: AckPacket) -> bool:
        """Whether the ACK's cumulative PSN is one this QP could be acknowledged up to."""
        cum = self.cumulative(ack)
        return self.una - self.config.window - 1 <= cum < self.next_psn

    def on_ack(self, ack: AckPacket, now: int) -> None:
        """An ACK (or non-fatal NAK) that is `in_range`: deliver, sample RTTs, find losses."""
        W = self.config.window
        una = self.una
        cum = self.cumulative(ack)  # every PSN up to this one has arrived
        if ack.syndrome == Syndrome.NAK_PSN_SEQUENCE and self.policy.on_sequence_nak(self, cum, now):
            return
        sent = self.sent
        evs = self.profile.evs
        # an RTT sample from the echoed packet, if it was sent once on that EV (Karn), without
        # the time the responder held it (its service time: the endpoint's, not the network's)
        rtt = sampled = echo_sent = None
        heard = now - ack.service_ns
        echo = sent.pkts.get(psn_abs(ack.echo_psn, una))
        if echo is not None and echo.tx == 1 and echo.ev == ack.echo_ev and (
                rtt := rtt_sample(heard, echo.sent_ns, echo.left_ns)) is not None:
            echo_sent = echo.sent_ns
            sampled = echo.ev
            self.profile.on_rtt(echo.ev, rtt, now)  # ECN comes from the ACK's CE counts, per packet
        ce = {ev: count for ev, count in ack.ce_counts if ev in evs} if ack.ce_counts else None
        seen: dict[int, list[int]] = {}
        acked = 0
        if cum >= una:
            acked += sent.deliver(range(una, cum + 1), seen)
            shift = cum + 1 - una
            self.sacked = (self.sacked << shift) & self._window_mask if shift < W else 0
            una = self.una = cum + 1
            self.policy.on_progress()
        if ack.sack_bitmap:
            acked += sent.deliver(self._newly_sacked(ack, una), seen)
        self.bytes_acked += acked
        if acked == 0:
            self.duplicates_acked += 1
        else:
            self.ledger.progressed(now)
            self.ledger.delivered(sent.pkts, now)
        self._credit(seen, now, sampled, rtt, ce, echo_sent, heard)
        if self.witness is not None and (seen or self.witness.out):
            self.witness.on_delivered(seen, now, ack.echo_ev, psn_abs(ack.echo_psn, una))
        self.policy.detect_losses(self, now, seen)

    def on_trimmed(self, nack: TrimNackPacket, now: int) -> bool:
        """A TRIM NACK: a switch trimmed `nack.psn` on `nack.ev`. Its EV and the CC hear it; when
        that transmission is the one in flight, the packet leaves flight and is queued first to be
        resent (the pump picks another EV), as soon as the window has room: UEC takes the trimmed
        bytes out of inflight and the CC cuts the window by as much (or quick-adapts), so the
        resend waits for the ACKs the window waits for. Sent past the window, as it first was, the
        resends of a queue held at the trim threshold kept it there (1,606 trims of 5,709 packets
        in a 4-to-1 incast with ECN on; 110 with the window kept). A trim is a full queue, not a failing path: it never
        counts as a loss (no ASSUMED_BAD). False: no such packet is waiting to be acknowledged."""
        psn = psn_abs(nack.psn, self.una)
        pkt = self.sent.pkts.get(psn)
        if pkt is None:
            return False
        stats = self.profile.evs[nack.ev]
        self.trims += 1
        self.profile.on_trimmed(nack.ev, nack.last_hop, nack.ecn_ce)
        self.cc.on_trimmed(now, nack.ev, pkt.length, stats.rtt.srtt_ns, last_hop=nack.last_hop)
        if pkt.ev == nack.ev and psn in self.sent.flight:
            self.sent.out_of_flight(pkt)
            self.sent.retx.appendleft(psn)
            self.trims_resent += 1
            # the RTT its repair is held against: the trimmed EV's srtt (its queue included), else
            # the longest one the QP knows; 0 before any sample (a trim in the incast's first RTT)
            rtt = stats.rtt.srtt_ns or max((e.rtt.srtt_ns for e in self.profile.evs.values()), default=0.0)
            self.ledger.trimmed(psn, pkt.sent_ns, rtt, now)
        return True

    def _newly_sacked(self, ack: AckPacket, una: int) -> list[int]:
        """PSNs the ACK's bitmap marks that were not known delivered; the bitmap joins `sacked`.

        The bitmap starts at the ACK's SACK base, which may lie below `una` (an older ACK
        overtaken by a newer one: a negative shift drops the bits below una) or above it."""
        W = self.config.window
        base = psn_abs(ack.sack_base, una)
        nbits = 8 * len(ack.sack_bitmap)
        bits = int.from_bytes(ack.sack_bitmap, "big") << (W - nbits) if nbits <= W else 0
        shift = base - una
        if 0 <= shift < W:
            bits >>= shift
        elif -W < shift < 0:
            bits = (bits << -shift) & self._window_mask
        else:
            bits = 0
        new = bits & ~self.sacked
        self.sacked |= bits
        psns = []
        top_psn = una + W - 1
        while new:
            top = new.bit_length() - 1
            new ^= 1 << top
            psns.append(top_psn - top)
        return psns

    def ack_cumulative(self, cum: int, now: int) -> None:
        """Everything up to `cum` arrived (a NAK's cumulative part): no RTT sample, no SACK."""
        if cum >= self.una:
            seen: dict[int, list[int]] = {}
            acked = self.sent.deliver(range(self.una, cum + 1), seen)
            self.bytes_acked += acked
            if acked:
                self.ledger.progressed(now)
                self.ledger.delivered(self.sent.pkts, now)
            self.una = cum + 1
            self.policy.on_progress()
            self._credit(seen, now, None, None, None)

    def _credit(self, seen: dict[int, list[int]], now: int, sampled: int | None, rtt: int | None,
                ce: dict[int, int] | None, echo_sent: int | None = None, heard: int = 0) -> None:
        """Tell the EV profile and the CC what each EV delivered, and how many CE marks (`ce`: EV
        -> CE-marked packets the responder counted since its last ACK) it saw.

        The echoed EV has its exact sample (`rtt`): the ACK's arrival less the responder's service
        time of the echoed packet (`heard`) less its send time, so an endpoint slow to read or
        answer (in the emulator: its own lag) is not taken for a queue in the fabric.
        One echo per ACK alone left EVs without any sample (the ACK every 32nd packet echoes the
        same one or two EVs of an 8-EV schedule), so every other EV that delivered gets a sample
        from its newest packet in this ACK (Karn: not from a retransmission), `heard` less its
        send time. That is exact only if it arrived when the echoed one did; it arrived up to
        (echo sent - its sent) earlier, so it is taken only from a packet sent at most one echoed
        RTT before the echoed packet: at most twice the truth. A QP whose bursts are far apart
        (a slow QP among many) thus samples the EVs at the end of each burst, not the old ones."""
        profile, cc = self.profile, self.cc
        evs = profile.evs
        for ev, (count, latest_sent, latest_tx, nbytes, latest_left) in seen.items():
            profile.on_delivered(ev, latest_sent, count)
            evs[ev].last_heard_ns = now
            marked = ce.get(ev, 0) if ce else 0
            if marked or evs[ev].ecn:
                profile.on_ecn(ev, marked, count)
            if latest_sent > self.rack_sent_ns:
                self.rack_sent_ns = latest_sent
            sample = None
            if ev == sampled:
                sample = rtt
            elif (echo_sent is not None and latest_tx == 1 and echo_sent - latest_sent <= rtt
                  and (sample := rtt_sample(heard, latest_sent, latest_left)) is not None):
                profile.on_rtt(ev, sample, now)
            cc.on_acked(now, ev, nbytes, sample, evs[ev].rtt.srtt_ns, marked > 0)
        # an echo (sample) or CE marks on an EV that delivered nothing new
        for ev in ({sampled} | (ce.keys() if ce else set())) - seen.keys() - {None}:
            marked = ce.get(ev, 0) if ce else 0
            if marked:
                profile.on_ecn(ev, marked, marked)
            cc.on_acked(now, ev, 0, rtt if ev == sampled else None, evs[ev].rtt.srtt_ns, marked > 0)

    # ---- losses --------------------------------------------------------------------------

    def lose(self, pkt: PyPkt, now: int, why: str, path_failed: bool = False) -> None:
        """`pkt` is lost: out of flight, queued to resend, counted against its EV and told to the CC
        (not as congestion when its path failed). With witness probes, a run of losses on an EV
        asks for one (witness.py), which decides whether the path failed; the ACK timeout still
        fails it alone."""
        self.ledger.lost(pkt, now)
        self.lost_by[why] = self.lost_by.get(why, 0) + 1
        self.sent.out_of_flight(pkt)
        self.sent.retx.append(pkt.psn)
        stats = self.profile.evs[pkt.ev]
        run = 0
        if self.config.path_avoidance:
            decide = self.witness is None or why is ACK_TIMEOUT
            run = self.profile.on_lost(pkt.ev, now, why, pkt.sent_ns, decide)
            if not decide and run >= self.profile.bad_after_losses:
                self.witness.suspect(pkt.ev)
        else:
            stats.packets_lost += 1
        # An isolated loss, or one on a path that keeps delivering, is congestion: the window shrinks.
        # A run of losses on one EV is a failing path: the EV's state handles it, not the window.
        congestion = run <= 1 and not path_failed
        if why is ACK_TIMEOUT:
            self.cc.on_timeout(now, pkt.ev, pkt.length, stats.rtt.srtt_ns, congestion)
        else:
            self.cc.on_lost(now, pkt.ev, pkt.length, stats.rtt.srtt_ns, congestion)

    def largest_srtt(self) -> float:
        """The largest srtt of the QP's EVs (0: no sample yet)."""
        return max((stats.rtt.srtt_ns for stats in self.profile.evs.values()), default=0.0)

    # ---- the ACK timeout -----------------------------------------------------------------

    def on_timer(self, now: int) -> str | None:
        """Run what is due at `now`: ACK timeouts, then the loss rules' timers once one is due.
        Returns the QP's error when a packet's retry budget is spent. Timers are judged at
        `decide_at(now)`; what that puts off is counted in `deferred` and looked at again on the
        next call (the requester asks to be woken for it)."""
        sent = self.sent
        known = self.decide_at(now)
        while (pkt := sent.oldest()) is not None:
            tries = self.policy.tries(pkt)
            deadline = pkt.sent_ns + self.config.ack_timeout_for(tries)
            if known < deadline:
                self.put_off(deadline, now)
                break
            self.timeouts += 1
            if self.config.retry_budget_spent(tries):
                evs = sorted({p.ev for p in sent.pkts.values()})
                return (f"retry budget spent: PSN {pkt.psn & (PSN_MOD - 1)} went unacknowledged after {tries} "
                        f"transmissions ({self.config.retry_linear} linear + {self.config.retry_exp} exponential "
                        f"retries, ACK timeout {self.config.ack_timeout_ns / 1e6:.1f} ms); "
                        f"EVs tried: {evs}. Every path to the responder seems dead.")
            self.policy.on_ack_timeout(self, pkt, now)
        if sent.flight and (due := self.policy.loss_deadline(self)) is not None:
            if known >= due:
                self.policy.detect_losses(self, now, None)
            else:
                self.put_off(due, now)
        return None

    def next_deadline(self) -> int | None:
        """When `on_timer` next has something to do, if nothing arrives meanwhile."""
        pkt = self.sent.oldest()
        if pkt is None:
            return None
        deadline = pkt.sent_ns + self.config.ack_timeout_for(self.policy.tries(pkt))
        loss_due = self.policy.loss_deadline(self)
        return deadline if loss_due is None else min(deadline, loss_due)


class RecoveryPolicy(Protocol):
    """How lost packets are found and resent: what `Recovery` asks of `Selective` and `GoBackN`."""

    mode: RecoveryMode

    def on_sequence_nak(self, recovery: Recovery, cum: int, now: int) -> bool: ...  # True: handled
    def detect_losses(self, recovery: Recovery, now: int, touched: Iterable[int] | None) -> None: ...
    def loss_deadline(self, recovery: Recovery) -> int | None: ...
    def tries(self, pkt: PyPkt) -> int: ...  # transmissions that count against the retry budget
    def on_ack_timeout(self, recovery: Recovery, pkt: PyPkt, now: int) -> None: ...
    def on_progress(self) -> None: ...  # the cumulative PSN advanced


class Selective:
    """MRC's recovery: each lost packet found by the loss rules (loss.py: later packets on any EV
    acknowledged, its EV's RTT passed, the tail) or, last, its own ACK timeout, and resent alone
    (on another EV); its retry budget counts its own transmissions."""

    mode = RecoveryMode.SACK

    def on_sequence_nak(self, recovery: Recovery, cum: int, now: int) -> bool:
        return False  # a sequence NAK (a PSN beyond the window) is read as any ACK: its SACK tells

    def detect_losses(self, recovery: Recovery, now: int, touched: Iterable[int] | None) -> None:
        loss.later_acked(recovery, now)  # every EV: the reference moved for all of them
        if recovery.sent.flight:
            loss.timer_losses(recovery, now)

    def loss_deadline(self, recovery: Recovery) -> int | None:
        return loss.next_deadline(recovery)

    def tries(self, pkt: PyPkt) -> int:
        return pkt.tx

    def on_ack_timeout(self, recovery: Recovery, pkt: PyPkt, now: int) -> None:
        recovery.lose(pkt, now, ACK_TIMEOUT)

    def on_progress(self) -> None:
        pass


class GoBackN:
    """RoCEv2 RC's recovery, the baseline: losses are learned only from a PSN-sequence NAK or
    the ACK timeout, and then everything from the oldest unacknowledged PSN is resent, in
    order. The retry budget counts the QP's timeouts without progress (an RC QP's counter)."""

    mode = RecoveryMode.GO_BACK_N

    def __init__(self) -> None:
        self.timeouts_without_progress = 0

    def on_sequence_nak(self, recovery: Recovery, cum: int, now: int) -> bool:
        recovery.ack_cumulative(cum, now)
        self.rewind(recovery, now, SEQUENCE_NAK)
        return True

    def detect_losses(self, recovery: Recovery, now: int, touched: Iterable[int] | None) -> None:
        pass  # RC learns of losses only from NAKs and timeouts

    def loss_deadline(self, recovery: Recovery) -> int | None:
        return None

    def tries(self, pkt: PyPkt) -> int:
        return self.timeouts_without_progress + 1

    def on_ack_timeout(self, recovery: Recovery, pkt: PyPkt, now: int) -> None:
        self.timeouts_without_progress += 1
        self.rewind(recovery, now, ACK_TIMEOUT)

    def on_progress(self) -> None:
        self.timeouts_without_progress = 0

    def rewind(self, recovery: Recovery, now: int, why: str) -> None:
        """Resend everything from the oldest unacknowledged PSN on, in order."""
        sent, evs = recovery.sent, recovery.profile.evs
        psns = sorted(p for p in sent.pkts if p >= recovery.una)
        lost: dict[int, int] = {}  # EV -> bytes that were in flight
        for psn in psns:
            pkt = sent.pkts[psn]
            lost.setdefault(pkt.ev, 0)
            if psn in sent.flight:
                recovery.ledger.lost(pkt, now)
                sent.out_of_flight(pkt)
                evs[pkt.ev].packets_lost += 1
                lost[pkt.ev] += pkt.length
        sent.retx.clear()
        sent.retx.extend(psns)
        for ev, nbytes in lost.items():
            if why is ACK_TIMEOUT:
                recovery.cc.on_timeout(now, ev, nbytes, evs[ev].rtt.srtt_ns, True)
            else:
                recovery.cc.on_lost(now, ev, nbytes, evs[ev].rtt.srtt_ns, True)
