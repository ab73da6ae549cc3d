"""Static routing: the routes BGP converges to in this fabric, installed directly over netlink.

Why it exists: the baseline (RoCEv2 as deployed) needs plain IPv6 routing between hosts.
routing.py gets it from FRR, three daemons in every switch: on `default` BGP takes about 6 s
to converge here, and `large` would need 576 daemons. When repair is not what a run
measures, the converged routes are all the baseline needs, and they follow from the topology
alone (RFC 7938 eBGP as routing.py configures it: one ASN per plane's spines, one per leaf,
each leaf announcing its hosts' /128s, multipath over equal AS paths):

    leaf   a /128 to every host not cabled to it, ECMP over every spine of its plane
           (AS path spine-ASN, leaf-ASN through each spine: all equal, all used)
    spine  a /128 to every host, via the one leaf of its plane that host is cabled to
           (a path through another leaf would cross the spine tier's ASN twice)

Hosts' ECMP routes over their planes' leaves and leaves' routes to their own hosts are in every
fabric already (config.py). The UDP source port of the 5-tuple picks the path, as with BGP.
tests/test_routing_system.py proves on `default` that these are the routes FRR installs: the
same prefixes over the same interfaces, each gateway naming the same neighbour (FRR names it
by its link-local address, this module by its link address).

What it never does is repair. Nothing here watches the fabric: when a link goes down the kernel
of each end drops the routes through it (a leaf's ECMP loses that spine, a spine loses its only
route to that leaf's hosts), and no other node learns of it. Traffic that other leaves hash onto
that spine is lost until the link comes back; set_link then re-applies both ends' routes (the
kernel does not restore them itself). That is why `bgp` stays the routing of every scenario that
measures the baseline's repair after a fault.
"""

from __future__ import annotations

import functools
import time

from ..topology import Role, Topology
from ..topology import addressing as ad
from . import config
from .kernel import netns
from .kernel.netlink import Batch
from .running import Fabric

MODE = "static"


@functools.lru_cache(maxsize=4)
def _host_prefixes(topo: Topology) -> list[tuple[str, str]]:
    """(host, its /128) of every host: the same in every switch's plan."""
    return [(h.name, ad.host_address(topo, h.name) + "/128") for h in topo.hosts]


def plan(topo: Topology, node: str) -> list[config.Route]:
    """The host routes BGP would have given this switch once converged (nothing for a host)."""
    me = topo.node(node)
    routes: list[config.Route] = []
    if me.role is Role.LEAF:
        uplinks = []
        for link in topo.links_of(node):
            peer, intf, _ = topo.peer(link, node)
            if topo.node(peer).role is Role.SPINE:
                uplinks.append((intf, ad.link_address(link, peer)))
        routes = [config.Route(prefix, uplinks[0][0], multipath=uplinks)
                  for host, prefix in _host_prefixes(topo) if topo.leaf_of(host, me.plane) != node]
    elif me.role is Role.SPINE:
        down = {}  # leaf -> (interface, the leaf's address on that link)
        for link in topo.links_of(node):
            peer, intf, _ = topo.peer(link, node)
            down[peer] = (intf, ad.link_address(link, peer))
        for host, prefix in _host_prefixes(topo):
            intf, gateway = down[topo.leaf_of(host, me.plane)]
            routes.append(config.Route(prefix, intf, gateway=gateway))
    return routes


def apply(fabric: Fabric, node: str, skip: frozenset[str] = frozenset()) -> int:
    """Install (create or replace) a switch's routes, leaving out interfaces in `skip`; returns
    how many requests that took."""
    routes = plan(fabric.topology, node)
    if not routes:
        return 0
    with netns.entered(fabric.netns(node)):
        out = Batch()
        config.add_routes(out, routes, config.interface_indexes(), skip)
        out.send()
    return len(out)


def down_interfaces(topo: Topology, node: str, down_links: set[int]) -> frozenset[str]:
    """The node's interfaces on links the journal records as down."""
    return frozenset(topo.peer(link, node)[1] for link in topo.links_of(node) if link.link_id in down_links)


def install(fabric: Fabric) -> float:
    """Give every switch of the fabric its converged routes; returns the seconds it took.
    The journal records the mode first, so a link brought up later gets them back."""
    began = time.monotonic()
    fabric.journal.routing(MODE)
    topo = fabric.topology
    down = fabric.state().down_links
    for node in topo.nodes.values():
        if node.role is not Role.HOST:
            apply(fabric, node.name, down_interfaces(topo, node.name, down))
    return time.monotonic() - began


def installed(fabric: Fabric) -> bool:
    return fabric.state().routing == MODE
