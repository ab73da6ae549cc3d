"""How close the port program's virtual queue follows TBF's real backlog (docs/fabric.md).

Two hosts burst at line rate each to a third (h0 via spine 0, h1 via spine 1), so the last
hop p0l1 -> h2 receives twice its rate; while they send, a thread in p0l1's namespace samples
TBF's backlog (netlink qdisc stats) and the program's virtual backlog (ports.queue_now) of that
port, one pair at a time. Marking and trimming are off and the program's buffer is one packet
under TBF's limit, so both queues only grow and drain (a burst beyond that is dropped by the
program, as it would be by TBF). Prints JSON: the samples and their differences.

    sudo PYTHONPATH=. .venv/bin/python scripts/port_queue.py [--frames 200] [--payload 8000] [--rate 400mbit]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import threading
import time

from pyroute2 import IPRoute

from mrc_emu.fabric import build, netns, ops, ports
from mrc_emu.fabric.running import Fabric
from mrc_emu.topology import from_dict
from mrc_emu.topology.model import parse_rate
from mrc_emu.topology.port import tbf_limit
from mrc_emu.transport.paths import qp_paths
from mrc_emu.wire.format import DataPacket


def measure(frames: int, payload: int, rate: str, name: str = "pq") -> dict:
    topo = from_dict({"name": "pq", "planes": 1, "spines_per_plane": 2, "leaves_per_plane": 2, "hosts_per_leaf": 2,
                      "mtu": 9000, "link_rate": rate, "port": {"ecn": "off", "trim": "off",
                                                  "buffer": tbf_limit(parse_rate(rate), 9000) - 9000}}, "<port_queue>")
    build.up(topo, name)
    samples: list[tuple[float, int, int]] = []
    try:
        with Fabric.open(name) as fabric:
            (link,) = topo.links_between("p0l1", "h2")
            ifname = topo.peer(link, "p0l1")[1]
            streams, socks = [], []
            for host, ev in (("h0", 0), ("h1", 1)):
                path = qp_paths(topo, host, "h2", ev_indexes=[ev]).forward[ev]
                streams.append([(path.template.data(DataPacket(5, psn, psn * payload, 7, bytes(payload))), path.first_hop)
                                for psn in range(frames)])
                raw, unused = ops.host_sockets(fabric, host)
                unused.close()
                raw.setsockopt(socket.SOL_SOCKET, 32, 64 << 20)  # SO_SNDBUFFORCE: the burst never blocks
                socks.append(raw)
            done = threading.Event()
            start = time.monotonic()

            def sample() -> None:  # pyroute2's socket belongs to the thread that made it
                with netns.entered(fabric.node_path("p0l1")):
                    ipr = IPRoute()
                index = ipr.link_lookup(ifname=ifname)[0]
                idle = 0
                while idle < 20:  # until both queues stayed empty for 20 samples after the burst
                    before = ports.queue_now(fabric, "p0l1", ifname)
                    began = time.monotonic()
                    _, tbf = ports.tbf_counters(ipr, index)
                    took = time.monotonic() - began
                    virtual = (before + ports.queue_now(fabric, "p0l1", ifname)) // 2  # the TBF read sits between
                    if took < 0.005:  # a pair the sending thread split by more than 5 ms says nothing
                        samples.append((round((began - start) * 1e3, 2), tbf, virtual))
                    idle = idle + 1 if done.is_set() and tbf == 0 and virtual == 0 else 0
                ipr.close()

            sampler = threading.Thread(target=sample)
            sampler.start()
            for i in range(frames):
                for raw, stream in zip(socks, streams):
                    raw.sendto(stream[i][0], (stream[i][1], 0))
            done.set()
            sampler.join(timeout=30)
            counters = ports.counters(fabric, "p0l1")["p0l1"][ifname]
            for raw in socks:
                raw.close()
    finally:
        build.down(name)
    busy = [(t, a, b) for t, a, b in samples if a or b]
    diffs = [b - a for _, a, b in busy]
    peak_tbf = max((a for _, a, _ in samples), default=0)
    return {
        "rate": rate, "frames_per_sender": frames, "payload": payload, "samples": len(samples),
        "peak_tbf_backlog": peak_tbf, "peak_virtual": max((b for _, _, b in samples), default=0),
        "virtual_minus_tbf": {"median": statistics.median(diffs) if diffs else None,
                              "mean_abs": round(statistics.mean(abs(d) for d in diffs)) if diffs else None,
                              "max_abs": max((abs(d) for d in diffs), default=None),
                              "mean_abs_of_peak": round(statistics.mean(abs(d) for d in diffs) / peak_tbf, 4)
                              if diffs and peak_tbf else None},
        "program": {k: counters[k] for k in ports.COUNTERS},
        "series_ms_tbf_virtual": samples,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=200, help="frames per sender")
    parser.add_argument("--payload", type=int, default=8000, help="RDMA payload bytes per frame")
    parser.add_argument("--rate", default="400mbit", help="link rate of every link")
    args = parser.parse_args()
    print(json.dumps(measure(args.frames, args.payload, args.rate), indent=1))


if __name__ == "__main__":
    main()
