"""MRC's controller on a real fabric: a maintenance drain around a switch reboot, a port disabled
mid-transfer, a deny from the shell reaching a running WRITE (root)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import wait_for
from test_transport_system import MiB, _run_in_thread

from mrc_emu.experiments.analysis import report
from mrc_emu.experiments.runtime.controller import ControlRecord
from mrc_emu.experiments.scenarios import runner, scenario

pytestmark = pytest.mark.system
CLI = [sys.executable, "-m", "mrc_emu.cli"]


def _shipped(name: str, size: str) -> scenario.Scenario:
    scn = scenario.load(name)
    for w in scn.workloads:
        w.size = scenario.parse_size(size)
    return scn


def _no_losses(transfer: dict) -> None:
    assert transfer["verified"] and transfer["sha256_placed"] == transfer["sha256_source"]
    assert transfer["requester"]["stats"]["retransmits"] == 0
    assert all(e["packets_lost"] == 0 and e["retransmits_sent"] == 0 for e in transfer["per_ev"]), transfer["per_ev"]


def test_maintenance_drain_around_a_spine_reboot_loses_nothing(tmp_path):
    scn = _shipped("drain", "384MiB")
    results = runner.run(scn, tmp_path)
    t = results["runs"]["mrc"]["transfers"][0]
    _no_losses(t)
    steps = {f["kind"]: f["events"] for f in results["runs"]["mrc"]["faults"]}
    reboot_up = next(e for e in steps["switch-reboot"] if e["action"] == "reboot-up")
    assert steps["drain"][0]["at_ms"] < steps["switch-reboot"][0]["began_ms"]
    assert reboot_up["returned_ms"] < steps["undrain"][0]["at_ms"], "the reboot must be over before the undrain"
    # the drained EV (the only one through p0s1) carried nothing between drain and undrain ...
    deny, allow = t["ev_ops"]
    assert deny["deny"] == [1] and allow["allow"] == [1]
    assert allow["sent"]["1"] == deny["sent"]["1"] > 0
    assert all(allow["sent"][k] > deny["sent"][k] for k in allow["sent"] if k != "1")  # the others did
    assert report.controller_rows(t)[1][-1] == "EV 1: 0"
    # ... and carried data again after it (probed first)
    per_ev = {e["ev"]: e for e in t["per_ev"]}
    assert per_ev[1]["packets_sent"] > allow["sent"]["1"] and per_ev[1]["state"] == "GOOD"
    assert [(e["old"], e["new"]) for e in t["ev_events"] if e["ev"] == 1] == [
        ("GOOD", "DENIED"), ("DENIED", "ASSUMED_BAD"), ("ASSUMED_BAD", "GOOD")]
    assert t["drained_at_fault"] == [1] and t["fault_figures"] is None  # the reboot hit nothing in use


def test_port_disable_mid_transfer_stops_its_evs_at_once_without_a_resend(tmp_path):
    results = runner.run(_shipped("port-disable", "96MiB"), tmp_path)
    t = results["runs"]["mrc"]["transfers"][0]
    _no_losses(t)
    off, on = t["ev_ops"]
    assert off["deny"] == [4, 5, 6, 7] and on["allow"] == [4, 5, 6, 7] and off["reason"] == "h0 port(s) 2 disabled"
    # the host controller's port admin state followed: query_port(2) read DISABLED, then ENABLED
    assert {int(k): v for k, v in off["port_admin"].items()} == {1: "ENABLED", 2: "DISABLED"}
    assert {int(k): v for k, v in on["port_admin"].items()} == {1: "ENABLED", 2: "ENABLED"}
    for ev in ("4", "5", "6", "7"):
        assert on["sent"][ev] == off["sent"][ev] > 0  # nothing on the port's EVs while it was disabled
    assert all(on["sent"][ev] > off["sent"][ev] for ev in ("0", "1", "2", "3"))
    assert "h0 port 2 (plane 1)" not in results["notes"]  # no complaint: this is no fault


def test_a_deny_from_the_shell_reaches_a_running_write(default_fabric):
    fabric = default_fabric
    control, box, thread = _run_in_thread(fabric=fabric, src="h0", dst="h2", size=256 * MiB, dilation=3.0)
    wait_for(lambda: control.progress > 0.2 or "error" in box, 60, "the WRITE to be under way")
    done = subprocess.run(CLI + ["ev", "deny", "--link", "p1l0", "p1s2", "--name", fabric.name],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and "p1l0-p1s2: denied" in done.stdout, done.stderr
    thread.join(120)
    result = box["result"]
    assert result.verified and result.requester["stats"]["retransmits"] == 0
    (op,) = result.ev_ops
    assert op["deny"] == [6] and 0 < op["time_ms"] and op["sent"]["6"] > 0
    assert next(e for e in result.per_ev if e["ev"] == 6)["packets_sent"] == op["sent"]["6"]  # nothing after the deny
    listed = subprocess.run(CLI + ["ev", "list", "--src", "h0", "--dst", "h2", "--json", "--name", fabric.name],
                            capture_output=True, text=True, timeout=30)
    assert '"why": "p1l0-p1s2 (by cli)"' in listed.stdout
    assert ControlRecord(fabric).state().rules  # kept for later transfers, until allowed
