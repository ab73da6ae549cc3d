"""Run a scenario in virtual time: its transports, faults and figures, on the virtual fabric.

Why it exists: `mrc-emu run SCENARIO --clock virtual` (or `clock: virtual` in the file) runs the
same scenario files as the namespace fabric, with the same WRITEs (transports.py), the same
summary (runner._summarise: exact fault figures, flows, false EV events), the same results.json
schema, report and plots, but the driver is experiments/runtime/virtual.py: no root, no
namespaces, no wall clock in the figures. Each fault of the schedule becomes its model on the
virtual fabric's links (vfabric/faults.py) or a step of an in-memory controller record; a kind
without a model is refused by name before anything runs. The baseline's routing repair is
vfabric/routing.py's model with the timers the namespace fabric gives FRR (fabric/routing.py),
said in the results as a model. A seed gives one results.json, byte for byte: this machine's
time goes to wall.json beside it, never into results.json. A capture is of the measured run
itself (`Capture`: capturing costs nothing in virtual time), with virtual timestamps.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ...fabric import limits
from ...fabric import routing as frr
from ...stats import histogram_percentile
from ...topology import Role, Topology
from ...topology.evs import EvFormat
from ...vfabric.faults import FaultKind, LinkFault
from ...vfabric.routing import RoutingTimers
from ..runtime.controller import ALLOW, DENY, LiveControl, Selector, State, qp_evs
from ..runtime.spec import plan_paths
from ..runtime.virtual import Live, run_virtual
from .faults import Fault
from .runner import FaultRun, Progress, _quiet, _summarise
from .scenario import Scenario, ScenarioError
from .transports import Transport, baseline_path, competing_specs

MEMORY_PER_BYTE = 3  # a virtual run's peak memory per byte its WRITEs move (ring512: 1.5 GB for 512 MiB)
UPDATE_HOP_NS = 1_000_000  # the model's time for a BGP UPDATE to be processed and installed, per hop
VIRTUAL_TICK_NS = 100_000  # timelines every 0.1 ms: a fault-free WRITE on `default` takes milliseconds
_LINK_KINDS = {"link-down": FaultKind.DOWN, "flap": FaultKind.DOWN, "loss": FaultKind.LOSS,
               "blackhole": FaultKind.BLACKHOLE, "degrade": FaultKind.DEGRADE, "delay": FaultKind.DELAY,
               "switch-reboot": FaultKind.DOWN, "plane-down": FaultKind.DOWN}
_NO_LINKS = ("congestion",)  # carried out by the WRITEs themselves (competing flows)


class NotModelled(ScenarioError):
    """A scenario asks for something the virtual fabric has no model of."""


def check(scn: Scenario, available: int | None = None) -> None:
    """Refuse, by name, what virtual time cannot run: a fault kind without a model, a topology
    whose ports are not the port program's, WRITEs whose bytes do not fit in memory (`available`
    bytes, or the kernel's MemAvailable): one process holds every source and destination buffer."""
    total = sum(n for _, _, n in scn.transfers())
    available = limits.available_memory() if available is None else available
    if available is not None and total * MEMORY_PER_BYTE > available:
        raise NotModelled(f"{scn.source or scn.name}: its WRITEs move {total / 2**30:.1f} GiB, which virtual time holds "
                          f"in this one process (source and destination buffers, the transport's records: about "
                          f"{total * MEMORY_PER_BYTE / 2**30:.1f} GiB); {available / 2**30:.1f} GiB is available: "
                          f"give the workloads a smaller size")
    for fault in scn.faults:
        if fault.kind not in _LINK_KINDS and fault.kind not in _NO_LINKS and not fault.controller:
            raise NotModelled(f"{scn.source or scn.name}: fault kind {fault.kind!r} has no model in virtual time "
                              f"(modelled: {', '.join([*_LINK_KINDS, *_NO_LINKS])} and the controller's steps); "
                              f"run it with --clock emulated")
    if scn.topology.ports.model != "bpf":
        raise NotModelled(f"{scn.source or scn.name}: topology {scn.topology.name} has port model "
                          f"{scn.topology.ports.model!r}; virtual time models the port program's rule only (bpf)")


@dataclass(frozen=True)
class _NoFabric:
    """What a controller record's `fabric` is asked for: its topology (virtual time has no fabric)."""

    topology: Topology


class MemoryRecord:
    """A controller record held in memory, for a run without a fabric (virtual time): the same
    operations, checks and state as ControlRecord's, nothing written, no EV event queues."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self.fabric = _NoFabric(topology)  # LiveControl asks a record's fabric for its topology
        self._state = State([], {}, {}, {})
        self._ops = 0

    def size(self) -> int:
        return self._ops

    def deny(self, selector: Selector, by: str = "cli") -> None:
        self._state.rules.append((DENY, selector.check(self.topology), by))
        self._ops += 1

    def allow(self, selector: Selector, by: str = "cli") -> None:
        self._state.rules.append((ALLOW, selector.check(self.topology), by))
        self._ops += 1

    def set_port(self, host: str, plane: int, enabled: bool, by: str = "cli") -> None:
        if self.topology.node(host).role is not Role.HOST or not 0 <= plane < self.topology.planes:
            raise ValueError(f"{host} plane {plane}: not a host's port of {self.topology.name}")
        self._state.ports[(host, plane)] = enabled
        self._ops += 1

    def state(self) -> State:
        return State(list(self._state.rules), dict(self._state.ports), {}, {})


def link_faults(scn: Scenario, fault: Fault, link: tuple[str, str] | None, tag: int) -> list[LinkFault]:
    """The virtual fabric's faults that carry out one fault of the schedule (none for congestion
    and the controller's steps). A fault at progress 0 comes into force when the WRITEs start."""
    kind = _LINK_KINDS.get(fault.kind)
    if kind is None:
        return []
    when = {"at_ns": 0} if fault.at == 0 else {"at_progress": fault.at}
    duration = int(fault.duration_ms * 1e6) if fault.duration_ms else None
    if fault.kind == "switch-reboot":
        return [LinkFault(kind, fault.node, scn.topology.peer(each, fault.node)[0], duration_ns=duration, tag=tag, **when)
                for each in scn.topology.links_of(fault.node)]
    if fault.kind == "plane-down":
        link = (fault.host, scn.topology.leaf_of(fault.host, fault.plane))
    a, b = fault.direction or link
    value = {"loss": fault.percent / 100, "degrade": fault.rate, "delay": fault.ms * 1e6}.get(fault.kind, 0.0)
    if fault.kind == "flap":
        period = int(fault.period_ms * 1e6)
        return [LinkFault(kind, a, b, duration_ns=period // 2, repeat=fault.count, period_ns=period, tag=tag, **when)]
    return [LinkFault(kind, a, b, fault.direction is not None, value, duration_ns=duration, tag=tag, **when)]


def routing_timers(scn: Scenario) -> RoutingTimers | None:
    """The repair model's timers for a scenario routed by BGP: FRR's, as fabric/routing.py sets them."""
    if scn.routing != "bgp":
        return None
    return RoutingTimers(bfd_interval_ns=frr.BFD_INTERVAL_MS * 1_000_000 if scn.bfd else None,
                         bfd_multiplier=frr.BFD_DETECT_MULTIPLIER, keepalive_ns=frr.KEEPALIVE_S * 10**9,
                         hold_ns=frr.HOLD_S * 10**9, connect_retry_ns=frr.CONNECT_RETRY_S * 10**9,
                         update_hop_ns=UPDATE_HOP_NS)


def baseline_link(scn: Scenario, seed: int, ecmp_seed: int | None = None,
                  seen: dict[str, tuple[str, str]] | None = None) -> tuple[str, str]:
    """The leaf-spine link the baseline's flow crosses in the model, seen as the namespace fabric
    sees it: in the source side's leaf port counters during a short WRITE with the same 5-tuple.
    `seen`, if given, gets "data" (that link) and "acks" (the uplink on dst's side its ACKs took),
    as baseline_path.observe_baseline_path gives them."""
    src, dst, _ = scn.transfers()[0]
    topo = scn.topology
    run = run_virtual(topo, [Transport.BASELINE.spec(src, dst, 256 * 1024, scn.mtu, topology=topo)], seed,
                      ecmp_seed=ecmp_seed)
    found = {}
    for side, host in (("data", src), ("acks", dst)):
        best, most = None, 0
        for plane in range(topo.planes):
            leaf = topo.leaf_of(host, plane)
            for port in run.fabric.ports[leaf].values():
                if topo.node(port.peer).role is Role.SPINE and port.packets > most:
                    best, most = (leaf, port.peer), port.packets
        if best is not None:
            found[side] = best
    if "data" not in found:
        raise RuntimeError(f"the baseline's flow {src}->{dst} crossed no leaf-spine link in the model")
    if seen is not None:
        seen.update(found)
    return found["data"]


def _controller(fr: FaultRun, record: MemoryRecord, control: LiveControl, by: str) -> Callable[[Live], None]:
    def act(live: Live) -> None:
        fr.events.append({"action": fr.fault.kind, "at_ms": round(live.engine.now / 1e6, 6)})
        fr.fault.act(record, by)
        ev_changes, masks = control.changes()
        for key, _, deny, allow, why in ev_changes:
            live.set_ev_states(key, deny, allow, why)
        for host, mask in masks.items():
            live.set_port_status(host, mask)

    return act


def _ports(fabric: Any) -> dict[str, dict[str, dict[str, Any]]]:
    """The switch ports' counters over a run, as runner's port delta has them (those that passed packets)."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for node, ifaces in fabric.port_counters().items():
        for ifname, c in ifaces.items():
            if c.get("queue_hist") is None or not c["packets"]:
                continue
            hist, width = c["queue_hist"], c["hist_width"]
            quantile = {q: histogram_percentile(hist, q) for q in (50, 99)}
            out.setdefault(node, {})[ifname] = {
                **{k: v for k, v in c.items() if k not in ("peer", "rate_bps")},
                "queue_p50": None if quantile[50] is None else quantile[50] * width,
                "queue_p99": None if quantile[99] is None else quantile[99] * width}
    return out


PCAP_LINKTYPE_ETHERNET = 1
_PCAP_HEADER = struct.Struct("<IHHiIII")  # the classic pcap file header, nanosecond timestamps (magic a1b23c4d)
_PCAP_RECORD = struct.Struct("<IIII")


class Capture:
    """A pcap of one host's ports in a virtual run (`tap` is VirtualFabric's), with virtual
    timestamps: whole frames, each behind an Ethernet header (the host's port's MAC, made from
    its interface name, and the peer's; ethertype IPv6), as tcpdump on the host's interfaces
    writes them. Capturing changes nothing in virtual time, so the captured run is the measured one."""

    def __init__(self, path: Path, host: str) -> None:
        self.path, self.host = path, host
        self.file = path.open("wb")
        self.file.write(_PCAP_HEADER.pack(0xA1B23C4D, 2, 4, 0, 0, 0, PCAP_LINKTYPE_ETHERNET))
        self.packets = 0
        self.interfaces: set[str] = set()
        self._macs: dict[str, bytes] = {}

    def _mac(self, name: str) -> bytes:
        mac = self._macs.get(name)
        if mac is None:
            mac = self._macs[name] = b"\x02" + hashlib.sha256(name.encode()).digest()[:5]  # locally administered
        return mac

    def tap(self, frame: bytes, ifname: str, outbound: bool, time_ns: int) -> None:
        ours, peer = self._mac(ifname), self._mac(f"{ifname} peer")
        ether = (peer + ours if outbound else ours + peer) + b"\x86\xdd"
        self.file.write(_PCAP_RECORD.pack(time_ns // 10**9, time_ns % 10**9, len(frame) + 14, len(frame) + 14))
        self.file.write(ether + frame)
        self.packets += 1
        self.interfaces.add(ifname)

    def close(self, run: dict[str, Any]) -> dict[str, Any]:
        """The run's `capture` block (results.json's schema, as the namespace fabric's has it); its
        path is the file's name, beside results.json (the same seed, the same results.json, anywhere)."""
        self.file.close()
        return {"path": self.path.name, "run": "same", "host": self.host, "interfaces": sorted(self.interfaces),
                "packets": self.packets, "received": self.packets, "dropped_kernel": 0, "dropped_interface": 0,
                "left_in_ring": 0, "lost": 0, "complete": True, "snaplen": 0, "problem": None,
                "completion_ms": run["completion_ms"], "verified": run["verified"], "time_dilation": 1,
                "ring_kib": None, "attempts": [{"time_dilation": 1, "ring_kib": None, "lost": 0}]}


def run_transport(scn: Scenario, transport: Transport, link: tuple[str, str] | None, seed: int,
                  reference: dict | None = None, on_bytes: Callable[[int, int], None] | None = None,
                  progress: Progress = _quiet, pcap: Path | None = None,
                  emulator_guards: bool = False, ecmp_seed: int | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """One transport's run of the scenario in virtual time: (its summary, this machine's wall
    figures); with `pcap`, the first WRITE's source host's ports are captured into it;
    `emulator_guards`: the QPs' reordering guards as the emulated workers have them."""
    topo = scn.topology
    specs = [transport.spec(s, d, n, scn.mtu, label=f"{s}->{d}", topology=topo) for s, d, n in scn.transfers()]
    runs: list[FaultRun] = []
    faults: list[LinkFault] = []
    hooks: list[tuple[float, Callable[[Live], None]]] = []
    record = MemoryRecord(topo)
    steps: list[tuple[FaultRun, Fault]] = []
    for tag, fault in enumerate(scn.faults):
        target = link if fault.link == "baseline-path" else fault.link
        fr = FaultRun(fault, target if isinstance(target, tuple) else None)
        runs.append(fr)
        if fault.controller:
            if transport is Transport.MRC:
                steps.append((fr, fault))
            else:
                fr.events.append({"action": "not for this transport: RoCE RC has no EV controller"})
            continue
        specs += competing_specs(fault, topo, fr.link, scn.mtu)
        faults += link_faults(scn, fault, fr.link, tag)
    if steps:
        control = LiveControl(record, {key: (spec.src, qp_evs(plan_paths(topo, spec)))
                                       for key, spec in enumerate(specs) if spec.ev_format is not EvFormat.UDP},
                              since=0.0)  # no wall clock: the in-memory record has no EV_PROBEs of other runs
        control.changes()  # nothing yet: the record starts empty
        hooks = [(fault.at, _controller(fr, record, control, f"scenario {scn.name}")) for fr, fault in steps]
    progress(f"{transport}: {len(specs)} WRITE(s) in virtual time, faults: "
             f"{', '.join(f.describe() for f in scn.faults) or 'none'}" + (f", captured to {pcap.name}" if pcap else ""))
    capture = None if pcap is None else Capture(pcap, scn.transfers()[0][0])
    run = run_virtual(topo, specs, seed, faults, limit_ns=int(scn.timeout_s * 1e9), on_progress=on_bytes,
                      hooks=hooks, routing=routing_timers(scn), linger_ns=int(transport.linger_s * 1e9),
                      tick_ns=VIRTUAL_TICK_NS, taps={capture.host: capture.tap} if capture else None,
                      emulator_guards=emulator_guards, ecmp_seed=ecmp_seed)
    for entry in run.virtual["faults"]:
        fr = runs[entry["tag"]]
        for action, at in ((fr.fault.kind, entry["applied_ns"]), ("undone", entry["reverted_ns"])):
            event = None if at is None else {"action": action, "began_ms": round(at / 1e6, 6),
                                             "returned_ms": round(at / 1e6, 6)}
            if event is not None and event not in fr.events:
                fr.events.append(event)
    for fr in runs:
        fr.events.sort(key=lambda e: e.get("began_ms", e.get("at_ms", 0)))
    summary = _summarise(transport, run, runs, None, topo, reference)
    for entry in summary["transfers"]:
        entry.pop("virtual", None)  # the run's, once, below
    virtual = dict(run.virtual)
    wall = virtual.pop("wall")
    summary["clock"] = "virtual"
    summary["virtual"] = virtual
    summary["ports"] = _ports(run.fabric)
    if capture is not None:
        summary["capture"] = capture.close(summary)
        summary["pcap"] = summary["capture"]["path"]
    return summary, {"transport": transport.value, "virtual_ns": virtual["virtual_ns"],
                     "packet_hops": virtual["packet_hops"], "events": virtual["events"], **wall}


def run(scn: Scenario, out_dir: Path, seed: int = 0, progress: Progress = _quiet,
        on_bytes: Callable[[str], Callable[[int, int], None] | None] | None = None,
        emulator_guards: bool = False, ecmp_seed: int | None = None) -> dict[str, Any]:
    """The scenario in virtual time; returns results.json's data (wall.json is written to out_dir).
    `emulator_guards`: the QPs keep the emulated workers' reordering guards (runtime/virtual.py
    _configured); `ecmp_seed`: the ECMP hash's salt, if not the seed's (a cross-validation gives
    the one under which the baseline's flow takes the emulated run's path)."""
    check(scn)
    out_dir.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"schema": "mrc-emu/results/1", "scenario": {**scn.to_dict(), "clock": "virtual",
                                                                         "seed": seed},
                               "clock": "virtual", "seed": seed, "fabric": None, "runs": {}, "notes": []}
    notes = results["notes"]
    if scn.time_dilation != 1:
        notes.append(f"time_dilation {scn.time_dilation:g} does not apply in virtual time (no machine to slow down)")
    if scn.workers is not None:
        notes.append(f"workers: {scn.workers} does not apply in virtual time (one process drives every endpoint)")
    if scn.routing == "bgp" and any(t.needs_routing for t in scn.transports):
        notes.append(f"the baseline's routing repair is a model (vfabric/routing.py), from FRR's timers as the "
                     f"namespace fabric sets them: {routing_timers(scn).describe()}")
    elif scn.routing == "static" and scn.faults and any(t.needs_routing for t in scn.transports):
        notes.append("routing: static repairs nothing: after a fault the baseline keeps only what the link's two "
                     "ends do alone")
    for note in notes:
        progress(note)
    link = None
    if any(f.link == "baseline-path" for f in scn.faults):
        src, dst, _ = scn.transfers()[0]
        seen: dict[str, tuple[str, str]] = {}
        link, note = baseline_path(scn.topology, src, dst, scn.transports,
                                   lambda: baseline_link(scn, seed, ecmp_seed, seen), "seen in the model's leaf port counters")
        if seen:
            results["baseline_uplinks"] = {side: list(link) for side, link in seen.items()}
        notes.append(note)
        progress(note)
    walls = []
    for transport in scn.transports:
        reference = None
        if scn.faults and scn.reference:
            progress(f"{transport}: the workloads without faults first (the reference run)")
            reference, wall = run_transport(replace(scn, faults=[]), transport, None, seed, progress=progress,
                                            emulator_guards=emulator_guards, ecmp_seed=ecmp_seed)
            walls.append({**wall, "run": "reference"})
        summary, wall = run_transport(scn, transport, link, seed, reference,
                                      on_bytes(transport.value) if on_bytes else None, progress,
                                      pcap=out_dir / f"{transport}.pcap" if scn.capture else None,
                                      emulator_guards=emulator_guards, ecmp_seed=ecmp_seed)
        results["runs"][transport.value] = summary
        walls.append({**wall, "run": "measured"})
    results["seconds"] = round(sum(w["virtual_ns"] for w in walls) / 1e9, 9)  # of virtual time, every run
    (out_dir / "wall.json").write_text(json.dumps({"runs": walls, "seconds": round(sum(w["seconds"] for w in walls), 3)},
                                                  indent=1))
    return results
