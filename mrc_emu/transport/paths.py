"""Paths of a QP from the topology's EV list (EV profile EXPLICIT), and the driver interface.

Why it exists: a QP needs, per EV, a frame template and a first hop, for data (requester
to responder; EV probes take the same paths), for ACKs and probe responses (the reverse EV:
same plane and spine, back). The fabric's EV list is the controller's.
`Send` and `Endpoint` are the whole contract between a QP and the driver that carries its
frames (mrc_emu.io): frames out through `send(frame, path)`, datagrams (with the traffic class
they arrived with: ECN and the trimmed DSCPs) and time in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from ..topology import Topology, evs_between
from ..topology import addressing as ad
from ..topology.evs import Ev, EvFormat
from ..wire import format as fmt
from ..wire.encoder import Encap, FrameTemplate
from ..wire.format import Endpoints


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


def qp_paths(topo: Topology, src: str, dst: str, ev_format: EvFormat = EvFormat.SRV6,
             ev_indexes: list[int] | None = None, trimmable: bool = True) -> QpPaths:
    """Every path a QP from host `src` to host `dst` uses (all EVs, or those in `ev_indexes`).
    `trimmable`: its data packets say DSCP_TRIMMABLE (MRC), else DSCP_NO_TRIM (RoCEv2 RC)."""
    tclass = fmt.TCLASS_DATA if trimmable else fmt.TCLASS_DATA_NO_TRIM
    evs = evs_between(topo, src, dst)
    if ev_indexes is not None:
        unknown = [k for k in ev_indexes if not 0 <= k < len(evs)]
        if unknown:
            raise ValueError(f"no EV {unknown[0]} between {src} and {dst} (EVs 0..{len(evs) - 1})")
        evs = [evs[k] for k in ev_indexes]
    reverse = {(ev.plane, ev.spine): ev for ev in evs_between(topo, dst, src)}
    me, peer = ad.host_address(topo, src), ad.host_address(topo, dst)
    forward, back = {}, {}
    for ev in evs:
        forward[ev.index] = _path(ev, me, peer, ev_format, ev.udp_sport, tclass)
        rev = reverse[(ev.plane, ev.spine)]
        back_path = _path(rev, peer, me, ev_format, ev.udp_sport)
        back[ev.index] = Path(ev.index, back_path.first_hop, back_path.template, ev.plane)
    return QpPaths(forward, back, evs, me, peer)
