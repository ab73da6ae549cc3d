#!/usr/bin/env python3
"""Fabric benchmark: mrc-emu up/down of a topology beside plain Mininet build/stop of the
same graph, measured in one run (ratios matter on a noisy machine). Needs root.

Plain Mininet here means: every node a Mininet Host, every link a Mininet Link, built by
Mininet(topo, controller=None) and stopped by net.stop(); it configures no SRv6 at all.
Targets for large.yaml on a 2-core machine: up <= 10 s, down <= 5 s.
"""

import json
import sys
import time

from mininet.net import Mininet
from mininet.topo import Topo

from mrc_emu.fabric import build
from mrc_emu.topology import resolve


class SameGraph(Topo):
    "The topology's graph as plain Mininet hosts and links."

    def build(self, topo):  # noqa: D401 (Mininet's hook)
        for name in topo.nodes:
            self.addHost(name, ip=None)
        for link in topo.links:
            self.addLink(link.a, link.b, intfName1=link.a_intf, intfName2=link.b_intf)


def main() -> None:
    topo = resolve(sys.argv[1] if len(sys.argv) > 1 else "large")
    t = time.perf_counter()
    result = build.up(topo, "benchf")
    ours_up = time.perf_counter() - t
    t = time.perf_counter()
    build.down("benchf")
    ours_down = time.perf_counter() - t

    t = time.perf_counter()
    net = Mininet(topo=SameGraph(topo=topo), controller=None, autoSetMacs=False, waitConnected=False)
    try:
        plain_up = time.perf_counter() - t
    finally:
        t = time.perf_counter()
        net.stop()
        plain_down = time.perf_counter() - t
    print(json.dumps({
        "topology": topo.summary(),
        "mrc_emu_up_s": round(ours_up, 2), "mrc_emu_up_phases_s": {k: round(v, 2) for k, v in result.phases.items()},
        "mrc_emu_down_s": round(ours_down, 2),
        "plain_mininet_build_s": round(plain_up, 2), "plain_mininet_stop_s": round(plain_down, 2),
        "ratio_up_to_plain_build": round(ours_up / plain_up, 3),
        "ratio_down_to_plain_stop": round(ours_down / plain_down, 4),
        "targets_s": {"up": 10, "down": 5},
    }, indent=2))


if __name__ == "__main__":
    main()
