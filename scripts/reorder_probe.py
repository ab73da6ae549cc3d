#!/usr/bin/env python3
"""Does one path keep its packets in order? Numbered frames along one EV, inversions counted.

Needs root. Brings up a fabric (default `incast`, whose ports are shaped by TBF as a dilated or
congested run's are), then sends bursts of numbered RoCE frames (the PSN is the number) from
h5 to h2 along EV 0 only, from this process, and a reader in h2 counts how many arrived after a
higher-numbered one (an inversion: a later packet of the same path overtook it) and by how
many. Each mode runs `--bursts` bursts of `--burst` frames, paced so the shaped link never
drops:

- free:   this process may run on any CPU, with two CPU-bound processes beside it (a busy
          machine, as an emulation with two workers is);
- pinned: the same, this process pinned to CPU 0;
- steered: pinned, and every interface of the fabric receives on one CPU of its own
          (RPS: /sys/class/net/IF/queues/rx-0/rps_cpus), what `fabric.build` does
          (fabric/datapath/steering.py).

Prints one JSON object: per mode, frames sent and received, inversions and the largest
distance. Traffic stays inside the fabric's namespaces. Usage: reorder_probe.py [--topology T]
[--bursts N] [--burst M] [--modes free,pinned,steered].
"""

from __future__ import annotations

import argparse
import json
import os
import select
import subprocess
import sys
import time
from dataclasses import dataclass

from mrc_emu.fabric import build, ops
from mrc_emu.fabric.datapath import steering
from mrc_emu.fabric.kernel import netns
from mrc_emu.fabric.procs import Child, Parent, Stop
from mrc_emu.fabric.running import Fabric
from mrc_emu.io.sockets import udp_receiver
from mrc_emu.topology import resolve
from mrc_emu.transport.multipath.paths import qp_paths
from mrc_emu.wire.format import DataPacket

SRC, DST = "h5", "h2"
MTU = 4096


@dataclass(frozen=True)
class Counted:
    received: int
    inversions: int
    max_distance: int


def _count(parent: Parent, path: str, address: str) -> None:
    """In the destination's namespace: read every datagram, count the PSNs that came after a higher one."""
    netns.move_to(path)
    sock = udp_receiver(address)
    sock.setblocking(False)
    parent.ready()
    got = inversions = distance = 0
    highest = -1
    while True:
        ready, _, _ = select.select([sock, parent], [], [], 5)
        if parent in ready or not ready:
            break
        try:
            while True:
                data = sock.recv(65535)
                psn = int.from_bytes(data[9:12], "big")  # BTH: the PSN is its last three bytes
                got += 1
                if psn < highest:
                    inversions += 1
                    distance = max(distance, highest - psn)
                else:
                    highest = psn
        except BlockingIOError:
            pass
    parent.send(Counted(got, inversions, distance))


def _spin() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def probe(fabric: Fabric, bursts: int, burst: int, pinned: bool) -> dict:
    paths = qp_paths(fabric.topology, SRC, DST)
    path = paths.forward[0]
    frames = [bytes(path.template.data(DataPacket(psn, 1, 0x1000, 7, bytes(MTU)))) for psn in range(bursts * burst)]
    drain_s = burst * (len(frames[0]) * 8) / (fabric.topology.link_rate_bps or 1e12) * 1.5
    raw, unused = ops.host_sockets(fabric, SRC)
    unused.close()
    reader = Child(fabric, f"reorder counter in {DST}", _count, (str(fabric.node_path(DST)), paths.dst_address))
    spinners = [_spin(), _spin()]
    before = os.sched_getaffinity(0)
    try:
        if pinned:
            os.sched_setaffinity(0, {min(before)})
        for b in range(bursts):
            for frame in frames[b * burst:(b + 1) * burst]:
                raw.sendto(frame, (path.first_hop, 0))
            time.sleep(drain_s)  # the schedule of the probe: the shaped link drains the burst
    finally:
        os.sched_setaffinity(0, before)
        for proc in spinners:
            proc.kill()
            proc.wait()
        raw.close()
        reader.send(Stop())
        counted = reader.expect(Counted)
        reader.stop()
    return {"sent": len(frames), "received": counted.received, "inversions": counted.inversions,
            "max_distance": counted.max_distance}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--topology", default="incast")
    parser.add_argument("--bursts", type=int, default=40)
    parser.add_argument("--burst", type=int, default=100)
    parser.add_argument("--modes", default="free,pinned,steered")
    args = parser.parse_args()
    topo = resolve(args.topology)
    name = "reord"
    out = {"topology": topo.name, "path": f"{SRC}->{DST} EV 0", "modes": {}}
    build.up(topo, name)
    try:
        with Fabric.open(name) as fabric:
            for mode in args.modes.split(","):
                if mode == "steered":
                    steering.steer(fabric)
                out["modes"][mode] = probe(fabric, args.bursts, args.burst, pinned=mode != "free")
                print(f"reorder_probe: {mode}: {out['modes'][mode]}", file=sys.stderr, flush=True)
    finally:
        build.down(name)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
