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
  model computes its unloaded RTT, and NSCC's window differs), and the model's QPs keep the
  emulated workers' guards against reordering (two witness probes, a 10 us reorder floor);
- the ports: every port a TBF with the same bucket (`port: {bucket}`, --bucket: one frame by
  default, the least TBF takes), which the model's ports let through as TBF does: a larger
  bucket passes bursts through idle ports at once, and no bucket (the model's default) makes
  every hop serialise what TBF passes at once (docs/virtual.md, Cross-validation);
- no reference runs and no pcaps (they double the emulated time and change nothing compared);
- the baseline's paths: the emulated run resolves `baseline-path` first and measures the uplinks
  its flow and the flow's ACKs take (the kernel's hash, seen in the leaves' counters), and the
  model's ECMP salt is the first under which its flow and ACKs take the same two (the hashes
  differ: the kernel's jhash with a boot key, the model's mixed, salted CRC), so the fault hits
  the same link in both and MRC's EV events fall on the same EVs;
- the workload sizes, scaled by --scale (the emulated runs are CPU-heavy on 2 shared cores).

Prints a markdown table per figure, then docs/virtual.md's (a row per scenario and transport),
and writes the JSON of every figure to --out.
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
from mrc_emu.topology import Role, builtin
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


def _topology_file(name: str, rate_bps: float, base_rtt: str, bucket: str, folder: Path) -> Path:
    """The topology both clocks run: the built-in one with a link rate, a base RTT and TBF's bucket given."""
    topo = builtin(name)
    data = topo.to_dict()
    if topo.link_rate_bps is None:
        data["link_rate"] = f"{rate_bps / 1e3:.12g}kbit"
    data["base_rtt"] = base_rtt
    if bucket != "default":  # "frame": the least TBF takes (tbf_shape raises it to a whole frame)
        data["port"] = {**(data.get("port") or {}), "bucket": 1 if bucket == "frame" else bucket}
    data["name"] = f"{name}-compare"
    path = folder / f"{name}-compare.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _scaled(size: str | int, scale: float) -> str:
    from mrc_emu.topology.units import parse_size

    return f"{max(4096, int(parse_size(size) * scale) // 4096 * 4096)}B"


def prepare(name: str, args: argparse.Namespace, folder: Path) -> scenario.Scenario:
    data = _scenario_data(name)
    data["topology"] = str(_topology_file(data.get("topology", "default"), args.rate, args.base_rtt, args.bucket, folder))
    for workload in data["workloads"]:
        workload["size"] = _scaled(workload.get("size", "16MiB"), args.scale)
    for fault in data.get("faults") or []:
        fault.pop("duration_ms", None) if fault.get("kind") == "blackhole" else None  # in force to the end in both
    data.update(reference=False, capture=False, time_dilation=args.dilation, timeout_s=600)
    return scenario.from_dict(data, f"{name} (compare)")


def figures(results: dict, topo) -> dict:
    """Per transport, what the table compares."""
    out = {}
    for transport, run in results["runs"].items():
        ports = [c for ifaces in (run.get("ports") or {}).values() for c in ifaces.values()]
        bottleneck = max(ports, key=lambda c: (c.get("queue_p99") or 0, c["packets"]), default={})
        ff = run.get("fault_figures") or {}
        evs = sorted({(t["label"], e["ev"]) for t in run["transfers"] for e in t["ev_events"] if e["new"] == "ASSUMED_BAD"})
        began = [e["began_ms"] for f in run["faults"] for e in f.get("events", []) if "began_ms" in e][:1]
        out[transport] = {
            "verified": run["verified"], "goodput_gbps": run["goodput_gbps"], "completion_ms": run["completion_ms"],
            "detection_ms": ff.get("detection_ms"), "stall_ms": ff.get("stall_ms"), "repair_ms": ff.get("repair_ms"),
            "queue_p50": bottleneck.get("queue_p50"), "queue_p99": bottleneck.get("queue_p99"),
            "ce_marked": sum(c["ce_marked"] for c in ports), "trimmed": sum(c["trimmed"] for c in ports),
            "ev_events_on": [f"{label} EV {ev}" for label, ev in evs],
            "false_ev_events": run.get("false_ev_events", 0),  # on EVs no fault crossed
            "fault_links": sorted({"-".join(f["link"]) for f in run["faults"] if f.get("link")}),
            "fault_at_ms": began[0] if began else None,  # when the (first) fault came into force
            "uplink": _uplinks(run.get("ports") or {}, topo),
            "verdict": None if run.get("clock") == "virtual" else run["emulation"]["verdict"],
            "emulation_reasons": [] if run.get("clock") == "virtual" else run["emulation"]["reasons"],
        }
    return out


def _uplinks(ports: dict, topo) -> str:
    """The leaf-to-spine ports that carried the most packets in the run (the baseline's one flow:
    its path as the leaves' port counters show it)."""
    peers = {(node, intf): peer for link in topo.links for node, intf, peer in
             ((link.a, link.a_intf, link.b), (link.b, link.b_intf, link.a))}
    used = sorted(((c["packets"], f"{node}-{peers[(node, ifname)]}") for node, ifaces in ports.items()
                   for ifname, c in ifaces.items() if topo.node(node).role is Role.LEAF
                   and topo.node(peers[(node, ifname)]).role is Role.SPINE and c["packets"]), reverse=True)
    return used[0][1] if used else "-"


ROWS = ("goodput_gbps", "completion_ms", "fault_at_ms", "detection_ms", "stall_ms", "repair_ms", "queue_p50",
        "queue_p99", "ce_marked", "trimmed")


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
            lines.append(f"| {name} | {transport} | busiest leaf uplink | {virt['uplink']} | {emu.get('uplink', '-')} | |")
            lines.append(f"| {name} | {transport} | EV events on (false) | {', '.join(virt['ev_events_on']) or 'none'} "
                         f"({virt['false_ev_events']}) | {', '.join(emu.get('ev_events_on', [])) or 'none'} "
                         f"({emu.get('false_ev_events', '-')}) | {agree} |")
            lines.append(f"| {name} | {transport} | verified / emulation | {virt['verified']} | "
                         f"{emu.get('verified')} / {emu.get('verdict')} | |")
    return "\n".join(lines)


def _pair(v, e, digits: int = 3) -> str:
    if v is None and e is None:
        return "- / -"
    ratio = f" ({v / e:.2f})" if isinstance(v, (int, float)) and isinstance(e, (int, float)) and e else ""
    return f"{_cell(v)} / {_cell(e)}{ratio}"


def doc_table(compared: dict) -> str:
    """One row per scenario and transport, `virtual / emulated (ratio)`: docs/virtual.md's table."""
    lines = ["| scenario | transport | goodput Gbit/s | completion ms | fault at ms | detection ms | stall ms | "
             "repair ms | queue p50/p99 KB | CE | trims | faulted link | EV events | emulated |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    kb = lambda c: "-" if c.get("queue_p50") is None else f"{c['queue_p50'] // 1000}/{c['queue_p99'] // 1000}"  # noqa: E731
    for name, entry in compared.items():
        for transport, virt in entry["virtual"].items():
            emu = entry["emulated"].get(transport, {})
            cells = [_pair(virt.get(k), emu.get(k)) for k in ("goodput_gbps", "completion_ms", "fault_at_ms",
                                                              "detection_ms", "stall_ms", "repair_ms")]
            links = f"{', '.join(virt['fault_links']) or '-'} / {', '.join(emu.get('fault_links', [])) or '-'}"
            events = f"{', '.join(virt['ev_events_on']) or 'none'} / {', '.join(emu.get('ev_events_on', [])) or 'none'}"
            lines.append(f"| {name} | {transport} | {' | '.join(cells)} | {kb(virt)} / {kb(emu) if emu else '-'} | "
                         f"{virt['ce_marked']} / {emu.get('ce_marked', '-')} | {virt['trimmed']} / {emu.get('trimmed', '-')} | "
                         f"{links} | {events} | {emu.get('verdict') or '-'} |")
    return "\n".join(lines)


def matching_salt(scn: scenario.Scenario, seed: int, uplinks: dict, tries: int = 1024) -> int | None:
    """The first ECMP salt under which the model's baseline flow takes the emulated run's leaf
    uplinks (`uplinks`: its "data" link and, if seen, its ACKs' "acks" link), or None."""
    want = {side: tuple(link) for side, link in uplinks.items()}
    for salt in range(tries):
        seen: dict = {}
        virtual_run.baseline_link(scn, seed, salt, seen)
        if all(seen.get(side) == link for side, link in want.items()):
            return salt
    return None


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
    parser.add_argument("--bucket", default="frame",
                        help="TBF's bucket on every port of both: frame (the least, one frame), a size, or default "
                             "(the emulator's 4 MTU or 1 ms of the rate; the model then serialises every frame)")
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
            emu = {"runs": {}, "notes": []} if args.virtual_only else runner.run(
                scn, folder / f"{name}-emulated", lambda line: print(f"  .. {line}", flush=True))
            emulated_s = time.perf_counter() - began
            salt = None  # the seed's: the model resolves baseline-path by its own hash
            uplinks = emu.get("baseline_uplinks")
            if uplinks:
                salt = matching_salt(scn, args.seed, uplinks)
                print(f"{name}: the emulated baseline flow's leaf uplinks {uplinks}; the model's ECMP salt {salt}",
                      flush=True)
            began = time.perf_counter()
            virt = virtual_run.run(scn, folder / f"{name}-virtual", args.seed, emulator_guards=True, ecmp_seed=salt)
            virtual_s = time.perf_counter() - began
            for clock, results in (("virtual", virt), ("emulated", emu)):
                if results["runs"]:
                    report.write(results, folder / f"{name}-{clock}")  # results.json, report.md, plots
            compared[name] = {"virtual": figures(virt, scn.topology), "emulated": figures(emu, scn.topology),
                              "ecmp_salt": salt, "baseline_uplinks": {"virtual": virt.get("baseline_uplinks"),
                                                                      "emulated": uplinks},
                              "wall_s": {"virtual": round(virtual_s, 1), "emulated": round(emulated_s, 1)},
                              "notes": {"virtual": virt["notes"], "emulated": emu["notes"]}}
            print(f"{name}: virtual {virtual_s:.1f} s, emulated {emulated_s:.1f} s of wall time", flush=True)
    settings = {"rate_bps": args.rate, "base_rtt": args.base_rtt, "dilation": args.dilation, "scale": args.scale,
                "seed": args.seed, "bucket": args.bucket, "load": os.getloadavg(),
                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    Path(args.out).write_text(json.dumps({"settings": settings, "scenarios": compared}, indent=1))
    print(json.dumps(settings))
    print(table(compared))
    print()
    print(doc_table(compared))
