"""Receive steering: every interface of the fabric hands its packets to one CPU of its own.

Why it exists: a veth hands what it transmits to the receive backlog of the CPU that happens to
be transmitting, and a shaped port (TBF) transmits from whichever CPU its timer or its next
enqueue runs on, so two packets of one path that leave a port from two CPUs could enter two
backlogs and the later one be forwarded first. With RPS (Receive Packet Steering) set to a
single CPU per interface, every packet an interface receives is processed by that CPU, in the
order the interface received it, whichever CPU sent it: each hop is FIFO, and so is every path.
scripts/reorder_probe.py measures a path's order with and without it (docs/transport.md,
Reordering); a fabric is not steered unless asked (the probe's `steered` mode), since the probe
found no reordering to remove. The CPUs are taken in turn, node by node, so the forwarding work
still spreads over all of them.

RPS lives in sysfs only (`/sys/class/net/IF/queues/rx-0/rps_cpus`), and a namespace's
interfaces show in a sysfs mounted from inside it, so a short-lived child process takes a mount
namespace of its own (nothing it mounts is seen outside it) and, node by node, enters the
node's network namespace, mounts sysfs over /sys and writes the masks. The setting belongs to
the interfaces and goes with them when the fabric is taken down: nothing to record.

What it must never do: touch an interface outside the fabric's namespaces, or a mount outside
its own child's mount namespace.
"""

from __future__ import annotations

import ctypes
import os

from ...topology import Topology
from ..kernel import netns
from ..running import Fabric

CLONE_NEWNS = 0x00020000
MS_REC, MS_PRIVATE = 0x4000, 1 << 18
MNT_DETACH = 2
_libc = ctypes.CDLL(None, use_errno=True)


def plan(topo: Topology, cpus: list[int]) -> dict[str, dict[str, int]]:
    """Node -> {interface: CPU}: every interface of a node on the node's CPU, the CPUs in turn."""
    out = {}
    for i, node in enumerate(topo.nodes):
        cpu = cpus[i % len(cpus)]
        out[node] = {topo.peer(link, node)[1]: cpu for link in topo.links_of(node)}
    return out


def _mount_sysfs() -> None:
    if _libc.umount2(b"/sys", MNT_DETACH) != 0 or _libc.mount(b"sysfs", b"/sys", b"sysfs", 0, None) != 0:
        raise OSError(ctypes.get_errno(), "mounting this namespace's sysfs: " + os.strerror(ctypes.get_errno()))


def _apply(fabric: Fabric, steering: dict[str, dict[str, int]]) -> None:
    """In the child: a private mount namespace, then each node's sysfs and its masks."""
    if _libc.unshare(CLONE_NEWNS) != 0 or _libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        raise OSError(ctypes.get_errno(), "a private mount namespace: " + os.strerror(ctypes.get_errno()))
    for node, interfaces in steering.items():
        fd = os.open(fabric.node_path(node), os.O_RDONLY)
        try:
            netns.setns(fd)
        finally:
            os.close(fd)
        _mount_sysfs()
        for intf, cpu in interfaces.items():
            with open(f"/sys/class/net/{intf}/queues/rx-0/rps_cpus", "w") as mask:
                mask.write(f"{1 << cpu:x}")


def steer(fabric: Fabric, cpus: list[int] | None = None) -> dict[str, dict[str, int]]:
    """Every interface of the fabric receives on one CPU (of `cpus`, default: this process's);
    returns the plan. Raises OSError naming what the kernel refused (no RPS: CONFIG_RPS)."""
    cpus = sorted(os.sched_getaffinity(0)) if cpus is None else cpus
    steering = plan(fabric.topology, cpus)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: nothing of the parent's Python state is used but the plan
        os.close(read)
        code = 0
        try:
            _apply(fabric, steering)
        except BaseException as exc:  # reported to the parent, which raises it
            os.write(write, f"{type(exc).__name__}: {exc}".encode()[:4000])
            code = 1
        os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        said = pipe.read().decode(errors="replace")
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise OSError(f"receive steering of fabric {fabric.name!r} failed: {said or 'the child died'} "
                      "(it needs RPS, CONFIG_RPS, and root)")
    return steering
