"""Operations on a running fabric: inspect it, run commands and captures in a node, open sockets.

Why it exists: the CLI and the experiments need these, and the CLI must stay thin.
Everything here acts only on namespaces that the fabric's journal records, through a `Fabric`.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyroute2 import IPRoute

from ..topology import ev_count
from .kernel import netns
from .kernel.waiting import WaitTimeout, until
from .limits import available_memory
from .nodes import FabricSetupError
from .running import Fabric


def status(fabric: Fabric) -> dict[str, Any]:
    """Every node with role and plane, every link with ends, interfaces, plane and state."""
    record = fabric.state()
    topo = fabric.topology
    oper: dict[str, bool] = {}
    missing = []
    for node_name in topo.nodes:
        path = fabric.netns(node_name)
        if not path.exists():
            missing.append(node_name)
            continue
        with netns.entered(path), IPRoute() as ipr:
            for link in ipr.get_links():
                oper[link.get("ifname")] = link.get("operstate") == "UP"
    links = []
    for link in topo.links:
        up = oper.get(link.a_intf, False) and oper.get(link.b_intf, False)
        links.append({
            "link_id": link.link_id, "a": link.a, "b": link.b, "a_intf": link.a_intf, "b_intf": link.b_intf,
            "plane": link.plane, "state": "up" if up else "down",
            "admin_down": link.link_id in record.down_links,
        })
    nodes = [
        {"name": n.name, "role": n.role.value, "plane": n.plane, "node_id": n.node_id,
         "netns": str(fabric.netns(n.name))}
        for n in topo.nodes.values()
    ]
    return {
        "name": fabric.name,
        "ready": record.ready,
        "topology": topo.summary(),
        "ev_count": ev_count(topo),
        "nodes": nodes,
        "links": links,
        "missing_namespaces": missing,
    }


def exec_in(fabric: Fabric, node: str, argv: Sequence[str]) -> None:
    """Replace this process with `argv` running in the node's namespace (like ip netns exec)."""
    netns.move_to(fabric.node_path(node))
    try:
        os.execvp(argv[0], list(argv))
    except FileNotFoundError:
        raise FabricSetupError(f"command not found: {argv[0]}") from None


def host_sockets(fabric: Fabric, host: str) -> tuple[socket.socket, socket.socket]:
    """A raw IPv6 socket that sends whole frames and a raw UDP socket that receives, in `host`."""
    with netns.entered(fabric.node_path(host)):
        send = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_RAW)
        recv = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_UDP)
    return send, recv


BURST_DILATIONS = (1, 4, 16, 64)


def burst_dilation(fabric: Fabric, host: str, frames: Sequence[tuple[bytes, str]], factor: float = 2.0) -> tuple[int, float]:
    """(K, bits/s): the first K of BURST_DILATIONS at which `host`'s raw socket hands `frames`
    ((frame, first hop), sent once) to the kernel at `factor` x the link rate / K or faster.

    A burst from raw sockets builds a queue at a port only if it arrives faster than the port
    drains; a send returns once the kernel has forwarded the frame up to its first queue, so this
    is the machine's own forwarding speed (1 frame in about a millisecond in a VM under TCG). A
    caller that needs the queue runs the ports at rate / K (build.shape_node), as a run under time
    dilation K does: the same bytes of buffer and thresholds, K times slower."""
    raw, unused = host_sockets(fabric, host)
    unused.close()
    raw.setsockopt(socket.SOL_SOCKET, 32, 64 << 20)  # SO_SNDBUFFORCE: a full buffer never blocks the burst
    try:
        began = time.monotonic()
        for frame, hop in frames:
            raw.sendto(frame, (hop, 0))
        bps = sum(len(f) for f, _ in frames) * 8 / max(time.monotonic() - began, 1e-9)
    finally:
        raw.close()
    rate = fabric.topology.link_rate_bps or 0
    return next((k for k in BURST_DILATIONS if bps >= factor * rate / k), BURST_DILATIONS[-1]), bps


CAPTURE_BUFFER_KIB = 65536  # tcpdump -B by default: 64 MiB of ring
CAPTURE_RING_MEMORY_SHARE = 0.25  # a capture's ring takes at most this share of the memory available
RING_FLUSH_S = 1.1  # tcpdump's 1000 ms packet timeout is the kernel's block retire timer (TPACKET_V3): what
                    # arrived before stop() reaches the file within it; the exit statistics check it
DRAIN_TIMEOUT_S = 120.0  # how long stop() lets tcpdump write out a full ring before it ends it


def ring_kib_for(expected_bytes: int, available: int | None = None) -> int:
    """tcpdump's ring (-B, KiB) that holds `expected_bytes` of frames whole, so nothing is dropped even
    when tcpdump gets no CPU until the traffic is over (on a busy 2-core machine the endpoints and
    the kernel's forwarding take both cores: docs/results.md, Pcaps). Half as much again for headers,
    ACKs and resends (go-back-N resent a sixth of the demo's WRITE); never below the default, nor
    above a share of the memory available (`available` bytes, or the kernel's MemAvailable)."""
    available = available_memory() if available is None else available
    wanted = max(CAPTURE_BUFFER_KIB, int(expected_bytes * 1.5) // 1024)
    if available is not None:
        wanted = min(wanted, max(CAPTURE_BUFFER_KIB, int(available * CAPTURE_RING_MEMORY_SHARE) // 1024))
    return wanted


@dataclass
class CaptureResult:
    """What tcpdump wrote and what it lost, from its own statistics on exit.

    `received`: packets its filter saw (the kernel counts them as they enter the ring);
    `dropped_kernel`: the ring was full ("packets dropped by kernel"); `dropped_interface`: the
    interface dropped them ("dropped by interface"); `left_in_ring`: received, not dropped and
    still not written when tcpdump exited. Each is lost from the pcap; `lost` sums them.
    """

    path: str
    packets: int | None  # written to the pcap ("packets captured"); None: tcpdump reported nothing
    interfaces: list[str]
    received: int | None = None
    dropped_kernel: int = 0
    dropped_interface: int = 0
    left_in_ring: int = 0
    snaplen: int = 0  # 0: whole packets

    @property
    def lost(self) -> int:
        return self.dropped_kernel + self.dropped_interface + self.left_in_ring

    @property
    def complete(self) -> bool:
        """Every packet the interfaces carried while the capture ran is in the pcap."""
        return self.packets is not None and self.lost == 0

    def problem(self) -> str | None:
        """None if complete, else one sentence that says what the pcap misses."""
        if self.packets is None:
            return "tcpdump exited without its statistics: how many packets it kept is unknown"
        if not self.lost:
            return None
        parts = [f"{n:,} {what}" for n, what in ((self.dropped_kernel, "dropped by the kernel (tcpdump's ring was full)"),
                                                 (self.dropped_interface, "dropped by the interface"),
                                                 (self.left_in_ring, "not written before tcpdump exited")) if n]
        return (f"the capture lost {self.lost:,} packets: {', '.join(parts)}; the pcap holds {self.packets:,} of "
                f"the {self.received or 0:,} its filter saw")

    @classmethod
    def of(cls, stderr: str, path: str, interfaces: list[str], snaplen: int = 0) -> CaptureResult:
        """From tcpdump's exit report."""
        stats = _statistics(stderr)
        captured, received = stats.get("captured"), stats.get("received")
        dropped_kernel = stats.get("dropped_kernel", 0)
        left = 0
        if captured is not None and received is not None:
            left = max(0, received - captured - dropped_kernel)  # the kernel counts its drops as received
        return cls(path, captured, interfaces, received, dropped_kernel, stats.get("dropped_interface", 0), left,
                   snaplen)

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "interfaces": self.interfaces, "packets": self.packets, "received": self.received,
                "dropped_kernel": self.dropped_kernel, "dropped_interface": self.dropped_interface,
                "left_in_ring": self.left_in_ring, "lost": self.lost, "complete": self.complete,
                "snaplen": self.snaplen, "problem": self.problem()}


def _statistics(stderr: str) -> dict[str, int]:
    """tcpdump's exit report ('2111 packets captured', '... received by filter', '... dropped by kernel',
    '... dropped by interface'; 'packet' when there is one) as {"captured": 2111, ...}."""
    found = {}
    for line in stderr.splitlines():
        words = line.split()
        if len(words) >= 3 and words[0].isdigit() and words[1] in ("packet", "packets"):
            found[" ".join(words[2:])] = int(words[0])
    return {key: found[text] for key, text in (("captured", "captured"), ("received", "received by filter"),
                                               ("dropped_kernel", "dropped by kernel"),
                                               ("dropped_interface", "dropped by interface")) if text in found}


class Capture:
    """tcpdump running in a node's namespace, recorded in the journal; `stop` ends it.

    No --immediate-mode: it makes libpcap use TPACKET_V2, whose ring of snaplen-sized frames (a
    few, with whole packets) overflowed at full rate (1,371 of 2,111 packets dropped on a 4 MiB
    WRITE). Blocks of TPACKET_V3 in a large buffer (-B) keep up; they reach the file within
    RING_FLUSH_S, so `stop` waits that long before it ends tcpdump.
    """

    def __init__(self, fabric: Fabric, node: str, out: str, iface: str | None = None, snaplen: int = 0,
                 buffer_kib: int = CAPTURE_BUFFER_KIB) -> None:
        path = fabric.node_path(node)
        topo = fabric.topology
        intfs = [topo.peer(link, node)[1] for link in topo.links_of(node)]
        if iface is not None and iface not in intfs + ["lo"]:
            raise FabricSetupError(f"{node} has no interface {iface!r} (it has: {', '.join(intfs)})")
        tcpdump = shutil.which("tcpdump")
        if tcpdump is None:
            raise FabricSetupError("tcpdump not found: apt-get install tcpdump (or run scripts/install.sh)")
        self.fabric = fabric
        self.interfaces = [iface] if iface else intfs
        self.snaplen = snaplen
        self.path = Path(out).resolve()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDONLY)
        cmd = [tcpdump, "-i", iface or "any", "-U", "-B", str(buffer_kib), "-Z", "root", "-s", str(snaplen), "-w",
               str(self.path)]
        try:
            self.proc = subprocess.Popen(cmd, preexec_fn=lambda: netns.setns(fd), stdout=subprocess.DEVNULL,
                                         stderr=subprocess.PIPE)
        finally:
            os.close(fd)
        fabric.journal.process(self.proc.pid, f"tcpdump in {node}")
        self._stderr = b""
        try:
            until(self._listening, 10.0, f"tcpdump in {node} to open its socket", wake=[self.proc.stderr])
        except (WaitTimeout, FabricSetupError) as exc:
            self.stop(flush=False)
            raise FabricSetupError(f"tcpdump did not start: {exc}") from None

    def _listening(self) -> bool:
        """tcpdump says 'listening on' once its socket is open: from then on nothing is missed."""
        fd = self.proc.stderr.fileno()
        if select.select([fd], [], [], 0)[0]:
            chunk = os.read(fd, 4096)
            if not chunk:
                raise FabricSetupError(self._stderr.decode(errors="replace").strip() or "it exited")
            self._stderr += chunk
        return b"listening on" in self._stderr

    def _written(self) -> int:
        try:
            return self.path.stat().st_size
        except FileNotFoundError:
            return 0

    def _drain(self) -> None:
        """Wait until tcpdump has written out its ring: the pcap stops growing for longer than the
        kernel's block timer (RING_FLUSH_S: a block retires at the latest then), or tcpdump exits.
        A ring sized to hold a whole run (ring_kib_for) may still be full when the traffic ends."""
        seen = {"size": self._written(), "since": time.monotonic()}

        def written_out() -> bool:
            size = self._written()
            if size != seen["size"]:
                seen.update(size=size, since=time.monotonic())
            return self.proc.poll() is not None or time.monotonic() - seen["since"] > RING_FLUSH_S

        try:
            until(written_out, DRAIN_TIMEOUT_S, "tcpdump to write out its ring", interval=0.05)
        except WaitTimeout:
            pass  # still writing after the deadline: what is left in the ring is counted as lost

    def stop(self, flush: bool = True) -> CaptureResult:
        """End tcpdump once what arrived so far is written; its counts of what it kept and lost."""
        if self.proc.poll() is None:  # still running (it exits by itself only when it fails)
            if flush:
                self._drain()
            self.proc.send_signal(signal.SIGINT)
        _, err = self.proc.communicate(timeout=10)
        self._stderr += err or b""
        self.fabric.journal.process_ended(self.proc.pid)
        return CaptureResult.of(self._stderr.decode(errors="replace"), str(self.path), self.interfaces, self.snaplen)


def capture(fabric: Fabric, node: str, out: str, duration: float, iface: str | None = None) -> CaptureResult:
    """Record a pcap of one node's interfaces (all of them, in one file, without `iface`)."""
    cap = Capture(fabric, node, out, iface)
    try:
        cap.proc.wait(timeout=duration)  # the capture's length is the point of waiting here
    except subprocess.TimeoutExpired:
        pass
    finally:
        result = cap.stop()
    return result
