"""MRC transfers on a running fabric: any number of WRITEs at once, one process per host.

Why it exists: `mrc-emu send`, the system tests, the benchmarks and the scenarios all run
WRITEs between hosts and want the same results back (goodput, per-EV share, EV events, the
SHA-256 of both buffers). This module is the parent's side: it plans each QP's paths from
the topology, starts one endpoint process per host taking part (host.py, through
fabric/procs.py: journaled, dying with the parent, stopped in order), sets each QP up out
of band (the destination accepts it, then the source posts the WRITE), follows their
progress reports (running fault hooks and progress bars) and collects the results.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ..fabric.procs import Child, Stop
from ..fabric.running import Fabric
from ..fabric.waiting import WaitTimeout, until
from ..topology.evs import EvFormat
from ..transport.config import QpConfig
from ..transport.ev import EvState
from ..transport.paths import QpPaths, qp_paths
from .host import Accept, Accepted, Final, Hash, Hashed, JobProgress, Progress, Started, Write, serve_host


class TransferError(RuntimeError):
    """A transfer could not be set up or run (bad arguments, no progress in time)."""


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
    if all(s.start_at is not None for s in specs):
        raise TransferError("at least one transfer must start at once")
    control = control or Control()
    # a UDP EV is whatever path the fabric's ECMP hash picks: no EV states, no probes (the
    # caller's specs stay as they were)
    specs = [replace(s, config=replace(s.config, path_avoidance=False)) if s.ev_format is EvFormat.UDP else s
             for s in specs]
    plans = [qp_paths(fabric.topology, spec.src, spec.dst, spec.ev_format, spec.evs) for spec in specs]
    address_of = {s.src: p.src_address for s, p in zip(specs, plans)} | {s.dst: p.dst_address for s, p in zip(specs, plans)}
    hosts: dict[str, Child] = {}
    try:
        cpus = sorted(os.sched_getaffinity(0))
        pin = len(address_of) <= len(cpus)  # one core per host process when there are enough
        for i, host in enumerate(sorted(address_of)):
            hosts[host] = Child(fabric, f"MRC endpoint process of {host}", serve_host,
                                (str(fabric.node_path(host)), address_of[host]), cpu=cpus[i] if pin else None)
        started: dict[int, int] = {}
        deferred: list[tuple[float, Child, Write]] = []
        for key, (spec, paths) in enumerate(zip(specs, plans)):
            qpn_req, qpn_resp = next(_qpns) << 8 | os.getpid() & 0xFF, next(_qpns) << 8 | os.getpid() & 0xFF
            start_psn = int.from_bytes(os.urandom(3), "big")
            dst, src = hosts[spec.dst], hosts[spec.src]
            dst.send(Accept(key, spec.size, qpn_resp, qpn_req, start_psn, paths.back, paths.src_address, spec.config))
            region = dst.expect(Accepted).region
            write = Write(key, qpn_req, qpn_resp, paths.forward, paths.probes, spec.config, spec.cc,
                          spec.ev_min_active, start_psn, region, spec.size, spec.imm)
            if spec.start_at is None:
                src.send(write)
                started[key] = src.expect(Started).start_ns
            else:
                deferred.append((spec.start_at, src, write))
        control.started_ns = min(started.values())
        deferred.sort(key=lambda d: d[0])
        _watch(hosts, specs, control, on_progress, linger_s, timeout_s, deferred)
        placed = {}
        for key, spec in enumerate(specs):
            hosts[spec.dst].send(Hash(key))
            placed[key] = hosts[spec.dst].expect(Hashed).sha256
        for host in hosts.values():
            host.send(Stop())
        finals = {host_name: host.expect(Final, timeout=60) for host_name, host in hosts.items()}
    finally:
        for host in hosts.values():
            host.stop()
        control.finished.set()
    return [_result(spec, plans[key], finals[spec.src].requesters[key], finals[spec.dst], key, placed[key])
            for key, spec in enumerate(specs)]


def _watch(hosts: dict[str, Child], specs: list[TransferSpec], control: Control,
           on_progress: Callable[[int, int], None] | None, linger_s: float, timeout_s: float,
           deferred: list[tuple[float, Child, Write]]) -> None:
    """Follow the hosts' progress reports until every transfer is done (and lingering ended)."""
    watch = _Watch(hosts, specs, control, on_progress, linger_s, deferred)
    try:
        until(watch.step, timeout_s, "the transfers to finish", interval=0.05, wake=list(hosts.values()))
    except WaitTimeout:
        raise TransferError(f"the transfers did not finish within {timeout_s:.0f} s") from None


class _Watch:
    """What the parent follows while transfers run; `step` takes what arrived and says if it is over."""

    def __init__(self, hosts: dict[str, Child], specs: list[TransferSpec], control: Control,
                 on_progress: Callable[[int, int], None] | None, linger_s: float,
                 deferred: list[tuple[float, Child, Write]]) -> None:
        self.hosts, self.specs, self.control, self.on_progress = hosts, specs, control, on_progress
        self.linger_s, self.deferred = linger_s, deferred
        self.primary = {k for k, s in enumerate(specs) if s.start_at is None}
        self.total = sum(s.size for k, s in enumerate(specs) if k in self.primary)
        self.latest: dict[int, JobProgress] = {}
        self.done_at: float | None = None
        self.last_bar = 0.0

    def step(self) -> bool:
        control, latest, deferred = self.control, self.latest, self.deferred
        if control.stop.is_set():
            return True
        for host in self.hosts.values():
            while (report := host.poll(Progress)) is not None:  # other answers wait for their expect
                latest.update(report.jobs)
        acked = sum(v.bytes_acked for k, v in latest.items() if k in self.primary)
        control.bytes_acked = acked
        control.progress = acked / self.total
        primaries_done = all(k in latest and latest[k].done for k in self.primary)
        while deferred and (control.progress >= deferred[0][0] or primaries_done):
            _, host, write = deferred.pop(0)
            host.send(write)  # its Started answer waits, unread
        if 0 in latest:
            control.ev_states = latest[0].ev_states
        while control.hooks and control.progress >= control.hooks[0][0]:
            _, action = control.hooks.pop(0)
            action()
        now = time.monotonic()
        if self.on_progress is not None and now - self.last_bar > 0.1:
            self.last_bar = now
            self.on_progress(acked, self.total)
        all_done = not deferred and len(latest) == len(self.specs) and all(v.done for v in latest.values())
        if all_done and self.done_at is None:
            self.done_at = now
            if self.on_progress is not None:
                self.on_progress(acked, self.total)
        if self.done_at is None:
            return False
        healed = all(state != EvState.ASSUMED_BAD.value for v in latest.values() for state in v.ev_states.values())
        return healed or now - self.done_at >= self.linger_s


def _result(spec: TransferSpec, paths: QpPaths, req: dict, dst: Final, key: int, placed: str) -> TransferResult:
    ok = req["error"] is None and req["completed_ns"] is not None
    elapsed = req["completed_ns"] - req["start_ns"] if ok else None
    packets = -(-spec.size // spec.config.mtu)
    per_ev = []
    for entry in req["per_ev"]:
        ev = next(e for e in paths.evs if e.index == entry["ev"])
        per_ev.append({**entry, "plane": ev.plane, "spine": ev.spine, "first_hop": paths.forward[ev.index].first_hop})
    resp = dst.responders[key]
    return TransferResult(
        ok=ok, error=req["error"] or (None if ok else "the transfer was stopped before it completed"),
        src=spec.src, dst=spec.dst, size=spec.size, mtu=spec.config.mtu, ev_format=spec.ev_format.value, cc=req["cc"],
        evs=sorted(paths.forward), start_ns=req["start_ns"], end_ns=req["end_ns"],
        completion_ms=round(elapsed / 1e6, 3) if elapsed else None,
        goodput_gbps=round(spec.size * 8 / elapsed, 3) if elapsed else None,
        goodput_pps=round(packets / (elapsed / 1e9)) if elapsed else None,
        sha256_source=req["sha256_source"], sha256_placed=placed,
        requester={"stats": req["stats"], "drops": req["drops"]},
        responder={"stats": resp["stats"], "drops": resp["drops"], "kernel_udp": dst.kernel_udp,
                   "unknown_qp": dst.unknown_qp},
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
