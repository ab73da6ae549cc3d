"""Run a scenario: fabric, routing, each transport in turn, the fault schedule, the results.

Why it exists: `mrc-emu run` and `mrc-emu demo` do what a user would do by hand (bring a
fabric up, start BGP, run the workloads with MRC, fail a link, repair it, run them again
with the baseline, tear down) and measure it the same way every time. Faults are carried
out by a fault agent (a child process, timed exactly); each fault is reversible and
reverted before the next transport runs; every fault lands in the timeline. A fault this
kernel cannot carry out (a delay without netem) is skipped, said in the notes and in the run's
fault list with its reason, and the rest of the scenario runs: what a user asked for is
measured as far as the machine allows, and the report says what was left out.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ...fabric import build, ops, routing, static_routes
from ...fabric.datapath import ports
from ...fabric.running import Fabric
from ...stats import percentile
from ...topology import evs_between
from ..analysis import congestion, metrics
from ..runtime.controller import ControlRecord
from ..runtime.fault_agent import After, Done, LinkFaultAgent, RecordAs
from ..runtime.transfer import Control, Run, run_transfers
from .baseline_path import observe_baseline_path
from .faults import Fault
from .scenario import Scenario
from .transports import Transport, baseline_path, competing_specs

Progress = Callable[[str], None]
MIN_PRE_FAULT_NS = 20_000_000  # a fault earlier than this has no pre-fault level: no recovery time


def _quiet(_: str) -> None:
    pass


@dataclass
class FaultRun:
    """One fault as carried out: what, where, and when (ns since the run's first transfer began)."""

    fault: Fault
    link: tuple[str, str] | None
    events: list[dict[str, Any]] = field(default_factory=list)  # {"action", "began_ms", "returned_ms"}
    skipped: str | None = None  # why this kernel could not carry it out

    def record(self, done: Done) -> None:
        self.events.append({"action": done.action.label, "began_ns": done.began_ns, "returned_ns": done.returned_ns})

    def to_dict(self) -> dict:
        out = {"kind": self.fault.kind, "description": self.fault.describe(),
               "link": list(self.link) if self.link else None, "node": self.fault.node,
               "host": self.fault.host, "plane": self.fault.plane, "at_progress": self.fault.at,
               "direction": "->".join(self.fault.direction) if self.fault.direction else None,
               # one that undoes itself (a flap) has no revert of its own: its window is its one action
               "undoes_itself": type(self.fault).revert is Fault.revert, "events": self.events}
        if self.skipped:
            out["skipped"] = self.skipped
        return out


def skipped_faults(scn: Scenario) -> dict[int, str]:
    """The faults of the schedule this kernel cannot carry out (by index), with the reason."""
    return {i: reason for i, f in enumerate(scn.faults) if (reason := f.unavailable())}


# ---- one transport -------------------------------------------------------------------------

def run_transport(scn: Scenario, fabric: Fabric, transport: Transport, baseline_link: tuple[str, str] | None,
                  out_dir: Path, progress: Progress = _quiet,
                  on_bytes: Callable[[int, int], None] | None = None, pcap: Path | None = None,
                  reference: dict | None = None, ring_kib: int = ops.CAPTURE_BUFFER_KIB) -> dict[str, Any]:
    """One transport's run of the scenario; with `pcap`, tcpdump records the source host's ports
    into it, with a ring of `ring_kib` (the caller says that this run was captured: see capture_run); `reference`: its
    fault-free run, made just before (completion inflation, per-flow slowdown and the windowed
    figure's noise band come from it)."""
    topo = fabric.topology
    specs = [transport.spec(s, d, n, scn.mtu, label=f"{s}->{d}", topology=scn.topology) for s, d, n in scn.transfers()]
    runs: list[FaultRun] = []
    agents: list[tuple[FaultRun, LinkFaultAgent | None]] = []
    control = Control()
    skipped = skipped_faults(scn)
    record = ControlRecord(fabric)
    try:
        for i, fault in enumerate(scn.faults):
            link = baseline_link if fault.link == "baseline-path" else fault.link
            fr = FaultRun(fault, link if isinstance(link, tuple) else None, skipped=skipped.get(i))
            runs.append(fr)
            if fr.skipped:
                agents.append((fr, None))
                continue
            if fault.controller:
                agents.append((fr, None))
                if transport is Transport.MRC:
                    control.hooks.append((fault.at, _controller_step(fr, record, f"scenario {scn.name}")))
                else:
                    fr.events.append({"action": "not for this transport: RoCE RC has no EV controller"})
                continue
            specs += competing_specs(fault, topo, fr.link, scn.mtu)
            targets = fault.agent_links(topo, fr.link)
            record_as = RecordAs(fault.kind, fault.target_name(fr.link), fault.params(),
                                 f"scenario {scn.name} ({transport.value})", os.getpid())
            agent = None if targets is None else LinkFaultAgent(fabric, *targets, drops=fault.drops, qdiscs=fault.qdiscs,
                                                                direction=fault.direction, record_as=record_as)
            agents.append((fr, agent))
            if agent is not None:
                control.hooks.append((fault.at, _trigger(agent, fault, scn.time_dilation)))
        control.hooks.sort(key=lambda h: h[0])
        capture = None if pcap is None else ops.Capture(fabric, scn.transfers()[0][0], str(pcap), buffer_kib=ring_kib)
        captured = None
        progress(f"{transport}: {len(specs)} WRITE(s), faults: {', '.join(f.describe() for f in scn.faults) or 'none'}")
        port_counters = ports.attached(fabric)
        before = ports.counters(fabric) if port_counters else None
        try:
            results = run_transfers(fabric, specs, control, on_bytes, linger_s=transport.linger_s,
                                    timeout_s=scn.timeout_s, workers=scn.workers, dilation=scn.time_dilation)
        finally:
            if capture is not None:
                captured = capture.stop()
        port_delta = _busy_ports(ports.delta(before, ports.counters(fabric))) if port_counters else None
        # each fault's timeline, then revert what is still applied
        for fr, agent in agents:
            fr.events += fr.fault.events_without_agent()
            if agent is None:
                continue
            while agent.pending():
                fr.record(agent.wait(60))
            revert = fr.fault.revert()  # the run is over: its links are back at their full rate
            if revert is not None and not any(e["action"] == revert.label for e in fr.events):
                agent.trigger(revert)
                fr.record(agent.wait(60))
    finally:
        for _, agent in agents:
            if agent is not None:
                agent.close()
        _undo_steps(record, runs, f"scenario {scn.name}")
    if scn.routing == "bgp" and routing.frr_missing() is None:
        routing.wait_converged(fabric, 60)  # the next run starts on a repaired fabric
        routing.wait_bfd_heard(scn.bfd and bool(scn.faults), scn.time_dilation)  # ... and BFD has heard its peers
    summary = _summarise(transport, results, runs, captured.path if captured else None, topo, reference)
    if captured is not None:
        summary["capture"] = captured.to_dict()  # tcpdump's counts: kept, dropped, lost
    summary["ports"] = port_delta  # the switch ports' counters over the run (fabric/datapath/ports.py), those that passed packets
    return summary


def _busy_ports(delta: dict) -> dict:
    """The ports of a counters delta that passed packets, without their configuration (the
    topology's `port:` block says it once)."""
    return {node: {ifname: {k: v for k, v in entry.items() if k != "config"} for ifname, entry in ifaces.items()
                   if entry.get("packets")}
            for node, ifaces in delta.items() if any(e.get("packets") for e in ifaces.values())}


def _controller_step(fr: FaultRun, record: ControlRecord, by: str) -> Callable[[], None]:
    def fire() -> None:
        fr.events.append({"action": fr.fault.kind, "at_ns": time.monotonic_ns()})
        fr.fault.act(record, by)

    return fire


def _undo_steps(record: ControlRecord, runs: list[FaultRun], by: str) -> None:
    """What a scenario's controller steps left in force (a drain without its undrain, a port left
    disabled) is lifted when the run ends: the next run, and the user's, start from a clean slate."""
    for step in [fr.fault for fr in runs if any(e.get("action") == fr.fault.kind for e in fr.events)]:
        if step.kind == "drain":
            record.allow(step.selector(), f"{by}: run over")
        elif step.kind == "port-disable":
            record.set_port(step.host, step.plane, True, f"{by}: run over")


def _trigger(agent: LinkFaultAgent, fault: Fault, dilation: float) -> Callable[[], None]:
    apply, revert = fault.apply(dilation), fault.revert(dilation)

    def fire() -> None:
        agent.trigger(apply)
        if fault.duration_ms and revert is not None:
            agent.trigger(After(fault.duration_ms * dilation, revert))  # emulated ms: K times as long in wall time

    return fire


def _failed_evs(transport: Transport, topo, fr: FaultRun | None, src: str, dst: str) -> set[int] | None:
    """The EVs of a WRITE src -> dst through the links a fault acts on (MRC), or None: the baseline,
    whose one ECMP path is the one the fault hits (its 'baseline-path', or it is not hit at all)."""
    if transport is not Transport.MRC:
        return None
    targets = None if fr is None else fr.fault.agent_links(topo, fr.link)
    if not targets:
        return set()
    links = targets[0]
    return {ev.index for ev in evs_between(topo, src, dst) if any(ev.crosses(link.a, link.b) for link in links)}


def _fault_share(transport: Transport, topo, fr: FaultRun, entry: dict, src: str, dst: str) -> dict | None:
    """The share of a WRITE's packets on the EVs through a fault while it held (metrics.share_of)."""
    evs = _failed_evs(transport, topo, fr, src, dst) if topo is not None and fr.events else None
    times = [e["began_ms"] - entry["offset_ms"] for e in fr.events if "began_ms" in e]
    if not evs or not times:
        return None
    at = {i for i, e in enumerate(entry["per_ev"]) if e["ev"] in evs}  # the timeline's columns: per_ev's order
    held = metrics.share_of(entry["ev_timeline"], at, times[0], times[1] if len(times) > 1 else None)
    if held is None:
        return None
    return {"fault": fr.fault.describe(), "evs": sorted(evs), "share": held,
            "before": metrics.share_of(entry["ev_timeline"], at, 0.0, times[0])}


def _summarise(transport: Transport, results: Run, runs: list[FaultRun], pcap: str | None, topo=None,
               reference: dict | None = None) -> dict:
    origin = min(r.start_ns for r in results)
    for fr in runs:
        for e in fr.events:
            if "at_ns" in e:  # a controller step's monotonic time (never a fault's begin: it is no fault)
                e["at_ms"] = round((results.transport_time(e.pop("at_ns")) - origin) / 1e6, 3)
            if "began_ns" in e:  # the agent's monotonic times, onto the transport's (dilated) clock
                e["began_ms"] = round((results.transport_time(e.pop("began_ns")) - origin) / 1e6, 3)
                e["returned_ms"] = round((results.transport_time(e.pop("returned_ns")) - origin) / 1e6, 3)
    first_fault = next((e["began_ms"] for fr in runs for e in fr.events if "began_ms" in e), None)
    first_run = next((fr for fr in runs for e in fr.events if "began_ms" in e), None)
    ref_transfers = {t["label"]: t for t in reference["transfers"]} if reference else {}
    transfers = []
    for r in results:
        entry = r.to_dict()
        entry["timeline"] = [[round(t / 1e6, 3), b] for t, b in r.timeline]
        entry["ev_timeline"] = [[round(t / 1e6, 3), sent, got] for t, sent, got in r.ev_timeline]
        entry["offset_ms"] = round((r.start_ns - origin) / 1e6, 3)
        # the longest interval with nothing new acknowledged, fault or not: on a fault-free run,
        # the floor under which a stall is the emulator's (its scheduling), not the network's
        entry["longest_gap_ms"] = round(max((b - a for a, b in r.ledger.get("gaps", ())), default=0) / 1e6, 3)
        ref = ref_transfers.get(r.label)  # the same WRITE in the fault-free run, if there was one
        fault_rel = None if first_fault is None else int((first_fault - entry["offset_ms"]) * 1e6)
        completed = None if r.completion_ms is None else int(r.completion_ms * 1e6)
        figures = None
        if fault_rel is not None and topo is not None:
            failed = _failed_evs(transport, topo, first_run, r.src, r.dst)
            drained = metrics.denied_at(r.ev_events, fault_rel / 1e6)  # EVs the controller had taken out of use
            if failed and drained & failed:
                entry["drained_at_fault"] = sorted(drained & failed)
                failed -= drained  # a fault on a drained EV hits nothing of this WRITE
            if 0 <= fault_rel <= r.end_ns - r.start_ns and failed != set():  # it ran during the fault, through it
                figures = metrics.fault_figures(r.ledger, r.ev_events, fault_rel, completed, r.end_ns - r.start_ns,
                                                failed)
                figures["failed_evs"] = None if failed is None else sorted(failed)
                figures["stall_noise_ms"] = ref.get("longest_gap_ms") if ref else None
        rec = None
        if fault_rel is not None and r.timeline and MIN_PRE_FAULT_NS <= fault_rel <= r.end_ns - r.start_ns:
            # a level to come back to; not before what the fault lost was repaired (metrics.recovery)
            rec = metrics.recovery(r.timeline, fault_rel, completed,
                                   settled_ns=metrics.repaired_ns(figures, fault_rel)).to_dict()
            if ref and figures is not None:
                rec["noise_band"] = metrics.noise_band([(int(t * 1e6), b) for t, b in ref["timeline"]], fault_rel)
        entry["recovery"] = rec
        entry["fault_figures"] = figures
        entry["fault_shares"] = [x for fr in runs if (x := _fault_share(transport, topo, fr, entry, r.src, r.dst))]
        # resends of packets that had arrived (the responder placed them twice), and EVs marked
        # ASSUMED_BAD that no fault crossed: neither is a network event
        entry["spurious_retransmits"] = r.responder.get("stats", {}).get("duplicates", 0)
        crossed = set().union(*(_failed_evs(transport, topo, fr, r.src, r.dst) or set() for fr in runs)) if topo else set()
        entry["false_ev_events"] = false_ev_events(r.ev_events, crossed)
        entry["slowdown"] = (round(r.completion_ms / ref["completion_ms"], 3)
                             if ref and ref.get("completion_ms") and r.completion_ms else None)
        transfers.append(entry)
    main = [t for t in transfers if not t["label"].startswith("competing")]
    recoveries = [t["recovery"]["recovery_ms"] for t in main if t["recovery"] and t["recovery"]["recovery_ms"] is not None]
    unrecovered = any(t["recovery"] and t["recovery"]["recovery_ms"] is None for t in main)
    completions = [t["completion_ms"] for t in main if t["completion_ms"] is not None]
    total_bytes = sum(t["size"] for t in main)
    false_events = sum(t["false_ev_events"] for t in transfers)
    span = max(completions) if completions and len(completions) == len(main) else None
    hit = [t["fault_figures"] for t in main if t["fault_figures"]]
    fault = None
    if hit:
        fault = {"detection_ms": metrics.worst([f["detection_ms"] for f in hit]), "stall_ms": metrics.worst([f["stall_ms"] for f in hit]),
                 "repair_ms": metrics.worst([f["repair_ms"] for f in hit]), "transfers_through_it": len(hit),
                 "stall_noise_ms": metrics.worst([f.get("stall_noise_ms") for f in hit])}
    ref_span = reference.get("completion_ms") if reference else None
    slowdowns = sorted(t["slowdown"] for t in transfers if t["slowdown"] is not None)
    return {
        "transport": transport.value,
        "ok": all(t["ok"] for t in transfers),
        "verified": all(t["verified"] for t in transfers),
        "completion_ms": span,
        "goodput_gbps": round(total_bytes * 8 / (span * 1e6), 3) if span else None,
        "recovery_ms": None if unrecovered or not recoveries else max(recoveries),
        "unrecovered": unrecovered,  # recovery_ms None and this False: nothing to measure (no fault mid-run)
        "faults": [fr.to_dict() for fr in runs],
        # exact, from the requesters' records: the worst over the WRITEs through the fault (None: never)
        "fault_figures": fault,
        "reference": None if reference is None else {"completion_ms": ref_span, "goodput_gbps": reference["goodput_gbps"],
                                                     "verified": reference["verified"],
                                                     "emulation": reference["emulation"]["verdict"]},
        "inflation": round(span / ref_span - 1, 4) if span and ref_span else None,  # completion against fault-free
        "slowdown": {"p50": percentile(slowdowns, 50), "p99": percentile(slowdowns, 99),
                     "max": max(slowdowns)} if slowdowns else None,
        "transfers": transfers,
        "pcap": pcap,
        "flows": congestion.flows(list(results)),  # per-flow figures: FCT percentiles, fairness, timeouts
        "spurious_retransmits": sum(t["spurious_retransmits"] for t in transfers),
        "packets_sent": sum(t["requester"]["stats"].get("packets_sent", 0) for t in transfers),
        "false_ev_events": false_events,
        "emulation": _with_false_events(results.emulation.to_dict(), false_events),
        # NSCC's base RTT, when the run measured it (the topology gives none): runtime/base_rtt.py
        "base_rtt": None if results.base_rtt is None else results.base_rtt.to_dict(),
    }


def false_ev_events(ev_events: list[dict[str, Any]], crossed: set[int]) -> int:
    """EV events that marked ASSUMED_BAD an EV outside `crossed` (the EVs some fault of the run
    crossed); an EV the controller allows again starts ASSUMED_BAD (from DENIED): not counted."""
    return sum(1 for e in ev_events if e["new"] == "ASSUMED_BAD" and e["old"] != "DENIED" and e["ev"] not in crossed)


def _with_false_events(emulation: dict[str, Any], false_events: int) -> dict[str, Any]:
    """A run in which an EV no fault crossed was marked ASSUMED_BAD published a path failure that
    did not happen: whatever caused it (reordering, a late datagram, a deferred timer), the run
    is never faithful, and says why."""
    if false_events:
        emulation["verdict"] = "emulator-bound"
        emulation["reasons"] = [*emulation["reasons"], f"{false_events} EV event(s) marked ASSUMED_BAD an EV that no "
                                "fault crossed: a path failure that did not happen (docs/transport.md, Reordering)"]
    return emulation


# ---- the whole scenario ------------------------------------------------------------------------

def run(scn: Scenario, out_dir: Path, progress: Progress = _quiet,
        on_bytes: Callable[[str], Callable[[int, int], None] | None] | None = None) -> dict[str, Any]:
    """Build a fabric for the scenario, run each transport, tear down; return results.json's data."""
    out_dir.mkdir(parents=True, exist_ok=True)
    name = "s" + uuid.uuid4().hex[:6]
    started = time.time()
    results: dict[str, Any] = {"schema": "mrc-emu/results/1", "scenario": scn.to_dict(), "fabric": name,
                               "started_unix": round(started, 3), "runs": {}, "notes": []}
    for i, reason in skipped_faults(scn).items():  # said before anything is made
        results["notes"].append(f"fault {scn.faults[i].describe()} skipped: {reason}")
        progress(results["notes"][-1])
    progress(f"bringing up fabric '{name}' ({scn.topology.name})")
    build.up(scn.topology, name)
    try:
        with Fabric.open(name) as fabric:
            _run_transports(scn, fabric, list(scn.transports), results, out_dir, progress, on_bytes)
    finally:
        progress(f"taking fabric '{name}' down")
        build.down(name)
    results["seconds"] = round(time.time() - started, 2)
    return results


def _run_transports(scn: Scenario, fabric: Fabric, transports: list[Transport], results: dict[str, Any],
                    out_dir: Path, progress: Progress,
                    on_bytes: Callable[[str], Callable[[int, int], None] | None] | None) -> None:
    """Routing, the baseline's path, then each transport in turn, on a running fabric."""
    notes = results["notes"]
    if scn.routing == "bgp":
        reason = routing.frr_missing()
        if reason:
            skipped = [t.value for t in transports if t.needs_routing]
            notes.append(f"{reason}. Without BGP there is no route repair and no plain IPv6 routing: "
                         f"the {', '.join(skipped) or 'baseline'} is skipped.")
            transports = [t for t in transports if not t.needs_routing]
            progress(notes[-1])
        else:
            progress("starting FRR (BGP" + (" + BFD" if scn.bfd else "") + ") in every switch")
            results["bgp_converged_s"] = round(routing.start(fabric, bfd=scn.bfd, progress=progress,
                                                             dilation=scn.time_dilation), 2)
    elif scn.routing == "static":
        progress("installing the static routes BGP would converge to")
        results["static_routes_s"] = round(static_routes.install(fabric), 3)
        if scn.faults and any(t.needs_routing for t in transports):
            notes.append("routing: static repairs nothing: after a fault the baseline keeps only what each "
                         "kernel does alone (a dead local nexthop leaves its ECMP route); use routing: bgp "
                         "to measure repair")
    baseline_link = None
    if any(f.link == "baseline-path" for f in scn.faults):
        src, dst, _ = scn.transfers()[0]
        seen: dict[str, tuple[str, str]] = {}
        baseline_link, note = baseline_path(scn.topology, src, dst, transports,
                                            lambda: observe_baseline_path(fabric, src, dst, scn.mtu, seen),
                                            "seen in the leaves' packet counters")
        if seen:  # the flow's leaf uplink and its ACKs' (on dst's side), as measured
            results["baseline_uplinks"] = {side: list(link) for side, link in seen.items()}
        notes.append(note)
        progress(note)
    for transport in transports:
        reference = None
        if scn.faults and scn.reference:  # the same workloads fault-free, just before: what the fault cost
            progress(f"{transport}: the workloads without faults first (the reference run)")
            reference = run_transport(replace(scn, faults=[], capture=False), fabric, transport, None, out_dir, progress)
        results["runs"][transport.value] = run_transport(scn, fabric, transport, baseline_link, out_dir, progress,
                                                         on_bytes(transport.value) if on_bytes else None,
                                                         reference=reference)
        if scn.capture:
            capture_run(scn, fabric, transport, baseline_link, out_dir, progress, results)


CAPTURE_DILATION_STEPS = 3  # the captured run at K, 2K, 4K at most (K: the scenario's time dilation)


def capture_run(scn: Scenario, fabric: Fabric, transport: Transport, baseline_link: tuple[str, str] | None,
                out_dir: Path, progress: Progress, results: dict[str, Any]) -> None:
    """The transport's pcap, from a second run of the same scenario made only for it: tcpdump
    shares the CPUs with the endpoints, so the measured run is never the captured one. Whole
    packets (a cut one is malformed to Wireshark's RoCE dissector), the whole run: the fault and
    the recovery are in it.

    Since it only makes the pcap, it may run slower: its ring holds the whole run (ops.ring_kib_for),
    and while a capture loses packets it is made again at twice the time dilation and twice the
    ring, up to CAPTURE_DILATION_STEPS runs (on a shaped fabric a higher K slows the wall-clock
    packet rate; on an unshaped one the endpoints send as fast as the CPUs let them at any K, and
    the ring is what keeps up: docs/results.md, Pcaps). A capture still lossy after the last step
    is a warning in the notes, not a failed run. Its counts, the K and ring of each attempt and its
    own completion go into the measured run's "capture"."""
    host = scn.transfers()[0][0]
    expected = sum(n for s, d, n in scn.transfers() if host in (s, d))
    ring = ops.ring_kib_for(expected)
    dilation = scn.time_dilation
    attempts: list[dict[str, Any]] = []
    for step in range(CAPTURE_DILATION_STEPS):
        progress(f"{transport}: the same again at time dilation {dilation:g}, captured to {transport}.pcap with a "
                 f"{ring // 1024} MiB ring (the figures are the uncaptured run's)")
        again = run_transport(replace(scn, time_dilation=dilation), fabric, transport, baseline_link, out_dir,
                              progress, pcap=out_dir / f"{transport}.pcap", ring_kib=ring)
        attempts.append({"time_dilation": dilation, "ring_kib": ring, "lost": again["capture"]["lost"],
                         "packets": again["capture"]["packets"]})
        if again["capture"]["complete"] or step == CAPTURE_DILATION_STEPS - 1:
            break
        progress(f"{transport}: {again['capture']['problem']}: again, slower")
        dilation, expected = dilation * 2, expected * 2
        ring = ops.ring_kib_for(expected)
    capture = {**again["capture"], "run": "separate", "host": host, "time_dilation": dilation, "ring_kib": ring,
               "attempts": attempts, "completion_ms": again["completion_ms"], "verified": again["verified"]}
    run = results["runs"][transport.value]
    run["pcap"], run["capture"] = capture["path"], capture
    if capture["problem"]:
        results["notes"].append(f"{transport}'s pcap is INCOMPLETE after {len(attempts)} captured run(s) up to time "
                                f"dilation {dilation:g}: {capture['problem']}")
        progress(results["notes"][-1])

