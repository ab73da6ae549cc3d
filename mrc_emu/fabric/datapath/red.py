"""The kernel's own RED qdisc with ECN at the switch ports (`port: {model: red}`), to hold the port
program's virtual queue against a real queue.

Why it exists: the port model of issue 12 (bpf/port.bpf.c) marks CE from a virtual queue that
follows TBF's backlog; a kernel with sch_red (a stock Debian or Ubuntu one, as in the Vagrant
VM) can mark from the queue itself. Under `model: red` every served egress port keeps the shaping
TBF 1: and the ordering HTB 2: (build.shape_node); RED takes the place of the pfifo under the
data class 2:2 (control and trimmed headers still go ahead through 2:1), with its numbers from
the same `port:` block:

    limit = buffer, min = kmin, max = kmax, probability = pmax, ecn (no harddrop: marked above
    max too, as the program marks every ECT packet above kmax; dropped only at limit)

and the averaging weight: by default Wlog 0 (the average is the backlog each arrival finds, the
program's instantaneous queue), with an idle table that forgets it at once (every entry 31);
`red: {burst: N}` gives RED's classic EWMA, Wlog and idle table as iproute2 derives them from
burst, avpkt and the link's rate. The port program stays attached with marking and trimming off:
it still sets skb->priority (which class), counts, and keeps its virtual queue beside RED's.

What cannot match (docs/congestion.md): RED's queue is its class's backlog (not control, not
the one packet HTB has handed to TBF), the virtual queue is all of TBF's; RED spaces its marks
(Floyd's count: the gap between marks is uniform in 1..1/p, so about 2p of the packets are
marked where the program marks each with p); RED has no trimming (model red needs `trim: off`);
RED marks the outer IPv6 header only, and the hosts' SRv6 decapsulation (exthdrs.c) does not
carry it inward, so model red also puts ecn_decap.py's program on every host port's ingress,
which does (RFC 6040); the endpoints then see RED's marks as they see the program's.

The requests are encoded here (as impair.py encodes netem) so a unit test sees exactly what is
sent; `tc -s qdisc` text is parsed by parse_tc_stats. Nothing here outlives the fabric: the
qdiscs are on veths inside its namespaces, which `down` removes (the journal's topology says
`model: red`). This module never touches a namespace the fabric does not own.
"""

from __future__ import annotations

import functools
import math
import re
import shutil
import socket
import struct
import subprocess
from dataclasses import dataclass

from ...topology.port import PortConfig
from ..kernel import netns
from ..kernel.netlink import NLM_F_CREATE, NLM_F_REPLACE, Batch, _nla
from ..nodes import FabricSetupError
from ..running import Fabric
from . import ecn_decap, ports
from .impair import TC_H_ROOT, kernel_refuses

RTM_NEWQDISC = 36
TCA_KIND, TCA_OPTIONS = 1, 2
TCA_RED_PARMS, TCA_RED_STAB, TCA_RED_MAX_P = 1, 2, 3
TC_RED_ECN = 1
RED_HANDLE = 0x72650000  # "re": RED's handle on a port, never one the kernel picks (8000+)
STAB_SIZE = 256
_QOPT = struct.Struct("=IIIBBBB")  # struct tc_red_qopt: limit, qth_min, qth_max, Wlog, Plog, Scell_log, flags
_TCMSG = struct.Struct("=BxxxiIII")


class RedMissing(FabricSetupError):
    """The kernel has no RED: `model: red` cannot be built."""


@dataclass(frozen=True)
class RedParams:
    """One port's RED, as the kernel takes it (struct tc_red_qopt, the idle table, max_P)."""

    limit: int
    qth_min: int
    qth_max: int
    wlog: int
    plog: int
    scell_log: int
    stab: bytes
    max_p: int  # probability x 2^32
    ecn: bool
    avpkt: int
    burst: int | None  # None: Wlog 0, the instantaneous queue

    @property
    def probability(self) -> float:
        return self.max_p / 2**32

    def tc_line(self, dev: str, parent: str = "2:2") -> str:
        """The `tc` command that makes (nearly) this RED: exact with a burst; tc cannot write Wlog 0,
        so for the instantaneous queue it says so."""
        line = (f"tc qdisc replace dev {dev} parent {parent} handle {RED_HANDLE >> 16:x}: red limit {self.limit} "
                f"min {self.qth_min} max {self.qth_max} avpkt {self.avpkt} burst {self.burst or 1} "
                f"probability {self.probability:g}" + (" ecn" if self.ecn else ""))
        return line if self.burst else line + "  # but ewma 0 (tc's smallest is 1): sent by netlink"


def ewma_log(qth_min: int, burst: int, avpkt: int) -> int:
    """RED's Wlog for a burst of `burst` packets of `avpkt` bytes (Floyd: the average stays under
    qth_min through such a burst from empty): the smallest w with
    burst + 1 - qth_min/avpkt <= (1 - (1 - 2^-w)^burst) / 2^-w."""
    a = burst + 1 - qth_min / avpkt
    if a < 1:
        raise ValueError(f"RED burst {burst} is too small for min {qth_min} and avpkt {avpkt}: "
                         f"give at least {1 + qth_min // avpkt}")
    weight = 0.5
    for wlog in range(1, 32):
        if a <= (1 - (1 - weight) ** burst) / weight:
            return wlog
        weight /= 2
    raise ValueError(f"no RED weight fits burst {burst}")


def probability_log(qth_min: int, qth_max: int, probability: float) -> int:
    """Plog, the old way of saying max_P (the kernel reads TCA_RED_MAX_P when it is given, as here)."""
    span = qth_max - qth_min
    if span <= 0:
        return 0
    p = probability / span
    for i in range(32):
        if p > 1:
            return i
        p *= 2
    raise ValueError(f"RED probability {probability:g} too small for min {qth_min}, max {qth_max}")


PSCHED_TICKS_PER_US = 1000 / 64  # iproute2's tick_in_usec: /proc/net/psched's t2us / us2t (64 ns ticks)


def idle_table(wlog: int, avpkt: int, bytes_per_s: float) -> tuple[int, bytes]:
    """(Scell_log, Stab): how RED decays its average over an idle period (sch_red: the average is
    shifted right by Stab[idle >> Scell_log]), as iproute2's tc_red_eval_idle_damping makes them
    for `avpkt` at `bytes_per_s`, so that tc_line's command makes the same RED. (iproute2 counts
    the time in 64 ns psched ticks and the kernel reads the index in microseconds, so a real idle
    period decays as one 15.6 times shorter would; kept, since it is what `tc` gives.) Wlog 0
    (the instantaneous queue): every entry 31, so an idle port's average is 0 at its next packet."""
    if wlog == 0:
        return 0, bytes([31] * STAB_SIZE)
    xmit_ticks = avpkt / bytes_per_s * 1e6 * PSCHED_TICKS_PER_US
    per_tick = -math.log(1 - 1 / (1 << wlog)) / xmit_ticks
    longest = 31 / per_tick
    cell_log = next(c for c in range(32) if longest / (1 << c) < 512)
    table = [0] + [min(31, int((i << cell_log) * per_tick)) for i in range(1, STAB_SIZE - 1)] + [31]
    return cell_log, bytes(table)


def red_params(port: PortConfig, avpkt: int, burst: int | None, rate_bps: float | None = None) -> RedParams:
    """The RED of one served port from its resolved numbers (the mapping in the module docstring).
    ECN off: RED without early marking (min = max = limit), a tail-drop FIFO at the buffer."""
    rate = rate_bps or port.rate_bps
    if port.ecn:
        qth_min, qth_max, probability = port.kmin, port.kmax, port.pmax
    else:
        qth_min = qth_max = port.buffer
        probability = 1.0
    wlog = 0 if burst is None else ewma_log(qth_min, burst, avpkt)
    scell_log, stab = idle_table(wlog, avpkt, rate / 8)
    return RedParams(limit=port.buffer, qth_min=qth_min, qth_max=qth_max, wlog=wlog,
                     plog=probability_log(qth_min, qth_max, probability), scell_log=scell_log, stab=stab,
                     max_p=min(0xFFFFFFFF, round(probability * 2**32)), ecn=port.ecn, avpkt=avpkt, burst=burst)


def red_options(params: RedParams) -> bytes:
    """TCA_OPTIONS of a RED: parameters (ECN in the historic flags every kernel reads), idle table, max_P."""
    qopt = _QOPT.pack(params.limit, params.qth_min, params.qth_max, params.wlog, params.plog, params.scell_log,
                      TC_RED_ECN if params.ecn else 0)
    return (_nla(TCA_RED_PARMS, qopt) + _nla(TCA_RED_STAB, params.stab)
            + _nla(TCA_RED_MAX_P, struct.pack("=I", params.max_p)))


class RedBatch(ports.TcBatch):
    """The requests that put RED on ports (create or replace), beside the tc ones of ports.py."""

    def red(self, index: int, parent: int, params: RedParams, handle: int = RED_HANDLE) -> None:
        body = _TCMSG.pack(socket.AF_UNSPEC, index, handle, parent, 0) + _nla(TCA_KIND, b"red\0")
        body += _nla(TCA_OPTIONS, red_options(params))
        self._add(RTM_NEWQDISC, NLM_F_CREATE | NLM_F_REPLACE, body, f"red under {parent:#x} on {index}")


@functools.lru_cache(maxsize=1)
def red_missing() -> str | None:
    """Why `model: red` cannot be built here (one line naming the module), or None: asks the kernel
    to add a RED with ECN to the loopback of a fresh, unnamed namespace."""
    from ...topology.port import PortConfig

    probe = PortConfig("probe", "lo", "probe", False, 1e9, 50_000, 200_000, True, 10_000, 40_000, 0.2, False, 0, 28)

    def build() -> Batch:
        batch = RedBatch()
        batch.red(socket.if_nametoindex("lo"), TC_H_ROOT, red_params(probe, 4250, None))
        return batch

    said = kernel_refuses(build, "RED")
    if said is None or said.startswith("cannot probe"):
        return said
    return (f"this kernel has no RED (module sch_red, CONFIG_NET_SCH_RED): the `red` port model needs it (the "
            f"kernel said: {said}); a stock distribution kernel has it (the Vagrant VM of the README)")


def require_red() -> None:
    if reason := red_missing():
        raise RedMissing(reason)


DECAP_FILTER = "mrc-ecn-decap"


def attach(fabric: Fabric) -> int:
    """RED under the data class of every served port of a `model: red` fabric, and the ECN
    decapsulation program on every host port's ingress (one batch per node); the number of RED
    ports (0 for `model: bpf`). The TBF and its ordering HTB must be there (build.up)."""
    topo = fabric.topology
    if topo.ports.model != "red" or not topo.egress_ports():
        return 0
    require_red()
    by_node = ports.served_by_node(topo)
    batches: dict[str, RedBatch] = {}
    count = 0
    for node, served in by_node.items():
        batch = batches.setdefault(node, RedBatch())
        for port, index in served:
            batch.red(index, ports.CLASS_DATA, red_params(port, topo.ports.red_avpkt, topo.ports.red_burst))
            count += 1
    prog_fd = ecn_decap.load()
    try:
        decap_requests(topo, batches, prog_fd)
        for node, batch in batches.items():
            with netns.entered(fabric.netns(node)):
                batch.send()
    finally:
        ecn_decap.close(prog_fd)
    return count


def decap_requests(topo, batches: dict[str, RedBatch], prog_fd: int) -> None:
    """Add to `batches` (per node) the requests that put the ECN decapsulation program on every
    host port's ingress, on the port's clsact (made here, or shared with the port program's and the
    SRv6 endpoint program's filters)."""
    for host in topo.hosts:
        batch = batches.setdefault(host.name, RedBatch())
        for link in topo.links_of(host.name):
            _, intf, _ = topo.peer(link, host.name)
            index = ports.index_of(topo, host.name, intf)
            batch.clsact(index, shared=True)  # the port program's or the SRv6 program's, or a new one
            batch.bpf_egress(index, prog_fd, ports.CLSACT_INGRESS, DECAP_FILTER)


# ---- reading `tc -s qdisc` -------------------------------------------------------------------

_QDISC_RE = re.compile(r"^qdisc (\S+) ([0-9a-f]+): (?:dev (\S+) )?(?:root|parent ([0-9a-f]*:[0-9a-f]*))(.*)$")
_SENT_RE = re.compile(r"Sent (\d+) bytes (\d+) pkt \(dropped (\d+), overlimits (\d+) requeues (\d+)\)")
_BACKLOG_RE = re.compile(r"backlog (\d+(?:\.\d+)?)([KMG]?)b (\d+)p")
_RED_RE = re.compile(r"marked (\d+) early (\d+) pdrop (\d+) other (\d+)")
_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}


def parse_tc_stats(text: str) -> list[dict]:
    """Every qdisc of `tc -s qdisc show [dev X]` text (iproute2's format: tc_util.c's statistics,
    q_red.c's `marked early pdrop other`): kind, handle, parent (None: root), options (the rest of
    its first line), sent_bytes, sent_packets, dropped, overlimits, requeues, backlog_bytes,
    backlog_packets, and for RED marked, early, pdrop, other. iproute2 prints a backlog in Kb/Mb
    when it is within 16 B / 1 KiB of a multiple: backlog_bytes is that close, not exact."""
    out: list[dict] = []
    for line in text.splitlines():
        if m := _QDISC_RE.match(line.strip()):
            out.append({"kind": m.group(1), "handle": m.group(2) + ":", "parent": m.group(4),
                        "options": m.group(5).strip()})
            continue
        if not out:
            continue
        entry = out[-1]
        if m := _SENT_RE.search(line):
            entry.update(zip(("sent_bytes", "sent_packets", "dropped", "overlimits", "requeues"), map(int, m.groups())))
        if m := _BACKLOG_RE.search(line):
            entry["backlog_bytes"] = round(float(m.group(1)) * _UNITS[m.group(2)])
            entry["backlog_packets"] = int(m.group(3))
        if m := _RED_RE.search(line):
            entry.update(zip(("marked", "early", "pdrop", "other"), map(int, m.groups())))
    return out


def tc_stats(fabric: Fabric, node: str, ifname: str) -> list[dict]:
    """parse_tc_stats of `tc -s qdisc show dev IFNAME` run in the node's namespace."""
    tc = shutil.which("tc")
    if tc is None:
        raise FabricSetupError("tc not found: apt-get install iproute2")
    with netns.entered(fabric.node_path(node)):  # the child inherits this thread's namespace
        done = subprocess.run([tc, "-s", "qdisc", "show", "dev", ifname], capture_output=True, text=True)
    if done.returncode != 0:
        raise FabricSetupError(f"tc -s qdisc show dev {ifname} in {node} failed: {done.stderr.strip()}")
    return parse_tc_stats(done.stdout)


def red_counters(fabric: Fabric, node: str, ifname: str) -> dict:
    """The RED of one port as `tc -s qdisc` shows it (marked, early, pdrop, other, sent, backlog)."""
    found = [q for q in tc_stats(fabric, node, ifname) if q["kind"] == "red"]
    if not found:
        raise FabricSetupError(f"{node} {ifname} has no RED qdisc (is the fabric's port model red?)")
    return found[0]
