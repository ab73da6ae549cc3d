"""How close the port program's virtual queue follows TBF's real backlog (docs/fabric.md).

Two hosts burst at line rate each to a third (h0 via spine 0, h1 via spine 1), so the last
hop p0l1 -> h2 receives twice its rate; meanwhile the parent samples, from p0l1's namespace,
TBF's backlog (one RTM_GETQDISC dump, netlink.qdisc_counters) between two reads of the program's
virtual backlog (ports.queue_now) of that port, about every 0.3 ms. Marking and trimming are off
and the program's buffer is one packet under TBF's limit, so both queues only grow and drain (a
burst beyond that is dropped by the program, as it would be by TBF). With trimming off, the
program's trimmed-packet redirect (a trim goes round the device once more) never runs:
`program.trimmed` is 0 and TBF's sent bytes equal the program's passed bytes
(`tbf_sent_minus_program`).

Two things once made it measure nothing (peak backlog 0 in most runs): the burst left from a
thread beside a sampling thread that was pure Python for milliseconds per pair (pyroute2 parsing
the qdisc dump), so the sender waited for the GIL after every sendto (CPython's convoy effect) and
the hosts sent below line rate; and one pyroute2 read could take 25-100 ms while the kernel
forwarded the burst, longer than the queue lived. Now the burst leaves from a forked child
(`handoff_ms`: how long it took to hand to the kernel) and the read is a 0.2 ms netlink dump.

Prints JSON: the samples and their differences.

    sudo PYTHONPATH=. .venv/bin/python scripts/port_queue.py [--frames 200] [--payload 8000] [--rate 400mbit]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import struct
import time
import traceback

from mrc_emu.fabric import build, ops
from mrc_emu.fabric.datapath import ports
from mrc_emu.fabric.kernel import netlink, netns
from mrc_emu.fabric.running import Fabric
from mrc_emu.stats import percentile
from mrc_emu.topology import from_dict
from mrc_emu.topology.port import tbf_limit
from mrc_emu.topology.units import parse_rate
from mrc_emu.transport.multipath.paths import qp_paths
from mrc_emu.wire.format import DataPacket

PAIR_S = 0.002  # a sample whose three reads took longer (the scheduler) is too spread to compare (x K at rate / K)
IDLE_S = 0.02  # sampling ends when both queues stayed empty this long after the burst
BUSY_FLOOR = 0.1  # per-sample relative differences only where TBF holds at least this share of its peak


def _burst_from_child(socks: list[socket.socket], streams: list[list[tuple[bytes, str]]]) -> tuple[int, int, int]:
    """Fork a child that sends every frame (the senders in turn) once a byte arrives on its pipe,
    then writes the ns the handoff took; (pid, the go pipe's write end, the result's read end).
    A process of its own, so the sampling never holds a GIL that the sender waits for."""
    go_read, go_write = os.pipe()
    result_read, result_write = os.pipe()
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            os.close(go_write)  # so that the parent's end going (it failed) reads as EOF here: send nothing then
            os.close(result_read)
            if os.read(go_read, 1) != b"!":
                os._exit(1)
            began = time.monotonic_ns()
            for frames in zip(*streams):
                for raw, (frame, first_hop) in zip(socks, frames):
                    raw.sendto(frame, (first_hop, 0))
            os.write(result_write, struct.pack("q", time.monotonic_ns() - began))
            status = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(status)
    os.close(go_read)
    os.close(result_write)
    return pid, go_write, result_read


def _drained_share(samples: list[tuple[float, int, int, int]], rate_bps: float) -> float | None:
    """What TBF sent while it held a backlog, as a share of its rate over that time. Below 1 the
    kernel did not dequeue on time (a loaded machine delays the qdisc's watchdog), so the real
    queue outgrew the virtual one, which drains at the rate by the clock: the machine's lag, not
    the program's error (the test then runs the ports slower, as a user would)."""
    held = [(t, sent) for t, tbf, _, sent in samples if tbf]
    if len(held) < 2 or held[-1][0] - held[0][0] < 1e-3:
        return None
    (t0, s0), (t1, s1) = held[0], held[-1]
    return round((s1 - s0) * 8 / ((t1 - t0) * rate_bps), 3)


def _spread(values: list[float], digits: int) -> dict:
    if not values:
        return {"mean": None, "p99": None, "max": None}
    return {"mean": round(statistics.mean(values), digits), "p99": round(percentile(values, 99), digits),
            "max": round(max(values), digits)}


def measure(frames: int, payload: int, rate: str, name: str = "pq", dilation: int | None = None) -> dict:
    """The burst's queue at p0l1's port to h2, sampled. `dilation` K runs every port at rate / K (the
    same bytes of buffer, as a run under time dilation does); by default K is measured
    (ops.burst_dilation: where this machine cannot send at 4x the link rate, a VM under TCG)."""
    topo = from_dict({"name": "pq", "planes": 1, "spines_per_plane": 2, "leaves_per_plane": 2, "hosts_per_leaf": 2,
                      "mtu": 9000, "link_rate": rate, "port": {"ecn": "off", "trim": "off",
                                                  "buffer": tbf_limit(parse_rate(rate), 9000) - 9000}}, "<port_queue>")
    build.up(topo, name)
    samples: list[tuple[float, int, int, int]] = []
    tbf_sent: list[int] = []
    discarded: list[float] = []
    try:
        with Fabric.open(name) as fabric:
            if dilation is None:
                path = qp_paths(topo, "h0", "h3", ev_indexes=[0]).forward[0]
                probe = [(path.template.data(DataPacket(5, psn, psn * payload, 7, bytes(payload))), path.first_hop)
                         for psn in range(30)]
                dilation, _ = ops.burst_dilation(fabric, "h0", probe, factor=4.0)  # 2 senders: 2x the rate in
            if dilation > 1:
                build.shape_every_node(fabric, topo.link_rate_bps / dilation)
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
            with netns.entered(fabric.node_path("p0l1")):
                route = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
                index = socket.if_nametoindex(ifname)
            route.bind((0, 0))
            netlink.qdisc_counters(route, index)
            pid, go, result = _burst_from_child(socks, streams)
            start = time.monotonic()
            os.write(go, b"!")
            status, idle_since = None, None
            while idle_since is None or time.monotonic() - idle_since < IDLE_S:  # until both stay empty after the burst
                first = time.monotonic()
                before = ports.queue_now(fabric, "p0l1", ifname)
                began = time.monotonic()
                sent, tbf = netlink.qdisc_counters(route, index)
                virtual = (before + ports.queue_now(fabric, "p0l1", ifname)) // 2  # the TBF read sits between
                took = time.monotonic() - first
                if took < PAIR_S * dilation:  # split by longer (the scheduler) it says nothing; at rate / K the
                    # queue moves K times slower, so a pair K times as long says as much
                    samples.append((began, tbf, virtual, sent))
                else:
                    discarded.append(took)
                if status is None and os.waitpid(pid, os.WNOHANG)[0]:
                    status = 0 if len(took_ns := os.read(result, 8)) == 8 else 1
                if status is None or tbf or virtual:
                    idle_since = None
                elif idle_since is None:
                    idle_since = time.monotonic()
            tbf_sent.append(sent)
            route.close()
            os.close(go)
            os.close(result)
            counters = ports.counters(fabric, "p0l1")["p0l1"][ifname]
            for raw in socks:
                raw.close()
            if status != 0:
                raise RuntimeError("the sending child failed (its traceback is above)")
    finally:
        build.down(name)
    drained = _drained_share(samples, topo.link_rate_bps / dilation)
    samples = [(round((t - start) * 1e3, 2), tbf, virtual) for t, tbf, virtual, _ in samples]
    busy = [(t, a, b) for t, a, b in samples if a or b]
    diffs = [b - a for _, a, b in busy]
    peak_tbf = max((a for _, a, _ in samples), default=0)
    abs_diffs = [abs(d) for d in diffs]
    relative = [abs(b - a) / a for _, a, b in busy if peak_tbf and a >= BUSY_FLOOR * peak_tbf]
    return {
        "rate": rate, "dilation": dilation, "tbf_drained_of_rate": drained,
        "frames_per_sender": frames, "payload": payload, "samples": len(samples),
        "busy_samples": len(busy), "discarded_pairs_ms": [round(t * 1e3, 1) for t in discarded],
        "first_busy_ms": busy[0][0] if busy else None, "handoff_ms": round(struct.unpack("q", took_ns)[0] / 1e6, 2),
        "peak_tbf_backlog": peak_tbf, "peak_virtual": max((b for _, _, b in samples), default=0),
        "virtual_minus_tbf": {"median": percentile(diffs, 50), **_spread(abs_diffs, 0)},
        "abs_of_peak_tbf": _spread([d / peak_tbf for d in abs_diffs] if peak_tbf else [], 4),
        f"relative_where_tbf_over_{BUSY_FLOOR:g}_of_peak": _spread(relative, 4),
        "program": {k: counters[k] for k in ports.COUNTERS},
        "tbf_sent_minus_program": tbf_sent[0] - counters["bytes"] if tbf_sent else None,
        "series_ms_tbf_virtual": samples,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=200, help="frames per sender")
    parser.add_argument("--payload", type=int, default=8000, help="RDMA payload bytes per frame")
    parser.add_argument("--rate", default="400mbit", help="link rate of every link")
    parser.add_argument("--dilation", type=int, default=None,
                        help="run the ports at rate / K (default: measured, 1 unless this machine sends slower than "
                             "4x the link rate)")
    args = parser.parse_args()
    print(json.dumps(measure(args.frames, args.payload, args.rate, dilation=args.dilation), indent=1))


if __name__ == "__main__":
    main()
