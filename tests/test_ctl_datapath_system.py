"""The controller drives the data path on a real fabric (issue 27, root): a REPLACE_EV from the shell
re-paths a running WRITE's EV, EV probes of any EV value through the hosts' endpoints, and EV
events followed while the WRITE runs."""

from __future__ import annotations

import ipaddress
import json
import subprocess
import sys
import threading

import pytest
from conftest import wait_for
from test_transport_system import MiB, _run_in_thread

from mrc_emu.fabric import links
from mrc_emu.topology import addressing as ad
from mrc_emu.topology import evs_between

pytestmark = pytest.mark.system
CLI = [sys.executable, "-m", "mrc_emu.cli"]


def _tx_packets(fabric, node: str, intf: str) -> int:
    out = subprocess.run(["ip", "-n", f"{fabric.name}-{node}", "-j", "-s", "link", "show", "dev", intf],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)[0]["stats64"]["tx"]["packets"]


def _towards(fabric, node: str, peer: str) -> str:
    """`node`'s interface towards `peer` (a spine's towards p0l1: its egress for h0 -> h2's data)."""
    (link,) = fabric.topology.links_between(node, peer)
    return link.a_intf if link.a == node else link.b_intf


def test_ev_replace_from_the_shell_moves_a_running_writes_ev_to_another_spine(default_fabric):
    """1 GiB h0 -> h2 on `default` (a WRITE that outlasts two CLI calls here): `ev replace h0 h2 --ev 1`
    with EV 2's carrier (spine p0s2) under
    traffic. From then on p0s1's port towards p0l1 (h0 -> h2's data through it) sends nothing, p0s2's
    keeps sending, and the WRITE is verified; `ev probe` of the new value meanwhile is sent by the
    running transfer's workers (asked through the controller record)."""
    fabric = default_fabric
    evs = evs_between(fabric.topology, "h0", "h2")
    assert evs[1].spine == "p0s1" and evs[2].spine == "p0s2"
    p0s1, p0s2 = _towards(fabric, "p0s1", "p0l1"), _towards(fabric, "p0s2", "p0l1")
    control, box, thread = _run_in_thread(fabric=fabric, src="h0", dst="h2", size=1024 * MiB, dilation=3.0)
    wait_for(lambda: control.progress > 0.15 or control.finished.is_set(), 60, "the WRITE to be under way")
    assert not control.finished.is_set(), box.get("error")
    before = _tx_packets(fabric, "p0s1", p0s1), _tx_packets(fabric, "p0s2", p0s2)
    done = subprocess.run(CLI + ["ev", "replace", "h0", "h2", "--ev", "1", "--value", evs[2].usid_carrier,
                                 "--name", fabric.name], capture_output=True, text=True, timeout=60)
    print("\n$ mrc-emu ev replace h0 h2 --ev 1 --value", evs[2].usid_carrier, "\n" + done.stdout.strip())
    assert done.returncode == 0 and "taken by 1 running QP" in done.stdout, done.stdout + done.stderr
    taken_at = control.progress
    after = _tx_packets(fabric, "p0s1", p0s1), _tx_packets(fabric, "p0s2", p0s2)
    # an EV probe of the new value while the WRITE runs: the run's workers serve h0 and h2, so it is asked of them
    probed = subprocess.run(CLI + ["ev", "probe", "h0", "h2", "--value", evs[2].usid_carrier, "--json",
                                   "--timeout", "1000", "--name", fabric.name], capture_output=True, text=True, timeout=60)
    assert probed.returncode == 0, probed.stderr
    answer = json.loads(probed.stdout)
    assert answer["via"] == "run" and answer["reachable"] and answer["adjusted_rtt_ns"] <= answer["rtt_ns"], answer
    wait_for(lambda: control.progress > taken_at + 0.2 or control.finished.is_set(), 120, "more of the WRITE")
    later = _tx_packets(fabric, "p0s1", p0s1), _tx_packets(fabric, "p0s2", p0s2)
    print(f"p0s1 -> p0l1 tx packets: {before[0]} before, {after[0]} when taken, {later[0]} later; "
          f"p0s2 -> p0l1: {before[1]}, {after[1]}, {later[1]}")
    assert after[0] > before[0] > 0  # p0s1 carried EV 1 until the replace ...
    assert later[0] - after[0] <= 3  # ... and nothing after it (a neighbour solicitation at most)
    assert later[1] - after[1] > 1000  # p0s2 carries EV 1 and EV 2 on
    thread.join(180)
    result = box["result"]
    assert result.verified, result.error
    (op,) = result.ev_ops
    assert op["replace"] == 1 and bytes.fromhex(op["value"]) == ipaddress.IPv6Address(evs[2].usid_carrier).packed
    per_ev = {e["ev"]: e for e in result.per_ev}
    assert per_ev[1]["packets_sent"] > op["sent"]["1"]  # EV 1 kept sending, on p0s2


def test_ev_probe_of_a_value_through_a_downed_link_is_unreachable(default_fabric):
    """`ev probe h0 h2 --value`: p0s2's carrier while p0l0-p0s2 is down comes back unreachable, p0s1's
    reachable with an RTT (corrected for h2's service time, adj_svc_time 1)."""
    fabric = default_fabric
    evs = evs_between(fabric.topology, "h0", "h2")
    links.set_state(fabric, "p0l0", "p0s2", False)
    try:
        # a generous rsp_timeout: a busy machine's endpoints answer in ms, not the fabric's us
        runs = {spine: subprocess.run(CLI + ["ev", "probe", "h0", "h2", "--value", evs[k].usid_carrier, "--json",
                                             "--timeout", "1000", "--name", fabric.name],
                                      capture_output=True, text=True, timeout=60)
                for spine, k in (("p0s2", 2), ("p0s1", 1))}
    finally:
        links.set_state(fabric, "p0l0", "p0s2", True)
    for spine, done in runs.items():
        print(f"\n$ mrc-emu ev probe h0 h2 --value {evs[2 if spine == 'p0s2' else 1].usid_carrier}\n{done.stdout}")
        assert done.returncode == 0, done.stderr
    down, up = (json.loads(runs[s].stdout) for s in ("p0s2", "p0s1"))
    assert down["reachable"] is False and "rtt_ns" not in down
    assert up["reachable"] is True and up["port"] == 1 and up["adj_svc_time"] == 1
    assert 0 < up["adjusted_rtt_ns"] <= up["rtt_ns"]


def test_ev_events_follow_prints_the_assumed_bad_event_before_the_write_ends(default_fabric):
    """`ev events --host h0 --follow` running beside a 256 MiB WRITE: the link p0l0-p0s1 taken down
    mid-WRITE makes EV 1 ASSUMED_BAD, and the follower prints that event while the WRITE still runs."""
    fabric = default_fabric
    follower = subprocess.Popen(CLI + ["ev", "events", "--host", "h0", "--follow", "--for", "300", "--json",
                                       "--name", fabric.name], stdout=subprocess.PIPE, text=True)
    seen: list[tuple[dict, bool]] = []  # (event, whether the WRITE had ended when it was printed)
    try:
        control, box, thread = _run_in_thread(fabric=fabric, src="h0", dst="h2", size=256 * MiB, dilation=3.0,
                                              linger_s=5.0)

        def read() -> None:
            for line in follower.stdout:
                seen.append((json.loads(line), control.finished.is_set()))

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        wait_for(lambda: control.progress > 0.15 or control.finished.is_set(), 60, "the WRITE to be under way")
        links.set_state(fabric, "p0l0", "p0s1", False)
        try:
            wait_for(lambda: any(e.get("state") == "ASSUMED_BAD" and e.get("ev") == 1 for e, _ in seen)
                     or control.finished.is_set(), 60, "the follower to print EV 1 ASSUMED_BAD")
        finally:
            links.set_state(fabric, "p0l0", "p0s1", True)
        thread.join(180)
    finally:
        follower.terminate()
        follower.wait(30)
    bad = [(e, ended) for e, ended in seen if e.get("state") == "ASSUMED_BAD" and e.get("ev") == 1]
    print("\n$ mrc-emu ev events --host h0 --follow --json\n" + "\n".join(json.dumps(e) for e, _ in seen))
    assert bad and not bad[0][1], "EV 1's ASSUMED_BAD event was printed only after the WRITE ended"
    assert bad[0][0]["dst"] == "h2" and bad[0][0]["port"] == 1
    assert box["result"].verified


def test_ev_replace_moves_a_stev_ev_to_the_other_plane_under_traffic(default_fabric):
    """A STEV WRITE on one EV (EV 0: port 1, plane 0) over plain IPv6 routing: `ev replace --ev 0` with
    other flow label bits on port 2 moves it to plane 1 at once: h0's NIC into plane 0 sends nothing
    after, its NIC into plane 1 sends the rest; verified."""
    from mrc_emu.fabric import static_routes
    from mrc_emu.topology.evs import EvFormat, default_stev

    fabric = default_fabric
    static_routes.install(fabric)
    eth0, eth1 = (_towards(fabric, "h0", fabric.topology.leaf_of("h0", plane)) for plane in (0, 1))
    control, box, thread = _run_in_thread(fabric=fabric, src="h0", dst="h2", size=1024 * MiB, evs=[0],
                                          ev_format=EvFormat.STEV, dilation=3.0)
    wait_for(lambda: control.progress > 0.15 or control.finished.is_set(), 60, "the WRITE to be under way")
    assert not control.finished.is_set(), box.get("error")
    before = _tx_packets(fabric, "h0", eth0), _tx_packets(fabric, "h0", eth1)
    value = 0x1234 << 16 | default_stev(0) & 0xFFFF  # new flow label bits, the EV's own UDP source port
    done = subprocess.run(CLI + ["ev", "replace", "h0", "h2", "--ev", "0", "--value", f"0x{value:08x}", "--port", "2",
                                 "--name", fabric.name], capture_output=True, text=True, timeout=60)
    print(f"\n$ mrc-emu ev replace h0 h2 --ev 0 --value 0x{value:08x} --port 2\n{done.stdout.strip()}")
    assert done.returncode == 0 and "taken by 1 running QP" in done.stdout, done.stdout + done.stderr
    taken_at = control.progress
    after = _tx_packets(fabric, "h0", eth0), _tx_packets(fabric, "h0", eth1)
    wait_for(lambda: control.progress > taken_at + 0.2 or control.finished.is_set(), 120, "more of the WRITE")
    later = _tx_packets(fabric, "h0", eth0), _tx_packets(fabric, "h0", eth1)
    print(f"h0 -> plane 0 tx packets {before[0]} before, {after[0]} when taken, {later[0]} later; plane 1: "
          f"{before[1]}, {after[1]}, {later[1]}")
    assert before[0] > 1000 and before[1] < 100  # plane 1 idle (a probe or two) until the replace ...
    assert later[0] - after[0] <= 3 and later[1] - after[1] > 1000  # ... then plane 0 idle
    thread.join(180)
    result = box["result"]
    assert result.verified, result.error
    assert result.per_ev[0]["first_hop"] == ad.link_address(
        fabric.topology.links_between("h0", fabric.topology.leaf_of("h0", 1))[0], fabric.topology.leaf_of("h0", 1))
