"""What one node of the fabric does with a frame: its routes and SIDs, and the SRv6 behaviours.

Why it exists: the virtual fabric must forward each frame exactly as the namespace fabric's
kernels do, from the same addressing plan (topology/addressing.py) and the same routes
(fabric/config.py plans them, fabric/static_routes.py adds the converged plain-IPv6 ones):

    fc00:0:N:e00K::/64   at node N: End.X out of port K (SRH: Segments Left - 1, next segment)
    fc00:0:N::/48        at node N: End with NEXT-C-SID: a carrier's next uSID shifted up, or,
                         its last one spent, the SRH's next segment (Segments Left > 0)
    fc00:0:N::/48        elsewhere: towards N (a neighbour's SIDs over the link to it; a host
                         reaches every spine over its uplink in the spine's plane, a spine every
                         host over the host's leaf in its plane)
    fc00:0:H:f0d6::      local to host H: the SRH is spent (Segments Left 0), the inner packet is H's
    fc00:2:L:I::1        host addresses: local at the host; a leaf's own hosts directly, the
                         others by ECMP over its plane's spines; a spine's via the host's leaf;
                         a host's by ECMP over its uplinks (the baseline's plain UDP)
    fc00:f:K::1, ::2     the ends of link K: connected at both (a STEV frame's first hop)

`Rib.lookup` answers for a destination address from the topology alone (cached per
address; which links are up is the caller's to apply). `end_x` and `end` rewrite a frame in
place as the kernel's seg6local behaviours do. tests/test_vfabric_forwarding.py holds every
answer to the kernel routes config.py and static_routes.py plan.
"""

from __future__ import annotations

import ipaddress
from enum import Enum

from ..topology import Node, Role, Topology
from ..topology import addressing as ad
from ..topology.model import host_name

_BLOCK = ad.USID_BLOCK.to_bytes(4, "big")  # fc00:0000: the uSID/SID block
HOSTS_BLOCK = bytes.fromhex("fc000002")  # fc00:2::/32
_LINKS = bytes.fromhex("fc00000f")  # fc00:f::/32
_HOST_IID = bytes(7) + b"\x01"  # fc00:2:L:I::1
SRH_AT = 40  # the SRH follows the outer IPv6 header


class Hop(Enum):
    """What a node's routes say about a destination."""

    LOCAL = "local"  # an address of this node
    END_X = "end.x"  # this node's End.X SID: out of the port it names
    END = "end"  # this node's uN / End SID (NEXT-C-SID)
    PORTS = "ports"  # forward out of one of these ports (several: ECMP)
    NONE = "none"  # no route


class Rib:
    """One node's routes and SIDs, by the interface index K of its ports (node-ethK). `by_id`:
    the topology's nodes by node ID (made once per fabric; made here if not given). The routes
    that name every host or every spine are worked out for an address when it is first seen."""

    def __init__(self, topo: Topology, name: str, by_id: dict[int, Node] | None = None) -> None:
        node = topo.node(name)
        self.topo, self.by_id = topo, by_id if by_id is not None else {n.node_id: n for n in topo.nodes.values()}
        self.name, self.role, self.node_id, self.plane = name, node.role, node.node_id, node.plane
        self.port_to: dict[str, int] = {}  # neighbour -> port
        self.link_ports: dict[int, int] = {}  # link id -> port (connected /64), for links of this node
        self.local: set[bytes] = set()
        for link in topo.links_of(name):
            peer, intf, _ = topo.peer(link, name)
            self.port_to[peer] = self.link_ports[link.link_id] = ad.port_of(intf)
            self.local.add(_packed(ad.link_address(link, name)))
        self.endx_ports = set(self.port_to.values())
        self.neighbour_ports = {topo.node(peer).node_id: k for peer, k in self.port_to.items()}
        self.uplinks: tuple[int, ...] = ()  # a host's, one per plane
        self.spine_ports: tuple[int, ...] = ()  # a leaf's
        if node.role is Role.HOST:
            self.local |= {_packed(ad.host_address(topo, name)), _packed(ad.decap_sid(node.node_id))}
            self.uplinks = tuple(self.port_to[topo.leaf_of(name, p)] for p in range(topo.planes))
        elif node.role is Role.LEAF:
            self.spine_ports = tuple(k for peer, k in self.port_to.items() if topo.node(peer).role is Role.SPINE)
        self._cache: dict[bytes, tuple[Hop, object]] = {}

    def _sid_port(self, node_id: int) -> int | None:
        """The port node `node_id`'s SIDs are routed out of: a neighbour's over the link to it; at a
        host, a spine's over its uplink in that plane; at a spine, a host's via the host's leaf."""
        port = self.neighbour_ports.get(node_id)
        if port is not None:
            return port
        node = self.by_id.get(node_id)
        if node is None:
            return None
        if self.role is Role.HOST and node.role is Role.SPINE:
            return self.port_to[self.topo.leaf_of(self.name, node.plane)]
        if self.role is Role.SPINE and node.role is Role.HOST:
            return self.port_to[self.topo.leaf_of(node.name, self.plane)]
        return None

    def _host_route(self, host: str) -> tuple[int, ...]:
        """At a switch, the ports of its /128 to `host`: a leaf's own host directly, another leaf's
        by ECMP over the plane's spines (static routing: what BGP converges to); a spine's via the
        host's leaf."""
        leaf = self.topo.leaf_of(host, self.plane)
        if self.role is Role.LEAF:
            return (self.port_to[host],) if leaf == self.name else self.spine_ports
        return (self.port_to[leaf],)

    def lookup(self, dst: bytes) -> tuple[Hop, object]:
        """(what, detail) for destination `dst` (16 bytes): LOCAL, END_X (its port), END, PORTS
        (a tuple of ports), NONE."""
        hit = self._cache.get(dst)
        if hit is None:
            hit = self._cache[dst] = self._resolve(dst)
        return hit

    def _resolve(self, dst: bytes) -> tuple[Hop, object]:
        if dst in self.local:
            return Hop.LOCAL, None
        head = dst[:4]
        if head == _BLOCK:
            node_id, function = int.from_bytes(dst[4:6], "big"), int.from_bytes(dst[6:8], "big")
            if node_id == self.node_id:
                port = function - ad.ENDX_FUNCTION_BASE
                if port in self.endx_ports:
                    return Hop.END_X, port
                return Hop.END, None
            port = self._sid_port(node_id)
            return (Hop.PORTS, (port,)) if port is not None else (Hop.NONE, None)
        if head == HOSTS_BLOCK:
            if self.role is Role.HOST:  # fc00:2::/32 over every uplink
                return Hop.PORTS, self.uplinks
            leaf, index = int.from_bytes(dst[4:6], "big"), int.from_bytes(dst[6:8], "big")
            host = leaf * self.topo.hosts_per_leaf + index
            if dst[8:] == _HOST_IID and index < self.topo.hosts_per_leaf and host < self.topo.host_count:
                return Hop.PORTS, self._host_route(host_name(host))  # a switch has a /128 per host
            return Hop.NONE, None
        if head == _LINKS and dst[6:15] == bytes(9) and dst[15] in (1, 2):
            port = self.link_ports.get(int.from_bytes(dst[4:6], "big"))
            return (Hop.PORTS, (port,)) if port is not None else (Hop.NONE, None)
        return Hop.NONE, None


def _packed(address: str) -> bytes:
    return ipaddress.IPv6Address(address).packed


def next_segment(frame: bytearray) -> bool:
    """The SRH's next segment becomes the destination (Segments Left - 1), as End and End.X do;
    False (drop) without an SRH or with Segments Left 0."""
    if frame[6] != 43 or len(frame) < SRH_AT + 8:
        return False
    left = frame[SRH_AT + 3]
    if left == 0:
        return False
    left -= 1
    at = SRH_AT + 8 + 16 * left
    if len(frame) < at + 16:
        return False
    frame[SRH_AT + 3] = left
    frame[24:40] = frame[at:at + 16]
    return True


def end(frame: bytearray) -> bool:
    """End with NEXT-C-SID (32-bit block, 16-bit uSIDs): the carrier's argument shifted up by one
    uSID while it holds one; once it is spent, classic End on the SRH. False: drop."""
    if any(frame[30:40]):
        frame[28:38] = frame[30:40]
        frame[38:40] = b"\0\0"
        return True
    return next_segment(frame)
