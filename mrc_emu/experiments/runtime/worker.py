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

from ...api.errors import MrcApiError
from ...api.files import ProfileFile
from ...api.formats import EvFormatMode
from ...fabric.kernel import netns
from ...fabric.procs import Parent, Stop
from ...io.loop import Clock, EventLoop, Horizon, Port
from ...io.sockets import raw_sender, udp_receiver
from ...transport.config import QpConfig
from ...transport.endpoint import HostEndpoint
from ...transport.multipath.evvalues import ValuePaths
from ...transport.multipath.paths import Path
from ...transport.mux import HostMux
from ...transport.responder import Responder
from .endpoint_ops import SetPortStatus, WorkerOps
from .hostctl import HostControl
from .qps import TIMELINE_TICK_NS, WriteJob, accept_write, prepare_write, responder_report

REPORT_NS = 10_000_000  # progress reports to the parent, every this many ns of wall time (REPORT_NS / K emulated)
LIVE_JOBS = 16  # transfers whose EVs a progress report details (mrc-emu view shows them): a ring of 128 stays cheap
RECV_BUFFER = 256 * 1024 * 1024  # a host's receive socket: an incast of 64 windows must fit, or the kernel drops
KERNEL_UDP = ("Udp6InErrors", "Udp6RcvbufErrors", "Udp6InCsumErrors", "Udp6NoPorts")


def report_interval_ns(dilation: float) -> int:
    """Transport time between two progress reports: REPORT_NS of wall time, so that under time
    dilation K a fault at a fraction of the bytes (a hook the parent runs on a report) fires as
    close to it in emulated time as at K = 1, not K times later (at K = 16 a ring's 30 % fault
    fired at 13.3 ms of its 14.5 ms with reports every 10 ms of emulated time)."""
    return int(REPORT_NS / dilation)


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
    mode: EvFormatMode | None = None  # the api format of its EV profile (None: from the paths)
    caps: int = 0  # its api QP caps (QpCap): TRIM_NACK_DEST_UNSUPPORTED, SVC_TIME_DEST_UNSUPPORTED


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
    values: ValuePaths | None = None  # how its EVs' values become paths: the requester follows its profile's
    cc_config: dict[str, Any] | None = None  # its CC profile's config
    profile: ProfileFile | None = None  # the EV profile file its EVs come from: the host's controller holds it


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
class ReplaceEv:
    """REPLACE_EV on the EV profile of transfer `key`'s QP: EV `ev` takes `value` on `port` (None: its own);
    `value` None puts its first value back."""

    key: int
    ev: int
    value: bytes | None
    port: int | None
    ident: str  # the controller record's id of the REPLACE_EV (its answer names it)


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
    ev_states: dict[int, str] | None  # every EV's state: of the first LIVE_JOBS transfers only (what a run shows live)
    ev_sent: dict[int, int] | None = None  # packets sent per EV so far (its share), for those transfers too
    ev_events: tuple[dict[str, Any], ...] = ()  # EV events since the last report (time_ms from the WRITE's start)


@dataclass(frozen=True)
class Progress:
    jobs: dict[int, JobProgress]  # by transfer key, for the WRITEs this worker's hosts posted
    # per host: the EV events its controller queued since the last report (hostctl.take_events), and drops
    ev_queues: dict[str, tuple[list[dict[str, Any]], int]] = field(default_factory=dict)
    replaced: tuple[tuple[int, int, str], ...] = ()  # (key, EV, why not) of each refused ReplaceEv ("" = done)


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
        raw = raw_sender()
        ports = {socket.if_nametoindex(intf): port for intf, port in spec.ports.items()}
        return raw, recv, kernel_udp_counters(), ports


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
        self.jobs: dict[int, WriteJob] = {}
        self.running: list[WriteJob] = []  # started, not done
        self.stopped = False
        self.next_report = 0
        self.events_reported: dict[int, int] = {}  # by transfer key: its EV events already in a progress report
        self.ctl = {name: HostControl(name, max(1, len(spec.ports))) for name, spec in hosts.items()}  # OCP controllers
        self.ops = WorkerOps(parent, loop, ports)  # EV_PROBE batches, port status (experiments/runtime/endpoint_ops.py)
        self.handlers = {Accept: self.accept, Prepare: self.prepare, Start: self.start, Hash: self.hash,
                         SetEvStates: self.set_ev_states, ReplaceEv: self.replace_ev, Stop: self.stop,
                         **self.ops.handlers}
        self.replaced: list[tuple[int, int, str]] = []
        self.handlers[SetPortStatus] = self.set_port_status
    def on_control(self) -> None:
        while self.parent.poll():
            message = self.parent.recv()
            self.handlers[type(message)](message)

    def accept(self, msg: Accept) -> None:
        port = self.ports[msg.host]
        responder, mr = accept_write(port.mux, self.ctl[msg.host], msg.key, msg.size, msg.qpn, msg.peer_qpn,
                                     msg.start_psn, msg.back, msg.peer, msg.config, msg.recvs, secrets.randbits,
                                     msg.mode, msg.caps)
        self.responders[msg.key], self.regions[msg.key] = responder, mr
        self.loop.add_endpoint(responder, port, first=True)
        self.parent.send(Accepted(msg.key, mr.to_dict()))

    def prepare(self, msg: Prepare) -> None:
        profile_id = None
        if msg.profile is not None:  # made on the host's controller as the file says, bound by id
            ports = {ev: (path.plane or 0) + 1 for ev, path in msg.forward.items()}
            peer = next(iter(msg.forward.values())).template.ends.dst
            profile_id = self.ctl[msg.host].load_profile(msg.profile, peer, ports)
        data = os.urandom(msg.size)
        digest = hashlib.sha256(data).hexdigest()  # before the clock starts: hashing is not the transfer
        self.jobs[msg.key] = prepare_write(self.ports[msg.host].mux, self.ctl[msg.host], msg.key, msg.host, msg.qpn,
                                           msg.dest_qp, msg.forward, msg.config, msg.cc, msg.ev_min_active,
                                           msg.start_psn, msg.region, data, digest, msg.imm, secrets.randbits,
                                           msg.values, msg.cc_config, profile_id)
        self.parent.send(Prepared(msg.key))

    def start(self, msg: Start) -> None:
        self.loop.measure(True)
        now = self.clock.now()
        for key in msg.keys:
            job = self.jobs[key]
            job.post(now)
            self.loop.add_endpoint(job.requester, self.ports[job.host])
            self.running.append(job)
        self.parent.send(Started(msg.keys, now))

    def set_ev_states(self, msg: SetEvStates) -> None:
        self.jobs[msg.key].set_ev_states(msg.deny, msg.allow, msg.reason, self.clock.now())

    def replace_ev(self, msg: ReplaceEv) -> None:
        """The controller's REPLACE_EV on the QP's EV profile: its frames follow at the next pump."""
        job = self.jobs.get(msg.key)
        why = "no such transfer here"
        if job is not None:
            profile, now = job.requester.profile, self.clock.now()
            try:
                old = self.ctl[job.host].replace_ev(profile.api.profile_id, msg.ev, msg.value, msg.port)
                why = ""
            except (ValueError, MrcApiError) as exc:
                why = str(exc)
            else:
                job.ev_ops.append({"time_ns": now, "deny": [], "allow": [], "replace": msg.ev,
                                   "old": old[0].rstrip(bytes(1)).hex(), "value": msg.value and msg.value.hex(),
                                   "port": msg.port, "id": msg.ident,
                                   "reason": f"REPLACE_EV: EV {msg.ev} " + (f"value 0x{msg.value.hex()}" if msg.value
                                                                            else "back to its first value"),
                                   "sent": {str(ev): s.packets_sent for ev, s in profile.evs.items()}})
                self.loop.wake(job.requester)
        self.replaced.append((msg.key, msg.ev, why))

    def set_port_status(self, msg: SetPortStatus) -> None:
        """A host's port-status mask (endpoint_ops), and, for the report, what it did to each of the
        host's QPs (qps.WriteJob.record_port_status)."""
        was = self.ports[msg.host].mux.endpoint.status.local
        self.ops.port_status(msg)
        admin = self.ctl[msg.host].follow_ports(msg.mask)  # the api's port admin state is the endpoint's
        now = self.clock.now()
        for job in self.jobs.values():
            if job.host == msg.host:
                job.record_port_status(was, msg.mask, now, admin)

    def hash(self, msg: Hash) -> None:
        self.loop.measure(False)
        self.parent.send(Hashed(msg.key, hashlib.sha256(self.regions[msg.key].buffer).hexdigest()))

    def stop(self, _: Stop) -> None:
        self.stopped = True

    def tick(self, now: int) -> None:
        self.ops.tick(now)
        self.running = [job for job in self.running if not job.sample(now)]
        if now >= self.next_report and self.jobs:
            self.next_report = now + report_interval_ns(self.clock.dilation)
            events = {host: taken for host, hc in self.ctl.items() if (taken := hc.take_events())[0]}
            self.parent.send(Progress({k: self._progress(k, j) for k, j in self.jobs.items() if j.start_ns}, events,
                                      tuple(self.replaced)))
            self.replaced = []

    def _progress(self, key: int, job: WriteJob) -> JobProgress:
        r = job.requester
        if key >= LIVE_JOBS:
            return JobProgress(r.bytes_acked, job.end_ns is not None, r.error, r.profile.assumed_bad, None)
        events = r.ev_events
        fresh = tuple(e.to_dict(job.start_ns) for e in events[self.events_reported.get(key, 0):])
        self.events_reported[key] = len(events)
        return JobProgress(r.bytes_acked, job.end_ns is not None, r.error, r.profile.assumed_bad,
                           {e: s.state.name for e, s in r.profile.evs.items()},
                           {e: s.packets_sent for e, s in r.profile.evs.items()}, fresh)

    def final(self, before: dict[str, dict[str, int]], loop_stats: dict[str, Any]) -> Final:
        kernel = {}
        for host, spec in self.hosts.items():
            with netns.entered(spec.ns_path):
                after = kernel_udp_counters()
            kernel[host] = {k: after[k] - before[host].get(k, 0) for k in after}
        requesters = {key: job.report(self.clock.now()) for key, job in self.jobs.items()}
        responders = {key: responder_report(resp) for key, resp in self.responders.items()}
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
