"""The exact fault figures (experiments/analysis/metrics.py fault_figures) from a requester's ledger (transport/ledger.py)."""

from __future__ import annotations

from types import SimpleNamespace

from mrc_emu.experiments.analysis import metrics
from mrc_emu.transport.ledger import GAP_NS, Ledger

MS = 1_000_000


def _pkt(psn: int, ev: int, sent: int):
    return SimpleNamespace(psn=psn, ev=ev, sent_ns=sent)


def test_the_ledger_keeps_gaps_and_each_lost_packets_repair_once():
    ledger = Ledger()
    ledger.started(0)
    ledger.progressed(GAP_NS // 2)  # the ACK clock: no gap
    ledger.progressed(5 * MS)  # 4.95 ms with nothing acknowledged
    pkt = _pkt(7, 3, 4 * MS)
    ledger.lost(pkt, 6 * MS)
    pkt.ev, pkt.sent_ns = 1, 6 * MS  # resent on EV 1 ...
    ledger.lost(pkt, 7 * MS)  # ... and lost again: still the first loss's repair
    pkt.ev, pkt.sent_ns = 2, 7 * MS
    ledger.delivered({7: pkt}, 8 * MS)  # still waiting
    ledger.delivered({}, 9 * MS)
    got = ledger.to_dict()
    assert got["gaps"] == [[GAP_NS // 2, 5 * MS]]
    assert got["repairs"] == [[3, 4 * MS, 6 * MS, 7 * MS, 9 * MS]]  # lost on EV 3; the copy sent at 7 ms got through
    assert got["unrepaired"] == [] and got["last_progress"] == 5 * MS


def _events(*pairs):
    return [{"time_ms": t, "ev": ev} for t, ev in pairs]


def test_mrc_detection_is_the_first_event_on_an_ev_through_the_fault():
    ledger = {"gaps": [[99 * MS, 101 * MS]], "repairs": [[1, 99 * MS, 100 * MS, 100 * MS + 200_000, 101 * MS]],
              "unrepaired": [], "last_progress": 150 * MS}
    # an event on EV 5 (not through the fault) comes first and does not count; one before the fault neither
    got = metrics.fault_figures(ledger, _events((50, 1), (100.3, 5), (100.5, 1)), 100 * MS, 150 * MS, 150 * MS, {1, 2})
    assert got == {"detection_ms": 0.5, "stall_ms": 1.0, "repair_ms": 1.0, "lost_on_failed_path": 1}


def test_the_baselines_detection_is_its_first_resend_after_the_fault_that_got_through():
    ledger = {"gaps": [[100 * MS, 1_400 * MS]],
              "repairs": [[0, 10 * MS, 20 * MS, 21 * MS, 22 * MS],  # an old loss: before the fault
                          [0, 99 * MS, 133 * MS, 1_300 * MS, 1_400 * MS], [0, 99 * MS, 133 * MS, 1_300 * MS, 1_401 * MS]],
              "unrepaired": [], "last_progress": 1_500 * MS}
    got = metrics.fault_figures(ledger, [], 100 * MS, 1_600 * MS, 1_600 * MS, None)
    assert got["detection_ms"] == 1_200.0 and got["stall_ms"] == 1_300.0 and got["repair_ms"] == 1_301.0


def test_no_detection_no_loss_and_a_transfer_that_never_completed():
    nothing = {"gaps": [], "repairs": [], "unrepaired": [], "last_progress": 90 * MS}
    got = metrics.fault_figures(nothing, [], 100 * MS, None, 400 * MS, {0})
    assert got["detection_ms"] is None and got["repair_ms"] == 0  # nothing lost on the failed path
    assert got["stall_ms"] == 300.0  # it stopped before the fault and never went on: stalled to the end
    lost = {**nothing, "unrepaired": [[0, 99 * MS, 120 * MS]]}
    assert metrics.fault_figures(lost, [], 100 * MS, None, 400 * MS, {0})["repair_ms"] is None  # never repaired


def test_the_noise_band_is_the_spread_of_the_window_on_a_steady_run():
    steady = [(t * MS, t * 125_000) for t in range(0, 300)]  # 1 Gbit/s, exactly
    assert metrics.noise_band(steady, 100 * MS) == {"p5": 1.0, "p95": 1.0, "windows": 99}
    wobbly = [(t * MS, t * 125_000 + (60_000 if t % 4 == 0 else 0)) for t in range(0, 300)]
    band = metrics.noise_band(wobbly, 100 * MS)
    assert band["p5"] < 0.9 and band["p95"] > 1.1
    assert metrics.noise_band(steady, 0) is None  # no stretch before it to compare with


def test_a_run_that_never_recovered_is_counted_not_dropped():
    assert metrics.across_runs([3.0, None, 1.0]) == {"runs": [3.0, None, 1.0], "median": 3.0, "never": 1,
                                                     "min": 1.0, "max": 3.0}
    assert metrics.across_runs([None, None, 1.0])["median"] is None  # most runs never got there
    assert metrics.across_runs([])["median"] is None
