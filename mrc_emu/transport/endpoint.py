"""A host's MRC endpoint at the reserved QPN 0x2: controller EV probes and PORT_STATUS_UPDATE.

Why it exists: OCP's endpoint batch (mrc_ctl_ep_batch_send_wait, ../shared/ref/OCP-API.md)
lets a host's controller probe one EV towards another host (EV_PROBE) and tell other hosts
which of its ports are usable (PORT_STATUS_UPDATE). Both are messages between the hosts' MRC
endpoints, not between QPs, so each host has one endpoint at ENDPOINT_QPN (0x2) beside its
QPs (transport/mux.py routes datagrams for that QPN here):

- an EV probe goes out along the EV's forward path, exactly as data would, to the peer's
  endpoint, which answers along the reverse EV (the way its ACKs for that EV go) with the
  1-based port the probe arrived at and its service time (the probe's arrival to the
  response's send); the response gives the batch {req_id, port, rtt, adj_svc_time} as the
  header has it: rtt is the RTT corrected for that service time and adj_svc_time the flag that
  says so (always 1 here), with the RTT as measured (`rtt_raw`) and the service time beside;
- a probe of an EV *value* (OCP's req_ev: one the QPs may not use yet) carries its own path
  (`EpRequest.path`, made of the value by multipath/evvalues.py) and the EV number
  VALUE_PROBE_EV; the peer answers it along its first usable path back;
- `set_port_status(mask)` applies a new mask of this host's ports at once (its QPs stop using
  EVs of a disabled port for data, retransmissions, probes and ACKs), and sends
  PORT_STATUS_UPDATE to every peer its QPs talk to, resent until acknowledged; a peer that
  hears one applies it to its QPs towards this host (`on_port_status`).

`ProbeAnswers` is the answering half on its own: the host endpoint and each responder (for
the in-QP probes that revive ASSUMED_BAD EVs, transport/probing.py) hold one. Sans-IO: the
paths to a peer come from a callable the driver gives (`paths_to(peer)`: this host's forward
paths towards that peer, EV indexes as between the two hosts; the reverse of the peer's EV i
is this host's EV i, as transport/multipath/paths.py numbers them).
"""

from __future__ import annotations

import ipaddress
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from ..wire import format as fmt
from ..wire.decoder import decode_udp
from ..wire.format import DropReason, PortStatusPacket, ProbePacket, ProbeResponsePacket
from .multipath.evvalues import VALUE_PROBE_EV
from .multipath.paths import Path, Send
from .multipath.portstatus import PortStatus

MAX_WAITING = 1024  # probe requests held for an answer between two pumps (more: dropped, counted)
UPDATE_RETRY_NS = 1_000_000  # a PORT_STATUS_UPDATE not acknowledged is sent again after this
UPDATE_TRIES = 8


def packed_peer(path: Path) -> bytes:
    """The packed address a path's frames go to (the peer host)."""
    return ipaddress.IPv6Address(path.template.ends.dst).packed


def qp_paths_to(mux: Any) -> Callable[[bytes], dict[int, Path]]:
    """`paths_to` from a host's own QPs: a requester's forward paths towards its peer, or a
    responder QP's paths back to its requester (the same EV indexes: the reverse of the peer's
    EV i is this host's EV i), whichever the host has. Hosts no QP of this one talks to have none."""

    def paths_to(peer: bytes) -> dict[int, Path]:
        for qpn, qp in mux.by_qpn.items():
            if qpn == fmt.ENDPOINT_QPN:
                continue
            if hasattr(qp, "profile"):
                if packed_peer(next(iter(qp.paths.values()))) == peer:
                    return qp.paths
            else:
                for rq in qp.qps.values():
                    back = rq.paths_back
                    if (rq.peer if rq.peer is not None else packed_peer(next(iter(back.values())))) == peer:
                        return back
        return {}

    return paths_to


class ProbeAnswers:
    """Probe requests that arrived and wait for their response (sent at the next pump)."""

    def __init__(self) -> None:
        self.waiting: list[tuple[ProbePacket, bytes, int, int]] = []  # (probe, source, arrival port, arrival time)
        self.answered = 0
        self.dropped = 0

    def take(self, probe: ProbePacket, src: bytes, port: int, now: int) -> None:
        if len(self.waiting) >= MAX_WAITING:
            self.dropped += 1
        else:
            self.waiting.append((probe, src, port, now))

    def flush(self, now: int, send: Send, clock: Callable[[], int] | None,
              route: Callable[[ProbePacket, bytes], tuple[Path, int, int] | None]) -> None:
        """Answer every waiting probe: `route(probe, source)` gives (path back, the QPN to answer,
        P_Key) or None (nowhere to answer: dropped). The service time runs to this send."""
        waiting, self.waiting = self.waiting, []
        for probe, src, port, arrived in waiting:
            way = route(probe, src)
            if way is None:
                self.dropped += 1
                continue
            path, qpn, pkey = way
            left = clock() if clock is not None else now
            rsp = ProbeResponsePacket(qpn, probe.probe_id, probe.ev, probe.send_time_ns, port, max(0, left - arrived), pkey)
            if send(path.template.encode(rsp), path):
                self.answered += 1
            else:
                self.dropped += 1

    @property
    def due(self) -> bool:
        return bool(self.waiting)


@dataclass(frozen=True)
class EpRequest:
    """One EV_PROBE request of a batch: probe EV `ev` (this host's EV index towards `peer`)."""

    req_id: int  # u16, unique among the outstanding ones
    peer: bytes  # the destination host's packed address (dgid)
    ev: int
    path: Path | None = None  # a probe of an EV value (req_ev): its path; `ev` is then VALUE_PROBE_EV


@dataclass(frozen=True)
class EpResponse:
    """mrc_ctl_ep_batch_rsp: the port the probe arrived at (1-based), the RTT in ns corrected for the
    responder's service time, and adj_svc_time, the header's flag that it was (1); beside them the
    RTT as measured and the service time."""

    req_id: int
    port: int
    rtt: int
    adj_svc_time: int
    service_ns: int
    rtt_raw: int

    def to_dict(self) -> dict:
        return {"req_id": self.req_id, "port": self.port, "rtt": self.rtt, "adj_svc_time": self.adj_svc_time,
                "service_ns": self.service_ns, "rtt_raw": self.rtt_raw}


class HostEndpoint:
    """The MRC endpoint of one host (QPN 0x2): answers probes, probes for its controller, and
    keeps the port status of the host and its peers, applied to the host's QPs (`mux`)."""

    def __init__(self, address: bytes, mux: Any, paths_to: Callable[[bytes], dict[int, Path]] | None, ports: int,
                 pkey: int = fmt.DEFAULT_PKEY) -> None:
        """`paths_to(peer)`: this host's paths towards `peer` by EV index (None: those its own
        QPs have, `qp_paths_to`); `ports`: how many ports (planes) the host has."""
        self.address = address
        self.mux = mux
        self.paths_to = paths_to if paths_to is not None else qp_paths_to(mux)
        self._known: dict[bytes, dict[int, Path]] = {}  # paths given with `learn`, before paths_to
        self.pkey = pkey
        self.status = PortStatus(ports)
        self.answers = ProbeAnswers()
        self.drops: Counter[str] = Counter()
        self._queued: list[EpRequest] = []  # probes asked for, sent at the next pump
        self._outstanding: dict[int, tuple[EpRequest, int]] = {}  # probe id (= req_id) -> (request, send time)
        self.responses: list[EpResponse] = []  # in arrival order; `take_responses` empties it
        self._update_id = 0
        self._updates: dict[bytes, tuple[int, int, int, int]] = {}  # peer -> (req id, mask, next send, tries left)
        self.updates_sent = 0
        self.updates_heard = 0
        self._acks: list[tuple[bytes, int, int]] = []  # PORT_STATUS_UPDATEs to acknowledge: (peer, req id, mask)
        self._applied = -1  # the status version the QPs were last given
        self._last_now = 0

    # ---- the controller's side -----------------------------------------------------------

    def learn(self, peer: bytes, paths: dict[int, Path]) -> None:
        """This host's paths towards `peer` (by EV index), for hosts its QPs do not talk to."""
        self._known[peer] = paths

    def _paths(self, peer: bytes) -> dict[int, Path]:
        return self._known.get(peer) or self.paths_to(peer)

    def ev_probe(self, requests: list[EpRequest]) -> None:
        """Queue a batch of EV probes (sent at the next pump); ValueError for a req_id already
        outstanding or an EV with no path (nothing of the batch is queued then)."""
        ids = set(self._outstanding) | {r.req_id for r in self._queued}
        for r in requests:
            if not 0 <= r.req_id <= 0xFFFF or r.req_id in ids:
                raise ValueError(f"req_id {r.req_id} is outstanding or not a u16")
            if r.path is None and r.ev not in self._paths(r.peer):
                raise ValueError(f"req_id {r.req_id}: no EV {r.ev} towards that host")
            ids.add(r.req_id)
        self._queued += requests

    def take_responses(self) -> list[EpResponse]:
        """The responses that arrived since the last call (OCP: not buffered between calls)."""
        out, self.responses = self.responses, []
        return out

    def forget(self, req_ids: list[int]) -> None:
        """Give up on outstanding probes (the batch's rsp_timeout passed); their ids may be reused
        once a late response cannot come any more, which is the caller's judgement."""
        for k in req_ids:
            self._outstanding.pop(k, None)

    def set_port_status(self, mask: int, now: int) -> None:
        """This host's port-status mask (bit p: 1-based port p enabled): applied to its QPs at
        once, and announced to every peer they talk to (and to peers that announced theirs)."""
        if not self.status.set_local(mask):
            return
        self._apply()
        self._update_id = (self._update_id + 1) & 0xFFFFFFFF
        for peer in self._peers() | set(self.status.peers):
            self._updates[peer] = (self._update_id, self.status.local, now, UPDATE_TRIES)

    def on_port_status(self, peer: bytes, mask: int) -> None:
        """`peer` says which of its ports are usable: QPs towards it follow at once."""
        if self.status.set_peer(peer, mask):
            self._apply()

    # ---- applying port status to the host's QPs ------------------------------------------

    def _qps(self):
        return [qp for qpn, qp in self.mux.by_qpn.items() if qpn != fmt.ENDPOINT_QPN]

    def _peers(self) -> set[bytes]:
        peers = set()
        for qp in self._qps():
            if hasattr(qp, "profile"):  # a requester
                peers.add(packed_peer(next(iter(qp.paths.values()))))
            else:
                for rq in qp.qps.values():
                    peers.add(rq.peer if rq.peer is not None else packed_peer(next(iter(rq.paths_back.values()))))
        return peers

    def _apply(self) -> None:
        """Give every requester of the host the EVs it may not use now (responders ask the
        status themselves for each ACK)."""
        for qp in self._qps():
            if hasattr(qp, "profile"):
                qp.profile.exclude(self.status.blocked(packed_peer(next(iter(qp.paths.values()))), qp.paths))
            else:
                qp.ports = self.status
        self._applied = self.status.version

    def adopt(self) -> None:
        """A QP was added to the host: give it the current port status."""
        self._apply()

    # ---- receiving -----------------------------------------------------------------------

    def on_datagram(self, payload: bytes | memoryview, src: bytes, sport: int, now: int, tclass: int = 0,
                    port: int = 0) -> None:
        packet = decode_udp(payload, src, self.address, sport)
        if isinstance(packet, DropReason):
            self.drops[packet.value] += 1
        elif packet.dest_qp != fmt.ENDPOINT_QPN or packet.pkey != self.pkey:
            self.drops["unknown_qp" if packet.dest_qp != fmt.ENDPOINT_QPN else "bad_pkey"] += 1
        elif isinstance(packet, ProbePacket):
            self.answers.take(packet, src, port, now)
        elif isinstance(packet, ProbeResponsePacket):
            sent = self._outstanding.get(packet.probe_id)
            if sent is None or sent[0].ev != packet.ev or sent[0].peer != src:
                self.drops["unknown_probe"] += 1
                return
            del self._outstanding[packet.probe_id]
            rtt = now - sent[1]
            self.responses.append(EpResponse(sent[0].req_id, packet.port, max(0, rtt - packet.service_ns), 1,
                                             packet.service_ns, rtt))
        elif isinstance(packet, PortStatusPacket):
            if packet.ack:
                update = self._updates.get(src)
                if update is not None and update[0] == packet.req_id:
                    del self._updates[src]
                return
            self.updates_heard += 1
            self.on_port_status(src, packet.port_status)
            self._acks.append((src, packet.req_id, packet.port_status))
        else:
            self.drops["unexpected_packet"] += 1

    # ---- sending -------------------------------------------------------------------------

    def _way(self, peer: bytes, ev: int | None = None) -> Path | None:
        """A usable path to `peer`: EV `ev`'s when given (None if it is not usable), else the first usable one."""
        paths = self._paths(peer)
        if ev is not None:
            path = paths.get(ev)
            return path if path is not None and self.status.usable(peer, path) else None
        return next((p for p in paths.values() if self.status.usable(peer, p)), None)

    def _send(self, send: Send, peer: bytes, packet, ev: int | None = None) -> bool:
        path = self._way(peer, ev)
        if path is None:
            self.drops["no_usable_path"] += 1
            return False
        return send(path.template.encode(packet), path)

    def pump(self, now: int, send: Send, clock: Callable[[], int] | None = None, horizon: int | None = None) -> None:
        self._last_now = now
        if self._applied != self.status.version:
            self._apply()
        for r in self._queued:
            t = clock() if clock is not None else now
            probe = ProbePacket(fmt.ENDPOINT_QPN, r.req_id, VALUE_PROBE_EV if r.path is not None else r.ev, t, self.pkey)
            if r.path is not None:
                sent = send(r.path.template.encode(probe), r.path)
            else:
                sent = self._send(send, r.peer, probe, r.ev)
            if sent:
                self._outstanding[r.req_id] = (replace(r, ev=probe.ev), t)
        self._queued = []
        if self.answers.due:
            self.answers.flush(now, send, clock, lambda probe, src: self._answer_way(probe, src))
        for peer, req_id, mask in self._acks:
            self._send(send, peer, PortStatusPacket(fmt.ENDPOINT_QPN, req_id, mask, True, self.pkey))
        self._acks = []
        for peer, (req_id, mask, due, tries) in list(self._updates.items()):
            if due > now:
                continue
            if tries == 0:
                del self._updates[peer]
                self.drops["port_status_unacknowledged"] += 1
                continue
            self._send(send, peer, PortStatusPacket(fmt.ENDPOINT_QPN, req_id, mask, False, self.pkey))
            self.updates_sent += 1
            self._updates[peer] = (req_id, mask, now + UPDATE_RETRY_NS, tries - 1)

    def _answer_way(self, probe: ProbePacket, src: bytes) -> tuple[Path, int, int] | None:
        path = self._way(src, None if probe.ev == VALUE_PROBE_EV else probe.ev)
        return None if path is None else (path, fmt.ENDPOINT_QPN, self.pkey)

    def next_wakeup(self) -> int | None:
        if self._queued or self.answers.due or self._acks or self._applied != self.status.version:
            return self._last_now
        due = [u[2] for u in self._updates.values()]
        return min(due) if due else None
