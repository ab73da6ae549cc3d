#!/usr/bin/env python3
"""mrc-emu's side of scripts/interop-rxe.sh: the baseline transport (RoCEv2 RC as deployed:
QpConfig.baseline(), go-back-N, DCQCN) against rdma_rxe, a real RoCE stack, over one veth.

Each run is one direction and one size. mrc-emu's QP lives in a network namespace (its sockets
are made there: a raw IPv6 socket out, a UDP socket on [address]:4791 in, the io layer's
SocketLink), rxe in the initial one (its UDP socket is there, docs/interop.md); the rxe side is
scripts/rxe_peer.py under the system Python (pyverbs), spoken to over a pipe. A run:

  to-rxe    the baseline's requester WRITEs `size` bytes into rxe's MR and completes on rxe's
            ACKs; rxe's side reports the MR's SHA-256
  from-rxe  rxe's requester WRITEs `size` bytes, then WRITE WITH IMMEDIATE `size` more, into the
            baseline responder's region; every work completion must be IBV_WC_SUCCESS and both
            halves' SHA-256 equal what rxe sent

tcpdump captures the run on rxe's side of the veth; every RoCE packet of the pcap is then opened
and decoded by mrc-emu's own decoder (mrc_emu/wire: the UDP checksum, every length, the ICRC),
and the data packets whose PSN went out before count as retransmissions, per sender; what the
order of arrival says (reordering, each NAK's neighbourhood, ACK waits) is scripts/rxe_pcap.py's.

mrc-emu's process runs on one CPU (--no-pin: wherever the scheduler puts it), as a NIC sends a
QP's packets from one queue: a veth hands each packet to the receive backlog of the CPU that sent
it, so a sender that moves between CPUs could in principle have later packets reach rxe first. A
precaution: no run has shown it to matter (docs/interop.md, "The clean 64 MiB WRITE to rxe").
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import secrets
import select
import socket
import subprocess
import sys
import time
from pathlib import Path

from rxe_pcap import check_pcap
from rxe_peer import pattern

from mrc_emu.fabric.kernel import netns
from mrc_emu.fabric.ops import RING_FLUSH_S
from mrc_emu.io.sockets import SocketLink, udp_receiver
from mrc_emu.topology.evs import UDP_SPORT_BASE
from mrc_emu.transport.cc.registry import make_cc
from mrc_emu.transport.config import QpConfig
from mrc_emu.transport.multipath.paths import Path as QpPath
from mrc_emu.transport.requester import Requester
from mrc_emu.transport.responder import Responder
from mrc_emu.wire import format as fmt
from mrc_emu.wire.encoder import Encap, FrameTemplate

PEER = Path(__file__).with_name("rxe_peer.py")
MY_QPN, MY_PSN = 0x11, 0x777
REGION_VA = 0x1000_0000
RUN_LIMIT_S = 1800.0  # a run not done by then has failed (the VM is an emulated CPU: 64 MiB takes minutes)
WAIT_S = 0.05  # the longest select() while the endpoint has nothing due (it ends at once on a datagram)


def rxe_counters(device: str) -> dict[str, int]:
    """rxe's port counters (`rdma statistic show link DEV/1`), name -> value."""
    out = subprocess.run(["rdma", "statistic", "show", "link", f"{device}/1"], capture_output=True, text=True,
                         check=True).stdout
    return {k: int(v) for k, v in re.findall(r"(\w+) (\d+)", out)}


def backlog_drops() -> int:
    """Packets the kernel dropped from a CPU's receive backlog (/proc/net/softnet_stat, column 2,
    summed over the CPUs): a veth hands what it carries to that backlog, a full one drops."""
    try:
        return sum(int(line.split()[1], 16) for line in Path("/proc/net/softnet_stat").read_text().splitlines())
    except (OSError, IndexError, ValueError):
        return -1


def kernel_log() -> list[str]:
    """The kernel's log, a line each (a run's new lines are those past the count before it)."""
    return subprocess.run(["dmesg"], capture_output=True, text=True).stdout.splitlines()


def rdma_lines(lines: list[str]) -> list[str]:
    """The lines about RDMA: rxe's own (a bad ICRC, a QP error), not tcpdump's promiscuous mode."""
    return [line for line in lines if re.search(r"rdma|rxe|icrc|infiniband", line, re.I) and "promiscuous" not in line]


class Capture:
    """tcpdump on one interface into a pcap, every byte of every RoCE packet (ICRC included)."""

    def __init__(self, iface: str, pcap: Path, size: int) -> None:
        self.pcap = pcap
        ring_kib = max(65536, size * 3 // 1024)  # the run's frames whole, resends and ACKs beside them
        self.proc = subprocess.Popen(["tcpdump", "-i", iface, "-s", "0", "-B", str(ring_kib), "-w", str(pcap), "-n",
                                      "udp port 4791"], stderr=subprocess.PIPE, text=True)
        line = self.proc.stderr.readline()  # "listening on ...": capturing from here on
        if "listening" not in line:
            raise SystemExit(f"interop_rxe: tcpdump did not start: {line.strip()}")

    def stop(self) -> dict[str, int]:
        """Once the pcap has stopped growing for RING_FLUSH_S (TPACKET_V3's block timer: a block
        of the ring reaches the file within it; mrc_emu.fabric.ops.Capture does the same), end
        tcpdump and read its statistics."""
        seen, since = -1, time.monotonic()
        while time.monotonic() - since <= RING_FLUSH_S and self.proc.poll() is None:
            size = self.pcap.stat().st_size if self.pcap.exists() else 0
            if size != seen:
                seen, since = size, time.monotonic()
            time.sleep(0.05)  # a poll of the file's size; the block timer is the kernel's, not ours to wake on
        self.proc.send_signal(2)
        err = self.proc.communicate(timeout=120)[1]
        return {k.replace(" ", "_"): int(n) for n, k in re.findall(r"(\d+) packets? (captured|received by filter|"
                                                                   r"dropped by kernel)", err)}


class Peer:
    """scripts/rxe_peer.py, one JSON line each way. `running`: every one started, ended by `end_all`."""

    running: list[Peer] = []

    @classmethod
    def end_all(cls) -> None:
        """Whatever peer a broken run left behind, ended by its own handle."""
        for peer in cls.running:
            if peer.proc.poll() is None:
                peer.proc.kill()
                peer.proc.wait()
        cls.running.clear()

    def __init__(self, args: argparse.Namespace, role: str, size: int) -> None:
        self.proc = subprocess.Popen(["/usr/bin/python3", str(PEER), "--device", args.device, "--address",
                                      args.rxe_address, "--role", role, "--size", str(size), "--timeout",
                                      str(args.rxe_timeout)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        Peer.running.append(self)

    def hear(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"interop_rxe: rxe_peer.py ended (exit {self.proc.wait()})")
        return json.loads(line)

    def say(self, obj: dict) -> None:
        self.proc.stdin.write(json.dumps(obj) + "\n")
        self.proc.stdin.flush()

    def close(self) -> int:
        self.proc.stdin.close()
        return self.proc.wait(timeout=60)


def sockets(ns: str, address: str) -> SocketLink:
    with netns.entered(f"/run/netns/{ns}"):
        send = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_RAW)
        recv = udp_receiver(address)  # it takes rxe's datagrams, which carry no UDP checksum
    return SocketLink(send, recv)


def drive(endpoint, link: SocketLink, done, extra_fd=None, limit_s: float = RUN_LIMIT_S) -> bool:
    """The endpoint over its sockets until `done()` (or `extra_fd` is readable): datagrams in,
    pump, then select() until the next datagram or the endpoint's next wakeup. False: timed out."""
    clock = time.monotonic_ns
    fds = [link.recv_sock] + ([extra_fd] if extra_fd is not None else [])
    limit = clock() + int(limit_s * 1e9)
    while not done():
        link.receive(endpoint, clock, 64)
        endpoint.pump(clock(), link.send, clock)
        now = clock()
        if now > limit:
            return False
        wake = endpoint.next_wakeup()
        wait = WAIT_S if wake is None else min(WAIT_S, max(0.0, (wake - now) / 1e9))
        readable = select.select(fds, [], [], wait)[0]
        if extra_fd is not None and extra_fd in readable:
            link.receive(endpoint, clock, 1 << 20)
            endpoint.pump(clock(), link.send, clock)
            return True
    return True


def to_rxe(args: argparse.Namespace, size: int, link: SocketLink, path: QpPath, mrc: bool = False) -> dict:
    """The baseline's requester -> rxe's responder; `mrc`: MRC's own requester instead (SACK
    recovery, path avoidance, `--mrc-evs` EVs: as many UDP source ports over the one link; a
    fixed window of `--mrc-window` packets, so that what happens is the wire's doing, not NSCC's)."""
    peer = Peer(args, "responder", size)
    info = peer.hear()
    if mrc:
        config = QpConfig(mtu=args.mtu)
        cc = make_cc("fixed", args.mtu, window=args.mrc_window * args.mtu)
        paths = {ev: QpPath(ev, args.rxe_address, FrameTemplate(fmt.Endpoints(args.local, args.rxe_address, UDP_SPORT_BASE + ev),
                                                                Encap.udp())) for ev in range(args.mrc_evs)}
    else:
        config = QpConfig.baseline(mtu=args.mtu, link_rate_bps=args.rate, ack_timeout_exp=args.ack_timeout_exp)
        cc = make_cc("dcqcn", args.mtu, args.rate, None)
        paths = {0: path}
    req = Requester(socket.inet_pton(socket.AF_INET6, args.local), MY_QPN, info["qpn"], paths, config, cc,
                    start_psn=MY_PSN, random_bits=secrets.randbits)
    data = pattern(args.seed, size)
    peer.say({"qpn": MY_QPN, "psn": MY_PSN, "gid": args.local, "rkey": 0, "va": 0})
    peer.hear()  # rxe's QP is ready to receive
    began, began_ns = time.monotonic(), time.monotonic_ns()
    req.post_write(data, info["va"], info["rkey"], now=began_ns)
    finished = drive(req, link, lambda: req.done, limit_s=args.limit)
    seconds = time.monotonic() - began
    peer.say({"done": True})
    answer = peer.hear()
    theirs = answer["sha256"]
    peer.close()
    mine = hashlib.sha256(data).hexdigest()
    summary = req.summary()
    return {"bytes": size, "completed": finished and req.error is None and bool(req.completions),
            "error": req.error, "seconds": round(seconds, 3), "sha256_sent": mine, "sha256_placed": theirs,
            "rxe_qp_state": answer.get("qp_state"), "ack_timeout_ms": config.ack_timeout_ns / 1e6,
            "sha256_equal": mine == theirs,
            "mrc_emu": {k: summary[k] for k in ("packets_sent", "retransmits", "naks", "timeouts", "bytes_acked", "lost_by",
                                                "probes_sent", "probes_returned")}
            | {"drops": dict(req.drops), "ev_events": [e.to_dict(began_ns) for e in req.profile.events]}}


def from_rxe(args: argparse.Namespace, size: int, link: SocketLink, path: QpPath) -> dict:
    """rxe's requester -> the baseline's responder: a WRITE, then a WRITE WITH IMMEDIATE."""
    peer = Peer(args, "requester", size)
    info = peer.hear()
    config = QpConfig.baseline(mtu=args.mtu)
    resp = Responder(socket.inet_pton(socket.AF_INET6, args.local), config, random_bits=secrets.randbits)
    buffer = bytearray(2 * size)
    mr = resp.register(buffer, va=REGION_VA)
    resp.accept(MY_QPN, info["qpn"], info["psn"], {0: path}, peer=socket.inet_pton(socket.AF_INET6, args.rxe_address),
                config=config)
    resp.post_recv(MY_QPN, 1)
    peer.say({"qpn": MY_QPN, "psn": MY_PSN, "gid": args.local, "rkey": mr.rkey, "va": mr.va})
    peer.hear()
    began = time.monotonic()
    finished = drive(resp, link, lambda: False, peer.proc.stdout, args.limit)
    seconds = time.monotonic() - began
    result = peer.hear() if finished else {"wcs": [], "sha256": ["", ""]}
    peer.close()
    placed = [hashlib.sha256(buffer[:size]).hexdigest(), hashlib.sha256(buffer[size:]).hexdigest()]
    wcs = result["wcs"]
    imms = [c.imm for c in resp.completions]
    return {"bytes": 2 * size, "completed": finished and len(wcs) == 2 and all(w["success"] for w in wcs),
            "seconds": round(seconds, 3), "work_completions": wcs, "sha256_sent": result["sha256"],
            "sha256_placed": placed, "sha256_equal": placed == result["sha256"],
            "immediates": {"sent": result.get("imm"), "completed": imms}, "rxe_qp_state": result.get("qp_state"),
            "rxe_ack_timeout_ms": 4.096e-3 * 2 ** args.rxe_timeout,
            "mrc_emu": {k: resp.stats[k] for k in ("packets_placed", "bytes_placed", "duplicates", "acks_sent",
                                                   "naks_sent")} | {"drops": dict(resp.drops)}}


RXE_ERRORS = ("rcvd_seq_err", "out_of_seq_request", "duplicate_request", "completer_retry_err", "retry_exceeded_err",
              "send_err", "rcvd_rnr_err", "retry_rnr_exceeded_err")


def _order(sender: dict) -> str:
    """Its packets that came behind a higher PSN of its own: late originals / first seen in a resend."""
    order = sender.get("order")
    return f"{order['reordered']} / {order['first_seen_resent']}" if order else "-"


def table(results: Path) -> str:
    """The runs of a --out file, one line each: what the issue asks to see."""
    head = ("direction", "size", "link", "bytes placed", "SHA-256 equal", "completed", "mrc-emu resent / NAKs / timeouts",
            "rxe resent (pcap)", "rxe error counters", "pcap parsed (ICRC checked)", "kernel log", "reordered / lost before capture",
            "local losses", "ACK wait p99 / max ms", "seconds")
    rows = [head]
    for line in results.read_text().splitlines():
        r = json.loads(line)
        mine = r["mrc_emu"]
        if not mine:
            resent = r.get("error", "failed")
        elif r["direction"] != "from-rxe":
            resent = f"{mine['retransmits']} / {mine['naks']} heard / {mine['timeouts']} timeouts"
        else:
            resent = f"0 / {mine['naks_sent']} sent"
        errors = {k: v for k, v in r["rxe_counters"].items() if k in RXE_ERRORS}
        parsed = sum(s["parsed"] for s in r["pcap"].values())
        packets = sum(s["packets"] for s in r["pcap"].values())
        sender = r["pcap"]["rxe" if r["direction"] == "from-rxe" else "mrc-emu"]  # the data's sender
        wait = sender.get("ack_wait_ms")
        losses = r.get("local_losses", {})
        rows.append((r["direction"], str(r["size"]), r["link"], str(r.get("mrc_emu", {}).get("bytes_placed", r["bytes"])
                     if r["direction"] == "from-rxe" else r["bytes"]), "yes" if r["sha256_equal"] else "NO",
                     "yes" if r["completed"] else "NO", resent, str(r["pcap"]["rxe"]["retransmitted"]),
                     " ".join(f"{k}={v}" for k, v in errors.items()) or "none", f"{parsed}/{packets}",
                     str(len(r["kernel_log"])), _order(sender),
                     f"{losses.get('backlog_drops', '-')} / {losses.get('raw_socket_send_errors', '-')}",
                     f"{wait['p99']} / {wait['max']}" if wait else "-", str(r["seconds"])))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


def main() -> int:
    if sys.argv[1:2] == ["--table"]:
        print(table(Path(sys.argv[2])))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ns", required=True, help="the namespace mrc-emu's side lives in")
    parser.add_argument("--local", required=True, help="mrc-emu's address there")
    parser.add_argument("--rxe-address", required=True, help="the address of rxe's netdev (initial namespace)")
    parser.add_argument("--iface", required=True, help="rxe's netdev, where tcpdump listens")
    parser.add_argument("--device", default="rxe0")
    parser.add_argument("--sizes", default="4096,1048576,67108864")
    parser.add_argument("--directions", default="to-rxe,from-rxe", help="to-rxe, from-rxe, mrc-to-rxe (MRC's own requester)")
    parser.add_argument("--mrc-evs", type=int, default=4, help="mrc-to-rxe: the EVs (UDP source ports) MRC sprays over")
    parser.add_argument("--mrc-window", type=int, default=64, help="mrc-to-rxe: the fixed window, packets")
    parser.add_argument("--limit", type=float, default=RUN_LIMIT_S, help="seconds a run may take")
    # ACK timeouts of 268 ms on both sides, where an emulated CPU's late ACK is not taken for a loss:
    # under TCG the baseline's own (t=15: 33.5 ms) fired twice on a clean 64 MiB run and rxe's (t=14:
    # 67 ms) 94 times, every ACK late, none lost (docs/interop.md)
    parser.add_argument("--ack-timeout-exp", type=int, default=18, help="the baseline requester's t: 1.024 us x 2^t (268 ms)")
    parser.add_argument("--rxe-timeout", type=int, default=16, help="rxe's QP's t: 4.096 us x 2^t (268 ms)")
    parser.add_argument("--label", default="clean", help="the link's condition, for the report (clean, lossy)")
    parser.add_argument("--mtu", type=int, default=4096)
    parser.add_argument("--rate", type=float, default=10e9, help="DCQCN's line rate, bit/s")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--pcaps", type=Path, required=True, help="directory for the pcaps")
    parser.add_argument("--keep-pcap-below", type=int, default=1 << 20, help="delete a run's pcap once checked if its size is this or more")
    parser.add_argument("--out", type=Path, help="append each run's JSON line here")
    parser.add_argument("--no-pin", action="store_true", help="leave mrc-emu's process on any CPU (default: one)")
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    if not args.no_pin:
        os.sched_setaffinity(0, {cpus[0]})  # one send queue, as a NIC's (module docstring)
    link = sockets(args.ns, args.local)
    path = QpPath(0, args.rxe_address, FrameTemplate(fmt.Endpoints(args.local, args.rxe_address, UDP_SPORT_BASE),
                                                     Encap.udp(), data_tclass=fmt.TCLASS_DATA_NO_TRIM))
    failed = 0
    for direction in args.directions.split(","):
        for size in (int(s) for s in args.sizes.split(",")):
            pcap = args.pcaps / f"{direction}-{size}-{args.label}.pcap"
            log_before, counters_before = len(kernel_log()), rxe_counters(args.device)
            drops_before, send_errors_before = backlog_drops(), link.send_errors
            capture = Capture(args.iface, pcap, size)
            try:
                if direction == "from-rxe":
                    run = from_rxe(args, size, link, path)
                else:
                    run = to_rxe(args, size, link, path, mrc=direction == "mrc-to-rxe")
            except (Exception, SystemExit) as failure:  # noqa: BLE001 - a run that broke is reported, the next one runs
                run = {"bytes": 0, "completed": False, "sha256_equal": False, "error": f"{type(failure).__name__}: {failure}",
                       "seconds": 0, "mrc_emu": {}}
            finally:
                Peer.end_all()
                capture_stats = capture.stop()
            after = rxe_counters(args.device)
            run = {"direction": direction, "size": size, "link": args.label} | run
            run["cpus"] = sorted(os.sched_getaffinity(0))
            run["rxe_counters"] = {k: v - counters_before.get(k, 0) for k, v in after.items() if v != counters_before.get(k, 0)}
            run["kernel_log"] = rdma_lines(kernel_log()[log_before:])
            # losses inside the machine, not on the link: a send the raw socket refused (a full queue:
            # counted, the packet lost) and the receive backlog's drops (every CPU's, any interface's)
            run["local_losses"] = {"raw_socket_send_errors": link.send_errors - send_errors_before,
                                   "backlog_drops": backlog_drops() - drops_before}
            run["capture"] = capture_stats
            run["pcap"] = check_pcap(pcap, args.rxe_address)
            run["pcap_all_parsed"] = all(s["parsed"] == s["packets"] for s in run["pcap"].values())
            if size >= args.keep_pcap_below:
                pcap.unlink()
            else:
                run["pcap_file"] = pcap.name
            ok = run["completed"] and run["sha256_equal"] and run["pcap_all_parsed"]
            run["ok"] = ok
            failed += not ok
            line = json.dumps(run)
            print(line, flush=True)
            print(f"interop_rxe.py: {direction} {size} {args.label}: {'ok' if ok else 'FAILED'} (completed "
                  f"{run['completed']}, SHA-256 equal {run['sha256_equal']}, pcap all parsed {run['pcap_all_parsed']}, "
                  f"{run['seconds']} s)", file=sys.stderr, flush=True)
            if args.out:
                with args.out.open("a") as f:
                    f.write(line + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
