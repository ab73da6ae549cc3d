"""A QP's forward path from the EV value its api EV profile holds now, so that REPLACE_EV re-paths it.

Why it exists: in the OCP model the controller owns an EV's value (mrc_ctl.h: 32 bytes and a
1-based port); the device puts on the wire what the profile holds. A requester bound to a profile
reads its slots' values whenever the profile's `values_version` moves (REPLACE_EV, MODIFY_FIELDS
of a GEN profile) and rebuilds the frame template of each slot whose value or port changed,
from the value alone, as the header's formats say:

- SRV6: bytes 0-15 are the outer IPv6 destination (a uSID carrier, also the first hop the host
  routes to), bytes 16-31 the single SRH segment (all zero: the destination's decapsulation
  address, which the destination's kernel decapsulates at, as evpaths.py does for profile files);
- STEV: bytes 0-3, the high 16 bits in the flow label and the low 16 in the UDP source port; the
  frame leaves by the port's leaf (`gateways`), and the fabric's ECMP hash picks the spine;
- UDP: bytes 0-1 are the UDP source port, routed by the fabric's hash.

The responder tells a QP's EVs apart by UDP source port, so a value keeps the EV's source port
(`sport`) where the format puts it (STEV low 16 bits, UDP): the caller refuses a replacement
that changes it (experiments/runtime/hostctl.py). The ACK paths are not this module's: an EV's
ACKs keep coming back the way its QP was set up with. It never touches the system.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from ...api.evops import ev_slots
from ...api.expansion import generated_evs
from ...api.formats import EvFormatMode
from ...api.profiles import EvProfile, EvProfileMode
from ...topology import Topology
from ...topology import addressing as ad
from ...topology.evs import EvFormat, udp_sport
from ...wire import format as fmt
from ...wire.encoder import Encap, FrameTemplate
from ...wire.format import Endpoints
from .evpaths import carrier_usids
from .paths import Path, port_gateway


def _address(raw: bytes) -> str:
    return str(ipaddress.IPv6Address(bytes(raw[:16])))


@dataclass(frozen=True)
class ValuePaths:
    """How a QP from `src` to `dst` turns an EV value of its profile's format into a forward path."""

    mode: EvFormatMode
    src: str  # the requester's address
    dst: str  # the responder's address
    decap: str = ""  # SRV6: the destination's decapsulation address (the SRH segment of a value without one)
    gateways: dict[int, str] = field(default_factory=dict)  # STEV: 1-based port -> the leaf address it leaves by
    tclass: int = fmt.TCLASS_DATA

    def sport_of(self, value: bytes) -> int | None:
        """The UDP source port a value puts on the wire (None: the format leaves it to the QP)."""
        if self.mode == EvFormatMode.STEV:
            return int.from_bytes(value[:4], "big") & 0xFFFF
        if self.mode == EvFormatMode.UDP:
            return int.from_bytes(value[:2], "big")
        return None

    def path(self, ev: int, value: bytes, port: int, sport: int) -> Path:
        """EV `ev`'s forward path for `value` on 1-based `port`; `sport` is the EV's UDP source port
        (the responder's name for it). ValueError for a value the format cannot carry."""
        plane = port - 1 if port >= 1 else None
        ends = Endpoints(self.src, self.dst, sport)
        if self.mode == EvFormatMode.SRV6:
            carrier = _address(value[:16])
            if not any(value[:16]):
                raise ValueError(f"EV {ev}: an SRV6 value needs an outer destination (bytes 0-15 are zero)")
            segment = _address(value[16:32]) if any(value[16:32]) else self.decap
            if not segment:
                raise ValueError(f"EV {ev}: an SRV6 value without an SRH segment, and no decapsulation address known")
            return Path(ev, carrier, FrameTemplate(ends, Encap.usid(self.src, carrier, segment), data_tclass=self.tclass),
                        plane)
        if self.mode == EvFormatMode.STEV:
            gateway = self.gateways.get(port)
            if gateway is None:
                raise ValueError(f"EV {ev}: port {port} is not one of the host's ports {sorted(self.gateways)}")
            label = int.from_bytes(value[:4], "big") >> 16
            return Path(ev, gateway, FrameTemplate(ends, Encap.udp(), flow_label=label, data_tclass=self.tclass), plane)
        return Path(ev, self.dst, FrameTemplate(ends, Encap.udp(), data_tclass=self.tclass), plane)


def wire_slots(profile: EvProfile) -> list[tuple[bytes, int]]:
    """Each slot's value as the wire carries it, and its port: an EXP profile's EVs as they are (explicit
    EVs are packet bytes), a GEN profile's expanded from its fields (port 0: the header gives them none)."""
    if profile.mode == EvProfileMode.GEN:
        return [(ev.expanded, 0) for ev in generated_evs(profile)]
    return ev_slots(profile)


API_MODE = {EvFormat.SRV6: EvFormatMode.SRV6, EvFormat.SRV6_USID: EvFormatMode.SRV6, EvFormat.STEV: EvFormatMode.STEV,
            EvFormat.UDP: EvFormatMode.UDP}  # the api format a topology EV format's values are written in


def value_paths(topo: Topology, src: str, dst: str, ev_format: EvFormat | EvFormatMode,
                trimmable: bool = True) -> ValuePaths:
    """How a QP from host `src` to host `dst` makes a path of an EV value in `ev_format` (a topology EV
    format, or the api's format mode of a profile)."""
    mode = ev_format if isinstance(ev_format, EvFormatMode) else API_MODE[ev_format]
    gateways = {plane + 1: port_gateway(topo, src, plane) for plane in range(topo.planes)}
    return ValuePaths(mode, ad.host_address(topo, src), ad.host_address(topo, dst), ad.decap_sid(topo.node(dst).node_id),
                      gateways, fmt.TCLASS_DATA if trimmable else fmt.TCLASS_DATA_NO_TRIM)


VALUE_PROBE_EV = 0xFFFF  # the EV number a probe of a value carries (transport/endpoint.py answers it)


def value_probe_path(topo: Topology, src: str, dst: str, mode: EvFormatMode, value: bytes,
                     port: int | None = None) -> Path:
    """The path an EV_PROBE of `value` (OCP's req_ev, format `mode`) takes from `src` to `dst`: on `port`, or
    by default an SRV6 carrier's first node's plane (else port 1); the value's own UDP source port (STEV,
    UDP) or EV 0's (SRV6). ValueError for a value the format cannot carry."""
    padded = bytes(value).ljust(32, b"\0")
    if port is None:
        port = 1
        if mode == EvFormatMode.SRV6:
            try:
                ids, _ = carrier_usids(padded)
            except ValueError:
                ids = []
            planes = [node.plane for node in topo.nodes.values() if node.node_id in ids[:1] and node.plane is not None]
            port = planes[0] + 1 if planes else 1
    values = value_paths(topo, src, dst, mode)
    sport = values.sport_of(padded)
    return values.path(VALUE_PROBE_EV, padded, port, udp_sport(0) if sport is None else sport)


class FollowedValues:
    """A requester's paths as its EV profile's values have them: `follow` rebuilds, in `paths` itself, the
    path of each EV whose slot's value or port changed since (a slot back at its first value gets its
    first path as given: `--format SRV6`'s full segment list, which no 32-byte value names)."""

    def __init__(self, profile: EvProfile, paths: dict[int, Path], value_paths: ValuePaths) -> None:
        self.profile, self.paths, self.value_paths = profile, paths, value_paths
        self.seen = profile.values_version
        self.built = self._slots()  # EV -> the (value, port) its path carries
        self.first = dict(self.built), dict(paths)
        self.repaths: list[tuple[int, int, str, int]] = []  # (time, EV, new value hex, port): what was followed

    def _slots(self) -> dict[int, tuple[bytes, int]]:
        slots = wire_slots(self.profile)
        return {ev: slots[ev] for ev in self.paths}

    @property
    def changed(self) -> bool:
        """Whether a value may have changed since the last `follow` (one integer compared)."""
        return self.profile.values_version != self.seen

    def follow(self, now: int) -> list[int]:
        """The EVs whose path was rebuilt for their new value (`paths` holds the new ones)."""
        self.seen = self.profile.values_version
        moved = []
        for ev, slot in self._slots().items():
            if slot == self.built[ev]:
                continue
            old = self.paths[ev]
            self.paths[ev] = (self.first[1][ev] if slot == self.first[0][ev] else
                              self.value_paths.path(ev, slot[0], slot[1] or (old.plane or 0) + 1, old.template.ends.sport))
            self.built[ev] = slot
            self.repaths.append((now, ev, slot[0].rstrip(bytes(1)).hex(), slot[1]))
            moved.append(ev)
        return moved
