"""A host's endpoint process: the sockets of one host and every QP it takes part in.

Why it exists: each host of a transfer gets one child process (fabric/procs.py) that
entered its namespace, with one raw socket (out) and one UDP socket on port 4791 (in),
serving all of that host's QPs: requesters and responders, demultiplexed by destination
QPN. One process per host gives each side its own core (Python has one per process) and
lets many transfers share a host (incast, all-to-all, rings) without fighting over port 4791.

The parent drives it with the messages below, as RDMA's connection manager would set a QP
up out of band: `Accept` registers a buffer and accepts a QP with that transfer's own
QpConfig (so each QP recovers in its own mode: MRC's selective repeat or the baseline's
go-back-N), `Write` posts a WRITE, `Hash` asks for the placed bytes' SHA-256, `Stop` ends
the run and brings back the `Final` report. It reports `Progress` every few milliseconds.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from ..fabric import netns
from ..fabric.procs import Parent, Stop
from ..io.sockets import SocketLink, run_socket, udp_receiver
from ..transport.cc import make_cc
from ..transport.config import QpConfig
from ..transport.paths import Path
from ..transport.requester import Requester
from ..transport.responder import Responder

TIMELINE_TICK_NS = 1_000_000  # goodput timeline resolution
REPORT_NS = 10_000_000  # progress reports to the parent
EV_TIMELINE_EVERY = 5  # per-EV packet counters every 5 timeline ticks


# ---- messages: parent -> host ---------------------------------------------------------------

@dataclass(frozen=True)
class Accept:
    """Register `size` bytes for transfer `key` (its own protection domain) and accept the QP
    that writes them, recovering as `config` says."""

    key: int
    size: int
    qpn: int
    peer_qpn: int
    start_psn: int
    back: dict[int, Path]  # the ACKs' paths, by the forward EV's index
    peer: str  # the requester's address
    config: QpConfig


@dataclass(frozen=True)
class Write:
    """Post transfer `key`'s WRITE of `size` random bytes into the remote region."""

    key: int
    qpn: int
    dest_qp: int
    forward: dict[int, Path]
    probes: dict[int, Path]
    config: QpConfig
    cc: str
    ev_min_active: int
    start_psn: int
    region: dict[str, Any]  # the remote region: rkey, va, length
    size: int
    imm: int | None


@dataclass(frozen=True)
class Hash:
    """Ask for the SHA-256 of transfer `key`'s registered buffer."""

    key: int


# ---- messages: host -> parent ---------------------------------------------------------------

@dataclass(frozen=True)
class Accepted:
    key: int
    region: dict[str, Any]


@dataclass(frozen=True)
class Started:
    key: int
    start_ns: int  # when the WRITE was posted (CLOCK_MONOTONIC, shared by all processes)


@dataclass(frozen=True)
class Hashed:
    key: int
    sha256: str


@dataclass(frozen=True)
class JobProgress:
    bytes_acked: int
    done: bool
    error: str | None
    ev_states: dict[int, str]


@dataclass(frozen=True)
class Progress:
    jobs: dict[int, JobProgress]  # by transfer key, for the WRITEs this host posted


@dataclass(frozen=True)
class Final:
    requesters: dict[int, dict[str, Any]]  # by transfer key: what the requester saw
    responders: dict[int, dict[str, Any]]  # by transfer key: stats, drops, immediate completions
    kernel_udp: dict[str, int]  # the namespace's UDP drop counters over the run
    unknown_qp: int  # datagrams for no QP of this host


# ---- the process ----------------------------------------------------------------------------

def _kernel_udp_counters() -> dict[str, int]:
    """UDP drop counters of the namespace this process is in (checksum errors, full buffers)."""
    wanted = ("Udp6InErrors", "Udp6RcvbufErrors", "Udp6InCsumErrors", "Udp6NoPorts")
    out = {}
    try:
        with open("/proc/net/snmp6") as f:
            for line in f:
                key, _, value = line.partition(" ")
                if key in wanted:
                    out[key] = int(value)
    except OSError:
        pass
    return out


class HostMux:
    """All QPs of one host behind one pair of sockets: datagrams go to the QP they name."""

    def __init__(self, address: bytes) -> None:
        self.address = address
        self.by_qpn: dict[int, Any] = {}
        self.endpoints: list[Any] = []
        self.unknown_qp = 0

    def add(self, qpn: int, endpoint: Any) -> None:
        self.by_qpn[qpn] = endpoint
        if endpoint not in self.endpoints:
            self.endpoints.append(endpoint)

    def on_datagram(self, payload: bytes | memoryview, src: bytes, sport: int, now: int) -> None:
        endpoint = self.by_qpn.get(int.from_bytes(payload[5:8], "big")) if len(payload) >= 12 else None
        if endpoint is None:
            self.unknown_qp += 1
            return
        endpoint.on_datagram(payload, src, sport, now)

    def pump(self, now: int, send, clock=None) -> None:
        for endpoint in self.endpoints:
            endpoint.pump(now, send, clock)

    def next_wakeup(self) -> int | None:
        wakes = [w for w in (e.next_wakeup() for e in self.endpoints) if w is not None]
        return min(wakes) if wakes else None


@dataclass
class _Job:
    key: int
    requester: Requester
    size: int
    sha256_source: str
    start_ns: int
    timeline: list[tuple[int, int]] = field(default_factory=list)
    ev_timeline: list[tuple[int, list[int], list[int]]] = field(default_factory=list)
    end_ns: int | None = None


class _Host:
    """What one host's process holds while it runs: its QPs, buffers and WRITEs."""

    def __init__(self, parent: Parent, address: bytes) -> None:
        self.parent = parent
        self.address = address
        self.mux = HostMux(address)
        # one responder per transfer: each transfer is its own protection domain, and each QP
        # recovers as its own config says, whatever the other QPs of this host do
        self.responders: dict[int, Responder] = {}
        self.regions: dict[int, Any] = {}
        self.jobs: dict[int, _Job] = {}
        self.stopped = False
        self.next_report = 0
        self.handlers = {Accept: self.accept, Write: self.write, Hash: self.hash, Stop: self.stop}

    def accept(self, msg: Accept) -> None:
        responder = Responder(self.address, msg.config, random_bits=secrets.randbits)
        mr = responder.register(bytearray(msg.size), va=0x1000_0000 + (msg.key << 36), pd=msg.key)
        responder.accept(msg.qpn, msg.peer_qpn, msg.start_psn, msg.back,
                         peer=socket.inet_pton(socket.AF_INET6, msg.peer), pd=msg.key)
        self.responders[msg.key], self.regions[msg.key] = responder, mr
        self.mux.add(msg.qpn, responder)
        self.parent.send(Accepted(msg.key, mr.to_dict()))

    def write(self, msg: Write) -> None:
        data = os.urandom(msg.size)
        digest = hashlib.sha256(data).hexdigest()  # before the clock starts: hashing is not the transfer
        requester = Requester(self.address, msg.qpn, msg.dest_qp, msg.forward, msg.probes, msg.config,
                              make_cc(msg.cc, msg.config.mtu), start_psn=msg.start_psn, ev_min_active=msg.ev_min_active,
                              random_bits=secrets.randbits)
        now = time.monotonic_ns()
        requester.post_write(data, msg.region["va"], msg.region["rkey"], msg.imm, now=now)
        self.jobs[msg.key] = _Job(msg.key, requester, msg.size, digest, now)
        self.mux.add(msg.qpn, requester)
        self.parent.send(Started(msg.key, now))

    def hash(self, msg: Hash) -> None:
        self.parent.send(Hashed(msg.key, hashlib.sha256(self.regions[msg.key].buffer).hexdigest()))

    def stop(self, _: Stop) -> None:
        self.stopped = True

    def tick(self, now: int) -> None:
        for job in self.jobs.values():
            if job.end_ns is None:
                job.timeline.append((now - job.start_ns, job.requester.bytes_acked))
                if len(job.timeline) % EV_TIMELINE_EVERY == 1:
                    evs = job.requester.profile.evs.values()
                    job.ev_timeline.append((now - job.start_ns, [e.packets_sent for e in evs],
                                            [e.packets_delivered for e in evs]))
                if job.requester.done:
                    job.end_ns = now
        while self.parent.poll():
            message = self.parent.recv()
            self.handlers[type(message)](message)
        if now >= self.next_report and self.jobs:
            self.next_report = now + REPORT_NS
            self.parent.send(Progress({
                k: JobProgress(j.requester.bytes_acked, j.end_ns is not None, j.requester.error,
                               {e: s.state.value for e, s in j.requester.profile.evs.items()})
                for k, j in self.jobs.items()}))

    def final(self, kernel_before: dict[str, int]) -> Final:
        after = _kernel_udp_counters()
        requesters = {}
        for key, job in self.jobs.items():
            r = job.requester
            done_ns = r.completions[-1].time_ns if r.completions and r.error is None else None
            share = r.profile.share()
            per_ev = [{**stats.to_dict(), "share": round(share[ev], 4), "bytes_in_flight": r.ev_bytes_in_flight(ev)}
                      for ev, stats in r.profile.evs.items()]
            requesters[key] = {
                "error": r.error, "start_ns": job.start_ns, "end_ns": job.end_ns or time.monotonic_ns(),
                "completed_ns": done_ns, "sha256_source": job.sha256_source, "stats": r.summary(), "drops": r.drops,
                "per_ev": per_ev, "ev_events": [e.to_dict(job.start_ns) for e in r.ev_events],
                "timeline": job.timeline, "ev_timeline": job.ev_timeline, "cc": r.cc.name,
            }
        responders = {key: {"stats": resp.stats, "drops": resp.drops,
                            "imm_completions": [{"psn": c.psn, "imm": c.imm, "time_ns": c.time_ns}
                                                for c in resp.completions]}
                      for key, resp in self.responders.items()}
        return Final(requesters, responders, {k: after.get(k, 0) - kernel_before.get(k, 0) for k in after},
                     self.mux.unknown_qp)


def serve_host(parent: Parent, ns_path: str, address: str) -> None:
    """A host's process (a procs.Child target): enter its namespace, serve the parent's requests
    and all its QPs until told to stop, then send the Final report."""
    netns.move_to(ns_path)
    recv = udp_receiver(address)
    raw = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_RAW)
    host = _Host(parent, socket.inet_pton(socket.AF_INET6, address))
    kernel_before = _kernel_udp_counters()
    parent.ready()
    run_socket(host.mux, SocketLink(raw, recv), lambda: host.stopped, tick=host.tick, tick_ns=TIMELINE_TICK_NS)
    parent.send(host.final(kernel_before))
