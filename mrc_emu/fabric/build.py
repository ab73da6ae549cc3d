"""Bring a fabric up and take it down.

Why it exists: `up` turns a topology into namespaces, veths and kernel routes, fast, and
records each resource in the journal before creating it; if anything fails (or Ctrl-C),
it removes what it made before re-raising, so nothing is half-created. `down` deletes the
namespaces (their veths go with them) rather than links one by one, which is what makes
it fast. Neither ever touches a resource the journal does not name.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from pyroute2 import IPRoute

from ..topology import Topology
from . import config, links, netns, registry
from .nodes import LinuxRouter, check_prerequisites
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
    phases: dict[str, float] = {}
    start = time.monotonic()
    nodes: list[LinuxRouter] = []
    try:
        progress(f"starting {len(topo.nodes)} nodes")
        for node_name in topo.nodes:
            node = LinuxRouter(node_name)
            nodes.append(node)
            journal.process(node.pid, f"mininet shell of {node_name}")
        for node in nodes:
            node.wait_ready()
            path = fabric.netns(node.name)
            journal.namespace(path)
            netns.bind(node.pid, path)
            config.prepare_namespace(str(path))
        phases["nodes"] = time.monotonic() - start

        mark = time.monotonic()
        progress(f"cabling {len(topo.links)} links")
        _create_links(fabric)
        phases["links"] = time.monotonic() - mark

        mark = time.monotonic()
        progress("configuring addresses, SIDs and routes")
        for node_name in topo.nodes:
            config.apply(config.plan(topo, node_name), str(fabric.netns(node_name)))
        phases["routes"] = time.monotonic() - mark

        links.wait_carrier(fabric, topo.links, timeout=30.0)
        for node in nodes:
            node.stop_shell()
            journal.process_ended(node.pid)
        journal.append({"kind": "ready", "time": time.time()})
    except BaseException:
        for node in nodes:
            node.stop_shell()
        journal.close()
        registry.remove(name)
        raise
    journal.close()
    return UpResult(name, topo, time.monotonic() - start, phases)


def _create_links(fabric: Fabric) -> None:
    """Every veth pair, created straight inside its two namespaces, then shaped if asked."""
    topo = fabric.topology
    fds: dict[str, int] = {}
    try:
        for node_name in topo.nodes:
            fds[node_name] = os.open(fabric.netns(node_name), os.O_RDONLY)
        with IPRoute() as ipr:
            for node_name in topo.nodes:
                ipr.link("add", ifname=config.SID_ANCHOR, kind="veth", net_ns_fd=fds[node_name],
                         peer={"ifname": config.SID_ANCHOR_PEER, "net_ns_fd": fds[node_name]})
            for link in topo.links:
                ipr.link(
                    "add",
                    ifname=link.a_intf,
                    kind="veth",
                    mtu=topo.mtu,
                    net_ns_fd=fds[link.a],
                    peer={"ifname": link.b_intf, "net_ns_fd": fds[link.b], "mtu": topo.mtu},
                )
    finally:
        for fd in fds.values():
            os.close(fd)
    if topo.link_rate_bps:
        for node_name in topo.nodes:
            shape_node(fabric, node_name)


def shape_node(fabric: Fabric, node_name: str) -> None:
    """A token bucket on every interface of a node: the link rate of the topology."""
    topo = fabric.topology
    rate = int(topo.link_rate_bps / 8)  # pyroute2 takes bytes per second
    burst = max(topo.mtu * 4, rate // 1000)
    with netns.entered(fabric.netns(node_name)), IPRoute() as ipr:
        for link in topo.links_of(node_name):
            _, intf, _ = topo.peer(link, node_name)
            (index,) = ipr.link_lookup(ifname=intf)
            ipr.tc("replace", "tbf", index, rate=rate, burst=burst, latency=50_000)


def down(name: str = "mrc") -> registry.FabricRecord:
    if not netns.NETNS_DIR.exists() and not registry.journal_path(name).exists():
        raise registry.RegistryError(f"no fabric named {name!r} is running")
    return registry.remove(name)


def clean() -> list[str]:
    """Remove every fabric the journals record (what crashed or killed runs left)."""
    removed = []
    for name in registry.names():
        registry.remove(name)
        removed.append(name)
    return removed
