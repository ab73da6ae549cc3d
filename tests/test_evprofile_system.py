"""A transfer on an OCP EV profile over the fabric's SRv6 uSID plan (root): the shipped GEN profile's
short carriers fc00:0:<spine>:<dst>:f0d6:: are routed by the fabric and carry a verified WRITE."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mrc_emu.api.files import load
from mrc_emu.experiments.runtime.transfer import send
from mrc_emu.topology import evs_between

pytestmark = pytest.mark.system
CLI = [sys.executable, "-m", "mrc_emu.cli"]
MiB = 1024 * 1024
GEN = Path(__file__).parent.parent / "mrc_emu" / "topologies" / "ev-profiles" / "default-h0-h2-gen.yaml"




def test_8mib_on_the_gen_profile_verified_over_every_short_carrier(default_fabric):
    topo = default_fabric.topology
    result = send(default_fabric, "h0", "h2", 8 * MiB, ev_profile=load(GEN))
    assert result.verified, result.error
    assert result.ev_profile == str(GEN) and result.evs == list(range(8))
    long_carriers = {ev.usid_carrier for ev in evs_between(topo, "h0", "h2")}
    spines = set()
    for entry in result.per_ev:
        spine_id = topo.node(entry["spine"]).node_id
        assert entry["packets_sent"] > 0 and entry["state"] == "GOOD", entry
        assert entry["first_hop"] == f"fc00:0:{spine_id:x}:3:f0d6::" and entry["first_hop"] not in long_carriers
        spines.add((entry["plane"], entry["spine"]))
    assert spines == {(ev.plane, ev.spine) for ev in evs_between(topo, "h0", "h2")}
    assert sum(e["packets_sent"] for e in result.per_ev) >= 8 * MiB // result.mtu
    # what carried them: h0 routes the spine's /48 up its plane, the spine routes h2's /48 down to h2's leaf
    up = subprocess.run(["ip", "-n", f"{default_fabric.name}-h0", "-6", "route", "show", "fc00:0:d::/48"],
                        capture_output=True, text=True, check=True).stdout
    down = subprocess.run(["ip", "-n", f"{default_fabric.name}-p1s0", "-6", "route", "show", "fc00:0:3::/48"],
                          capture_output=True, text=True, check=True).stdout
    assert "dev h0-eth1" in up and "dev p1s0-eth1" in down, (up, down)  # plane 1's uplink; p1s0's link to p1l1


def test_send_ev_profile_on_the_command_line(default_fabric):
    done = subprocess.run(CLI + ["send", "h0", "h2", "-n", default_fabric.name, "--size", "1MiB", "--ev-profile", str(GEN)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"EV profile {GEN}: 8 EVs" in done.stdout and "MATCH" in done.stdout
    done = subprocess.run(CLI + ["send", "h0", "h2", "-n", default_fabric.name, "--size", "1MiB", "--ev-profile", str(GEN),
                                 "--json"], capture_output=True, text=True, timeout=120)
    out = json.loads(done.stdout)
    assert done.returncode == 0 and out["verified"] and out["ev_profile"] == str(GEN) and len(out["per_ev"]) == 8
    wrong = subprocess.run(CLI + ["send", "h0", "h3", "-n", default_fabric.name, "--size", "1MiB", "--ev-profile", str(GEN)],
                           capture_output=True, text=True, timeout=120)
    assert wrong.returncode == 1
    assert wrong.stderr.strip() == (f"mrc-emu: error: {GEN}: EV 0: fc00:0:9:3:f0d6:: ends at node h2 (0x3), "
                                    "not the destination h3 (0x4)")


def test_the_exp_example_mixes_short_and_long_carriers_verified(default_fabric):
    topo = default_fabric.topology
    result = send(default_fabric, "h0", "h2", 2 * MiB, ev_profile=str(GEN.with_name("default-h0-h2-exp.yaml")))
    assert result.verified, result.error
    fabric = evs_between(topo, "h0", "h2")
    assert [(e["spine"], e["first_hop"]) for e in result.per_ev] == [
        ("p0s0", "fc00:0:9:3:f0d6::"), ("p1s1", "fc00:0:e:3:f0d6::"),
        ("p0s2", fabric[2].usid_carrier), ("p1s3", fabric[7].usid_carrier)]
    assert all(e["packets_sent"] > 0 for e in result.per_ev)
