"""Loss recovery alone: synthetic packets in the sent-packet table, hand-made ACKs, no network."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from mrc_emu.transport import loss
from mrc_emu.transport import sent as sent_module
from mrc_emu.transport.cc.base import CongestionControl
from mrc_emu.transport.config import QpConfig, RecoveryMode
from mrc_emu.transport.multipath.ev import EvProfile
from mrc_emu.transport.recovery import GoBackN, Recovery, Selective
from mrc_emu.wire.format import AckPacket, Syndrome, TrimNackPacket

MTU = 1000
US = 1000


class RecordingCc(CongestionControl):
    """A fixed window that writes down every event it is fed."""

    name = "recording"

    def __init__(self) -> None:
        self.cwnd = 1e9
        self.events: list[tuple] = []

    def on_sent(self, now, ev, nbytes):
        self.events.append(("sent", ev, nbytes))

    def on_acked(self, now, ev, nbytes, rtt_ns, srtt_ns, ecn):
        self.events.append(("acked", ev, nbytes, rtt_ns, ecn))

    def on_lost(self, now, ev, nbytes, srtt_ns, congestion):
        self.events.append(("lost", ev, nbytes, congestion))

    def on_trimmed(self, now, ev, nbytes, srtt_ns, last_hop=False):
        self.events.append(("trimmed", ev, nbytes, last_hop))

    def on_cnp(self, now):
        self.events.append(("cnp",))

    def on_timeout(self, now, ev, nbytes, srtt_ns, congestion):
        self.events.append(("timeout", ev, nbytes, congestion))

    def of(self, kind: str) -> list[tuple]:
        return [e for e in self.events if e[0] == kind]


def make(evs=(0, 1, 2), mode=RecoveryMode.SACK, start_psn=0, **config):
    cc = RecordingCc()
    return Recovery(QpConfig(mtu=MTU, recovery=mode, **config), EvProfile(list(evs)), cc, start_psn), cc


def send(rec: Recovery, ev: int, t: int, length: int = MTU):
    """A new packet leaves on `ev` at `t`, as the requester records it."""
    pkt = rec.sent.new(rec.next_psn, SimpleNamespace(acked=0), 0, length, False)
    rec.sent.record(pkt, ev, t)
    rec.next_psn += 1
    return pkt


def resend(rec: Recovery, ev: int, t: int):
    """The requester resends the oldest lost packet on `ev` at `t`."""
    pkt = rec.sent.pkts[rec.sent.retx.popleft()]
    rec.sent.record(pkt, ev, t)
    return pkt


def ack(cum: int, arrived=(), base: int | None = None, echo: tuple[int, int] = (0, 0xFFFF), nak: bool = False,
        ecn: bool = False) -> AckPacket:
    """An ACK as the responder builds it: every PSN up to `cum` arrived, and the PSNs in `arrived`
    as a SACK bitmap from `base` (default cum + 1) in whole 32-bit words; echo = (PSN, EV)."""
    base = cum + 1 if base is None else base
    bitmap = b""
    if arrived:
        nbits = -(-(max(arrived) - base + 1) // 32) * 32
        word = sum(1 << (nbits - 1 - (psn - base)) for psn in arrived)
        bitmap = word.to_bytes(nbits // 8, "big")
    syndrome = Syndrome.NAK_PSN_SEQUENCE if nak else Syndrome.ACK
    psn = cum + 1 if nak else cum  # a sequence NAK names the expected PSN (IBA)
    return AckPacket(0x11, psn & 0xFFFFFF, syndrome, 0, base & 0xFFFFFF, echo[0] & 0xFFFFFF, echo[1], ecn, bitmap)


def settled(rec: Recovery, rtts: dict[int, int], var: int = 2 * US) -> None:
    """Give each EV an RTT estimate as many samples would: srtt `rtts[ev]`, rttvar about `var`."""
    for ev, rtt in rtts.items():
        for i in range(64):
            rec.profile.on_rtt(ev, rtt + (var if i % 2 else -var))


def test_sack_delivers_out_of_order_and_a_packet_passed_by_later_ones_is_lost_after_its_evs_rtt():
    rec, cc = make()
    for ev, t in ((0, 0), (1, 10 * US), (0, 20 * US), (1, 30 * US)):  # PSNs 0..3
        send(rec, ev, t)
    rec.on_ack(ack(-1, arrived=(1, 2, 3), base=0, echo=(3, 1)), 100 * US)
    assert rec.una == 0 and sorted(rec.sent.pkts) == [0] and rec.bytes_acked == 3 * MTU
    # RTT: the echoed packet's exact sample for EV 1, the newest delivered packet's for EV 0
    assert rec.profile.evs[1].rtt.latest_ns == 70 * US and rec.profile.evs[0].rtt.latest_ns == 80 * US
    assert sorted(cc.of("acked")) == [("acked", 0, MTU, 80 * US, False), ("acked", 1, 2 * MTU, 70 * US, False)]
    # PSN 0 left 20 us before PSN 2 on its EV: within EV 0's reorder window (its first sample's
    # variation, 40 us, twice), so it may still come; it is lost once EV 0's srtt, four RTT
    # variations and the ACK delay passed since EV 0 last delivered: 100 + 80 + 160 + 250 us
    assert 0 in rec.sent.flight and not cc.of("lost")
    assert rec.next_deadline() == 590 * US
    assert rec.on_timer(589 * US) is None and 0 in rec.sent.flight
    assert rec.on_timer(590 * US) is None
    assert list(rec.sent.retx) == [0] and 0 not in rec.sent.flight and rec.sent.bytes_in_flight == 0
    assert rec.profile.evs[0].packets_lost == 1 and cc.of("lost") == [("lost", 0, MTU, True)]
    rec.on_ack(ack(3), 650 * US)  # the resent PSN 0 arrived: everything is delivered
    assert rec.una == 4 and not rec.sent.pkts and rec.sacked == 0


def test_a_packet_passed_by_one_sent_later_on_its_own_ev_is_lost_at_once():
    """Rule 1 reads send times on one EV, not the time now: a delivered packet sent more than the
    EV's reorder window after it proves the packet lost; one sent within the window does not."""
    rec, cc = make()
    settled(rec, {0: 100 * US, 1: 100 * US})  # window: 24.5 us (a quarter of 98 us)
    assert loss.window(rec.profile.evs[0], rec.config.reorder_floor_ns) == 24_500
    old = send(rec, 0, 0)
    send(rec, 0, 20 * US)
    rec.on_ack(ack(-1, arrived=(1,), base=0), 120 * US)
    assert old.psn in rec.sent.flight  # 20 us later: within the window
    send(rec, 0, 30 * US)
    rec.on_ack(ack(-1, arrived=(1, 2), base=0), 130 * US)
    assert list(rec.sent.retx) == [old.psn] and rec.lost_by == {loss.LATER_ACKED: 1}
    assert rec.profile.events == []  # one loss: congestion, not a failed path
    assert cc.of("lost") == [("lost", 0, MTU, True)]


def test_a_packet_queued_behind_its_evs_deliveries_is_not_lost_while_they_go_on():
    """EV 0's queue grew past its RTT estimate: its packets keep arriving, late, while EV 1's come
    on time. The oldest one waiting is not lost while EV 0 delivers; it is once EV 0 goes quiet."""
    rec, cc = make()
    settled(rec, {0: 100 * US, 1: 100 * US})
    for _ in range(10):  # EV 0: ten packets sent at once, the queue delivers one every 40 us
        send(rec, 0, 0)
    for i in range(10, 20):
        send(rec, 1, (i - 9) * US)
    rec.on_ack(ack(-1, arrived=range(10, 20), base=0), 110 * US)  # EV 1's, on time
    for i in range(8):  # EV 0's, in order, the last of them 400 us after they left
        rec.on_ack(ack(i, arrived=range(10, 20)), 120 * US + i * 40 * US)
        rec.on_timer(120 * US + i * 40 * US + 39 * US)
    assert not cc.of("lost") and rec.una == 8
    rec.on_timer(2_000 * US)  # EV 0 went quiet with two still out: lost now
    assert sorted(rec.sent.retx) == [8, 9]


def test_another_evs_deliveries_alone_do_not_make_a_packet_lost():
    """Packets on EV 1 sent well after one on EV 0 arrive first (EV 0's queue grew): no loss until
    EV 0's own timer, srtt and four RTT variations, has passed since it left."""
    rec, cc = make()
    settled(rec, {0: 100 * US, 1: 100 * US})
    queued = send(rec, 0, 0)
    for i in range(1, 6):
        send(rec, 1, i * 2 * US)
    rec.on_ack(ack(-1, arrived=range(1, 6), base=0), 112 * US)  # sent up to 10 us after it, all arrived
    assert queued.psn in rec.sent.flight and not cc.of("lost")
    due = rec.next_deadline()
    stats = rec.profile.evs[0]  # it never delivered: from when it left
    assert due == int(stats.rtt.srtt_ns + max(4 * stats.rtt.rttvar_ns, 24_500)) + rec.config.ack_delay_ns
    rec.on_timer(due - 1)
    assert queued.psn in rec.sent.flight
    rec.on_timer(due)
    assert list(rec.sent.retx) == [queued.psn] and rec.lost_by == {loss.NOT_IN_TIME: 1}


def test_each_ev_has_its_own_rtt_in_the_allowance():
    """A packet on an EV ten times slower than the one whose later packet arrived is not lost
    while its own RTT says it may still come: a slow path is not a failed one."""
    rec, cc = make()
    settled(rec, {0: 100 * US, 1: 1000 * US})
    slow = send(rec, 1, 0)
    for i in range(1, 9):  # EV 0's packets for 800 us after it, each acknowledged 100 us later
        send(rec, 0, i * 100 * US)
        rec.on_ack(ack(-1, arrived=range(1, i + 1), base=0), i * 100 * US + 100 * US)
    assert slow.psn in rec.sent.flight and not cc.of("lost")
    assert rec.on_timer(950 * US) is None and slow.psn in rec.sent.flight
    rec.on_ack(ack(8, echo=(0, 1)), 1000 * US)  # it came, in its EV's time
    assert not rec.sent.pkts and not cc.of("lost") and rec.profile.events == []


def test_reordering_inside_one_ev_is_no_loss():
    """Packets of one EV sent 5 us apart arrive the other way round (a kernel's per-CPU backlog):
    the earlier ones are not lost, the EV is not marked bad (the old rule, "a later packet on
    the same EV arrived", lost all three at once and marked the EV ASSUMED_BAD)."""
    rec, cc = make()
    settled(rec, {0: 100 * US, 1: 100 * US})
    for i in range(4):
        send(rec, 0, i * 5 * US)
    rec.on_ack(ack(-1, arrived=(3,), base=0), 120 * US)
    assert not rec.sent.retx and not cc.of("lost") and rec.profile.events == []
    rec.on_ack(ack(3), 125 * US)
    assert not rec.sent.pkts and rec.profile.evs[0].packets_lost == 0


def test_losses_on_an_ev_that_delivers_later_packets_do_not_fail_it():
    """An EV whose packets sent after three lost ones arrive is working: the losses count against
    the window (congestion), never towards ASSUMED_BAD."""
    rec, cc = make()
    settled(rec, {0: 100 * US, 1: 100 * US})
    for i in range(3):
        send(rec, 0, i * US)
    send(rec, 0, 3 * US)
    rec.on_ack(ack(-1, arrived=(3,), base=0), 110 * US)
    rec.on_timer(800 * US)  # the three are lost by the timer: srtt, 4 rttvar and the ACK delay since they left
    assert list(rec.sent.retx) == [0, 1, 2]
    assert rec.profile.evs[0].consecutive_losses == 0 and rec.profile.events == []


def test_three_losses_in_a_row_make_the_ev_assumed_bad_naming_the_rule():
    rec, cc = make(evs=(0, 1))
    settled(rec, {0: 100 * US, 1: 100 * US})
    for t in range(3):
        send(rec, 0, t * US)
    send(rec, 1, 50 * US)  # a packet sent well after them, on the other EV, arrives
    rec.on_ack(ack(-1, arrived=(3,), base=0), 150 * US)
    rec.on_timer(700 * US)  # past EV 0's timer for all three
    assert list(rec.sent.retx) == [0, 1, 2]
    (event,) = rec.profile.events
    assert event.ev == 0 and event.new.name == "ASSUMED_BAD" and loss.NOT_IN_TIME in event.reason
    assert event.reason.startswith("3 consecutive losses")
    # the first is an isolated loss (the window shrinks); the run after it is the path's, not a queue's
    assert cc.of("lost") == [("lost", 0, MTU, True), ("lost", 0, MTU, False), ("lost", 0, MTU, False)]


class Fabric:
    """A synthetic network for one Recovery: each EV a path with its RTT (half each way), some EVs
    dead (they drop everything after `dead_from`); the responder acknowledges every packet on
    arrival with its cumulative PSN and SACK bitmap. Time advances by `step`; packets leave one
    per step on the EV the profile picks (its spray schedule), resends first."""

    def __init__(self, rec: Recovery, rtts: dict[int, int], dead=(), dead_from: int = 0) -> None:
        self.rec, self.rtts, self.dead, self.dead_from = rec, rtts, set(dead), dead_from
        self.arrived: set[int] = set()
        self.pending: list[tuple[int, int, int]] = []  # (arrival at the responder, psn, ev)
        self.acks: list[tuple[int, int, int]] = []  # (arrival of its ACK, psn, ev)
        self.t = 0

    def ack_now(self, psn: int, ev: int) -> AckPacket:
        self.arrived.add(psn)
        cum = self.rec.una - 1
        while cum + 1 in self.arrived:
            cum += 1
        return ack(cum, arrived=sorted(p for p in self.arrived if p > cum), echo=(psn, ev))

    def run(self, until: int, step: int, new_until: int | None = None) -> None:
        rec, pending, t = self.rec, self.pending, self.t
        while t < until:
            if rec.sent.retx:
                pkt = rec.sent.pkts[rec.sent.retx.popleft()]
                ev = rec.profile.pick(pkt.ev)
                rec.sent.record(pkt, ev, t)
            elif new_until is None or t < new_until:
                pkt = send(rec, rec.profile.pick(), t)
            else:
                pkt = None
            if pkt is not None and not (pkt.ev in self.dead and t >= self.dead_from):
                pending.append((t + self.rtts[pkt.ev] // 2, pkt.psn, pkt.ev))
            t += step
            for item in sorted(p for p in pending if p[0] <= t):
                pending.remove(item)
                self.acks.append((item[0] + self.rtts[item[2]] // 2, item[1], item[2]))
            for item in sorted(a for a in self.acks if a[0] <= t):
                self.acks.remove(item)
                if rec.in_range(ack(item[1])):
                    rec.on_ack(self.ack_now(item[1], item[2]), item[0])
            assert rec.on_timer(t) is None
        self.t = t


def test_one_ev_of_eight_blackholed_is_found_in_a_few_rtts_without_the_ack_timeout():
    rec, cc = make(evs=range(8))
    rtts = {ev: 100 * US for ev in range(8)}
    settled(rec, rtts)
    net = Fabric(rec, rtts, dead={3}, dead_from=1000 * US)
    net.run(until=3000 * US, step=2 * US)
    (event,) = rec.profile.events
    assert event.ev == 3 and event.new.name == "ASSUMED_BAD" and loss.NOT_IN_TIME in event.reason
    # within 4 RTTs of the blackhole, and the responder's ACK delay the timer allows for
    assert event.time_ns - 1000 * US <= 4 * 100 * US + rec.config.ack_delay_ns
    assert rec.timeouts == 0 and set(rec.lost_by) == {loss.NOT_IN_TIME}
    # lost: what EV 3 carried from the blackhole until it was marked, and nothing else
    assert [ev for ev, s in rec.profile.evs.items() if s.packets_lost] == [3]
    assert rec.profile.evs[3].packets_lost <= (event.time_ns - 1000 * US) // (8 * 2 * US) + 1
    assert not rec.sent.retx and all(p.ev != 3 for p in rec.sent.pkts.values() if p.psn in rec.sent.flight)


def test_evs_with_ten_times_different_rtts_lose_nothing():
    rec, cc = make(evs=range(8))
    rtts = {ev: (100 if ev < 4 else 1000) * US for ev in range(8)}
    settled(rec, rtts)
    Fabric(rec, rtts).run(until=5000 * US, step=2 * US)
    assert not cc.of("lost") and rec.timeouts == 0 and rec.profile.events == []


def test_a_dead_evs_packet_that_was_the_qps_last_is_lost_by_the_tail_timer():
    """Nothing is sent after it, so no later packet can pass it: the tail timer (two of the
    QP's largest RTTs and the ACK delay) finds it, long before the ACK timeout (16.8 ms)."""
    rec, cc = make(evs=range(8))
    rtts = {ev: 100 * US for ev in range(8)}
    settled(rec, rtts)
    net = Fabric(rec, rtts, dead={7}, dead_from=0)
    net.run(until=150 * US, step=2 * US, new_until=16 * US)  # 8 packets, the last on EV 7
    last = max(rec.sent.pkts)
    assert rec.sent.pkts[last].ev == 7 and len(rec.sent.pkts) == 1 and rec.una == last
    due = rec.sent.pkts[last].sent_ns + int(2 * rec.largest_srtt()) + rec.config.ack_delay_ns
    assert rec.next_deadline() == due < 600 * US
    net.run(until=due + 150 * US, step=2 * US, new_until=0)  # resent on another EV, acknowledged
    assert rec.timeouts == 0 and rec.una == last + 1 and not rec.sent.pkts
    assert cc.of("lost") == [("lost", 7, MTU, True)] and rec.profile.evs[7].packets_lost == 1
    assert rec.lost_by == {loss.TAIL: 1}


def test_the_tail_timer_takes_one_packet_at_a_time_under_a_growing_queue():
    """A shaped link filling: every packet in flight takes longer than two srtts. The tail timer
    resends only the newest one (the probe); the others wait for what its ACK says."""
    rec, cc = make(evs=(0,))
    settled(rec, {0: 100 * US})
    for i in range(20):
        send(rec, 0, i * US)
    due = rec.next_deadline()
    assert due == 19 * US + int(2 * rec.largest_srtt()) + rec.config.ack_delay_ns
    rec.on_timer(due + 1000 * US)  # long past every packet's tail deadline
    assert list(rec.sent.retx) == [19] and rec.lost_by == {loss.TAIL: 1}
    rec.on_timer(due + 2000 * US)  # the probe has not gone yet: nothing more
    assert list(rec.sent.retx) == [19]


def test_with_no_rtt_known_only_the_ack_timeout_finds_a_loss():
    rec, cc = make(ack_timeout_exp=10)  # 1.05 ms
    send(rec, 0, 0)
    assert rec.on_timer(5000 * US) is None  # no RTT sample: no loss rule has a threshold ...
    assert list(rec.sent.retx) == [0] and rec.timeouts == 1  # ... the ACK timeout does
    assert cc.of("timeout") == [("timeout", 0, MTU, True)] and not cc.of("lost")


def test_an_older_ack_with_its_sack_base_below_una_still_delivers_its_bits():
    """ACKs overtake each other: one whose SACK base lies below the PSNs already acknowledged
    (a negative shift) still delivers the PSNs above, and nothing twice."""
    rec, cc = make(evs=range(10))
    for psn in range(10):
        send(rec, psn, psn * US)  # one EV per packet: no path order between them
    rec.on_ack(ack(4, arrived=(6,)), 40 * US)  # the newer ACK first
    assert rec.una == 5 and sorted(rec.sent.pkts) == [5, 7, 8, 9] and rec.bytes_acked == 6 * MTU
    rec.on_ack(ack(2, arrived=(3, 4, 7), base=3), 41 * US)  # the older one: base 3, una 5
    assert sorted(rec.sent.pkts) == [5, 8, 9] and rec.bytes_acked == 7 * MTU
    assert rec.sacked == (1 << (rec.config.window - 1 - 1)) | (1 << (rec.config.window - 1 - 2))  # PSNs 6, 7
    rec.on_ack(ack(2, arrived=(3, 4, 7), base=3), 42 * US)  # once more: nothing new
    assert rec.bytes_acked == 7 * MTU and rec.duplicates_acked == 1
    assert not rec.sent.retx  # and nobody was declared lost on the way


def test_an_ack_beyond_what_was_sent_is_out_of_range():
    rec, _ = make(start_psn=0xFFFFF0)
    for _ in range(0x20):  # across the 24-bit wrap
        send(rec, 0, 0)
    assert rec.in_range(ack(0xFFFFF0 + 0x1F)) and not rec.in_range(ack(0xFFFFF0 + 0x20))
    rec.on_ack(ack(0xFFFFF0 + 0x1F), 10 * US)
    assert rec.una == 0x1000010 and not rec.sent.pkts


def test_a_retransmission_gives_no_rtt_sample():
    rec, cc = make()
    send(rec, 0, 0)
    rec.on_timer(rec.config.ack_timeout_ns)  # lost by the ACK timeout
    resend(rec, 1, rec.config.ack_timeout_ns)
    rec.on_ack(ack(0, echo=(0, 1)), rec.config.ack_timeout_ns + 30 * US)
    assert rec.profile.evs[1].rtt.samples == 0  # Karn: the sample could belong to either copy
    assert cc.of("acked") == [("acked", 1, MTU, None, False)]


def test_the_retry_budget_counts_a_packets_own_transmissions():
    rec, cc = make(ack_timeout_exp=0, retry_linear=2, retry_exp=1)  # 1024 ns, then 2048 ns
    send(rec, 0, 0)
    t = 0
    for tries, timeout in ((1, 1024), (2, 1024), (3, 1024), (4, 2048)):
        assert rec.config.ack_timeout_for(tries) == timeout
        assert rec.on_timer(t + timeout - 1) is None and rec.timeouts == tries - 1
        t += timeout
        if tries < 4:
            assert rec.on_timer(t) is None and list(rec.sent.retx) == [0]
            resend(rec, tries % 3, t)
    error = rec.on_timer(t)
    assert error is not None and "retry budget spent: PSN 0" in error and "after 4 transmissions" in error
    assert rec.timeouts == 4


def test_go_back_n_rewinds_to_the_oldest_unacknowledged_psn_on_a_sequence_nak():
    rec, cc = make(evs=(0,), mode=RecoveryMode.GO_BACK_N)
    assert isinstance(rec.policy, GoBackN)
    for i in range(5):
        send(rec, 0, i * US)
    rec.on_ack(ack(1, nak=True), 50 * US)  # PSNs 0 and 1 arrived, then a gap
    assert rec.una == 2 and rec.bytes_acked == 2 * MTU
    assert list(rec.sent.retx) == [2, 3, 4] and not rec.sent.flight and rec.sent.bytes_in_flight == 0
    assert rec.profile.evs[0].packets_lost == 3
    assert cc.of("lost") == [("lost", 0, 3 * MTU, True)]
    assert rec.profile.events == []  # go-back-N marks no EV bad


def test_go_back_n_finds_no_loss_by_the_sack_rules_and_counts_timeouts_without_progress():
    rec, cc = make(evs=(0,), mode=RecoveryMode.GO_BACK_N, ack_timeout_exp=10)
    for i in range(3):
        send(rec, 0, i * US)
    rec.on_ack(ack(0), 30 * US)  # PSN 0 arrived; 1 and 2 are older than nothing delivered after them
    timeout = rec.config.ack_timeout_ns
    assert rec.on_timer(timeout) is None and set(rec.sent.flight) == {1, 2}  # no SACK rule here
    assert rec.on_timer(timeout + 2 * US) is None  # PSN 1's ACK timeout: everything goes back
    assert list(rec.sent.retx) == [1, 2] and rec.policy.timeouts_without_progress == 1
    assert cc.of("timeout") == [("timeout", 0, 2 * MTU, True)]
    t = timeout + 2 * US
    resend(rec, 0, t)
    resend(rec, 0, t)
    assert rec.policy.tries(rec.sent.pkts[1]) == 2  # the QP's count, not the packet's
    rec.on_ack(ack(1), t + 30 * US)
    assert rec.policy.timeouts_without_progress == 0


@pytest.mark.parametrize("mode, policy", [(RecoveryMode.SACK, Selective), (RecoveryMode.GO_BACK_N, GoBackN),
                                          ("go-back-n", GoBackN)])
def test_the_recovery_mode_picks_the_policy(mode, policy):
    rec, _ = make(mode=mode)
    assert isinstance(rec.policy, policy) and rec.policy.mode is RecoveryMode(mode)


# ---- the driver's horizon: timers judged only as far as the emulation has seen ------------------

def test_ack_timeout_waits_for_the_horizon_and_counts_the_deferral():
    rec, cc = make(ack_timeout_exp=10)  # 1.05 ms
    pkt = send(rec, 0, 0)
    late = 5_000 * US  # the driver runs 5 ms after the packet left...
    rec.horizon = 200 * US  # ...but some part of the emulation has read its sockets only up to 0.2 ms
    assert rec.on_timer(late) is None
    assert rec.timeouts == 0 and pkt.psn in rec.sent.flight  # not lost: its ACK may be unread
    assert rec.deferred == 1
    rec.on_timer(late + 10 * US)  # the same deadline, put off again, is counted once
    assert rec.deferred == 1
    rec.horizon = late  # the emulation caught up, and no ACK came: now the timeout is real
    rec.on_timer(late)
    assert rec.timeouts == 1 and cc.of("timeout")


def test_ev_timer_loss_waits_for_the_horizon():
    rec, cc = make(reorder_floor_ns=500 * US)
    old = send(rec, 0, 0)
    newer = send(rec, 1, 10 * US)
    rec.horizon = 100 * US  # the responder's worker has not caught up
    rec.on_ack(ack(-1, arrived=[newer.psn], echo=(newer.psn, 1)), 3_000 * US)
    assert old.psn in rec.sent.flight and not cc.of("lost")
    rec.on_timer(12_000 * US)  # past EV 0's timer (3 x EV 1's 3 ms srtt), still not past the horizon
    assert old.psn in rec.sent.flight and not cc.of("lost")
    rec.horizon = None  # a driver whose `now` is the horizon (virtual time)
    rec.on_timer(12_000 * US)
    assert old.psn not in rec.sent.flight and cc.of("lost")


def test_the_responders_service_time_is_taken_out_of_the_rtt_sample():
    rec, cc = make()
    send(rec, 0, 0)
    served = ack(0, echo=(0, 0))
    served.service_ns = 400 * US  # the responder held the packet 400 us before the ACK left
    rec.on_ack(served, 500 * US)
    assert rec.profile.evs[0].rtt.latest_ns == 100 * US
    assert cc.of("acked") == [("acked", 0, MTU, 100 * US, False)]


def test_a_packet_sent_long_before_the_echoed_one_gives_no_rtt_sample():
    """An ACK that covers two bursts 5 ms apart: the echoed packet of the second has its exact
    sample; the first burst's packet arrived up to 5 ms before the ACK was due, so its
    `ACK arrival - sent` would count those 5 ms as delay: it gives no sample."""
    rec, cc = make()
    send(rec, 0, 0)
    send(rec, 1, 5000 * US)
    rec.on_ack(ack(1, echo=(1, 1)), 5100 * US)
    assert rec.profile.evs[1].rtt.latest_ns == 100 * US
    assert rec.profile.evs[0].rtt.samples == 0
    assert sorted(cc.of("acked")) == [("acked", 0, MTU, None, False), ("acked", 1, MTU, 100 * US, False)]


def _delivery_table(seed: int, ev_count: int, deliver_in_c: bool):
    """A sent-packet table of C records with a random history: several WRITEs, EVs, equal and
    unequal send times, retransmissions, packets lost (out of flight) and delivered before."""
    import random

    rng = random.Random(seed)
    table = sent_module.SentPackets(range(ev_count))
    if not deliver_in_c:
        table._deliver = table._front = None
    wrs = [SimpleNamespace(acked=rng.randrange(5) * 100) for _ in range(3)]
    for psn in range(1000, 1000 + 300):
        pkt = table.new(psn, wrs[min(2, (psn - 1000) // 120)], (psn - 1000) * 100, rng.choice([100, 100, 37]), False)
        for _ in range(rng.choice([1, 1, 1, 2, 3])):
            stamp = rng.randrange(0, 40) * 1000
            table.record(pkt, rng.randrange(ev_count), stamp, stamp - rng.randrange(0, 5) * 100)
        if rng.random() < 0.2:
            table.out_of_flight(pkt)  # declared lost, not resent yet
    for psn in rng.sample(range(1000, 1300), 30):
        table.deliver([psn], {})  # delivered before
    return table, wrs, rng


@pytest.mark.skipif(sent_module._spray is None, reason="the C extension mrc_emu.transport._spray is not built")
@pytest.mark.parametrize("seed, ev_count", [(1, 8), (2, 3), (3, 100)])  # 100 EVs: more than the C side aggregates at once
def test_delivery_in_c_leaves_what_the_python_loop_leaves(seed, ev_count):
    """SentPackets.deliver in C (_spray.deliver) against the Python loop, on the same table: a
    cumulative range, then SACKed PSNs with holes, repeats, unknown PSNs, into a `seen` that
    already holds entries; the same bytes, the same `seen` (in the same order), the same table;
    then SentPackets.front in C against Python: the same packet first on each EV, the same
    stale entries dropped."""
    results = []
    for in_c in (True, False):
        table, wrs, rng = _delivery_table(seed, ev_count, in_c)
        assert (table._deliver is not None) == in_c
        seen = {5 % ev_count: [2, 17_000, 1, 200, 16_000], 1: [1, 999_000, 2, 100, 999_000]}
        acked = [table.deliver(range(990, 1100), seen)]
        sacked = rng.sample(range(1100, 1400), 120) + [1150, 1150, 5, 10**9]
        acked.append(table.deliver(sacked, seen))
        acked.append(table.deliver(range(1290, 1310), seen))
        fronts = [getattr(table.front(ev), "psn", None) for ev in range(ev_count)]  # stale entries dropped
        results.append((acked, list(seen.items()), table.bytes_in_flight, table.ev_flight, [w.acked for w in wrs],
                        sorted(table.pkts), list(table.flight), fronts, {ev: list(q) for ev, q in table.by_ev.items()}))
    assert results[0] == results[1]
    assert results[0][0][0] > 0 and results[0][0][1] > 0 and any(f is not None for f in results[0][7])


def test_a_trim_nack_takes_the_packet_out_of_flight_and_queues_it_first():
    """The trimmed packet leaves flight and goes to the front of the retransmission queue, the CC
    and the EV hear the trim; a trim of an older transmission (the packet is in flight elsewhere
    now) is heard but resends nothing; a trim is never a loss."""
    rec, cc = make()
    for ev, t in ((0, 0), (1, 10 * US), (2, 20 * US)):  # PSNs 0..2
        send(rec, ev, t)
    rec.on_ack(ack(-1, arrived=(1,), base=0, echo=(1, 1)), 50 * US)  # nothing lost: PSN 0 is on another EV
    rec.sent.retx.append(7)  # something else waiting to be resent
    assert rec.on_trimmed(TrimNackPacket(0x11, 2, 2), 60 * US)
    assert list(rec.sent.retx) == [2, 7] and 2 not in rec.sent.flight and rec.sent.bytes_in_flight == MTU
    assert cc.of("trimmed") == [("trimmed", 2, MTU, False)] and not cc.of("lost")
    assert rec.profile.evs[2].packets_lost == 0 and rec.profile.evs[2].trims == 1
    again = resend(rec, 0, 70 * US)
    assert again.psn == 2 and again.tx == 2
    assert rec.on_trimmed(TrimNackPacket(0x11, 2, 2, last_hop=True), 80 * US)  # the first copy's, late
    assert 2 in rec.sent.flight and not rec.sent.retx.count(2) and cc.of("trimmed")[-1] == ("trimmed", 2, MTU, True)
    assert not rec.on_trimmed(TrimNackPacket(0x11, 1, 1), 90 * US)  # delivered already
    assert rec.trims == 2 and rec.trims_resent == 1


def test_ce_counts_reach_the_cc_per_ev_and_marks_on_an_ev_that_delivered_nothing_too():
    rec, cc = make()
    for ev, t in ((0, 0), (1, 10 * US), (0, 20 * US)):  # PSNs 0..2
        send(rec, ev, t)
    got = ack(2, echo=(2, 0))
    got.ce_counts = ((0, 1), (2, 3), (9, 1))  # EV 2 delivered nothing new; EV 9 is none of this QP's
    rec.on_ack(got, 100 * US)
    acked = {e[1]: e[4] for e in cc.of("acked")}
    assert acked == {0: True, 1: False, 2: True}
    evs = rec.profile.evs
    assert (evs[0].ce_marks, evs[1].ce_marks, evs[2].ce_marks) == (1, 0, 3)
    assert evs[2].ecn > evs[0].ecn > 0 == evs[1].ecn


def test_an_rtt_sample_is_taken_from_when_the_send_began_and_never_short():
    """One sendmmsg of 16 frames takes ~160 us here and the kernel forwards each inside it: the
    first frame's ACK can come back before the call returns. From the call's end that read 3 us
    for a 1 ms path and pulled NSCC's base RTT (a minimum) down for good; from its start the
    sample is never short, and one whose send took more than half of it is none."""
    from mrc_emu.transport.recovery import rtt_sample

    began, done = 1_000_000, 1_160_000  # the call's span
    assert rtt_sample(done + 3_000, done, began) is None  # 163 us from the start, 160 of them the send's
    assert rtt_sample(began + 1_000_000, done, began) == 1_000_000  # a 1 ms sample: within 2x of the truth
    assert rtt_sample(began + 320_000, done, began) == 320_000  # the span is exactly half: still a sample
    assert rtt_sample(began + 319_999, done, began) is None
    assert rtt_sample(began + 500, began, began) is None  # under 1 us: the service time's rounding
    assert rtt_sample(done - 10_000, done, began) is None  # heard before the call returned
