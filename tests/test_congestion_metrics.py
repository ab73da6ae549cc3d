"""The congestion figures (experiments/analysis/congestion.py) on hand-made inputs: no fabric, no root."""

from types import SimpleNamespace

import pytest

from mrc_emu.experiments.analysis import congestion as cg


def test_jain_is_one_for_equal_shares_and_one_over_n_for_one_taker():
    assert cg.jain([2.0, 2.0, 2.0, 2.0]) == pytest.approx(1.0)
    assert cg.jain([8.0, 0.0, 0.0, 0.0]) == pytest.approx(0.25)
    assert cg.jain([1.0, 3.0]) == pytest.approx(16 / 20)
    assert cg.jain([]) is None


def test_utilisation_of_a_link_full_for_a_second():
    assert cg.utilisation(50_000_000, 1_000_000_000, 400e6) == pytest.approx(1.0)
    assert cg.utilisation(1, 0, 400e6) is None


def _result(size, start_ms, end_ms, ok=True, stats=None):
    span = (end_ms - start_ms) / 1e3
    return SimpleNamespace(ok=ok, verified=ok, size=size, start_ns=int(start_ms * 1e6), end_ns=int(end_ms * 1e6),
                           completion_ms=end_ms - start_ms, goodput_gbps=size * 8 / span / 1e9,
                           requester={"stats": stats or {"timeouts": 0, "retransmits": 1}}, ev_events=[])


def test_flows_add_up_a_run():
    results = [_result(1_000_000, 0, 10), _result(1_000_000, 0, 20, stats={"timeouts": 2, "retransmits": 3,
                                                                          "trim_nacks": 4})]
    f = cg.flows(results)
    assert f["flows"] == 2 and f["verified"] == 2
    assert f["span_ms"] == 20.0
    assert f["aggregate_goodput_gbps"] == pytest.approx(2_000_000 * 8 / 20e6, rel=1e-3)
    assert f["jain"] == pytest.approx(cg.jain([0.8, 0.4]), rel=1e-3)
    assert f["fct_ms"]["p99"] == 20.0 and f["fct_ms"]["p50"] == 10.0
    assert (f["timeouts"], f["retransmits"], f["trim_nacks"]) == (2, 4, 4)


def test_a_failed_flow_adds_no_bytes_and_its_fct_is_never():
    """What did not arrive is not goodput; a flow that never finished is slower than every other."""
    failed = _result(1_000_000, 0, 20, ok=False)
    failed.completion_ms = None
    results = [_result(1_000_000, 0, 10), _result(1_000_000, 0, 12), failed]
    f = cg.flows(results)
    assert f["verified"] == 2 and f["unfinished"] == 1
    assert f["aggregate_goodput_gbps"] == pytest.approx(2_000_000 * 8 / 20e6, rel=1e-3)  # the failed one's span counts
    assert f["fct_ms"] == {"p50": 12.0, "p99": None, "max": None}  # p99 and max fall on the never
    assert f["jain"] == pytest.approx(cg.jain([0.8, 0.8 / 1.2, 0.0]), rel=1e-3)
    # placed but not verified (the bytes differ): it completed, and still counts for nothing
    wrong = _result(1_000_000, 0, 5)
    wrong.verified = False
    assert cg.flows([_result(1_000_000, 0, 10), wrong])["fct_ms"]["max"] is None
    assert cg.aggregate_goodput_gbps([wrong]) == 0


def test_port_figures_from_a_delta_of_the_port_counters():
    counters = {"bytes": 25_000_000, "packets": 6000, "ce_marked": 40, "trimmed": 3, "dropped": 0,
                "queue_p50": 4096, "queue_p99": 32768, "max_queue": 65536}
    f = cg.port_figures(counters, 1_000_000_000, 400e6, sent_bytes=20_000_000)
    assert f["utilisation"] == pytest.approx(0.4)  # what TBF sent, not what the program passed
    assert (f["ce_marked"], f["trimmed"], f["dropped"]) == (40, 3, 0)
    assert f["queue_bytes"] == {"p50": 4096, "p99": 32768, "max": 65536}


def test_bottleneck_utilisation_is_the_mean_of_its_ports():
    ports = {"a": {"utilisation": cg.port_utilisation(50_000_000, 1_000_000_000, 400e6)},
             "b": {"utilisation": cg.port_utilisation(25_000_000, 1_000_000_000, 400e6)}, "c": {"utilisation": None}}
    assert cg.bottleneck_utilisation(ports) == pytest.approx(0.75)
    assert cg.bottleneck_utilisation({}) is None
