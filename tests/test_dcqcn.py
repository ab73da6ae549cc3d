"""DCQCN's reaction point alone: CNPs and time in, rate out (the paper model, FABRIC-CC.md §4)."""

from __future__ import annotations

import pytest

from mrc_emu.transport.cc.dcqcn import DEFAULT_WINDOW, MIN_WINDOW_PACKETS, Dcqcn, DcqcnParams
from mrc_emu.transport.cc.registry import make_cc

US = 1000
LINE = 400e6
K = T = 55 * US
G = 1 / 256


def dcqcn(**params) -> Dcqcn:
    """The paper model with uet-htsim's increase (T = 55 us, R_AI = line/20, R_HAI = line/10)."""
    return Dcqcn(DcqcnParams.uet_htsim(), 4096, LINE, **params)


def test_before_any_cnp_it_sends_at_line_rate_with_a_large_window():
    cc = dcqcn()
    assert cc.pacing_rate_bps == LINE and cc.cwnd == DEFAULT_WINDOW and cc.alpha == 1 and cc.next_timer() is None
    cc.on_acked(10**9, 0, 4096, 10 * US, 10 * US, True)  # an ECN echo is not a CNP
    cc.on_lost(10**9, 0, 4096, 10 * US, True)
    assert cc.pacing_rate_bps == LINE
    assert (cc.rate_ai, cc.rate_hai, cc.min_rate) == (LINE / 20, LINE / 10, LINE / 100)


def test_the_defaults_increase_with_hpccs_timer_and_steps():
    """By default the increase timer and steps are HPCC's NIC model's (1.5 ms, 5 and 50 Mbit/s),
    everything else uet-htsim's."""
    cc = make_cc("dcqcn", 4096, LINE)
    assert (cc.p.increase_timer_ns, cc.rate_ai, cc.rate_hai, cc.min_rate) == (1_500_000, 5e6, 50e6, LINE / 100)
    assert (cc.p.g, cc.p.alpha_timer_ns, cc.p.byte_counter, cc.p.fast_recovery_steps) == (G, K, 10_000_000, 5)
    cc.on_cnp(0)
    cc.on_cnp(0)  # RC 100, RT 200 (Mb/s)
    assert cc.next_timer() == 1_500_000
    cc.advance(5 * 1_500_000)  # five fast recovery steps
    assert cc.rc == pytest.approx(200e6 - 100e6 / 32) and cc.rt == 200e6
    cc.advance(6 * 1_500_000)  # then additive increase by 5 Mbit/s
    assert cc.rt == 205e6


def test_without_a_link_rate_it_does_not_pace_until_a_cnp():
    cc = make_cc("dcqcn", 4096)
    assert cc.pacing_rate_bps is None
    cc.on_cnp(0)
    assert cc.pacing_rate_bps == cc.line / 2


def test_one_cnp_halves_the_rate_and_keeps_the_target():
    cc = dcqcn()
    cc.on_cnp(1000)
    assert cc.rc == LINE / 2 and cc.rt == LINE and cc.alpha == pytest.approx((1 - G) * 1 + G)
    assert cc.pacing_rate_bps == LINE / 2 and cc.cnps == 1 and cc.next_timer() == 1000 + T
    cc.on_cnp(2000)  # a second CNP at once: the target is the rate it cut from
    assert cc.rt == LINE / 2 and cc.rc == LINE / 4  # α was 1 after the first (1 - g + g)


def test_alpha_decays_once_per_k_without_a_cnp():
    cc = dcqcn()
    cc.on_cnp(0)
    alpha = cc.alpha
    cc.advance(K - 1)
    assert cc.alpha == alpha
    cc.advance(10 * K)
    assert cc.alpha == pytest.approx(alpha * (1 - G) ** 10)
    cc.on_cnp(10 * K + 1)  # a CNP raises α again, from where it decayed to, then cuts by the raised α next time
    assert cc.alpha == pytest.approx((1 - G) * alpha * (1 - G) ** 10 + G)


def test_fast_recovery_then_additive_then_hyper_increase():
    cc = dcqcn(byte_counter=1_000_000)
    cc.on_cnp(0)  # RC 200, RT 400 (Mb/s)
    cc.on_cnp(0)  # RC 100, RT 200: the target is below the line, so the increases show
    rc, rt = cc.rc, cc.rt
    assert (rc, rt) == (LINE / 4, LINE / 2)
    for step in range(1, 6):  # T = 1..5: fast recovery, halfway to the target each time
        cc.advance(step * T)
        rc = (rt + rc) / 2
        assert (cc.t_count, cc.rc, cc.rt) == (step, pytest.approx(rc), rt)
    cc.advance(6 * T)  # T = 6 > F, BC = 0: additive increase
    rt += LINE / 20
    rc = (rt + rc) / 2
    assert (cc.rc, cc.rt) == (pytest.approx(rc), pytest.approx(rt))
    for bc in range(1, 7):  # the byte counter: BC = 1..5 are additive (min(T, BC) <= F), BC = 6 hyper
        cc.on_sent(6 * T, 0, 1_000_000)
        rt += LINE / 20 if bc <= 5 else (6 - 5) * LINE / 10
        rt = min(rt, LINE)
        rc = (rt + rc) / 2
        assert (cc.bc_count, cc.rc, cc.rt) == (bc, pytest.approx(rc), pytest.approx(rt))


def test_hyper_increase_grows_with_min_t_bc():
    cc = dcqcn(byte_counter=1_000_000)
    cc.on_cnp(0)
    cc.on_cnp(0)
    cc.on_cnp(0)  # RT 100, RC 50 Mb/s
    cc.t_count = cc.bc_count = 7
    rt, rc = cc.rt, cc.rc
    cc.on_sent(1, 0, 1_000_000)  # BC = 8, T = 7: hyper increase by (7 - 5) R_HAI
    assert cc.rt == pytest.approx(rt + 2 * LINE / 10) and cc.rc == pytest.approx((cc.rt + rc) / 2)


def test_the_rate_climbs_back_to_the_line_and_stops_there():
    cc = dcqcn()
    cc.on_cnp(0)
    cc.on_cnp(1)
    cc.on_cnp(2)
    cc.advance(10**9)  # a second of no CNP: caught up at once, capped at the line rate
    assert cc.rc == cc.rt == LINE and cc.pacing_rate_bps == LINE and cc.next_timer() is None
    assert cc.alpha < 1e-6
    cc.advance(2 * 10**9)
    assert cc.rc == LINE


def test_the_rate_never_falls_below_the_minimum():
    cc = dcqcn(min_rate_bps=10e6)
    for i in range(40):
        cc.on_cnp(i)
    assert cc.rc == 10e6


def test_parameters_are_checked_by_name():
    assert Dcqcn(DcqcnParams(line_rate_bps=1e9)).line == 1e9
    with pytest.raises(TypeError, match="no parameter 'beta'"):
        dcqcn(beta=1)


def test_with_a_base_rtt_the_window_is_one_bdp():
    """A go-back-N QP resends everything in flight after a loss: its window is one BDP of the
    fabric (line rate x base RTT), not the 2 MiB it keeps when the BDP is unknown."""
    assert make_cc("dcqcn", 4096, LINE, 1_000_000).cwnd == 50_000  # 400 Mbit/s x 1 ms
    assert make_cc("dcqcn", 4096, None, 1_000_000).cwnd == DEFAULT_WINDOW  # no line rate: no BDP
    assert make_cc("dcqcn", 4096, LINE, 10_000).cwnd == MIN_WINDOW_PACKETS * 4096  # 500 bytes: at least two packets
    assert make_cc("dcqcn", 4096, LINE, 1_000_000, window=300_000).cwnd == 300_000  # a window given wins
    cc = make_cc("dcqcn", 4096, LINE, 1_000_000)
    for i in range(40):
        cc.on_cnp(i)
    cc.advance(10**9)
    assert cc.cwnd == 50_000  # the rate moves, the window does not
