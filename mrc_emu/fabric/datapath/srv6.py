"""SRv6 endpoint behaviours in BPF, for a kernel built without seg6local.

Why it exists: every SID of the fabric is a `seg6local` route (End with NEXT-C-SID, End.X;
fabric/config.py). A kernel built without CONFIG_IPV6_SEG6_LWTUNNEL refuses those routes ("lwt
encapsulation type not supported"), though it still has the rest of SRv6 (the seg6_enabled
sysctl, the SRH processing that decapsulates at a host). On such a kernel the fabric puts
bpf/srv6.bpf.c on the ingress of every fabric interface instead (tc clsact, direct action): it
rewrites a packet addressed to one of the node's SIDs as End or End.X would and hands it back to
the kernel, which forwards it on its new destination (docs/fabric.md: "SRv6 without seg6local").

Which one a fabric uses (`kernel/seg6local.py`, `mode`): the kernel's, where it accepts a seg6local route (probed once
per process in a namespace of its own, `kernel_problem`), else the program; MRC_EMU_SRV6=bpf
forces the program (to test it on a kernel that has both), =kernel the routes. The seg6local
routes are installed wherever the kernel takes them (config.py), whichever mode: with the
program attached they are never reached, since it rewrites the destination before the lookup.

The program and its map are not pinned: the filters hold them, and they go with the
namespaces. Nothing here outlives the fabric or needs recording.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

from ...topology import Role, Topology
from ...topology import addressing as ad
from .. import cabling
from ..kernel import bpfobj, netns
from ..nodes import FabricSetupError
from ..running import Fabric
from .ports import CLSACT_INGRESS, TcBatch

OBJECT = Path(__file__).resolve().parents[1] / "bpf" / "srv6.bpf.o"
PROGRAM, MAP, FILTER_NAME = "srv6_ingress", "srv6_nodes", "mrc-srv6"
FILTER_PRIO = 2  # after red.py's ECN decapsulation filter (priority 1) on a host port's ingress
MAX_PORTS = 256  # srv6.bpf.c: End.X functions 0xE000 .. 0xE0FF, one bit each
_NODE = struct.Struct(f"<II{MAX_PORTS // 8}s")  # struct srv6_node
NODE_HOST = 1  # srv6_node.flags


class Srv6Error(FabricSetupError):
    """The BPF endpoint program cannot serve this fabric."""


def missing_object() -> str | None:
    """Why the program cannot be loaded, or None."""
    if OBJECT.exists():
        return None
    return f"the SRv6 endpoint program {OBJECT} is missing: run scripts/install.sh, which compiles it with clang"


def node_records(topo: Topology) -> dict[int, bytes]:
    """Interface index -> the map's value for it: its node's ID and the node's End.X ports."""
    out = {}
    for name, node in topo.nodes.items():
        ports, indexes = bytearray(MAX_PORTS // 8), []
        for link in topo.links_of(name):
            _, intf, _ = topo.peer(link, name)
            port = ad.port_of(intf)
            if port >= MAX_PORTS:
                raise Srv6Error(f"{name} has port {port}: the SRv6 endpoint program serves ports 0-{MAX_PORTS - 1}")
            ports[port // 8] |= 1 << (port % 8)
            indexes.append(cabling.index_of(link, name))
        for index in indexes:
            out[index] = _NODE.pack(node.node_id, NODE_HOST if node.role is Role.HOST else 0, bytes(ports))
    return out


def topology_problem(topo: Topology) -> str | None:
    """Why the program's End.X (the kernel routes the next segment) would not pin a port here:
    two links between one pair of nodes (None: every neighbour pair has one link)."""
    seen: dict[frozenset[str], int] = {}
    for link in topo.links:
        pair = frozenset((link.a, link.b))
        if pair in seen:
            return (f"{link.a} and {link.b} have two links ({seen[pair]} and {link.link_id}): without seg6local "
                    f"an End.X cannot choose between them")
        seen[pair] = link.link_id
    return None


def attach(fabric: Fabric) -> int:
    """The program on the ingress of every fabric interface (after the port program and RED,
    whose clsacts it shares); the number of interfaces."""
    topo = fabric.topology
    if reason := missing_object() or topology_problem(topo):
        raise Srv6Error(reason)
    records = node_records(topo)
    try:
        prog_fd, maps = bpfobj.load(OBJECT, PROGRAM, {MAP: max(records) + 1})
    except bpfobj.BpfError as exc:
        raise Srv6Error(f"the SRv6 endpoint program: {exc}") from None
    try:
        handle = bpfobj.MapHandle(maps[MAP], _NODE.size)
        for index, value in records.items():
            handle.put(index, value)
        for name in topo.nodes:
            batch = TcBatch()
            for link in topo.links_of(name):
                index = cabling.index_of(link, name)
                batch.clsact(index, shared=True)
                batch.bpf_egress(index, prog_fd, CLSACT_INGRESS, FILTER_NAME, prio=FILTER_PRIO)
            with netns.entered(fabric.netns(name)):
                batch.send()
    finally:
        os.close(prog_fd)
        for fd in maps.values():
            os.close(fd)
    return len(records)
