"""One MRC transfer on a running fabric: responder in DST's namespace, requester in SRC's.

Why it exists: this is what `mrc-emu send`, the system tests, the benchmarks and the
scenarios run. The responder is a child process (its own core: Python has one per
process) that entered DST's namespace; the requester runs in the calling thread with
sockets opened in SRC's namespace. QP set-up is out of band, as RDMA's connection manager
would do it: the child sends its QPN, starting PSN, R_Key, VA and length over a pipe.

The child is recorded in the fabric's journal (so `clean` can kill it after a crash) and
dies with its parent (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import ctypes
import hashlib
import multiprocessing
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..fabric import netns, ops, registry
from ..fabric.build import load_topology
from ..topology.evs import EvFormat
from ..transport.cc import make_cc
from ..transport.ev import EvState
from ..transport.link import Path, SocketLink, run_socket, udp_receiver
from ..transport.paths import qp_paths
from ..transport.qp import QpConfig, Requester, Responder

PR_SET_PDEATHSIG = 1
TIMELINE_TICK_NS = 1_000_000  # goodput timeline resolution


class TransferError(RuntimeError):
    """The transfer could not be set up (bad arguments, responder failed to start)."""


@dataclass
class Control:
    """Shared with other threads while a transfer runs: progress and EV states, read-only to them."""

    progress: float = 0.0
    bytes_acked: int = 0
    ev_states: dict[int, str] = field(default_factory=dict)
    started_ns: int = 0
    finished: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)  # set to abandon the transfer
    # (progress fraction, action): run once, inside the requester's loop, when progress reaches it;
    # the time it returned (ns since the transfer started) lands in `fired`
    hooks: list[tuple[float, Callable[[], object]]] = field(default_factory=list)
    fired: list[tuple[float, int, int]] = field(default_factory=list)  # (fraction, started, returned)


@dataclass
class TransferResult:
    ok: bool
    error: str | None
    src: str
    dst: str
    size: int
    mtu: int
    ev_format: str
    cc: str
    evs: list[int]
    start_ns: int
    end_ns: int
    completion_ms: float | None
    goodput_gbps: float | None
    goodput_pps: float | None
    sha256_source: str
    sha256_placed: str | None
    requester: dict[str, Any]
    responder: dict[str, Any]
    per_ev: list[dict[str, Any]]
    ev_events: list[dict[str, Any]]
    timeline: list[tuple[int, int]]  # (ns since start, bytes acknowledged so far), every ~1 ms
    imm_completions: list[dict[str, Any]] = field(default_factory=list)

    @property
    def verified(self) -> bool:
        return self.ok and self.sha256_placed == self.sha256_source

    def to_dict(self, timeline: bool = False) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k not in ("timeline",)}
        out["verified"] = self.verified
        if timeline:
            out["timeline"] = [[round(t / 1e6, 3), b] for t, b in self.timeline]
        return out


def _die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _kernel_udp_counters() -> dict[str, int]:
    """UDP drop counters of the namespace this process is in (checksum errors, full buffers)."""
    wanted = ("Udp6InErrors", "Udp6RcvbufErrors", "Udp6InCsumErrors", "Udp6NoPorts")
    out = {}
    try:
        for line in open("/proc/net/snmp6"):
            key, _, value = line.partition(" ")
            if key in wanted:
                out[key] = int(value)
    except OSError:
        pass
    return out


def _responder_main(conn, ns_path: str, address: str, size: int, qpn: int, peer_qpn: int, start_psn: int,
                    back: dict[int, Path], peer: str, config: QpConfig) -> None:
    """The child: enter DST's namespace, register memory, accept the QP, serve until told to finish."""
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and tells us to finish
    try:
        fd = os.open(ns_path, os.O_RDONLY)
        netns.setns(fd)
        os.close(fd)
        recv = udp_receiver(address)
        send = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_RAW)
        responder = Responder(socket.inet_pton(socket.AF_INET6, address), config)
        buffer = bytearray(size)
        mr = responder.register(buffer)
        responder.accept(qpn, peer_qpn, start_psn, back, peer=socket.inet_pton(socket.AF_INET6, peer))
        counters_before = _kernel_udp_counters()
        conn.send(("ready", mr.to_dict()))
    except Exception as exc:  # report any set-up failure to the parent, which raises it
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    finished = []

    def poll(_now: int) -> None:
        if conn.poll():
            finished.append(conn.recv())

    run_socket(responder, SocketLink(send, recv), lambda: bool(finished), tick=poll, tick_ns=10_000_000)
    after = _kernel_udp_counters()
    conn.send(("result", {
        "sha256_placed": hashlib.sha256(buffer).hexdigest(),
        "stats": responder.stats,
        "drops": responder.drops,
        "kernel_udp": {k: after.get(k, 0) - counters_before.get(k, 0) for k in after},
        "imm_completions": [{"psn": c.psn, "imm": c.imm, "time_ns": c.time_ns} for c in responder.completions],
    }))


def send(name: str, src: str, dst: str, size: int, evs: list[int] | None = None, cc: str = "nscc",
         mtu: int = 4096, ev_format: EvFormat = EvFormat.SRV6, ev_min_active: int = 1,
         imm: int | None = None, config: QpConfig | None = None, control: Control | None = None,
         on_progress: Callable[[int, int], None] | None = None, linger_s: float = 0.0,
         data: bytes | None = None) -> TransferResult:
    """WRITE `size` random bytes from host `src` to a buffer registered at host `dst`.

    `linger_s`: after the WRITE completes, keep the QP alive (probing ASSUMED_BAD EVs) until
    every EV not DENIED is GOOD again, or this many seconds pass.
    """
    if size <= 0:
        raise TransferError(f"size must be at least one byte, not {size}")
    topo = load_topology(name)
    paths = qp_paths(topo, src, dst, ev_format, evs)
    config = config or QpConfig(mtu=mtu)
    if ev_format is EvFormat.UDP:
        config.path_avoidance = False
    control = control or Control()
    src_ns, dst_ns = ops.node_path(name, src), ops.node_path(name, dst)
    source = data if data is not None else os.urandom(size)
    if len(source) != size:
        raise TransferError("data and size disagree")
    sha_source = hashlib.sha256(source).hexdigest()
    qpn_req, qpn_resp = 0x000100 + os.getpid() % 0xFF00, 0x010000 + os.getpid() % 0xFF00
    start_psn = int.from_bytes(os.urandom(3), "big")

    ctx = multiprocessing.get_context("fork")
    parent_conn, child_conn = ctx.Pipe()
    child = ctx.Process(target=_responder_main, name=f"mrc-emu responder {dst}", daemon=True,
                        args=(child_conn, str(dst_ns), paths.dst_address, size, qpn_resp, qpn_req, start_psn,
                              paths.back, paths.src_address, config))
    child.start()
    with registry.Journal.open(name) as journal:
        journal.process(child.pid, f"MRC responder in {dst}")
    try:
        if not parent_conn.poll(30):
            raise TransferError("the responder did not start within 30 s")
        kind, info = parent_conn.recv()
        if kind != "ready":
            raise TransferError(f"the responder in {dst} failed to start: {info}")
        with netns.entered(src_ns):
            recv = udp_receiver(paths.src_address)
            raw = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_RAW)
        try:
            result = _run_requester(paths, config, cc, ev_min_active, qpn_req, qpn_resp, start_psn, info, source,
                                    imm, control, on_progress, linger_s, SocketLink(raw, recv))
        finally:
            raw.close()
            recv.close()
        parent_conn.send("finish")
        if not parent_conn.poll(60):
            raise TransferError("the responder did not report its result within 60 s")
        kind, responder = parent_conn.recv()
    finally:
        if child.is_alive():
            try:
                parent_conn.send("finish")
            except OSError:
                pass
            child.join(timeout=5)
        if child.is_alive():
            child.kill()
            child.join()
        with registry.Journal.open(name) as journal:
            journal.process_ended(child.pid)
        control.finished.set()
    requester, timeline, start_ns, end_ns, completion_ns = result
    ok = requester.error is None and completion_ns is not None
    elapsed = (completion_ns - start_ns) if ok else None
    packets = -(-size // config.mtu)
    share = requester.profile.share()
    per_ev = []
    for k, stats in requester.profile.evs.items():
        entry = stats.to_dict()
        entry["share"] = round(share[k], 4)
        path = paths.forward[k]
        ev = next(e for e in paths.evs if e.index == k)
        entry.update({"plane": ev.plane, "spine": ev.spine, "first_hop": path.first_hop})
        per_ev.append(entry)
    return TransferResult(
        ok=ok, error=requester.error or (None if ok else "the transfer was stopped before it completed"),
        src=src, dst=dst, size=size, mtu=config.mtu, ev_format=ev_format.value, cc=requester.cc.name,
        evs=sorted(paths.forward), start_ns=start_ns, end_ns=end_ns,
        completion_ms=round(elapsed / 1e6, 3) if elapsed else None,
        goodput_gbps=round(size * 8 / elapsed, 3) if elapsed else None,
        goodput_pps=round(packets / (elapsed / 1e9)) if elapsed else None,
        sha256_source=sha_source, sha256_placed=responder["sha256_placed"],
        requester={"stats": requester.summary(), "drops": requester.drops},
        responder={k: v for k, v in responder.items() if k not in ("sha256_placed", "imm_completions")},
        per_ev=per_ev, ev_events=[e.to_dict(start_ns) for e in requester.ev_events],
        timeline=timeline, imm_completions=responder["imm_completions"],
    )


def _run_requester(paths, config, cc, ev_min_active, qpn_req, qpn_resp, start_psn, mr, source, imm, control,
                   on_progress, linger_s, link):
    requester = Requester(socket.inet_pton(socket.AF_INET6, paths.src_address), qpn_req, qpn_resp, paths.forward,
                          paths.probes, config, make_cc(cc, config.mtu), start_psn=start_psn,
                          ev_min_active=ev_min_active)
    size = len(source)
    timeline: list[tuple[int, int]] = []
    start_ns = time.monotonic_ns()
    control.started_ns = start_ns
    requester.post_write(source, mr["va"], mr["rkey"], imm, now=start_ns)
    last_report = [0]

    def tick(now: int) -> None:
        acked = requester.bytes_acked
        timeline.append((now - start_ns, acked))
        control.bytes_acked = acked
        control.progress = acked / size
        control.ev_states = {k: s.state.value for k, s in requester.profile.evs.items()}
        while control.hooks and control.progress >= control.hooks[0][0]:
            fraction, action = control.hooks.pop(0)
            began = time.monotonic_ns()
            action()
            control.fired.append((fraction, began - start_ns, time.monotonic_ns() - start_ns))
        if on_progress is not None and now - last_report[0] >= 100_000_000:
            last_report[0] = now
            on_progress(acked, size)

    run_socket(requester, link, lambda: requester.done or control.stop.is_set(), tick=tick,
               tick_ns=TIMELINE_TICK_NS)
    end_ns = time.monotonic_ns()
    tick(end_ns)
    completion_ns = requester.completions[-1].time_ns if requester.completions and requester.error is None else None
    if on_progress is not None:
        on_progress(requester.bytes_acked, size)
    if linger_s > 0 and requester.error is None:
        deadline = end_ns + int(linger_s * 1e9)

        def healed() -> bool:
            return control.stop.is_set() or time.monotonic_ns() > deadline or all(
                s.state is not EvState.ASSUMED_BAD for s in requester.profile.evs.values())

        run_socket(requester, link, healed, tick=tick, tick_ns=10_000_000)
    return requester, timeline, start_ns, end_ns, completion_ns
