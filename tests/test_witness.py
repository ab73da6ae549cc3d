"""Witness probes (transport/witness.py) alone: a QP's recovery over a synthetic fabric of EVs in
two planes, where data may wait in a queue that the probes skip, as the switches' control class
lets them; no sockets, no root."""

from __future__ import annotations

from test_recovery import RecordingCc, send, settled

from mrc_emu.transport import witness as witness_module
from mrc_emu.transport.config import QpConfig
from mrc_emu.transport.multipath.ev import EvProfile
from mrc_emu.transport.multipath.rtt import RttEstimator
from mrc_emu.transport.recovery import ACK_TIMEOUT, Recovery
from mrc_emu.transport.witness import Witness
from mrc_emu.wire.format import AckPacket, Syndrome

US = 1000


class Prober:
    """What the witness asks of the QP's prober: probes along an EV, answered by the fabric."""

    def __init__(self, fabric: Net) -> None:
        self.fabric = fabric
        self.paths = {ev: None for ev in fabric.planes}
        self.witness = None
        self.next_id = 1
        self.sent_at: dict[int, int] = {}
        self.revived: list[int] = []

    def send_probe(self, ev: int, now: int, send) -> int:
        probe_id, self.next_id = self.next_id, self.next_id + 1
        self.sent_at[probe_id] = now
        self.fabric.probe(ev, probe_id, now)
        return probe_id

    def on_response(self, ev: int, probe_id: int, now: int) -> None:
        """As EvProber.on_response: a witness's answer goes to the witness, any other revives."""
        if not self.witness.on_answer(ev, probe_id, now):
            self.revived.append(ev)
            self.fabric.rec.profile.on_probe(ev, now, now - self.sent_at.get(probe_id, now))


class Net:
    """A QP's packets over EVs: each EV a one-way delay of half its RTT each way, `queue(ev, t)`
    more for data (never for probes, as the control class passes queues), `dead` EVs losing
    everything (both ways) from `dead_from`. The responder acknowledges every packet at once,
    echoing it, by its EV's way back, where `back(plane, t)` more holds ACKs and answers alike (the
    responder's NIC port on that plane, one queue for what it sends)."""

    def __init__(self, planes: dict[int, int | None], rtts: dict[int, int], dead=(), dead_from: int = 0,
                 queue=lambda ev, t: 0, witness: bool = True, evs_min: int = 1, witnesses: int = 2,
                 back=lambda plane, t: 0) -> None:
        self.planes, self.rtts, self.dead, self.dead_from, self.queue = planes, rtts, set(dead), dead_from, queue
        self.back = back
        self.cc = RecordingCc()
        self.rec = Recovery(QpConfig(mtu=1000, witnesses=witnesses), EvProfile(list(planes), ev_min_active=evs_min),
                            self.cc)
        settled(self.rec, rtts)
        self.prober = Prober(self)
        self.rec.profile.planes = dict(planes)
        self.witness = Witness(self.rec, self.prober) if witness else None
        self.events: list[tuple[int, int, str, tuple]] = []  # (time, order, kind, what)
        self.order = 0
        self.arrived: set[int] = set()
        self.t = 0

    def lost(self, ev: int, t: int) -> bool:
        return ev in self.dead and t >= self.dead_from

    def at(self, t: int, kind: str, *what) -> None:
        self.order += 1
        self.events.append((t, self.order, kind, what))

    def probe(self, ev: int, probe_id: int, t: int) -> None:
        if not self.lost(ev, t):
            half = self.rtts[ev] // 2
            self.at(t + half, "question", ev, probe_id)

    def run(self, until: int, step: int = 2 * US, new_until: int | None = None) -> None:
        rec, t = self.rec, self.t
        while t < until:
            if self.witness is not None:  # as the requester's pump: witnesses before data
                self.witness.pump(t, None)
            while rec.sent.retx and rec.sent.retx[0] not in rec.sent.pkts:  # delivered after all (a queue)
                rec.sent.retx.popleft()
            if rec.sent.retx:
                pkt = rec.sent.pkts[rec.sent.retx.popleft()]
                rec.sent.record(pkt, rec.profile.pick(pkt.ev), t)
            elif new_until is None or t < new_until:
                pkt = send(rec, rec.profile.pick(), t)
            else:
                pkt = None
            if pkt is not None and not self.lost(pkt.ev, t):
                self.at(t + self.rtts[pkt.ev] // 2 + self.queue(pkt.ev, t), "arrival", pkt.psn, pkt.ev)
            t += step
            while due := sorted(e for e in self.events if e[0] <= t):  # what they schedule may be due too
                for event in due:
                    self.events.remove(event)
                    when, _, kind, what = event
                    if kind == "question":  # the responder answers at once, by the EV's way back
                        self.at(self._way_back(what[0], when), "answer", *what)
                    elif kind == "arrival":  # and acknowledges what has arrived so far
                        self.at(self._way_back(what[1], when), "ack", self.ack_for(*what))
                    elif kind == "answer":
                        self.prober.on_response(what[0], what[1], when)
                    elif rec.in_range(what[0]):
                        rec.on_ack(what[0], when)
            assert rec.on_timer(t) is None
        self.t = t

    def _way_back(self, ev: int, t: int) -> int:
        """When what the responder sends at `t` by `ev`'s way back arrives."""
        return t + self.rtts[ev] // 2 + self.back(self.planes[ev], t)

    def ack_for(self, psn: int, ev: int) -> AckPacket:
        self.arrived.add(psn)
        cum = self.rec.una - 1
        while cum + 1 in self.arrived:
            cum += 1
        above = sorted(p for p in self.arrived if p > cum)
        bitmap = b""
        if above:
            nbits = -(-(max(above) - cum) // 32) * 32
            bitmap = sum(1 << (nbits - 1 - (p - cum - 1)) for p in above).to_bytes(nbits // 8, "big")
        return AckPacket(0x11, cum & 0xFFFFFF, Syndrome.ACK, 0, (cum + 1) & 0xFFFFFF, psn & 0xFFFFFF, ev, False, bitmap)


TWO_PLANES = {ev: ev // 4 for ev in range(8)}


def test_one_ev_of_eight_blackholed_is_found_by_its_witness_within_a_few_rtts():
    """One witness decides (config.witnesses 1): within 4 RTTs of the blackhole."""
    net = Net(TWO_PLANES, {ev: 100 * US for ev in range(8)}, dead={3}, dead_from=1000 * US, witnesses=1)
    net.run(until=3000 * US)
    (event,) = net.rec.profile.events
    assert event.ev == 3 and event.new.name == "ASSUMED_BAD" and event.reason == witness_module.DEAD
    # quiet once its oldest packet's ACK is a window overdue (a smallest RTT after it left, or as
    # long after the EV's last ACK as it left after the packets that ACK covered), then one RTT for
    # the verdict: 268 us (348 us when quiet counted a whole smallest RTT from the EV's last ACK)
    assert event.time_ns - 1000 * US <= 3 * 100 * US
    assert net.rec.timeouts == 0 and ACK_TIMEOUT not in net.rec.lost_by
    assert [ev for ev, s in net.rec.profile.evs.items() if s.packets_lost] == [3]
    assert net.witness.dead == 1 and net.witness.late == 0
    # nothing of EV 3 left in flight: what it carried was resent on the other EVs at the verdict
    assert all(p.ev != 3 for p in net.rec.sent.pkts.values() if p.psn in net.rec.sent.flight)


def test_by_default_a_second_witness_confirms_and_the_ev_carries_nothing_meanwhile():
    """The first unanswered witness suspends the EV (its packets resent, none new on it); the
    second, sent at once, decides: one RTT and a window later than a single witness."""
    net = Net(TWO_PLANES, {ev: 100 * US for ev in range(8)}, dead={3}, dead_from=1000 * US)
    net.run(until=1320 * US)
    suspended_at = None
    while not net.rec.profile.events:
        net.run(until=net.t + 2 * US)
        if suspended_at is None and 3 in net.rec.profile.suspended:
            suspended_at = net.t
            sent_before = net.rec.profile.evs[3].packets_sent
    (event,) = net.rec.profile.events
    assert event.ev == 3 and event.reason.startswith(witness_module.DEAD) and "2 witness probes in a row" in event.reason
    assert suspended_at is not None and event.time_ns - 1000 * US <= 6 * 100 * US
    assert net.rec.profile.evs[3].packets_sent == sent_before  # nothing new while suspended
    assert net.witness.dead == 2 and not net.rec.profile.suspended and net.rec.timeouts == 0


def test_evs_with_ten_times_different_rtts_fail_nothing_and_lose_nothing():
    rtts = {ev: (100 if ev % 2 else 1000) * US for ev in range(8)}  # both kinds in each plane
    net = Net(TWO_PLANES, rtts)
    net.run(until=8000 * US)
    assert net.rec.profile.events == [] and not net.cc.of("lost") and net.rec.timeouts == 0
    assert net.witness.dead == 0


def queue_on(ev: int, start: int, delay: int):
    """A queue on `ev` alone that holds its data `delay` ns longer from `start` on (a burst of
    another flow filled its port at once)."""
    return lambda e, t: delay if e == ev and t >= start else 0


def test_an_ack_back_on_another_plane_proves_no_witness_lost_and_one_back_on_its_plane_does():
    """EV 5's data meets a queue (it goes quiet, and gets a witness), and the responder's NIC port
    on plane 1 holds its own data (a ring's QP sends as it receives): everything plane 1 sends
    back, ACKs and witness answers alike, waits 60 us more. ACKs back on plane 0 still say that
    plane 1's packets arrived, sent long after the witness whose answer is in that queue; taken as
    proof at once, they made plane-1 EVs fail (a fault-free 32-host ring in virtual time: 44 EV
    events per QP between leaves). An ACK back on the witness's own plane proves it at once; one
    back on another plane only once the answer is an srtt and four variations overdue (Witness.grace),
    so nothing fails; a blackhole on plane 1 is still found within a few RTTs."""
    rtts = {ev: 100 * US for ev in range(8)}

    def held(plane: int, t: int) -> int:
        return 60 * US if plane == 1 and t >= 1000 * US else 0

    net = Net(TWO_PLANES, rtts, back=held, witnesses=1, queue=queue_on(5, 1000 * US, 1500 * US))
    net.run(until=5000 * US)
    assert net.rec.profile.events == [] and net.rec.timeouts == 0
    assert net.witness.sent >= 1 and net.witness.dead == 0
    dead = Net(TWO_PLANES, rtts, back=held, witnesses=1, dead={6}, dead_from=2000 * US,
               queue=queue_on(5, 1000 * US, 1500 * US))
    dead.run(until=5000 * US)
    (event,) = dead.rec.profile.events
    assert event.ev == 6 and event.reason == witness_module.DEAD
    assert event.time_ns - 2000 * US <= 4 * 100 * US and dead.rec.timeouts == 0


def test_an_ev_behind_a_sudden_queue_is_alive_to_its_witness_and_never_fails():
    """The queue outgrows the EV's RTT estimate at once, so it goes quiet for 15 RTTs and its
    packets look lost to the timer (loss.py rule 2 resends some: spurious, but only resends);
    its witness skips the queue and answers, so the EV stays GOOD, where the losses alone made
    it ASSUMED_BAD."""
    rtts = {ev: 100 * US for ev in range(8)}
    grows = queue_on(2, 1000 * US, 1500 * US)
    net = Net(TWO_PLANES, rtts, queue=grows)
    net.run(until=4000 * US)
    assert net.rec.profile.events == [] and net.rec.timeouts == 0
    assert net.witness.answered >= 1 and net.witness.dead == 0
    without = Net(TWO_PLANES, rtts, queue=grows, witness=False)
    without.run(until=4000 * US)
    assert [(e.ev, e.new.name) for e in without.rec.profile.events][:1] == [(2, "ASSUMED_BAD")]


def test_a_dead_ev_whose_last_packet_was_the_qps_last_is_found():
    """The QP's data end just after the fault: the first witness is convicted by the resends on its
    siblings, the second, sent when nothing else is left to send, by time once all the QP sent was
    acknowledged (it was left out, the EV suspended for good, with nothing left to judge it)."""
    net = Net(TWO_PLANES, {ev: 100 * US for ev in range(8)}, dead={5}, dead_from=1000 * US)
    net.run(until=4000 * US, new_until=1010 * US)
    assert net.rec.una == net.rec.next_psn and net.rec.timeouts == 0  # all delivered, the dead EV's packets resent
    (event,) = net.rec.profile.events
    assert event.ev == 5 and event.new.name == "ASSUMED_BAD" and event.reason.startswith(witness_module.DEAD_IDLE)
    assert event.time_ns - 1000 * US <= 1100 * US and not net.rec.profile.suspended and not net.witness.out
    single = Net(TWO_PLANES, {ev: 100 * US for ev in range(8)}, dead={5}, dead_from=1000 * US, witnesses=1)
    single.run(until=4000 * US, new_until=1010 * US)
    assert single.rec.profile.evs[5].state.name == "ASSUMED_BAD" and single.rec.timeouts == 0


def test_a_second_witness_the_siblings_data_ended_before_is_judged_by_time():
    """The siblings delivered packets sent after the second witness, none an allowance after it,
    then carried nothing more: no ACK can convict it, so the timer stands in for a sibling packet
    sent an allowance after it (due two of its srtts and the ACK delay later). The old rules left
    the EV suspended, its EV event never reported (ring16's h3->h4 in virtual time)."""
    net = Net(TWO_PLANES, {ev: 100 * US for ev in range(8)}, dead={5}, dead_from=1000 * US)
    net.run(until=4000 * US, new_until=1200 * US)
    rules = [v["rule"] for v in net.witness.summary()["verdicts"]]
    assert rules == ["plane", "idle"] and net.rec.timeouts == 0
    (event,) = net.rec.profile.events
    assert event.ev == 5 and "2 witness probes in a row" in event.reason
    second = net.witness.verdicts[1]
    due = net.witness.allowance(5, 4) + witness_module.TIMER_RTTS * 100 * US + net.rec.config.ack_delay_ns
    assert abs(event.time_ns - (second[1] + due)) <= 8 * US


def test_an_ev_queued_at_the_end_of_the_qps_data_answers_its_witness_and_never_fails():
    """Fault-free: EV 2's last packets wait behind a queue of 15 RTTs as the QP's data end; its
    witness skips the queue and is answered, so the timers that judge a witness once nothing else
    is in flight convict nothing."""
    net = Net(TWO_PLANES, {ev: 100 * US for ev in range(8)}, queue=queue_on(2, 1000 * US, 1500 * US))
    net.run(until=6000 * US, new_until=1100 * US)
    assert net.rec.profile.events == [] and net.rec.timeouts == 0 and not net.rec.profile.suspended
    assert net.witness.answered >= 1 and net.witness.dead == 0 and net.rec.una == net.rec.next_psn


def test_an_ev_alone_in_its_plane_is_judged_by_the_witness_timer():
    planes = {0: 0, 1: 0, 2: 0, 3: 1}  # EV 3 has no sibling: no ACK comes back its plane's way
    net = Net(planes, {ev: 100 * US for ev in planes}, dead={3}, dead_from=1000 * US)
    net.run(until=3000 * US)
    (event,) = net.rec.profile.events
    assert event.ev == 3 and event.reason.startswith(witness_module.DEAD_TIMER)
    # its last delivery one RTT after the fault; quiet for an RTT and a window; then the timer, twice
    window = net.witness.window(3)
    timer = witness_module.TIMER_RTTS * 100 * US + window + net.rec.config.ack_delay_ns
    assert event.time_ns - 1000 * US <= 2 * 100 * US + window + 2 * timer + 8 * US and net.rec.timeouts == 0


def test_a_plane_down_fails_each_of_its_evs_by_the_timer_and_keeps_the_other_plane():
    net = Net(TWO_PLANES, {ev: 100 * US for ev in range(8)}, dead={0, 1, 2, 3}, dead_from=1000 * US)
    net.run(until=4000 * US)
    bad = sorted(e.ev for e in net.rec.profile.events if e.new.name == "ASSUMED_BAD")
    assert bad == [0, 1, 2, 3] and net.rec.timeouts == 0
    assert all(s.state.name == "GOOD" for ev, s in net.rec.profile.evs.items() if ev >= 4)


def test_a_witness_answered_after_it_was_taken_for_lost_resumes_the_ev_and_is_counted():
    """A reordering, not a failure: the suspended EV carries data again, no EV event."""
    net = Net(TWO_PLANES, {ev: 100 * US for ev in range(8)})
    net.run(until=1000 * US)
    net.witness.pump(net.t, None)  # nothing due: every EV delivers
    assert not net.witness.out
    # a witness by hand, then its EV convicted by a sibling's later ACK before the answer came
    net.witness.out[1] = (999, net.t)
    net.witness.fail(1, net.t + 1, witness_module.DEAD)
    assert 1 in net.rec.profile.suspended and 1 not in net.rec.profile.schedule_at()[0]
    net.prober.on_response(1, 999, net.t + 2)
    assert net.witness.late == 1 and net.prober.revived == []
    assert not net.rec.profile.suspended and 1 in net.rec.profile.schedule_at()[0]
    assert net.rec.profile.events == []


def test_with_one_witness_a_late_answer_revives_the_ev_as_any_probe():
    net = Net(TWO_PLANES, {ev: 100 * US for ev in range(8)}, witnesses=1)
    net.run(until=1000 * US)
    net.witness.out[1] = (999, net.t)
    net.witness.fail(1, net.t + 1, witness_module.DEAD)
    assert net.rec.profile.evs[1].state.name == "ASSUMED_BAD"
    net.prober.on_response(1, 999, net.t + 2)
    assert net.witness.late == 1 and net.prober.revived == [1]
    assert net.rec.profile.evs[1].state.name == "GOOD"


def test_ev_min_active_holds_against_a_witness_verdict():
    planes = {0: 0, 1: 0, 2: 0}
    net = Net(planes, {ev: 100 * US for ev in planes}, dead={0, 1}, dead_from=500 * US, evs_min=2)
    net.run(until=2000 * US)
    # one of the two dead EVs fails; the other stays GOOD: never fewer than ev_min_active
    assert len([e for e in net.rec.profile.events if e.new.name == "ASSUMED_BAD"]) == 1
    assert net.witness.dead >= 2


def test_losses_before_an_answered_witness_do_not_count_towards_a_path_failure():
    profile = EvProfile([0, 1])
    profile.evs[0].alive_sent_ns = 500
    for sent in (100, 200, 300):
        assert profile.on_lost(0, 1000, "test", sent) == 0
    assert profile.evs[0].state.name == "GOOD"
    for sent in (600, 700):
        profile.on_lost(0, 1000, "test", sent, decide=False)
    assert profile.evs[0].consecutive_losses == 2
    profile.on_lost(0, 1000, "test", 800, decide=False)
    assert profile.evs[0].state.name == "GOOD"  # a run, but only a witness decides
    profile.on_lost(0, 1000, "test", 900)
    assert profile.evs[0].state.name == "ASSUMED_BAD"


def test_an_ev_whose_path_grew_ten_times_longer_fails_at_most_once_then_is_learned():
    """A 1 ms delay added to one EV's path (netem's `delay` on a link: data and probes alike): its
    witnesses are convicted (its siblings' later packets come back first), but an answer that comes
    after all, or the probe that revives it, restarts the EV's smallest RTT from the path as it is
    now, so its next witnesses allow for the longer path. With its smallest RTT of all time
    (100 us), every witness of it was convicted and the EV went ASSUMED_BAD and back for ever."""
    net = Net(TWO_PLANES, {ev: 100 * US for ev in range(8)})
    net.run(until=1000 * US)
    net.rtts[1] = 1100 * US
    net.run(until=12000 * US)
    events = [(e.ev, e.new.name) for e in net.rec.profile.events]
    assert events in ([], [(1, "ASSUMED_BAD"), (1, "GOOD")])  # at most once, as its two witnesses decide
    assert net.rec.profile.evs[1].rtt.min_rtt_ns >= 1100 * US and net.rec.profile.evs[1].state.name == "GOOD"
    assert net.witness.dead <= 3 and net.rec.timeouts == 0
    net.run(until=20000 * US)  # and from then on it carries its share, convicted no more
    assert net.witness.dead <= 3 and len(net.rec.profile.events) == len(events)
    assert net.rec.profile.evs[1].last_delivered_sent_ns > 12000 * US


def test_a_smallest_rtt_is_compared_with_its_siblings_over_the_same_span_of_time():
    """A quiet EV's smallest RTT is what it saw before it went quiet; its sibling's is taken as it
    was then, not after the plane went idle (ring16 in virtual time: 1,291 us behind the host's
    start-up queue against 34.6 us, and the second witness waited 2.1 ms for a sibling's packet
    that never came). A path that is longer over the same span still counts."""
    net = Net({0: 0, 1: 0}, {0: 1300 * US, 1: 1300 * US})
    evs, witness = net.rec.profile.evs, net.witness
    plain = witness.window(0) + witness.holdup_ns
    net.rec.profile.on_rtt(0, 1300 * US, 1000 * US)  # both behind the same queue, then 0 goes quiet
    net.rec.profile.on_rtt(1, 1300 * US, 1000 * US)
    net.rec.profile.on_rtt(1, 100 * US, 5000 * US)  # the queue drained: its sibling sees the plane idle
    assert evs[1].rtt.min_rtt_ns == 100 * US and evs[0].rtt.min_rtt_ns == 1298 * US
    assert witness.allowance(0, 1) == plain  # the old rule allowed 1,198 us more
    net.rec.profile.on_rtt(0, 1200 * US, 6000 * US)  # 0 heard from again, its path 1.1 ms longer than 1's
    assert witness.allowance(0, 1) == witness.window(0) + 1100 * US + witness.holdup_ns
    evs[0].rtt.rebase(2000 * US, at_least=True, now=7000 * US)  # a late answer: its path grew longer still
    assert witness.allowance(0, 1) == witness.window(0) + 1900 * US + witness.holdup_ns


def test_an_ev_dead_since_its_start_up_queue_fails_by_its_siblings_acks_once_they_run_fast():
    """Every EV's first samples read the QP's start-up queue (1.3 ms on 100 us paths) and EV 3 dies
    before that queue drains, so its smallest RTT stays 1.3 ms while its siblings' fall to 100 us.
    Its witnesses are convicted as soon as its siblings' ACKs overtake them by a window: ASSUMED_BAD
    2.5 ms after the fault, where the old rule (the siblings' smallest RTTs of all time) waited
    1.2 ms more for each of its two witnesses."""
    net = Net(TWO_PLANES, {ev: 1300 * US for ev in range(8)}, dead={3}, dead_from=0)
    net.rtts = {ev: 100 * US for ev in range(8)}  # the start-up queue drained: the paths as they are
    net.run(until=6000 * US)
    (event,) = net.rec.profile.events
    assert event.ev == 3 and event.reason.startswith(witness_module.DEAD) and "2 witness probes" in event.reason
    assert event.time_ns <= 2700 * US and net.rec.timeouts == 0
    assert net.witness.late == 0 and net.witness.dead == 2


def test_an_rtt_estimator_answers_for_a_past_time_with_its_smallest_rtt_then_or_at_most_an_eighth_less():
    rtt = RttEstimator()
    assert rtt.min_by(0) == 0
    for t in range(100):  # a queue draining: the smallest RTT falls from 1,300 us to 301 us, sample by sample
        rtt.update((1300 - 10 * t) * US, (1000 + t) * US)
    rtt.update(1500 * US, 2000 * US)  # no new smallest
    assert rtt.min_by(999 * US) == 0 and rtt.min_by(5000 * US) == rtt.min_rtt_ns == 310 * US
    for t in range(100):
        true = (1300 - 10 * t) * US
        assert true * 7 / 8 <= rtt.min_by((1000 + t) * US) <= true
    assert len(rtt.lows) <= 12  # steps of an eighth, not one a sample
    rtt.rebase(900 * US, now=3000 * US)  # the path changed: a new span from then
    assert rtt.min_by(2999 * US) == 310 * US and rtt.min_by(3000 * US) == 900 * US and rtt.heard_ns == 3000 * US
