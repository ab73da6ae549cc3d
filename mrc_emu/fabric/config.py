"""What the kernel of each node is told: sysctls, addresses, SIDs and routes.

Why it exists: the configuration of a node is a pure function of the topology (`plan`),
applied in one netlink batch inside the node's namespace (`apply`). Re-applying is safe
(every request is create-or-replace), which is how a link brought back up gets its
addresses and routes again. Every node routes to its direct neighbours' SIDs, so an EV that
lists every hop needs no more; besides, for the short uSID carrier `fc00:0:<spine>:<dst>:f0d6::`
(docs/addressing.md), a host routes each spine's SIDs up its uplink in that spine's plane and a
spine routes each host's SIDs down to the host's leaf in its plane. Those neighbours are written
down too (permanent entries: every veth end has a MAC the topology fixes), as a fabric's ND/ARP
tables are populated before traffic: resolved on the data path, a next hop behind a lossy link
can hold a QP's ACKs for the one second of an NS retransmission, which the transport takes for
a dead path.
"""

from __future__ import annotations

import functools
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path

from ..topology import Role, Topology
from ..topology import addressing as ad
from .kernel import netns, seg6local
from .kernel.netlink import Batch, Seg6Local

NEXT_CSID = (ad.USID_BLOCK_BITS, ad.USID_BITS)
# The End SID hangs off a veth pair kept inside the node. Not lo: the kernel's End looks the
# next segment up with local delivery disabled, and a seg6local route on a loopback device
# then yields no route (seen on 6.18). No dummy devices here. No link failure touches it.
SID_ANCHOR = "sid0"
SID_ANCHOR_PEER = "sid1"

# ECMP hash inputs (ip-sysctl.rst, fib_multipath_hash_fields; include/net/ip_fib.h FIB_MULTIPATH_HASH_FIELD_*):
# source and destination address, next header, flow label, source and destination port. The UDP format's
# flow label is 0, so its UDP source port still picks the path; a STEV EV's flow label joins in.
HASH_FIELDS = {"src_ip": 0x01, "dst_ip": 0x02, "ip_proto": 0x04, "flowlabel": 0x08, "src_port": 0x10, "dst_port": 0x20}
CUSTOM_HASH_POLICY, L4_HASH_POLICY = 3, 1
STEV_HASH_FIELDS = sum(HASH_FIELDS.values())  # 0x3f
_HASH_FIELDS_SYSCTL = "net.ipv6.fib_multipath_hash_fields"


def _sysctl_path(name: str) -> Path:
    return Path("/proc/sys") / name.replace(".", "/")


@functools.lru_cache(maxsize=1)
def custom_hash_supported() -> bool:
    """Whether this kernel has the custom multipath hash (policy 3 and its fields sysctl, Linux 5.14):
    looked up once, in whatever namespace asks first (every namespace has the same kernel)."""
    return _sysctl_path(_HASH_FIELDS_SYSCTL).exists()


def multipath_hash_sysctls() -> list[tuple[str, int]]:
    """The multipath hash every node is given: custom (policy 3) on STEV_HASH_FIELDS where the
    kernel has it, else the 5-tuple (policy 1: the UDP format works, STEV is refused by stev_hash_problem)."""
    if custom_hash_supported():
        return [("net.ipv6.fib_multipath_hash_policy", CUSTOM_HASH_POLICY), (_HASH_FIELDS_SYSCTL, STEV_HASH_FIELDS)]
    return [("net.ipv6.fib_multipath_hash_policy", L4_HASH_POLICY)]


def multipath_hash(path: str | os.PathLike) -> tuple[int, int | None]:
    """(policy, fields) of the multipath hash in the namespace at `path` (fields None: no such sysctl)."""
    with netns.entered(path):
        policy = int(_sysctl_path("net.ipv6.fib_multipath_hash_policy").read_text())
        fields = _sysctl_path(_HASH_FIELDS_SYSCTL)
        return policy, int(fields.read_text(), 0) if fields.exists() else None


def stev_hash_problem(path: str | os.PathLike) -> str | None:
    """Why the namespace at `path` cannot forward STEV EVs by their hash, or None when it can."""
    policy, fields = multipath_hash(path)
    if fields is None:
        return ("this kernel has no custom multipath hash (net.ipv6.fib_multipath_hash_fields, Linux 5.14+): "
                f"the fabric hashes on policy {policy}, which leaves out the IPv6 flow label a STEV EV is carried in")
    if policy != CUSTOM_HASH_POLICY or fields & STEV_HASH_FIELDS != STEV_HASH_FIELDS:
        return (f"the fabric hashes on policy {policy}, fields {fields:#x}, not policy {CUSTOM_HASH_POLICY} with fields "
                f"{STEV_HASH_FIELDS:#x} (addresses, next header, flow label, ports): bring it up again with this mrc-emu")
    return None


# Written before the node's interfaces exist, so every interface inherits them.
NAMESPACE_SYSCTLS = [
    (f"net.ipv6.conf.{scope}.{key}", value)
    for scope in ("all", "default")
    for key, value in (
        ("forwarding", 1),  # End on a host forwards too (EV probes turn around there)
        ("seg6_enabled", 1),
        ("accept_dad", 0),  # no tentative addresses: a node is usable the moment it is up
        ("accept_ra", 0),
        ("router_solicitations", 0),
        ("keep_addr_on_down", 1),
    )
] + [("net.ipv6.icmp.ratelimit", 0)] + multipath_hash_sysctls()


@dataclass
class Route:
    prefix: str
    intf: str  # 'lo' or one of the node's interfaces
    gateway: str | None = None
    seg6local: Seg6Local | None = None
    multipath: list[tuple[str, str]] | None = None  # (intf, gateway) per nexthop, instead of intf/gateway


@dataclass
class NodePlan:
    node: str
    intfs: list[str] = field(default_factory=list)
    addresses: list[tuple[str, str, int]] = field(default_factory=list)  # (intf, address, prefixlen)
    routes: list[Route] = field(default_factory=list)
    neighbours: list[tuple[str, str, bytes]] = field(default_factory=list)  # (intf, peer address, peer MAC)


def plan(topo: Topology, name: str) -> NodePlan:
    node = topo.node(name)
    result = NodePlan(name)
    result.intfs.append(SID_ANCHOR)
    result.routes.append(
        Route(ad.end_sid(node.node_id) + "/48", SID_ANCHOR, seg6local=Seg6Local("End", next_csid=NEXT_CSID))
    )
    if node.role is Role.HOST:
        result.addresses.append(("lo", ad.host_address(topo, name), 128))
        result.addresses.append(("lo", ad.decap_sid(node.node_id), 128))
    uplinks = []
    for link in topo.links_of(name):
        peer, intf, _ = topo.peer(link, name)
        peer_addr = ad.link_address(link, peer)
        if node.role is Role.HOST:
            uplinks.append((intf, peer_addr))
        elif topo.node(peer).role is Role.HOST:  # plain IPv6 reachability of the host (baseline traffic)
            result.routes.append(Route(ad.host_address(topo, peer) + "/128", intf, gateway=peer_addr))
        result.intfs.append(intf)
        result.addresses.append((intf, ad.link_address(link, name), 64))
        result.neighbours.append((intf, peer_addr, ad.link_mac(link, peer)))
        result.routes.append(Route(ad.usid_prefix(topo.node(peer).node_id), intf, gateway=peer_addr))
        result.routes.append(
            Route(
                ad.endx_prefix(node.node_id, ad.port_of(intf)),
                intf,
                seg6local=Seg6Local("End.X", nh6=peer_addr),
            )
        )
    if uplinks:  # a host reaches other hosts over its planes' leaves; the multipath hash picks one
        result.routes.append(Route(ad.HOST_PREFIX, uplinks[0][0], multipath=uplinks))
    result.routes.extend(_short_carrier_routes(topo, name))
    return result


def _short_carrier_routes(topo: Topology, name: str) -> list[Route]:
    """The routes the short carrier fc00:0:<spine>:<dst>:f0d6:: needs beyond the neighbours' /48s:
    a host's to every spine (via its leaf in the spine's plane), a spine's to every host (via the
    host's leaf in its plane). The leaves on the way already route their neighbours. A plane's
    spines and a leaf's hosts have contiguous node IDs, so a few aligned prefixes hold each run."""
    node = topo.node(name)
    if node.role is Role.LEAF:
        return []
    spines, hosts = _short_carrier_prefixes(topo)
    routes = []
    for link in topo.links_of(name):
        peer, intf, _ = topo.peer(link, name)  # a host's leaf in some plane, or a spine's leaf
        prefixes = spines[link.plane] if node.role is Role.HOST else hosts.get(peer, [])
        routes += [Route(prefix, intf, gateway=ad.link_address(link, peer)) for prefix in prefixes]
    return routes


@functools.lru_cache(maxsize=4)
def _short_carrier_prefixes(topo: Topology) -> tuple[dict[int, list[str]], dict[str, list[str]]]:
    """(each plane's spines, each leaf's hosts) as prefixes: worked out once per topology, not per node."""
    spines: dict[int, list[int]] = {}
    hosts: dict[str, list[int]] = {}
    for node in topo.nodes.values():
        if node.role is Role.SPINE:
            spines.setdefault(node.plane, []).append(node.node_id)
        elif node.role is Role.HOST:
            for plane in range(topo.planes):
                hosts.setdefault(topo.leaf_of(node.name, plane), []).append(node.node_id)
    return ({plane: _runs(ids) for plane, ids in spines.items()}, {leaf: _runs(ids) for leaf, ids in hosts.items()})


def _runs(node_ids: list[int]) -> list[str]:
    """The prefixes holding exactly these node IDs' SIDs (one aligned cover per contiguous run)."""
    out, ids = [], sorted(node_ids)
    start = 0
    for k in range(1, len(ids) + 1):
        if k == len(ids) or ids[k] != ids[k - 1] + 1:
            out += ad.usid_range_prefixes(ids[start], ids[k - 1])
            start = k
    return out


def batch(node_plan: NodePlan, indexes: dict[str, int], skip: frozenset[str] = frozenset()) -> Batch:
    """The netlink requests for a plan; interfaces in `skip` (failed links) are left alone."""
    out = Batch()
    out.link_up(indexes["lo"], what="lo up")
    if SID_ANCHOR_PEER in indexes:
        out.link_up(indexes[SID_ANCHOR_PEER], what=f"{SID_ANCHOR_PEER} up")
    for intf in node_plan.intfs:
        if intf not in skip:
            out.link_up(indexes[intf], what=f"{intf} up")
    for intf, address, prefixlen in node_plan.addresses:
        if intf not in skip:
            out.addr(indexes[intf], address, prefixlen)
    for intf, address, mac in node_plan.neighbours:
        if intf not in skip:
            out.neighbour(indexes[intf], address, mac)
    add_routes(out, node_plan.routes, indexes, skip)
    return out


def add_routes(out: Batch, routes: list[Route], indexes: dict[str, int], skip: frozenset[str] = frozenset()) -> None:
    """Create-or-replace requests for `routes`; nexthops over interfaces in `skip` are left out
    (the kernel refuses a route over a device that is down); so are the SIDs' seg6local routes
    on a kernel that refuses them (the BPF endpoint program does their work: datapath/srv6.py)."""
    kernel_sids = seg6local.kernel_problem() is None
    for route in routes:
        if route.seg6local is not None and not kernel_sids:
            continue
        if route.multipath is not None:
            hops = [(indexes[intf], gw) for intf, gw in route.multipath if intf not in skip]
            if hops:
                out.multipath_route(route.prefix, hops)
        elif route.intf not in skip:
            out.route(route.prefix, indexes[route.intf], route.gateway, route.seg6local)


def interface_indexes() -> dict[str, int]:
    """ifname -> ifindex of the namespace this thread is in."""
    return {name: index for index, name in socket.if_nameindex()}


def apply(node_plan: NodePlan, path: str, skip: frozenset[str] = frozenset()) -> None:
    with netns.entered(path):
        batch(node_plan, interface_indexes(), skip).send()

