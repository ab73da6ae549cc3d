"""Added delay or random loss on a link's egress, with netem, and the probe that says whether the kernel has it.

Why it exists: a `delay` fault (a longer cable, a detour through a distant switch) is netem's
job, and so is the netem way of a `loss` fault (`mechanism: netem`, `fault loss --by netem`:
the kernel's own random loss on egress, beside our XDP and nft drops on ingress, so the two can
be held against each other). netem is a kernel module a kernel may lack (sch_netem; a stock
Debian or Ubuntu kernel has it). So before any fault touches a fabric, `netem_missing()` asks
the kernel itself: it adds a netem qdisc to the loopback of a throwaway network namespace (an
unnamed one, gone as soon as this thread leaves it) and reports the refusal as one line naming
the module. The messages are encoded here (as fabric/kernel/netlink.py encodes routes) so a unit test
sees exactly what would be sent.

Where netem goes: on an unshaped port it is the root qdisc (undo: delete it, the kernel puts the
default back). On a shaped port the root is the port's TBF (build.py) and netem becomes the TBF's
child, so a packet waits the delay and then for its tokens; the TBF itself, and the port
program's virtual queue modelled on it, stay as they are. Undo puts the TBF's own default child
back (a bfifo of the TBF's limit): deleting the child would leave TBF a qdisc that drops all.
A shaped port of a fabric with port programs has an HTB under its TBF that sends control ahead
of data (build.py): there netem goes under each of the HTB's two classes, and undo puts their
pfifos back, so the order between the classes stays.
"""

from __future__ import annotations

import ctypes
import functools
import os
import socket
import struct

from pyroute2 import IPRoute

from ..kernel import netns
from ..kernel.netlink import NLM_F_CREATE, NLM_F_REPLACE, Batch, NetlinkError, _nla
from ..nodes import FabricSetupError
from ..running import Fabric
from .ports import CLASS_AHEAD, CLASS_DATA, ORDER_HANDLE, leaf_limit

RTM_NEWQDISC, RTM_DELQDISC = 36, 37
TCA_KIND, TCA_OPTIONS = 1, 2
TC_H_ROOT = 0xFFFFFFFF
# a shaped port's qdiscs (fabric/build.py shape_node): TBF 1:, under it the HTB whose two classes
# send control ahead of data; a delay there goes under each class, in place of its pfifo
ORDER_CLASSES = (CLASS_AHEAD, CLASS_DATA)
NETEM_HANDLE = 0x6D720000  # "mr": our netem's handle on a port, never one the kernel picks (8000+);
# a qdisc handle is a major only (the kernel refuses a minor: "Invalid minor handle"), so the two
# netems under a shaped port's classes are majors 6d73: and 6d74:
TCA_NETEM_LATENCY64 = 10
PSCHED_SHIFT = 6  # the kernel's psched tick is 64 ns (PSCHED_TICKS2NS)
NETEM_LIMIT = 100_000  # packets netem may hold (its default, 1,000, drops at ~4 MB/s x 1 ms with small ACKs)
_QOPT = struct.Struct("=6I")  # struct tc_netem_qopt: latency, limit, loss, gap, duplicate, jitter
_TCMSG = struct.Struct("=BxxxiIII")  # struct tcmsg: family, ifindex, handle, parent, info


class NetemMissing(FabricSetupError):
    """The kernel has no netem: a delay (or a netem loss) cannot be applied."""


def _tcmsg(index: int, handle: int, parent: int) -> bytes:
    return _TCMSG.pack(socket.AF_UNSPEC, index, handle, parent, 0)


def loss_word(fraction: float) -> int:
    """netem's random loss probability as tc_netem_qopt holds it: fraction x (2^32 - 1), as
    iproute2's `loss 5%` writes it (q_netem.c: percent_to_u32)."""
    if not 0 <= fraction <= 1:
        raise ValueError(f"a loss fraction is in [0, 1], not {fraction:g}")
    return round(fraction * 0xFFFFFFFF)


def netem_options(delay_ns: int, limit: int = NETEM_LIMIT, loss: float = 0.0) -> bytes:
    """TCA_OPTIONS of a netem with a fixed delay and a random loss fraction: tc_netem_qopt (latency
    in psched ticks, as every kernel reads it; loss as loss_word) followed by TCA_NETEM_LATENCY64
    in ns (exact, read since 4.15)."""
    ticks = min(delay_ns >> PSCHED_SHIFT, 0xFFFFFFFF)
    return _QOPT.pack(ticks, limit, loss_word(loss), 0, 0, 0) + _nla(TCA_NETEM_LATENCY64, struct.pack("=q", delay_ns))


class QdiscBatch(Batch):
    """The qdisc requests of a delay: netem added (or replaced), a fifo put back, a root deleted."""

    def netem(self, index: int, parent: int, delay_ns: int, limit: int = NETEM_LIMIT, handle: int = NETEM_HANDLE,
              loss: float = 0.0) -> None:
        body = _tcmsg(index, handle, parent) + _nla(TCA_KIND, b"netem\0")
        body += _nla(TCA_OPTIONS, netem_options(delay_ns, limit, loss))
        self._add(RTM_NEWQDISC, NLM_F_CREATE | NLM_F_REPLACE, body,
                  f"netem delay {delay_ns / 1e6:g} ms loss {loss:.4%} on {index}")

    def bfifo(self, index: int, parent: int, limit_bytes: int) -> None:
        body = _tcmsg(index, 0, parent) + _nla(TCA_KIND, b"bfifo\0") + _nla(TCA_OPTIONS, struct.pack("=I", limit_bytes))
        self._add(RTM_NEWQDISC, NLM_F_CREATE | NLM_F_REPLACE, body, f"bfifo under {parent:#x} on {index}")

    def pfifo(self, index: int, parent: int, limit_packets: int) -> None:
        body = _tcmsg(index, 0, parent) + _nla(TCA_KIND, b"pfifo\0") + _nla(TCA_OPTIONS, struct.pack("=I", limit_packets))
        self._add(RTM_NEWQDISC, NLM_F_CREATE | NLM_F_REPLACE, body, f"pfifo under {parent:#x} on {index}")

    def delete_root(self, index: int) -> None:
        self._add(RTM_DELQDISC, 0, _tcmsg(index, 0, TC_H_ROOT), f"root qdisc of {index}")


_libc = ctypes.CDLL(None, use_errno=True)


def kernel_refuses(build, what: str = "netem") -> str | None:
    """What the kernel said when refusing the requests `build()` makes (a Batch), sent in a fresh,
    unnamed namespace that vanishes with this call; None if it took them. A probe for a module:
    netem here, RED in red.py."""
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        if _libc.unshare(netns.CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            return f"cannot probe for {what}: unshare(CLONE_NEWNET): {os.strerror(err)} (needs root)"
        try:
            build().send()
        except NetlinkError as exc:
            return str(exc).rsplit(": ", 1)[-1]
        finally:
            netns.setns(home)
    finally:
        os.close(home)
    return None


@functools.lru_cache(maxsize=1)
def netem_missing() -> str | None:
    """Why a delay cannot be applied here (one line naming the module), or None: asks the kernel to
    add a netem to the loopback of a fresh, unnamed namespace, which vanishes with this call."""
    def build() -> QdiscBatch:
        batch = QdiscBatch()
        batch.netem(socket.if_nametoindex("lo"), TC_H_ROOT, 1_000_000)
        return batch

    said = kernel_refuses(build)
    if said is None or said.startswith("cannot probe"):
        return said
    return (f"this kernel has no netem (module sch_netem, CONFIG_NET_SCH_NETEM): a delay fault needs it "
            f"(the kernel said: {said}); a stock distribution kernel has it (the Vagrant VM of the README)")


def require_netem() -> None:
    if reason := netem_missing():
        raise NetemMissing(reason)


def _root(ipr: IPRoute, index: int):
    roots = [q for q in ipr.get_qdiscs(index=index) if q["parent"] == TC_H_ROOT]
    return roots[0] if roots else None


def _tbf_limit(qdisc) -> int:
    return qdisc.get_attr("TCA_OPTIONS").get_attr("TCA_TBF_PARMS")["limit"]


def delay_batch(ipr: IPRoute, index: int, delay_ns: int, loss: float = 0.0) -> QdiscBatch:
    """The request that adds `delay_ns` (and drops a fraction `loss` at random) on the port: netem
    at the root, or under the port's TBF."""
    root = _root(ipr, index)
    batch = QdiscBatch()
    if root is None or root.get_attr("TCA_KIND") in ("noqueue", "netem"):
        batch.netem(index, TC_H_ROOT, delay_ns, loss=loss)
    elif root.get_attr("TCA_KIND") == "tbf":
        if _ordered(ipr, index, root):  # the HTB that sends control ahead of data: under each of its classes
            for n, classid in enumerate(ORDER_CLASSES):
                batch.netem(index, classid, delay_ns, handle=NETEM_HANDLE + ((1 + n) << 16), loss=loss)
        else:
            batch.netem(index, root["handle"] | 1, delay_ns, loss=loss)
    else:
        raise FabricSetupError(f"cannot add a delay under a {root.get_attr('TCA_KIND')} root qdisc")
    return batch


def undelay_batch(ipr: IPRoute, index: int) -> QdiscBatch:
    """The request that takes our netem off the port (nothing if it has none)."""
    batch = QdiscBatch()
    root = _root(ipr, index)
    if root is None:
        return batch
    if root.get_attr("TCA_KIND") == "netem" and root["handle"] == NETEM_HANDLE:
        batch.delete_root(index)
    elif root.get_attr("TCA_KIND") == "tbf":
        qdiscs = ipr.get_qdiscs(index=index)
        if _ordered(ipr, index, root):
            for classid in ORDER_CLASSES:  # the classes' own fifos back (ports.TcBatch.order_classes)
                leaf = [q for q in qdiscs if q["parent"] == classid]
                if leaf and leaf[0].get_attr("TCA_KIND") == "netem":
                    batch.pfifo(index, classid, leaf_limit(_tbf_limit(root)))
            return batch
        child = [q for q in qdiscs if q["parent"] == root["handle"] | 1]
        if child and child[0].get_attr("TCA_KIND") == "netem":
            batch.bfifo(index, root["handle"] | 1, _tbf_limit(root))
    return batch


def _ordered(ipr: IPRoute, index: int, root) -> bool:
    """Whether the TBF's child is the HTB that orders a port's classes (fabric/build.py)."""
    child = [q for q in ipr.get_qdiscs(index=index) if q["parent"] == root["handle"] | 1]
    return bool(child) and child[0].get_attr("TCA_KIND") == "htb" and child[0]["handle"] == ORDER_HANDLE


def set_delay(fabric: Fabric, ends: list[tuple[str, str]], ms: float, loss: float = 0.0) -> None:
    """Delay every packet leaving each (node, interface) of `ends` by `ms` milliseconds, and drop
    a fraction `loss` of them at random (netem's own loss: `loss` faults with mechanism netem)."""
    require_netem()
    for node, intf in ends:
        with netns.entered(fabric.node_path(node)), IPRoute() as ipr:
            (index,) = ipr.link_lookup(ifname=intf)
            delay_batch(ipr, index, round(ms * 1e6), loss).send()  # its socket opens in this namespace


def clear_delay(fabric: Fabric, ends: list[tuple[str, str]]) -> None:
    """Take our netem off each end (those without one are left alone)."""
    for node, intf in ends:
        with netns.entered(fabric.node_path(node)), IPRoute() as ipr:
            indexes = ipr.link_lookup(ifname=intf)
            if indexes:
                undelay_batch(ipr, indexes[0]).send()
