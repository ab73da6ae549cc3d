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
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyroute2 import IPRoute

from ..topology import ev_count
from . import netns
from .nodes import FabricSetupError
from .running import Fabric
from .waiting import WaitTimeout, until


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


@dataclass
class CaptureResult:
    path: str
    packets: int | None
    interfaces: list[str]


class Capture:
    """tcpdump running in a node's namespace, recorded in the journal; `stop` ends it."""

    def __init__(self, fabric: Fabric, node: str, out: str, iface: str | None = None, snaplen: int = 0,
                 count: int | None = None) -> None:
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
        fabric.journal.process(self.proc.pid, f"tcpdump in {node}")
        self._stderr = b""
        try:
            until(self._listening, 10.0, f"tcpdump in {node} to open its socket", wake=[self.proc.stderr])
        except (WaitTimeout, FabricSetupError) as exc:
            self.stop()
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

    def stop(self) -> CaptureResult:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        _, err = self.proc.communicate(timeout=10)
        self._stderr += err or b""
        self.fabric.journal.process_ended(self.proc.pid)
        packets = None
        for line in self._stderr.decode(errors="replace").splitlines():
            if "packets captured" in line:
                packets = int(line.split()[0])
        return CaptureResult(str(self.path), packets, self.interfaces)


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
