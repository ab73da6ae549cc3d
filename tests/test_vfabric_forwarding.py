"""The virtual fabric forwards as the namespace fabric's kernels do: every node's answer for every
address of the plan is the one its kernel routes give (fabric/config.py's plan and the converged
static routes of fabric/static_routes.py, by longest prefix), and the SRv6 behaviours rewrite a
frame as seg6local End (NEXT-C-SID) and End.X do."""

from __future__ import annotations

import ipaddress

import pytest

from mrc_emu.fabric import config, static_routes
from mrc_emu.topology import Role, builtin, evs_between, from_dict
from mrc_emu.topology import addressing as ad
from mrc_emu.topology.evs import EvFormat
from mrc_emu.transport.multipath.paths import qp_paths
from mrc_emu.vfabric.forwarding import Hop, Rib, end, next_segment
from mrc_emu.wire.format import DataPacket

ONE_LEAF = from_dict({"name": "oneleaf", "planes": 2, "spines_per_plane": 2, "leaves_per_plane": 1, "hosts_per_leaf": 3})


class KernelRoutes:
    """A node's kernel table as config.py and static_routes.py plan it: its local addresses, its
    routes, and the connected route the kernel gives each address with a prefix on an interface."""

    def __init__(self, topo, name: str) -> None:
        plan = config.plan(topo, name)
        self.local = {ipaddress.IPv6Address(a).packed for _, a, _ in plan.addresses}
        connected = [config.Route(str(ipaddress.IPv6Network(f"{a}/{n}", strict=False)), intf)
                     for intf, a, n in plan.addresses if intf != "lo"]
        routes = plan.routes + static_routes.plan(topo, name) + connected
        self.routes = sorted(((ipaddress.IPv6Network(r.prefix, strict=False), r) for r in routes),
                             key=lambda item: -item[0].prefixlen)

    def answer(self, dst: bytes) -> tuple[Hop, object]:
        """What the kernel does with `dst`: a local address first, then the longest prefix."""
        if dst in self.local:
            return Hop.LOCAL, None
        address = ipaddress.IPv6Address(dst)
        route = next((r for net, r in self.routes if address in net), None)
        if route is None:
            return Hop.NONE, None
        if route.seg6local is not None:
            return (Hop.END, None) if route.seg6local.action == "End" else (Hop.END_X, ad.port_of(route.intf))
        intfs = [intf for intf, _ in route.multipath] if route.multipath else [route.intf]
        return Hop.PORTS, {ad.port_of(intf) for intf in intfs}


def addresses(topo) -> list[bytes]:
    """Every address a frame of this fabric may be sent to, and a few it may not."""
    out = []
    for node in topo.nodes.values():
        out += [ad.end_sid(node.node_id), ad.decap_sid(node.node_id), ad.end_sid(node.node_id).replace("::", ":1::")]
        out += [ad.endx_sid(node.node_id, ad.port_of(topo.peer(link, node.name)[1])) for link in topo.links_of(node.name)]
        if node.role is Role.HOST:
            out.append(ad.host_address(topo, node.name))
    for link in topo.links:
        out += [ad.link_address(link, link.a), ad.link_address(link, link.b)]
    hosts = [h.name for h in topo.hosts]
    for src, dst in [(hosts[0], hosts[-1]), (hosts[-1], hosts[0]), (hosts[0], hosts[1])]:
        for ev in evs_between(topo, src, dst):
            out.append(ev.usid_carrier)
            if ev.spine is not None:  # the short carrier: the spine, then the destination
                out.append(ad.usid_carrier([topo.node(ev.spine).node_id, topo.node(dst).node_id], ad.USID_DECAP_FUNCTION))
    out += ["fc00:2:99:0::1", "fc00:0:dfff::", "2001:db8::1", "fc00:f:ffff::1"]
    return [ipaddress.IPv6Address(a).packed for a in out]


@pytest.mark.parametrize("topo", [builtin("default"), builtin("fourplane"), ONE_LEAF], ids=lambda t: t.name)
def test_every_node_answers_every_address_as_its_kernel_routes_do(topo):
    dsts = addresses(topo)
    for name in topo.nodes:
        kernel, rib = KernelRoutes(topo, name), Rib(topo, name)
        for dst in dsts:
            hop, detail = rib.lookup(dst)
            got = (hop, set(detail)) if hop is Hop.PORTS else (hop, detail)
            assert got == kernel.answer(dst), (name, str(ipaddress.IPv6Address(dst)))


def _outer(frame: bytearray) -> str:
    return str(ipaddress.IPv6Address(bytes(frame[24:40])))


def test_an_srh_frame_follows_its_segments_hop_by_hop():
    topo = builtin()
    ev = evs_between(topo, "h0", "h2")[5]
    frame = bytearray(qp_paths(topo, "h0", "h2", EvFormat.SRV6).forward[5].template.encode(DataPacket(1, 2, 3, 4, b"x")))
    node, seen = "h0", []
    for here in ev.hops[1:-1]:
        assert Rib(topo, here).lookup(bytes(frame[24:40]))[0] is Hop.END_X  # each forwarding hop's own End.X
        assert next_segment(frame)
        seen.append(_outer(frame))
        node = here
    assert seen == list(ev.segments[1:]) and _outer(frame) == ad.decap_sid(topo.node("h2").node_id)
    assert frame[43] == 0 and not next_segment(frame)  # Segments Left 0: spent, End.X would drop
    assert Rib(topo, "h2").lookup(bytes(frame[24:40]))[0] is Hop.LOCAL and node == ev.hops[-2]


def test_a_usid_carrier_shifts_one_usid_per_hop_then_reaches_the_decapsulation_address():
    topo = builtin()
    ev = evs_between(topo, "h0", "h2")[2]
    frame = bytearray(qp_paths(topo, "h0", "h2", EvFormat.SRV6_USID).forward[2].template.encode(DataPacket(1, 2, 3, 4, b"x")))
    ids = [topo.node(h).node_id for h in ev.hops[1:]]
    for k, here in enumerate(ev.hops[1:-1]):
        assert Rib(topo, here).lookup(bytes(frame[24:40]))[0] is Hop.END
        assert end(frame)
        assert _outer(frame) == ad.usid_carrier(ids[k + 1:], ad.USID_DECAP_FUNCTION)
    assert _outer(frame) == ad.decap_sid(topo.node("h2").node_id)
    assert Rib(topo, "h2").lookup(bytes(frame[24:40]))[0] is Hop.LOCAL
    spent = bytearray(frame)
    spent[30:40] = bytes(10)  # the carrier's last uSID, and the SRH's Segments Left 0: End drops it
    assert frame[43] == 0 and not end(spent)


def test_a_hosts_raw_socket_sends_plain_udp_to_one_destination_over_the_same_plane_from_every_host():
    # the kernel hashes an unbound raw socket's flow without a source address or ports, with one
    # key per machine: on the namespace fabric incast8's eight baseline flows into h0 all took plane 0
    import ipaddress
    import random

    from mrc_emu.topology import addressing as ad
    from mrc_emu.topology import builtin
    from mrc_emu.vfabric.engine import Engine
    from mrc_emu.vfabric.fabric import VirtualFabric

    topo = builtin("incast")
    by_dst = {}
    for salt in range(4):
        fabric = VirtualFabric(topo, Engine(), random.Random(0), ecmp_seed=salt)
        for dst in ("h0", "h1", "h2", "h3"):
            address = ipaddress.IPv6Address(ad.host_address(topo, dst)).packed
            planes = {fabric._choose(src, fabric.ribs[src].lookup(address)[1], bytearray(), address).plane
                      for src in ("h4", "h8", "h12", "h16")}
            assert len(planes) == 1  # every source the same plane
            by_dst.setdefault(dst, set()).update(planes)
    assert any(len(planes) == 2 for planes in by_dst.values())  # the destination and the salt decide it
