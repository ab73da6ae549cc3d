"""Plain IPv6 routing for the baseline: static routes are BGP's converged ones, and carry it (root)."""

from __future__ import annotations

import ipaddress
import json
import subprocess
import sys

import pytest
from pyroute2 import IPRoute

from mrc_emu.experiments.runtime.transfer import send
from mrc_emu.fabric import build, links, registry, routing, static_routes
from mrc_emu.fabric.kernel import netns
from mrc_emu.fabric.running import Fabric
from mrc_emu.topology import Role, Topology, builtin
from mrc_emu.topology import addressing as ad
from mrc_emu.topology.evs import EvFormat
from mrc_emu.transport.config import QpConfig

pytestmark = pytest.mark.system
CLI = [sys.executable, "-m", "mrc_emu.cli"]
HOSTS = ipaddress.IPv6Network(ad.HOST_PREFIX)

Nexthops = frozenset[tuple[str, str]]  # (outgoing interface, the neighbour node the gateway belongs to)


def _addresses(name: str, topo: Topology) -> dict[tuple[str, str], set[str]]:
    """(node, interface) -> every IPv6 address on it, link-local ones included."""
    out: dict[tuple[str, str], set[str]] = {}
    for node in topo.nodes:
        with netns.entered(netns.netns_path(name, node)), IPRoute() as ipr:
            names = {link["index"]: link.get("ifname") for link in ipr.get_links()}
            for addr in ipr.get_addr(family=10):
                out.setdefault((node, names[addr["index"]]), set()).add(addr.get("IFA_ADDRESS"))
    return out


def host_routes(name: str, topo: Topology) -> dict[str, dict[str, Nexthops]]:
    """switch -> host /128 -> its nexthops, each gateway resolved to the neighbour that owns it
    (FRR uses the neighbour's link-local address, static routes its link address)."""
    addresses = _addresses(name, topo)
    peer_of = {}
    for link in topo.links:
        peer_of[(link.a, link.a_intf)] = (link.b, link.b_intf)
        peer_of[(link.b, link.b_intf)] = (link.a, link.a_intf)
    out: dict[str, dict[str, Nexthops]] = {}
    for node in (n.name for n in topo.nodes.values() if n.role is not Role.HOST):
        table: dict[str, Nexthops] = {}
        with netns.entered(netns.netns_path(name, node)), IPRoute() as ipr:
            names = {link["index"]: link.get("ifname") for link in ipr.get_links()}
            for route in ipr.get_routes(family=10, table=254):
                dst = route.get("RTA_DST")
                if not dst or route["dst_len"] != 128 or ipaddress.IPv6Address(dst) not in HOSTS:
                    continue
                hops = route.get("RTA_MULTIPATH") or [route]
                resolved = set()
                for hop in hops:
                    intf = names[hop["oif"] if "oif" in hop else hop.get("RTA_OIF")]
                    gateway = hop.get("RTA_GATEWAY")
                    peer, peer_intf = peer_of[(node, intf)]
                    resolved.add((intf, peer if gateway in addresses.get((peer, peer_intf), ()) else f"? {gateway}"))
                table[dst] = frozenset(resolved)
        out[node] = table
    return out


@pytest.mark.slow
@pytest.mark.skipif(routing.frr_missing() is not None, reason=str(routing.frr_missing()))
def test_static_routes_equal_bgp_converged(fabric_name):
    topo = builtin()
    build.up(topo, fabric_name)
    try:
        with Fabric.open(fabric_name) as fabric:
            routing.start(fabric)
        learned = host_routes(fabric_name, topo)
    finally:
        build.down(fabric_name)
    build.up(topo, fabric_name)
    try:
        with Fabric.open(fabric_name) as fabric:
            static_routes.install(fabric)
        assert not registry.read(fabric_name).processes  # no daemon: the routes alone
        installed = host_routes(fabric_name, topo)
    finally:
        build.down(fabric_name)
    assert installed == learned
    # and the comparison has teeth: every switch reaches every host it is not cabled to over all its spines
    leaf = learned["p0l0"]
    assert len(leaf) == len(topo.hosts) and len(leaf[ad.host_address(topo, "h2")]) == topo.spines_per_plane
    assert all(len(table) == len(topo.hosts) for table in learned.values())


def test_baseline_write_verified_over_static_routes(fabric_name):
    """`up --routing static`, then the baseline as runner.py runs it: UDP, one ECMP-hashed path, go-back-N."""
    up = subprocess.run(CLI + ["up", "--routing", "static", "--name", fabric_name, "--json"], capture_output=True,
                        text=True)
    assert up.returncode == 0, up.stderr
    try:
        fabric = Fabric.open(fabric_name)
        assert json.loads(up.stdout)["routing"] == "static" and static_routes.installed(fabric)
        result = send(fabric, "h0", "h3", 16 * 2**20, [0], ev_format=EvFormat.UDP, config=QpConfig.baseline())
        assert result.verified, result.error
        assert result.sha256_placed == result.sha256_source
    finally:
        build.down(fabric_name)


def test_link_up_restores_static_routes(fabric_name):
    """The kernel drops a downed link's routes and nothing repairs them (no BGP); `link up` puts them back."""
    topo = builtin()
    build.up(topo, fabric_name)
    try:
        fabric = Fabric.open(fabric_name)
        static_routes.install(fabric)
        before = host_routes(fabric_name, topo)
        links.set_state(fabric, "p0l0", "p0s1", False)
        during = host_routes(fabric_name, topo)
        under_p0l0 = {ad.host_address(topo, h) for h in ("h0", "h1")}
        assert under_p0l0.isdisjoint(during["p0s1"])  # the spine lost its only way to p0l0's hosts
        assert during["p0l1"] == before["p0l1"]  # and the other leaf still hashes onto that spine
        links.set_state(fabric, "p0l0", "p0s1", True)
        assert host_routes(fabric_name, topo) == before
    finally:
        build.down(fabric_name)


def test_scenario_baseline_over_static_routes_through_a_link_fault(tmp_path):
    """`routing: static` in a scenario: no FRR, the baseline runs, the fault is reverted, and the
    results say that nothing but the revert repaired it."""
    from mrc_emu.experiments.scenarios import runner, scenario

    path = tmp_path / "static.yaml"
    path.write_text("""
transports: [baseline]
routing: static
workloads:
  - {kind: write, src: h0, dst: h2, size: 32MiB}
faults:
  - {kind: link-down, link: [p0l1, p0s1], at: 0.3, duration_ms: 200}
""")
    results = runner.run(scenario.load(path), tmp_path / "out")
    run = results["runs"]["baseline"]
    assert run["verified"], [t["error"] for t in run["transfers"]]
    assert "static_routes_s" in results and "bgp_converged_s" not in results
    assert any("repairs nothing" in note for note in results["notes"])
    assert [e["action"] for e in run["faults"][0]["events"]] == ["down", "restore"]
    assert not registry.journal_path(results["fabric"]).exists()
