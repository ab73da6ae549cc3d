"""MRC transfers on a running fabric: any number of WRITEs at once, on a pool of workers.

Why it exists: `mrc-emu send`, the system tests, the benchmarks and the scenarios all run
WRITEs between hosts and want the same results back (goodput, per-EV share, EV events, the
SHA-256 of both buffers) and to know whether the run was faithful. This module is the
parent's side: it plans each QP's paths from the topology (or from an OCP EV profile,
evpaths.py), starts a fixed pool of endpoint
workers (worker.py, through fabric/procs.py: journaled, dying with the parent, stopped in
order; default one per CPU) and spreads the hosts over them, sets each QP up out of band
(the destination accepts it, the source prepares its bytes; when every WRITE is prepared
they all start together), follows their progress reports (running fault hooks and
progress bars), collects the results and the emulation report (emulation.py).
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from ...api.files import ProfileFile
from ...fabric import build
from ...fabric.faults import fault_ops
from ...fabric.kernel.waiting import WaitTimeout, until
from ...fabric.live import LiveBoard
from ...fabric.procs import Child, ChildError, Stop
from ...fabric.running import Fabric
from ...io.clock import Clock, Horizon
from ...topology import Topology
from ...topology import addressing as ad
from ...topology.evs import EvFormat
from ...transport.config import QpConfig
from ..analysis import emulation
from . import base_rtt as idle_loop
from .base_rtt import BaseRtt
from .controller import ControlRecord, LiveControl, post_run_events, qp_evs
from .endpoint_ops import EndpointOps, EpBatch
from .spec import TransferError, TransferResult, TransferSpec, cc_options, plan_paths, plan_values, prepared_specs, result_of
from .stev import check_fabric
from .worker import Accept, Accepted, Final, Hash, Hashed, HostSpec, JobProgress, Prepare, Prepared, Progress, Start, Started, serve_hosts


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
    # EV_PROBE batches and port status on the run's hosts, from any thread (endpoint_ops.py)
    endpoint: EndpointOps = field(default_factory=EndpointOps)


_qpns = itertools.count(0x100)


def default_workers() -> int:
    """One endpoint worker per CPU this process may run on."""
    return len(os.sched_getaffinity(0))


class _Pool:
    """The endpoint workers of one run, and which serves which host."""

    def __init__(self, fabric: Fabric, hosts: dict[str, str], workers: int, dilation: float) -> None:
        cpus = sorted(os.sched_getaffinity(0))
        names = sorted(hosts, key=_host_order)
        count = max(1, min(workers, len(names)))
        self.horizon = Horizon(count)
        self.clock = Clock(dilation)  # the run's transport clock: every worker keeps it from the same origin
        self.workers: list[Child] = []
        self.of: dict[str, Child] = {}
        shares: list[list[HostSpec]] = [[] for _ in range(count)]
        for i, host in enumerate(names):  # round robin: neighbours of a ring land on different workers
            shares[i % count].append(HostSpec(host, str(fabric.node_path(host)), hosts[host], host_ports(fabric.topology, host)))
        try:
            for index, share in enumerate(shares):
                child = Child(fabric, f"MRC endpoint worker {index} ({len(share)} hosts)", serve_hosts,
                              (index, share, self.horizon, dilation, self.clock.origin),
                              cpu=cpus[index] if count <= len(cpus) else None, ready_timeout=60.0)
                self.workers.append(child)
                self.of.update({h.name: child for h in share})
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()
        self.horizon.close()


def host_ports(topo: Topology, host: str) -> dict[str, int]:
    """A host's interfaces and their 1-based ports: its link to the leaf of plane p is port p + 1."""
    ports = {}
    for plane in range(topo.planes):
        (link,) = topo.links_between(host, topo.leaf_of(host, plane))
        ports[topo.peer(link, host)[1]] = plane + 1
    return ports


def _host_order(name: str) -> tuple:
    digits = "".join(c for c in name if c.isdigit())
    return (name.rstrip("0123456789"), int(digits) if digits else -1, name)


def run_transfers(fabric: Fabric, specs: list[TransferSpec], control: Control | None = None,
                  on_progress: Callable[[int, int], None] | None = None, linger_s: float = 0.0,
                  timeout_s: float = 600.0, workers: int | None = None, dilation: float = 1.0,
                  on_prepare: Callable[[int, int], None] | None = None) -> Run:
    """Run every WRITE of `specs` at once on a pool of `workers` endpoint processes (default:
    one per CPU); return one result per spec, in order, and the run's emulation report.

    `linger_s`: after the WRITEs complete, keep the QPs alive (probing ASSUMED_BAD EVs) until
    every EV not DENIED is GOOD again, or this many seconds pass. `dilation`: time dilation K
    (the transport's clock runs K times slower than wall time). `on_prepare(done, total)`
    follows the making of the source bytes, before any WRITE starts.
    """
    if workers is not None and workers < 1:
        raise TransferError(f"--workers {workers}: at least one worker")
    control = control or Control()
    began = time.time()  # an EV_PROBE asked of the run from then on is its to send (controller.py)
    specs = prepared_specs(specs)
    if any(s.ev_format is EvFormat.STEV for s in specs):
        check_fabric(fabric)
    plans = [plan_paths(fabric.topology, spec) for spec in specs]
    measured: BaseRtt | None = None
    address_of = {s.src: p.src_address for s, p in zip(specs, plans)} | {s.dst: p.dst_address for s, p in zip(specs, plans)}
    kernel_before = emulation.softnet()
    shaped = _shape_for_dilation(fabric, dilation)
    try:
        pool = _Pool(fabric, address_of, workers or default_workers(), dilation)
    except BaseException:
        _shape_for_dilation(fabric, 1.0, shaped)
        raise
    try:
        # NSCC QPs told no base RTT get the fabric's idle loop, measured now, before any QP exists
        specs, measured = idle_loop.for_specs(fabric.topology, specs, plans, control.endpoint, pool.of, address_of)
        deferred: list[tuple[float, Child, int]] = []
        for key, (spec, paths) in enumerate(zip(specs, plans)):
            qpn_req, qpn_resp = next(_qpns) << 8 | os.getpid() & 0xFF, next(_qpns) << 8 | os.getpid() & 0xFF
            start_psn = int.from_bytes(os.urandom(3), "big")
            dst, src = pool.of[spec.dst], pool.of[spec.src]
            recvs = spec.recvs if spec.recvs is not None else int(spec.imm is not None)
            values = plan_values(fabric.topology, spec)
            dst.send(Accept(key, spec.dst, spec.size, qpn_resp, qpn_req, start_psn, paths.back, paths.src_address,
                            spec.config, recvs, values.mode, spec.qp_caps))
            region = _expect_key(dst, Accepted, key).region
            src.send(Prepare(key, spec.src, qpn_req, qpn_resp, paths.forward, spec.config, spec.cc,
                             spec.ev_min_active, start_psn, region, spec.size, spec.imm, values, spec.cc_config,
                             spec.ev_profile if isinstance(spec.ev_profile, ProfileFile) else None))
        for key, spec in enumerate(specs):
            _expect_key(pool.of[spec.src], Prepared, key, timeout=120.0)
            if on_prepare is not None:
                on_prepare(key + 1, len(specs))
        # the controller's record (EVs denied, ports disabled) holds from the first packet on, and
        # is followed live while the WRITEs run (UDP EVs are the fabric's hash: no controller)
        live = LiveControl(ControlRecord(fabric), {key: (spec.src, qp_evs(plans[key]))
                                                   for key, spec in enumerate(specs) if spec.ev_format is not EvFormat.UDP},
                           began)
        live.push(pool.of, control.endpoint, address_of, fabric.topology)
        now_keys: dict[Child, list[int]] = {}
        for key, spec in enumerate(specs):
            if spec.start_at is None:
                now_keys.setdefault(pool.of[spec.src], []).append(key)
            else:
                deferred.append((spec.start_at, pool.of[spec.src], key))
        for worker in pool.workers:  # every worker measures its loop from now, the sources start their WRITEs
            worker.send(Start(tuple(now_keys.get(worker, ()))))
        control.started_ns = min(s.start_ns for s in (w.expect(Started) for w in pool.workers) if s.keys)
        deferred.sort(key=lambda d: d[0])
        host_of = {a: h for h, a in address_of.items()}
        board = _LiveRun(LiveBoard(fabric), specs, plans, dilation)
        _watch(pool.workers, specs, control, on_progress, linger_s, timeout_s, deferred,
               lambda: live.push(pool.of, control.endpoint, address_of, fabric.topology),
               lambda report: live.report(report, host_of), board)
        placed = {}
        for key, spec in enumerate(specs):
            pool.of[spec.dst].send(Hash(key))
            placed[key] = _expect_key(pool.of[spec.dst], Hashed, key).sha256
        for worker in pool.workers:
            worker.send(Stop())
        finals = [worker.expect(Final, timeout=60) for worker in pool.workers]
    finally:
        pool.stop()
        _shape_for_dilation(fabric, 1.0, shaped)
        control.finished.set()
    by_host = {h: f for f in finals for h in f.hosts}
    results = [result_of(spec, plans[key], by_host[spec.src].requesters[key], by_host[spec.dst].responders[key],
                         by_host[spec.dst].kernel_udp[spec.dst], by_host[spec.dst].unknown_qp[spec.dst], placed[key],
                         idle_loop.source_of(fabric.topology, spec, measured))
               for key, spec in enumerate(specs)]
    post_run_events(live.record, finals, host_of)
    report = emulation.assess(finals, results, kernel_before, emulation.softnet(), dilation)
    return Run(results, report, pool.clock, finals, measured)


class EndpointBusy(TransferError):
    """A host's MRC endpoint is served by a running transfer's workers already (its port 4791 is taken)."""


def probe(fabric: Fabric, src: str, dst: str, requests: list[tuple], rsp_timeout_ns: int) -> EpBatch:
    """One EV_PROBE batch from `src` to `dst` between no transfers: an endpoint worker serves both hosts
    for as long as it takes (requests as EndpointOps.ev_probe takes them); the batch, answered or timed
    out. A host serving a running transfer cannot be served twice (its port 4791 is taken): EndpointBusy."""
    topo = fabric.topology
    address_of = {host: ad.host_address(topo, host) for host in (src, dst)}
    try:
        pool = _Pool(fabric, address_of, 1, 1.0)
    except ChildError as exc:
        raise EndpointBusy(f"no endpoint could serve {src} and {dst} here ({exc}): a transfer runs on them") from None
    try:
        ops = EndpointOps()
        batch = ops.ev_probe(src, requests, rsp_timeout_ns)

        def answered() -> bool:
            ops.step(pool.of, address_of, topo)
            return batch.done.is_set()

        until(answered, 30.0 + rsp_timeout_ns / 1e9, f"{src}'s EV probes", interval=0.001, wake=pool.workers)
    finally:
        pool.stop()
    return batch


class Run(list):
    """The results of a run, in the order of its specs (a list), with its emulation report, the
    workers' Final reports, the run's transport clock and the base RTT it measured for NSCC
    (None: no QP needed one)."""

    def __init__(self, results: list[TransferResult], report: emulation.Report, clock: Clock,
                 finals: list[Final], base_rtt: BaseRtt | None = None) -> None:
        super().__init__(results)
        self.emulation = report
        self.clock = clock
        self.finals = finals
        self.base_rtt = base_rtt

    def transport_time(self, monotonic_ns: int) -> int:
        """A CLOCK_MONOTONIC time (a fault agent's) on the transport's clock of this run."""
        return self.clock.from_monotonic(monotonic_ns)


def _shape_for_dilation(fabric: Fabric, dilation: float, undo: bool = False) -> bool:
    """Under time dilation K a shaped fabric runs its links at rate / K (DieCast); `undo` puts the
    topology's rate back. Returns whether anything was shaped."""
    rate = fabric.topology.link_rate_bps
    if not rate or (dilation == 1.0 and not undo):
        return False
    build.shape_every_node(fabric, rate / dilation)
    for node, intf, fraction in fault_ops.degraded_ports(fabric):  # a degrade in force stays degraded
        build.shape_port(fabric, node, intf, rate * fraction / dilation)
    return True


def _expect_key(worker: Child, kind: type, key: int, timeout: float = 30.0):
    """The answer of `kind` about transfer `key` (answers about other transfers are kept)."""
    return worker.expect(kind, timeout, where=lambda message: message.key == key)


def _watch(workers: list[Child], specs: list[TransferSpec], control: Control,
           on_progress: Callable[[int, int], None] | None, linger_s: float, timeout_s: float,
           deferred: list[tuple[float, Child, int]], on_step: Callable[[], None],
           on_report: Callable[[Progress], None] | None, board: _LiveRun) -> None:
    """Follow the workers' progress reports until every transfer is done (and lingering ended);
    `on_step` runs at every step (after the hooks: the controller's changes and endpoint
    operations go out at once), `on_report` with each progress report (its EV events); what
    they report goes on the fabric's live board as it comes."""
    watch = _Watch(workers, specs, control, on_progress, linger_s, deferred, on_step, on_report)
    try:
        until(lambda: board.step(watch, watch.step()), timeout_s, "the transfers to finish", interval=0.05,
              wake=list(workers))
    except WaitTimeout:
        board.step(watch, True, "timed out")
        raise TransferError(f"the transfers did not finish within {timeout_s:.0f} s") from None


class _LiveRun:
    """This run on the fabric's live board (fabric/live.py; docs/view.md has the schema): every
    transfer's bytes acknowledged and, for the first LIVE_JOBS, each EV's state and packets sent
    and the EV events so far; replaced at most every PUBLISH_S and once more when the run ends."""

    PUBLISH_S = 0.1

    def __init__(self, board: LiveBoard, specs: list[TransferSpec], plans: list, dilation: float) -> None:
        self.board: LiveBoard | None = board
        self.specs, self.dilation = specs, dilation
        self.evs = [{index: {"plane": ev.plane, "spine": ev.spine} for index, ev in qp_evs(plan).items()} for plan in plans]
        self.events: dict[int, list[dict]] = {}
        self.started_unix = time.time()
        self.last = 0.0
        self.command = " ".join(os.path.basename(arg) if i == 0 else arg for i, arg in enumerate(sys.argv))[:200]

    def step(self, watch: _Watch, over: bool, error: str | None = None) -> bool:
        latest = watch.latest
        for key, events in watch.ev_events.items():  # each report's new events, taken once
            self.events.setdefault(key, []).extend(events)
        watch.ev_events.clear()
        now = time.monotonic()
        if self.board is not None and (over or now - self.last >= self.PUBLISH_S):
            self.last = now
            try:
                self.board.publish({"schema": "mrc-emu/live-run/1", "command": self.command, "started_unix":
                                    round(self.started_unix, 3), "finished": over, "error": error,
                                    "time_dilation": self.dilation,
                                    "transfers": [self._transfer(key, latest.get(key)) for key in range(len(self.specs))]})
            except OSError:
                self.board = None  # a board that cannot be written (/run full, say) never stops the transfers
        return over

    def _transfer(self, key: int, job: JobProgress | None) -> dict:
        spec = self.specs[key]
        out = {"key": key, "src": spec.src, "dst": spec.dst, "size": spec.size, "label": spec.label,
               "started": job is not None, "bytes_acked": job.bytes_acked if job else 0,
               "done": bool(job and job.done), "error": job.error if job else None}
        if job is not None and job.ev_states is not None:
            out["evs"] = [{"ev": ev, **self.evs[key].get(ev, {}), "state": state, "sent": (job.ev_sent or {}).get(ev, 0)}
                          for ev, state in sorted(job.ev_states.items())]
            out["ev_events"] = self.events.get(key, [])
        return out


class _Watch:
    """What the parent follows while transfers run; `step` takes what arrived and says if it is over."""

    def __init__(self, workers: list[Child], specs: list[TransferSpec], control: Control,
                 on_progress: Callable[[int, int], None] | None, linger_s: float,
                 deferred: list[tuple[float, Child, int]], on_step: Callable[[], None],
                 on_report: Callable[[Progress], None] | None = None) -> None:
        self.workers, self.specs, self.control, self.on_progress = workers, specs, control, on_progress
        self.on_step, self.on_report = on_step, on_report
        self.linger_s, self.deferred = linger_s, deferred
        self.primary = {k for k, s in enumerate(specs) if s.start_at is None}
        self.total = sum(s.size for k, s in enumerate(specs) if k in self.primary)
        self.latest: dict[int, JobProgress] = {}
        self.ev_events: dict[int, list[dict]] = {}  # by transfer key: the EV events reported since the board took them
        self.done_at: float | None = None
        self.last_bar = 0.0

    def step(self) -> bool:
        control, latest, deferred = self.control, self.latest, self.deferred
        if control.stop.is_set():
            return True
        for worker in self.workers:
            while (report := worker.poll(Progress)) is not None:  # other answers wait for their expect
                latest.update(report.jobs)
                for key, job in report.jobs.items():
                    if job.ev_events:
                        self.ev_events.setdefault(key, []).extend(job.ev_events)
                if self.on_report is not None:
                    self.on_report(report)
        acked = sum(v.bytes_acked for k, v in latest.items() if k in self.primary)
        control.bytes_acked = acked
        control.progress = acked / self.total
        primaries_done = all(k in latest and latest[k].done for k in self.primary)
        while deferred and (control.progress >= deferred[0][0] or primaries_done):
            _, worker, key = deferred.pop(0)
            worker.send(Start((key,)))  # its Started answer waits, unread
        if 0 in latest:
            control.ev_states = latest[0].ev_states
        while control.hooks and control.progress >= control.hooks[0][0]:
            _, action = control.hooks.pop(0)
            action()
        self.on_step()
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
        healed = not any(v.assumed_bad for v in latest.values())
        return healed or now - self.done_at >= self.linger_s


def send(fabric: Fabric, src: str, dst: str, size: int, evs: list[int] | None = None, cc: str = "nscc",
         mtu: int = 4096, ev_format: EvFormat = EvFormat.SRV6, ev_min_active: int = 1,
         imm: int | None = None, config: QpConfig | None = None, control: Control | None = None,
         on_progress: Callable[[int, int], None] | None = None, linger_s: float = 0.0,
         workers: int | None = None, dilation: float = 1.0, recvs: int | None = None,
         ev_profile: ProfileFile | str | None = None, cc_config: dict | None = None,
         qp_caps: int = 0) -> TransferResult:
    """WRITE `size` random bytes from host `src` to a buffer registered at host `dst` (over the EVs of
    `ev_profile` if given: an SRV6 GEN/EXP profile, loaded or its file, see evpaths.py). Without a
    `config`, the QP learns the fabric's link rate and base RTT (its CC's BDP) from the topology
    (NSCC: its `base_rtt` if it gives one, else the idle loop measured before the WRITE), and a
    DCQCN QP's responder answers CE marks with CNPs. `cc_config`: its CC profile's config (NSCC's or
    DCQCN's fields by name), which its CC is made with; `qp_caps`: the destination QP's api.QpCap bits."""
    if config is None:
        topo = fabric.topology
        base_rtt = topo.ports.base_rtt_ns if cc != "nscc" or topo.ports.base_rtt_given else None
        nic = topo.nic_rate_bps if evs is None or len(evs) > 1 else None  # sprayed: its NIC's rate
        config = QpConfig(mtu=mtu, link_rate_bps=topo.link_rate_bps, nic_rate_bps=nic, base_rtt_ns=base_rtt,
                          cnp=cc == "dcqcn")
        config = replace(config, cc_options=cc_options(cc, config.cc_rate_bps, base_rtt, config.link_rate_bps))
    spec = TransferSpec(src, dst, size, evs, ev_format, config, cc, ev_min_active, imm, recvs=recvs,
                        ev_profile=ev_profile, cc_config=cc_config, qp_caps=qp_caps)
    run = run_transfers(fabric, [spec], control, on_progress, linger_s, workers=workers, dilation=dilation)
    result = run[0]
    result.emulation = run.emulation.to_dict()
    if run.base_rtt is not None and result.base_rtt["source"] == run.base_rtt.source:
        result.base_rtt = run.base_rtt.to_dict()  # measured for it: how
    return result
