#!/usr/bin/env python3
"""Run every benchmark of the project and write one JSON with every figure and ratio.

Usage: sudo .venv/bin/python scripts/bench.py [OUT.json]   (default: bench-results.json)

Each benchmark script runs in its own process, one after the other (they build fabrics and
must not share the 2 cores), and prints one JSON object; this script collects them with the
targets and whether each was met. Every ratio inside a script is measured side by side in
that script's own run. The demo runs three times: its headline (MRC recovering at least 100x
faster than the BGP baseline) is a speed figure, so it is measured here, as a median.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPTS = {
    "fabric": ["bench_fabric.py", "large", "huge"],
    "wire": ["bench_wire.py"],
    "transport": ["bench_transport.py"],
    "scale": ["bench_scale.py"],
}


DEMO_RUNS = 3


def demo() -> dict:
    """The demo's headline, MRC's recovery against the BGP baseline's, as a median of runs."""
    runs = []
    print(f"bench: demo x{DEMO_RUNS} ...", file=sys.stderr, flush=True)
    for i in range(DEMO_RUNS):
        done = subprocess.run([sys.executable, "-m", "mrc_emu.cli", "demo", "--json", "--out", f"/tmp/mrc-emu-bench-demo-{i}"],
                              capture_output=True, text=True)
        if done.returncode != 0:
            return {"error": done.stderr.strip().splitlines()[-1:] or ["failed"], "runs": runs}
        out = json.loads(done.stdout)
        mrc, base = out["runs"]["mrc"]["recovery_ms"], out["runs"]["baseline"]["recovery_ms"]
        runs.append({"mrc_recovery_ms": mrc, "baseline_recovery_ms": base,
                     "ratio": None if mrc is None or base is None else round(base / max(mrc, 0.1), 1)})
    ratios = sorted(r["ratio"] for r in runs if r["ratio"] is not None)
    return {"runs": runs, "recovery_ratio_median": ratios[len(ratios) // 2] if ratios else None, "target": 100}


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
    add("demo_recovery_ratio_mrc_vs_baseline", results.get("demo", {}).get("recovery_ratio_median"), 100, "higher")
    return rows


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "bench-results.json")
    results = {name: run(name, argv) for name, argv in SCRIPTS.items()}
    results["demo"] = demo()
    results["headline"] = headline(results)
    out.write_text(json.dumps(results, indent=2))
    for key, row in results["headline"].items():
        mark = {True: "met", False: "NOT met", None: "no figure"}[row["met"]]
        print(f"{key:<32} {row['value']!s:<12} target {row['target']:<10} {mark}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
