#!/usr/bin/env python3
"""Congestion benchmark: incasts of degree 2..16 into one host, MRC/NSCC against baseline/DCQCN,
side by side in one run. Needs root.

Usage: sudo .venv/bin/python scripts/bench_congestion.py [--degrees 2,4,8,16] [--size-mib 2]
       [--trim] [--transports mrc,baseline] [--dilation K]

Brings up the `incast` topology (every link shaped to 400 Mbit/s by TBF, ECN marking and trimming
on every switch port by the fabric's egress BPF programs, fabric/datapath/ports.py) with static routes for
the baseline, then for each degree N: N hosts on the other leaves each WRITE `size` to h0 at once,
first over MRC (sprayed over every EV, selective repeat, NSCC), then over the baseline (one
ECMP-hashed path per QP, go-back-N, DCQCN with CNPs from the responder). `--trim` turns ECN off
and makes the buffers shallow, so the fabric trims instead of marking.

For each point and transport: WRITEs verified; bottleneck utilisation (the bytes TBF sent from
leaf 0 towards h0, each plane's port against 400 Mbit/s over the span of the incast, the mean of
the ports: congestion.port_utilisation, as bench_red.py); queue p50/p99 and max at those ports (from the BPF histogram: an upper estimate),
over the whole point and after start-up (the first STARTUP of the bytes), with the share of arrivals trimmed after it;
CE marks, trims and drops there; Jain fairness of the flows' goodput; FCT p50/p99/max; ACK
timeouts, retransmits, trim NACKs and CNPs; the emulation verdict; and, per bottleneck port, the
bytes TBF sent against the bytes the port program passed (equal when the virtual queue is charged
as TBF is; scripts/port_queue.py samples the two backlogs side by side). Prints one JSON object on
stdout; progress on stderr. Traffic stays inside the fabric's namespaces.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from mrc_emu.experiments.analysis import congestion
from mrc_emu.experiments.runtime.transfer import Control, Run, run_transfers
from mrc_emu.experiments.scenarios.transports import Transport
from mrc_emu.fabric import build, static_routes
from mrc_emu.fabric.running import Fabric
from mrc_emu.topology import Topology, builtin, from_dict

MiB = 1024 * 1024
MTU = 4096
DST = "h0"
TRIM_PORT = {"ecn": "off", "trim": {"threshold": "1bdp"}}  # --trim: the fabric trims instead of marking
# start-up: until this fraction of the bytes is acknowledged (NSCC starts every QP at MaxWnd, so the
# first round trip of an incast overfills the last hop); the ports' figures "after start-up" are
# counted from there. At degree 2 it is about 10 base RTTs, at 16 about 80.
STARTUP = 0.1


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def senders(topo: Topology, n: int) -> list[str]:
    """N hosts on leaves other than DST's, taken leaf by leaf so that every leaf sends alike."""
    dst_leaf = topo.leaf_of(DST, 0)
    by_leaf: dict[str, list[str]] = {}
    for host in topo.hosts:
        leaf = topo.leaf_of(host.name, 0)
        if leaf != dst_leaf:
            by_leaf.setdefault(leaf, []).append(host.name)
    order = [h for group in zip(*by_leaf.values()) for h in group]
    if n > len(order):
        raise SystemExit(f"bench_congestion.py: degree {n} needs {n} hosts off {dst_leaf}; the topology has {len(order)}")
    return order[:n]


def bottleneck(topo: Topology) -> list[tuple[str, str]]:
    """(node, interface) of every port towards DST: one per plane, on DST's leaves."""
    return [(peer, peer_intf) for link in topo.links_of(DST) for peer, _, peer_intf in [topo.peer(link, DST)]]


def steady_figures(counters: dict) -> dict:
    """A bottleneck port's figures after start-up: the queue its arrivals found (p50/p99, upper
    bucket edges), and the share of them trimmed. An arrival is trimmed when the queue it finds
    and its own length pass the trim threshold, so every arrival that found more than the
    threshold was trimmed: a trimmed share at most 1 % is an exact proof (no bucket edge in it)
    that the queue's p99 was at most the threshold."""
    packets, trimmed = counters.get("packets", 0), counters.get("trimmed", 0)
    return {"packets": packets, "ce_marked": counters.get("ce_marked", 0), "trimmed": trimmed,
            "trimmed_share": round(trimmed / packets, 4) if packets else None,
            "queue_bytes": {"p50": counters.get("queue_p50"), "p99": counters.get("queue_p99")},
            "kmax": counters["config"]["kmax"], "trim_threshold": counters["config"]["trim_threshold"]}


def point(fabric: Fabric, transport: Transport, hosts: list[str], size: int, ports_module, dilation: float) -> dict:
    topo = fabric.topology
    specs = []
    for src in hosts:
        spec = transport.spec(src, DST, size, MTU, label=f"{src}->{DST}", topology=topo)
        specs.append(spec)
    before = ports_module.counters(fabric)
    sent_before = {port: ports_module.tbf_counters_of(fabric, *port)[0] for port in bottleneck(topo)}
    startup: list = []  # the ports' counters when start-up ends
    control = Control(hooks=[(STARTUP, lambda: startup.append(ports_module.counters(fabric)))])
    run: Run = run_transfers(fabric, specs, control, dilation=dilation)
    after = ports_module.counters(fabric)
    sent_after = {port: ports_module.tbf_counters_of(fabric, *port)[0] for port in bottleneck(topo)}
    start, end = min(r.start_ns for r in run), max(r.end_ns for r in run)
    span = end - start  # the transport's (emulated) clock: bytes over it against the topology's rate
    delta = ports_module.delta(before, after)
    ports = {}
    for node, intf in bottleneck(topo):
        tbf_sent = sent_after[(node, intf)] - sent_before[(node, intf)]
        figures = congestion.port_figures(delta[node][intf], span, topo.link_rate_bps, tbf_sent)
        # the virtual queue is TBF's only if both were charged the same bytes (trimmed packets at
        # their trimmed length): what TBF sent against what the program passed, over the point
        figures["tbf_sent_bytes"] = tbf_sent
        figures["tbf_minus_program_bytes"] = figures["tbf_sent_bytes"] - delta[node][intf]["bytes"]
        if startup:
            figures["after_startup"] = steady_figures(ports_module.delta(startup[0], after)[node][intf])
        ports[f"{node}:{intf}"] = figures
    flows = congestion.flows(list(run))
    emu = run.emulation
    return {"transport": transport.value, "cc": specs[0].cc, "degree": len(hosts), **flows,
            "bottleneck_utilisation": congestion.bottleneck_utilisation(ports),
            "bottleneck": ports,
            # NSCC's base RTT: the fabric's idle loop measured before the WRITEs (the topology gives none)
            "base_rtt": None if run.base_rtt is None else run.base_rtt.to_dict(),
            "emulation": {"verdict": emu.verdict, "reasons": emu.reasons, "loop_lag_us": emu.loop_lag_us,
                          "cpu_busy": emu.cpu_busy}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--degrees", default="2,4,8,16", help="incast degrees, comma-separated (default 2,4,8,16)")
    parser.add_argument("--size-mib", type=float, default=2.0, help="bytes each sender WRITEs (default 2 MiB)")
    parser.add_argument("--trim", action="store_true", help="ECN off and shallow buffers: trimming instead of marking")
    parser.add_argument("--transports", default="mrc,baseline", help="which to run (default mrc,baseline)")
    parser.add_argument("--dilation", type=float, default=1.0,
                        help="time dilation K: links run at rate / K, the transport's clock K times slower (default 1)")
    args = parser.parse_args()
    try:
        degrees = [int(x) for x in args.degrees.split(",")]
        transports = [Transport(x) for x in args.transports.split(",")]
    except ValueError as exc:
        parser.error(str(exc))
    from mrc_emu.fabric.datapath import ports as ports_module  # the fabric's egress port programs (issue 12)

    topo = builtin("incast")
    if args.trim:
        topo = from_dict({**topo.to_dict(), "port": TRIM_PORT}, "<bench_congestion --trim>")
    name = f"bcg{os.getpid() % 100000}"
    began = time.monotonic()
    build.up(topo, name)
    log(f"{topo.name} up as {name!r} in {time.monotonic() - began:.1f} s")
    points = []
    try:
        with Fabric.open(name) as fabric:
            if Transport.BASELINE in transports:
                static_routes.install(fabric)
            for n in degrees:
                hosts = senders(topo, n)
                for transport in transports:
                    log(f"incast {n} -> {DST}, {transport.value} ...")
                    p = point(fabric, transport, hosts, int(args.size_mib * MiB), ports_module, args.dilation)
                    log(f"  {p['verified']}/{n} verified, utilisation {p['bottleneck_utilisation']}, Jain {p['jain']}, "
                        f"FCT p99 {p['fct_ms']['p99']} ms, timeouts {p['timeouts']}, {p['emulation']['verdict']}")
                    for port, figures in p["bottleneck"].items():
                        if "after_startup" in figures:
                            a = figures["after_startup"]
                            log(f"  {port} after start-up: queue p50/p99 {a['queue_bytes']['p50']}/{a['queue_bytes']['p99']} B "
                                f"(Kmax {a['kmax']}, trim threshold {a['trim_threshold']}), trimmed {a['trimmed']} of "
                                f"{a['packets']} ({a['trimmed_share']})")
                    if p["base_rtt"]:
                        log(f"  NSCC's base RTT: {p['base_rtt']['summary']}")
                    points.append(p)
    finally:
        build.down(name)
    print(json.dumps({"topology": topo.name, "link_rate_bps": topo.link_rate_bps, "mtu": MTU, "trim": args.trim,
                      "time_dilation": args.dilation,
                      "size_bytes": int(args.size_mib * MiB), "points": points}, indent=2))


if __name__ == "__main__":
    main()
