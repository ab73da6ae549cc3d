"""EV profiles over the fabric's SRv6 uSID plan: slots -> fabric EVs -> QP paths (no root)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mrc_emu.api.files import from_dict, load
from mrc_emu.topology import Role, builtin, evs_between
from mrc_emu.topology import addressing as ad
from mrc_emu.topology.evs import udp_sport
from mrc_emu.transport.multipath.evpaths import EvProfileError, carrier_usids, fabric_coverage, profile_paths, slot_evs

PROFILES = Path(__file__).parent.parent / "mrc_emu" / "topologies" / "ev-profiles"
GEN = PROFILES / "default-h0-h2-gen.yaml"


def gen_profile(topo, dst: str, ev_count: int | None = None, spine_ids: tuple[int, int] | None = None, path="<gen>"):
    """The GEN profile of the short carriers to `dst`: block fixed, spine generated, dst fixed, function fixed."""
    ids = [n.node_id for n in topo.nodes.values() if n.role is Role.SPINE]
    low, high = spine_ids or (min(ids), max(ids))
    mask = (1 << high.bit_length()) - 1
    return from_dict({"format": {"mode": "SRV6", "fields": [32, 16, 16, 16]},
                      "profile": {"mode": "GEN", "ev_count": ev_count or high - low + 1, "ev_min_active": 1,
                                  "fields": [{"width": 32, "init_val": ad.USID_BLOCK},
                                             {"width": 16, "mask": mask, "min_val": low, "max_val": high},
                                             {"width": 16, "init_val": topo.node(dst).node_id},
                                             {"width": 16, "init_val": ad.USID_DECAP_FUNCTION}]}}, path)


def exp_profile(*carriers: str, segment: str | None = None):
    evs = [bytes.fromhex(ad_hex(c) + (ad_hex(segment) if segment else "")).hex() for c in carriers]
    return from_dict({"format": {"mode": "SRV6", "fields": [128, 128]},
                      "profile": {"mode": "EXP", "ev_count": len(evs), "ev_min_active": 1,
                                  "fields": [{"width": 128}, {"width": 128}], "evs": evs}}, "<exp>")


def ad_hex(address: str) -> str:
    import ipaddress
    return ipaddress.IPv6Address(address).packed.hex()


def test_the_shipped_gen_profile_yields_exactly_the_fabrics_evs_h0_to_h2():
    topo, profile = builtin(), load(GEN)
    assert fabric_coverage(topo, profile, "h0", "h2") == {"missing": [], "duplicates": []}
    slots = slot_evs(topo, profile, "h0", "h2")
    fabric = evs_between(topo, "h0", "h2")
    assert {(s.ev.plane, s.ev.spine) for s in slots} == {(e.plane, e.spine) for e in fabric} and len(slots) == 8
    assert all(s.short for s in slots)
    assert slots[0].carrier == "fc00:0:9:3:f0d6::" and slots[0].ev.spine == "p0s0"
    assert slots[7].carrier == "fc00:0:10:3:f0d6::" and slots[7].ev.spine == "p1s3"


@pytest.mark.parametrize("name,src,dst", [("default", "h1", "h3"), ("large", "h0", "h127"), ("fourplane", "h7", "h0")])
def test_a_gen_profile_over_the_spines_covers_every_pair_of_leaves(name, src, dst):
    topo = builtin(name)
    profile = gen_profile(topo, dst)
    assert fabric_coverage(topo, profile, src, dst) == {"missing": [], "duplicates": []}
    assert len(slot_evs(topo, profile, src, dst)) == len(evs_between(topo, src, dst)) == topo.planes * topo.spines_per_plane


def test_a_profile_short_of_spines_or_repeating_one_is_told():
    topo = builtin()
    short = gen_profile(topo, "h2", spine_ids=(9, 12))  # plane 0 only
    assert fabric_coverage(topo, short, "h0", "h2")["missing"] == [(1, f"p1s{s}") for s in range(4)]
    twice = exp_profile("fc00:0:9:3:f0d6::", "fc00:0:5:9:6:3:f0d6::")  # p0s0, short then long
    assert fabric_coverage(topo, twice, "h0", "h2")["duplicates"] == [(1, 0)]


def test_paths_carry_the_slots_carriers_and_come_back_on_the_reverse_ev():
    topo, profile = builtin(), load(GEN)
    paths = profile_paths(topo, profile, "h0", "h2")
    assert sorted(paths.forward) == sorted(paths.back) == list(range(8))
    reverse = {(e.plane, e.spine): e for e in evs_between(topo, "h2", "h0")}
    for slot, fabric_ev in enumerate(paths.topology_evs):
        forward, back = paths.forward[slot], paths.back[slot]
        spine = topo.node(fabric_ev.spine).node_id
        assert forward.first_hop == f"fc00:0:{spine:x}:3:f0d6::" == paths.evs[slot].usid_carrier
        assert forward.template.encap.outer_dst == bytes.fromhex(ad_hex(forward.first_hop))
        assert forward.template.ends.sport == back.template.ends.sport == udp_sport(slot)
        assert back.first_hop == f"fc00:0:{spine:x}:1:f0d6::"  # the same spine back to h0 (node 1)
        assert reverse[(fabric_ev.plane, fabric_ev.spine)].hops == tuple(reversed(fabric_ev.hops))
        assert forward.plane == back.plane == fabric_ev.plane  # its port: plane + 1 (probes go out and back on these)
        assert (paths.evs[slot].index, paths.evs[slot].plane, paths.evs[slot].spine) == (slot, fabric_ev.plane,
                                                                                          fabric_ev.spine)


def test_the_exp_example_mixes_short_and_long_carriers():
    topo = builtin()
    paths = profile_paths(topo, load(PROFILES / "default-h0-h2-exp.yaml"), "h0", "h2")
    assert [e.spine for e in paths.topology_evs] == ["p0s0", "p1s1", "p0s2", "p1s3"]
    assert paths.short == [True, True, False, False]
    assert paths.back[2].first_hop == evs_between(topo, "h2", "h0")[2].usid_carrier  # long forward, long back
    assert paths.forward[3].first_hop == evs_between(topo, "h0", "h2")[7].usid_carrier


def test_an_srh_segment_must_be_the_destinations_decapsulation_address():
    topo = builtin()
    fine = exp_profile("fc00:0:9:3:f0d6::", segment="fc00:0:3:f0d6::")
    assert slot_evs(topo, fine, "h0", "h2")[0].segment == "fc00:0:3:f0d6::"
    with pytest.raises(EvProfileError, match=r"^<exp>: EV 0: fc00:0:9:3:f0d6::: SRH segment fc00:0:4:f0d6:: is not h2's"):
        slot_evs(topo, exp_profile("fc00:0:9:3:f0d6::", segment="fc00:0:4:f0d6::"), "h0", "h2")


@pytest.mark.parametrize("carrier,why", [
    ("fc00:0:5:63:3:f0d6::", "names node 0x63, which the fabric does not have"),
    ("fc00:0:9:4:f0d6::", r"ends at node h3 \(0x4\), not the destination h2 \(0x3\)"),
    ("fc00:0:9:3::", "ends in no local function, not the decapsulation function 0xf0d6"),
    ("fc00:0:9:3:e001::", "ends in function 0xe001, not the decapsulation function 0xf0d6"),
    ("fc00:1:9:3:f0d6::", "is outside the fabric's uSID block fc00:0::/32"),
    ("fc00:0:9:0:3:f0d6::", "has an empty uSID"),
    ("fc00:0:7:9:3:f0d6::", r"names h0 > p1l0 > p0s0 > h2, not a path of the fabric from h0 to h2"),
    ("fc00:0:6:3:f0d6::", r"names h0 > p0l1 > h2, not a path of the fabric"),
])
def test_a_carrier_the_fabric_cannot_carry_is_one_line_naming_the_ev(carrier, why):
    profile = exp_profile("fc00:0:9:3:f0d6::", carrier)
    with pytest.raises(EvProfileError, match=rf"^<exp>: EV 1: {carrier}:? {why}") as caught:
        profile_paths(builtin(), profile, "h0", "h2")
    assert "\n" not in str(caught.value)


def test_a_gen_profile_for_another_destination_is_refused_at_its_first_ev():
    topo = builtin()
    with pytest.raises(EvProfileError, match=r"^<gen>: EV 0: fc00:0:9:4:f0d6:: ends at node h3"):
        profile_paths(topo, gen_profile(topo, "h3"), "h0", "h2")


def test_same_leaf_hosts_turn_at_the_leaf():
    topo = builtin()
    profile = exp_profile("fc00:0:5:2:f0d6::", "fc00:0:7:2:f0d6::")  # h0 -> h1 via p0l0, p1l0
    paths = profile_paths(topo, profile, "h0", "h1")
    assert [(e.plane, e.spine) for e in paths.topology_evs] == [(0, None), (1, None)]
    assert paths.back[1].first_hop == "fc00:0:7:1:f0d6::"


def test_stev_and_udp_profiles_map_onto_plain_paths():
    """A STEV profile's values are flow label bits and source port, each EV's port going round the planes;
    a UDP profile's the source port; a profile whose EVs share a source port is refused (the responder
    tells a QP's EVs apart by it), as the shipped STEV example's fixed 0xBEEF field does."""
    topo = builtin()
    stev = from_dict({"format": {"mode": "STEV", "fields": [32]},
                      "profile": {"mode": "EXP", "ev_count": 3, "ev_min_active": 1, "fields": [{"width": 32}],
                                  "evs": ["0x0000c000", "0x1234c001", "0xbeefc002"]}}, "<stev>")
    paths = profile_paths(topo, stev, "h0", "h2")
    assert [(p.template.flow_label, p.template.ends.sport, p.plane) for p in paths.forward.values()] == [
        (0, 0xC000, 0), (0x1234, 0xC001, 1), (0xBEEF, 0xC002, 0)]  # a value without label bits is STEV still
    assert paths.back[1].template.flow_label == 0x1234 and paths.topology_evs == paths.evs
    udp = from_dict({"format": {"mode": "UDP", "fields": [16]},
                     "profile": {"mode": "EXP", "ev_count": 2, "ev_min_active": 1, "fields": [{"width": 16}],
                                 "evs": ["0xd000", "0xd001"]}}, "<udp>")
    paths = profile_paths(topo, udp, "h0", "h2")
    assert [(p.first_hop, p.template.ends.sport, p.template.encap.outer) for p in paths.forward.values()] == [
        (paths.dst_address, 0xD000, b""), (paths.dst_address, 0xD001, b"")]
    with pytest.raises(EvProfileError, match=r"example-gen.yaml: EV 1: UDP source port 0xbeef is EV 0's too"):
        profile_paths(topo, load(PROFILES / "example-gen.yaml"), "h0", "h2")


def test_carrier_usids_reads_nodes_and_function():
    assert carrier_usids(bytes.fromhex(ad_hex("fc00:0:5:9:6:3:f0d6::"))) == ([5, 9, 6, 3], 0xF0D6)
    assert carrier_usids(bytes.fromhex(ad_hex("fc00:0:1:2:3:4:5:6"))) == ([1, 2, 3, 4, 5, 6], None)
