"""MRC transfers on a running fabric: one process per host, any number of QPs at once.

Why it exists: `mrc-emu send`, the system tests, the benchmarks and the scenarios all run
WRITEs between hosts. Each host taking part gets one child process that entered its
namespace, with one raw socket (out) and one UDP socket on port 4791 (in), serving all of
that host's QPs: requesters and the responder, demultiplexed by destination QPN. One
process per host gives each side its own core (Python has one per process) and lets many
transfers share a host (incast, all-to-all, rings) without fighting over port 4791.

QP set-up is out of band, as RDMA's connection manager would do it: the parent asks the
destination host to register a buffer and accept a QP (QPN, starting PSN, R_Key, VA,
length come back over a pipe), then tells the source host to post the WRITE. Children
report progress every few milliseconds; the parent runs fault hooks and progress bars.

Every child is recorded in the fabric's journal (so `clean` can kill it after a crash) and
dies with its parent (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import ctypes
import hashlib
import itertools
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ..fabric import netns
from ..fabric.running import Fabric
from ..topology.evs import EvFormat
from ..transport.cc import make_cc
from ..transport.ev import EvState
from ..transport.link import SocketLink, run_socket, udp_receiver
from ..transport.paths import qp_paths
from ..transport.qp import QpConfig, Requester, Responder

PR_SET_PDEATHSIG = 1
TIMELINE_TICK_NS = 1_000_000  # goodput timeline resolution
REPORT_NS = 10_000_000  # progress reports to the parent
EV_TIMELINE_EVERY = 5  # per-EV packet counters every 5 timeline ticks


class TransferError(RuntimeError):
    """A transfer could not be set up or run (bad arguments, a host process failed)."""


@dataclass
class Control:
    """Shared with other threads while transfers run: progress and EV states, read-only to them."""

    progress: float = 0.0  # of all transfers together
    bytes_acked: int = 0
    ev_states: dict[int, str] = field(default_factory=dict)  # of the first transfer
    started_ns: int = 0
    finished: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)  # set to abandon the transfers
    # (progress fraction, action): run once by the parent when progress reaches it (a fault
    # agent times the fault itself, to the microsecond)
    hooks: list[tuple[float, Callable[[], object]]] = field(default_factory=list)


@dataclass
class TransferSpec:
    src: str
    dst: str
    size: int
    evs: list[int] | None = None
    ev_format: EvFormat = EvFormat.SRV6
    config: QpConfig = field(default_factory=QpConfig)
    cc: str = "nscc"
    ev_min_active: int = 1
    imm: int | None = None
    label: str = ""
    start_at: float | None = None  # start when the other transfers reach this progress (competing flows)


@dataclass
class TransferResult:
    ok: bool
    error: str | None
    src: str
    dst: str
    size: int
    mtu: int
    ev_format: str
    cc: str
    evs: list[int]
    start_ns: int
    end_ns: int
    completion_ms: float | None
    goodput_gbps: float | None
    goodput_pps: float | None
    sha256_source: str
    sha256_placed: str | None
    requester: dict[str, Any]
    responder: dict[str, Any]
    per_ev: list[dict[str, Any]]
    ev_events: list[dict[str, Any]]
    timeline: list[tuple[int, int]]  # (ns since start, bytes acknowledged so far), every ~1 ms
    imm_completions: list[dict[str, Any]] = field(default_factory=list)
    label: str = ""
    ev_timeline: list[tuple[int, list[int], list[int]]] = field(default_factory=list)  # (ns, sent, delivered per EV)

    @property
    def verified(self) -> bool:
        return self.ok and self.sha256_placed == self.sha256_source

    def to_dict(self, timeline: bool = False) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k not in ("timeline", "ev_timeline")}
        out["verified"] = self.verified
        if timeline:
            out["timeline"] = [[round(t / 1e6, 3), b] for t, b in self.timeline]
        return out


# ---- the host process ---------------------------------------------------------------------------

def _die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


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


def stop_child(fabric: Fabric, proc, conn, farewell) -> None:
    """Ask a child to stop, kill it if it does not within 5 s, record that it ended."""
    if proc.is_alive():
        try:
            conn.send(farewell)
        except OSError:
            pass
        proc.join(timeout=5)
    if proc.is_alive():
        proc.kill()
        proc.join()
    fabric.journal.process_ended(proc.pid)


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


def _host_main(conn, ns_path: str, address: str, config: QpConfig, cpu: int | None) -> None:
    """A host's process: enter its namespace, serve the parent's requests and all its QPs."""
    _die_with_parent()
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and tells us to stop
    try:
        netns.move_to(ns_path)
        recv = udp_receiver(address)
        raw = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_RAW)
    except Exception as exc:  # reported to the parent, which raises it
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    packed = socket.inet_pton(socket.AF_INET6, address)
    mux = HostMux(packed)
    responder = Responder(packed, config)
    regions: dict[int, Any] = {}
    jobs: dict[int, _Job] = {}
    counters_before = _kernel_udp_counters()
    state = {"stop": False, "next_report": 0}
    conn.send(("ready", None))

    def handle(msg: tuple) -> None:
        kind = msg[0]
        if kind == "register":
            _, key, size = msg
            # each transfer is its own protection domain: no other QP can write its region
            mr = responder.register(bytearray(size), va=0x1000_0000 + (key << 36), pd=key)
            regions[key] = mr
            conn.send(("registered", (key, mr.to_dict())))
        elif kind == "accept":
            _, qpn, peer_qpn, start_psn, back, peer, pd = msg
            responder.accept(qpn, peer_qpn, start_psn, back, peer=socket.inet_pton(socket.AF_INET6, peer), pd=pd)
            mux.add(qpn, responder)
            conn.send(("accepted", qpn))
        elif kind == "write":
            _, key, qpn, dest_qp, forward, probes, cfg, cc, ev_min_active, start_psn, mr, size, imm = msg
            data = os.urandom(size)
            digest = hashlib.sha256(data).hexdigest()  # before the clock starts: hashing is not the transfer
            requester = Requester(packed, qpn, dest_qp, forward, probes, cfg, make_cc(cc, cfg.mtu),
                                  start_psn=start_psn, ev_min_active=ev_min_active)
            now = time.monotonic_ns()
            requester.post_write(data, mr["va"], mr["rkey"], imm, now=now)
            jobs[key] = _Job(key, requester, size, digest, now)
            mux.add(qpn, requester)
            conn.send(("started", (key, now)))
        elif kind == "hash":
            _, key = msg
            conn.send(("hash", (key, hashlib.sha256(regions[key].buffer).hexdigest())))
        elif kind == "stop":
            state["stop"] = True

    def tick(now: int) -> None:
        for job in jobs.values():
            if job.end_ns is None:
                job.timeline.append((now - job.start_ns, job.requester.bytes_acked))
                if len(job.timeline) % EV_TIMELINE_EVERY == 1:
                    evs = job.requester.profile.evs.values()
                    job.ev_timeline.append((now - job.start_ns, [e.packets_sent for e in evs],
                                            [e.packets_delivered for e in evs]))
                if job.requester.done:
                    job.end_ns = now
        while conn.poll():
            handle(conn.recv())
        if now >= state["next_report"] and jobs:
            state["next_report"] = now + REPORT_NS
            conn.send(("progress", {k: (j.requester.bytes_acked, j.end_ns is not None, j.requester.error,
                                        {e: s.state.value for e, s in j.requester.profile.evs.items()})
                                    for k, j in jobs.items()}))

    run_socket(mux, SocketLink(raw, recv), lambda: state["stop"], tick=tick, tick_ns=TIMELINE_TICK_NS)
    after = _kernel_udp_counters()
    summaries = {}
    for key, job in jobs.items():
        r = job.requester
        done_ns = r.completions[-1].time_ns if r.completions and r.error is None else None
        per_ev = []
        share = r.profile.share()
        for ev, stats in r.profile.evs.items():
            per_ev.append({**stats.to_dict(), "share": round(share[ev], 4), "bytes_in_flight": r.ev_bytes_in_flight(ev)})
        summaries[key] = {
            "error": r.error, "start_ns": job.start_ns, "end_ns": job.end_ns or time.monotonic_ns(),
            "completed_ns": done_ns, "sha256_source": job.sha256_source, "stats": r.summary(), "drops": r.drops,
            "per_ev": per_ev, "ev_events": [e.to_dict(job.start_ns) for e in r.ev_events],
            "timeline": job.timeline, "ev_timeline": job.ev_timeline, "cc": r.cc.name,
        }
    conn.send(("final", {
        "requesters": summaries,
        "responder": {"stats": responder.stats, "drops": responder.drops,
                      "kernel_udp": {k: after.get(k, 0) - counters_before.get(k, 0) for k in after},
                      "unknown_qp": mux.unknown_qp,
                      "imm_completions": [{"psn": c.psn, "imm": c.imm, "time_ns": c.time_ns}
                                          for c in responder.completions]},
    }))


class HostProcess:
    """The parent's handle on one host's process."""

    def __init__(self, fabric: Fabric, host: str, address: str, config: QpConfig, cpu: int | None = None) -> None:
        self.fabric, self.host = fabric, host
        ctx = multiprocessing.get_context("fork")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_host_main, name=f"mrc-emu {host}", daemon=True,
                                args=(child, str(fabric.node_path(host)), address, config, cpu))
        self.proc.start()
        fabric.journal.process(self.proc.pid, f"MRC endpoint process of {host}")
        self.inbox: list[tuple] = []
        kind, info = self.expect({"ready", "error"}, timeout=30)
        if kind == "error":
            self.close()
            raise TransferError(f"the process of {host} failed to start: {info}")

    def expect(self, kinds: set[str], timeout: float = 30.0) -> tuple:
        """The next message of one of `kinds` (others are kept in the inbox)."""
        for i, msg in enumerate(self.inbox):
            if msg[0] in kinds:
                return self.inbox.pop(i)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self.conn.poll(left):
                raise TransferError(f"the process of {self.host} did not answer ({'/'.join(sorted(kinds))})")
            msg = self.conn.recv()
            if msg[0] in kinds:
                return msg
            self.inbox.append(msg)

    def close(self) -> None:
        stop_child(self.fabric, self.proc, self.conn, ("stop",))


_qpns = itertools.count(0x100)


def run_transfers(fabric: Fabric, specs: list[TransferSpec], control: Control | None = None,
                  on_progress: Callable[[int, int], None] | None = None, linger_s: float = 0.0,
                  timeout_s: float = 600.0) -> list[TransferResult]:
    """Run every WRITE of `specs` at once; return one result per spec, in order.

    `linger_s`: after the WRITEs complete, keep the QPs alive (probing ASSUMED_BAD EVs) until
    every EV not DENIED is GOOD again, or this many seconds pass.
    """
    for spec in specs:
        if spec.size <= 0:
            raise TransferError(f"size must be at least one byte, not {spec.size}")
    control = control or Control()
    topo = fabric.topology
    # a UDP EV is whatever path the fabric's ECMP hash picks: no EV states, no probes (the
    # caller's specs stay as they were)
    specs = [replace(s, config=replace(s.config, path_avoidance=False)) if s.ev_format is EvFormat.UDP else s
             for s in specs]
    plans = [qp_paths(topo, spec.src, spec.dst, spec.ev_format, spec.evs) for spec in specs]
    names = sorted({h for s in specs for h in (s.src, s.dst)})
    addresses = {p.src_address: s.src for s, p in zip(specs, plans)} | {p.dst_address: s.dst for s, p in zip(specs, plans)}
    address_of = {host: a for a, host in addresses.items()}
    hosts: dict[str, HostProcess] = {}
    try:
        cpus = sorted(os.sched_getaffinity(0))
        pin = len(names) <= len(cpus)  # one core per host process when there are enough
        for i, host in enumerate(names):
            hosts[host] = HostProcess(fabric, host, address_of[host], specs[0].config, cpus[i] if pin else None)
        started: dict[int, int] = {}
        deferred: list[tuple[float, HostProcess, tuple]] = []
        if all(s.start_at is not None for s in specs):
            raise TransferError("at least one transfer must start at once")
        for key, (spec, paths) in enumerate(zip(specs, plans)):
            qpn_req, qpn_resp = next(_qpns) << 8 | os.getpid() & 0xFF, next(_qpns) << 8 | os.getpid() & 0xFF
            start_psn = int.from_bytes(os.urandom(3), "big")
            dst, src = hosts[spec.dst], hosts[spec.src]
            dst.conn.send(("register", key, spec.size))
            _, (_, mr) = dst.expect({"registered"})
            dst.conn.send(("accept", qpn_resp, qpn_req, start_psn, paths.back, paths.src_address, key))
            dst.expect({"accepted"})
            write = ("write", key, qpn_req, qpn_resp, paths.forward, paths.probes, spec.config, spec.cc,
                     spec.ev_min_active, start_psn, mr, spec.size, spec.imm)
            if spec.start_at is None:
                src.conn.send(write)
                _, (_, started[key]) = src.expect({"started"})
            else:
                deferred.append((spec.start_at, src, write))
        control.started_ns = min(started.values())
        deferred.sort(key=lambda d: d[0])
        _watch(hosts, specs, control, on_progress, linger_s, timeout_s, deferred)
        finals: dict[str, dict] = {}
        placed = {}
        for key, spec in enumerate(specs):
            hosts[spec.dst].conn.send(("hash", key))
            _, (_, placed[key]) = hosts[spec.dst].expect({"hash"})
        for host in hosts.values():
            host.conn.send(("stop",))
        for host_name, host in hosts.items():
            _, finals[host_name] = host.expect({"final"}, timeout=60)
    finally:
        for host in hosts.values():
            host.close()
        control.finished.set()
    return [_result(spec, plans[key], finals[spec.src]["requesters"][key], finals[spec.dst]["responder"],
                    placed[key]) for key, spec in enumerate(specs)]


def _watch(hosts, specs, control, on_progress, linger_s, timeout_s, deferred) -> None:
    """Follow the hosts' progress reports until every transfer is done (and lingering ended)."""
    primary = {k for k, s in enumerate(specs) if s.start_at is None}
    total = sum(s.size for k, s in enumerate(specs) if k in primary)
    latest: dict[int, tuple] = {}
    deadline = time.monotonic() + timeout_s
    done_at = None
    last_bar = 0.0
    conns = {h.conn: h for h in hosts.values()}
    while not control.stop.is_set():
        for conn in multiprocessing.connection.wait(list(conns), timeout=0.05):
            try:
                msg = conn.recv()
            except EOFError:
                raise TransferError(f"the process of {conns[conn].host} died") from None
            if msg[0] == "progress":
                latest.update(msg[1])
            else:
                conns[conn].inbox.append(msg)
        acked = sum(v[0] for k, v in latest.items() if k in primary)
        control.bytes_acked = acked
        control.progress = acked / total
        primaries_done = all(k in latest and latest[k][1] for k in primary)
        while deferred and (control.progress >= deferred[0][0] or primaries_done):
            _, host, write = deferred.pop(0)
            host.conn.send(write)  # its "started" answer waits in the inbox
        if 0 in latest:
            control.ev_states = latest[0][3]
        while control.hooks and control.progress >= control.hooks[0][0]:
            _, action = control.hooks.pop(0)
            action()
        now = time.monotonic()
        if on_progress is not None and now - last_bar > 0.1:
            last_bar = now
            on_progress(acked, total)
        all_done = not deferred and len(latest) == len(specs) and all(v[1] for v in latest.values())
        if all_done and done_at is None:
            done_at = now
            if on_progress is not None:
                on_progress(acked, total)
        if done_at is not None:
            healed = all(state != EvState.ASSUMED_BAD.value for v in latest.values() for state in v[3].values())
            if healed or now - done_at >= linger_s:
                break
        if now > deadline:
            raise TransferError(f"the transfers did not finish within {timeout_s:.0f} s")


def _result(spec: TransferSpec, paths, req: dict, resp: dict, placed: str) -> TransferResult:
    ok = req["error"] is None and req["completed_ns"] is not None
    elapsed = req["completed_ns"] - req["start_ns"] if ok else None
    packets = -(-spec.size // spec.config.mtu)
    per_ev = []
    for entry in req["per_ev"]:
        ev = next(e for e in paths.evs if e.index == entry["ev"])
        per_ev.append({**entry, "plane": ev.plane, "spine": ev.spine, "first_hop": paths.forward[ev.index].first_hop})
    return TransferResult(
        ok=ok, error=req["error"] or (None if ok else "the transfer was stopped before it completed"),
        src=spec.src, dst=spec.dst, size=spec.size, mtu=spec.config.mtu, ev_format=spec.ev_format.value, cc=req["cc"],
        evs=sorted(paths.forward), start_ns=req["start_ns"], end_ns=req["end_ns"],
        completion_ms=round(elapsed / 1e6, 3) if elapsed else None,
        goodput_gbps=round(spec.size * 8 / elapsed, 3) if elapsed else None,
        goodput_pps=round(packets / (elapsed / 1e9)) if elapsed else None,
        sha256_source=req["sha256_source"], sha256_placed=placed,
        requester={"stats": req["stats"], "drops": req["drops"]},
        responder={k: v for k, v in resp.items() if k != "imm_completions"},
        per_ev=per_ev, ev_events=req["ev_events"], timeline=req["timeline"],
        imm_completions=resp["imm_completions"], label=spec.label, ev_timeline=req["ev_timeline"],
    )


def send(fabric: Fabric, src: str, dst: str, size: int, evs: list[int] | None = None, cc: str = "nscc",
         mtu: int = 4096, ev_format: EvFormat = EvFormat.SRV6, ev_min_active: int = 1,
         imm: int | None = None, config: QpConfig | None = None, control: Control | None = None,
         on_progress: Callable[[int, int], None] | None = None, linger_s: float = 0.0) -> TransferResult:
    """WRITE `size` random bytes from host `src` to a buffer registered at host `dst`."""
    spec = TransferSpec(src, dst, size, evs, ev_format, config or QpConfig(mtu=mtu), cc, ev_min_active, imm)
    return run_transfers(fabric, [spec], control, on_progress, linger_s)[0]



