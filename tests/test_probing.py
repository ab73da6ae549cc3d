"""EV probe pacing alone: backoff for EVs that stay bad, a per-QP cap, a budget shared by a host."""

from __future__ import annotations

import pytest

from mrc_emu.transport.multipath.ev import EvProfile, EvState
from mrc_emu.transport.probing import MAX_BACKOFF, EvProber, ProbeBudget
from mrc_emu.wire.format import ProbePacket, ProbeResponsePacket

MS = 1_000_000


class FakeTemplate:
    def encode(self, packet):
        return packet


class FakePath:
    def __init__(self, ev, plane=None):
        self.ev = ev
        self.plane = plane
        self.template = FakeTemplate()


def prober(n_evs=4, budget=None, per_interval=8):
    profile = EvProfile(list(range(n_evs + 1)), ev_min_active=1)  # the last EV stays GOOD, unprobed
    for ev in range(n_evs):
        profile.set_state(ev, EvState.ASSUMED_BAD, 0, "test")
    paths = {ev: FakePath(ev) for ev in range(n_evs)}
    return EvProber(7, 8, paths, profile, MS, lambda bits: 0, budget, per_interval), profile


def run(p, until_ns, step_ns=100_000):
    sent = []
    for now in range(0, until_ns, step_ns):
        p.send_due(now, lambda frame, path, now=now: sent.append((now, frame.ev)) or True)
    return sent


def test_an_ev_that_stays_bad_is_probed_less_and_less_often():
    p, _ = prober(n_evs=1)
    times = [t for t, _ in run(p, 200 * MS)]
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert gaps[:4] == [MS, 2 * MS, 4 * MS, 8 * MS]
    assert max(gaps) == MAX_BACKOFF * MS
    assert len(times) < 12  # one probe per interval would have been 200


def test_a_returning_probe_resets_the_backoff():
    p, profile = prober(n_evs=1)
    run(p, 20 * MS)
    (probe_id, (ev, sent)), = list(p.pending.items())[-1:]
    assert p.on_response(ProbeResponsePacket(7, probe_id, ev, sent, 0, 3_000), sent + 50_000) is None
    assert profile.evs[0].state is EvState.GOOD and 0 not in p._backoff
    answer = p.answers[0]
    assert (answer.rtt_ns, answer.service_ns, answer.port) == (50_000, 3_000, 0)
    assert profile.events[-1].rtt_ns == 50_000  # the RTT includes the responder's service time


def test_a_probe_goes_to_the_responder_and_only_its_own_answer_counts():
    profile = EvProfile([0, 1, 2], ev_min_active=1)
    profile.set_state(0, EvState.ASSUMED_BAD, 0, "test")
    p = EvProber(7, 8, {0: FakePath(0, plane=1), 1: FakePath(1, plane=0), 2: FakePath(2, plane=0)},
                 profile, MS, lambda bits: 0)
    sent = []
    p.send_due(0, lambda frame, path: sent.append(frame) or True)
    (probe,) = sent
    assert isinstance(probe, ProbePacket) and probe.dest_qp == 8 and probe.ev == 0  # the responder's QPN
    assert p.on_response(ProbeResponsePacket(7, probe.probe_id + 1, 0, 0, 2, 0), 10) == "unknown_probe"
    assert p.on_response(ProbeResponsePacket(7, probe.probe_id, 1, 0, 2, 0), 10) == "unknown_probe"  # another EV's
    assert p.on_response(ProbeResponsePacket(7, probe.probe_id, 0, 0, 1, 0), 10) == "probe_wrong_port"  # plane 1: port 2
    assert profile.evs[0].state is EvState.ASSUMED_BAD
    assert p.on_response(ProbeResponsePacket(7, probe.probe_id, 0, 0, 2, 0), 10) is None
    assert profile.evs[0].state is EvState.GOOD
    profile.set_state(0, EvState.ASSUMED_BAD, 20 * MS, "test")
    profile.exclude(frozenset({0}))  # its port disabled: not probed
    sent.clear()
    p.send_due(30 * MS, lambda frame, path: sent.append(frame) or True)
    assert sent == [] and p.next_wakeup() is None


def test_one_qp_sends_at_most_per_interval_probes_per_interval():
    p, _ = prober(n_evs=32, per_interval=4)
    sent = run(p, 10 * MS)
    per_ms = [sum(1 for t, _ in sent if k * MS <= t < (k + 1) * MS) for k in range(10)]
    assert max(per_ms) <= 4
    assert len({ev for _, ev in sent}) == 32  # every EV gets its turn all the same
    assert p.probes_paced > 0


def test_a_host_budget_caps_all_its_qps_together():
    budget = ProbeBudget(rate_per_s=1000, burst=5)
    qps = [prober(n_evs=8, budget=budget)[0] for _ in range(10)]
    sent = 0
    for now in range(0, 20 * MS, 100_000):
        for p in qps:
            before = p.probes_sent
            p.send_due(now, lambda frame, path: True)
            sent += p.probes_sent - before
    assert sent <= 5 + 1000 * 0.02 + 1  # the burst plus the rate over 20 ms
    assert budget.refused > 0
    with pytest.raises(ValueError):
        ProbeBudget(0, 1)
