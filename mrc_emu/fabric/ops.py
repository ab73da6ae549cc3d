"""Operations on a running fabric: inspect it, run commands and captures in a node, open sockets.

Why it exists: the CLI and the experiments need these, and the CLI must stay thin.
Everything here acts only on namespaces that the fabric's journal records.
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

from ..topology import Topology, ev_count
from . import netns, registry
from .build import load_topology
from .nodes import FabricSetupError


def status(name: str) -> dict[str, Any]:
    """Every node with role and plane, every link with ends, interfaces, plane and state."""
    record = registry.read(name)
    topo = load_topology(name)
    oper: dict[str, bool] = {}
    missing = []
    for node_name in topo.nodes:
        path = netns.netns_path(name, node_name)
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
         "netns": str(netns.netns_path(name, n.name))}
        for n in topo.nodes.values()
    ]
    return {
        "name": name,
        "ready": record.ready,
        "topology": topo.summary(),
        "ev_count": ev_count(topo),
        "nodes": nodes,
        "links": links,
        "missing_namespaces": missing,
    }


def node_path(name: str, node: str) -> Path:
    topo = load_topology(name)
    topo.node(node)
    path = netns.netns_path(name, node)
    if not path.exists():
        raise FabricSetupError(f"namespace {path} of node {node} is gone; run 'mrc-emu clean'")
    return path


def exec_in(name: str, node: str, argv: Sequence[str]) -> None:
    """Replace this process with `argv` running in the node's namespace (like ip netns exec)."""
    path = node_path(name, node)
    netns.move_to(path)
    try:
        os.execvp(argv[0], list(argv))
    except FileNotFoundError:
        raise FabricSetupError(f"command not found: {argv[0]}") from None


def host_sockets(name: str, host: str) -> tuple[socket.socket, socket.socket]:
    """A raw IPv6 socket that sends whole frames and a raw UDP socket that receives, in `host`."""
    with netns.entered(node_path(name, host)):
        send = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_RAW)
        recv = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_UDP)
    return send, recv


@dataclass
class CaptureResult:
    path: str
    packets: int | None
    interfaces: list[str]


class Capture:
    """tcpdump running in a node's namespace, recorded in the journal; `stop` ends it."""

    def __init__(self, name: str, node: str, out: str, iface: str | None = None, snaplen: int = 0,
                 count: int | None = None) -> None:
        path = node_path(name, node)
        topo: Topology = load_topology(name)
        intfs = [topo.peer(link, node)[1] for link in topo.links_of(node)]
        if iface is not None and iface not in intfs + ["lo"]:
            raise FabricSetupError(f"{node} has no interface {iface!r} (it has: {', '.join(intfs)})")
        tcpdump = shutil.which("tcpdump")
        if tcpdump is None:
            raise FabricSetupError("tcpdump not found: apt-get install tcpdump (or run scripts/install.sh)")
        self.name = name
        self.interfaces = [iface] if iface else intfs
        self.path = Path(out).resolve()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDONLY)
        cmd = [tcpdump, "-i", iface or "any", "-U", "--immediate-mode", "-Z", "root", "-s", str(snaplen), "-w",
               str(self.path)] + (["-c", str(count)] if count else [])
        try:
            self.proc = subprocess.Popen(cmd, preexec_fn=lambda: netns.setns(fd), stdout=subprocess.DEVNULL,
                                         stderr=subprocess.PIPE)
        finally:
            os.close(fd)
        with registry.Journal.open(name) as journal:
            journal.process(self.proc.pid, f"tcpdump in {node}")
        self._stderr = b""
        self._wait_listening(timeout=10.0)

    def _wait_listening(self, timeout: float) -> None:
        """tcpdump says 'listening on' once its socket is open: from then on nothing is missed."""
        deadline = time.monotonic() + timeout
        while b"listening on" not in self._stderr:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self.proc.stderr], [], [], max(0.0, left))
            chunk = os.read(self.proc.stderr.fileno(), 4096) if ready else b""
            if not chunk:
                self.stop()
                raise FabricSetupError(f"tcpdump did not start: {self._stderr.decode(errors='replace').strip()}")
            self._stderr += chunk

    def stop(self) -> CaptureResult:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        _, err = self.proc.communicate(timeout=10)
        self._stderr += err or b""
        with registry.Journal.open(self.name) as journal:
            journal.process_ended(self.proc.pid)
        packets = None
        for line in self._stderr.decode(errors="replace").splitlines():
            if "packets captured" in line:
                packets = int(line.split()[0])
        return CaptureResult(str(self.path), packets, self.interfaces)


def capture(name: str, node: str, out: str, duration: float, iface: str | None = None) -> CaptureResult:
    """Record a pcap of one node's interfaces (all of them, in one file, without `iface`)."""
    cap = Capture(name, node, out, iface)
    try:
        cap.proc.wait(timeout=duration)  # the capture's length is the point of waiting here
    except subprocess.TimeoutExpired:
        pass
    finally:
        result = cap.stop()
    return result
