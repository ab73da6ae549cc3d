"""Congestion control alone: events in, window out; profiles found by name; UEC NSCC's test vectors."""

from __future__ import annotations

import pytest

from mrc_emu.transport.cc import registry as cc_module
from mrc_emu.transport.cc.base import CongestionControl
from mrc_emu.transport.cc.fixed import FixedWindow
from mrc_emu.transport.cc.nscc import DEFAULT_MAX_CWND, DELAY_GAIN, QA_THRESHOLD_OFF, Nscc, NsccParams, max_wnd_for
from mrc_emu.transport.cc.registry import CC_PROFILES, make_cc, profile_names

US = 1000
BASE = 12 * US  # NSCC.md §10: 100 Gb/s at both ends, config_base_rtt 12 us, trimming on, MTU 4096


def vector_cc(**state) -> Nscc:
    """NSCC.md §10's set-up: cwnd 150 000, QA not eligible, no receiver penalty, period started at 0."""
    cc = Nscc(mtu=4096, link_rate_bps=100e9, base_rtt_ns=BASE)
    cc.cwnd = 150_000.0
    cc.inflight = 200_000
    cc.last_adjust_time = cc.last_dec_time = 0
    cc.qa_endtime = 10**12  # far ahead: quick adapt is not eligible
    for key, value in state.items():
        assert hasattr(cc, key), key
        setattr(cc, key, value)
    return cc


def ack(cc: Nscc, now: int, delay: int | None, ecn: bool = False, nbytes: int = 4096, **kw) -> None:
    cc.on_acked(now, 0, nbytes, None if delay is None else BASE + delay, 0.0, ecn, **kw)


def before_update(avg_after: float, sample: float) -> float:
    """The avg_delay that the EWMA turns into `avg_after` with this one-packet sample: the
    vectors give avg as the multiplicative decrease reads it, after OnACK's update_delay."""
    return (avg_after - DELAY_GAIN * sample) / (1 - DELAY_GAIN)


def test_the_parameters_derive_from_link_rate_base_rtt_and_mtu():
    p = vector_cc().p
    assert (p.target_delay, p.fi, p.eta, p.fi_scale, p.max_cwnd, p.adjust_bytes_threshold) == (
        9 * US, pytest.approx(20_480), pytest.approx(614.4), pytest.approx(0.25), 225_000, 32_768)
    assert (p.gamma, p.max_md_jump, p.qa_gate, p.adjust_period_threshold, p.qa_threshold) == (0.8, 0.5, 3, BASE, QA_THRESHOLD_OFF)
    no_trim = Nscc(mtu=4096, link_rate_bps=100e9, base_rtt_ns=BASE, trimming=False).p
    assert (no_trim.target_delay, no_trim.qa_threshold) == (BASE, 4 * BASE)
    fresh = Nscc(mtu=4096, link_rate_bps=100e9, base_rtt_ns=BASE)
    assert fresh.cwnd == fresh.max_wnd == 225_000  # MaxWnd is also the initial window


def test_without_a_link_rate_the_window_is_the_emulators_and_ocp_fields_override():
    cc = make_cc("nscc", 4096)
    assert cc.cwnd == cc.max_wnd == cc.p.max_cwnd == DEFAULT_MAX_CWND
    given = make_cc("nscc", 4096, 100e9, BASE, gamma=0.5, max_cwnd=300_000, disable_qa=True)
    assert (given.p.gamma, given.cwnd, given.p.disable_qa, given.p.fi) == (0.5, 300_000, True, pytest.approx(20_480))
    assert Nscc(NsccParams(target_delay=5 * US), mtu=4096).p.target_delay == 5 * US


def test_vector_01_proportional_increase_is_batched():
    cc = vector_cc()
    ack(cc, 1 * US, 3 * US)
    assert cc.inc_bytes == pytest.approx(33_554_432, rel=1e-12) and cc.cwnd == 150_000


def test_vector_02_fulfil_on_bytes():
    cc = vector_cc(received_bytes=30_000)  # this ACK takes it past 32 768; the period has not elapsed
    ack(cc, 1 * US, 3 * US)
    assert cc.cwnd == pytest.approx(150_000 + 33_554_432 / 150_000) == pytest.approx(150_223.70, abs=0.005)
    assert cc.inc_bytes == 0 and cc.received_bytes == 0


def test_vector_03_fair_increase_and_eta_when_the_period_elapsed():
    cc = vector_cc()
    ack(cc, 12 * US, 10 * US)
    assert cc.cwnd == pytest.approx(150_000 + 20_480 * 4096 / 150_000 + 614.4) == pytest.approx(151_173.64, abs=0.005)
    assert cc.last_adjust_time == 12 * US


def test_vector_04_ecn_without_delay_changes_nothing_but_counters():
    cc = vector_cc()
    ack(cc, 1 * US, 3 * US, ecn=True)
    assert cc.cwnd == 150_000 and cc.inc_bytes == 0 and cc.received_bytes == 4096 and cc.decreases == 0


@pytest.mark.parametrize("avg_us, expected", [(18, 90_000), (90, 75_000)])  # vectors 5 and 6 (factor 0.28 clamped to 0.5)
def test_vectors_05_06_multiplicative_decrease(avg_us, expected):
    cc = vector_cc(avg_delay=before_update(avg_us * US, 10 * US), last_adjust_time=19 * US)
    ack(cc, 20 * US, 10 * US, ecn=True)  # the last cut 20 us ago
    assert cc.avg_delay == pytest.approx(avg_us * US)
    assert cc.cwnd == pytest.approx(expected) and cc.last_dec_time == 20 * US and cc.decreases == 1


@pytest.mark.parametrize("state", [{"last_dec_time": 15 * US, "avg_delay": before_update(18 * US, 10 * US)},
                                   {"avg_delay": before_update(9 * US, 10 * US)}], ids=["cut-within-base-rtt", "avg-at-target"])
def test_vector_07_no_cut_but_fast_increase_state_cleared(state):
    cc = vector_cc(increase_mode=True, fi_count=50_000, last_adjust_time=19 * US, **state)
    ack(cc, 20 * US, 10 * US, ecn=True)
    assert cc.cwnd == 150_000 and not cc.increase_mode and cc.fi_count == 0 and cc.decreases == 0


@pytest.mark.parametrize("cwnd, expected", [(150_000, 151_024), (224_500, 225_000)])
def test_vector_08_fast_increase_is_immediate_and_capped(cwnd, expected):
    cc = vector_cc(cwnd=float(cwnd), fi_count=cwnd)  # this ACK takes fi_count past cwnd
    ack(cc, 1 * US, 500)
    assert cc.cwnd == expected and cc.increase_mode and cc.inc_bytes == 0


def test_vector_09_a_trim_after_the_first_period_quick_adapts():
    cc = vector_cc(qa_endtime=5 * US, achieved_bytes=20_000, inflight=100_000, inc_bytes=1e6, received_bytes=10_000)
    cc.on_trimmed(10 * US, 0, 4136, 0.0)
    assert cc.cwnd == 20_000 and cc.bytes_to_ignore == 100_000 - 4136 and cc.bytes_ignored == 0
    assert cc.inc_bytes == 0 and cc.received_bytes == 0 and cc.qa_endtime == 10 * US + 21 * US and not cc.trigger_qa


def test_vector_10_a_trim_within_the_period_takes_its_bytes_and_arms_quick_adapt():
    cc = vector_cc(qa_endtime=15 * US, achieved_bytes=0)
    cc.on_trimmed(10 * US, 0, 4136, 0.0)
    assert cc.cwnd == 145_864 and cc.trigger_qa
    ack(cc, 14 * US, 3 * US)  # before qa_endtime: no quick adapt yet (a fulfilled increase instead)
    assert cc.trigger_qa and cc.cwnd > 145_864
    ack(cc, 16 * US, 3 * US)  # the first eligible ACK: the window becomes what was delivered in the period
    assert cc.cwnd == 8192 and not cc.trigger_qa


def test_quick_adapt_acts_only_after_its_period_ends():
    """uet-htsim's quick_adapt tests `now > _qa_endtime` (UEC's pseudo-code `>=`): an ACK at the
    period's very end is still inside it; the next one measures what the period delivered and
    starts the next period, base_rtt + target long."""
    cc = vector_cc(qa_endtime=15 * US, achieved_bytes=0, trigger_qa=True)
    ack(cc, 15 * US, 3 * US)
    assert cc.trigger_qa and cc.qa_endtime == 15 * US and cc.cwnd >= 150_000
    ack(cc, 15 * US + 1, 3 * US)
    assert cc.cwnd == 2 * 4096 and not cc.trigger_qa and cc.qa_endtime == 15 * US + 1 + BASE + 9 * US


def test_vector_11_a_trim_in_the_ignore_phase_moves_nothing():
    cc = vector_cc(bytes_to_ignore=100_000, bytes_ignored=0, qa_endtime=5 * US, achieved_bytes=0)
    cc.on_trimmed(10 * US, 0, 4136, 0.0)
    assert cc.cwnd == 150_000 and cc.bytes_ignored == 4136


@pytest.mark.parametrize("rccc, expected", [(True, 150_000), (False, 145_864)])
def test_vector_12_a_last_hop_trim_with_rccc_on_only_feeds_the_delay(rccc, expected):
    cc = vector_cc(rccc=rccc, qa_endtime=15 * US)
    cc.on_trimmed(10 * US, 0, 4136, 0.0, last_hop=True)
    assert cc.cwnd == expected and cc.avg_delay == pytest.approx(DELAY_GAIN * 12 * US)
    assert cc.trigger_qa is not rccc


def test_vector_13_the_receivers_penalty_caps_the_window_and_blocks_increase():
    cc = vector_cc(inflight=100_000 + 4096)  # 100 000 once this ACK is counted (OnACK step 1)
    ack(cc, 1 * US, 3 * US, rcv_cwnd_pend=64)
    assert cc.saved_cwnd == 150_000 and cc.cwnd == 97_952 and cc.inc_bytes == 0
    ack(cc, 2 * US, 3 * US, restore_cwnd=True)
    assert cc.cwnd == 150_000 and cc.saved_cwnd == 0


def test_vector_14_a_smaller_rtt_is_the_new_base_rtt_and_rescales_max_wnd():
    cc = vector_cc()
    cc.on_acked(1 * US, 0, 4096, 10 * US, 0.0, False)
    assert cc.base_rtt == 10 * US and cc.max_wnd == pytest.approx(187_500)
    given = Nscc(mtu=4096, link_rate_bps=100e9, base_rtt_ns=BASE, max_cwnd=225_000)
    given.on_acked(1 * US, 0, 4096, 10 * US, 0.0, False)
    assert given.base_rtt == 10 * US and given.max_wnd == 225_000  # a max_cwnd given is kept


def test_vector_15_the_very_first_trim_cannot_quick_adapt():
    cc = vector_cc(qa_endtime=0, achieved_bytes=0)
    cc.on_trimmed(10 * US, 0, 4136, 0.0)
    assert cc.cwnd == 145_864 and cc.qa_endtime == 31 * US and cc.trigger_qa


@pytest.mark.parametrize("event", ["on_lost", "on_timeout"])
def test_vector_16_a_loss_or_timeout_takes_its_bytes_never_below_an_mtu(event):
    cc = vector_cc()
    getattr(cc, event)(1 * US, 0, 4136, 0.0, True)
    assert cc.cwnd == 145_864 and cc.inflight == 200_000 - 4136 and cc.bytes_ignored == 4136
    small = vector_cc(cwnd=5000.0)
    getattr(small, event)(1 * US, 0, 4136, 0.0, True)
    assert small.cwnd == 4096


# ---- NSCC's behaviour over many events ----------------------------------------------------


@pytest.mark.parametrize("event", ["on_lost", "on_timeout"])
def test_a_loss_on_a_failing_path_is_not_congestion(event):
    cc = vector_cc()
    getattr(cc, event)(1 * US, 0, 4136, 0.0, False)  # one of a run on a failing EV: the EV states handle it
    assert cc.cwnd == 150_000 and cc.inflight == 200_000 - 4136


def test_ecn_with_delay_cuts_at_most_once_per_base_rtt():
    cc = Nscc(mtu=4096, link_rate_bps=100e9, base_rtt_ns=BASE)
    cc.on_sent(0, 0, 200_000)
    cuts = []
    for now in range(1 * US, 200 * US, 1 * US):
        before = cc.cwnd
        ack(cc, now, 40 * US, ecn=True, nbytes=16_384)
        if cc.cwnd < before:
            cuts.append(now)
    assert len(cuts) >= 5 and cc.decreases >= len(cuts)  # (cuts at the one-MTU floor count, but move nothing)
    assert all(later - earlier > BASE for earlier, later in zip(cuts, cuts[1:], strict=False))


def test_delay_without_ecn_increases_fairly():
    """A queue without a mark is another EV's queue or the path's: UEC adds fi per window, it does not cut."""
    cc = vector_cc(cwnd=100_000.0)
    for i in range(1, 10):  # 9 ACKs of 4 KiB, 40 us of queueing each: the 9th passes 32 KiB and fulfils
        ack(cc, i * US, 40 * US)
    assert cc.cwnd == pytest.approx(100_000 + 9 * cc.p.fi * 4096 / 100_000) and cc.decreases == 0
    for i in range(10, 100):
        ack(cc, i * US, 40 * US)
    assert cc.cwnd > 110_000 and cc.decreases == 0


def test_an_ack_without_a_valid_sample_decides_on_the_average_delay():
    """uet-htsim (uec.cpp processAck): an ACK with no valid RTT sample takes avg_delay as its delay
    and runs the rest of OnACK (UEC's pseudo-code stops after the counters): marked, with the
    average over target, it cuts (vector 5's numbers); the average itself is not fed."""
    cc = vector_cc(avg_delay=18 * US, last_adjust_time=19 * US)
    ack(cc, 20 * US, None, ecn=True)
    assert cc.cwnd == pytest.approx(90_000) and cc.decreases == 1 and cc.avg_delay == 18 * US
    assert cc.inflight == 200_000 - 4096 and cc.received_bytes == 4096
    calm = vector_cc(avg_delay=3 * US, last_adjust_time=19 * US)
    ack(calm, 20 * US, None)  # unmarked, average under target: a proportional increase, batched
    assert calm.inc_bytes == pytest.approx(calm.alpha * 4096 * 6 * US) and calm.cwnd == 150_000


def test_cuts_follow_the_current_base_rtt_not_the_configured_one():
    """The gate is base_rtt as it stands (uec.cpp: now - _last_dec_time > _base_rtt), so after a
    10 us sample two cuts may come 11 us apart under a 12 us config_base_rtt."""
    cc = vector_cc(last_adjust_time=19 * US)
    cc.on_acked(1 * US, 0, 0, 10 * US, 0.0, False)  # base_rtt 10 us
    for now in (20 * US, 31 * US):
        cc.avg_delay = before_update(18 * US, 10 * US)
        cc.on_acked(now, 0, 4096, 20 * US, 0.0, True)  # 10 us of queueing, marked
    assert cc.base_rtt == 10 * US and cc.decreases == 2 and cc.last_dec_time == 31 * US


def test_quick_adapt_cannot_fire_in_the_first_window():
    """Without trimming a delay above qa_threshold arms quick adapt, but qa_endtime starts at 0:
    the first window only starts the period; the first ACK after it may collapse the window."""
    cc = Nscc(mtu=4096, link_rate_bps=100e9, base_rtt_ns=BASE, trimming=False)
    huge = 10 * cc.p.qa_threshold
    ack(cc, 1 * US, huge)
    assert cc.cwnd == 225_000 and cc.qa_endtime == 1 * US + BASE + BASE  # base_rtt + target (1.0 base_rtt)
    ack(cc, 10 * US, huge)  # still within the first period
    assert cc.cwnd == 225_000
    ack(cc, 26 * US, huge)  # the period is over and it delivered 8 KiB < max_wnd >> 3
    assert cc.cwnd == 2 * 4096 and cc.decreases == 1  # what the period's ACKs delivered (the first one only started it)
    assert cc.bytes_to_ignore == cc.inflight and cc.bytes_ignored == 0


def test_marks_on_what_was_in_flight_at_a_quick_adapt_are_ignored():
    cc = vector_cc(qa_endtime=5 * US, achieved_bytes=20_000, inflight=100_000)
    cc.on_trimmed(10 * US, 0, 4136, 0.0)
    assert cc.cwnd == 20_000
    ack(cc, 40 * US, 40 * US, ecn=True, nbytes=8192)  # ECN and delay, but part of what was already in flight
    assert cc.cwnd == 20_000 and cc.decreases == 1


def test_near_zero_delay_turns_into_fast_increase_after_a_window():
    cc = vector_cc(cwnd=40_000.0)
    now = 0
    while not cc.increase_mode and now < 100 * US:  # a window's worth of ACKs with a delay of about zero
        now += 100
        before = cc.fi_count
        ack(cc, now, 200)
    assert cc.increase_mode and before + 4096 > cc.cwnd - 1024
    grown = cc.cwnd
    ack(cc, now + 100, 200)
    assert cc.cwnd == min(grown + 1024, cc.max_wnd)  # fast increase: at once, n * fi_scale
    ack(cc, now + 200, 5 * US)  # delay back: fast increase ends
    assert not cc.increase_mode and cc.fi_count == 0


def test_inflight_follows_sends_and_acknowledgements():
    cc = make_cc("nscc", 4096)
    cc.on_sent(0, 0, 3 * 4096)
    cc.on_acked(1, 0, 4096, 50 * US, 0.0, False)
    assert cc.inflight == 2 * 4096
    cc.on_acked(2, 0, 5 * 4096, 50 * US, 0.0, False)  # more than is in flight (an ACK of a packet declared lost)
    assert cc.inflight == 0


def test_fixed_window_never_moves():
    cc = make_cc("fixed", 1024, window=64 * 1024)
    assert isinstance(cc, FixedWindow) and cc.cwnd == 64 * 1024
    cc.on_sent(0, 0, 1024)
    cc.on_acked(0, 0, 4096, 10 * US, 10 * US, True)
    cc.on_lost(0, 0, 1024, 10_000 * US, True)
    cc.on_trimmed(0, 0, 1024, 10 * US, last_hop=True)
    cc.on_timeout(0, 0, 1024, 10_000 * US, True)
    cc.on_cnp(0)
    cc.advance(10**9)
    assert cc.cwnd == 64 * 1024 and cc.pacing_rate_bps is None and cc.next_timer() is None


def test_profiles_are_found_by_name():
    assert profile_names() == list(CC_PROFILES) and {"nscc", "fixed"} <= set(profile_names())
    built = make_cc("nscc", 2048)
    assert isinstance(built, Nscc) and built.mtu == 2048 and built.name == "nscc"
    assert "dcqcn" in profile_names()
    with pytest.raises(ValueError, match="unknown CC profile 'cubic' .*nscc"):
        make_cc("cubic", 1024)


def test_a_registered_profile_is_offered_and_each_name_is_taken_once(monkeypatch):
    monkeypatch.setattr(cc_module, "CC_PROFILES", dict(CC_PROFILES))

    @cc_module.register
    class Halving(FixedWindow):
        name = "halving"

        def on_lost(self, now, ev, nbytes, srtt_ns, congestion):
            self.cwnd /= 2

    assert "halving" in cc_module.profile_names()
    built = cc_module.make_cc("halving", 1024, window=1000)
    built.on_lost(0, 0, 1024, 0.0, True)
    assert built.cwnd == 500
    with pytest.raises(ValueError, match="registered twice"):
        cc_module.register(Halving)


def test_a_profile_must_handle_every_event():
    class Partial(CongestionControl):
        name = "partial"

        def on_sent(self, now, ev, nbytes): ...
        def on_acked(self, now, ev, nbytes, rtt_ns, srtt_ns, ecn): ...
        def on_lost(self, now, ev, nbytes, srtt_ns, congestion): ...
        def on_timeout(self, now, ev, nbytes, srtt_ns, congestion): ...

    with pytest.raises(TypeError, match="on_trimmed"):
        Partial()


def test_a_tiny_rtt_sample_never_takes_max_wnd_under_one_packet():
    """An idle shaped port passes a frame unserialized (5 us on the incast fabric): UEC's rescale,
    max_wnd = 1.5 link x rtt, would be 375 B at 400 Mbit/s, a window no packet fits in."""
    cc = Nscc(mtu=4096, link_rate_bps=400e6, base_rtt_ns=1_000_000)
    cc.on_acked(0, 0, 4096, 5_000, 0.0, False)
    assert cc.base_rtt == 5_000 and cc.max_wnd == 4096 and cc.cwnd == 4096


def test_uecs_scaling_factor_can_come_from_one_planes_link_while_maxwnd_covers_the_nic():
    # a NIC of two 400 Mbit/s planes: uet-htsim scales NSCC by its link speed (initNsccParams), and
    # MRC's MaxWnd covers the NIC; the NIC's rate as the scale gave every increase twice htsim's
    nic = make_cc("nscc", 4096, 800e6, 366_000)
    plane = make_cc("nscc", 4096, 800e6, 366_000, scale_rate_bps=400e6)
    assert plane.max_wnd == nic.max_wnd == max_wnd_for(800e6, 366_000)
    assert plane.p.fi == nic.p.fi / 2 and plane.p.eta == nic.p.eta / 2 and plane.p.fi_scale == nic.p.fi_scale / 2
    assert plane.alpha == pytest.approx(nic.alpha / 2)
    assert plane.p.fi == 5 * 4096 * (400e6 / 8 * 366e-6) / 150_000  # a = one link's BDP / UEC's reference BDP


def test_no_rtt_sample_takes_the_base_rtt_under_its_floor():
    # an emulated port's token bucket lets an idle path's first frame through unserialised: an 8 us
    # sample on a path whose packets take 361 us to serialise must not become the base RTT (a QP
    # whose base fell to it read every later delay 360 us too long and cut deeper than its peers)
    floored = make_cc("nscc", 4096, 800e6, 366_000, base_rtt_floor_ns=361_000)
    free = make_cc("nscc", 4096, 800e6, 366_000)
    for cc in (floored, free):
        cc.on_sent(0, 0, 4096)
        cc.on_acked(10_000, 0, 4096, 8_000, 8_000.0, False)
    assert floored.base_rtt == 361_000 and free.base_rtt == 8_000
    floored.on_sent(20_000, 0, 4096)
    floored.on_acked(400_000, 0, 4096, 350_000, 350_000.0, False)  # under the floor too: no change
    assert floored.base_rtt == 361_000


def test_nscc_adds_back_the_serialisation_a_token_bucket_fabric_leaves_out_of_its_samples():
    # on `incast` a sample over a path whose one busy port is the last hop lacks every other hop's
    # serialisation (275 us: TBF passes a frame through an idle port at once). Samples of 500 us
    # over a 366 us base RTT are a queue 409 us deep, over the 274.5 us target: a marked ACK cuts.
    # Read raw they say 134 us, under the target, and a marked ACK changes nothing
    unseen = 274_920
    told = make_cc("nscc", 4096, 800e6, 366_000, unseen_ns=unseen)
    raw = make_cc("nscc", 4096, 800e6, 366_000)
    for cc in (told, raw):
        for i in range(200):  # unmarked: the delay average follows the samples
            cc.on_sent(i * 100_000, 0, 4096)
            cc.on_acked(i * 100_000 + 50_000, 0, 4096, 500_000, 500_000.0, False)
        cc.cwnd = 40_000.0
        cc.on_sent(20_000_000, 0, 4096)
        cc.on_acked(20_500_000, 0, 4096, 500_000, 500_000.0, True)
        assert cc.base_rtt == 366_000  # no sample went under it
    assert told.avg_delay == pytest.approx(408_920 * (1 - (1 - 0.0125) ** 201))
    assert told.avg_delay > told.p.target_delay and told.cwnd < 0.9 * 40_000  # cut (x0.78)
    assert raw.avg_delay < raw.p.target_delay and raw.cwnd >= 40_000  # untouched (the batched increase aside)
