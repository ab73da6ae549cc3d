"""Switch egress ports that signal congestion: the port program attached, configured and read.

Why it exists: the kernel here has no RED, fq_codel or netem; a tc clsact egress BPF program
(bpf/port.bpf.c, compiled by scripts/install.sh) keeps a virtual queue per port, marks CE,
trims and drops. This module loads it once per fabric (sized to the fabric's interface
indexes), pins program and maps under /sys/fs/bpf/mrc-emu/<fabric>/ (recorded in the journal
first, removed by registry.remove at down/clean), attaches it to every egress port the topology
names (netlink batches per namespace: `large` has 4,096 ports), writes each port's numbers
(topology/port.py) and the shaped rate, and reads the per-port counters for `mrc-emu stats`
and the experiments. Without a link rate there is no queue to model: nothing is attached.

The port numbers live in topology/port.py; the DSCPs below are the wire format's (issue 12),
repeated because the fabric never imports the wire layer.
"""

from __future__ import annotations

import functools
import os
import socket
import struct
import time
import weakref
from pathlib import Path
from typing import Any

from ...stats import histogram_percentile
from ...topology import Topology
from ...topology.port import HIST_BUCKETS, PortConfig, tbf_limit, tbf_shape
from ...topology.port_verdict import PORT_ENABLED, PORT_LASTHOP, pmax_fixed, port_flags
from .. import cabling
from ..kernel import bpfobj, netlink, netns
from ..kernel.netlink import NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE, Batch, _nla
from ..nodes import FabricSetupError
from ..running import Fabric

TBF_HANDLE = 0x10000  # the TBF at the root of a shaped port (build.py shape_node)
ORDER_HANDLE = 0x20000  # the HTB under a shaped port's TBF that orders its two classes (ports.TcBatch.order_classes)
CLASS_AHEAD = 0x20001  # skb->priority: the HTB class under TBF served first (control, trimmed headers)
CLASS_DATA = 0x20002  # ... and the one after it (data); port.bpf.c and build.py shape_node use both
DSCP_TRIMMED = 10  # = mrc_emu.wire.format DSCP_TRIMMED (port.bpf.c has the same numbers)
DSCP_TRIMMED_LASTHOP = 11
OBJECT = Path(__file__).resolve().parents[1] / "bpf" / "port.bpf.o"  # fabric/bpf/, where scripts/install.sh compiles it
PIN_ROOT = bpfobj.PIN_ROOT
PROGRAM = "port_egress"
CFG_MAP, STATE_MAP = "ports_cfg", "ports_state"  # the program's maps of struct port_cfg and struct port_state
FILTER_NAME = "mrc-port"

_CFG = struct.Struct("<Q10I")  # struct port_cfg
_STATE = struct.Struct(f"<IIQQQ6Q{HIST_BUCKETS}Q")  # struct port_state
COUNTERS = ("packets", "bytes", "max_queue", "ce_marked", "trimmed", "dropped")

RTM_NEWQDISC, RTM_NEWTCLASS, RTM_NEWTFILTER = 36, 40, 44
TCA_HTB_PARMS, TCA_HTB_INIT, TCA_HTB_RATE64, TCA_HTB_CEIL64 = 1, 2, 6, 7
TC_LINKLAYER_ETHERNET = 1  # a rate spec with a link layer needs no rate table (kernel >= 3.11)
PSCHED_NS_PER_TICK = 64  # HTB's buffers are in psched ticks (PSCHED_SHIFT 6)
_RATESPEC = struct.Struct("=BBHhHI")  # struct tc_ratespec: cell_log, linklayer, overhead, cell_align, mpu, rate
TCA_KIND, TCA_OPTIONS = 1, 2
TCA_BPF_FD, TCA_BPF_NAME, TCA_BPF_FLAGS = 6, 7, 8
TCA_BPF_FLAG_ACT_DIRECT = 1
TC_H_CLSACT, CLSACT_HANDLE, CLSACT_INGRESS, CLSACT_EGRESS = 0xFFFFFFF1, 0xFFFF0000, 0xFFFFFFF2, 0xFFFFFFF3
ETH_P_ALL = 3


class PortsError(FabricSetupError):
    """The port program is missing, refused, or not attached to this fabric."""


def pin_dir(name: str) -> Path:
    return PIN_ROOT / name


def missing_object() -> str | None:
    """Why the port program cannot be loaded, or None."""
    if OBJECT.exists():
        return None
    import shutil

    tools = [t for t in ("clang", "bpftool") if shutil.which(t) is None]
    need = f" ({', '.join(tools)} not installed)" if tools else ""
    return (f"the port program {OBJECT} is missing{need}: run scripts/install.sh, which installs clang, "
            f"libbpf-dev and bpftool and compiles it")


def leaf_limit(tbf_limit_bytes: int) -> int:
    """Packets the pfifo under each ordering class holds: TBF's byte limit in 256-byte packets,
    at least 1,000 (the port program drops at the port's buffer before either fills)."""
    return max(1000, tbf_limit_bytes // 256)


def _tcmsg(index: int, handle: int, parent: int) -> bytes:
    return struct.pack("=BxxxiIII", socket.AF_UNSPEC, index, handle, parent, 0)


class TcBatch(Batch):
    """The requests that put a direct-action BPF program on an interface's egress, and the HTB
    that orders a shaped port's two classes."""

    def clsact(self, index: int, shared: bool = False) -> None:
        """A clsact on `index`; `shared`: or the one already there (create-or-replace: the port
        program's, the SRv6 endpoint program's and the ECN decapsulation program's filters share it)."""
        body = struct.pack("=BxxxiIII", socket.AF_UNSPEC, index, CLSACT_HANDLE, TC_H_CLSACT, 0)
        flags = NLM_F_CREATE | (NLM_F_REPLACE if shared else NLM_F_EXCL)
        self._add(RTM_NEWQDISC, flags, body + _nla(TCA_KIND, b"clsact\0"), f"clsact on {index}")

    def order_classes(self, index: int, rate: int, limit: int, mtu: int) -> None:
        """The HTB under a shaped port's TBF (its class 1:1) that only orders, never shapes: class
        2:1 (CLASS_AHEAD, prio 0) served before 2:2 (CLASS_DATA, prio 1, the default), both at 16x
        the port's rate (`rate`, bytes/s; at least 1 GB/s), each with a pfifo that holds `limit`
        bytes in 256-byte packets (at least 1,000). Five requests, sent with the node's others."""
        glob = struct.pack("=IIIII", 3, 10, CLASS_DATA & 0xFFFF, 0, 0)  # tc_htb_glob: version 3, r2q, default class
        self._add(RTM_NEWQDISC, NLM_F_CREATE | NLM_F_EXCL,
                  _tcmsg(index, ORDER_HANDLE, TBF_HANDLE | 1) + _nla(TCA_KIND, b"htb\0")
                  + _nla(TCA_OPTIONS, _nla(TCA_HTB_INIT, glob)), f"htb under the TBF of {index}")
        unlimited = max(rate * 16, 1 << 30)
        spec = _RATESPEC.pack(0, TC_LINKLAYER_ETHERNET, 0, 0, 0, min(unlimited, 0xFFFFFFFF))
        burst = 64 * mtu
        ticks = int(burst * 1e9 / unlimited / PSCHED_NS_PER_TICK) + 1
        for classid, prio in ((CLASS_AHEAD, 0), (CLASS_DATA, 1)):
            opt = spec + spec + struct.pack("=IIIII", ticks, ticks, 2 * (mtu + 512), 0, prio)  # tc_htb_opt
            extra = (_nla(TCA_HTB_RATE64, struct.pack("=Q", unlimited)) + _nla(TCA_HTB_CEIL64, struct.pack("=Q", unlimited))
                     if unlimited > 0xFFFFFFFF else b"")
            self._add(RTM_NEWTCLASS, NLM_F_CREATE | NLM_F_EXCL,
                      _tcmsg(index, classid, ORDER_HANDLE) + _nla(TCA_KIND, b"htb\0")
                      + _nla(TCA_OPTIONS, _nla(TCA_HTB_PARMS, opt) + extra), f"htb class {classid:#x} on {index}")
            leaf = (0x20 + (classid & 0xFFFF)) << 16
            self._add(RTM_NEWQDISC, NLM_F_CREATE | NLM_F_EXCL,
                      _tcmsg(index, leaf, classid) + _nla(TCA_KIND, b"pfifo\0")
                      + _nla(TCA_OPTIONS, struct.pack("=I", leaf_limit(limit))), f"pfifo under {classid:#x} on {index}")

    def bpf_egress(self, index: int, prog_fd: int, parent: int = CLSACT_EGRESS, name: str = FILTER_NAME,
                   prio: int = 1) -> None:
        info = (prio << 16) | socket.htons(ETH_P_ALL)  # every protocol
        body = struct.pack("=BxxxiIII", socket.AF_UNSPEC, index, 1, parent, info)
        options = (_nla(TCA_BPF_FD, struct.pack("=I", prog_fd)) + _nla(TCA_BPF_NAME, name.encode() + b"\0")
                   + _nla(TCA_BPF_FLAGS, struct.pack("=I", TCA_BPF_FLAG_ACT_DIRECT)))
        where = "egress" if parent == CLSACT_EGRESS else "ingress"
        self._add(RTM_NEWTFILTER, NLM_F_CREATE | NLM_F_EXCL, body + _nla(TCA_KIND, b"bpf\0") + _nla(TCA_OPTIONS, options),
                  f"bpf {where} filter {name} on {index}")


@functools.lru_cache(maxsize=8)
def _indexes(topo: Topology) -> dict[tuple[str, str], int]:
    """(node, ifname) -> interface index, fixed by cabling.py and unique across the fabric."""
    out = {}
    for link in topo.links:
        out[(link.a, link.a_intf)] = cabling.index_of(link, link.a)
        out[(link.b, link.b_intf)] = cabling.index_of(link, link.b)
    return out


def _cfg_bytes(port: PortConfig, rate_bps: float, mtu: int, epoch: int = 0, bucket: int | None = None) -> bytes:
    """The program's numbers for one port. Under `model: red` the kernel's RED qdisc marks and
    drops (fabric/datapath/red.py): the program only classifies (skb->priority), counts and keeps its
    virtual queue, with ECN and trimming off and its buffer at what TBF holds, so it drops nothing
    RED would let in; its histogram keeps the port's bucket width, comparable with a `bpf` run."""
    rate, burst = tbf_shape(rate_bps, mtu, bucket)  # `bucket`: the topology's port: {bucket}
    if port.model == "red":
        flags, buffer = PORT_ENABLED | (PORT_LASTHOP if port.lasthop else 0), tbf_limit(rate_bps, mtu, bucket)
    else:
        flags = port_flags(port)
        buffer = port.buffer
    return _CFG.pack(rate, flags, burst, buffer, port.kmin, port.kmax, pmax_fixed(port.pmax),
                     port.trim_threshold, port.trim_bytes, port.hist_width, epoch)


def attach(fabric: Fabric) -> int:
    """Load, pin and attach the port program to every egress port of the topology; the number of
    ports (0 without a link rate: nothing to model, nothing loaded)."""
    topo = fabric.topology
    ports = topo.egress_ports()
    if not ports:
        return 0
    if reason := missing_object():
        raise PortsError(reason)
    directory = pin_dir(fabric.name)
    if directory.exists():
        raise PortsError(f"{directory} exists but no fabric of this name was up: a run killed before its journal "
                         f"recorded it left it; remove it (rm -r {directory}) and try again")
    fabric.journal.append({"kind": "bpf-pin", "path": str(directory)})
    if bpfobj.ensure_bpffs():
        fabric.journal.append({"kind": "bpffs-mounted", "path": str(bpfobj.BPFFS)})  # left mounted: see ensure_bpffs
    indexes = _indexes(topo)
    entries = max(indexes.values()) + 1
    try:
        prog_fd = bpfobj.load_and_pin(OBJECT, PROGRAM, {CFG_MAP: entries, STATE_MAP: entries}, directory)
    except bpfobj.BpfError as exc:
        raise PortsError(str(exc)) from None
    try:
        maps = _maps_of(fabric)
        by_node: dict[str, list[int]] = {}
        for port in ports:
            index = indexes[(port.node, port.ifname)]
            maps.cfg.put(index, _cfg_bytes(port, topo.link_rate_bps, topo.mtu, bucket=topo.ports.bucket))
            by_node.setdefault(port.node, []).append(index)
        for node, node_indexes in by_node.items():
            batch = TcBatch()
            for index in node_indexes:
                batch.clsact(index)
                batch.bpf_egress(index, prog_fd)
            with netns.entered(fabric.netns(node)):
                batch.send()
    finally:
        os.close(prog_fd)
    return len(ports)


class _Maps:
    def __init__(self, name: str) -> None:
        directory = pin_dir(name)
        if not (directory / STATE_MAP).exists():
            raise PortsError(f"fabric {name!r} has no port programs ({directory} does not exist): its topology has no "
                             f"link_rate, so there is no queue to model (give the topology a link_rate)")
        try:
            self.cfg = bpfobj.MapHandle(bpfobj.obj_get(directory / CFG_MAP), _CFG.size)
            self.state = bpfobj.MapHandle(bpfobj.obj_get(directory / STATE_MAP), _STATE.size, locked=True)
        except bpfobj.BpfError as exc:
            raise PortsError(f"{exc} (needs root)") from None

    def close(self) -> None:
        self.cfg.close()
        self.state.close()


_open_maps: weakref.WeakKeyDictionary[Fabric, _Maps] = weakref.WeakKeyDictionary()


def _maps_of(fabric: Fabric) -> _Maps:
    """The fabric's maps, opened once per Fabric handle."""
    maps = _open_maps.get(fabric)
    if maps is None or maps.cfg.fd < 0:
        maps = _open_maps[fabric] = _Maps(fabric.name)
        weakref.finalize(fabric, maps.close)
    return maps


def attached(fabric: Fabric) -> bool:
    return (pin_dir(fabric.name) / STATE_MAP).exists()


def set_rate(fabric: Fabric, node: str, rate_bps: float) -> None:
    """The virtual queues of `node`'s ports drain at `rate_bps` from now on (TBF was reshaped:
    time dilation runs links at rate / K). Nothing if the fabric has no port programs."""
    if not attached(fabric):
        return
    topo = fabric.topology
    maps = _maps_of(fabric)
    for port, index in _by_node(topo).get(node, []):
        epoch = _CFG.unpack(maps.cfg.get(index))[-1]
        maps.cfg.put(index, _cfg_bytes(port, rate_bps, topo.mtu, epoch, topo.ports.bucket))


def set_port_rate(fabric: Fabric, node: str, ifname: str, rate_bps: float) -> None:
    """set_rate for one port (its TBF alone was reshaped: a degraded link). Nothing if the port
    program does not serve it."""
    if not attached(fabric):
        return
    maps = _maps_of(fabric)
    for port, index in _by_node(fabric.topology).get(node, []):
        if port.ifname == ifname:
            epoch = _CFG.unpack(maps.cfg.get(index))[-1]
            topo = fabric.topology
            maps.cfg.put(index, _cfg_bytes(port, rate_bps, topo.mtu, epoch, topo.ports.bucket))

def reset(fabric: Fabric) -> None:
    """Zero every port's counters (queues keep their state): the program sees a new epoch and
    zeroes them under the port's lock at its next packet; counters() reads zeros until then."""
    maps = _maps_of(fabric)
    for _, index in _served(fabric):
        cfg = list(_CFG.unpack(maps.cfg.get(index)))
        cfg[-1] = (cfg[-1] + 1) & 0xFFFFFFFF
        maps.cfg.put(index, _CFG.pack(*cfg))


def _served(fabric: Fabric) -> list[tuple[PortConfig, int]]:
    """Every port the program serves, with its interface index."""
    indexes = _indexes(fabric.topology)
    return [(port, indexes[(port.node, port.ifname)]) for port in fabric.topology.egress_ports()]


@functools.lru_cache(maxsize=8)
def _by_node(topo: Topology) -> dict[str, list[tuple[PortConfig, int]]]:
    indexes = _indexes(topo)
    out: dict[str, list[tuple[PortConfig, int]]] = {}
    for port in topo.egress_ports():
        out.setdefault(port.node, []).append((port, indexes[(port.node, port.ifname)]))
    return out


def index_of(topo: Topology, node: str, ifname: str) -> int:
    """The interface index of a node's interface (fixed by cabling.py, unique across the fabric)."""
    return _indexes(topo)[(node, ifname)]


def served_by_node(topo: Topology) -> dict[str, list[tuple[PortConfig, int]]]:
    """{node: [(port, interface index)]} of every port the program serves (red.py puts RED on them)."""
    return _by_node(topo)


def counters(fabric: Fabric, node: str | None = None) -> dict[str, dict[str, dict[str, Any]]]:
    """{node: {ifname: {packets, bytes, max_queue, ce_marked, trimmed, dropped, queue_hist, hist_width,
    queue_p50, queue_p99, config}}} of every port the program serves (or only `node`'s), since
    attach or the last reset. packets/bytes: what the port passed (trimmed ones at their short
    size); dropped: refused above the buffer; queue_hist[i]: arrivals that found a queue of
    (i-1, i] x hist_width bytes (bucket 0: an empty queue; the last bucket: that or more)."""
    served = _served(fabric)
    if node is not None and not any(port.node == node for port, _ in served):
        fabric.topology.node(node)
        raise PortsError(f"{node} has no port program: host egress ports are served only with `port: {{hosts: on}}`"
                         if fabric.topology.nodes[node].role.value == "host" else f"{node} has no port program")
    maps = _maps_of(fabric)
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for port, index in served:
        if node is not None and port.node != node:
            continue
        epoch = _CFG.unpack(maps.cfg.get(index))[-1]
        values = _STATE.unpack(maps.state.get(index))
        fresh = values[1] == epoch
        numbers = values[5:5 + len(COUNTERS)] if fresh else (0,) * len(COUNTERS)
        hist = list(values[5 + len(COUNTERS):]) if fresh else [0] * HIST_BUCKETS
        entry: dict[str, Any] = dict(zip(COUNTERS, numbers))
        entry.update(queue_hist=hist, hist_width=port.hist_width,
                     queue_p50=quantile(hist, port.hist_width, 0.5), queue_p99=quantile(hist, port.hist_width, 0.99),
                     config=port.to_dict())
        out.setdefault(port.node, {})[port.ifname] = entry
    return out


def queue_now(fabric: Fabric, node: str, ifname: str) -> int:
    """The port's virtual backlog now, in bytes (what its next packet would find): the virtual
    queue drained at the shaped rate since its last packet."""
    index = _indexes(fabric.topology)[(node, ifname)]
    maps = _maps_of(fabric)
    cfg = _CFG.unpack(maps.cfg.get(index))
    _, _, queue, _, last_ns, *_ = _STATE.unpack(maps.state.get(index))
    now = time.monotonic_ns()  # bpf_ktime_get_ns is CLOCK_MONOTONIC
    return max(0, queue - cfg[0] * max(0, now - last_ns) // 1_000_000_000)


def tbf_counters_of(fabric: Fabric, node: str, ifname: str) -> tuple[int, int]:
    """(bytes sent, backlog bytes) of one port's TBF (netlink.qdisc_counters, one dump on a socket
    made in the node's namespace): what the virtual queue is held against."""
    with netns.entered(fabric.netns(node)):
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
    with sock:
        sock.bind((0, 0))
        return netlink.qdisc_counters(sock, _indexes(fabric.topology)[(node, ifname)])


def quantile(hist: list[int], width: int, q: float) -> int | None:
    """The queue (bytes, the upper edge of its bucket: 0 for bucket 0, i x width for bucket i) that
    a fraction q of arrivals found at most."""
    bucket = histogram_percentile(hist, q * 100)
    return None if bucket is None else bucket * width


def delta(before: dict, after: dict) -> dict:
    """after - before of two counters() results: counts and histograms subtract; max_queue is
    the window's highest histogram bucket edge (a maximum does not subtract)."""
    out: dict = {}
    for node, ifaces in after.items():
        for ifname, now in ifaces.items():
            was = before.get(node, {}).get(ifname)
            if was is None:
                out.setdefault(node, {})[ifname] = now
                continue
            entry = {k: now[k] - was[k] for k in COUNTERS if k != "max_queue"}
            hist = [a - b for a, b in zip(now["queue_hist"], was["queue_hist"])]
            width = now["hist_width"]
            top = max((i for i, c in enumerate(hist) if c), default=None)
            entry.update(max_queue=None if top is None else top * width, queue_hist=hist, hist_width=width,
                         queue_p50=quantile(hist, width, 0.5), queue_p99=quantile(hist, width, 0.99),
                         config=now["config"])
            out.setdefault(node, {})[ifname] = entry
    return out
