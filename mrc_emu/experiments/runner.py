"""Run a scenario: fabric, routing, each transport in turn, the fault schedule, the results.

Why it exists: `mrc-emu run` and `mrc-emu demo` do what a user would do by hand (bring a
fabric up, start BGP, run the workloads with MRC, fail a link, repair it, run them again
with the baseline, tear down) and measure it the same way every time. Faults are carried
out by a fault agent (a child process, timed exactly); each fault is reversible and
reverted before the next transport runs; every fault lands in the timeline.
"""

from __future__ import annotations

import select
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyroute2 import IPRoute

from ..fabric import build, netns, ops, routing, static_routes
from ..topology import Role, Topology, evs_between
from ..topology.evs import EvFormat
from ..transport.config import QpConfig
from . import metrics
from .fault_agent import LinkFaultAgent
from .scenario import Fault, Scenario
from .transfer import Control, TransferResult, TransferSpec, run_transfers

Progress = Callable[[str], None]
MIN_PRE_FAULT_NS = 20_000_000  # a fault earlier than this has no pre-fault level: no recovery time
PCAP_PACKETS = 4000  # the first packets of each run (about 17 MB): tcpdump at full rate would steal a core


def _quiet(_: str) -> None:
    pass


@dataclass
class FaultRun:
    """One fault as carried out: what, where, and when (ns since the run's first transfer began)."""

    fault: Fault
    link: tuple[str, str] | None
    events: list[dict[str, Any]] = field(default_factory=list)  # {"action", "began_ms", "returned_ms"}

    def to_dict(self) -> dict:
        return {"kind": self.fault.kind, "description": self.fault.describe(),
                "link": list(self.link) if self.link else None, "node": self.fault.node,
                "host": self.fault.host, "plane": self.fault.plane, "at_progress": self.fault.at,
                "events": self.events}


# ---- the baseline's path ---------------------------------------------------------------------

def _tx_counts(name: str, node: str) -> dict[str, int]:
    with netns.entered(netns.netns_path(name, node)), IPRoute() as ipr:
        return {link.get("ifname"): link.get("stats64").get("tx_packets") if link.get("stats64") else 0
                for link in ipr.get_links()}


def observe_baseline_path(name: str, topo: Topology, src: str, dst: str, mtu: int) -> tuple[str, str]:
    """The leaf-spine link the baseline's flow from src to dst crosses, measured: packet counters
    of every leaf uplink on src's side before and after a short transfer with the same 5-tuple."""
    leaves = [topo.leaf_of(src, p) for p in range(topo.planes)]
    before = {leaf: _tx_counts(name, leaf) for leaf in leaves}
    run_transfers(name, [_spec("baseline", src, dst, 2 * 2**20, mtu)])
    best, best_delta = None, -1
    for leaf in leaves:
        after = _tx_counts(name, leaf)
        for link in topo.links_of(leaf):
            peer, intf, _ = topo.peer(link, leaf)
            if topo.node(peer).role is not Role.SPINE:
                continue
            delta = after.get(intf, 0) - before[leaf].get(intf, 0)
            if delta > best_delta:
                best, best_delta = (leaf, peer), delta
    if best is None or best_delta < 100:
        raise RuntimeError(f"could not see the baseline's path from {src} to {dst} in the leaves' counters")
    return best


# ---- transports --------------------------------------------------------------------------------

def _spec(transport: str, src: str, dst: str, size: int, mtu: int, evs: list[int] | None = None,
          start_at: float | None = None, label: str = "") -> TransferSpec:
    if transport == "baseline":
        return TransferSpec(src, dst, size, [0], EvFormat.UDP, QpConfig.baseline(mtu=mtu), "nscc", label=label,
                            start_at=start_at)
    return TransferSpec(src, dst, size, evs, EvFormat.SRV6, QpConfig(mtu=mtu), "nscc", label=label,
                        start_at=start_at)


def _competing(topo: Topology, transport: str, fault: Fault, link: tuple[str, str], mtu: int) -> list[TransferSpec]:
    """Congestion: `flows` extra WRITEs between host pairs whose EVs cross the link, pinned to those EVs."""
    out = []
    hosts = [h.name for h in topo.hosts]
    for a in hosts:
        for b in hosts:
            if a == b or len(out) >= fault.flows:
                continue
            crossing = [ev.index for ev in evs_between(topo, a, b) if ev.crosses(*link)]
            if crossing:
                out.append(_spec("mrc", a, b, fault.size, mtu, crossing, start_at=fault.at,
                                 label=f"competing flow {a}->{b} over {'-'.join(link)}"))
    if not out:
        raise RuntimeError(f"no host pair has an EV over {'-'.join(link)} for competing flows")
    return out


# ---- faults --------------------------------------------------------------------------------

def _wait_ms(ms: float) -> None:
    """The fault schedule's own clock: a flap's half period, a reboot's downtime."""
    select.select([], [], [], ms / 1000)


def _agent_for(name: str, topo: Topology, fault: Fault, link: tuple[str, str] | None) -> LinkFaultAgent | None:
    kind = fault.kind
    if kind == "congestion":
        return None
    if kind in ("link-down", "flap", "loss", "blackhole"):
        a, b = link
    elif kind == "plane-down":
        a, b = fault.host, topo.leaf_of(fault.host, fault.plane)
    else:  # switch-reboot: the agent's own link is any of the switch's, the action takes them all
        a = fault.node
        b = topo.peer(topo.links_of(a)[0], a)[0]
    (edge,) = topo.links_between(a, b)
    _, ia, _ = topo.peer(edge, a)  # a's interface on that link

    def restore_link() -> None:
        build.set_link(name, a, b, True)

    def flap() -> None:
        for _ in range(fault.count):
            with netns.entered(netns.netns_path(name, a)), IPRoute() as ipr:
                (index,) = ipr.link_lookup(ifname=ia)
                ipr.link("set", index=index, state="down")
            _wait_ms(fault.period_ms / 2)
            build.set_link(name, a, b, True)
            _wait_ms(fault.period_ms / 2)

    def reboot_down() -> None:
        for link in topo.links_of(fault.node):
            _, intf, _ = topo.peer(link, fault.node)
            with netns.entered(netns.netns_path(name, fault.node)), IPRoute() as ipr:
                (index,) = ipr.link_lookup(ifname=intf)
                ipr.link("set", index=index, state="down")

    def reboot_up() -> None:
        for link in topo.links_of(fault.node):
            build.set_link(name, fault.node, topo.peer(link, fault.node)[0], True)

    actions = {"restore": restore_link, "flap": flap, "reboot-down": reboot_down, "reboot-up": reboot_up}
    return LinkFaultAgent(name, a, b, extra=actions)


_APPLY = {"link-down": "down", "plane-down": "down", "flap": "flap", "loss": "xdp:{fraction}", "blackhole": "xdp:1",
          "switch-reboot": "reboot-down"}
_REVERT = {"link-down": "restore", "plane-down": "restore", "flap": None, "loss": "xdp-off", "blackhole": "xdp-off",
           "switch-reboot": "reboot-up"}


# ---- one transport -------------------------------------------------------------------------

def run_transport(scn: Scenario, name: str, transport: str, baseline_link: tuple[str, str] | None,
                  out_dir: Path, progress: Progress = _quiet,
                  on_bytes: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    topo = scn.topology
    specs = [_spec(transport, s, d, n, scn.mtu, label=f"{s}->{d}") for s, d, n in scn.transfers()]
    runs: list[FaultRun] = []
    agents: list[tuple[FaultRun, LinkFaultAgent | None]] = []
    control = Control()
    try:
        for fault in scn.faults:
            link = baseline_link if fault.link == "baseline-path" else fault.link
            fr = FaultRun(fault, link if isinstance(link, tuple) else None)
            runs.append(fr)
            if fault.kind == "congestion":
                specs += _competing(topo, transport, fault, link, scn.mtu)
                agents.append((fr, None))
                continue
            agent = _agent_for(name, topo, fault, fr.link)
            agents.append((fr, agent))
            control.hooks.append((fault.at, _trigger(agent, fault)))
        control.hooks.sort(key=lambda h: h[0])
        capture = None
        if scn.capture:
            capture = ops.Capture(name, scn.transfers()[0][0], str(out_dir / f"{transport}.pcap"), snaplen=0,
                                  count=PCAP_PACKETS)
        progress(f"{transport}: {len(specs)} WRITE(s), faults: {', '.join(f.describe() for f in scn.faults) or 'none'}")
        try:
            results = run_transfers(name, specs, control, on_bytes, linger_s=3.0 if transport == "mrc" else 0.0,
                                    timeout_s=scn.timeout_s)
        finally:
            if capture is not None:
                capture.stop()
        # each fault's timeline, then revert what is still applied
        for fr, agent in agents:
            if agent is None:
                fr.events.append({"action": "competing flows start", "at_progress": fr.fault.at})
                continue
            for action, began, returned in _drain(agent):
                fr.events.append({"action": action, "began_ns": began, "returned_ns": returned})
            revert = _REVERT[fr.fault.kind]
            if revert and not any(e["action"] == revert for e in fr.events):
                agent.trigger(revert)
                action, began, returned = agent.wait(60)
                fr.events.append({"action": action, "began_ns": began, "returned_ns": returned})
    finally:
        for _, agent in agents:
            if agent is not None:
                agent.close()
    if scn.routing == "bgp" and routing.frr_missing() is None:
        routing.wait_converged(name, topo, 60)  # the next run starts on a repaired fabric
    return _summarise(transport, results, runs, str(capture.path) if scn.capture and capture else None)


def _trigger(agent: LinkFaultAgent, fault: Fault):
    apply, revert = _APPLY[fault.kind].format(fraction=fault.percent / 100), _REVERT[fault.kind]

    def fire() -> None:
        agent.trigger(apply)
        if fault.duration_ms and revert:
            agent.trigger(f"after:{fault.duration_ms}:{revert}")

    return fire


def _drain(agent: LinkFaultAgent) -> list[tuple[str, int, int]]:
    out = []
    while agent.pending():
        out.append(agent.wait(60))
    return out


def _summarise(transport: str, results: list[TransferResult], runs: list[FaultRun], pcap: str | None) -> dict:
    origin = min(r.start_ns for r in results)
    for fr in runs:
        for e in fr.events:
            if "began_ns" in e:
                e["began_ms"] = round((e.pop("began_ns") - origin) / 1e6, 3)
                e["returned_ms"] = round((e.pop("returned_ns") - origin) / 1e6, 3)
    first_fault = next((e["began_ms"] for fr in runs for e in fr.events if "began_ms" in e), None)
    transfers = []
    for r in results:
        entry = r.to_dict()
        entry["timeline"] = [[round(t / 1e6, 3), b] for t, b in r.timeline]
        entry["ev_timeline"] = [[round(t / 1e6, 3), sent, got] for t, sent, got in r.ev_timeline]
        entry["offset_ms"] = round((r.start_ns - origin) / 1e6, 3)
        rec = None
        if first_fault is not None and r.timeline:
            fault_rel = int((first_fault - entry["offset_ms"]) * 1e6)
            if MIN_PRE_FAULT_NS <= fault_rel <= r.end_ns - r.start_ns:  # a level to come back to
                completed = None if r.completion_ms is None else int(r.completion_ms * 1e6)
                rec = metrics.recovery(r.timeline, fault_rel, completed).to_dict()
        entry["recovery"] = rec
        transfers.append(entry)
    main = [t for t in transfers if not t["label"].startswith("competing")]
    recoveries = [t["recovery"]["recovery_ms"] for t in main if t["recovery"] and t["recovery"]["recovery_ms"] is not None]
    unrecovered = any(t["recovery"] and t["recovery"]["recovery_ms"] is None for t in main)
    completions = [t["completion_ms"] for t in main if t["completion_ms"] is not None]
    total_bytes = sum(t["size"] for t in main)
    span = max(completions) if completions and len(completions) == len(main) else None
    return {
        "transport": transport,
        "ok": all(t["ok"] for t in transfers),
        "verified": all(t["verified"] for t in transfers),
        "completion_ms": span,
        "goodput_gbps": round(total_bytes * 8 / (span * 1e6), 3) if span else None,
        "recovery_ms": None if unrecovered or not recoveries else max(recoveries),
        "unrecovered": unrecovered,  # recovery_ms None and this False: nothing to measure (no fault mid-run)
        "faults": [fr.to_dict() for fr in runs],
        "transfers": transfers,
        "pcap": pcap,
    }


# ---- the whole scenario ------------------------------------------------------------------------

def run(scn: Scenario, out_dir: Path, progress: Progress = _quiet,
        on_bytes: Callable[[str], Callable[[int, int], None] | None] | None = None) -> dict[str, Any]:
    """Build a fabric for the scenario, run each transport, tear down; return results.json's data."""
    out_dir.mkdir(parents=True, exist_ok=True)
    name = "s" + uuid.uuid4().hex[:6]
    notes: list[str] = []
    transports = list(scn.transports)
    started = time.time()
    results: dict[str, Any] = {"schema": "mrc-emu/results/1", "scenario": scn.to_dict(), "fabric": name,
                               "started_unix": round(started, 3), "runs": {}, "notes": notes}
    progress(f"bringing up fabric '{name}' ({scn.topology.name})")
    build.up(scn.topology, name)
    try:
        if scn.routing == "bgp":
            reason = routing.frr_missing()
            if reason:
                notes.append(f"{reason}. Without BGP there is no route repair and no plain IPv6 routing: "
                             f"the baseline is skipped.")
                transports = [t for t in transports if t != "baseline"]
                progress(notes[-1])
            else:
                progress("starting FRR (BGP" + (" + BFD" if scn.bfd else "") + ") in every switch")
                seconds = routing.start(name, bfd=scn.bfd, progress=progress)
                results["bgp_converged_s"] = round(seconds, 2)
        elif scn.routing == "static":
            progress("installing the static routes BGP would converge to")
            results["static_routes_s"] = round(static_routes.install(name, scn.topology), 3)
            if scn.faults and "baseline" in transports:
                notes.append("routing: static repairs nothing: after a fault the baseline keeps only what each "
                             "kernel does alone (a dead local nexthop leaves its ECMP route); use routing: bgp "
                             "to measure repair")
        baseline_link = None
        if any(f.link == "baseline-path" for f in scn.faults):
            src, dst, _ = scn.transfers()[0]
            if "baseline" in transports:
                baseline_link = observe_baseline_path(name, scn.topology, src, dst, scn.mtu)
                notes.append(f"the baseline's flow {src}->{dst} crosses {baseline_link[0]}-{baseline_link[1]} "
                             f"(seen in the leaves' packet counters); the fault hits that link")
            else:
                ev = evs_between(scn.topology, src, dst)[0]
                baseline_link = (ev.hops[1], ev.hops[2])
                notes.append(f"no baseline run: 'baseline-path' falls back to EV 0's link {baseline_link[0]}-{baseline_link[1]}")
            progress(notes[-1])
        for transport in transports:
            results["runs"][transport] = run_transport(scn, name, transport, baseline_link, out_dir, progress,
                                                       on_bytes(transport) if on_bytes else None)
    finally:
        progress(f"taking fabric '{name}' down")
        build.down(name)
    results["seconds"] = round(time.time() - started, 2)
    mrc, base = results["runs"].get("mrc"), results["runs"].get("baseline")
    if mrc and base and mrc["recovery_ms"] is not None:
        b = base["recovery_ms"]
        results["recovery_ratio"] = None if b is None else round(b / max(mrc["recovery_ms"], 0.1), 1)
    return results
