"""STEV coverage: which of the fabric's paths N STEV values take, measured with real packets.

Why it exists: a STEV EV names no path. Its port picks the plane (the host's NIC there) and the
leaf's ECMP hash over flow label and UDP ports picks the spine, so how many of the paths between
two hosts N values reach is a property of the kernel's hash that only packets show. For one value
at a time this sends a few real STEV frames (UDP 4791, from the source's namespace) and finds the
spine they crossed from the spines' own per-interface receive counters (one netlink dump per
spine), and checks that they arrived at the destination. It compares the paths hit with what an
ideal uniform hash would hit on average. It never changes the fabric: the STEV hash and the
plain IPv6 routes must be there (`check_fabric` says what is missing).
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field
from typing import Any

from ...fabric import config, routing, static_routes
from ...fabric.kernel import netlink, netns
from ...fabric.running import Fabric
from ...io.sockets import udp_receiver
from ...topology import Role
from ...topology.evs import default_stev
from ...transport.multipath.paths import stev_paths
from ...wire.format import DataPacket
from .spec import TransferError

PAYLOAD = bytes(64)
PROBE_QP = 0xFFFFFF  # no responder listens for it: the frames are counted, not placed


def check_fabric(fabric: Fabric) -> None:
    """Raise TransferError unless the fabric can carry STEV EVs: plain IPv6 routes between hosts
    (static or BGP, as the UDP format needs) and the multipath hash on the flow label and ports."""
    if not (routing.running(fabric) or static_routes.installed(fabric)):
        raise TransferError(f"STEV needs plain IPv6 routing: bring the fabric up with 'mrc-emu up --routing static' "
                            f"(or --routing bgp) (fabric {fabric.name!r} has neither)")
    leaf = next(n.name for n in fabric.topology.nodes.values() if n.role is Role.LEAF)
    if problem := config.stev_hash_problem(fabric.node_path(leaf)):
        raise TransferError(f"STEV cannot be hashed on fabric {fabric.name!r}: {problem}")


def ideal_coverage(paths: int, values: int) -> float:
    """Paths an ideal uniform hash hits on average with `values` values: P (1 - (1 - 1/P)^N)."""
    return paths * (1 - (1 - 1 / paths) ** values) if paths else 0.0


@dataclass
class ValueRoute:
    """Where one STEV value's frames went: the spine whose counter took them, and how many arrived."""

    ev: int
    value: int
    port: int
    plane: int
    frames: int
    arrived: int
    spines: dict[str, int]  # every spine whose link from the source's leaf saw packets meanwhile, with how many

    @property
    def spine(self) -> str | None:
        """The one spine that took all the frames, or None (none did, or several took that many).
        Fewer packets on another spine are the fabric's own (an MLD report of a new address):
        counted as `stray`, as the frames could not have been split without one spine missing some."""
        full = [s for s, n in self.spines.items() if n >= self.frames]
        return full[0] if len(full) == 1 else None

    @property
    def stray(self) -> int:
        """Packets other spines saw meanwhile (and those the value's own spine saw beyond its frames)."""
        return sum(self.spines.values()) - (self.frames if self.spine is not None else 0)

    def to_dict(self) -> dict[str, Any]:
        return {"ev": self.ev, "value": f"{self.value:#010x}", "flow_label": self.value >> 16,
                "udp_sport": self.value & 0xFFFF, "port": self.port, "plane": self.plane, "spine": self.spine,
                "spines_seen": self.spines, "stray": self.stray, "frames": self.frames, "arrived": self.arrived}


@dataclass
class Coverage:
    src: str
    dst: str
    paths: list[tuple[int, str]]  # (plane, spine) of every path between the two hosts
    routes: list[ValueRoute] = field(default_factory=list)

    @property
    def packets_per_path(self) -> dict[str, int]:
        out = {spine: 0 for _, spine in self.paths}
        for r in self.routes:
            if r.spine is not None:
                out[r.spine] += r.frames  # the spine's counter rose by at least that much; strays are apart
        return out

    @property
    def values_per_path(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {spine: [] for _, spine in self.paths}
        for r in self.routes:
            if r.spine is not None:
                out[r.spine].append(r.ev)
        return out

    @property
    def hit(self) -> int:
        return sum(1 for evs in self.values_per_path.values() if evs)

    @property
    def ideal(self) -> float:
        return ideal_coverage(len(self.paths), len(self.routes))

    @property
    def ideal_given_ports(self) -> float:
        """The ideal when each value's plane is fixed by its port: the hash chooses among one plane's spines."""
        planes = sorted({p for p, _ in self.paths})
        spines = {p: sum(1 for q, _ in self.paths if q == p) for p in planes}
        return sum(ideal_coverage(spines[p], sum(1 for r in self.routes if r.plane == p)) for p in planes)

    @property
    def one_spine_each(self) -> bool:
        """Every value's frames all arrived, all through one spine of the value's own plane."""
        plane_of = dict((s, p) for p, s in self.paths)
        return all(r.spine is not None and plane_of[r.spine] == r.plane and r.arrived == r.frames for r in self.routes)

    def to_dict(self) -> dict[str, Any]:
        return {"src": self.src, "dst": self.dst, "values": len(self.routes), "paths": len(self.paths),
                "paths_hit": self.hit, "ideal_uniform": round(self.ideal, 2),
                "ideal_given_ports": round(self.ideal_given_ports, 2), "one_spine_each": self.one_spine_each,
                "packets_per_path": self.packets_per_path, "values_per_path": self.values_per_path,
                "routes": [r.to_dict() for r in self.routes]}

    def text(self) -> str:
        n, frames = len(self.routes), self.routes[0].frames if self.routes else 0
        lines = [f"STEV coverage {self.src} -> {self.dst}: {n} values, {frames} frames each",
                 f"paths hit: {self.hit}/{len(self.paths)}   ideal uniform hash: {self.ideal:.2f}   "
                 f"ideal given the values' ports (hash over one plane's spines): {self.ideal_given_ports:.2f}",
                 "packets per path:"]
        per_path, evs = self.packets_per_path, self.values_per_path
        top = max(per_path.values(), default=0) or 1
        for plane, spine in self.paths:
            bar = "#" * round(30 * per_path[spine] / top)
            lines.append(f"  plane {plane} {spine:<8} {per_path[spine]:>5} {bar:<30} {len(evs[spine])} values")
        lines.append("values:")
        for r in self.routes:
            where = r.spine or f"NOT ONE SPINE {r.spines}"
            lines.append(f"  EV {r.ev:<3} {r.value:#010x} (flow label {r.value >> 16:#06x}, sport {r.value & 0xFFFF:#06x}) "
                         f"port {r.port} -> {where}, {r.arrived}/{r.frames} arrived")
        if stray := sum(r.stray for r in self.routes):
            lines.append(f"{stray} other packets crossed the spines meanwhile (the fabric's own), not counted")
        if not self.one_spine_each:
            lines.append("NOT every value's frames arrived through exactly one spine of its plane")
        return "\n".join(lines)


def _facing(fabric: Fabric, src: str) -> dict[str, str]:
    """spine -> its interface on the link from the source's leaf of the spine's plane."""
    topo = fabric.topology
    out = {}
    for node in topo.nodes.values():
        if node.role is Role.SPINE:
            (link,) = topo.links_between(node.name, topo.leaf_of(src, node.plane))
            out[node.name] = topo.peer(link, node.name)[1]
    return out


def _received(facing: dict[str, str], fabric: Fabric) -> dict[str, int]:
    out = {}
    for spine, intf in facing.items():
        with netns.entered(fabric.node_path(spine)):
            out[spine] = netlink.link_packets()[intf][0]
    return out


def _arrivals(sock: socket.socket, sport: int, want: int, timeout_s: float) -> int:
    """How many datagrams from source port `sport` the destination's socket got within the timeout."""
    got, deadline = 0, time.monotonic() + timeout_s
    while got < want and (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            _, addr = sock.recvfrom(65535)
        except TimeoutError:
            break
        got += addr[1] == sport
    return got


def coverage(fabric: Fabric, src: str, dst: str, count: int = 16, values: list[int | tuple[int, int]] | None = None,
             frames: int = 4, timeout_s: float = 2.0) -> Coverage:
    """Send `frames` STEV frames for each of `values` (default: `default_stev(i)` for i < count,
    ports going round the planes), one value at a time, from `src` to `dst`, and find each value's
    spine from the spines' receive counters. The hosts must be on different leaves."""
    check_fabric(fabric)
    topo = fabric.topology
    if frames < 1:
        raise TransferError(f"--frames {frames}: at least one")
    if any(topo.leaf_of(src, p) == topo.leaf_of(dst, p) for p in range(topo.planes)):
        raise TransferError(f"{src} and {dst} share a leaf: their paths turn there, no hash picks a spine")
    values = values if values is not None else [default_stev(i) for i in range(count)]
    if not values:
        raise TransferError("no STEV values to measure")
    plan = stev_paths(topo, src, dst, list(values))
    facing = _facing(fabric, src)
    result = Coverage(src, dst, sorted(((topo.node(s).plane, s) for s in facing), key=lambda ps: (ps[0], ps[1])))
    with netns.entered(fabric.node_path(src)):
        sender = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_RAW)
    with netns.entered(fabric.node_path(dst)):
        try:
            receiver = udp_receiver(plan.dst_address, buffer=1 << 20)
        except OSError as e:
            sender.close()
            raise TransferError(f"cannot listen on [{plan.dst_address}]:4791 in {dst} ({e.strerror}): "
                                "is a transfer running on this fabric?") from None
    try:
        for ev in plan.evs:
            path = plan.forward[ev.index]
            before = _received(facing, fabric)
            for psn in range(frames):
                sender.sendto(path.template.data(DataPacket(PROBE_QP, psn, 0, 0, PAYLOAD)), (path.first_hop, 0))
            arrived = _arrivals(receiver, ev.udp_sport, frames, timeout_s)
            after = _received(facing, fabric)
            seen = {s: after[s] - before[s] for s in facing if after[s] > before[s]}
            result.routes.append(ValueRoute(ev.index, ev.stev, ev.plane + 1, ev.plane, frames, arrived, seen))
    finally:
        sender.close()
        receiver.close()
    return result
