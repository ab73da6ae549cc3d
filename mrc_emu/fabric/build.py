"""Bring a fabric up and take it down.

Why it exists: `up` turns a topology into namespaces, veths and kernel routes, fast, and
records each resource in the journal before creating it; if anything fails (or Ctrl-C),
it removes what it made before re-raising, so nothing is half-created. `down` deletes the
namespaces (their veths go with them) rather than links one by one, which is what makes
it fast. Neither ever touches a resource the journal does not name.
"""

from __future__ import annotations

import select
import time
from collections.abc import Callable
from dataclasses import dataclass

from pyroute2 import IPRoute

from ..topology import Topology, from_dict
from . import cabling, config, namespaces, netlink, netns, registry, static_routes
from .nodes import FabricSetupError, check_prerequisites

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
    phases: dict[str, float] = {}
    start = time.monotonic()
    fds: list[int] = []
    try:
        progress(f"creating {len(topo.nodes)} namespaces")
        paths = [netns.netns_path(name, node_name) for node_name in topo.nodes]
        for path in paths:
            journal.namespace(path)
            namespaces.create(path, config.NAMESPACE_SYSCTLS)
        phases["nodes"] = time.monotonic() - start

        mark = time.monotonic()
        progress(f"cabling {len(topo.links)} links")
        fds = namespaces.open_all(paths)
        cabling.batch(topo, dict(zip(topo.nodes, fds))).send()
        if topo.link_rate_bps:
            for node_name in topo.nodes:
                shape_node(topo, name, node_name)
        phases["links"] = time.monotonic() - mark

        mark = time.monotonic()
        progress("configuring addresses, SIDs and routes")
        for node_name in topo.nodes:
            config.apply(config.plan(topo, node_name), str(netns.netns_path(name, node_name)))
        phases["routes"] = time.monotonic() - mark

        mark = time.monotonic()
        wait_operational(name, topo, topo.links, timeout=30.0)
        phases["carrier"] = time.monotonic() - mark
        journal.append({"kind": "ready", "time": time.time()})
    except BaseException:
        journal.close()
        registry.remove(name)
        raise
    finally:
        namespaces.close_all(fds)
    journal.close()
    return UpResult(name, topo, time.monotonic() - start, phases)


def shape_node(topo: Topology, name: str, node_name: str) -> None:
    """A token bucket on every interface of a node: the link rate of the topology."""
    rate = int(topo.link_rate_bps / 8)  # pyroute2 takes bytes per second
    burst = max(topo.mtu * 4, rate // 1000)
    with netns.entered(netns.netns_path(name, node_name)), IPRoute() as ipr:
        for link in topo.links_of(node_name):
            _, intf, _ = topo.peer(link, node_name)
            (index,) = ipr.link_lookup(ifname=intf)
            ipr.tc("replace", "tbf", index, rate=rate, burst=burst, latency=50_000)


def down(name: str = "mrc") -> registry.FabricRecord:
    if not netns.NETNS_DIR.exists() and not registry.journal_path(name).exists():
        raise registry.RegistryError(f"no fabric named {name!r} is running")
    with namespaces.held(registry.read(name).namespaces):
        return registry.remove(name)


def clean() -> list[str]:
    """Remove every fabric the journals record (what crashed or killed runs left)."""
    removed = []
    for name in registry.names():
        with namespaces.held(registry.read(name).namespaces):
            registry.remove(name)
        removed.append(name)
    return removed


def load_topology(name: str) -> Topology:
    record = registry.read(name)
    return from_dict(record.topology, record.source or "<journal>")


def set_link(name: str, a: str, b: str, up_: bool, plane: int | None = None) -> list[int]:
    """Take the link(s) between a and b down or up; up re-applies both ends' configuration
    (and their static routes, on a fabric with `routing: static`)."""
    topo = load_topology(name)
    links = topo.links_between(a, b, plane)
    if not links:
        raise FabricSetupError(f"no link between {a} and {b}" + (f" in plane {plane}" if plane is not None else ""))
    record = registry.read(name)
    with registry.Journal.open(name) as journal:
        for link in links:
            journal.link_state(link.link_id, up_)
            for node_name, intf in ((link.a, link.a_intf), (link.b, link.b_intf)):
                with netns.entered(netns.netns_path(name, node_name)), IPRoute() as ipr:
                    (index,) = ipr.link_lookup(ifname=intf)
                    ipr.link("set", index=index, state="up" if up_ else "down")
    if up_:
        wait_operational(name, topo, links)
        down_links = record.down_links - {link.link_id for link in links}
        for node_name in {n for link in links for n in (link.a, link.b)}:
            skip = frozenset(
                topo.peer(link, node_name)[1] for link in topo.links_of(node_name) if link.link_id in down_links
            )
            config.apply(config.plan(topo, node_name), str(netns.netns_path(name, node_name)), skip)
            if record.routing == static_routes.MODE:  # the kernel dropped them with the link
                static_routes.apply(name, topo, node_name, skip)
    return [link.link_id for link in links]


def _operational(name: str, node_name: str, intfs: set[str]) -> set[str]:
    with netns.entered(netns.netns_path(name, node_name)):
        states = netlink.link_operstates()
    return {intf for intf in intfs if states.get(intf) == netlink.IF_OPER_UP}


def wait_operational(name: str, topo: Topology, links: list, timeout: float = 5.0) -> None:
    """Wait until both ends of every link report carrier: the kernel raises it asynchronously
    (linkwatch, up to a second later), and a frame sent before then is dropped."""
    wanted: dict[str, set[str]] = {}
    for link in links:
        wanted.setdefault(link.a, set()).add(link.a_intf)
        wanted.setdefault(link.b, set()).add(link.b_intf)
    deadline = time.monotonic() + timeout
    while wanted:
        wanted = {n: rest for n, intfs in wanted.items() if (rest := intfs - _operational(name, n, intfs))}
        if not wanted:
            return
        if time.monotonic() > deadline:
            raise FabricSetupError(f"links did not come up within {timeout:.0f} s: {wanted}")
        select.select([], [], [], 0.01)

