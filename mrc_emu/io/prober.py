"""EV probes over sockets: send one probe along each EV and time its return.

Why it exists: users check a fabric path by path (`mrc-emu probe`), the way MRC revives an
ASSUMED_BAD EV: a probe of exactly that path comes back or it does not. A probe's segment
list goes out along the EV and back along its reverse, turned around by the destination
host's kernel (End SID), so no responder process is needed. This module sees sockets and
bytes only; which namespace the sockets live in is the caller's business. (A requester's
own probes, answered by the destination's MRC endpoint, are transport/probing.py's.)
"""

from __future__ import annotations

import itertools
import secrets
import select
import socket
import time
from dataclasses import dataclass

from ..wire.decoder import decode_roce
from ..wire.encoder import FrameTemplate
from ..wire.format import Endpoints, ProbePacket

_ids = itertools.count(secrets.randbits(24) << 8)


@dataclass(frozen=True)
class ProbeRequest:
    ev: int
    first_hop: str  # outer destination address: where the raw socket routes the frame
    template: FrameTemplate


@dataclass(frozen=True)
class ProbeResult:
    ev: int
    reachable: bool
    rtt_ns: int | None

    def to_dict(self) -> dict:
        return {"ev": self.ev, "reachable": self.reachable, "rtt_ns": self.rtt_ns}


def probe(send_sock: socket.socket, recv_sock: socket.socket, requests: list[ProbeRequest],
          dest_qp: int = 1, timeout: float = 1.0) -> list[ProbeResult]:
    """Send every probe at once; wait (at most `timeout`) for each to come back."""
    pending: dict[int, tuple[int, int]] = {}  # probe id -> (ev, send time)
    for req in requests:
        probe_id = next(_ids) & 0xFFFFFFFF
        sent = time.monotonic_ns()
        frame = req.template.encode(ProbePacket(dest_qp, probe_id, req.ev, sent))
        try:
            send_sock.sendto(frame, (req.first_hop, 0))
        except OSError:
            continue  # no route out (the host's own link is down): the EV is unreachable
        pending[probe_id] = (req.ev, sent)
    rtts: dict[int, int] = {}
    deadline = time.monotonic() + timeout
    while pending and (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([recv_sock], [], [], left)
        if not ready:
            break
        data, addr = recv_sock.recvfrom(65535)
        now = time.monotonic_ns()
        if len(data) < 8:
            continue
        sport, dport = int.from_bytes(data[0:2], "big"), int.from_bytes(data[2:4], "big")
        # a raw socket receives the UDP header; the ICRC check needs the inner addresses
        ends = Endpoints(addr[0], requests[0].template.ends.src, sport, dport) if requests else None
        decoded = decode_roce(data[8:], ends)
        if isinstance(decoded, ProbePacket) and decoded.probe_id in pending:
            ev, sent = pending.pop(decoded.probe_id)
            rtts[ev] = now - sent
    return [ProbeResult(r.ev, r.ev in rtts, rtts.get(r.ev)) for r in requests]
