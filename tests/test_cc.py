"""Congestion control alone: events in, window out; profiles found by name."""

from __future__ import annotations

import pytest

from mrc_emu.transport import cc as cc_module
from mrc_emu.transport.cc import CC_PROFILES, CongestionControl, FixedWindow, Nscc, NsccParams, make_cc, profile_names

US = 1000


def nscc(**params) -> Nscc:
    return Nscc(NsccParams(**{"base_rtt_ns": 10 * US, "target_delay_ns": 50 * US, "initial_cwnd": 100_000, **params}),
                mtu=1024)


def test_nscc_shrinks_on_delay_and_grows_without():
    cc = nscc()
    start = cc.cwnd
    for i in range(10):
        cc.on_acked(i * 1000, 0, 4096, 12_000, 12_000, False)
    assert cc.cwnd > start
    grown = cc.cwnd
    cc.on_acked(20_000, 0, 4096, 500_000, 500_000, False)
    assert cc.cwnd < grown
    shrunk = cc.cwnd
    cc.on_acked(20_001, 0, 4096, 500_000, 500_000, False)  # at most one decrease per RTT
    assert cc.cwnd == shrunk


def test_nscc_growth_follows_the_equation():
    cc = nscc()
    cc.on_acked(0, 0, 4096, None, 30 * US, False)  # delay 20 us of the 50 us target
    assert cc.cwnd == pytest.approx(100_000 + 0.15 * 4096 * 30 / 50 + 1024 * 4096 / 100_000)


def test_nscc_reads_the_delay_of_the_ev_that_acknowledged():
    """Each event carries its EV's srtt: a queue on one EV shrinks the window, a clean EV grows it."""
    cc = nscc()
    cc.on_acked(0, 1, 4096, None, 15 * US, False)
    assert cc.cwnd > 100_000
    before = cc.cwnd
    cc.on_acked(1 * US, 2, 4096, None, 210 * US, False)  # EV 2: delay 200 us, four times the target
    assert cc.cwnd == pytest.approx(before * max(1 - 0.8 * 150 / 200, 0.5))


def test_nscc_ecn_and_trims_halve_the_window_once_per_rtt():
    cc = nscc()
    cc.on_acked(0, 0, 4096, None, 20 * US, True)
    assert cc.cwnd == 50_000
    cc.on_trimmed(10 * US, 0, 1024, 20 * US)  # within the RTT the decrease holds for
    assert cc.cwnd == 50_000
    cc.on_trimmed(25 * US, 0, 1024, 20 * US)
    assert cc.cwnd == 25_000 and cc.decreases == 2


@pytest.mark.parametrize("event", ["on_lost", "on_timeout"])
def test_nscc_shrinks_for_a_loss_only_when_it_is_congestion_with_a_queue(event):
    cc = nscc()
    getattr(cc, event)(0, 0, 1024, 20 * US, True)  # delay 10 us: no queue, a lossy path
    getattr(cc, event)(0, 0, 1024, 60 * US, False)  # a queue, but one of a run on a failing path
    assert cc.cwnd == 100_000
    getattr(cc, event)(0, 0, 1024, 60 * US, True)  # delay 50 us > target / 2
    assert cc.cwnd == 50_000


def test_nscc_learns_base_rtt_from_the_smallest_sample_and_stays_in_bounds():
    cc = Nscc(NsccParams(target_delay_ns=50 * US, initial_cwnd=8192, min_cwnd=4096, max_cwnd=16_384), mtu=1024)
    for rtt in (40 * US, 25 * US, 30 * US):
        cc.on_acked(0, 0, 0, rtt, rtt, False)
    assert cc.base_rtt == 25 * US
    for i in range(100):
        cc.on_acked(i, 0, 65_536, None, 25 * US, False)
    assert cc.cwnd == 16_384
    for i in range(20):
        cc.on_acked(i * 10_000 * US, 0, 0, None, 5000 * US, True)
    assert cc.cwnd == 4096


def test_fixed_window_never_moves():
    cc = make_cc("fixed", 1024, window=64 * 1024)
    assert isinstance(cc, FixedWindow) and cc.cwnd == 64 * 1024
    cc.on_sent(0, 0, 1024)
    cc.on_acked(0, 0, 4096, 10 * US, 10 * US, True)
    cc.on_lost(0, 0, 1024, 10_000 * US, True)
    cc.on_trimmed(0, 0, 1024, 10 * US)
    cc.on_timeout(0, 0, 1024, 10_000 * US, True)
    assert cc.cwnd == 64 * 1024


def test_profiles_are_found_by_name():
    assert profile_names() == list(CC_PROFILES) and {"nscc", "fixed"} <= set(profile_names())
    built = make_cc("nscc", 2048)
    assert isinstance(built, Nscc) and built.mtu == 2048 and built.name == "nscc"
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
