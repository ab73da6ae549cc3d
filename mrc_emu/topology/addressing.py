"""The addressing plan: every address and SID of a fabric, derived from node and link IDs.

Why it exists: one source of truth for addresses, shared by the fabric (which installs them)
and the wire format and transport (which put them in packets). Pure functions, no kernel.
The plan is documented in docs/addressing.md; change both together.

    fc00:0:N::/48        every SID of node N; a neighbour needs one route to reach them all
    fc00:0:N::           uN of node N: End with NEXT-C-SID (32-bit block, 16-bit node IDs),
                         also the plain End SID of N in a full SRH
    fc00:0:N:e00K::/64   End.X of node N out of its port K (N-ethK): pins that exact link
    fc00:0:N:f0d6::      decapsulation address of host N (a local address on lo): a packet
                         whose SRH reaches Segments Left 0 there is decapsulated by the
                         kernel's own SRH processing and the inner packet delivered
    fc00:2:L:I::1/128    address of host number I under leaf index L (on lo); fc00:2::/32 holds
                         them all (plain IPv6 routing of it is the baseline's, over BGP)
    fc00:f:K::1, ::2/64  the two ends of link K (a = lower tier = ::1)
"""

from __future__ import annotations

import ipaddress

from .model import Link, Topology

USID_BLOCK = 0xFC000000  # 32-bit locator block of uN / uDT6 SIDs (fc00:0::/32)
USID_BLOCK_BITS = 32
USID_BITS = 16
USID_DECAP_FUNCTION = 0xF0D6  # local functions lie above MAX_NODE_ID: never read as a node's uSID
ENDX_FUNCTION_BASE = 0xE000  # End.X of port K is function 0xE000 + K
HOST_PREFIX = "fc00:2::/32"
MAX_USIDS = (128 - USID_BLOCK_BITS) // USID_BITS  # 6 uSIDs fit one carrier


def _v6(value: int) -> str:
    return str(ipaddress.IPv6Address(value))


def _addr(*groups: int) -> str:
    """fc00-style address from leading 16-bit groups, zero-filled."""
    value = 0
    for g in groups:
        value = (value << 16) | g
    return _v6(value << (16 * (8 - len(groups))))


def usid_prefix(node_id: int) -> str:
    return _addr(0xFC00, 0, node_id) + "/48"


def usid_range_prefixes(first: int, last: int) -> list[str]:
    """The fewest prefixes that hold the SIDs of nodes first..last exactly (each a /48 or shorter,
    aligned): one route per prefix then reaches a run of contiguous node IDs (a leaf's hosts, a
    plane's spines) instead of one route per node."""
    out = []
    while first <= last:
        size = first & -first if first else 1 << USID_BITS
        while size > last - first + 1:
            size >>= 1
        out.append(_addr(0xFC00, 0, first) + f"/{USID_BLOCK_BITS + USID_BITS - size.bit_length() + 1}")
        first += size
    return out


def end_sid(node_id: int) -> str:
    return _addr(0xFC00, 0, node_id)


def decap_sid(node_id: int) -> str:
    return _addr(0xFC00, 0, node_id, USID_DECAP_FUNCTION)



def endx_sid(node_id: int, port: int) -> str:
    return _addr(0xFC00, 0, node_id, ENDX_FUNCTION_BASE + port)


def endx_prefix(node_id: int, port: int) -> str:
    return endx_sid(node_id, port) + "/64"


def port_of(intf: str) -> int:
    """'p0l1-eth3' -> 3."""
    return int(intf.rsplit("eth", 1)[1])


def host_address(topo: Topology, host: str) -> str:
    node = topo.node(host)
    leaf, index = divmod(node.index, topo.hosts_per_leaf)
    return _addr(0xFC00, 2, leaf, index, 0, 0, 0, 1)


def link_address(link: Link, node: str) -> str:
    """The address of `node`'s end of `link` (without prefix length: it is /64)."""
    return _addr(0xFC00, 0xF, link.link_id, 0, 0, 0, 0, 1 if node == link.a else 2)


def link_mac(link: Link, node: str) -> bytes:
    """The MAC address of `node`'s end of `link`: locally administered, unique in the fabric
    (02:6d:72 "mr", the link id in 16 bits, then 1 or 2 for the end), so every neighbour entry
    can be written down in advance (fabric/config.py) instead of resolved on the data path."""
    return bytes((0x02, 0x6D, 0x72, (link.link_id >> 8) & 0xFF, link.link_id & 0xFF, 1 if node == link.a else 2))


def usid_carrier(node_ids: list[int], final_function: int | None = None) -> str:
    """A NEXT-C-SID carrier: the block then each uSID in path order, then a local function."""
    usids = list(node_ids) + ([final_function] if final_function is not None else [])
    if not usids or len(usids) > MAX_USIDS:
        raise ValueError(f"a uSID carrier holds 1..{MAX_USIDS} uSIDs, not {len(usids)}")
    value = USID_BLOCK
    for u in usids:
        value = (value << USID_BITS) | u
    return _v6(value << (128 - USID_BLOCK_BITS - USID_BITS * len(usids)))
