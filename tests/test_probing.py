"""EV probe pacing alone: backoff for EVs that stay bad, a per-QP cap, a budget shared by a host."""

from __future__ import annotations

import pytest

from mrc_emu.transport.ev import EvProfile, EvState
from mrc_emu.transport.probing import MAX_BACKOFF, EvProber, ProbeBudget
from mrc_emu.wire.format import ProbePacket

MS = 1_000_000


class FakeTemplate:
    def encode(self, packet):
        return packet


class FakePath:
    def __init__(self, ev):
        self.ev = ev
        self.template = FakeTemplate()


def prober(n_evs=4, budget=None, per_interval=8):
    profile = EvProfile(list(range(n_evs + 1)), ev_min_active=1)  # the last EV stays GOOD, unprobed
    for ev in range(n_evs):
        profile.set_state(ev, EvState.ASSUMED_BAD, 0, "test")
    paths = {ev: FakePath(ev) for ev in range(n_evs)}
    return EvProber(7, paths, profile, MS, lambda bits: 0, budget, per_interval), profile


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
    assert p.on_probe(ProbePacket(7, probe_id, ev, sent), sent + 50_000)
    assert profile.evs[0].state is EvState.GOOD and 0 not in p._backoff


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
