"""The fabric for real: namespaces, veths and the kernel's SRv6 forwarding (root)."""

import itertools
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import wait_for
from scapy.layers.inet6 import IPv6ExtHdrSegmentRouting
from scapy.utils import rdpcap

from mrc_emu.experiments.runtime.probes import probe_evs
from mrc_emu.fabric import build, limits, links, ops, registry
from mrc_emu.fabric.datapath import srv6
from mrc_emu.fabric.kernel import netns, seg6local
from mrc_emu.fabric.running import Fabric
from mrc_emu.topology import addressing as ad
from mrc_emu.topology import builtin, evs_between
from mrc_emu.wire.decoder import decode_roce
from mrc_emu.wire.encoder import Encap, FrameTemplate
from mrc_emu.wire.format import DataPacket, Endpoints

pytestmark = pytest.mark.system
CLI = [sys.executable, "-m", "mrc_emu.cli"]


def leftovers(name: str) -> list[str]:
    found = [str(p) for p in netns.NETNS_DIR.glob(f"{name}-*")] if netns.NETNS_DIR.exists() else []
    found += [line for line in Path("/proc/mounts").read_text().splitlines() if f"/run/netns/{name}-" in line]
    if registry.journal_path(name).exists():
        found.append(str(registry.journal_path(name)))
    return found


def test_every_ev_of_every_pair_reachable(default_fabric):
    fabric, topo = default_fabric, default_fabric.topology
    for src, dst in itertools.permutations([h.name for h in topo.hosts], 2):
        results = probe_evs(fabric, src, dst)
        assert len(results) == len(evs_between(topo, src, dst))
        assert all(r.reachable and r.rtt_ns > 0 for r in results), (src, dst, results)


def test_link_down_fails_exactly_the_evs_through_it(default_fabric):
    fabric, topo = default_fabric, default_fabric.topology
    evs = evs_between(topo, "h0", "h2")
    through = {ev.index for ev in evs if ev.crosses("p0l0", "p0s1")}
    assert len(through) == 1
    links.set_state(fabric, "p0l0", "p0s1", False)
    for src, dst in (("h0", "h2"), ("h2", "h0"), ("h1", "h3")):
        failed = {r.ev for r in probe_evs(fabric, src, dst, timeout=0.5) if not r.reachable}
        expect = {ev.index for ev in evs_between(topo, src, dst) if ev.crosses("p0l0", "p0s1")}
        assert failed == expect, (src, dst)
    status = {(link["a"], link["b"]): link for link in ops.status(fabric)["links"]}
    assert status[("p0l0", "p0s1")]["state"] == "down" and status[("p0l0", "p0s0")]["state"] == "up"
    assert status[("p0l0", "p0s1")]["admin_down"] and not status[("p0l0", "p0s0")]["admin_down"]
    links.set_state(fabric, "p0l0", "p0s1", True)
    assert all(r.reachable for r in probe_evs(fabric, "h0", "h2"))
    assert all(r.reachable for r in probe_evs(fabric, "h2", "h0"))
    assert not any(link["admin_down"] for link in ops.status(fabric)["links"])


def test_host_link_down_keeps_other_plane(default_fabric):
    fabric, topo = default_fabric, default_fabric.topology
    links.set_state(fabric, "h0", "p0l0", False)
    results = probe_evs(fabric, "h0", "h3", timeout=0.5)
    planes = {ev.index: ev.plane for ev in evs_between(topo, "h0", "h3")}
    assert {r.ev for r in results if r.reachable} == {k for k, p in planes.items() if p == 1}
    links.set_state(fabric, "h0", "p0l0", True)
    # every EV answers again (within a deadline: on a loaded machine a probe may miss its 1 s once)
    wait_for(lambda: all(r.reachable for r in probe_evs(fabric, "h0", "h3")), timeout=10,
             what="every EV from h0 to h3 reachable after the host link came back")


def test_flap_ends_up_and_keeps_its_schedule(default_fabric):
    """One helper flaps for the CLI, the runner and the agent: down and up on the flap's own clock."""
    fabric = default_fabric
    changes = []
    with links.LinkSwitch(fabric, links.between(fabric, "p0l0", "p0s1")) as switch:
        links.flap(switch, 60, 2, lambda up, ms: changes.append((up, ms)))
    assert [up for up, _ in changes] == [False, True, False, True]
    # each change on its slot of the flap's clock (30 ms apart), never before it (a restore may run late)
    assert all(ms >= k * 30 for k, (_, ms) in enumerate(changes)), changes
    assert all(r.reachable for r in probe_evs(fabric, "h0", "h2"))
    assert fabric.state().down_links == set()


def test_capture_on_spine_shows_kernel_forwarded_srh(default_fabric, tmp_path):
    fabric = default_fabric
    out = tmp_path / "spine.pcap"
    cap = ops.Capture(fabric, "p0s0", str(out))
    try:
        assert all(r.reachable for r in probe_evs(fabric, "h0", "h2", [0]))
        wait_for(lambda: out.stat().st_size > 200, timeout=5, what="packets in the pcap")
    finally:
        result = cap.stop()
    assert result.packets and result.packets > 0
    packets = rdpcap(str(out))
    assert len(packets) == result.packets  # what tcpdump said it captured is what the file holds
    srh = [p[IPv6ExtHdrSegmentRouting] for p in packets if IPv6ExtHdrSegmentRouting in p]
    assert srh, "no SRH packet seen on the spine"
    # the spine received it with one Segments Left and sent it on with one less
    lefts = sorted({h.segleft for h in srh})
    assert any(b == a - 1 for a in lefts for b in lefts)


def test_usid_carrier_delivers_to_destination(default_fabric):
    """SRV6_USID format: the carrier alone steers the packet, the destination decapsulates."""
    fabric, topo = default_fabric, default_fabric.topology
    ev = evs_between(topo, "h0", "h2")[5]
    src, dst = ad.host_address(topo, "h0"), ad.host_address(topo, "h2")
    ends = Endpoints(src, dst, ev.udp_sport)
    template = FrameTemplate(ends, Encap.usid(src, ev.usid_carrier, ev.segments[-1]))
    send, unused_recv = ops.host_sockets(fabric, "h0")
    unused_send, recv = ops.host_sockets(fabric, "h2")
    unused_recv.close()
    unused_send.close()
    packet = DataPacket(7, 42, 0x1000, 0x99, b"placed by address")
    try:
        send.sendto(template.data(packet), (ev.usid_carrier, 0))
        ready, _, _ = select.select([recv], [], [], 2.0)
        assert ready, "uSID packet did not arrive"
        data, addr = recv.recvfrom(65535)
        got = decode_roce(data[8:], Endpoints(addr[0], dst, ev.udp_sport))
        assert got == packet
    finally:
        send.close()
        recv.close()


def test_down_leaves_nothing(fabric_name):
    build.up(builtin(), fabric_name)
    record = registry.read(fabric_name)
    assert len(record.namespaces) == 16 and not record.processes
    build.down(fabric_name)
    assert leftovers(fabric_name) == []


def test_sigkill_mid_build_then_clean_leaves_nothing(fabric_name, tmp_path):
    # a state directory of its own: `clean` removes every fabric its journals record, and other
    # fabrics of this machine (other tests, other users) must not be among them
    env = {**os.environ, "MRC_EMU_STATE_DIR": str(tmp_path / "state")}
    proc = subprocess.Popen(CLI + ["up", "-t", "large", "--name", fabric_name], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    journal = tmp_path / "state" / f"{fabric_name}.journal"
    wait_for(lambda: journal.exists() and journal.read_text().count('"netns"') >= 40, what="namespaces")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    recorded = [json.loads(line) for line in journal.read_text().splitlines() if '"process"' in line]
    result = subprocess.run(CLI + ["clean"], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    assert leftovers(fabric_name) == [] and not journal.exists()
    # nodes are namespaces, not processes; whatever process the build recorded is gone too
    wait_for(lambda: not any(netns.process_start_time(e["pid"]) == e["start"] for e in recorded),
             what="recorded processes to exit")


def test_ctrl_c_mid_build_removes_what_was_made(fabric_name):
    """No `clean` here: the interrupted build itself removes every namespace it had made."""
    # SIGINT as a terminal sends it, whatever this test's own parent ignores (a background CI job
    # starts with SIGINT ignored, and Python keeps an ignored SIGINT ignored)
    proc = subprocess.Popen(CLI + ["up", "-t", "huge", "--name", fabric_name],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    journal = registry.journal_path(fabric_name)
    wait_for(lambda: journal.exists() and journal.read_text().count('"netns"') >= 40, what="namespaces")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and b"interrupted" in err, err
    assert leftovers(fabric_name) == []


def test_name_clash_is_one_clear_error(default_fabric):
    name = default_fabric.name
    result = subprocess.run(CLI + ["up", "--name", name], capture_output=True, text=True)
    assert result.returncode == 1
    assert "already up" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert len(registry.read(name).namespaces) == 16


def test_invalid_topology_creates_nothing(fabric_name, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("planes: 2\nspines_per_plane: x\nleaves_per_plane: 2\nhosts_per_leaf: 2\n")
    result = subprocess.run(CLI + ["up", "-t", str(bad), "--name", fabric_name], capture_output=True, text=True)
    assert result.returncode == 1
    assert "bad.yaml, line 2, field 'spines_per_plane'" in result.stderr
    assert leftovers(fabric_name) == []


def test_cli_status_paths_probe_json(default_fabric):
    name = default_fabric.name
    status = json.loads(subprocess.run(CLI + ["status", "--name", name, "--json"], capture_output=True,
                                       text=True, check=True).stdout)
    assert {n["role"] for n in status["nodes"]} == {"host", "leaf", "spine"}
    assert status["ev_count"] == 8 and all(link["state"] == "up" for link in status["links"])
    probe = json.loads(subprocess.run(CLI + ["probe", "h1", "h3", "--all", "--name", name, "--json"],
                                      capture_output=True, text=True, check=True).stdout)
    assert len(probe["evs"]) == 8 and all(e["reachable"] for e in probe["evs"])
    single = json.loads(subprocess.run(CLI + ["probe", "h1", "h3", "--ev", "3", "--name", name, "--json"],
                                       capture_output=True, text=True, check=True).stdout)
    assert [e["ev"] for e in single["evs"]] == [3]
    if seg6local.mode() == "kernel":  # the SIDs as the kernel's seg6local routes
        out = subprocess.run(CLI + ["exec", "--name", name, "p0s0", "--", "ip", "-6", "route"], capture_output=True,
                             text=True, check=True).stdout
        assert "seg6local" in out
    else:  # or the BPF endpoint program on every port's ingress (datapath/srv6.py)
        out = subprocess.run(CLI + ["exec", "--name", name, "p0s0", "--", "tc", "filter", "show", "dev", "p0s0-eth0",
                                    "ingress"], capture_output=True, text=True, check=True).stdout
        assert srv6.FILTER_NAME in out


@pytest.mark.slow
def test_large_comes_up_and_goes_down(fabric_name):
    topo = builtin("large")
    result = build.up(topo, fabric_name)
    try:
        with Fabric.open(fabric_name) as fabric:
            assert len(fabric.state().namespaces) == 320 and fabric.state().ready
            assert fabric.topology.summary() == topo.summary()
            assert all(r.reachable for r in probe_evs(fabric, "h0", "h127"))
    finally:
        build.down(fabric_name)
    assert leftovers(fabric_name) == []
    # the phases are consecutive parts of the build
    srv6_phase = {"srv6"} if seg6local.mode() == "bpf" else set()  # the SRv6 endpoint program, without seg6local
    assert set(result.phases) == {"nodes", "links", "routes", "carrier"} | srv6_phase
    assert sum(result.phases.values()) <= result.seconds


@pytest.mark.slow
def test_huge_comes_up_and_goes_down(fabric_name):
    """A thousand namespaces (bench_fabric.py times it; here: it works and leaves nothing)."""
    topo = builtin("huge")
    held_before = limits.entries_now()
    build.up(topo, fabric_name)
    try:
        assert len(registry.read(fabric_name).namespaces) == 1088 and not registry.read(fabric_name).processes
        with Fabric.open(fabric_name) as fabric:
            results = probe_evs(fabric, "h0", "h511")
        assert len(results) == 64 and all(r.reachable for r in results)
    finally:
        build.down(fabric_name)
    assert leftovers(fabric_name) == []
    # the kernel tears the namespaces down after `down` returns (seconds for a thousand here, minutes
    # in a VM under TCG): let it finish, so that the tests after this one do not run beside it. It
    # fails only if the kernel stops releasing entries for 60 s, not because the machine is slow.
    left = {"n": limits.entries_now(), "at": time.monotonic()}

    def released() -> bool:
        now = limits.entries_now()
        if now < left["n"]:
            left.update(n=now, at=time.monotonic())
        elif time.monotonic() - left["at"] > 60:
            pytest.fail(f"the kernel released none of huge's {now - held_before} neighbours left for 60 s")
        return now <= held_before + 64

    wait_for(released, timeout=1800, what="the kernel to release huge's neighbours")


def _permanent_neighbours(fabric, node: str) -> set[tuple[str, str, str]]:
    out = subprocess.run(["ip", "netns", "exec", fabric.netns(node).name, "ip", "-6", "-j", "neigh", "show",
                          "nud", "permanent"], capture_output=True, text=True, check=True, timeout=10)
    return {(n["dev"], n["dst"], n["lladdr"]) for n in json.loads(out.stdout or "[]")}


def test_every_link_neighbour_is_written_down_and_survives_a_link_flap(default_fabric):
    """Each end of each link knows its peer's MAC before any traffic (permanent entries, never
    resolved on the data path), and a link brought back up gets its entries again."""
    fabric, topo = default_fabric, default_fabric.topology
    for link in topo.links_of("p0l0"):
        peer, intf, _ = topo.peer(link, "p0l0")
        mac = ":".join(f"{b:02x}" for b in ad.link_mac(link, peer))
        assert (intf, ad.link_address(link, peer), mac) in _permanent_neighbours(fabric, "p0l0"), intf
    link = next(lk for lk in topo.links_of("p0l0") if "p0s1" in (lk.a, lk.b))
    _, intf, _ = topo.peer(link, "p0l0")
    links.set_state(fabric, "p0l0", "p0s1", False)
    links.set_state(fabric, "p0l0", "p0s1", True)
    assert any(dev == intf for dev, _, _ in _permanent_neighbours(fabric, "p0l0"))
