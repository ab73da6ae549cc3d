"""A QP's paths from an OCP EV profile (GEN or EXP; SRV6 over the fabric's uSID plan, STEV, UDP).

Why it exists: `send --ev-profile FILE` runs a transfer on the EVs a controller's profile yields
instead of the fabric's own EV list. An SRV6 EV's bytes 0-15 are the packet's outer destination, a
uSID carrier; this module reads each carrier back into the nodes it names, checks that they are a
real path of the fabric from the source to the destination (one line naming the EV and why not),
and builds the QP's paths on it: EV slot i of the profile is transport EV i (UDP source port
udp_sport(i), docs/issue 13), its forward frame carries the carrier exactly as expanded, its ACKs
come back on the reverse EV of the same plane and spine in the same carrier form, and its EV
probes take those two paths (the destination's responder answers them).

Two carrier forms name a fabric EV (docs/addressing.md): the long one lists every hop,
fc00:0:<leaf>:<spine>:<leaf>:<dst>:f0d6::, the short one only the spine, fc00:0:<spine>:<dst>:f0d6::
(the plane follows from the spine; the fabric routes it), which is what lets a GEN profile with a
generated spine field yield exactly the fabric's EVs between two hosts (`fabric_coverage`).
Bytes 16-31, when not zero, are the single SRH segment: only the destination's decapsulation
address can be one (it is the segment the destination's kernel decapsulates at), so any other
value is refused. It must never touch the system: it reads the profile and the topology only.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field, replace

from ...api.expansion import ExpandedEv
from ...api.files import ProfileFile
from ...api.formats import EvFormatMode
from ...api.profiles import EvProfileMode
from ...topology import Topology, evs_between
from ...topology import addressing as ad
from ...topology.evs import Ev, udp_sport
from ...wire import format as fmt
from ...wire.encoder import Encap, FrameTemplate
from ...wire.format import Endpoints
from .paths import Path, QpPaths, stev_paths

MAX_NODE_ID = ad.ENDX_FUNCTION_BASE - 1  # 16-bit groups above it are local functions, never nodes


class EvProfileError(ValueError):
    """A profile that does not map onto the fabric: '<file>: EV <slot>: <address> <why>' (one line)."""


@dataclass
class ProfileQpPaths(QpPaths):
    """QpPaths of a profile's QP: `evs[i]` is slot i as the transport sees it (index i, the slot's
    carrier and UDP source port); `topology_evs[i]` is the fabric EV slot i names (its own index)."""

    topology_evs: list[Ev] = field(default_factory=list)
    profile: str = ""  # the file the profile came from
    short: list[bool] = field(default_factory=list)  # per slot: the short carrier (spine only) or the long one


@dataclass(frozen=True)
class SlotEv:
    """What one EV slot of a profile names: the fabric EV, the carrier it gives, its SRH segment."""

    slot: int
    ev: Ev
    carrier: str
    segment: str
    short: bool


def _where(profile: ProfileFile, slot: int, address: str) -> str:
    return f"{profile.path}: EV {slot}: {address}"


def carrier_usids(da: bytes) -> tuple[list[int], int | None]:
    """(the node IDs, the local function or None) a uSID carrier names after the fabric's block;
    a ValueError saying why it is no carrier of this fabric."""
    value = int.from_bytes(da[:16], "big")
    if value >> (128 - ad.USID_BLOCK_BITS) != ad.USID_BLOCK:
        raise ValueError(f"is outside the fabric's uSID block fc00:0::/{ad.USID_BLOCK_BITS}")
    groups = [(value >> (128 - ad.USID_BLOCK_BITS - ad.USID_BITS * (k + 1))) & 0xFFFF for k in range(ad.MAX_USIDS)]
    nodes: list[int] = []
    for k, group in enumerate(groups):
        if group == 0:
            if any(groups[k:]):
                raise ValueError(f"has an empty uSID (0) at position {k + 1}, before others")
            return nodes, None
        if group > MAX_NODE_ID:
            if any(groups[k + 1:]):
                raise ValueError(f"has uSIDs after the local function 0x{group:x}")
            return nodes, group
        nodes.append(group)
    return nodes, None


def slot_ev(topo: Topology, profile: ProfileFile, src: str, dst: str, ev: ExpandedEv,
            fabric_evs: list[Ev] | None = None) -> SlotEv:
    """The fabric EV from `src` to `dst` that the SRV6 EV in slot `ev.index` names, or an EvProfileError."""
    address = str(ipaddress.IPv6Address(ev.expanded[:16]))
    where = _where(profile, ev.index, address)
    try:
        ids, function = carrier_usids(ev.expanded)
    except ValueError as exc:
        raise EvProfileError(f"{where} {exc}") from None
    by_id = {node.node_id: node for node in topo.nodes.values()}
    for node_id in ids:
        if node_id not in by_id:
            raise EvProfileError(f"{where} names node 0x{node_id:x}, which the fabric does not have")
    if function != ad.USID_DECAP_FUNCTION:
        what = "no local function" if function is None else f"function 0x{function:x}"
        raise EvProfileError(f"{where} ends in {what}, not the decapsulation function 0x{ad.USID_DECAP_FUNCTION:x}")
    names = tuple(by_id[node_id].name for node_id in ids)
    dst_node = topo.node(dst)
    if not names or names[-1] != dst:
        last = f"node {names[-1]} (0x{ids[-1]:x})" if names else "no node"
        raise EvProfileError(f"{where} ends at {last}, not the destination {dst} (0x{dst_node.node_id:x})")
    segment = ev.expanded[16:32]
    decap = ad.decap_sid(dst_node.node_id)
    if any(segment) and str(ipaddress.IPv6Address(segment)) != decap:
        raise EvProfileError(f"{where}: SRH segment {ipaddress.IPv6Address(segment)} is not {dst}'s decapsulation "
                             f"address {decap}, the only segment the destination decapsulates at")
    for candidate in fabric_evs if fabric_evs is not None else evs_between(topo, src, dst):
        turn = candidate.spine or candidate.hops[1]
        if names == candidate.hops[1:] or names == (turn, dst):
            return SlotEv(ev.index, candidate, address, decap, short=len(names) < len(candidate.hops) - 1)
    raise EvProfileError(f"{where} names {' > '.join((src,) + names)}, not a path of the fabric from {src} to {dst}")


def _check_profile(profile: ProfileFile, mode: EvFormatMode = EvFormatMode.SRV6) -> list[ExpandedEv]:
    if profile.fmt.mode != mode:
        raise EvProfileError(f"{profile.path}: format.mode: {profile.fmt.mode.name}, not {mode.name}")
    if profile.profile.mode == EvProfileMode.AUTO:
        raise EvProfileError(f"{profile.path}: profile.mode: AUTO names no EVs (give a GEN or EXP profile)")
    evs = profile.expanded()
    if not evs:
        raise EvProfileError(f"{profile.path}: profile.ev_count: 0 EVs: a QP needs at least one")
    return evs


def slot_evs(topo: Topology, profile: ProfileFile, src: str, dst: str) -> list[SlotEv]:
    """Every slot of the profile, mapped onto the fabric EV it names (slot order), or an EvProfileError."""
    fabric_evs = evs_between(topo, src, dst)
    return [slot_ev(topo, profile, src, dst, ev, fabric_evs) for ev in _check_profile(profile)]


def fabric_coverage(topo: Topology, profile: ProfileFile, src: str, dst: str) -> dict[str, list]:
    """How the profile's EVs cover the fabric's between `src` and `dst`: {"missing": the fabric EVs
    (plane, spine) no slot names, "duplicates": slots naming a (plane, spine) an earlier slot named}.
    Both empty: the profile yields exactly the fabric's EVs."""
    seen: dict[tuple[int, str | None], int] = {}
    duplicates = []
    for item in slot_evs(topo, profile, src, dst):
        key = (item.ev.plane, item.ev.spine)
        if key in seen:
            duplicates.append((item.slot, seen[key]))
        seen.setdefault(key, item.slot)
    missing = [(ev.plane, ev.spine) for ev in evs_between(topo, src, dst) if (ev.plane, ev.spine) not in seen]
    return {"missing": missing, "duplicates": duplicates}


def _back_carrier(topo: Topology, rev: Ev, short: bool) -> str:
    if not short:
        return rev.usid_carrier
    turn = rev.spine or rev.hops[1]
    return ad.usid_carrier([topo.node(turn).node_id, topo.node(rev.dst).node_id], ad.USID_DECAP_FUNCTION)


def _plain_paths(topo: Topology, profile: ProfileFile, src: str, dst: str, trimmable: bool) -> ProfileQpPaths:
    """A STEV or UDP profile's QP: slot i's value is EV i's (STEV: 32 bits, its port going round the planes;
    UDP: the source port, the fabric's hash picks the path). Two slots with one UDP source port are refused:
    the responder tells EVs apart by it."""
    evs, mode = _check_profile(profile, profile.fmt.mode), profile.fmt.mode
    sports: dict[int, int] = {}
    for ev in evs:
        sport = int.from_bytes(ev.expanded[2:4] if mode == EvFormatMode.STEV else ev.expanded[:2], "big")
        if sport in sports:
            raise EvProfileError(f"{profile.path}: EV {ev.index}: UDP source port 0x{sport:04x} is EV {sports[sport]}'s "
                                 "too (the responder tells a QP's EVs apart by it)")
        sports[sport] = ev.index
    if mode == EvFormatMode.STEV:
        values = [int.from_bytes(ev.expanded[:4], "big") for ev in evs]
        paths = stev_paths(topo, src, dst, values, trimmable=trimmable)
        return ProfileQpPaths(paths.forward, paths.back, paths.evs, paths.src_address, paths.dst_address,
                              topology_evs=paths.evs, profile=profile.path)
    tclass = fmt.TCLASS_DATA if trimmable else fmt.TCLASS_DATA_NO_TRIM
    fabric_evs = evs_between(topo, src, dst)
    me, peer = ad.host_address(topo, src), ad.host_address(topo, dst)
    forward, back, slots = {}, {}, []
    for ev, sport in zip(evs, sports):
        slot = replace(fabric_evs[ev.index % len(fabric_evs)], index=ev.index, udp_sport=sport)
        forward[ev.index] = Path(ev.index, peer, FrameTemplate(Endpoints(me, peer, sport), Encap.udp(), data_tclass=tclass),
                                 slot.plane)
        back[ev.index] = Path(ev.index, me, FrameTemplate(Endpoints(peer, me, sport), Encap.udp()), slot.plane)
        slots.append(slot)
    return ProfileQpPaths(forward, back, slots, me, peer, topology_evs=slots, profile=profile.path)


def profile_paths(topo: Topology, profile: ProfileFile, src: str, dst: str, trimmable: bool = True) -> ProfileQpPaths:
    """The paths of a QP from `src` to `dst` on the profile's EVs: what paths.qp_paths
    gives for the fabric's EV list, with EV index = profile slot (any format: STEV and UDP
    profiles name values the fabric's hash routes, `_plain_paths`)."""
    if profile.fmt.mode != EvFormatMode.SRV6:
        return _plain_paths(topo, profile, src, dst, trimmable)
    tclass = fmt.TCLASS_DATA if trimmable else fmt.TCLASS_DATA_NO_TRIM
    slots = slot_evs(topo, profile, src, dst)
    reverse = {(ev.plane, ev.spine): ev for ev in evs_between(topo, dst, src)}
    me, peer = ad.host_address(topo, src), ad.host_address(topo, dst)
    back_decap = ad.decap_sid(topo.node(src).node_id)
    forward, back, evs = {}, {}, []
    for item in slots:
        sport, plane = udp_sport(item.slot), item.ev.plane
        forward[item.slot] = Path(item.slot, item.carrier, FrameTemplate(Endpoints(me, peer, sport),
                                                                        Encap.usid(me, item.carrier, item.segment),
                                                                        data_tclass=tclass), plane)
        back_carrier = _back_carrier(topo, reverse[(item.ev.plane, item.ev.spine)], item.short)
        back[item.slot] = Path(item.slot, back_carrier, FrameTemplate(Endpoints(peer, me, sport),
                                                                     Encap.usid(peer, back_carrier, back_decap)), plane)
        evs.append(replace(item.ev, index=item.slot, usid_carrier=item.carrier, udp_sport=sport))
    # EV probes go along the forward path and come back on the back path (the responder answers them)
    return ProfileQpPaths(forward, back, evs, me, peer, topology_evs=[item.ev for item in slots],
                          profile=profile.path, short=[item.short for item in slots])
