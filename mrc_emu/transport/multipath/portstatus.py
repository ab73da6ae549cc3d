"""Which ports of a host and of its peers may carry packets: the port-status masks.

Why it exists: a controller may disable a host's port (api.ports.PortAdmin: the MRC
endpoint's admin state; the kernel link stays up). The host's own QPs must stop using the EVs
of that port at once, and its peers, told by PORT_STATUS_UPDATE (transport/endpoint.py), must
stop sending towards it. An EV of plane p leaves its sender by port p + 1 and arrives at its
receiver's port p + 1 (ports are 1-based), so a path is usable only while both ends' port of
its plane are. One `PortStatus` per host holds its own mask and the last mask each peer sent;
the host's requesters and responders ask it. Pure state: no I/O.
"""

from __future__ import annotations

from .paths import Path


def all_ports(ports: int) -> int:
    """The mask of ports 1..ports (bit p set: 1-based port p usable), the OCP phy_port_mask."""
    return ((1 << ports) - 1) << 1


def port_of_plane(plane: int) -> int:
    """The 1-based port of a host's NIC on `plane`."""
    return plane + 1


class PortStatus:
    """A host's own port-status mask and its peers' (by packed address)."""

    def __init__(self, ports: int) -> None:
        if ports < 1 or ports > 31:
            raise ValueError(f"a host has 1..31 ports, not {ports}")
        self.ports = ports
        self.local = all_ports(ports)
        self.peers: dict[bytes, int] = {}
        self.version = 0  # moves on every change: holders of a derived view recompute it

    @property
    def all_up(self) -> bool:
        full = all_ports(self.ports)
        return self.local == full and all(m & full == full for m in self.peers.values())

    def set_local(self, mask: int) -> bool:
        """This host's mask (bits outside 1..ports are ignored); whether it changed."""
        mask &= all_ports(self.ports)
        if mask == self.local:
            return False
        self.local, self.version = mask, self.version + 1
        return True

    def set_peer(self, peer: bytes, mask: int) -> bool:
        """The mask `peer` last announced; whether it changed anything."""
        if self.peers.get(peer, all_ports(self.ports)) == mask:
            self.peers.setdefault(peer, mask)
            return False
        self.peers[peer] = mask
        self.version += 1
        return True

    def usable(self, peer: bytes | None, path: Path) -> bool:
        """Whether `path` (between this host and `peer`) may carry a packet: its plane's port is
        enabled here and at the peer. A path of unknown plane always may."""
        if path.plane is None:
            return True
        bit = 1 << port_of_plane(path.plane)
        return bool(self.local & bit) and (peer is None or bool(self.peers.get(peer, bit) & bit))

    def blocked(self, peer: bytes | None, paths: dict[int, Path]) -> frozenset[int]:
        """The EVs of `paths` (to or from `peer`) that may carry nothing now."""
        if self.all_up:
            return frozenset()
        return frozenset(ev for ev, p in paths.items() if not self.usable(peer, p))
