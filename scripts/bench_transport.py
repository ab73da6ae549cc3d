#!/usr/bin/env python3
"""Transport benchmark: goodput, recovery after a link failure, plane aggregation. One run, ratios.

Needs root. Brings up the default fabric (name 'bencht'), then:
1. goodput: a 64 MiB WRITE h0 -> h2 over all 8 EVs, in packets/s, beside a raw-socket loop
   sending identical pre-built frames of the same size (the ceiling): sprayed over the same
   EVs to a receiver that reads them (like for like), and, the strictest, along one EV to a
   socket nobody reads. Both ceilings are Python loops, one sendto per frame. Beside them the
   physical reference: a C loop (mrc_emu.io._sockio.send_loop, sendmmsg 16 at a time, no
   per-packet user-space work) sending the same frames over the same 8 EVs to a receiver
   that reads them in batches as the workers do: what the kernel's forwarding allows on this
   machine. Rounds alternate; medians count. Targets (issue 11): goodput >= 0.9 of the
   like-for-like ceiling and >= 0.7 of the strict one; the physical ratio has none.
2. recovery: the leaf-spine link p0l0-p0s1 goes down (netlink, from inside the requester's
   loop, timed to the microsecond) at 30 % of a 64 MiB WRITE; recovery time per
   mrc_emu.experiments.analysis.metrics (goodput back at >= 90 % of its pre-fault level on the
   remaining EVs). Target <= 5 ms. The link comes back up between runs.
3. planes: the fabric again with every link shaped by TBF to R; aggregate goodput of one
   QP against planes x R. Target >= 0.9.
Prints one JSON object. Traffic stays inside the fabric's namespaces.
Usage: bench_transport.py [--rounds N] [--only goodput|recovery|planes ...] (--help).
"""

from __future__ import annotations

import argparse
import json
import select
import socket
import time
from dataclasses import dataclass

from mrc_emu.experiments.analysis import metrics
from mrc_emu.experiments.runtime.fault_agent import LinkDown, LinkFaultAgent
from mrc_emu.experiments.runtime.transfer import Control, send
from mrc_emu.fabric import build, links, ops
from mrc_emu.fabric.kernel import netns
from mrc_emu.fabric.procs import Child, Parent, Stop
from mrc_emu.fabric.running import Fabric
from mrc_emu.io import _sockio
from mrc_emu.io.sockets import udp_receiver
from mrc_emu.stats import percentile
from mrc_emu.topology import builtin, evs_between, from_dict
from mrc_emu.transport.multipath.paths import qp_paths
from mrc_emu.wire.format import DataPacket

MiB = 1024 * 1024
SIZE = 64 * MiB
MTU = 4096
ROUNDS = 3  # rounds of each part (--rounds)
PLANE_RATE = 400e6  # R, bits/s per link
PHYSICAL_FRAMES = 200_000  # the C loop is several times faster: as long a measurement as the others'
SEND_BATCH = 16  # frames per sendmmsg, and datagrams per recvmmsg of the physical reference's reader
TARGET_LIKE_FOR_LIKE = 0.9
TARGET_STRICT = 0.7


@dataclass(frozen=True)
class Received:
    datagrams: int


def _drain(parent: Parent, path: str, address: str, batched: bool) -> None:
    """A receiver in the destination's namespace that reads every datagram, as a responder does:
    one recv each, or (batched) recvmmsg in C, as the endpoint workers read."""
    netns.move_to(path)
    sock = udp_receiver(address)
    sock.setblocking(False)
    parent.ready()
    got = 0
    while True:
        ready, _, _ = select.select([sock, parent], [], [], 5)
        if parent in ready or not ready:  # told to stop, or nothing came for 5 s
            break
        if batched:
            while batch := _sockio.recv_batch(sock.fileno(), SEND_BATCH):
                got += len(batch)
            continue
        try:
            while True:
                sock.recv(65535)
                got += 1
        except BlockingIOError:
            pass
    parent.send(Received(got))


def ceiling_pps(fabric: Fabric, sprayed: bool, n: int = 30_000, physical: bool = False) -> dict:
    """A raw-socket loop sending identical pre-built frames of the transfer's size from h0 to h2.

    sprayed=False: along EV 0 only, to a socket nobody reads (it fills, then the kernel drops at
    it): the strictest ceiling. sprayed=True: over all 8 EVs in turn, to a receiver that reads
    everything, as the transfer's frames go: like for like (spraying costs the sender route
    look-ups, and delivering to a reader costs wake-ups, about 25 % together on this VM).
    physical=True (sprayed): the same frames sent by the C loop with sendmmsg, read in batches;
    frames the kernel refused (ENOBUFS) are not counted as sent.
    """
    paths = qp_paths(fabric.topology, "h0", "h2")  # the transfer's own frame templates and first hops
    dst = paths.dst_address
    chosen = list(paths.forward.values()) if sprayed else [paths.forward[0]]
    frames = [(bytes(p.template.data(DataPacket(1, 1, 0x1000, 7, bytes(MTU)))), (p.first_hop, 0)) for p in chosen]
    raw, unused = ops.host_sockets(fabric, "h0")
    unused.close()
    reader = None
    if sprayed:
        reader = Child(fabric, "benchmark reader in h2", _drain, (str(fabric.node_path("h2")), dst, physical))
    else:
        with netns.entered(fabric.node_path("h2")):
            sink = udp_receiver(dst)
    try:
        count = len(frames)
        t = time.perf_counter()
        if physical:
            sent = _sockio.send_loop(raw.fileno(), [f for f, _ in frames],
                                     [socket.inet_pton(socket.AF_INET6, a[0]) for _, a in frames], n, SEND_BATCH)
        else:
            for i in range(n):
                frame, addr = frames[i % count]
                raw.sendto(frame, addr)
            sent = n
        seconds = time.perf_counter() - t
        pps = sent / seconds
    finally:
        raw.close()
        if reader is not None:
            reader.send(Stop())
            received = reader.expect(Received).datagrams
            reader.stop()
        else:
            sink.close()
            received = None
    return {"pps": round(pps), "sent": sent, "received": received}


def goodput(fabric: Fabric) -> dict:
    rounds = []
    for _ in range(ROUNDS):
        strict = ceiling_pps(fabric, sprayed=False)["pps"]
        like = ceiling_pps(fabric, sprayed=True)["pps"]
        physical = ceiling_pps(fabric, sprayed=True, n=PHYSICAL_FRAMES, physical=True)
        r = send(fabric, "h0", "h2", SIZE, mtu=MTU)
        if not r.verified:
            rounds.append(_failed(r))
            continue
        rounds.append({"ceiling_one_ev_unread_pps": strict, "ceiling_sprayed_read_pps": like,
                       "physical_sendmmsg_pps": physical["pps"],
                       "physical_delivered": round(physical["received"] / max(1, physical["sent"]), 3),
                       "goodput_pps": r.goodput_pps, "goodput_gbps": r.goodput_gbps,
                       "ratio": round(r.goodput_pps / like, 3), "ratio_to_strict": round(r.goodput_pps / strict, 3),
                       "ratio_to_physical": round(r.goodput_pps / physical["pps"], 3),
                       "retransmits": r.requester["stats"]["retransmits"],
                       "emulation": {k: r.emulation[k] for k in ("verdict", "reasons", "loop_lag_us", "cpu_busy",
                                                                  "runqueue_wait")}})
    done = [x for x in rounds if "failed" not in x]
    failed = len(rounds) - len(done)
    like = _median(x["ratio"] for x in done)
    strict = _median(x["ratio_to_strict"] for x in done)
    return {"frame_payload_bytes": MTU, "rounds": rounds, "failed_rounds": failed,
            "ratio_goodput_to_ceiling": like, "ratio_goodput_to_strict_ceiling": strict,
            "ratio_goodput_to_physical": _median(x["ratio_to_physical"] for x in done),
            "ratio_like_for_like_to_physical": _median(
                round(x["ceiling_sprayed_read_pps"] / x["physical_sendmmsg_pps"], 3) for x in done),
            "targets": {"like_for_like": _target(like, TARGET_LIKE_FOR_LIKE, failed),
                        "strict": _target(strict, TARGET_STRICT, failed)},
            "ceiling": "the same frames sprayed over the same 8 EVs to a receiver that reads them",
            "physical": "the same frames over the same 8 EVs, sendmmsg from C, read in batches"}


def recovery(fabric: Fabric) -> dict:
    runs = []
    with LinkFaultAgent(fabric, links.between(fabric, "p0l0", "p0s1"), at="p0l0") as agent:
        for _ in range(ROUNDS):
            control = Control(hooks=[(0.3, lambda: agent.trigger(LinkDown()))])
            r = send(fabric, "h0", "h2", SIZE, mtu=MTU, control=control)
            done = agent.wait()
            began, returned = done.began_ns, done.returned_ns
            links.set_state(fabric, "p0l0", "p0s1", True)
            if not r.verified:  # a failure, counted as never recovered: not the end of the bench
                runs.append({**_failed(r), "recovery_ms": None, "detection_ms": None, "stall_ms": None,
                             "repair_ms": None})
                continue
            fault = began - r.start_ns  # the moment the agent started the request (conservative)
            bad = [e["time_ms"] - fault / 1e6 for e in r.ev_events if e["new"] == "ASSUMED_BAD"]
            through = {ev.index for ev in evs_between(fabric.topology, "h0", "h2") if ev.crosses("p0l0", "p0s1")}
            exact = metrics.fault_figures(r.ledger, r.ev_events, fault, r.end_ns - r.start_ns, r.end_ns - r.start_ns,
                                          through)
            rec = metrics.recovery(r.timeline, fault, r.end_ns - r.start_ns,
                                   settled_ns=metrics.repaired_ns(exact, fault))
            runs.append({**rec.to_dict(), **exact, "fault_request_us": round((returned - began) / 1e3, 1),
                         "assumed_bad_after_ms": [round(b, 3) for b in bad], "completion_ms": r.completion_ms,
                         "retransmits": r.requester["stats"]["retransmits"],
                         # what found the path failed (witness probes, or the ACK timeout: the last resort)
                         "assumed_bad_by": [e["reason"] for e in r.ev_events if e["new"] == "ASSUMED_BAD"],
                         "ack_timeouts": r.requester["stats"]["timeouts"]})
    # every run counted: one that never recovered is the largest value, not dropped
    return {"link": "p0l0-p0s1", "at_progress": 0.3, "runs": runs, "failed_runs": sum("failed" in x for x in runs),
            "recovery_ms_median": metrics.across_runs([x["recovery_ms"] for x in runs])["median"],
            **{f"{k}_across_runs": metrics.across_runs([x[f"{k}_ms"] for x in runs]) for k in ("detection", "stall", "repair")},
            "target_ms": 5.0}


def planes() -> dict:
    topo = from_dict({**builtin().to_dict(), "link_rate": f"{PLANE_RATE / 1e6:g}mbit"}, "<bench>")
    name = "benchp"
    build.up(topo, name)
    try:
        runs = []
        with Fabric.open(name) as fabric:
            for _ in range(ROUNDS):
                r = send(fabric, "h0", "h2", SIZE, mtu=MTU)
                if not r.verified:
                    runs.append(_failed(r))
                    continue
                runs.append({"goodput_gbps": r.goodput_gbps,
                             "ratio": round(r.goodput_gbps * 1e9 / (topo.planes * PLANE_RATE), 3),
                             "retransmits": r.requester["stats"]["retransmits"]})
    finally:
        build.down(name)
    failed = sum("failed" in x for x in runs)
    ratio = _median(x["ratio"] for x in runs if "failed" not in x)
    return {"planes": topo.planes, "rate_per_plane_mbit": PLANE_RATE / 1e6, "runs": runs, "failed_runs": failed,
            "ratio_to_planes_x_rate": ratio, "target": 0.9, "met": _target(ratio, 0.9, failed)["met"]}


def _failed(r) -> dict:
    """A WRITE that failed or was not verified: recorded as such, with why; the bench goes on."""
    return {"failed": r.error or "the placed bytes differ from the source (SHA-256)", "completion_ms": r.completion_ms}


def _median(values) -> float | None:
    return percentile(list(values), 50)


def _target(value: float | None, target: float, failed: int) -> dict:
    """A target is met only by a figure from rounds that all completed."""
    return {"value": value, "target": target, "failed_rounds": failed,
            "met": value is not None and failed == 0 and value >= target}


PARTS = ("goodput", "recovery", "planes")


def main(argv: list[str] | None = None) -> None:
    global ROUNDS
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="rounds of each part (default %(default)s)")
    parser.add_argument("--only", choices=PARTS, action="append", help="run only this part (repeatable; default all)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    ROUNDS = args.rounds
    parts = args.only or PARTS
    out = {}
    if "goodput" in parts or "recovery" in parts:
        name = "bencht"
        build.up(builtin(), name)
        try:
            with Fabric.open(name) as fabric:
                if "goodput" in parts:
                    out["goodput"] = goodput(fabric)
                if "recovery" in parts:
                    out["recovery"] = recovery(fabric)
        finally:
            build.down(name)
    if "planes" in parts:
        out["plane_aggregation"] = planes()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
