"""Static routing's plan, scenarios and CLI that name it, and the `huge` topology: no root."""

import pytest
from click.testing import CliRunner

from mrc_emu import cli
from mrc_emu.experiments.scenarios import scenario
from mrc_emu.fabric import static_routes
from mrc_emu.topology import Role, builtin, ev_count, evs_between
from mrc_emu.topology import addressing as ad


def test_leaf_reaches_other_leaves_hosts_over_every_spine_of_its_plane():
    topo = builtin()
    routes = {r.prefix: r for r in static_routes.plan(topo, "p1l0")}
    assert set(routes) == {ad.host_address(topo, h) + "/128" for h in ("h2", "h3")}  # h0, h1 are its own
    for route in routes.values():
        gateways = {gw for _, gw in route.multipath}
        spines = [link for link in topo.links_of("p1l0") if topo.node(link.b).role is Role.SPINE]
        assert gateways == {ad.link_address(link, link.b) for link in spines} and len(gateways) == 4


def test_spine_reaches_every_host_via_its_leaf_in_the_plane():
    topo = builtin()
    routes = {r.prefix: r for r in static_routes.plan(topo, "p0s2")}
    assert len(routes) == len(topo.hosts)
    (to_p0l1,) = topo.links_between("p0l1", "p0s2")
    route = routes[ad.host_address(topo, "h3") + "/128"]
    assert route.multipath is None and route.intf == to_p0l1.b_intf
    assert route.gateway == ad.link_address(to_p0l1, "p0l1")
    assert static_routes.plan(topo, "h0") == []  # hosts keep config.py's ECMP route over their leaves


def test_large_counts():
    topo = builtin("large")
    leaf = static_routes.plan(topo, "p3l5")
    assert len(leaf) == topo.host_count - topo.hosts_per_leaf and all(len(r.multipath) == 8 for r in leaf)
    assert len(static_routes.plan(topo, "p7s7")) == topo.host_count


def test_huge_has_a_thousand_namespaces_and_512_hosts():
    topo = builtin("huge")
    assert len(topo.nodes) == 1088 and topo.host_count == 512 and len(topo.links) == 8192
    assert ev_count(topo) == 64 and len(evs_between(topo, "h0", "h511")) == 64
    assert all(len(link.a_intf) <= 15 and len(link.b_intf) <= 15 for link in topo.links)


def test_scenario_accepts_static_routing_for_the_baseline(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("topology: default\nrouting: static\nworkloads:\n  - {kind: write, src: h0, dst: h2}\n")
    assert scenario.load(path).routing == "static"
    path.write_text("topology: default\nrouting: ospf\nworkloads:\n  - {kind: write, src: h0, dst: h2}\n")
    with pytest.raises(scenario.ScenarioError, match="'static'"):
        scenario.load(path)


def test_up_bgp_flag_is_routing_bgp_and_conflicts_are_refused():
    result = CliRunner().invoke(cli.main, ["up", "--bgp", "--routing", "static"])
    assert result.exit_code == 2 and "--bgp means --routing bgp" in result.output
    help_text = CliRunner().invoke(cli.main, ["up", "--help"]).output
    assert "--routing [none|static|bgp]" in help_text and "Same as --routing bgp" in help_text


def test_frr_timers_are_dilated_with_the_transport_clock():
    """Under time dilation K, BGP's keepalive/hold and BFD's intervals are K times longer in wall
    time (the same in emulated time); at K = 1 the configuration is FRR's defaults, untouched."""
    from mrc_emu.fabric import routing
    from mrc_emu.topology import builtin

    topo = builtin()
    plain = routing.bgp_config(topo, "p0l0", True)
    assert " timers 3 9" not in plain and "bfd profile" not in plain and " bfd\n" in plain
    assert routing.bfd_config("p0l0") == "hostname p0l0\n"
    dilated = routing.bgp_config(topo, "p0l0", True, dilation=2)
    peers = plain.count(" remote-as ")
    assert dilated.count(" timers 6 18\n") == peers and dilated.count(f" bfd profile {routing.BFD_PROFILE}\n") == peers
    bfd = routing.bfd_config("p0l0", 2)
    assert f"profile {routing.BFD_PROFILE}" in bfd and "receive-interval 600" in bfd and "transmit-interval 600" in bfd
