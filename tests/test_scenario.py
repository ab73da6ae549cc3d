"""Scenario files and reports without root: parsing, errors that name the field, the schema."""

import json

import jsonschema
import pytest

from mrc_emu.experiments.analysis import report
from mrc_emu.experiments.scenarios import scenario
from mrc_emu.experiments.scenarios.scenario import ScenarioError
from mrc_emu.experiments.scenarios.schema import RESULTS_SCHEMA


def test_every_shipped_scenario_loads():
    for name in ("demo", "link-down", "lossy-link", "collectives"):
        scn = scenario.load(name)
        assert scn.transfers() and scn.topology.name == "default"
    demo = scenario.load("demo")
    assert demo.transports == ["mrc", "baseline"] and demo.faults[0].link == "baseline-path"


def test_workload_patterns_expand_to_writes():
    hosts = ["h0", "h1", "h2", "h3"]
    assert len(scenario.Workload("all-to-all", 10, hosts=hosts).pairs()) == 12
    assert scenario.Workload("incast", 10, dst="h2", hosts=hosts).pairs() == [("h0", "h2", 10), ("h1", "h2", 10),
                                                                            ("h3", "h2", 10)]
    ring = scenario.Workload("ring-allreduce", 400, hosts=hosts).pairs()
    assert [(a, b) for a, b, _ in ring] == [("h0", "h1"), ("h1", "h2"), ("h2", "h3"), ("h3", "h0")]
    assert all(n == 2 * 3 * 100 for _, _, n in ring)  # 2(n-1) chunks of size/n each


@pytest.mark.parametrize("text, field, words", [
    ("workloads: []", "workloads", "at least one"),
    ("workloads:\n  - {kind: write, src: h0, dst: h9, size: 1MiB}", "workloads[0].dst", "not a host"),
    ("workloads:\n  - {kind: write, src: h0, dst: h0}", "workloads[0]", "same host"),
    ("workloads:\n  - {kind: teleport}", "workloads[0]", "kind"),
    ("workloads:\n  - {kind: write, src: h0, dst: h2, size: lots}", "workloads[0].size", "not a size"),
    ("workloads:\n  - {kind: write, src: h0, dst: h2}\nfaults:\n  - {kind: loss, link: [h0, h2], percent: 5}",
     "faults[0].link", "no link"),
    ("workloads:\n  - {kind: write, src: h0, dst: h2}\nfaults:\n  - {kind: loss, link: [p0l0, p0s1]}",
     "faults[0].percent", "percent"),
    ("workloads:\n  - {kind: write, src: h0, dst: h2}\nfaults:\n  - {kind: blackhole, link: [p0l0, p0s1], at: 2}",
     "faults[0].at", "0..0.99"),
    ("workloads:\n  - {kind: write, src: h0, dst: h2}\ntransports: [mrc, tcp]", "transports", "mrc"),
    ("workloads:\n  - {kind: write, src: h0, dst: h2}\nrouting: none", "routing", "baseline needs"),
    ("workloads:\n  - {kind: write, src: h0, dst: h2}\ntopology: nowhere", "topology", "no built-in topology"),
    ("workloads:\n  - {kind: write, src: h0, dst: h2}\ncolour: blue", "colour", "unknown field"),
    ("workloads:\n  - {kind: write, src: h0, dst: h2}\nmtu: 1002", "mtu", "multiple of 4"),
    ("workloads:\n  - {kind: write, src: h0, dst: h2}\nmtu: 9000", "mtu", "64..8192"),
])
def test_bad_scenarios_name_file_line_and_field(tmp_path, text, field, words):
    path = tmp_path / "bad.yaml"
    path.write_text("topology: default\n" + text + "\n")
    with pytest.raises(ScenarioError) as err:
        scenario.load(path)
    message = str(err.value)
    assert str(path) in message and f"field '{field}'" in message and words in message and "line" in message


def test_not_yaml_and_missing_file(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("workloads: [unclosed\n")
    with pytest.raises(ScenarioError, match="not valid YAML"):
        scenario.load(path)
    with pytest.raises(ScenarioError, match="no scenario file"):
        scenario.load("no-such-scenario")


def _fake_results() -> dict:
    transfer = {
        "src": "h0", "dst": "h2", "size": 4096, "ok": True, "verified": True, "error": None, "mtu": 4096,
        "sha256_source": "a" * 64, "sha256_placed": "a" * 64, "completion_ms": 10.0, "goodput_gbps": 1.0,
        "goodput_pps": 100, "offset_ms": 0.0, "ev_format": "SRV6", "label": "h0->h2",
        "per_ev": [{"ev": 0, "state": "GOOD", "share": 1.0, "packets_sent": 1, "plane": 0, "spine": "p0s0"}],
        "ev_events": [{"time_ms": 1.0, "ev": 0, "old": "GOOD", "new": "ASSUMED_BAD", "reason": "x", "rtt_ns": None}],
        "timeline": [[float(t), 400 * t] for t in range(12)],
        "ev_timeline": [[float(t), [t], [t]] for t in range(0, 12, 5)],
        "recovery": {"pre_fault_gbps": 1.0, "recovery_ms": 2.0, "worst_gbps": 0.0, "window_ms": 2, "level": 0.9},
        "requester": {"stats": {"retransmits": 1}}, "responder": {"stats": {}},
    }
    run = {"transport": "mrc", "ok": True, "verified": True, "completion_ms": 10.0, "goodput_gbps": 1.0,
           "recovery_ms": 2.0, "faults": [{"kind": "blackhole", "description": "blackhole p0l0-p0s1 at 30%",
                                            "events": [{"action": "xdp:1", "began_ms": 3.0, "returned_ms": 3.1}]}],
           "transfers": [transfer], "pcap": None}
    return {"schema": "mrc-emu/results/1",
            "scenario": {"name": "t", "topology": "default", "transports": ["mrc"], "workloads": [], "faults": []},
            "runs": {"mrc": run}, "notes": [], "seconds": 1.0}


def test_report_files_and_schema(tmp_path):
    results = _fake_results()
    files = report.write(results, tmp_path)
    written = json.loads((tmp_path / "results.json").read_text())
    jsonschema.validate(written, RESULTS_SCHEMA)
    assert set(files) >= {"results", "report", "goodput", "recovery", "spray_share"}
    assert (tmp_path / "goodput.png").stat().st_size > 10_000
    assert "![goodput](goodput.png)" in (tmp_path / "report.md").read_text()
    broken = dict(written, runs={"mrc": dict(written["runs"]["mrc"], recovery_ms="fast")})
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, RESULTS_SCHEMA)


def test_headline_compares_like_with_like():
    """Stall against stall, inflation against inflation, never a ratio over the metric's floor."""
    def runs(mrc_stall, base_stall, mrc_inf=None, base_inf=None):
        return {"runs": {"mrc": {"fault_figures": {"stall_ms": mrc_stall}, "inflation": mrc_inf},
                         "baseline": {"fault_figures": {"stall_ms": base_stall}, "inflation": base_inf}}}
    assert report.headline(runs(0.4, 1280.0, 0.04, 3.1)) == (
        "MRC stalled 0.4 ms, the baseline 1,280 ms; completion +4 % against +310 % (each against its fault-free run).")
    assert report.headline(runs(0.0, None)) == "MRC stalled 0.0 ms, the baseline never."
    assert report.headline({"runs": {"mrc": {"fault_figures": None}}}) is None


def test_a_path_failure_no_fault_caused_is_counted_and_the_run_is_never_faithful():
    from mrc_emu.experiments.scenarios import runner

    events = [{"ev": 1, "old": "GOOD", "new": "ASSUMED_BAD"}, {"ev": 3, "old": "GOOD", "new": "ASSUMED_BAD"},
              {"ev": 3, "old": "ASSUMED_BAD", "new": "GOOD"}, {"ev": 5, "old": "DENIED", "new": "ASSUMED_BAD"}]
    assert runner.false_ev_events(events, crossed={1}) == 1  # EV 3's; EV 5 was the controller's allow
    assert runner.false_ev_events(events, crossed=set()) == 2  # a fault-free run: every failure is false
    faithful = {"verdict": "faithful", "reasons": []}
    assert runner._with_false_events(dict(faithful), 0) == faithful
    marked = runner._with_false_events(dict(faithful), 2)
    assert marked["verdict"] == "emulator-bound" and marked["reasons"][0].startswith("2 EV event(s)")
