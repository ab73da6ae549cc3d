"""Bring a fabric up and take it down.

Why it exists: `up` turns a topology into namespaces, veths and kernel routes, fast, and
records each resource in the journal before creating it; if anything fails (or Ctrl-C),
it removes what it made before re-raising, so nothing is half-created. `down` deletes the
namespaces (their veths go with them) rather than links one by one, which is what makes
it fast. Neither ever touches a resource the journal does not name.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from pyroute2 import IPRoute

from ..topology import Topology
from ..topology.port import TBF_LATENCY_US, tbf_limit, tbf_shape
from . import cabling, config, limits, links, registry
from .datapath import ports, red, srv6
from .kernel import namespaces, netns, seg6local
from .nodes import check_prerequisites
from .running import Fabric

Progress = Callable[[str], None]


@dataclass
class UpResult:
    name: str
    topology: Topology
    seconds: float
    phases: dict[str, float]


def _quiet(_: str) -> None:
    pass


def up(topo: Topology, name: str = "mrc", progress: Progress | None = None) -> UpResult:
    progress = progress or _quiet
    registry.check_name(name)
    check_prerequisites()
    if topo.ports.model == "red" and topo.egress_ports():
        red.require_red()  # one line naming sch_red, before anything exists
    if registry.journal_path(name).exists():
        raise registry.RegistryError(
            f"a fabric named {name!r} is already up: 'mrc-emu down --name {name}' first, or choose another --name"
        )
    clashes = [p for n in topo.nodes if (p := netns.netns_path(name, n)).exists()]
    if clashes:
        raise registry.RegistryError(
            f"{clashes[0]} already exists, and not from a fabric this tool recorded: "
            f"choose another --name"
        )
    journal = registry.Journal.create(name, {"topology": topo.to_dict(), "source": topo.source})
    fabric = Fabric(name, topo, journal)
    limits.raise_for(topo)
    phases: dict[str, float] = {}
    start = time.monotonic()
    fds: list[int] = []
    try:
        progress(f"creating {len(topo.nodes)} namespaces")
        paths = [fabric.netns(node_name) for node_name in topo.nodes]
        for path in paths:
            journal.namespace(path)
            namespaces.create(path, config.NAMESPACE_SYSCTLS)
        phases["nodes"] = time.monotonic() - start

        mark = time.monotonic()
        progress(f"cabling {len(topo.links)} links")
        fds = namespaces.open_all(paths)
        cabling.send(cabling.batch(topo, dict(zip(topo.nodes, fds))))
        if topo.link_rate_bps:
            for node_name in topo.nodes:
                shape_node(fabric, node_name)
        phases["links"] = time.monotonic() - mark

        if topo.egress_ports():  # without a link rate there is no queue to model: no phase
            mark = time.monotonic()
            progress(f"port programs on {len(topo.egress_ports())} egress ports")
            ports.attach(fabric)
            if topo.ports.model == "red":  # the kernel's RED marks under each data class (fabric/datapath/red.py)
                count = red.attach(fabric)
                progress(f"RED with ECN on {count} egress ports")
            phases["ports"] = time.monotonic() - mark

        if seg6local.mode() == "bpf":  # no seg6local in this kernel (or MRC_EMU_SRV6=bpf): the SIDs in BPF
            mark = time.monotonic()
            progress(f"SRv6 endpoint program on {srv6.attach(fabric)} interfaces (no seg6local here)")
            phases["srv6"] = time.monotonic() - mark

        mark = time.monotonic()
        progress("configuring addresses, SIDs and routes")
        for node_name in topo.nodes:
            config.apply(config.plan(topo, node_name), str(fabric.netns(node_name)))
        phases["routes"] = time.monotonic() - mark

        mark = time.monotonic()
        links.wait_carrier(fabric, topo.links, timeout=30.0)
        phases["carrier"] = time.monotonic() - mark
        journal.append({"kind": "ready", "time": time.time()})
    except BaseException:
        journal.close()
        registry.remove(name)
        limits.restore_if_last()
        raise
    finally:
        namespaces.close_all(fds)
    journal.close()
    return UpResult(name, topo, time.monotonic() - start, phases)


def shape_node(fabric: Fabric, node_name: str, rate_bps: float | None = None) -> None:
    """A token bucket on every interface of a node: the link rate of the topology (or `rate_bps`:
    a run under time dilation K shapes links to rate / K, and back afterwards). The port
    program's virtual queues drain at the same rate.

    Under each TBF (handle 1:) sits an HTB (2:) that only orders, never shapes: class 2:1
    (CLASS_AHEAD) before 2:2 (CLASS_DATA, its default), each with a FIFO that holds at least
    TBF's own limit in bytes (the port program drops at the port's buffer before either fills).
    The port program puts control packets and trimmed headers in 2:1, so they leave ahead of
    the data queued at the port. A reshape changes TBF in place and keeps its child."""
    topo = fabric.topology
    rate, burst = tbf_shape(rate_bps or topo.link_rate_bps, topo.mtu, topo.ports.bucket)  # pyroute2 takes bytes per second
    # the limit in bytes is the topology's, whatever the rate: under time dilation K a port holds
    # as many bytes as it does at full rate (K times as long), never less than the program's buffer
    limit = tbf_limit(topo.link_rate_bps, topo.mtu, topo.ports.bucket)
    order = ports.TcBatch() if rate_bps is None else None  # the first shaping: the HTB under each TBF too
    with netns.entered(fabric.netns(node_name)), IPRoute() as ipr:
        for link in topo.links_of(node_name):
            _, intf, _ = topo.peer(link, node_name)
            (index,) = ipr.link_lookup(ifname=intf)
            ipr.tc("replace", "tbf", index, ports.TBF_HANDLE, rate=rate, burst=burst, limit=limit)
            if order is not None:
                order.order_classes(index, rate, limit, topo.mtu)
        if order is not None:
            order.send()  # one round trip for the node's ports
    if rate_bps is not None:
        ports.set_rate(fabric, node_name, rate_bps)


def shape_every_node(fabric: Fabric, rate_bps: float) -> None:
    """Every node's ports at `rate_bps` (shape_node): a run under time dilation K at rate / K, and a
    raw-socket burst on a machine too slow to outrun the links (ops.burst_dilation)."""
    for node in fabric.topology.nodes:
        shape_node(fabric, node, rate_bps)


def shape_port(fabric: Fabric, node_name: str, intf: str, rate_bps: float, ipr: IPRoute | None = None) -> None:
    """One port's token bucket (and its port program's virtual queue) reshaped to `rate_bps`: a
    degraded link (experiments' `degrade` fault, `mrc-emu fault degrade`). `ipr`: an IPRoute
    already in the node's namespace (a fault agent opens them in advance)."""
    rate, burst = tbf_shape(rate_bps, fabric.topology.mtu, fabric.topology.ports.bucket)
    if ipr is None:
        with netns.entered(fabric.netns(node_name)), IPRoute() as own:
            (index,) = own.link_lookup(ifname=intf)
            own.tc("replace", "tbf", index, ports.TBF_HANDLE, rate=rate, burst=burst, latency=TBF_LATENCY_US)
    else:
        (index,) = ipr.link_lookup(ifname=intf)
        ipr.tc("replace", "tbf", index, ports.TBF_HANDLE, rate=rate, burst=burst, latency=TBF_LATENCY_US)
    ports.set_port_rate(fabric, node_name, intf, rate_bps)


def down(name: str = "mrc") -> registry.FabricRecord:
    if not netns.NETNS_DIR.exists() and not registry.journal_path(name).exists():
        raise registry.RegistryError(f"no fabric named {name!r} is running")
    with namespaces.held(registry.read(name).namespaces):
        record = registry.remove(name)
    limits.restore_if_last()
    return record


def clean() -> list[str]:
    """Remove every fabric the journals record (what crashed or killed runs left)."""
    removed = []
    for name in registry.names():
        with namespaces.held(registry.read(name).namespaces):
            registry.remove(name)
        removed.append(name)
    limits.restore_if_last()
    return removed
