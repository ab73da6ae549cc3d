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
    STEV = "STEV"  # no SRv6: a 32-bit EV in the IPv6 flow label and the UDP source port; the EV's port
    # (the host's NIC on one plane) picks the plane, the leaves' ECMP hash on flow label and L4 the spine


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
    stev: int | None = None  # STEV format: the 32-bit value (flow label << 16 | UDP sport); spine unknown (hashed)

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
        } | ({"stev": self.stev, "flow_label": stev_flow_label(self.stev)} if self.stev is not None else {})


UDP_SPORT_BASE = 0xC000  # RoCEv2 source ports come from the dynamic range


def udp_sport(index: int) -> int:
    """The UDP source port (RoCEv2 entropy) that EV `index` carries, in every EV format."""
    return UDP_SPORT_BASE + index


def ev_of_sport(sport: int) -> int:
    """The EV a datagram came on, from its UDP source port (the inverse of `udp_sport`)."""
    return sport - UDP_SPORT_BASE


STEV_MAX = 0xFFFFFFFF
_STEV_LABEL_STEP = 0x9E37  # odd, so i -> label is a bijection modulo 2^16 (Fibonacci hashing's constant)


def stev_sport(value: int) -> int:
    """The UDP source port a STEV value puts on the wire: its low 16 bits."""
    return value & 0xFFFF


def stev_flow_label(value: int) -> int:
    """The IPv6 flow label a STEV value puts on the wire: its high 16 bits (the label's low 16 of 20)."""
    return value >> 16


def default_stev(index: int) -> int:
    """EV `index`'s STEV value when none is given: UDP source port `udp_sport(index)` (so the responder
    finds the EV as in every format) and a non-zero flow label spread over 16 bits by `index`."""
    return ((index + 1) * _STEV_LABEL_STEP & 0xFFFF) << 16 | udp_sport(index)


def stev_evs(topo: Topology, src: str, dst: str, values: list[int | tuple[int, int]]) -> list[Ev]:
    """EV i of a STEV QP from `src` to `dst` for each of `values`: an int (its port, the plane it
    leaves on, goes round the planes: port i % planes + 1) or a (value, port) pair, ports 1-based.
    The spine is whatever the leaf's ECMP hash makes of the value, so it is None and `hops` holds
    only the known nodes. Two EVs with the same low 16 bits (UDP source port) are an error naming
    both: the responder tells EVs apart by source port."""
    evs_between(topo, src, dst)  # both must be hosts, and not the same
    out: list[Ev] = []
    by_sport: dict[int, int] = {}
    for index, entry in enumerate(values):
        value, port = entry if isinstance(entry, tuple) else (entry, index % topo.planes + 1)
        if not 0 <= value <= STEV_MAX:
            raise TopologyError(f"STEV value {value:#x} of EV {index} does not fit in 32 bits")
        if not 1 <= port <= topo.planes:
            raise TopologyError(f"EV {index}: port {port} is not one of {src}'s ports 1..{topo.planes}")
        sport = stev_sport(value)
        if sport in by_sport:
            other = by_sport[sport]
            raise TopologyError(f"STEV EVs {other} ({_value_of(values[other]):#010x}) and {index} ({value:#010x}) "
                                f"share UDP source port {sport:#06x}: the responder could not tell them apart")
        by_sport[sport] = index
        plane = port - 1
        leaf_a, leaf_b = topo.leaf_of(src, plane), topo.leaf_of(dst, plane)
        hops = (src, leaf_a, dst) if leaf_a == leaf_b else (src, leaf_a, leaf_b, dst)
        out.append(Ev(index=index, src=src, dst=dst, plane=plane, spine=None, hops=hops, segments=(),
                      usid_carrier="", udp_sport=sport, stev=value))
    return out


def _value_of(entry: int | tuple[int, int]) -> int:
    return entry[0] if isinstance(entry, tuple) else entry


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
