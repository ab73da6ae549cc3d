"""An endpoint worker: one process serving the sockets and QPs of many hosts.

Why it exists: a process per host does not hold on 2 cores: 128 of them wait tens of
milliseconds each for the CPU, and timers meant for the network measure that wait instead.
So a fixed pool of workers (default one per CPU) serves every host of a run. A worker makes
each host's sockets inside that host's namespace (a socket stays in the namespace it was
made in; the worker itself stays in the root namespace), and drives all of them from one
event loop (io/loop.py): one epoll, one wakeup heap, bounded turns, kernel arrival stamps,
its own lag measured, its horizon shared with the other workers.

The parent drives it with the messages below, as RDMA's connection manager would set QPs up
out of band: `Accept` registers a buffer at a host and accepts the QP that writes it (with
that transfer's own QpConfig, so each QP recovers in its own mode); `Prepare` makes a
WRITE's source bytes and their SHA-256 and builds its requester (all before any WRITE
starts, so that making bytes never stalls a running transfer); `Start` posts prepared
WRITEs; `Hash` asks for the placed bytes' SHA-256; `Stop` ends the run and brings back the
`Final` report. The worker reports `Progress` every few milliseconds.
"""

from __future__ import annotations

import gc
import hashlib
import os
import secrets
import socket
from dataclasses import dataclass, field
from typing import Any

from ...api.qp import WrOpcode
from ...fabric.kernel import netns
from ...fabric.procs import Parent, Stop
from ...io.loop import Clock, EventLoop, Horizon, Port
from ...io.sockets import udp_receiver
from ...transport.cc.registry import make_cc
from ...transport.config import QpConfig
from ...transport.endpoint import HostEndpoint
from ...transport.multipath.paths import Path
from ...transport.mux import HostMux
from ...transport.requester import Requester
from ...transport.responder import Responder
from .endpoint_ops import SetPortStatus, WorkerOps
from .hostctl import HostControl

TIMELINE_TICK_NS = 1_000_000  # goodput timeline resolution (transport time)
REPORT_NS = 10_000_000  # progress reports to the parent
EV_TIMELINE_EVERY = 5  # per-EV packet counters every 5 timeline ticks
EV_TIMELINE_JOBS = 4  # ... of the first few WRITEs only (the report plots the first)
RECV_BUFFER = 256 * 1024 * 1024  # a host's receive socket: an incast of 64 windows must fit, or the kernel drops
KERNEL_UDP = ("Udp6InErrors", "Udp6RcvbufErrors", "Udp6InCsumErrors", "Udp6NoPorts")


def _since(ledger: dict, start_ns: int) -> dict:
    """A requester's ledger (transport/ledger.py) with its times made relative to the job's start,
    as its timeline and EV events are (EVs stay as they are: the first field of each repair)."""
    last = ledger["last_progress"]
    return {"gaps": [[a - start_ns, b - start_ns] for a, b in ledger["gaps"]],
            "last_progress": None if last is None else last - start_ns,
            "repairs": [[ev, *(t - start_ns for t in rest)] for ev, *rest in ledger["repairs"]],
            "unrepaired": [[ev, *(t - start_ns for t in rest)] for ev, *rest in ledger["unrepaired"]]}


# ---- messages: parent -> worker -------------------------------------------------------------

@dataclass(frozen=True)
class HostSpec:
    """A host this worker serves: its name, namespace and address, and its interfaces' 1-based
    ports (interface name -> port: the NIC on plane p is port p + 1)."""

    name: str
    ns_path: str
    address: str
    ports: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Accept:
    """At `host`, register `size` bytes for transfer `key` (its own protection domain) and accept
    the QP that writes them, recovering as `config` says."""

    key: int
    host: str
    size: int
    qpn: int
    peer_qpn: int
    start_psn: int
    back: dict[int, Path]  # the ACKs' paths, by the forward EV's index
    peer: str  # the requester's address
    config: QpConfig
    recvs: int = 0  # receives posted before the WRITE starts (one per WRITE_WITH_IMM: MRC has no RNR)


@dataclass(frozen=True)
class Prepare:
    """At `host`, make transfer `key`'s `size` random bytes and its requester; post nothing yet."""

    key: int
    host: str
    qpn: int
    dest_qp: int
    forward: dict[int, Path]
    config: QpConfig
    cc: str
    ev_min_active: int
    start_psn: int
    region: dict[str, Any]  # the remote region: rkey, va, length
    size: int
    imm: int | None


@dataclass(frozen=True)
class Start:
    """Post the prepared WRITEs of these transfers, now (none: only start measuring the loop)."""

    keys: tuple[int, ...]


@dataclass(frozen=True)
class SetEvStates:
    """The controller's word on transfer `key`'s EVs (experiments/runtime/controller.py): deny these, allow
    those (an allowed EV is probed before it carries data again)."""

    key: int
    deny: tuple[int, ...]
    allow: tuple[int, ...]
    reason: str


@dataclass(frozen=True)
class Hash:
    """Ask for the SHA-256 of transfer `key`'s registered buffer."""

    key: int


# ---- messages: worker -> parent -------------------------------------------------------------

@dataclass(frozen=True)
class Accepted:
    key: int
    region: dict[str, Any]


@dataclass(frozen=True)
class Prepared:
    key: int


@dataclass(frozen=True)
class Started:
    keys: tuple[int, ...]
    start_ns: int  # when the WRITEs were posted (the transport's clock)


@dataclass(frozen=True)
class Hashed:
    key: int
    sha256: str


@dataclass(frozen=True)
class JobProgress:
    bytes_acked: int
    done: bool
    error: str | None
    assumed_bad: int  # EVs ASSUMED_BAD now
    ev_states: dict[int, str] | None  # every EV's state: of the first transfer only (what a run shows live)


@dataclass(frozen=True)
class Progress:
    jobs: dict[int, JobProgress]  # by transfer key, for the WRITEs this worker's hosts posted


@dataclass(frozen=True)
class Final:
    requesters: dict[int, dict[str, Any]]  # by transfer key: what the requester saw
    responders: dict[int, dict[str, Any]]  # by transfer key: stats, drops, immediate completions
    kernel_udp: dict[str, dict[str, int]]  # per host: the namespace's UDP drop counters over the run
    unknown_qp: dict[str, int]  # per host: datagrams for no QP of it
    loop: dict[str, Any]  # the event loop's own measurements (io.loop.LoopStats)
    hosts: list[str] = field(default_factory=list)
    ev_queues: dict[str, tuple[list[dict[str, Any]], int]] = field(default_factory=dict)  # per host: EV events, drops


# ---- the process ----------------------------------------------------------------------------

def kernel_udp_counters() -> dict[str, int]:
    """UDP drop counters of the namespace this thread is in (checksum errors, full buffers)."""
    out = dict.fromkeys(KERNEL_UDP, 0)
    try:
        with open("/proc/thread-self/net/snmp6") as f:
            for line in f:
                key, _, value = line.partition(" ")
                if key in out:
                    out[key] = int(value)
    except OSError:
        pass
    return out


def _host_sockets(spec: HostSpec) -> tuple[socket.socket, socket.socket, dict[str, int], dict[int, int]]:
    """The host's raw socket (out) and UDP socket on port 4791 (in), made inside its namespace,
    its kernel UDP counters, and its interface indexes' ports."""
    with netns.entered(spec.ns_path):
        recv = udp_receiver(spec.address, buffer=RECV_BUFFER)
        raw = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_RAW)
        ports = {socket.if_nametoindex(intf): port for intf, port in spec.ports.items()}
        return raw, recv, kernel_udp_counters(), ports


@dataclass
class _Job:
    key: int
    requester: Requester
    port: Port
    data: bytes
    region: dict[str, Any]
    imm: int | None
    sha256_source: str
    start_ns: int = 0
    timeline: list[tuple[int, int]] = field(default_factory=list)
    ev_timeline: list[tuple[int, list[int], list[int]]] = field(default_factory=list)
    ev_ops: list[dict[str, Any]] = field(default_factory=list)  # the controller's changes, with per-EV packets sent then
    api_qp: Any = None  # its api.Qp (hostctl.py): RTS, the WRs posted on it counted against max_wimm
    end_ns: int | None = None


class _Worker:
    """What one worker holds while it runs: its hosts' ports, QPs, buffers and WRITEs."""

    def __init__(self, parent: Parent, loop: EventLoop, hosts: dict[str, HostSpec], ports: dict[str, Port]) -> None:
        self.parent = parent
        self.loop = loop
        self.clock = loop.clock
        self.hosts = hosts
        self.ports = ports
        self.responders: dict[int, Responder] = {}
        self.regions: dict[int, Any] = {}
        self.jobs: dict[int, _Job] = {}
        self.running: list[_Job] = []  # started, not done
        self.stopped = False
        self.next_report = 0
        self.ctl = {name: HostControl(name, max(1, len(spec.ports))) for name, spec in hosts.items()}  # OCP controllers
        self.ops = WorkerOps(parent, loop, ports)  # EV_PROBE batches, port status (experiments/runtime/endpoint_ops.py)
        self.handlers = {Accept: self.accept, Prepare: self.prepare, Start: self.start, Hash: self.hash,
                         SetEvStates: self.set_ev_states, Stop: self.stop, **self.ops.handlers}
        self.handlers[SetPortStatus] = self.set_port_status
    def on_control(self) -> None:
        while self.parent.poll():
            message = self.parent.recv()
            self.handlers[type(message)](message)

    def accept(self, msg: Accept) -> None:
        port = self.ports[msg.host]
        responder = Responder(port.mux.address, msg.config, random_bits=secrets.randbits)
        mr = responder.register(bytearray(msg.size), va=0x1000_0000 + (msg.key << 36), pd=msg.key)
        responder.accept(msg.qpn, msg.peer_qpn, msg.start_psn, msg.back,
                         peer=socket.inet_pton(socket.AF_INET6, msg.peer), pd=msg.key)
        self.ctl[msg.host].responder_qp(msg.peer, msg.back, msg.config, msg.recvs)  # INIT -> RTR, receives posted
        responder.post_recv(msg.qpn, msg.recvs)
        self.responders[msg.key], self.regions[msg.key] = responder, mr
        port.mux.add(msg.qpn, responder)
        self.loop.add_endpoint(responder, port, first=True)
        self.parent.send(Accepted(msg.key, mr.to_dict()))

    def prepare(self, msg: Prepare) -> None:
        port = self.ports[msg.host]
        data = os.urandom(msg.size)
        digest = hashlib.sha256(data).hexdigest()  # before the clock starts: hashing is not the transfer
        # the QP takes its EV and CC profiles by id and goes RST -> INIT -> RTR -> RTS (hostctl.py);
        # its EV states are its EV profile's, shared with the host's other QPs towards that peer
        hc = self.ctl[msg.host]
        profile, api_qp, config = hc.requester_qp(next(iter(msg.forward.values())).template.ends.dst, msg.forward,
                                             msg.config, msg.cc, msg.ev_min_active)
        requester = Requester(port.mux.address, msg.qpn, msg.dest_qp, msg.forward, config,
                              make_cc(msg.cc, config.mtu, config.link_rate_bps, config.base_rtt_ns,
                                      **(config.cc_options or {})), start_psn=msg.start_psn,
                              random_bits=secrets.randbits, probe_budget=port.mux.probe_budget,
                              ev_profile=profile, ev_events=hc.ctl.events)
        self.jobs[msg.key] = _Job(msg.key, requester, port, data, msg.region, msg.imm, digest, api_qp=api_qp)
        port.mux.add(msg.qpn, requester)
        self.parent.send(Prepared(msg.key))

    def start(self, msg: Start) -> None:
        self.loop.measure(True)
        now = self.clock.now()
        for key in msg.keys:
            job = self.jobs[key]
            job.start_ns = now
            job.api_qp.post_send(WrOpcode.RDMA_WRITE if job.imm is None else WrOpcode.RDMA_WRITE_WITH_IMM)  # max_wimm
            job.requester.post_write(job.data, job.region["va"], job.region["rkey"], job.imm, now=now)
            self.loop.add_endpoint(job.requester, job.port)
            self.running.append(job)
        self.parent.send(Started(msg.keys, now))

    def set_ev_states(self, msg: SetEvStates) -> None:
        job = self.jobs[msg.key]
        profile, now = job.requester.profile, self.clock.now()
        for ev in msg.deny:
            profile.deny(ev, now, msg.reason)
        for ev in msg.allow:
            profile.allow(ev, now)
        job.ev_ops.append({"time_ns": now, "deny": list(msg.deny), "allow": list(msg.allow), "reason": msg.reason,
                           "sent": {str(ev): s.packets_sent for ev, s in profile.evs.items()}})  # str: as JSON has it

    def set_port_status(self, msg: SetPortStatus) -> None:
        """A host's port-status mask (endpoint_ops), and, for the report, what it did to each of the
        host's QPs: the EVs it took out of use or gave back, with the per-EV counters then."""
        before = {key: self._port_excluded(job, self.ports[msg.host].mux.endpoint.status.local)
                  for key, job in self.jobs.items() if job.port is self.ports[msg.host]}
        self.ops.port_status(msg)
        now = self.clock.now()
        for key, was in before.items():
            job = self.jobs[key]
            off = self._port_excluded(job, msg.mask)
            ports = {(path.plane or 0) + 1 for path in job.requester.paths.values()}
            disabled = sorted(p for p in ports if not msg.mask >> p & 1)
            job.ev_ops.append({"time_ns": now, "deny": sorted(off - was), "allow": sorted(was - off),
                               "reason": f"{msg.host} port(s) {', '.join(map(str, disabled))} disabled" if disabled
                               else f"{msg.host} ports enabled",
                               "sent": {str(ev): s.packets_sent for ev, s in job.requester.profile.evs.items()}})

    @staticmethod
    def _port_excluded(job: _Job, mask: int) -> set[int]:
        return {ev for ev, path in job.requester.paths.items() if not mask >> ((path.plane or 0) + 1) & 1}

    def hash(self, msg: Hash) -> None:
        self.loop.measure(False)
        self.parent.send(Hashed(msg.key, hashlib.sha256(self.regions[msg.key].buffer).hexdigest()))

    def stop(self, _: Stop) -> None:
        self.stopped = True

    def tick(self, now: int) -> None:
        self.ops.tick(now)
        still = []
        for job in self.running:
            r = job.requester
            # a WRITE's last sample is at its completion, not at the tick that noticed it
            at = min(now, r.completions[-1].time_ns) if r.done and r.completions and r.error is None else now
            job.timeline.append((at - job.start_ns, r.bytes_acked))
            if job.key < EV_TIMELINE_JOBS and len(job.timeline) % EV_TIMELINE_EVERY == 1:
                evs = job.requester.profile.evs.values()
                job.ev_timeline.append((now - job.start_ns, [e.packets_sent for e in evs],
                                        [e.packets_delivered for e in evs]))
            if job.requester.done:
                job.end_ns = now
            else:
                still.append(job)
        self.running = still
        if now >= self.next_report and self.jobs:
            self.next_report = now + REPORT_NS
            self.parent.send(Progress({
                k: JobProgress(j.requester.bytes_acked, j.end_ns is not None, j.requester.error,
                               j.requester.profile.assumed_bad,
                               {e: s.state.name for e, s in j.requester.profile.evs.items()} if k == 0 else None)
                for k, j in self.jobs.items() if j.start_ns}))

    def final(self, before: dict[str, dict[str, int]], loop_stats: dict[str, Any]) -> Final:
        kernel = {}
        for host, spec in self.hosts.items():
            with netns.entered(spec.ns_path):
                after = kernel_udp_counters()
            kernel[host] = {k: after[k] - before[host].get(k, 0) for k in after}
        requesters = {}
        for key, job in self.jobs.items():
            r = job.requester
            done_ns = r.completions[-1].time_ns if r.completions and r.error is None else None
            share = r.profile.share()
            per_ev = [{**stats.to_dict(), "share": round(share[ev], 4), "bytes_in_flight": r.ev_bytes_in_flight(ev)}
                      for ev, stats in r.profile.evs.items()]
            requesters[key] = {
                "error": r.error, "start_ns": job.start_ns, "end_ns": job.end_ns or self.clock.now(),
                "completed_ns": done_ns, "sha256_source": job.sha256_source, "stats": r.summary(), "drops": r.drops,
                "per_ev": per_ev, "ev_events": [e.to_dict(job.start_ns) for e in r.ev_events],
                "timeline": job.timeline, "ev_timeline": job.ev_timeline, "cc": r.cc.name,
                "ledger": _since(r.recovery.ledger.to_dict(), job.start_ns),
                "ev_ops": [{k: v for k, v in op.items() if k != "time_ns"} | {"time_ms": round((op["time_ns"] - job.start_ns) / 1e6, 3)}
                           for op in job.ev_ops],
            }
        responders = {key: {"stats": resp.stats, "drops": resp.drops, "reorder": resp.reorder(),
                            "imm_completions": [{"psn": c.psn, "imm": c.imm, "time_ns": c.time_ns}
                                                for c in resp.completions]}
                      for key, resp in self.responders.items()}
        loop_stats["send_errors"] = {h: p.errors for h, p in self.ports.items() if p.errors}
        return Final(requesters, responders, kernel, {h: p.mux.unknown_qp for h, p in self.ports.items()},
                     loop_stats, sorted(self.ports), {h: hc.take_events() for h, hc in self.ctl.items()})


def serve_hosts(parent: Parent, index: int, hosts: list[HostSpec], horizon: Horizon, dilation: float,
                origin_ns: int) -> None:
    """A worker (a procs.Child target): make every host's sockets in its namespace, serve the
    parent's requests and all the QPs until told to stop, then send the Final report."""
    clock = Clock(dilation, origin_ns)
    loop = EventLoop(clock, horizon, index)
    ports: dict[str, Port] = {}
    before: dict[str, dict[str, int]] = {}
    for spec in hosts:
        raw, recv, before[spec.name], by_ifindex = _host_sockets(spec)
        mux = HostMux(socket.inet_pton(socket.AF_INET6, spec.address))
        port = ports[spec.name] = Port(spec.name, raw, recv, mux, by_ifindex)
        mux.serve(HostEndpoint(mux.address, mux, None, max(1, len(spec.ports))))  # QPN 0x2: probes, port status
        loop.add_port(port)
        loop.add_endpoint(mux.endpoint, port, first=True)
    worker = _Worker(parent, loop, {spec.name: spec for spec in hosts}, ports)
    loop.add_control(parent.fileno(), worker.on_control)
    parent.ready()
    # The cyclic garbage collector is paused while the loop runs: a full collection over a
    # large heap stalls it for milliseconds, and the transport's objects are freed by
    # reference counting anyway.
    gc.disable()
    try:
        stats = loop.run(lambda: worker.stopped, tick=worker.tick, tick_ns=TIMELINE_TICK_NS)
    finally:
        gc.enable()
    parent.send(worker.final(before, stats.to_dict()))
