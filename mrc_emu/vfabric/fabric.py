"""The virtual fabric: a topology's nodes, links and egress ports, carrying frames in virtual time.

Why it exists: this is the namespace fabric as a model. Built from the same Topology, every link
is two egress ports (ports.py), one per direction, at the topology's link rate (an unshaped
topology's at DEFAULT_RATE_BPS, said in every result) with a propagation delay per link
(DEFAULT_LINK_DELAY_NS unless given); switch ports apply the port program's rule with the
topology's thresholds, a host's ports serialise its frames (and apply the rule too with
`port: {hosts: on}`). A host's frame goes out of the port its route to the path's first hop
names, as the raw socket's does; every node forwards what arrives by its routes and SIDs
(forwarding.py), rewriting the frame as the kernel would (SRH, uSID carrier, hop limit); the
destination host opens it as its kernel does (decapsulation, UDP checksum) and hands the
datagram to its endpoints with the arrival port. ECMP (the baseline's plain UDP) hashes the
frame's 5-tuple and flow label with a per-node salt. Each direction of a link can be down,
blackholed, lossy (the seeded generator decides), degraded or delayed (faults.py sets them).
"""

from __future__ import annotations

import ipaddress
import zlib
from collections import Counter
from collections.abc import Callable
from typing import Any

from ..topology import Role, Topology
from ..topology.port import tbf_shape
from ..topology.port_verdict import PortRule
from ..wire.decoder import open_frame
from ..wire.format import DropReason
from .engine import Engine
from .forwarding import HOSTS_BLOCK, Hop, Rib, end, next_segment
from .ports import NS_BITS, EgressPort

DEFAULT_RATE_BPS = 100_000_000_000  # an unshaped topology's links (no link_rate: the namespace fabric runs them at CPU speed)
DEFAULT_LINK_DELAY_NS = 1_000  # per link, each way: about 200 m of fibre and a switch's cut-through latency

Deliver = Callable[[bytes, bytes, int, int, int], None]  # (payload, source, source port, traffic class, 1-based port)


def _mix(h: int) -> int:
    """MurmurHash3's finaliser over a salted CRC-32: CRC is linear, so without it the choices of
    two nodes were tied to each other whatever the salt (a flow's ACKs always took the other plane
    from its data); the kernel's keyed jhash ties nothing."""
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    return h ^ (h >> 16)


class VirtualFabric:
    """The model of `topo`, its events on `engine`, its random choices (loss, ECN marks) from `rng`
    (anything with random() and getrandbits()); `ecmp_seed` salts every node's ECMP hash."""

    def __init__(self, topo: Topology, engine: Engine, rng: Any, link_delay_ns: int = DEFAULT_LINK_DELAY_NS,
                 default_rate_bps: int = DEFAULT_RATE_BPS, ecmp_seed: int = 0) -> None:
        if link_delay_ns < 0:
            raise ValueError(f"link delay {link_delay_ns} ns: must be at least 0")
        if topo.ports.model != "bpf":
            raise ValueError(f"topology {topo.name!r}: port model {topo.ports.model!r}: the virtual fabric's ports "
                             f"run the port program's rule only (model bpf)")
        self.topo, self.engine, self.rng = topo, engine, rng
        self.rate_default = topo.link_rate_bps is None
        self.rate_bps = int(default_rate_bps if self.rate_default else topo.link_rate_bps)
        self.link_delay_ns = link_delay_ns
        configs = {(p.node, p.ifname): p for p in topo.egress_ports(self.rate_bps)}
        # `port: {bucket}` given: every port of the namespace fabric is a TBF with that bucket
        # (build.shape_node), which lets a burst through an idle port at once; the model's ports
        # do the same (ports.py). Without it a port serialises every frame (docs/virtual.md)
        bucket = None if self.rate_default or topo.ports.bucket is None else \
            (lambda rate: tbf_shape(rate, topo.mtu, topo.ports.bucket)[1])
        self.bucketed = bucket is not None  # an idle port passes a frame at once (path_unseen_ns)
        by_id = {node.node_id: node for node in topo.nodes.values()}
        self.ribs = {name: Rib(topo, name, by_id) for name in topo.nodes}
        self.ports: dict[str, dict[int, EgressPort]] = {name: {} for name in topo.nodes}
        self._towards: dict[tuple[str, str], EgressPort] = {}
        for link in topo.links:
            for node, intf, peer in ((link.a, link.a_intf, link.b), (link.b, link.b_intf, link.a)):
                config = configs.get((node, intf))
                port = EgressPort(engine, node, intf, peer, link.plane, self.rate_bps, link_delay_ns,
                                  PortRule.of(config) if config else None, rng, self._arrive, bucket)
                self.ports[node][self.ribs[node].port_to[peer]] = port
                self._towards[(node, peer)] = port
        self._salt = {name: zlib.crc32(f"{ecmp_seed}:{name}".encode()) for name in topo.nodes}
        self._local_salt = zlib.crc32(f"{ecmp_seed}:raw sockets".encode())  # one kernel key for every host
        self._deliver: dict[str, Deliver] = {}
        self._hosts = {name for name, rib in self.ribs.items() if rib.role is Role.HOST}
        self._addresses: dict[str, bytes] = {}
        self.frames_sent = 0  # frames the hosts' endpoints handed over
        self.frames_refused = 0  # ... that could not leave the host (no route: its port down)
        self.frames_delivered = 0
        self.packet_hops = 0  # link traversals completed
        self.drops: Counter[str] = Counter()  # frames lost in the fabric, by why (port drops are the ports')
        # routes to hosts that routing withdrew (routing.py): node -> {(port, leaf index or None: every host)}
        self.withdrawn: dict[str, set[tuple[int, int | None]]] = {}
        # what a capture on a host's ports sees: tap(frame, ifname, outbound, time_ns) for each frame
        # the host sends (as it leaves for its NIC queue) or that arrives at it
        self.taps: dict[str, Callable[[bytes, str, bool, int], None]] = {}

    # ---- hosts -----------------------------------------------------------------------------

    def attach(self, host: str, deliver: Deliver) -> None:
        """`deliver(payload, src, sport, tclass, port)` receives what arrives for `host`, at the engine's now."""
        if self.ribs[host].role is not Role.HOST:
            raise ValueError(f"{host} is a {self.ribs[host].role.value}, not a host")
        self._deliver[host] = deliver

    def sender(self, host: str) -> Callable[[bytes | bytearray, Any], bool]:
        """The `send(frame, path)` of `host`'s endpoints: out of the port its route to the path's
        first hop names (queued at the NIC); False when it has no route (its port there is down)."""
        rib, addresses = self.ribs[host], self._addresses

        def send(frame: bytes | bytearray, path: Any) -> bool:
            self.frames_sent += 1
            first = addresses.get(path.first_hop)
            if first is None:
                first = addresses[path.first_hop] = ipaddress.IPv6Address(path.first_hop).packed
            hop, ports = rib.lookup(first)
            data = bytearray(frame)  # the transport reuses its buffers
            out = self._choose(host, ports, data, first) if hop is Hop.PORTS else None
            if out is None:
                self.frames_refused += 1
                return False
            tap = self.taps.get(host)
            if tap is not None:
                tap(bytes(data), out.ifname, True, self.engine.now)
            out.offer(data)
            return True

        return send

    # ---- forwarding ------------------------------------------------------------------------

    def _choose(self, node: str, candidates: tuple[int, ...], frame: bytearray,
                first_hop: bytes | None = None) -> EgressPort | None:
        """The live port of `candidates` a frame leaves by. A forwarding node hashes the frame's
        fields; a host's own frame (`first_hop`: what its raw socket routes to) leaves as the
        kernel sends an unbound IPPROTO_RAW socket's: the flow it hashes has no source address
        and no ports yet, under one key for the whole machine, so every host sends to one
        destination over the same plane (incast8 on the namespace fabric: its eight baseline
        flows into h0 all on plane 0)."""
        ports = self.ports[node]
        if len(candidates) == 1:
            port = ports[candidates[0]]
            return port if port.up else None
        live = [ports[k] for k in candidates if ports[k].up]
        if len(live) < 2:
            return live[0] if live else None
        if first_hop is not None:
            return live[_mix(zlib.crc32(first_hop, self._local_salt)) % len(live)]
        # the multipath hash's fields (fabric/config.py HASH_FIELDS): addresses, next header,
        # flow label, and the UDP ports of a frame that has them
        nh = frame[6]
        key = bytes(frame[8:40]) + bytes((nh, frame[1] & 0x0F, frame[2], frame[3]))
        if nh == 17:
            key += bytes(frame[40:44])
        return live[_mix(zlib.crc32(key, self._salt[node])) % len(live)]

    def _arrive(self, arrival: tuple[EgressPort, bytearray, int]) -> None:
        port, frame, generation = arrival
        if generation != port.generation:
            self.drops["link down"] += 1
            return
        if port.blackholed:
            self.drops["blackhole"] += 1
            return
        if port.loss and self.rng.random() < port.loss:
            self.drops["loss"] += 1
            return
        self.packet_hops += 1
        if port.peer in self._hosts:
            self._receive(port.peer, frame, port.plane)
        else:
            self._forward(port.peer, frame)

    def _forward(self, node: str, frame: bytearray) -> None:
        rib = self.ribs[node]
        hop, detail = rib.lookup(bytes(frame[24:40]))
        out = None
        if hop is Hop.END_X:
            if not next_segment(frame):
                self.drops["End.X without a segment left"] += 1
                return
            out = self.ports[node][detail]
            out = out if out.up else None
        else:
            if hop is Hop.END:
                if not end(frame):
                    self.drops["End without a segment left"] += 1
                    return
                hop, detail = rib.lookup(bytes(frame[24:40]))
            if hop is not Hop.PORTS:
                self.drops["no route" if hop is Hop.NONE else f"{hop.value} at a switch"] += 1
                return
            gone = self.withdrawn.get(node)
            if gone and frame[24:28] == HOSTS_BLOCK:
                leaf = int.from_bytes(frame[28:30], "big")
                detail = tuple(k for k in detail if (k, None) not in gone and (k, leaf) not in gone)
                if not detail:
                    self.drops["no route (withdrawn)"] += 1
                    return
            out = self._choose(node, detail, frame)
        if out is None:
            self.drops["no route (link down)"] += 1
            return
        if frame[7] <= 1:
            self.drops["hop limit"] += 1
            return
        frame[7] -= 1
        out.offer(frame)

    def _receive(self, host: str, frame: bytearray, plane: int) -> None:
        """What arrives at a host: its own (decapsulated and checked as its kernel does), or
        forwarded on (a host forwards SIDs of others, as every node does)."""
        tap = self.taps.get(host)
        if tap is not None:
            tap(bytes(frame), self._towards[(host, self.topo.leaf_of(host, plane))].ifname, False, self.engine.now)
        hop, _ = self.ribs[host].lookup(bytes(frame[24:40]))
        if hop is not Hop.LOCAL:
            self._forward(host, frame)
            return
        opened = open_frame(frame)
        if isinstance(opened, DropReason):
            self.drops[opened.value] += 1
            return
        if opened.segments_left:
            self.drops["SRH not spent at its destination"] += 1
            return
        if opened.dst not in self.ribs[host].local:
            self.drops["inner destination not this host"] += 1
            return
        deliver = self._deliver.get(host)
        if deliver is None:
            self.drops["no endpoint at the host"] += 1
            return
        self.frames_delivered += 1
        deliver(bytes(opened.payload), opened.src, opened.sport, opened.tclass, plane + 1)

    # ---- links -----------------------------------------------------------------------------

    def towards(self, node: str, peer: str) -> EgressPort:
        """The egress port `node` sends to `peer` from (one direction of their link)."""
        port = self._towards.get((node, peer))
        if port is None:
            self.topo.node(node)
            self.topo.node(peer)
            raise ValueError(f"no link between {node} and {peer}")
        return port

    def set_route(self, node: str, peer: str, leaf: int | None, present: bool) -> None:
        """Routing's word at `node` on its routes to hosts via `peer`: those to the hosts of leaf
        index `leaf` (None: to every host) are withdrawn (`present` False) or back."""
        entry = (self.ribs[node].port_to[peer], leaf)
        gone = self.withdrawn.setdefault(node, set())
        if present:
            gone.discard(entry)
        else:
            gone.add(entry)

    def path_rtt_ns(self, links: int, out_bytes: int, back_bytes: int) -> int:
        """The unloaded round trip over a path of `links` links: a frame of `out_bytes` on the wire
        out, one of `back_bytes` back, each serialised and propagated at every link."""
        return links * (2 * self.link_delay_ns + (out_bytes + back_bytes) * NS_BITS // self.rate_bps)

    def path_unseen_ns(self, links: int, out_bytes: int, back_bytes: int) -> int:
        """What of path_rtt_ns a frame pair does not take over a path of `links` links with one
        busy port: with TBF's bucket an idle port passes a frame at once, a busy one delays it by
        its queue and its own serialisation (ports.py), so every serialisation but the busy port's
        data frame's; 0 where every port serialises every frame."""
        if not self.bucketed:
            return 0
        return self.path_rtt_ns(links, out_bytes, back_bytes) - self.path_rtt_ns(links, 0, 0) - \
            out_bytes * NS_BITS // self.rate_bps

    def port_counters(self) -> dict[str, dict[str, dict[str, Any]]]:
        """Per node and interface, the counters of every port that carried a frame."""
        out: dict[str, dict[str, dict[str, Any]]] = {}
        for node, ports in self.ports.items():
            for _, port in sorted(ports.items()):
                if port.packets or port.dropped or port.flushed:
                    out.setdefault(node, {})[port.ifname] = port.counters()
        return out
