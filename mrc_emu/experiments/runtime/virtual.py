"""MRC transfers in virtual time: the WRITEs of transfer.py, on the virtual fabric, without root.

Why it exists: `mrc-emu send --clock virtual` and `run --clock virtual` run the same transfers
as on the namespace fabric, with the same pieces: a TransferSpec checked and planned as there
(spec.py), each host's OCP controller and MRC endpoint, the QPs built, posted, sampled and
reported by qps.py, the results made by spec.result_of; only the driver differs: the event
engine and the model of the topology (mrc_emu.vfabric) instead of workers and sockets. Every
random choice comes from the seed, each consumer its own stream (`Random(f"{seed}:<use>")`; the
source bytes are SHAKE-128's of the seed and the transfer): the transport's (start PSNs, R_Keys,
probe ids), the fabric's (loss, ECN marks), the ECMP salt; so one seed gives one run, to the
byte and the nanosecond. A QP's CC is given the model's link rate and unloaded RTT where its
config leaves them open. The run's
`virtual` block says what the model was (rate, delay, whether the rate is a default), what it
counted, and, apart in `wall`, how long this machine took (the only wall clock read, here).
"""

from __future__ import annotations

import hashlib
import ipaddress
import random
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ...topology import Topology
from ...topology import addressing as ad
from ...topology.evs import EvFormat
from ...transport.config import QpConfig
from ...transport.endpoint import HostEndpoint
from ...transport.mux import HostMux
from ...transport.requester import DATA_OVERHEAD
from ...vfabric.engine import Engine
from ...vfabric.fabric import DEFAULT_LINK_DELAY_NS, DEFAULT_RATE_BPS, VirtualFabric
from ...vfabric.faults import FaultTimeline, LinkFault
from ...vfabric.hosts import HostDriver
from ...vfabric.routing import BgpRepair, RoutingTimers
from ...wire import format as fmt
from ...wire.switchport import ETH_LEN
from .hostctl import HostControl
from .qps import TIMELINE_TICK_NS, WriteJob, accept_write, prepare_write, responder_report
from .spec import TransferResult, TransferSpec, cc_options, plan_paths, prepared_specs, result_of

DEFAULT_LIMIT_NS = 60_000_000_000  # virtual time a run may take before it is given up
# an ACK on the wire beside its outer headers: inner IPv6, UDP, BTH, AETH, SACK's fixed part, ICRC
ACK_OVERHEAD = fmt.IPV6_LEN + fmt.UDP_LEN + fmt.BTH_LEN + fmt.AETH_LEN + fmt.SACK_FIXED_LEN + fmt.ICRC_LEN


class VirtualRun(list):
    """The results of a virtual run, in the order of its specs (a list), with the run's `virtual`
    block, and the live objects behind it for a closer look (`jobs`, `fabric`, `faults`). Like
    transfer.Run it has an `emulation` report (virtual time has no emulator in the loop: always
    faithful, its figures the model's) and a `base_rtt` (None: the model's RTT is computed, not
    measured), so a scenario summarises either the same way."""

    base_rtt = None

    def __init__(self, results: list[TransferResult], virtual: dict[str, Any], jobs: list[WriteJob],
                 fabric: VirtualFabric, faults: FaultTimeline) -> None:
        super().__init__(results)
        self.virtual, self.jobs, self.fabric, self.faults = virtual, jobs, fabric, faults
        self.emulation = _NoEmulator(virtual["frames_sent"], virtual["virtual_ns"])

    @staticmethod
    def transport_time(ns: int) -> int:
        """A time of the run's engine on the transports' clock: the same clock."""
        return ns


class _NoEmulator:
    """The emulation report of a virtual run, in emulation.Report's fields: nothing waited for a
    CPU or a socket, nothing was dropped by a kernel; packets/s is per second of virtual time."""

    def __init__(self, frames: int, virtual_ns: int) -> None:
        self.frames, self.virtual_ns = frames, virtual_ns

    def to_dict(self) -> dict[str, Any]:
        zero = {"p50": 0.0, "p99": 0.0, "max": 0.0}
        return {"workers": 0, "time_dilation": 1.0, "loop_lag_us": zero, "socket_wait_us": zero, "cpu_busy": [],
                "runqueue_wait": [], "packets_per_s": round(self.frames * 1e9 / self.virtual_ns) if self.virtual_ns else 0,
                "kernel_drops": {}, "timers_deferred": 0, "verdict": "faithful",
                "reasons": [], "python_receive": [], "unstamped_datagrams": 0}


class Live:
    """What a hook (a controller step at a progress) reaches while a virtual run goes on."""

    def __init__(self, engine: Engine, driver: HostDriver, jobs: list[WriteJob], muxes: dict[str, HostMux],
                 controls: dict[str, HostControl]) -> None:
        self.engine, self.driver, self.jobs, self.muxes, self.controls = engine, driver, jobs, muxes, controls

    def set_ev_states(self, key: int, deny: tuple[int, ...], allow: tuple[int, ...], reason: str) -> None:
        job = self.jobs[key]
        job.set_ev_states(deny, allow, reason, self.engine.now)
        self.driver.wake(job.requester)

    def set_port_status(self, host: str, mask: int) -> None:
        endpoint, now = self.muxes[host].endpoint, self.engine.now
        was = endpoint.status.local
        endpoint.set_port_status(mask, now)
        admin = self.controls[host].follow_ports(mask)  # the api's port admin state is the endpoint's
        self.driver.wake(endpoint)
        for job in self.jobs:
            if job.host == host:
                job.record_port_status(was, mask, now, admin)
                self.driver.wake(job.requester)


def source_bytes(seed: int, key: int, size: int) -> bytes:
    """Transfer `key`'s source bytes under `seed`: SHAKE-128's stream (2.7 times as fast as
    random.randbytes, which took 4 s of the 512 MiB a ring over huge writes)."""
    return hashlib.shake_128(f"{seed}:data:{key}".encode()).digest(size)


def _unloaded_rtt(fabric: VirtualFabric, topo: Topology, spec: TransferSpec, plan: Any) -> tuple[int, int]:
    """The model's round trip between the spec's hosts over their longest path: a full data
    packet out, its ACK back, serialised and propagated on every link; and what of it an RTT
    sample with one busy port on the path lacks (VirtualFabric.path_unseen_ns)."""
    links = 2 if topo.leaf_of(spec.src, 0) == topo.leaf_of(spec.dst, 0) else 4  # turning at the leaf, or a spine
    out = max(len(p.template.encap.outer) for p in plan.forward.values()) + DATA_OVERHEAD + spec.config.mtu
    back = max(len(p.template.encap.outer) for p in plan.back.values()) + ACK_OVERHEAD
    return (fabric.path_rtt_ns(links, out + ETH_LEN, back + ETH_LEN),
            fabric.path_unseen_ns(links, out + ETH_LEN, back + ETH_LEN))


VIRTUAL_REORDER_FLOOR_NS = 1_000


def _configured(spec: TransferSpec, fabric: VirtualFabric, rtt_ns: int, unseen_ns: int,
                emulator_guards: bool = False) -> TransferSpec:
    """The spec with the model's link rate and unloaded RTT where its config leaves them open,
    and NSCC's MaxWnd from them (spec.cc_options) where it has none; `emulator_guards`: the
    reordering guards left as the emulated workers have them (a cross-validation's QPs)."""
    rate = spec.config.link_rate_bps or fabric.rate_bps
    nic = spec.config.nic_rate_bps or (rate * fabric.topo.planes if spec.config.path_avoidance else None)
    config = replace(spec.config, link_rate_bps=rate, nic_rate_bps=nic, base_rtt_ns=spec.config.base_rtt_ns or rtt_ns)
    options = config.cc_options if config.cc_options is not None else cc_options(spec.cc, config.cc_rate_bps,
                                                                                  config.base_rtt_ns, rate, rtt_ns,
                                                                                  unseen_ns)
    # the guards against the namespace emulator's own reordering (a host's two CPUs), where the QP's
    # config leaves them at their defaults: the model reorders nothing of one path, so one witness
    # decides a path failure and the reorder window's floor is the model's 1 us link delay
    guards = {}
    if not emulator_guards and config.witnesses == QpConfig.witnesses and \
            config.reorder_floor_ns == QpConfig.reorder_floor_ns:
        guards = {"witnesses": 1, "reorder_floor_ns": VIRTUAL_REORDER_FLOOR_NS}
    return replace(spec, config=replace(config, cc_options=options, **guards))


def run_virtual(topo: Topology, specs: list[TransferSpec], seed: int = 0, faults: list[LinkFault] = (),
                link_delay_ns: int = DEFAULT_LINK_DELAY_NS, default_rate_bps: int = DEFAULT_RATE_BPS,
                limit_ns: int = DEFAULT_LIMIT_NS, on_progress: Callable[[int, int], None] | None = None,
                hooks: list[tuple[float, Callable[[Live], None]]] = (), routing: RoutingTimers | None = None,
                linger_ns: int = 0, tick_ns: int = TIMELINE_TICK_NS,
                taps: dict[str, Callable[[bytes, str, bool, int], None]] | None = None,
                emulator_guards: bool = False, ecmp_seed: int | None = None) -> VirtualRun:
    """Run every WRITE of `specs` at once (a spec's `start_at`: when the others reach that
    progress) over the virtual fabric of `topo`, with `faults` on its links; one result per
    spec, in order. `limit_ns`: virtual time after which what has not completed has failed.
    `on_progress(acked, total)` follows the bytes acknowledged, every tick of virtual time
    (`tick_ns`, also the timelines' resolution). `hooks`: (progress, action) pairs, each action
    called once with the run's `Live` when that fraction of the bytes is acknowledged.
    `routing`: the timers of the routing repair model (vfabric/routing.py; None: routes stay
    as they are, but for a link's two ends). `linger_ns`: after the WRITEs complete, run on
    (probes reviving EVs) until no EV is ASSUMED_BAD, or this long. `taps`: host -> what sees
    every frame the host sends or receives (VirtualFabric.taps: a capture). `emulator_guards`:
    the QPs keep the emulated workers' guards against reordering (_configured). `ecmp_seed`: the
    ECMP hash's salt, if not the seed's."""
    specs = prepared_specs(specs)
    engine = Engine()
    fabric = VirtualFabric(topo, engine, random.Random(f"{seed}:fabric"), link_delay_ns, default_rate_bps,
                           ecmp_seed=seed if ecmp_seed is None else ecmp_seed)
    fabric.taps.update(taps or {})
    driver = HostDriver(engine, fabric)
    transport_rng = random.Random(f"{seed}:transport")
    plans = [plan_paths(topo, spec) for spec in specs]
    unloaded = [_unloaded_rtt(fabric, topo, spec, plan) for spec, plan in zip(specs, plans)]
    rtts = [rtt for rtt, _ in unloaded]
    specs = [_configured(spec, fabric, rtt, unseen, emulator_guards) for spec, (rtt, unseen) in zip(specs, unloaded)]
    muxes, controls = {}, {}
    for host in sorted({s.src for s in specs} | {s.dst for s in specs}, key=lambda h: topo.node(h).index):
        mux = muxes[host] = HostMux(ipaddress.IPv6Address(ad.host_address(topo, host)).packed)
        mux.serve(HostEndpoint(mux.address, mux, None, topo.planes))  # QPN 0x2: probes, port status
        controls[host] = HostControl(host, topo.planes)
        driver.add_host(host, mux)
        driver.add_endpoint(mux.endpoint, host)
    jobs, responders, regions = [], [], []
    for key, (spec, plan) in enumerate(zip(specs, plans)):
        qpn_req, qpn_resp = (0x100 + 2 * key) << 8 | 1, (0x101 + 2 * key) << 8 | 1
        start_psn = transport_rng.getrandbits(24)
        recvs = spec.recvs if spec.recvs is not None else int(spec.imm is not None)
        responder, region = accept_write(muxes[spec.dst], controls[spec.dst], key, spec.size, qpn_resp, qpn_req,
                                         start_psn, plan.back, plan.src_address, spec.config, recvs,
                                         transport_rng.getrandbits)
        data = source_bytes(seed, key, spec.size)
        jobs.append(prepare_write(muxes[spec.src], controls[spec.src], key, spec.src, qpn_req, qpn_resp, plan.forward,
                                  spec.config, spec.cc, spec.ev_min_active, start_psn, region.to_dict(), data,
                                  hashlib.sha256(data).hexdigest(), spec.imm, transport_rng.getrandbits))
        # the ledger's gaps (the fault figures' stall) at the model's resolution: one unloaded RTT,
        # not the 100 us a worker's ACK clock needs on the namespace fabric
        jobs[-1].requester.recovery.ledger.gap_ns = rtts[key]
        driver.add_endpoint(responder, spec.dst)
        responders.append(responder)
        regions.append(region)
    timeline = FaultTimeline(engine, fabric, list(faults))
    repair = None
    if routing is not None:
        repair = BgpRepair(engine, fabric, routing, random.Random(f"{seed}:routing"))
        timeline.listeners.append(repair.on_fault)
    live = Live(engine, driver, jobs, muxes, controls)
    follow = _Follow(engine, driver, specs, jobs, timeline, on_progress, sorted(hooks, key=lambda h: h[0]), live,
                     linger_ns, tick_ns)
    began = time.perf_counter()
    follow.start()
    engine.run(until_ns=limit_ns)
    wall = time.perf_counter() - began
    end = engine.now
    results = []
    for key, (spec, plan, job, responder) in enumerate(zip(specs, plans, jobs, responders)):
        report = job.report(end)
        if report["error"] is None and report["completed_ns"] is None:
            report["error"] = f"not completed within {limit_ns / 1e9:g} s of virtual time"
        results.append(result_of(spec, plan, report, responder_report(responder), {},
                                 muxes[spec.dst].unknown_qp, hashlib.sha256(regions[key].buffer).hexdigest()))
    virtual = _block(topo, fabric, engine, seed, rtts, timeline, wall, driver)
    if repair is not None:
        virtual["routing"] = {"model": routing.describe(),
                              "events": [{**e, "time_ns": e["time_ns"] - timeline.origin_ns} for e in repair.events]}
    for result in results:
        result.virtual = virtual
    return VirtualRun(results, virtual, jobs, fabric, timeline)


class _Follow:
    """What a virtual run follows as it goes: the WRITEs that start later, faults by progress, a
    timeline tick every millisecond, and the end (the engine stops when every WRITE is done)."""

    def __init__(self, engine: Engine, driver: HostDriver, specs: list[TransferSpec], jobs: list[WriteJob],
                 timeline: FaultTimeline, on_progress: Callable[[int, int], None] | None,
                 hooks: list[tuple[float, Callable[[Live], None]]], live: Live, linger_ns: int, tick_ns: int) -> None:
        self.engine, self.driver, self.jobs, self.timeline, self.on_progress = engine, driver, jobs, timeline, on_progress
        self.hooks, self.live, self.linger_ns, self.tick_ns = list(hooks), live, linger_ns, tick_ns
        self.linger_until: int | None = None
        self.reported = 0  # the bytes acknowledged on_progress was last told
        self.primary = [job for job, spec in zip(jobs, specs) if spec.start_at is None]
        self.total = sum(len(job.data) for job in self.primary)
        self.acked = {id(job.requester): 0 for job in self.primary}  # bytes acknowledged, as last seen
        self.acked_sum = 0  # ... together: progress follows it per delivery, not by a pass over every WRITE
        self.deferred = sorted(((spec.start_at, job) for spec, job in zip(specs, jobs) if spec.start_at is not None),
                               key=lambda d: d[0])
        self.running: dict[int, WriteJob] = {}  # by id(requester)
        self.left = len(jobs)

    def start(self) -> None:
        for job in self.primary:
            self._post(job)
        self.timeline.start(self.engine.now)
        self.driver.watchers.append(self._delivered)
        self.engine.after(self.tick_ns, self._tick)

    def _post(self, job: WriteJob) -> None:
        job.post(self.engine.now)
        self.running[id(job.requester)] = job
        self.driver.add_endpoint(job.requester, job.host)

    def _delivered(self, endpoint: Any) -> None:
        job = self.running.get(id(endpoint))
        if job is None:
            return
        key = id(endpoint)
        if key in self.acked:
            acked = endpoint.bytes_acked
            self.acked_sum += acked - self.acked[key]
            self.acked[key] = acked
        if self.timeline.waiting or self.deferred or self.hooks:
            progress = self.acked_sum / self.total
            self.timeline.progress(progress)
            while self.hooks and progress >= self.hooks[0][0]:
                self.hooks.pop(0)[1](self.live)
            while self.deferred and (progress >= self.deferred[0][0] or all(j.requester.done for j in self.primary)):
                self._post(self.deferred.pop(0)[1])
        if job.requester.done:
            del self.running[id(endpoint)]
            job.sample(self.engine.now)  # the last sample, at the completion itself
            self.left -= 1
            if not self.left:
                self._over()

    def _report(self) -> None:
        """on_progress at a tick, and once at the end; not again while lingering."""
        if self.on_progress is not None and self.reported < self.total:
            self.reported = self.acked_sum
            self.on_progress(self.acked_sum, self.total)

    def _over(self) -> None:
        """Every WRITE is done: stop, or linger while an EV is ASSUMED_BAD (ticks look again)."""
        self._report()
        # only a QP that had an EV event can have an EV ASSUMED_BAD: the others are not asked (512 of them, each tick)
        if self.linger_ns and any(job.requester.ev_events and job.requester.profile.any_assumed_bad() for job in self.jobs):
            if self.linger_until is None:
                self.linger_until = self.engine.now + self.linger_ns
            if self.engine.now < self.linger_until:
                return
        self.engine.stop()

    def _tick(self, _: Any) -> None:
        now = self.engine.now
        for job in list(self.running.values()):
            if job.sample(now):
                del self.running[id(job.requester)]
                self.left -= 1
        self._report()
        if not self.left:
            self._over()
        if not self.engine.stopped:  # lingering, it only looks for healed EVs: every timeline tick of transfer.py
            self.engine.after(self.tick_ns if self.left else max(self.tick_ns, TIMELINE_TICK_NS), self._tick)


def _block(topo: Topology, fabric: VirtualFabric, engine: Engine, seed: int, rtts: list[int],
           timeline: FaultTimeline, wall_s: float, driver: HostDriver) -> dict[str, Any]:
    """The run's `virtual` block: the model, what it counted, and apart (`wall`) this machine's time."""
    counters = fabric.port_counters()
    signalled = {node: {ifname: c for ifname, c in ports.items() if c["ce_marked"] or c["trimmed"] or c["dropped"]
                        or c["flushed"]} for node, ports in counters.items()}
    busiest = max(((c["max_queue"], node, ifname) for node, ports in counters.items() for ifname, c in ports.items()),
                  default=(0, None, None))
    return {
        "clock": "virtual", "seed": seed, "topology": topo.name,
        "link_rate_bps": fabric.rate_bps,
        "link_rate_from": "the default for a topology without link_rate" if fabric.rate_default else "the topology",
        "link_delay_ns": fabric.link_delay_ns, "qp_base_rtt_ns": rtts,
        "virtual_ns": engine.now, "events": engine.events, "pumps": driver.pumps,
        "frames_sent": fabric.frames_sent, "frames_refused": fabric.frames_refused,
        "frames_delivered": fabric.frames_delivered, "packet_hops": fabric.packet_hops,
        "fabric_drops": dict(fabric.drops),
        "ports_signalled": {node: ports for node, ports in signalled.items() if ports},
        "busiest_port": {"node": busiest[1], "ifname": busiest[2], "max_queue": busiest[0]},
        "faults": timeline.record,
        "wall": {"seconds": round(wall_s, 3), "packet_hops_per_s": round(fabric.packet_hops / wall_s) if wall_s else None,
                 "events_per_s": round(engine.events / wall_s) if wall_s else None},
    }


def send_virtual(topo: Topology, src: str, dst: str, size: int, evs: list[int] | None = None, cc: str = "nscc",
                 ev_format: EvFormat = EvFormat.SRV6, ev_min_active: int = 1, imm: int | None = None,
                 config: QpConfig | None = None, recvs: int | None = None, ev_profile: Any = None, seed: int = 0,
                 faults: list[LinkFault] = (), link_delay_ns: int = DEFAULT_LINK_DELAY_NS,
                 on_progress: Callable[[int, int], None] | None = None) -> TransferResult:
    """One WRITE of `size` seeded random bytes from `src` to `dst` in virtual time (transfer.send's
    virtual twin); a DCQCN QP's responder answers CE marks with CNPs, as there."""
    config = config or QpConfig(cnp=cc == "dcqcn")
    spec = TransferSpec(src, dst, size, evs, ev_format, config, cc, ev_min_active, imm, recvs=recvs,
                        ev_profile=ev_profile)
    return run_virtual(topo, [spec], seed, faults, link_delay_ns, on_progress=on_progress)[0]
