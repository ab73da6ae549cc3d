#!/usr/bin/env python3
"""Run every benchmark of the project and write one JSON with every figure and ratio.

Usage: sudo .venv/bin/python scripts/bench.py [OUT.json]   (default: bench-results.json)

Each benchmark script runs in its own process, one after the other (they build fabrics and
must not share the 2 cores), and prints one JSON object; this script collects them with the
targets and whether each was met. Every ratio inside a script is measured side by side in
that script's own run.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPTS = {
    "fabric": ["bench_fabric.py", "large"],
    "wire": ["bench_wire.py"],
    "transport": ["bench_transport.py"],
}


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
    add("fabric_up_s", fabric.get("mrc_emu_up_s"), 10.0, "lower")
    add("fabric_down_s", fabric.get("mrc_emu_down_s"), 5.0, "lower")
    add("wire_fast_to_ceiling", wire.get("ratio_fast_to_ceiling"), 0.8, "higher")
    add("wire_decoder_pps", wire.get("decoder_pps"), 200_000, "higher")
    add("transport_goodput_to_ceiling", transport.get("goodput", {}).get("ratio_goodput_to_ceiling"), 0.5, "higher")
    add("transport_recovery_ms", transport.get("recovery", {}).get("recovery_ms_median"), 5.0, "lower")
    add("transport_plane_aggregation", transport.get("plane_aggregation", {}).get("ratio_to_planes_x_rate"), 0.9,
        "higher")
    return rows


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "bench-results.json")
    results = {name: run(name, argv) for name, argv in SCRIPTS.items()}
    results["headline"] = headline(results)
    out.write_text(json.dumps(results, indent=2))
    for key, row in results["headline"].items():
        mark = {True: "met", False: "NOT met", None: "no figure"}[row["met"]]
        print(f"{key:<32} {row['value']!s:<12} target {row['target']:<10} {mark}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
