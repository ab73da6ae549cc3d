"""EV enumeration: every path (entropy value) between two hosts, with its segment lists.

Why it exists: an EV is the unit the MRC sender sprays over and the unit a probe checks.
The same list serves the fabric (paths, probes), the wire format (SRH / uSID carrier)
and the transport (EV profile EXPLICIT). Pure data; never touches the kernel.

EV numbering is stable: for hosts on different leaves, EV k = plane * spines + spine;
for hosts on the same leaf, EV k = plane (the path turns at the leaf).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from . import addressing as ad
from .model import Topology, TopologyError


class EvFormat(str, Enum):
    """How an EV is carried on the wire (names from the OCP companion API)."""

    SRV6 = "SRV6"  # outer IPv6 + SRH holding the segment list (End.X SIDs, then decapsulation address)
    SRV6_USID = "SRV6_USID"  # outer destination is a NEXT-C-SID carrier, no SRH
    UDP = "UDP"  # no SRv6: the EV is the UDP source port, the fabric's hash picks the path


@dataclass(frozen=True)
class Ev:
    index: int
    src: str
    dst: str
    plane: int
    spine: str | None  # None when both hosts hang off the same leaf
    hops: tuple[str, ...]  # every node from src to dst, both included
    segments: tuple[str, ...]  # SRV6 format, in path order (the SRH stores them reversed)
    usid_carrier: str  # SRV6_USID format: the outer destination
    udp_sport: int  # UDP format, and the RoCEv2 entropy in every format

    @property
    def links(self) -> tuple[tuple[str, str], ...]:
        return tuple(zip(self.hops, self.hops[1:]))

    def crosses(self, a: str, b: str) -> bool:
        return (a, b) in self.links or (b, a) in self.links

    def to_dict(self) -> dict:
        return {
            "ev": self.index,
            "plane": self.plane,
            "spine": self.spine,
            "hops": list(self.hops),
            "segments": list(self.segments),
            "usid_carrier": self.usid_carrier,
            "udp_sport": self.udp_sport,
        }


UDP_SPORT_BASE = 0xC000  # RoCEv2 source ports come from the dynamic range


def udp_sport(index: int) -> int:
    """The UDP source port (RoCEv2 entropy) that EV `index` carries, in every EV format."""
    return UDP_SPORT_BASE + index


def ev_of_sport(sport: int) -> int:
    """The EV a datagram came on, from its UDP source port (the inverse of `udp_sport`)."""
    return sport - UDP_SPORT_BASE


def _segments(topo: Topology, hops: list[str]) -> tuple[str, ...]:
    """End.X of every hop that forwards (out of the port towards the next hop), then decapsulation address."""
    segs = []
    for here, nxt in zip(hops[1:-1], hops[2:]):
        (link,) = topo.links_between(here, nxt)
        _, own_intf, _ = topo.peer(link, here)
        segs.append(ad.endx_sid(topo.node(here).node_id, ad.port_of(own_intf)))
    return tuple(segs) + (ad.decap_sid(topo.node(hops[-1]).node_id),)


def evs_between(topo: Topology, src: str, dst: str) -> list[Ev]:
    """All EVs from host src to host dst, ordered by EV index."""
    for name in (src, dst):
        if topo.node(name).role.value != "host":
            raise TopologyError(f"{name!r} is a {topo.node(name).role.value}, not a host")
    if src == dst:
        raise TopologyError(f"source and destination are both {src!r}")
    same_leaf = topo.node(src).index // topo.hosts_per_leaf == topo.node(dst).index // topo.hosts_per_leaf
    evs: list[Ev] = []
    for plane in range(topo.planes):
        leaf_a, leaf_b = topo.leaf_of(src, plane), topo.leaf_of(dst, plane)
        spines = [None] if same_leaf else [f"p{plane}s{s}" for s in range(topo.spines_per_plane)]
        for spine in spines:
            hops = [src, leaf_a, dst] if spine is None else [src, leaf_a, spine, leaf_b, dst]
            index = len(evs)
            ids = [topo.node(h).node_id for h in hops]
            evs.append(
                Ev(
                    index=index,
                    src=src,
                    dst=dst,
                    plane=plane,
                    spine=spine,
                    hops=tuple(hops),
                    segments=_segments(topo, hops),
                    usid_carrier=ad.usid_carrier(ids[1:], ad.USID_DECAP_FUNCTION),
                    udp_sport=udp_sport(index),
                )
            )
    return evs


def probe_segments(topo: Topology, ev: Ev) -> tuple[str, ...]:
    """The fabric check's probe SRH list: out along the EV to dst's End SID, back along the reverse EV.

    The destination host's kernel turns the probe around (End), so this reachability probe
    (`mrc-emu probe`) needs no MRC endpoint and proves both directions of exactly this EV's
    links. The transport's EV probes are answered by the destination's endpoint instead.
    """
    back = list(reversed(ev.hops))
    dst_id = topo.node(ev.dst).node_id
    return ev.segments[:-1] + (ad.end_sid(dst_id),) + _segments(topo, back)


def ev_count(topo: Topology) -> int:
    """EVs between two hosts on different leaves (the figure `status` reports)."""
    if topo.leaves_per_plane > 1:
        return topo.planes * topo.spines_per_plane
    return topo.planes
