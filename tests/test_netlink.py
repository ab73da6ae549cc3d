"""Our batched netlink messages are byte for byte the ones pyroute2 encodes (no root)."""

import ipaddress

import pytest
from pyroute2.netlink import NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE, NLM_F_REQUEST
from pyroute2.netlink.rtnl import RTM_NEWADDR, RTM_NEWLINK, RTM_NEWROUTE
from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg
from pyroute2.netlink.rtnl.rtmsg import rtmsg
from pyroute2.netlink.rtnl.tcmsg import tcmsg

from mrc_emu.fabric import config
from mrc_emu.fabric.kernel import netlink
from mrc_emu.fabric.kernel.netlink import Batch, Seg6Local
from mrc_emu.topology import addressing as ad
from mrc_emu.topology import builtin

CREATE = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE


def _encode(msg, kind, flags, seq):
    msg["header"]["type"] = kind
    msg["header"]["flags"] = flags
    msg["header"]["sequence_number"] = seq
    msg["header"]["pid"] = 0
    msg.encode()
    return bytes(msg.data)


def _route(seq, prefix, plen, oif, extra):
    msg = rtmsg()
    msg["family"], msg["dst_len"], msg["table"], msg["proto"], msg["scope"], msg["type"] = 10, plen, 254, 4, 0, 1
    msg["attrs"] = [("RTA_TABLE", 254), ("RTA_DST", prefix), ("RTA_OIF", oif)] + extra
    return _encode(msg, RTM_NEWROUTE, CREATE, seq)


def test_messages_equal_pyroute2():
    batch = Batch()
    batch.link_up(5)
    batch.addr(5, "fc00:f:1::1", 64)
    batch.route("fc00:0:9::/48", 5, gateway="fc00:f:1::2")
    batch.route("fc00:0:5:e002::/64", 5, seg6local=Seg6Local("End.X", nh6="fc00:f:1::2"))
    ours = batch.messages()

    link = ifinfmsg()
    link["family"], link["index"], link["flags"], link["change"] = 0, 5, 1, 1
    link["attrs"] = []
    addr = ifaddrmsg()
    addr["family"], addr["prefixlen"], addr["flags"], addr["scope"], addr["index"] = 10, 64, 0x82, 0, 5
    addr["attrs"] = [("IFA_LOCAL", "fc00:f:1::1"), ("IFA_ADDRESS", "fc00:f:1::1")]
    theirs = [
        _encode(link, RTM_NEWLINK, NLM_F_REQUEST | NLM_F_ACK, 1),
        _encode(addr, RTM_NEWADDR, CREATE, 2),
        _route(3, "fc00:0:9::", 48, 5, [("RTA_GATEWAY", "fc00:f:1::2")]),
        _route(4, "fc00:0:5:e002::", 64, 5, [
            ("RTA_ENCAP_TYPE", 7),
            ("RTA_ENCAP", {"attrs": [("SEG6_LOCAL_ACTION", {"value": "End.X"}), ("SEG6_LOCAL_NH6", "fc00:f:1::2")]}),
        ]),
    ]
    assert ours == theirs


def _covering(routes, address):
    """The gateway routes whose prefix holds `address`."""
    return [r for r in routes if ipaddress.IPv6Address(address) in ipaddress.IPv6Network(r.prefix)]


@pytest.mark.parametrize("name", ["default", "large"])
def test_plan_routes_to_neighbours_and_the_short_carriers_hosts(name):
    """A spine routes its neighbours' SIDs, and every host's SIDs (the short uSID carrier) via the
    host's leaf in its plane, in as few prefixes as hold them; nothing else has a gateway."""
    topo = builtin(name)
    plan = config.plan(topo, "p0s0")
    gateways = [r for r in plan.routes if r.gateway]
    neighbours = {ad.usid_prefix(topo.node(topo.peer(link, "p0s0")[0]).node_id) for link in topo.links_of("p0s0")}
    assert len(neighbours) == len(topo.links_of("p0s0")) == topo.leaves_per_plane
    assert neighbours <= {r.prefix for r in gateways}
    for host in topo.hosts:  # each host's SIDs: one route, down to the host's leaf in plane 0
        (route,) = _covering([r for r in gateways if r.prefix not in neighbours], ad.end_sid(host.node_id))
        (link,) = topo.links_between("p0s0", topo.leaf_of(host.name, 0))
        assert route.gateway == ad.link_address(link, link.a)
    covered = {n.node_id for n in topo.nodes.values() for r in gateways if r.prefix not in neighbours
               and _covering([r], ad.end_sid(n.node_id))}
    assert covered == {h.node_id for h in topo.hosts}
    assert sum(r.seg6local is not None and r.seg6local.action == "End.X" for r in plan.routes) == topo.leaves_per_plane
    (end,) = [r for r in plan.routes if r.seg6local and r.seg6local.action == "End"]
    assert end.intf == config.SID_ANCHOR and end.seg6local.next_csid == (32, 16)
    if name == "large":  # 8 hosts a leaf (IDs 8L+1..8L+8): 4 aligned prefixes each
        assert len(gateways) == len(neighbours) + 4 * topo.leaves_per_plane


def test_a_host_routes_every_spine_up_its_plane():
    topo = builtin()
    routes = [r for r in config.plan(topo, "h0").routes if r.gateway]
    spines = [n for n in topo.nodes.values() if n.role.value == "spine"]
    for spine in spines:
        (link,) = topo.links_between("h0", topo.leaf_of("h0", spine.plane))
        (route,) = _covering([r for r in routes if r.prefix != ad.usid_prefix(topo.node(link.b).node_id)],
                             ad.end_sid(spine.node_id))
        assert (route.intf, route.gateway) == (link.a_intf, ad.link_address(link, link.b))
    assert ad.usid_range_prefixes(9, 16) == ["fc00:0:9::/48", "fc00:0:a::/47", "fc00:0:c::/46", "fc00:0:10::/48"]
    assert ad.usid_range_prefixes(0, 7) == ["fc00::/45"] and ad.usid_range_prefixes(5, 5) == ["fc00:0:5::/48"]


def test_veth_equals_pyroute2():
    """A veth pair with both ends placed by namespace fd and their indexes fixed (cabling.py)."""
    batch = Batch()
    batch.veth("p0l0-eth2", 7, "p0s0-eth0", 9, 9000, index=40, peer_index=41)
    msg = ifinfmsg()
    msg["family"], msg["index"], msg["flags"], msg["change"] = 0, 40, 0, 0
    peer = {"index": 41, "attrs": [("IFLA_IFNAME", "p0s0-eth0"), ("IFLA_NET_NS_FD", 9), ("IFLA_MTU", 9000)]}
    msg["attrs"] = [("IFLA_IFNAME", "p0l0-eth2"), ("IFLA_NET_NS_FD", 7), ("IFLA_MTU", 9000),
                    ("IFLA_LINKINFO", {"attrs": [("IFLA_INFO_KIND", "veth"),
                                                 ("IFLA_INFO_DATA", {"attrs": [("VETH_INFO_PEER", peer)]})]})]
    assert batch.messages() == [_encode(msg, RTM_NEWLINK, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL, 1)]


def test_cabling_indexes_unique_and_never_shared_by_a_pair():
    from mrc_emu.fabric import cabling

    topo = builtin("large")
    ends = [(link.a, cabling.index_of(link, link.a)) for link in topo.links]
    ends += [(link.b, cabling.index_of(link, link.b)) for link in topo.links]
    assert len({index for _, index in ends}) == len(ends)  # unique across the fabric, so within each node
    assert min(index for _, index in ends) > cabling.ANCHOR_INDEX + 1  # lo, sid0, sid1 keep 1, 2, 3
    assert len(cabling.batch(topo, {n: 3 for n in topo.nodes})) == len(topo.nodes) + len(topo.links)


def test_qdisc_counters_read_the_tbf_of_one_interface_as_pyroute2_encodes_it():
    """netlink.qdisc_counters (scripts/port_queue.py's 0.2 ms TBF read) parses what pyroute2 encodes."""

    def message(index: int, kind: str) -> bytes:
        msg = tcmsg()
        msg["index"], msg["handle"], msg["parent"], msg["info"] = index, 0x10000, 0xFFFFFFFF, 1
        msg["attrs"] = [("TCA_KIND", kind), ("TCA_STATS2", {"attrs": [
            ("TCA_STATS_BASIC", {"bytes": 3282680, "packets": 402}),
            ("TCA_STATS_QUEUE", {"qlen": 3, "backlog": 24618, "drops": 0, "requeues": 0, "overlimits": 5})]})]
        msg["header"]["type"] = netlink.RTM_NEWQDISC
        msg.encode()
        return bytes(msg.data)

    assert netlink.qdisc_message_counters(message(7, "tbf"), 7, "tbf") == (3282680, 24618)
    assert netlink.qdisc_message_counters(message(8, "tbf"), 7, "tbf") is None  # another interface
    assert netlink.qdisc_message_counters(message(7, "htb"), 7, "tbf") is None  # TBF's child
