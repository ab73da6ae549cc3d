"""The EV profile alone: states, the spray schedule, and what a DENIED EV may never do."""

from __future__ import annotations

import os
import random
import socket

import pytest

from mrc_emu.io.memory import MemoryNetwork
from mrc_emu.topology import builtin
from mrc_emu.transport.config import QpConfig
from mrc_emu.transport.multipath.ev import EvProfile, EvState
from mrc_emu.transport.multipath.paths import qp_paths
from mrc_emu.transport.requester import Requester
from mrc_emu.transport.responder import Responder

PATHS = qp_paths(builtin(), "h0", "h2")
SRC = socket.inet_pton(socket.AF_INET6, PATHS.src_address)
DST = socket.inet_pton(socket.AF_INET6, PATHS.dst_address)


def test_ev_min_active_keeps_the_last_evs_good():
    profile = EvProfile([0, 1, 2], ev_min_active=2)
    for _ in range(5):
        profile.on_lost(0, 1, "test")
        profile.on_lost(1, 1, "test")
    assert [profile.evs[k].state for k in (0, 1, 2)].count(EvState.GOOD) == 2


def test_spray_is_weighted_and_interleaved():
    profile = EvProfile([0, 1, 2, 3])
    profile.evs[3].loss = 0.1
    picks = [profile.pick() for _ in range(320)]
    assert all(a != b for a, b in zip(picks, picks[1:]))  # no EV twice in a row
    assert picks.count(3) < 0.5 * picks.count(0)


def _share_of(profile: EvProfile, ev: int, picks: int = 640) -> float:
    profile.reweigh()
    return [profile.pick() for _ in range(picks)].count(ev) / picks


def test_an_ev_many_rtts_slower_than_the_best_loses_its_share_while_it_stays_slow():
    """Delay counts in the best EV's RTTs: a few tens of microseconds against 10 us (a degraded
    link) take the share down to a few percent; half an RTT above the best costs nothing; at
    1 ms against 0.1 ms the same ratio does the same (no fixed threshold that a dilated clock
    never reaches); back at the others' RTT, the EV earns its share back."""
    for base in (10_000, 100_000):  # 10 us and 100 us paths: the same ratios, the same shares
        profile = EvProfile(list(range(8)))
        for ev in range(8):
            profile.on_rtt(ev, base)
        assert _share_of(profile, 3) == 1 / 8
        for _ in range(40):
            profile.on_rtt(3, int(1.4 * base))  # within half an RTT of the best: no cost
        assert _share_of(profile, 3) == 1 / 8
        for _ in range(40):
            profile.on_rtt(3, 24 * base)  # a degraded EV: 237 us against 10 us
        assert _share_of(profile, 3) <= 0.02
        for _ in range(40):
            profile.on_rtt(3, base)  # the degrade is lifted
        assert _share_of(profile, 3) == 1 / 8


def test_pick_avoids_the_previous_ev_of_a_retransmission():
    profile = EvProfile([0, 1, 2, 3])
    for avoid in [0, 1, 2, 3] * 50:
        assert profile.pick(avoid) != avoid
    alone = EvProfile([0, 1])
    alone.deny(1, 0)
    assert alone.pick(0) == 0  # the only EV left carries the retransmission all the same


def test_assumed_bad_evs_stand_in_when_nothing_is_good():
    profile = EvProfile([0, 1, 2, 3])
    profile.set_state(0, EvState.ASSUMED_BAD, 0, "test")
    profile.set_state(1, EvState.ASSUMED_BAD, 0, "test")
    profile.deny(2, 0)
    profile.deny(3, 0)
    assert profile.good() == []
    assert {profile.pick() for _ in range(50)} == {0, 1}  # never the DENIED 2 and 3


def test_denied_evs_never_carry_data_even_when_every_ev_is_denied():
    profile = EvProfile([0, 1, 2])
    for ev in (0, 1, 2):
        profile.deny(ev, 0)
    assert profile.stalled and profile.schedule_at()[0] == []
    profile.allow(1, 5)
    assert not profile.stalled and profile.evs[1].state is EvState.ASSUMED_BAD
    assert {profile.pick() for _ in range(20)} == {1}


def _pair(size: int):
    config = QpConfig(mtu=1024)
    responder = Responder(DST, config, random_bits=random.Random(1).getrandbits)
    buffer = bytearray(size)
    mr = responder.register(buffer)
    responder.accept(0x22, 0x11, 0, PATHS.back)
    requester = Requester(SRC, 0x11, 0x22, PATHS.forward, config,
                          random_bits=random.Random(2).getrandbits)
    return requester, responder, mr, buffer


def test_a_requester_sends_nothing_on_denied_evs():
    requester, responder, mr, buffer = _pair(200_000)
    for ev in (0, 2, 5):
        requester.profile.deny(ev, 0)
    data = os.urandom(len(buffer))
    requester.post_write(data, mr.va, mr.rkey)
    assert MemoryNetwork(0).run([requester, responder], lambda: requester.done)
    assert buffer == data
    assert [requester.profile.evs[ev].packets_sent for ev in (0, 2, 5)] == [0, 0, 0]


def test_a_requester_with_every_ev_denied_stalls_until_one_is_allowed():
    """It sends no data and says so (`stalled`); its WRITE waits, and completes once the
    controller allows an EV again (ASSUMED_BAD first: a probe must pass before it is GOOD)."""
    requester, responder, mr, buffer = _pair(50_000)
    for ev in requester.profile.evs:
        requester.profile.deny(ev, 0)
    data = os.urandom(len(buffer))
    requester.post_write(data, mr.va, mr.rkey)
    net = MemoryNetwork(0)
    sent: list[int] = []  # the EV of every frame either side sends
    carry = net.send

    def send(frame, path) -> bool:
        sent.append(path.ev)
        return carry(frame, path)

    net.send = send
    assert not net.run([requester, responder], lambda: requester.done)  # nothing left to happen
    assert sent == [] and requester.stalled and requester.summary()["stalled"]
    assert requester.error is None and not requester.completions
    requester.profile.allow(3, net.now)
    assert net.run([requester, responder], lambda: requester.done)
    assert buffer == data and not requester.stalled
    assert set(sent) == {3}
    assert requester.profile.evs[3].state is EvState.GOOD and requester.prober.probes_returned >= 1


def test_ce_marks_move_the_ecn_ewma_per_packet_and_the_weight():
    profile = EvProfile([0, 1])
    profile.on_ecn(0, 32, 32)
    assert profile.evs[0].ecn == 1 - (1 - 1 / 16) ** 32 and profile.evs[0].ce_marks == 32
    profile.on_ecn(0, 0, 32)  # 32 clean packets: it decays as much
    assert profile.evs[0].ecn < 0.2
    profile.on_ecn(1, 16, 32)
    assert 0 < profile.evs[1].ecn < 0.5 and profile.weight(1, 0.0) < profile.weight(0, 0.0) < 1


def test_a_fabric_trim_cuts_the_weight_at_once_and_deliveries_earn_it_back():
    profile = EvProfile([0, 1, 2], bad_after_losses=3)
    for _ in range(50):  # far more trims than losses it takes to be ASSUMED_BAD: still GOOD
        profile.on_trimmed(1, last_hop=False, ce=False)
    assert all(s.state is EvState.GOOD for s in profile.evs.values()) and profile.evs[1].packets_lost == 0
    cut = profile.weight(1, 0.0)
    assert cut < 0.1 * profile.weight(0, 0.0)
    schedule, _ = profile.schedule_at()
    assert schedule.count(1) < schedule.count(0)
    profile.on_delivered(1, 100, 200)
    assert profile.weight(1, 0.0) > 0.9 * profile.weight(0, 0.0)


def test_a_last_hop_trim_is_only_an_ecn_echo():
    profile = EvProfile([0, 1])
    profile.on_trimmed(0, last_hop=True, ce=True)
    profile.on_trimmed(1, last_hop=True, ce=False)
    assert profile.evs[0].trim == profile.evs[1].trim == 0 and profile.evs[0].ecn > 0 == profile.evs[1].ecn


def test_an_evs_delay_is_judged_against_its_own_planes_best():
    """A queue every EV of a plane shares (the receiver's port on it) moves only the plane balance's
    part of its share between planes; one slow EV of a plane (a degraded link on its way) loses its
    share to its siblings. Against the best EV of all planes, plane 1's EVs would all have lost
    most of theirs."""
    from mrc_emu.transport.multipath.ev import EvProfile as Profile
    from mrc_emu.transport.multipath.weights import PLANE_BALANCE_GAIN

    profile = Profile([0, 1, 2, 3, 4, 5])
    profile.planes = {0: 0, 1: 0, 2: 0, 3: 1, 4: 1, 5: 1}
    srtts = {0: 100_000, 1: 100_000, 2: 100_000, 3: 300_000, 4: 300_000, 5: 900_000}
    for ev, rtt in srtts.items():
        for _ in range(64):
            profile.on_rtt(ev, rtt)
    schedule, _ = profile.schedule_at()
    counts = {ev: schedule.count(ev) for ev in srtts}
    assert counts[0] == counts[1] == counts[2] and counts[3] == counts[4]
    # plane 1's shared queue, its best EV at 3 RTTs of plane 0's: 1 / (1 + 0.5 x 2) of the share
    assert counts[3] == counts[0] / (1 + PLANE_BALANCE_GAIN * 2)
    assert counts[5] == 1 and counts[3] > 4 * counts[5]  # the slow one of plane 1: one slot, its floor
    profile.planes = {}
    profile._dirty = True
    schedule, _ = profile.schedule_at()
    assert schedule.count(3) < schedule.count(0) / 4  # judged against every plane's best, as before


def test_ecn_marks_are_judged_against_the_least_marked_ev_of_the_same_plane():
    """The receiver's port on a plane marks every EV of that plane alike: no share moves between the
    planes (against every EV, plane 1 would lose its share and, sending little, keep its marks:
    measured, h0's planes at 0.85 and 0.45 of their rate in a 2-to-1 incast). One EV marked more
    than its plane's siblings (a hot link on its own way) still loses its share."""
    from mrc_emu.transport.multipath.ev import EvProfile as Profile

    profile = Profile([0, 1, 2, 3, 4, 5])
    profile.planes = {0: 0, 1: 0, 2: 0, 3: 1, 4: 1, 5: 1}
    for ev, marked in {0: 2, 1: 2, 2: 2, 3: 12, 4: 12, 5: 28}.items():
        profile.on_ecn(ev, marked, 32)
    schedule, _ = profile.schedule_at()
    counts = {ev: schedule.count(ev) for ev in range(6)}
    assert counts[0] == counts[1] == counts[2] == counts[3] == counts[4]  # plane 1's last hop: no shift
    assert counts[5] < counts[3] / 2
    profile.planes = {}
    profile._dirty = True
    schedule, _ = profile.schedule_at()
    assert schedule.count(3) < schedule.count(0) * 0.75  # against every EV, as before: plane 1 loses


def test_an_ev_far_slower_than_every_planes_best_loses_its_share_even_among_slow_siblings():
    """Delay is judged within a plane, but beyond CROSS_PLANE_RTTS of the best EV of all planes it
    costs weight too: a degraded EV whose sibling is slow as well (a delay on its link) still
    gives up its share to the other plane (gray-failure: 0.15-0.28 of the packets without this)."""
    from mrc_emu.transport.multipath.ev import EvProfile as Profile
    from mrc_emu.transport.multipath.weights import CROSS_PLANE_RTTS

    profile = Profile([0, 1, 2, 3])
    profile.planes = {0: 0, 1: 0, 2: 1, 3: 1}
    for ev, rtt in {0: 1_200_000, 1: 1_000_000, 2: 300_000, 3: 300_000}.items():
        for _ in range(64):
            profile.on_rtt(ev, rtt)
    schedule, _ = profile.schedule_at()
    assert 1_000_000 / 300_000 - 1 > CROSS_PLANE_RTTS
    assert schedule.count(0) < schedule.count(2) / 4 and schedule.count(1) < schedule.count(2) / 2
    for ev in (0, 1):  # 1.4 best RTTs over the other plane's: within the allowance, only the planes' balance
        for _ in range(64):
            profile.on_rtt(ev, 420_000)
    profile._dirty = True
    schedule, _ = profile.schedule_at()
    assert schedule.count(0) == schedule.count(1) and schedule.count(2) == schedule.count(3)
    assert 0.75 < schedule.count(0) / schedule.count(2) < 1  # 1 / (1 + 0.5 x 0.4), in whole slots


def test_the_planes_queues_are_drawn_together_gently_and_the_share_comes_back_when_they_are_even():
    """Two planes into one receiver, each its own last hop: the plane whose best EV is slower (a
    longer queue at its port) gives up a share in proportion to its delay over the other plane's
    (PLANE_BALANCE_GAIN), and no more; with the planes even again every EV's share is equal. Before,
    a queue a plane's EVs shared moved nothing under two RTTs apart, and a 16-to-1 incast's two last
    hops random-walked to 28 and 42 KB (docs/congestion.md)."""
    from mrc_emu.transport.multipath.ev import EvProfile as Profile

    profile = Profile([0, 1, 2, 3])
    profile.planes = {0: 0, 1: 0, 2: 1, 3: 1}

    def settle(rtts: dict[int, int]) -> dict[int, int]:
        for ev, rtt in rtts.items():
            for _ in range(64):
                profile.on_rtt(ev, rtt)
        profile._dirty = True
        schedule, _ = profile.schedule_at()
        return {ev: schedule.count(ev) for ev in rtts}

    counts = settle({0: 1_100_000, 1: 1_150_000, 2: 700_000, 3: 720_000})  # plane 0: 1.57 times plane 1
    assert counts[0] == counts[1] < counts[2] == counts[3]
    assert counts[0] + counts[1] >= 0.7 * (counts[2] + counts[3])  # a lean, not a flight: 1 / 1.29
    counts = settle({0: 700_000, 1: 720_000, 2: 700_000, 3: 720_000})
    assert counts[0] == counts[1] == counts[2] == counts[3]


def test_congestion_signals_fade_with_time_and_the_schedule_follows_without_a_cycle_ending():
    """A QP sending a packet or two per RTT learns little about an EV it gave up for a fabric trim:
    its trim EWMA halves every FADE_RTTS of the EV's smallest RTTs, and the schedule is rebuilt
    every REWEIGH_RTTS of them even if none of its cycles ended. Its ECN EWMA does not fade."""
    from mrc_emu.transport.multipath import weights
    from mrc_emu.transport.multipath.ev import EvProfile as Profile

    profile = Profile([0, 1, 2, 3])
    profile.planes = {0: 0, 1: 0, 2: 1, 3: 1}
    for ev in range(4):
        profile.on_rtt(ev, 100_000)
    profile.sync(1_000_000)
    profile.on_trimmed(1, last_hop=False, ce=False)  # a spine's trim: EV 1 loses most of its share
    profile.on_ecn(2, 8, 8)
    schedule, _ = profile.schedule_at()
    assert schedule.count(1) < schedule.count(0) / 2
    trim = profile.evs[1].trim
    later = 1_000_000 + weights.FADE_RTTS * 100_000  # one half-life on, no packet sent meanwhile
    profile.sync(later)
    assert later >= 1_000_000 + weights.REWEIGH_RTTS * 100_000
    schedule, _ = profile.schedule_at()  # due by time alone
    assert profile.evs[1].trim == pytest.approx(trim / 2) and profile.evs[2].ecn == 1 - (1 - 1 / 16) ** 8
    profile.sync(later + 10 * weights.FADE_RTTS * 100_000)
    schedule, _ = profile.schedule_at()
    assert schedule.count(1) == schedule.count(0) > schedule.count(2)  # its share back, ten half-lives on
