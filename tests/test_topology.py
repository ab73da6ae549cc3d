"""Topology model, addressing plan and EV enumeration: pure data, no root."""

import ipaddress

import pytest

from mrc_emu.topology import TopologyError, builtin, evs_between, from_dict, load, probe_segments
from mrc_emu.topology import addressing as ad
from mrc_emu.topology.units import parse_size


def test_default_counts():
    topo = builtin()
    assert topo.host_count == 4
    assert len(topo.nodes) == 16
    assert len(topo.links) == 4 * 2 + 2 * 2 * 4
    assert len(evs_between(topo, "h0", "h2")) == 8


def test_large_counts():
    topo = builtin("large")
    assert len(topo.nodes) == 320
    assert len(topo.links) == 2048
    assert len(evs_between(topo, "h0", "h127")) == 64


def test_interface_names_fit_linux_limit():
    for link in builtin("large").links:
        assert len(link.a_intf) <= 15 and len(link.b_intf) <= 15


def test_addresses_unique_and_valid():
    topo = builtin("fourplane")
    seen = set()
    for link in topo.links:
        for end in (link.a, link.b):
            a = ad.link_address(link, end)
            ipaddress.IPv6Address(a)
            assert a not in seen
            seen.add(a)
    hosts = {ad.host_address(topo, h.name) for h in topo.hosts}
    assert len(hosts) == topo.host_count
    ids = [n.node_id for n in topo.nodes.values()]
    assert len(set(ids)) == len(ids)


def test_ev_paths_cross_distinct_spines_and_planes():
    topo = builtin()
    evs = evs_between(topo, "h0", "h3")
    assert {(ev.plane, ev.spine) for ev in evs} == {(p, f"p{p}s{s}") for p in range(2) for s in range(4)}
    for ev in evs:
        assert ev.hops[0] == "h0" and ev.hops[-1] == "h3"
        assert len(ev.segments) == 4
        assert ev.segments[-1] == ad.decap_sid(topo.node("h3").node_id)


def test_same_leaf_evs_turn_at_leaf():
    topo = builtin()
    evs = evs_between(topo, "h0", "h1")
    assert [ev.hops for ev in evs] == [("h0", "p0l0", "h1"), ("h0", "p1l0", "h1")]


def test_usid_carrier_packs_path():
    topo = builtin()
    ev = evs_between(topo, "h0", "h2")[5]
    ids = [topo.node(h).node_id for h in ev.hops[1:]]
    carrier = int(ipaddress.IPv6Address(ev.usid_carrier))
    assert carrier >> 96 == ad.USID_BLOCK
    for k, node_id in enumerate(ids):
        assert (carrier >> (80 - 16 * k)) & 0xFFFF == node_id
    assert (carrier >> (80 - 16 * len(ids))) & 0xFFFF == ad.USID_DECAP_FUNCTION


def test_probe_segments_go_out_and_back():
    topo = builtin()
    ev = evs_between(topo, "h0", "h2")[0]
    segs = probe_segments(topo, ev)
    assert segs[3] == ad.end_sid(topo.node("h2").node_id)
    assert segs[-1] == ad.decap_sid(topo.node("h0").node_id)
    assert len(segs) == 8


def test_crosses():
    topo = builtin()
    evs = evs_between(topo, "h0", "h2")
    through = [ev.index for ev in evs if ev.crosses("p0l0", "p0s1")]
    assert through == [1]


@pytest.mark.parametrize(
    "data, message",
    [
        ({"planes": 2, "spines_per_plane": 2, "leaves_per_plane": 2}, "field 'hosts_per_leaf': missing"),
        ({"planes": "two", "spines_per_plane": 2, "leaves_per_plane": 2, "hosts_per_leaf": 1},
         "field 'planes': 'two' is not a whole number"),
        ({"planes": 0, "spines_per_plane": 2, "leaves_per_plane": 2, "hosts_per_leaf": 1},
         "out of range"),
        ({"planes": 1, "spines_per_plane": 2, "leaves_per_plane": 2, "hosts_per_leaf": 1, "mtu": 100},
         "field 'mtu'"),
        ({"planes": 1, "spines_per_plane": 2, "leaves_per_plane": 2, "hosts_per_leaf": 1,
          "link_rate": "fast"}, "field 'link_rate'"),
        ({"planes": 1, "spines_per_plane": 2, "leaves_per_plane": 2, "hosts_per_leaf": 1, "spine": 3},
         "field 'spine': unknown field"),
        ([1, 2], "expected a mapping"),
    ],
)
def test_invalid_descriptions(data, message):
    with pytest.raises(TopologyError, match=message):
        from_dict(data, "t.yaml")


def test_error_names_file_and_line(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("planes: 2\nspines_per_plane: 4\nleaves_per_plane: -1\nhosts_per_leaf: 2\n")
    with pytest.raises(TopologyError, match=r"bad.yaml, line 3, field 'leaves_per_plane'"):
        load(f)


def test_yaml_syntax_error(tmp_path):
    f = tmp_path / "broken.yaml"
    f.write_text("planes: [2\n")
    with pytest.raises(TopologyError, match="broken.yaml.*not valid YAML"):
        load(f)


def test_missing_file():
    with pytest.raises(TopologyError, match="cannot read"):
        load("/nonexistent/topo.yaml")


def test_rate_parsed():
    topo = from_dict({"planes": 1, "spines_per_plane": 1, "leaves_per_plane": 2, "hosts_per_leaf": 1,
                      "link_rate": "100mbit"})
    assert topo.link_rate_bps == 1e8


@pytest.mark.parametrize("text, size", [("4096", 4096), (4096, 4096), ("100k", 100_000), ("64MiB", 64 * 2**20),
                                        ("1.5GB", 1_500_000_000), ("2 KiB", 2048), ("1_000", 1000)])
def test_one_size_language_for_cli_and_scenarios(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["0", 0, "-5", "1e3", "lots", "5 parsecs", "0.1", True, ""])
def test_what_is_not_a_size_is_refused_clearly(text):
    with pytest.raises(ValueError, match="size|byte"):
        parse_size(text)
