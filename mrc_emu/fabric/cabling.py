"""Every veth of a fabric, created in one netlink batch with interface indexes the topology fixes.

Why it exists: one pyroute2 call per veth costs several times the kernel's work on it; the same
requests encoded by netlink.Batch and sent from this namespace, each end placed straight into
its node's namespace by fd, cost little more than the kernel's (docs/scale.md has the figures).
The index of every end is fixed (lo is 1 everywhere; `index_of`) and unique across the whole
fabric, so the two ends of a veth never share an index. That matters: linkwatch makes a veth
operational (operstate UP, qdisc attached: until then it drops) at once only if its peer's
index differs from its own (its "urgent" test, meant for stacked devices), and otherwise up to
a second later. With the indexes the kernel picks (1, 2, 3... in every namespace) ends often
collide, and `large` waited over a second for its links.

The batch is sent from a namespace of its own that holds only lo (`send`): Linux 6.1 (Debian 12's
stock kernel, the Vagrant VM's) refuses a requested index that is taken in the namespace the request
comes from, not only in the one the end is made in, and the root namespace's eth0 is index 2, the
SID anchor's (EEXIST for every node); 6.18 checks the end's own namespace only.

It only creates interfaces (down); config.py brings them up and addresses them.
"""

from __future__ import annotations

import ctypes
import os
import socket

from ..topology import Link, Topology
from ..topology.addressing import link_mac
from .config import SID_ANCHOR, SID_ANCHOR_PEER
from .kernel import netns
from .kernel.netlink import NETLINK_CAP_ACK, SOL_NETLINK, Batch

ANCHOR_INDEX = 2  # sid0; its peer sid1 is 3
LINK_INDEX_BASE = 16  # link K: its a end is 16 + 2K, its b end 17 + 2K

_libc = ctypes.CDLL(None, use_errno=True)


def index_of(link: Link, node: str) -> int:
    """The interface index of `node`'s end of `link`, in `node`'s namespace."""
    return LINK_INDEX_BASE + 2 * link.link_id + (0 if node == link.a else 1)


def batch(topo: Topology, fds: dict[str, int]) -> Batch:
    """The requests creating each node's SID anchor pair and every link, given an fd per node's namespace."""
    out = Batch()
    for fd in fds.values():
        out.veth(SID_ANCHOR, fd, SID_ANCHOR_PEER, fd, 1500, ANCHOR_INDEX, ANCHOR_INDEX + 1)
    for link in topo.links:
        out.veth(link.a_intf, fds[link.a], link.b_intf, fds[link.b], topo.mtu,
                 index_of(link, link.a), index_of(link, link.b), link_mac(link, link.a), link_mac(link, link.b))
    return out


def send(requests: Batch) -> None:
    """Send the cabling requests from a fresh namespace holding only lo (it vanishes with the socket)."""
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        if _libc.unshare(netns.CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"unshare(CLONE_NEWNET) for the cabling batch: {os.strerror(err)}")
        try:
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
        finally:
            netns.setns(home)
    finally:
        os.close(home)
    with sock:
        sock.setsockopt(SOL_NETLINK, NETLINK_CAP_ACK, 1)
        sock.bind((0, 0))
        requests.send(sock)
