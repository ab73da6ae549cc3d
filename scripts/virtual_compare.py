"""Cross-validation of virtual time against the namespace emulation: the same scenarios both ways.

`bench_virtual.py compare` (root: the emulated runs build fabrics). For each scenario (demo,
incast8, link-down and a 16-host ring on `incast`), the same scenario is run with `--clock
virtual` and on the namespace fabric at a time dilation at which the emulator is faithful, and
the figures are printed side by side with their ratio (virtual / emulated): goodput,
completion, detection, stall, repair, the bottleneck port's queue p50/p99, CE marks and trims,
and which EVs had EV events. What is held equal so that the two are comparable:

- the link rate: an unshaped topology (`default`) runs at CPU speed on the namespace fabric,
  which is no rate a model can have, so both clocks get the topology with `link_rate`
  (--rate, 1 Gbit/s by default; `incast` keeps its 400 Mbit/s);
- the QPs' configuration: both are told the same base RTT (the topology's `base_rtt`, 1 ms:
  otherwise the emulated run measures its idle loop, endpoints' CPU time included, and the
  model computes its unloaded RTT, and NSCC's window differs);
- no reference runs and no pcaps (they double the emulated time and change nothing compared);
- not the ECMP hash: `baseline-path` is the link the baseline's flow takes in each, the kernel's
  jhash there, the model's CRC there (docs/virtual.md), so the demo's and link-down's fault may
  hit another link, and MRC's EV events fall on another EV: the table names each run's faulted
  link and says whether every EV event was on an EV through it (false EV events: none);
- the workload sizes, scaled by --scale (the emulated runs are CPU-heavy on 2 shared cores).

Prints a markdown table and writes the JSON of every figure to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import yaml

from mrc_emu.experiments.analysis import report
from mrc_emu.experiments.scenarios import runner, scenario, virtual_run
from mrc_emu.topology import builtin
from mrc_emu.topology.units import parse_rate

SCENARIOS = ("demo", "incast8", "link-down", "ring16")
RING16 = {"name": "ring16", "description": "Ring all-reduce over 16 hosts of incast; p0l1-p0s0 goes down at 30 %.",
          "topology": "incast", "transports": ["mrc"], "routing": "none",
          "workloads": [{"kind": "ring-allreduce", "hosts": [f"h{i}" for i in range(16)], "size": "2MiB"}],
          "faults": [{"kind": "link-down", "link": ["p0l1", "p0s0"], "at": 0.3}]}


def _scenario_data(name: str) -> dict:
    if name == "ring16":
        return json.loads(json.dumps(RING16))
    data, _ = scenario.read_yaml(scenario.SCENARIO_DIR / f"{name}.yaml", "scenario", scenario.ScenarioError)
    return data


def _topology_file(name: str, rate_bps: float, base_rtt: str, folder: Path) -> Path:
    """The topology both clocks run: the built-in one with a link rate and a base RTT given."""
    topo = builtin(name)
    data = topo.to_dict()
    if topo.link_rate_bps is None:
        data["link_rate"] = f"{rate_bps / 1e3:.12g}kbit"
    data["base_rtt"] = base_rtt
    data["name"] = f"{name}-compare"
    path = folder / f"{name}-compare.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _scaled(size: str | int, scale: float) -> str:
    from mrc_emu.topology.units import parse_size

    return f"{max(4096, int(parse_size(size) * scale) // 4096 * 4096)}B"


def prepare(name: str, args: argparse.Namespace, folder: Path) -> scenario.Scenario:
    data = _scenario_data(name)
    data["topology"] = str(_topology_file(data.get("topology", "default"), args.rate, args.base_rtt, folder))
    for workload in data["workloads"]:
        workload["size"] = _scaled(workload.get("size", "16MiB"), args.scale)
    for fault in data.get("faults") or []:
        fault.pop("duration_ms", None) if fault.get("kind") == "blackhole" else None  # in force to the end in both
    data.update(reference=False, capture=False, time_dilation=args.dilation, timeout_s=600)
    return scenario.from_dict(data, f"{name} (compare)")


def figures(results: dict) -> dict:
    """Per transport, what the table compares."""
    out = {}
    for transport, run in results["runs"].items():
        ports = [c for ifaces in (run.get("ports") or {}).values() for c in ifaces.values()]
        bottleneck = max(ports, key=lambda c: (c.get("queue_p99") or 0, c["packets"]), default={})
        ff = run.get("fault_figures") or {}
        evs = sorted({(t["label"], e["ev"]) for t in run["transfers"] for e in t["ev_events"] if e["new"] == "ASSUMED_BAD"})
        out[transport] = {
            "verified": run["verified"], "goodput_gbps": run["goodput_gbps"], "completion_ms": run["completion_ms"],
            "detection_ms": ff.get("detection_ms"), "stall_ms": ff.get("stall_ms"), "repair_ms": ff.get("repair_ms"),
            "queue_p50": bottleneck.get("queue_p50"), "queue_p99": bottleneck.get("queue_p99"),
            "ce_marked": sum(c["ce_marked"] for c in ports), "trimmed": sum(c["trimmed"] for c in ports),
            "ev_events_on": [f"{label} EV {ev}" for label, ev in evs],
            "false_ev_events": run.get("false_ev_events", 0),  # on EVs no fault crossed
            "fault_links": sorted({"-".join(f["link"]) for f in run["faults"] if f.get("link")}),
            "verdict": None if run.get("clock") == "virtual" else run["emulation"]["verdict"],
            "emulation_reasons": [] if run.get("clock") == "virtual" else run["emulation"]["reasons"],
        }
    return out


ROWS = ("goodput_gbps", "completion_ms", "detection_ms", "stall_ms", "repair_ms", "queue_p50", "queue_p99",
        "ce_marked", "trimmed")


def _cell(value) -> str:
    if value is None:
        return "-"
    return f"{value:,.3f}".rstrip("0").rstrip(".") if isinstance(value, float) else f"{value:,}"


def table(compared: dict) -> str:
    lines = ["| scenario | transport | figure | virtual | emulated | ratio |", "|---|---|---|---|---|---|"]
    for name, entry in compared.items():
        for transport, virt in entry["virtual"].items():
            emu = entry["emulated"].get(transport, {})
            for row in ROWS:
                v, e = virt.get(row), emu.get(row)
                ratio = f"{v / e:.2f}" if isinstance(v, (int, float)) and isinstance(e, (int, float)) and e else "-"
                lines.append(f"| {name} | {transport} | {row} | {_cell(v)} | {_cell(e)} | {ratio} |")
            if virt["ev_events_on"] == emu.get("ev_events_on"):
                agree = "same"
            elif not virt["false_ev_events"] and emu and not emu["false_ev_events"]:
                agree = "each only on EVs through its fault"
            else:
                agree = "differ"
            lines.append(f"| {name} | {transport} | faulted link | {', '.join(virt['fault_links']) or '-'} | "
                         f"{', '.join(emu.get('fault_links', [])) or '-'} | |")
            lines.append(f"| {name} | {transport} | EV events on (false) | {', '.join(virt['ev_events_on']) or 'none'} "
                         f"({virt['false_ev_events']}) | {', '.join(emu.get('ev_events_on', [])) or 'none'} "
                         f"({emu.get('false_ev_events', '-')}) | {agree} |")
            lines.append(f"| {name} | {transport} | verified / emulation | {virt['verified']} | "
                         f"{emu.get('verified')} / {emu.get('verdict')} | |")
    return "\n".join(lines)


def compare_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench_virtual.py compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=",".join(SCENARIOS), help=f"of {', '.join(SCENARIOS)}")
    parser.add_argument("--rate", default="1gbit", help="link rate of an unshaped topology (default 1gbit)")
    parser.add_argument("--base-rtt", default="1ms", help="the base RTT both clocks tell the QPs (default 1ms)")
    parser.add_argument("--dilation", type=float, default=4.0, help="the emulated runs' time dilation (default 4)")
    parser.add_argument("--scale", type=float, default=0.25, help="workload sizes x this (default 0.25)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default="virtual-compare.json")
    parser.add_argument("--virtual-only", action="store_true", help="only the virtual runs (no root needed)")
    parser.add_argument("--keep", default=None, help="a folder to keep every run's results.json and report in")
    args = parser.parse_args(argv)
    args.rate = parse_rate(args.rate)
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario {unknown[0]!r} (known: {', '.join(SCENARIOS)})")
    compared = {}
    with tempfile.TemporaryDirectory(prefix="vcompare-") as tmp:
        folder = Path(args.keep or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        for name in names:
            scn = prepare(name, args, folder)
            began = time.perf_counter()
            virt = virtual_run.run(scn, folder / f"{name}-virtual", args.seed)
            virtual_s = time.perf_counter() - began
            began = time.perf_counter()
            emu = {"runs": {}, "notes": []} if args.virtual_only else runner.run(
                scn, folder / f"{name}-emulated", lambda line: print(f"  .. {line}", flush=True))
            emulated_s = time.perf_counter() - began
            for clock, results in (("virtual", virt), ("emulated", emu)):
                if results["runs"]:
                    report.write(results, folder / f"{name}-{clock}")  # results.json, report.md, plots
            compared[name] = {"virtual": figures(virt), "emulated": figures(emu),
                              "wall_s": {"virtual": round(virtual_s, 1), "emulated": round(emulated_s, 1)},
                              "notes": {"virtual": virt["notes"], "emulated": emu["notes"]}}
            print(f"{name}: virtual {virtual_s:.1f} s, emulated {emulated_s:.1f} s of wall time", flush=True)
    settings = {"rate_bps": args.rate, "base_rtt": args.base_rtt, "dilation": args.dilation, "scale": args.scale,
                "seed": args.seed, "load": os.getloadavg()[0]}
    Path(args.out).write_text(json.dumps({"settings": settings, "scenarios": compared}, indent=1))
    print(json.dumps(settings))
    print(table(compared))
