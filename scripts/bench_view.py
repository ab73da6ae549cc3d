#!/usr/bin/env python3
"""What the live view costs: its update rate and its CPU while a WRITE runs (issue 28).

On a running fabric (`mrc-emu up -n NAME`, as root) this starts `mrc-emu view` on a free port,
reads its server-sent events (/api/events) as the page does, runs one `mrc-emu send SRC DST
--size SIZE`, and reports for the time the send ran: the states received per second, and the
view process's CPU time over the wall time (% of one core, from /proc/PID/stat), beside the
send's own goodput. --clients N reads the stream N times at once (one sample serves them all).

    sudo .venv/bin/python scripts/bench_view.py --name view1 --size 64MiB
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from mrc_emu.view.stream import read_events

MRC_EMU = str(Path(sys.executable).with_name("mrc-emu"))
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


class Reader(threading.Thread):
    """One SSE client: counts the `state` events and keeps their arrival times."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.times, self.last = url, [], None

    def run(self) -> None:
        for event, data in read_events(self.url + "api/events"):
            if event == "state":
                self.times.append(time.monotonic())
                self.last = data


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--name", default="mrc")
    parser.add_argument("--src", default="h0")
    parser.add_argument("--dst", default="h2")
    parser.add_argument("--size", default="64MiB")
    parser.add_argument("--interval", type=float, default=0.1, help="the view's --interval")
    parser.add_argument("--clients", type=int, default=1)
    args = parser.parse_args()
    view = subprocess.Popen([MRC_EMU, "view", "--name", args.name, "--port", "0", "--interval", str(args.interval),
                             "--read-only"], stdout=subprocess.PIPE, text=True)
    try:
        line = view.stdout.readline()  # "serving fabric 'x' on http://127.0.0.1:PORT/ (Ctrl-C stops)"
        if "http://" not in line:
            print(f"bench_view: the view did not start: {line.strip()}", file=sys.stderr)
            return 1
        url = line.split(" on ", 1)[1].split()[0]
        readers = [Reader(url) for _ in range(args.clients)]
        for reader in readers:
            reader.start()
        deadline = time.monotonic() + 30
        while not all(r.times for r in readers):  # every client has its first state
            if time.monotonic() > deadline:
                print("bench_view: no state within 30 s", file=sys.stderr)
                return 1
            time.sleep(0.05)
        cpu0, wall0 = cpu_seconds(view.pid), time.monotonic()
        send = subprocess.run([MRC_EMU, "send", args.src, args.dst, "--size", args.size, "--name", args.name, "--json"],
                              capture_output=True, text=True)
        cpu1, wall1 = cpu_seconds(view.pid), time.monotonic()
        if send.returncode != 0:
            print(f"bench_view: the send failed: {send.stderr.strip()}", file=sys.stderr)
            return 1
        result = json.loads(send.stdout)
        wall = wall1 - wall0
        rates = [sum(wall0 <= t <= wall1 for t in r.times) / wall for r in readers]
        seen = readers[0].last["transfers"] if readers[0].last else []
        out = {"fabric": args.name, "size": args.size, "clients": args.clients, "interval_s": args.interval,
               "send_wall_s": round(wall, 2), "goodput_gbps": result["goodput_gbps"],
               "updates_per_s": [round(r, 2) for r in rates],
               "view_cpu_percent_of_one_core": round(100 * (cpu1 - cpu0) / wall, 1),
               "transfers_seen_last": [f"{t['src']}->{t['dst']} {t['run']} {t['progress']:.0%}" for t in seen[-2:]]}
        print(json.dumps(out, indent=2))
        return 0
    finally:
        view.terminate()
        view.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
