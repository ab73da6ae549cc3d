"""Scenarios for real: the demo (MRC against the BGP baseline), collectives, every fault kind (root)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import jsonschema
import pcap_reader
import pytest

from mrc_emu.experiments.analysis import report
from mrc_emu.experiments.scenarios import runner, scenario
from mrc_emu.experiments.scenarios.faults import FAULT_KINDS
from mrc_emu.experiments.scenarios.schema import RESULTS_SCHEMA
from mrc_emu.fabric import registry, routing
from mrc_emu.fabric.datapath import impair
from mrc_emu.fabric.kernel import netns

pytestmark = pytest.mark.system
CLI = [sys.executable, "-m", "mrc_emu.cli"]


def no_leftovers(fabric: str) -> bool:
    gone = not registry.journal_path(fabric).exists()
    return gone and not list(netns.NETNS_DIR.glob(f"{fabric}-*")) and not (registry.STATE_DIR / f"{fabric}-frr").exists()


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """One run of `mrc-emu demo --json`: its exit, its stderr, its folder and results."""
    if routing.frr_missing() is not None:
        pytest.skip(str(routing.frr_missing()))
    out = tmp_path_factory.mktemp("demo") / "demo"
    # about a minute here; the timeout only guards against a hang, and a VM under TCG takes ten times as long
    done = subprocess.run(CLI + ["demo", "--out", str(out), "--json"], capture_output=True, text=True, timeout=1800)
    results = json.loads((out / "results.json").read_text()) if (out / "results.json").exists() else None
    return done, out, results


@pytest.mark.slow
def test_demo_runs_both_transports_through_the_fault(demo):
    """The demo end to end. Its headline figure (MRC recovering at least 100x faster) is a speed
    target, so scripts/bench.py measures it (median of runs); here: what it must do and show.
    It exits 0 when both transfers are verified, whatever the pcaps (the next test)."""
    done, out, results = demo
    assert done.returncode == 0, done.stderr[-2000:]
    jsonschema.validate(results, RESULTS_SCHEMA)
    mrc, base = results["runs"]["mrc"], results["runs"]["baseline"]
    for run in (mrc, base):
        assert run["verified"] and run["transfers"][0]["sha256_placed"] == run["transfers"][0]["sha256_source"]
        assert run["completion_ms"] is not None
    assert mrc["recovery_ms"] is not None
    print(f"\nrecovery: MRC {mrc['recovery_ms']} ms, baseline {base['recovery_ms']} ms; "
          f"completion {mrc['completion_ms']} / {base['completion_ms']} ms")
    # the fault really hit the baseline's flow: it stalled completely until BGP rerouted it
    assert base["transfers"][0]["requester"]["stats"]["retransmits"] > 0
    assert base["transfers"][0]["recovery"]["worst_gbps"] == 0.0
    assert base["recovery_ms"] is None or base["recovery_ms"] > mrc["recovery_ms"]  # None: not back at 90 % by the end
    # and MRC's endpoints marked the EV over it ASSUMED_BAD
    assert any(e["new"] == "ASSUMED_BAD" for e in mrc["transfers"][0]["ev_events"])
    for name in ("goodput.png", "spray_share.png", "recovery.png", "report.md", "mrc.pcap", "baseline.pcap"):
        assert (out / name).stat().st_size > 1000, name
    assert no_leftovers(results["fabric"])


@pytest.mark.slow
def test_demo_pcaps_are_complete_or_the_report_says_why(demo):
    """Each pcap comes from a separate run of its transport, captured whole; a capture that lost
    packets even at its slowest run is said in report.md, the notes and on stderr, never silently."""
    done, out, results = demo
    assert results is not None, done.stderr[-2000:]
    report_md = (out / "report.md").read_text()
    assert report_md.count("made in a separate run of the same scenario at time dilation") == 2
    for transport in ("mrc", "baseline"):
        run = results["runs"][transport]
        cap = run["capture"]
        assert cap["run"] == "separate" and cap["verified"] and run["pcap"] == cap["path"]
        assert cap["time_dilation"] >= results["scenario"]["time_dilation"]
        if cap["complete"]:
            assert cap["packets"] == pcap_reader.count(out / f"{transport}.pcap") >= 128 * 2**20 // 4096
        else:
            assert f"**pcap ({transport}) INCOMPLETE**" in report_md and cap["problem"] in report_md
            assert f"mrc-emu: warning: {transport}'s pcap is incomplete" in done.stderr
            assert any(note.startswith(f"{transport}'s pcap is INCOMPLETE") for note in results["notes"])
    if shutil.which("tshark"):
        # a whole window of WRITEs leaves before the first ACK is back: look past it (on a loaded
        # machine the first ACK came after more than 200 WRITEs)
        shown = subprocess.run(["tshark", "-r", str(out / "mrc.pcap"), "-c", "5000", "-Y", "infiniband"],
                               capture_output=True, text=True, timeout=120)
        assert "RDMA Write Only" in shown.stdout and "Acknowledge" in shown.stdout, shown.stdout[:2000]


@pytest.mark.slow
def test_collectives_with_switch_reboot(tmp_path):
    scn = scenario.load("collectives")
    results = runner.run(scn, tmp_path)
    run = results["runs"]["mrc"]
    assert len(run["transfers"]) == 7  # incast (3) + ring (4), posted as each source has made its bytes
    assert run["verified"], [t["error"] for t in run["transfers"]]
    assert sorted((t["src"], t["dst"]) for t in run["transfers"]) == sorted((s, d) for s, d, _ in scn.transfers())
    events = run["faults"][0]["events"]
    assert [e["action"] for e in events] == ["reboot-down", "reboot-up"]
    assert events[1]["began_ms"] - events[0]["began_ms"] >= 300
    assert no_leftovers(results["fabric"])


@pytest.mark.slow
def test_every_fault_kind_in_one_scenario(tmp_path):
    # the default fabric with a link rate: a degrade needs one to take a fraction of
    (tmp_path / "shaped.yaml").write_text("name: default-1g\nplanes: 2\nspines_per_plane: 4\nleaves_per_plane: 2\n"
                                          "hosts_per_leaf: 2\nmtu: 9000\nlink_rate: 1gbit\n")
    path = tmp_path / "all.yaml"
    path.write_text("""
topology: shaped.yaml
transports: [mrc]
routing: none
workloads:
  - {kind: write, src: h0, dst: h2, size: 96MiB}
  - {kind: write, src: h1, dst: h3, size: 32MiB}
faults:
  - {kind: loss, link: [p0l1, p0s0], percent: 20, at: 0.05, duration_ms: 200}
  - {kind: flap, link: [p0l0, p0s2], at: 0.1, period_ms: 40, count: 2}
  - {kind: plane-down, host: h0, plane: 1, at: 0.2, duration_ms: 150}
  - {kind: link-down, link: [p0l0, p0s1], at: 0.3}
  - {kind: blackhole, link: [p0l1, p0s3], at: 0.4}
  - {kind: congestion, link: [p0l0, p0s0], at: 0.2, flows: 1, size: 8MiB}
  - {kind: switch-reboot, node: p1s3, at: 0.5, duration_ms: 100}
  - {kind: degrade, link: [p1l0, p1s1], rate: 0.5, at: 0.1, duration_ms: 200}
  - {kind: delay, link: [p1l1, p1s2], ms: 2, at: 0.2, direction: p1s2->p1l1}
  - {kind: drain, link: [p1l1, p1s0], at: 0.15}
  - {kind: undrain, link: [p1l1, p1s0], at: 0.6}
  - {kind: port-disable, host: h1, plane: 0, at: 0.25}
  - {kind: port-enable, host: h1, plane: 0, at: 0.45}
""")
    scn = scenario.load(path)
    results = runner.run(scn, tmp_path / "out")
    report.write(results, tmp_path / "out")
    jsonschema.validate(json.loads((tmp_path / "out" / "results.json").read_text()), RESULTS_SCHEMA)
    run = results["runs"]["mrc"]
    assert run["verified"], [t["error"] for t in run["transfers"]]
    assert len(run["transfers"]) == 3  # two WRITEs and one competing flow
    (competing,) = [t for t in run["transfers"] if t["label"].startswith("competing flow")]
    assert competing["label"].endswith("over p0l0-p0s0") and competing["offset_ms"] > 0  # started at 20 %, not at once
    assert {f["kind"] for f in run["faults"]} == set(FAULT_KINDS)
    kinds = {f["kind"]: [e["action"] for e in f["events"]] for f in run["faults"]}
    assert kinds["loss"] == ["xdp:0.2", "xdp-off"] and kinds["blackhole"][0] == "xdp:1"
    assert kinds["flap"] == ["flap"] and kinds["plane-down"] == ["down", "restore"]
    assert kinds["switch-reboot"] == ["reboot-down", "reboot-up"]
    assert kinds["degrade"] == ["rate:0.5", "rate:1"]
    assert kinds["delay"] == ([] if impair.netem_missing() else ["delay:2ms", "delay-off"])
    assert [kinds[k] for k in ("drain", "undrain", "port-disable", "port-enable")] == [
        ["drain"], ["undrain"], ["port-disable"], ["port-enable"]]  # the controller's steps, carried out by the QPs
    bad = {e["ev"] for t in run["transfers"] for e in t["ev_events"] if e["new"] == "ASSUMED_BAD"}
    assert bad, "no EV was marked ASSUMED_BAD under six faults"
    assert no_leftovers(results["fabric"])
