"""Paths of a QP from the topology's EV list (EV profile EXPLICIT), and the driver interface.

Why it exists: a QP needs, per EV, a frame template and a first hop, for data (requester
to responder; EV probes take the same paths), for ACKs and probe responses (the reverse EV:
same plane and spine, back). The fabric's EV list is the controller's.
A STEV EV is a 32-bit value instead (flow label and UDP source port, topology.evs.stev_evs)
and a port: its frames leave on that port's plane, addressed to the leaf there, and the
fabric's ECMP hash picks the spine; its ACKs come back as plain UDP with the same value.
`Send` and `Endpoint` are the whole contract between a QP and the driver that carries its
frames (mrc_emu.io): frames out through `send(frame, path)`, datagrams (with the traffic class
they arrived with: ECN and the trimmed DSCPs) and time in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from ...topology import Topology, evs_between
from ...topology import addressing as ad
from ...topology.evs import Ev, EvFormat, default_stev, stev_evs, stev_flow_label
from ...wire import format as fmt
from ...wire.encoder import Encap, FrameTemplate
from ...wire.format import Endpoints


@dataclass
class Path:
    """One way to send: an EV's frame template and the first hop the frame is routed to."""

    ev: int
    first_hop: str  # the outer destination address (first segment, carrier, or the host itself)
    template: FrameTemplate
    plane: int | None = None  # the EV's plane: it leaves by port plane + 1 and arrives at the peer's port plane + 1


Send = Callable[[bytes | bytearray, Path], bool]  # False: the frame could not leave (no route)


class Endpoint(Protocol):
    """The face of a requester or responder that a driver sees."""

    address: bytes  # packed IPv6 address the endpoint receives on

    def on_datagram(self, payload: bytes | memoryview, src: bytes, sport: int, now: int,
                    tclass: int = 0) -> None: ...  # tclass: the IPv6 traffic class it arrived with
    def pump(self, now: int, send: Send, clock: Callable[[], int] | None = None,
             horizon: int | None = None) -> None: ...
    def next_wakeup(self) -> int | None: ...


@dataclass
class QpPaths:
    forward: dict[int, Path]  # requester -> responder, by EV index
    back: dict[int, Path]  # responder -> requester, by the forward EV's index
    evs: list[Ev]
    src_address: str
    dst_address: str


def _path(ev: Ev, src: str, dst: str, ev_format: EvFormat, sport: int, tclass: int = fmt.TCLASS_DATA) -> Path:
    ends = Endpoints(src, dst, sport)
    if ev_format is EvFormat.SRV6:
        return Path(ev.index, ev.segments[0], FrameTemplate(ends, Encap.srv6(src, ev.segments), data_tclass=tclass),
                    ev.plane)
    if ev_format is EvFormat.SRV6_USID:
        return Path(ev.index, ev.usid_carrier, FrameTemplate(ends, Encap.usid(src, ev.usid_carrier, ev.segments[-1]),
                                                             data_tclass=tclass), ev.plane)
    return Path(ev.index, dst, FrameTemplate(ends, Encap.udp(), data_tclass=tclass), ev.plane)


def port_gateway(topo: Topology, host: str, plane: int) -> str:
    """The address a host's frames for plane `plane` are sent to: its leaf's end of the host's link
    there (a raw socket takes the address it is given as the next hop, whatever the frame's own
    destination: the frame leaves on that port, and the leaf routes it on)."""
    leaf = topo.leaf_of(host, plane)
    (link,) = topo.links_between(host, leaf)
    return ad.link_address(link, leaf)


def _stev_path(topo: Topology, ev: Ev, host: str, src: str, dst: str, tclass: int) -> Path:
    template = FrameTemplate(Endpoints(src, dst, ev.udp_sport), Encap.udp(), flow_label=stev_flow_label(ev.stev),
                             data_tclass=tclass)
    return Path(ev.index, port_gateway(topo, host, ev.plane), template, ev.plane)


def stev_paths(topo: Topology, src: str, dst: str, values: list[int | tuple[int, int]] | None = None,
               ev_indexes: list[int] | None = None, trimmable: bool = True) -> QpPaths:
    """The paths of a STEV QP from host `src` to host `dst`: EV i carries `values[i]` (an int, its
    port going round the planes, or a (value, port) pair; ports 1-based), or by default, one EV per
    path of the topology, `default_stev(k)` on EV k's plane. Data and ACKs are plain UDP with the
    EV's flow label and source port; EV probes take the same two paths (the responder answers)."""
    tclass = fmt.TCLASS_DATA if trimmable else fmt.TCLASS_DATA_NO_TRIM
    if values is None:
        values = [(default_stev(ev.index), ev.plane + 1) for ev in evs_between(topo, src, dst)]
    evs = _selected(stev_evs(topo, src, dst, list(values)), ev_indexes, src, dst)
    me, peer = ad.host_address(topo, src), ad.host_address(topo, dst)
    forward = {ev.index: _stev_path(topo, ev, src, me, peer, tclass) for ev in evs}
    back = {ev.index: _stev_path(topo, ev, dst, peer, me, fmt.TCLASS_DATA) for ev in evs}
    return QpPaths(forward, back, evs, me, peer)


def _selected(evs: list[Ev], ev_indexes: list[int] | None, src: str, dst: str) -> list[Ev]:
    if ev_indexes is None:
        return evs
    unknown = [k for k in ev_indexes if not 0 <= k < len(evs)]
    if unknown:
        raise ValueError(f"no EV {unknown[0]} between {src} and {dst} (EVs 0..{len(evs) - 1})")
    return [evs[k] for k in ev_indexes]


def qp_paths(topo: Topology, src: str, dst: str, ev_format: EvFormat = EvFormat.SRV6,
             ev_indexes: list[int] | None = None, trimmable: bool = True,
             stev_values: list[int | tuple[int, int]] | None = None) -> QpPaths:
    """Every path a QP from host `src` to host `dst` uses (all EVs, or those in `ev_indexes`).
    `trimmable`: its data packets say DSCP_TRIMMABLE (MRC), else DSCP_NO_TRIM (RoCEv2 RC).
    `stev_values`: the STEV format's EV values (`stev_paths`); only with EvFormat.STEV."""
    if ev_format is EvFormat.STEV:
        return stev_paths(topo, src, dst, stev_values, ev_indexes, trimmable)
    if stev_values is not None:
        raise ValueError(f"STEV values given for EV format {ev_format.value}")
    tclass = fmt.TCLASS_DATA if trimmable else fmt.TCLASS_DATA_NO_TRIM
    evs = _selected(evs_between(topo, src, dst), ev_indexes, src, dst)
    reverse = {(ev.plane, ev.spine): ev for ev in evs_between(topo, dst, src)}
    me, peer = ad.host_address(topo, src), ad.host_address(topo, dst)
    forward, back = {}, {}
    for ev in evs:
        forward[ev.index] = _path(ev, me, peer, ev_format, ev.udp_sport, tclass)
        rev = reverse[(ev.plane, ev.spine)]
        back_path = _path(rev, peer, me, ev_format, ev.udp_sport)
        back[ev.index] = Path(ev.index, back_path.first_hop, back_path.template, ev.plane)
    return QpPaths(forward, back, evs, me, peer)
