#!/usr/bin/env python3
"""Run every benchmark of the project and write one JSON with every figure and ratio.

Usage: sudo .venv/bin/python scripts/bench.py [OUT.json] [--only fabric,wire,transport,scale,virtual,demo] [--demo-runs N]
                                              [--busy N]

Each benchmark script runs in its own process, one after the other (they build fabrics and
must not share the 2 cores), and prints one JSON object; this script collects them with the
targets and whether each was met. Every ratio inside a script is measured side by side in
that script's own run. The demo runs three times (or --demo-runs), each with its fault-free
reference runs: detection, stall, repair, completion inflation and the windowed recovery per
transport, each as a median and a spread over the runs, no run dropped; a demo that exits
non-zero is recorded as a failed run, with its stderr's last line, and the next runs go on.
`--busy N` starts N CPU-bound processes of its own beside the benchmarks (a busy machine, as a
user's may be) and ends exactly those when it is done.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path

from mrc_emu.experiments.analysis import metrics

HERE = Path(__file__).resolve().parent
SCRIPTS = {
    "fabric": ["bench_fabric.py", "large", "huge"],
    "wire": ["bench_wire.py"],
    "transport": ["bench_transport.py"],
    "scale": ["bench_scale.py"],
    "virtual": ["bench_virtual.py", "64"],  # no root; docs/virtual.md
}


DEMO_RUNS = 3  # at least 3 (issue 14)
FIGURES = ("detection_ms", "stall_ms", "repair_ms", "inflation", "windowed_recovery_ms")


def demo(runs_wanted: int = DEMO_RUNS) -> dict:
    """The demo N times. Each run makes its own fault-free reference per transport (the same
    invocation), so every figure is paired; across runs each figure is reported with its median
    and spread, every run counted (metrics.across_runs: a never is a value, not a gap). Targets:
    MRC's stall under 2 ms in every run, the baseline's at least 1 s in every run, every run
    exits 0 with a complete pcap of each transport."""
    runs, failed = [], []
    print(f"bench: demo x{runs_wanted} ...", file=sys.stderr, flush=True)
    for i in range(runs_wanted):
        done = subprocess.run([sys.executable, "-m", "mrc_emu.cli", "demo", "--json", "--out", f"/tmp/mrc-emu-bench-demo-{i}"],
                              capture_output=True, text=True)
        stderr_tail = done.stderr.strip().splitlines()[-1:] or [""]
        try:
            out = json.loads(done.stdout)
        except json.JSONDecodeError:
            failed.append({"run": i, "exit": done.returncode, "stderr": stderr_tail[0]})
            continue
        run = {"exit": done.returncode, "warnings": [line for line in done.stderr.splitlines()
                                                     if line.startswith("mrc-emu: warning:")]}
        for transport in ("mrc", "baseline"):
            r = out["runs"][transport]
            fig = r.get("fault_figures") or {}
            cap = r.get("capture") or {}
            run[transport] = {"detection_ms": fig.get("detection_ms"), "stall_ms": fig.get("stall_ms"),
                              "repair_ms": fig.get("repair_ms"), "inflation": r.get("inflation"),
                              "windowed_recovery_ms": r.get("recovery_ms"), "verified": r["verified"],
                              "emulation": r["emulation"]["verdict"], "pcap_complete": cap.get("complete"),
                              "pcap_lost": cap.get("lost"), "pcap_time_dilation": cap.get("time_dilation"),
                              "ev_event_reasons": sorted({e["reason"] for t in r["transfers"] for e in t["ev_events"]})}
        if done.returncode != 0:
            failed.append({"run": i, "exit": done.returncode, "stderr": stderr_tail[0]})
        runs.append(run)
        print(f"bench: demo {i + 1}/{runs_wanted}: exit {done.returncode}, MRC stall {run['mrc']['stall_ms']} ms, "
              f"baseline stall {run['baseline']['stall_ms']} ms, pcaps complete "
              f"{run['mrc']['pcap_complete']}/{run['baseline']['pcap_complete']}", file=sys.stderr, flush=True)
    across = {t: {k: metrics.across_runs([r[t][k] for r in runs]) for k in FIGURES} for t in ("mrc", "baseline")}
    mrc_stalls = [r["mrc"]["stall_ms"] for r in runs]
    base_stalls = [r["baseline"]["stall_ms"] for r in runs]
    return {"runs": runs, "failed": failed, "across_runs": across,
            "targets": {"every_run_exits_0": not failed and len(runs) == runs_wanted,
                        "every_pcap_complete": all(r[t]["pcap_complete"] for r in runs for t in ("mrc", "baseline")),
                        "mrc_stall_under_2_ms_each": all(s is not None and s < 2 for s in mrc_stalls),
                        "baseline_stall_at_least_1_s_each": all(s is None or s >= 1000 for s in base_stalls)}}


@contextlib.contextmanager
def busy(count: int):
    """`count` CPU-bound processes of this script's own for as long as the block runs; exactly
    those are ended after it (by the Popen objects held here, never by name)."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for proc in spinners:
            proc.kill()
            proc.wait()


def run(name: str, argv: list[str]) -> dict:
    began = time.monotonic()
    print(f"bench: {name} ...", file=sys.stderr, flush=True)
    done = subprocess.run([sys.executable, str(HERE / argv[0]), *argv[1:]], capture_output=True, text=True)
    seconds = round(time.monotonic() - began, 1)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1:] or ["failed"], "seconds": seconds}
    out = json.loads(done.stdout[done.stdout.index("{"):])
    out["seconds"] = seconds
    return out


def headline(results: dict) -> dict:
    """The figures the issues set targets for, each with its target and whether it was met."""
    rows = {}

    def add(key: str, value, target, better: str) -> None:
        met = None if value is None else (value >= target if better == "higher" else value <= target)
        rows[key] = {"value": value, "target": target, "met": met}

    fabric, wire, transport = results.get("fabric", {}), results.get("wire", {}), results.get("transport", {})
    large, huge = fabric.get("large", {}), fabric.get("huge", {})
    add("fabric_up_s", large.get("up_s"), 5.0, "lower")
    add("fabric_down_s", large.get("down_s"), 5.0, "lower")
    add("fabric_huge_up_s", huge.get("up_s"), 30.0, "lower")
    add("fabric_huge_down_s", huge.get("down_s"), 5.0, "lower")
    add("wire_fast_to_ceiling", wire.get("ratio_fast_to_ceiling"), 0.8, "higher")
    add("wire_decoder_pps", wire.get("decoder_pps"), 200_000, "higher")
    goodput, scale = transport.get("goodput", {}), results.get("scale", {}).get("targets", {})
    add("transport_goodput_to_ceiling", goodput.get("ratio_goodput_to_ceiling"), 0.9, "higher")
    add("transport_goodput_to_strict_ceiling", goodput.get("ratio_goodput_to_strict_ceiling"), 0.7, "higher")
    add("transport_recovery_ms", transport.get("recovery", {}).get("recovery_ms_median"), 5.0, "lower")
    add("transport_plane_aggregation", transport.get("plane_aggregation", {}).get("ratio_to_planes_x_rate"), 0.9,
        "higher")
    add("scale_goodput_128_qps_to_best", scale.get("goodput_128_to_best", {}).get("value"), 0.8, "higher")
    add("scale_retransmit_ratio_max", scale.get("retransmit_ratio_max", {}).get("value"), 0.01, "lower")
    add("scale_ev_events_without_fault", scale.get("ev_events_total", {}).get("value"), 0, "lower")
    demo_runs = results.get("demo", {}).get("across_runs", {})
    add("demo_mrc_stall_ms_max", demo_runs.get("mrc", {}).get("stall_ms", {}).get("max"), 2.0, "lower")
    add("demo_baseline_stall_ms_min", demo_runs.get("baseline", {}).get("stall_ms", {}).get("min"), 1000.0, "higher")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?", default="bench-results.json", help="the JSON to write (default: %(default)s)")
    parser.add_argument("--only", default=",".join([*SCRIPTS, "demo"]),
                        help="which benchmarks, comma-separated (default: all: %(default)s)")
    parser.add_argument("--demo-runs", type=int, default=DEMO_RUNS, help="runs of the demo (default: %(default)s, at least 3)")
    parser.add_argument("--busy", type=int, default=0, metavar="N",
                        help="N CPU-bound processes beside the benchmarks, a busy machine (default: none)")
    args = parser.parse_args()
    only = args.only.split(",")
    if unknown := [x for x in only if x not in SCRIPTS and x != "demo"]:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)}: choose from {', '.join([*SCRIPTS, 'demo'])}")
    if args.demo_runs < 3:
        parser.error("--demo-runs: at least 3, so that a median and a spread mean something")
    if args.busy < 0:
        parser.error("--busy: a count of processes, 0 or more")
    out = Path(args.out)
    with busy(args.busy):
        results = {name: run(name, argv) for name, argv in SCRIPTS.items() if name in only}
        if "demo" in only:
            results["demo"] = demo(args.demo_runs)
    results["busy_processes"] = args.busy
    results["headline"] = headline(results)
    out.write_text(json.dumps(results, indent=2))
    for key, row in results["headline"].items():
        mark = {True: "met", False: "NOT met", None: "no figure"}[row["met"]]
        print(f"{key:<32} {row['value']!s:<12} target {row['target']:<10} {mark}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
