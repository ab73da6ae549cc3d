#!/usr/bin/env python3
"""Fabric benchmark: mrc-emu up/down of each topology, its phases and the kernel memory it costs,
beside plain Mininet build/stop of the same graph for `large`, measured in one run (ratios
matter on a noisy machine). Needs root.

Usage: sudo .venv/bin/python scripts/bench_fabric.py [TOPOLOGY[@RATE] ...]   (default: large huge)

A topology name with `@RATE` (`large@1gbit`) is shaped to that link rate, so every switch port
gets TBF, the ordering HTB and the port program: its `up_phases_s` say what that costs (`links`:
the qdiscs; `ports`: loading, pinning and attaching the program).

Plain Mininet means: every node a Mininet Host, every link a Mininet Link, built by
Mininet(topo, controller=None) and stopped by net.stop(); it configures no SRv6 at all. It
needs the mininet module (the `bench` extra: pip install -e '.[bench]') and mnexec (apt-get
install mininet), and is skipped, saying which is missing, without them. It runs for `large`
only: at 320 nodes its stop alone took 50 s here, so at a thousand it would take minutes and
say nothing new.

Memory is the kernel's, read from /proc/meminfo (Slab + Percpu + VmallocUsed, and MemAvailable)
before `up`, with the fabric up, with its static routes installed, and after `down`. `down` returns once every name is gone
(the namespaces are then unreachable) and lets go of them all at once; the kernel tears them
down asynchronously, in one batch, so the script also waits, with a deadline, until the kernel's
slab memory is back within a tenth of what the fabric added, and reports how long that took.
(Not the kernel's count of namespace objects, /sys/kernel/slab/net_namespace: here the last
4 KiB of each stayed allocated for minutes after the memory had come back, until some other
namespace was made and removed.) Meanwhile the kernel holds its netlink lock for long stretches: an `up`
started then waits. Other fabrics on the
machine (other users, other tests) move both figures; the report says what it saw.

Targets on a 2-core machine: `large` up <= 5 s, a topology with >= 1,000 namespaces and
>= 512 hosts (`huge`) up <= 30 s, every down <= 5 s.
"""

from __future__ import annotations

import importlib.util
import json
import select
import shutil
import sys
import time
from pathlib import Path

from mrc_emu.fabric import build, static_routes
from mrc_emu.fabric.running import Fabric
from mrc_emu.topology import Topology, ev_count, from_dict, resolve

TARGETS_S = {"large": {"up": 5, "down": 5}, "huge": {"up": 30, "down": 5}}
MiB = 1024 * 1024


def meminfo() -> dict[str, int]:
    """Bytes of each /proc/meminfo field."""
    out = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, value = line.split(":", 1)
        parts = value.split()
        out[key] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    out["rss"] = rss()
    return out


def rss() -> int:
    """Bytes this process holds: its growth is Python's (plans, caches), not the fabric's."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def used_by_kernel(before: dict[str, int], after: dict[str, int]) -> dict[str, float]:
    """MiB the kernel allocated between two readings (slab, per-CPU, vmalloc), and the drop of
    MemAvailable less this process's own growth (wider, and moved by every process on the machine)."""
    def delta(key: str) -> float:
        return round((after[key] - before[key]) / MiB, 1)
    grown = after["rss"] - before["rss"]
    return {"kernel_mib": round(delta("Slab") + delta("Percpu") + delta("VmallocUsed"), 1),
            "slab_mib": delta("Slab"), "percpu_mib": delta("Percpu"), "vmalloc_mib": delta("VmallocUsed"),
            "mem_available_drop_mib": round((before["MemAvailable"] - after["MemAvailable"] - grown) / MiB, 1),
            "bench_process_rss_mib": round(grown / MiB, 1)}


def wait_released(slab_before: int, slab_grown: int, deadline_s: float = 120.0) -> dict:
    """Wait until the kernel's slab memory is back within a tenth of what the fabric had added."""
    began = time.monotonic()
    while (left := meminfo()["Slab"] - slab_before) > slab_grown / 10:
        if time.monotonic() - began > deadline_s:
            return {"kernel_release_s": None, "note": f"{left / MiB:.0f} MiB of slab still held after {deadline_s:.0f} s "
                    f"(other work on the machine counts too)"}
        select.select([], [], [], 0.02)
    return {"kernel_release_s": round(time.monotonic() - began, 3)}


def ours(topo: Topology, name: str) -> dict:
    before = meminfo()
    t = time.perf_counter()
    result = build.up(topo, name)
    up_s = time.perf_counter() - t
    try:
        with_fabric = meminfo()
        with Fabric.open(name) as fabric:
            static_s = static_routes.install(fabric)
        with_routes = meminfo()
    finally:
        held = meminfo()
        t = time.perf_counter()
        build.down(name)
        down_s = time.perf_counter() - t
    release = wait_released(before["Slab"], held["Slab"] - before["Slab"])
    after = meminfo()
    fabric = used_by_kernel(before, with_fabric)
    nodes, hosts = len(topo.nodes), topo.host_count
    return {
        "topology": {**topo.summary(), "ev_count": ev_count(topo)},
        "up_s": round(up_s, 2), "up_phases_s": {k: round(v, 2) for k, v in result.phases.items()},
        "static_routes_s": round(static_s, 2),
        "down_s": round(down_s, 3),
        "down_waited_for": "every name unmounted and removed, then all namespaces let go at once; the kernel "
                           "tears them down afterwards (kernel_release_s), and holds up other netlink work meanwhile",
        **release,
        "memory": {
            "fabric": fabric,
            "static_routes": used_by_kernel(with_fabric, with_routes),
            "per_namespace_kib": round(fabric["kernel_mib"] * 1024 / nodes, 1),
            "per_host_kib": round(fabric["kernel_mib"] * 1024 / hosts, 1),
            "after_down": used_by_kernel(before, after),
        },
    }


def plain_mininet(topo: Topology) -> dict:
    from mininet.net import Mininet
    from mininet.topo import Topo

    class SameGraph(Topo):
        "The topology's graph as plain Mininet hosts and links."

        def build(self, topo):  # noqa: D401 (Mininet's hook)
            for name in topo.nodes:
                self.addHost(name, ip=None)
            for link in topo.links:
                self.addLink(link.a, link.b, intfName1=link.a_intf, intfName2=link.b_intf)

    t = time.perf_counter()
    net = Mininet(topo=SameGraph(topo=topo), controller=None, autoSetMacs=False, waitConnected=False)
    try:
        build_s = time.perf_counter() - t
    finally:
        t = time.perf_counter()
        net.stop()
        stop_s = time.perf_counter() - t
    return {"build_s": round(build_s, 2), "stop_s": round(stop_s, 2)}


def main() -> None:
    names = sys.argv[1:] or ["large", "huge"]
    report: dict = {}
    for topo_name in names:
        base, _, rate = topo_name.partition("@")  # large@1gbit: shaped, with the port programs on every switch port
        topo = resolve(base)
        if rate:
            topo = from_dict({**topo.to_dict(), "link_rate": rate}, f"<{topo_name}>")
        entry = ours(topo, "benchf")
        if topo_name == "large":  # (not large@RATE: Mininet shapes nothing)
            if importlib.util.find_spec("mininet") is None:
                entry["plain_mininet"] = "skipped: the mininet module is not installed (pip install -e '.[bench]')"
            elif shutil.which("mnexec") is None:
                entry["plain_mininet"] = "skipped: mnexec not installed (apt-get install mininet)"
            else:
                plain = plain_mininet(topo)
                entry["plain_mininet"] = plain
                entry["ratio_up_to_plain_build"] = round(entry["up_s"] / plain["build_s"], 3)
                entry["ratio_down_to_plain_stop"] = round(entry["down_s"] / plain["stop_s"], 4)
        else:
            entry["plain_mininet"] = (f"skipped: {len(topo.nodes)} namespaces would take minutes to build and "
                                      f"stop (320 took 13.5 s and 50 s here)")
        entry["targets_s"] = TARGETS_S.get(topo_name)
        report[topo_name] = entry
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
