#!/usr/bin/env python3
"""RED against the port model: the same incast run once with each of the two ways a shaped fabric's
switch ports mark (the BPF port program's virtual queue, `port: {model: bpf}`; the kernel's RED
qdisc with ECN under the same TBF, `model: red`, fabric/datapath/red.py), printed side by side. Needs root;
the RED half needs sch_red (a stock kernel, the Vagrant VM) and is skipped, saying why, without it.

Usage: sudo .venv/bin/python scripts/bench_red.py [--scenario incast8] [--transports mrc]
       [--models bpf,red] [--red-burst N] [--bpf-trim] [--sample-ms 1] [--dilation K] [--json FILE]

The workload, topology, MTU and time dilation are the scenario's (default incast8: 8 hosts WRITE
2 MiB each to h0 over the `incast` fabric, 400 Mbit/s links, K = 4). Both runs use the topology's
port block with trimming off (RED cannot trim; `--bpf-trim` keeps it in the BPF run) and the same
thresholds: RED limit = buffer, min = kmin, max = kmax, probability = pmax, ecn, and by default an
averaging weight of 1 (Wlog 0: the queue each arrival finds, as the program uses); `--red-burst N`
gives RED its classic EWMA instead (iproute2's Wlog for a burst of N packets).

Per run and bottleneck port (DST's leaves' ports towards it, one per plane): CE marks (the
program's count, or RED's `marked` from `tc -s qdisc`), drops (the program's, or RED's early +
pdrop + other), the queue its arrivals found (the program's histogram: in the RED run it is an
observer with marking off, beside RED), the real backlog sampled every --sample-ms by a forked
child (TBF's, all of the port's queue; and RED's own, its class's), the bottleneck's utilisation
(TBF's sent bytes against the link rate over the incast), and the flows' completion (FCT, Jain,
timeouts, retransmits) with the emulation verdict. Prints the table on stdout (progress on stderr);
--json also writes every figure. Traffic stays inside the fabric's namespaces.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import select
import socket
import sys
import time

from mrc_emu.experiments.analysis import congestion
from mrc_emu.experiments.runtime.transfer import run_transfers
from mrc_emu.experiments.scenarios import scenario
from mrc_emu.experiments.scenarios.transports import Transport
from mrc_emu.fabric import build, static_routes
from mrc_emu.fabric.datapath import ports, red
from mrc_emu.fabric.kernel import netlink, netns
from mrc_emu.fabric.running import Fabric
from mrc_emu.stats import percentile
from mrc_emu.topology import Topology, from_dict
from mrc_emu.topology.port import with_model


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def topology_for(scn, model: str, trim: bool, burst: int | None) -> Topology:
    block = with_model(scn.topology.ports.raw, model)
    if not trim:
        block["trim"] = "off"
    if model == "red" and burst is not None:
        block["red"] = {"burst": burst}
    return from_dict({**scn.topology.to_dict(), "port": block}, f"<bench_red {model}>")


def bottleneck(topo: Topology, dst: str) -> list[tuple[str, str]]:
    """(node, interface) of every port towards `dst`: one per plane, on its leaves."""
    return [(peer, peer_intf) for link in topo.links_of(dst) for peer, _, peer_intf in [topo.peer(link, dst)]]


def summary(values: list[int]) -> dict:
    """Percentiles of a sampled backlog over the samples that found it busy (the sampler runs from
    before the workers start until after they end, idle most of that time), its maximum, and the
    fraction of samples that found it busy."""
    busy = sorted(x for x in values if x)
    return {"samples": len(values), "busy": round(len(busy) / len(values), 3) if values else None,
            "p50": percentile(busy, 50), "p99": percentile(busy, 99),
            "max": busy[-1] if busy else 0}


class BacklogSampler:
    """A forked child that reads the ports' qdisc backlogs (one netlink dump per port and qdisc
    kind, about 0.2 ms each) every `period_s` until stopped, then hands back their percentiles. A
    child, not a thread: a thread would share the GIL with this process's loop."""

    def __init__(self, fabric: Fabric, where: list[tuple[str, str]], kinds: list[str], period_s: float) -> None:
        indexes = {(p.node, p.ifname): i for served in ports.served_by_node(fabric.topology).values() for p, i in served}
        socks = []
        for node, ifname in where:
            with netns.entered(fabric.netns(node)):
                sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
            sock.bind((0, 0))
            socks.append((f"{node}:{ifname}", sock, indexes[(node, ifname)]))
        stop_r, self._stop_w = os.pipe()
        self._out_r, out_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # the child: sample, then write the summary and leave
            os.close(self._stop_w)
            os.close(self._out_r)
            series: dict[str, list[int]] = {f"{port}:{kind}": [] for port, _, _ in socks for kind in kinds}
            while not select.select([stop_r], [], [], 0)[0]:
                for port, sock, index in socks:
                    for kind in kinds:
                        series[f"{port}:{kind}"].append(netlink.qdisc_counters(sock, index, kind)[1])
                time.sleep(period_s)
            data = json.dumps({key: summary(values) for key, values in series.items()}).encode()
            while data:
                data = data[os.write(out_w, data):]
            os._exit(0)
        os.close(stop_r)
        os.close(out_w)
        for _, sock, _ in socks:
            sock.close()

    def stop(self) -> dict:
        os.close(self._stop_w)
        chunks = []
        while chunk := os.read(self._out_r, 65536):
            chunks.append(chunk)
        os.close(self._out_r)
        os.waitpid(self.pid, 0)
        return json.loads(b"".join(chunks) or b"{}")


def point(fabric: Fabric, scn, transport: Transport, model: str, period_s: float) -> dict:
    topo = fabric.topology
    transfers = scn.transfers()
    specs = [transport.spec(s, d, n, scn.mtu, label=f"{s}->{d}", topology=topo) for s, d, n in transfers]
    where = bottleneck(topo, transfers[0][1])
    before = ports.counters(fabric)
    tbf_before = {p: ports.tbf_counters_of(fabric, *p)[0] for p in where}
    red_before = {p: red.red_counters(fabric, *p) for p in where} if model == "red" else {}
    kinds = ["tbf", "red"] if model == "red" else ["tbf"]
    sampler = BacklogSampler(fabric, where, kinds, period_s) if period_s > 0 else None
    try:
        run = run_transfers(fabric, specs, dilation=scn.time_dilation)
    finally:
        sampled = sampler.stop() if sampler is not None else {}
    delta = ports.delta(before, ports.counters(fabric))
    span = max(r.end_ns for r in run) - min(r.start_ns for r in run)  # the transport's (emulated) clock
    per_port = {}
    for node, intf in where:
        program = delta[node][intf]
        tbf_sent = ports.tbf_counters_of(fabric, node, intf)[0] - tbf_before[(node, intf)]
        entry = {"utilisation": congestion.port_utilisation(tbf_sent, span, topo.link_rate_bps),
                 "tbf_sent_bytes": tbf_sent,
                 "program": {k: program[k] for k in ("packets", "bytes", "ce_marked", "trimmed", "dropped")}
                 | {"queue_p50": program["queue_p50"], "queue_p99": program["queue_p99"], "queue_max": program["max_queue"]},
                 "tbf_backlog": sampled.get(f"{node}:{intf}:tbf")}
        if model == "red":
            now = red.red_counters(fabric, node, intf)
            was = red_before[(node, intf)]
            entry["red"] = {k: now[k] - was[k] for k in ("marked", "early", "pdrop", "other", "sent_bytes", "sent_packets")}
            entry["red_backlog"] = sampled.get(f"{node}:{intf}:red")
            entry["ce_marked"] = entry["red"]["marked"]
            entry["dropped"] = entry["red"]["early"] + entry["red"]["pdrop"] + entry["red"]["other"]
        else:
            entry["ce_marked"], entry["dropped"] = program["ce_marked"], program["dropped"]
        per_port[f"{node}:{intf}"] = entry
    emu = run.emulation
    return {"model": model, "transport": transport.value, "cc": specs[0].cc, **congestion.flows(list(run)),
            "bottleneck_utilisation": congestion.bottleneck_utilisation(per_port), "bottleneck": per_port,
            "emulation": {"verdict": emu.verdict, "reasons": emu.reasons}}


def run_model(scn, model: str, transports: list[Transport], args) -> list[dict]:
    topo = topology_for(scn, model, args.bpf_trim and model == "bpf", args.red_burst)
    name = f"red{model[0]}{os.getpid() % 10000}"
    began = time.monotonic()
    build.up(topo, name)
    log(f"{topo.name} up as {name!r} with port model {model} in {time.monotonic() - began:.1f} s")
    out = []
    try:
        with Fabric.open(name) as fabric:
            if Transport.BASELINE in transports:
                static_routes.install(fabric)
            if model == "red":
                node, intf = bottleneck(topo, scn.transfers()[0][1])[0]
                port = next(p for p in topo.egress_ports() if (p.node, p.ifname) == (node, intf))
                log("  " + red.red_params(port, topo.ports.red_avpkt, topo.ports.red_burst).tc_line(intf))
            for transport in transports:
                log(f"  {scn.name} workload, {transport.value}, port model {model} ...")
                p = point(fabric, scn, transport, model, args.sample_ms / 1000)
                log(f"  {p['verified']}/{p['flows']} verified, utilisation {p['bottleneck_utilisation']}, "
                    f"FCT p99 {p['fct_ms']['p99']} ms, {p['emulation']['verdict']}")
                out.append(p)
    finally:
        build.down(name)
    return out


def _per_port(point: dict, get) -> str:
    return " / ".join("-" if (v := get(e)) is None else f"{v:,}" if isinstance(v, int) else str(v)
                      for e in point["bottleneck"].values())


def _kb(entry: dict | None, key: str):
    return None if not entry or entry.get(key) is None else round(entry[key] / 1000, 1)


ROWS = [
    ("verified", lambda p: f"{p['verified']}/{p['flows']}"),
    ("utilisation (TBF sent / rate, mean of ports)", lambda p: p["bottleneck_utilisation"]),
    ("utilisation per port", lambda p: _per_port(p, lambda e: e["utilisation"])),
    ("CE marks per port", lambda p: _per_port(p, lambda e: e["ce_marked"])),
    ("drops per port", lambda p: _per_port(p, lambda e: e["dropped"])),
    ("queue at arrival p50 / p99 KB (program)",
     lambda p: _per_port(p, lambda e: f"{_kb(e['program'], 'queue_p50')}/{_kb(e['program'], 'queue_p99')}")),
    ("TBF backlog sampled while busy p50 / p99 / max KB",
     lambda p: _per_port(p, lambda e: f"{_kb(e['tbf_backlog'], 'p50')}/{_kb(e['tbf_backlog'], 'p99')}/"
                                      f"{_kb(e['tbf_backlog'], 'max')}")),
    ("RED backlog sampled while busy p50 / p99 / max KB",
     lambda p: _per_port(p, lambda e: f"{_kb(e.get('red_backlog'), 'p50')}/{_kb(e.get('red_backlog'), 'p99')}/"
                                      f"{_kb(e.get('red_backlog'), 'max')}") if p["model"] == "red" else "-"),
    ("FCT p50 / p99 ms", lambda p: f"{p['fct_ms']['p50']} / {p['fct_ms']['p99']}"),
    ("Jain", lambda p: p["jain"]),
    ("ACK timeouts / retransmits", lambda p: f"{p['timeouts']} / {p['retransmits']:,}"),
    ("emulation", lambda p: p["emulation"]["verdict"]),
]


def table(points: list[dict], skipped: dict[str, str], transports: list[Transport], models: list[str]) -> str:
    columns = [(t.value, m) for t in transports for m in models]
    header = ["", *(f"{t} / {m}" for t, m in columns)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for label, get in ROWS:
        cells = []
        for transport, model in columns:
            found = [p for p in points if (p["transport"], p["model"]) == (transport, model)]
            cells.append(str(get(found[0])) if found else "skipped")
        lines.append("| " + " | ".join([label, *cells]) + " |")
    lines += [f"\n{m}: skipped: {reason}" for m, reason in skipped.items()]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--scenario", default="incast8", help="the scenario whose workload runs (default incast8)")
    parser.add_argument("--transports", default="mrc", help="which to run (default mrc; mrc,baseline for both)")
    parser.add_argument("--models", default="bpf,red", help="port models, in order (default bpf,red)")
    parser.add_argument("--red-burst", type=int, default=None, help="RED's burst in packets (its EWMA); default: Wlog 0")
    parser.add_argument("--bpf-trim", action="store_true", help="keep trimming on in the BPF run (RED has none)")
    parser.add_argument("--sample-ms", type=float, default=1.0, help="backlog sampling period (default 1 ms; 0: none)")
    parser.add_argument("--dilation", type=float, default=None, help="time dilation K (default: the scenario's)")
    parser.add_argument("--json", default=None, help="also write every figure to this file")
    args = parser.parse_args()
    try:
        transports = [Transport(x) for x in args.transports.split(",")]
        models = args.models.split(",")
        scn = scenario.load(args.scenario)
    except (ValueError, scenario.ScenarioError) as exc:
        parser.error(str(exc))
    if args.dilation is not None:
        scn = dataclasses.replace(scn, time_dilation=args.dilation)
    if bad := [m for m in models if m not in ("bpf", "red")]:
        parser.error(f"unknown port model {bad[0]!r} (bpf, red)")
    if not scn.topology.link_rate_bps:
        parser.error(f"scenario {scn.name}: topology {scn.topology.name} has no link_rate: no queue to compare")
    skipped = {}
    if "red" in models and (reason := red.red_missing()):
        skipped["red"] = reason
        log(f"bench_red.py: the RED run is skipped: {reason}")
    points = []
    for model in models:
        if model not in skipped:
            points += run_model(scn, model, transports, args)
    print(f"{scn.name}: {len(scn.transfers())} WRITEs into {scn.transfers()[0][1]}, "
          f"{scn.topology.link_rate_bps / 1e6:g} Mbit/s links, K = {scn.time_dilation:g}, trimming "
          f"{'on in the BPF run' if args.bpf_trim else 'off'}, RED "
          f"{'burst ' + str(args.red_burst) if args.red_burst else 'Wlog 0 (instantaneous)'}; per port: plane 0 / plane 1\n")
    print(table(points, skipped, transports, models))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"scenario": scn.name, "red_burst": args.red_burst, "bpf_trim": args.bpf_trim,
                       "skipped": skipped, "points": points}, f, indent=2)


if __name__ == "__main__":
    main()
