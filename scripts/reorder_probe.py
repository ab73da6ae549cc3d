#!/usr/bin/env python3
"""Does one path keep its packets in order? Numbered frames along one EV, inversions counted.

Needs root. Brings up a fabric (default `incast`, whose ports are shaped by TBF as a dilated or
congested run's are), then two senders at once, as two endpoint workers are, each sending
bursts of numbered RoCE frames (the PSN is the number) to h2 along EV 0 (the same spine, the
same shaped ports down to h2): h5 from this process, h9 from a child process. A reader in h2
counts, per sender, how many frames arrived after a higher-numbered one of the same sender (an
inversion: a later packet of the same path overtook it) and by how many. Each mode runs
`--bursts` bursts of `--burst` frames each, paced so the shaped links never drop:

- free:    the senders may run on any CPU;
- pinned:  each sender on a CPU of its own (as the endpoint workers are);
- steered: pinned, and every interface of the fabric receives on one CPU of its own
           (RPS: /sys/class/net/IF/queues/rx-0/rps_cpus; fabric/datapath/steering.py).
Measured 2026-12-03 on this project's 2-core machine (busy): 0 inversions of 8,000 frames in
every mode (docs/transport.md, Reordering).

Prints one JSON object: per mode, frames sent and received, inversions and the largest
distance. Traffic stays inside the fabric's namespaces. Usage: reorder_probe.py [--topology T]
[--bursts N] [--burst M] [--modes free,pinned,steered].
"""

from __future__ import annotations

import argparse
import json
import os
import select
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

SOURCES, DST = ("h5", "h9"), "h2"
MTU = 4096


@dataclass(frozen=True)
class Counted:
    received: dict[str, int]
    inversions: dict[str, int]
    max_distance: dict[str, int]


@dataclass(frozen=True)
class Go:
    pass


def _count(parent: Parent, path: str, address: str) -> None:
    """In the destination's namespace: read every datagram, count per sender the PSNs that came
    after a higher one of the same sender."""
    netns.move_to(path)
    sock = udp_receiver(address)
    sock.setblocking(False)
    parent.ready()
    got: dict[str, int] = {}
    inversions: dict[str, int] = {}
    distance: dict[str, int] = {}
    highest: dict[str, int] = {}
    while True:
        ready, _, _ = select.select([sock, parent], [], [], 5)
        if parent in ready or not ready:
            break
        try:
            while True:
                data, (src, *_) = sock.recvfrom(65535)
                psn = int.from_bytes(data[9:12], "big")  # BTH: the PSN is its last three bytes
                got[src] = got.get(src, 0) + 1
                if psn < highest.get(src, -1):
                    inversions[src] = inversions.get(src, 0) + 1
                    distance[src] = max(distance.get(src, 0), highest[src] - psn)
                else:
                    highest[src] = psn
        except BlockingIOError:
            pass
    parent.send(Counted(got, inversions, distance))


def _frames(fabric: Fabric, src: str, count: int) -> tuple[list[bytes], str]:
    path = qp_paths(fabric.topology, src, DST).forward[0]
    return [bytes(path.template.data(DataPacket(psn, 1, 0x1000, 7, bytes(MTU)))) for psn in range(count)], path.first_hop


def _send(fabric: Fabric, src: str, bursts: int, burst: int, cpu: int | None) -> None:
    """Send `bursts` bursts of numbered frames from `src` along EV 0, paced for the shaped links."""
    frames, hop = _frames(fabric, src, bursts * burst)
    drain_s = burst * (len(frames[0]) * 8) / (fabric.topology.link_rate_bps or 1e12) * 2.5  # two senders share it
    raw, unused = ops.host_sockets(fabric, src)
    unused.close()
    before = os.sched_getaffinity(0)
    try:
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})
        for b in range(bursts):
            for frame in frames[b * burst:(b + 1) * burst]:
                raw.sendto(frame, (hop, 0))
            time.sleep(drain_s)  # the probe's own schedule: the shaped links drain the bursts
    finally:
        os.sched_setaffinity(0, before)
        raw.close()


def _second_sender(parent: Parent, fabric: Fabric, bursts: int, burst: int, cpu: int | None) -> None:
    parent.ready()
    parent.recv()  # Go
    _send(fabric, SOURCES[1], bursts, burst, cpu)
    parent.send(Go())
    parent.recv()  # the farewell


def probe(fabric: Fabric, bursts: int, burst: int, pinned: bool) -> dict:
    cpus = sorted(os.sched_getaffinity(0))
    dst = qp_paths(fabric.topology, SOURCES[0], DST).dst_address
    reader = Child(fabric, f"reorder counter in {DST}", _count, (str(fabric.node_path(DST)), dst))
    other = Child(fabric, f"second sender from {SOURCES[1]}", _second_sender,
                  (fabric, bursts, burst, cpus[-1] if pinned else None))
    try:
        other.send(Go())
        _send(fabric, SOURCES[0], bursts, burst, cpus[0] if pinned else None)
        other.expect(Go)
    finally:
        other.stop()
        reader.send(Stop())
        counted = reader.expect(Counted)
        reader.stop()
    return {"sent_per_sender": bursts * burst, "received": counted.received, "inversions": counted.inversions,
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
    out = {"topology": topo.name, "paths": [f"{src}->{DST} EV 0" for src in SOURCES], "modes": {}}
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
