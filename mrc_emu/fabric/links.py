"""Link state on a running fabric: take links down, bring them back with their configuration, flap them.

Why it exists: `mrc-emu link down|up|flap`, the scenario runner and the fault agent all fail
and restore links, and must do it the same way: the journal records every change (so
`status` and a later restore know which links are down), and a link brought back up gets
its addresses and routes again (taking an interface down flushes every route through it,
and `up` restores none). Requests are netlink messages encoded when a `LinkSwitch` is made,
on sockets opened in the nodes' namespaces, so that `down()` is only the system calls: a
fault agent times a fault from just before the kernel acts (pyroute2 spends 0.3-0.6 ms
encoding one message).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Sequence

from ..topology.model import Link
from . import config, static_routes
from .kernel import netlink, netns
from .kernel.netlink import Batch
from .kernel.waiting import WaitTimeout, pause_until, until
from .nodes import FabricSetupError
from .running import Fabric


def between(fabric: Fabric, a: str, b: str, plane: int | None = None) -> list[Link]:
    """The link(s) between nodes a and b (of one plane, if given); an error if there is none."""
    links = fabric.topology.links_between(a, b, plane)
    if not links:
        raise FabricSetupError(f"no link between {a} and {b}" + (f" in plane {plane}" if plane is not None else ""))
    return links


def _ends(link: Link) -> list[tuple[str, str]]:
    return [(link.a, link.a_intf), (link.b, link.b_intf)]


class LinkSwitch:
    """Down and up requests for some links, encoded now; one netlink socket per namespace.

    `at`: take the links down at that node's end only (one request per namespace, as a fault
    agent wants it; the peer loses carrier all the same); None: at both ends. `up` always
    brings both ends up and re-applies both nodes' configuration.
    """

    def __init__(self, fabric: Fabric, links: Sequence[Link], at: str | None = None) -> None:
        if not links:
            raise ValueError("a LinkSwitch needs at least one link")
        if at is not None and any(at not in (link.a, link.b) for link in links):
            raise ValueError(f"{at} is not an end of every link given")
        self.fabric = fabric
        self.links = list(links)
        self._sockets: dict[str, socket.socket] = {}
        self._down: dict[str, Batch] = {}
        self._up: dict[str, Batch] = {}
        try:
            for link in self.links:
                for node, intf in _ends(link):
                    index = self._index(node, intf)
                    if at is None or node == at:
                        self._down.setdefault(node, Batch()).link_up(index, False, f"{node} {intf} down")
                    self._up.setdefault(node, Batch()).link_up(index, True, f"{node} {intf} up")
        except BaseException:
            self.close()
            raise

    def _index(self, node: str, intf: str) -> int:
        with netns.entered(self.fabric.node_path(node)):
            if node not in self._sockets:  # a netlink socket stays in the namespace it was opened in
                sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
                sock.bind((0, 0))
                self._sockets[node] = sock
            try:
                return socket.if_nametoindex(intf)
            except OSError:
                raise FabricSetupError(f"{node} has no interface {intf}") from None

    @property
    def link_ids(self) -> list[int]:
        return [link.link_id for link in self.links]

    def down(self) -> None:
        """Take the links down (journaled first, then the requests alone)."""
        for link in self.links:
            self.fabric.journal.link_state(link.link_id, False)
        for node, batch in self._down.items():
            batch.send(self._sockets[node])

    def up(self, timeout: float = 5.0) -> None:
        """Bring both ends up, wait for carrier, give both nodes their configuration back."""
        for link in self.links:
            self.fabric.journal.link_state(link.link_id, True)
        for node, batch in self._up.items():
            batch.send(self._sockets[node])
        wait_carrier(self.fabric, self.links, timeout)
        state = self.fabric.state()
        topo = self.fabric.topology
        for node in self._up:
            skip = frozenset(topo.peer(link, node)[1] for link in topo.links_of(node) if link.link_id in state.down_links)
            config.apply(config.plan(topo, node), str(self.fabric.netns(node)), skip)
            if state.routing == static_routes.MODE:  # the kernel dropped them with the link
                static_routes.apply(self.fabric, node, skip)

    def close(self) -> None:
        for sock in self._sockets.values():
            sock.close()
        self._sockets.clear()

    def __enter__(self) -> LinkSwitch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def set_state(fabric: Fabric, a: str, b: str, up: bool, plane: int | None = None) -> list[int]:
    """Take the link(s) between a and b down (both ends) or up (with their configuration)."""
    with LinkSwitch(fabric, between(fabric, a, b, plane)) as switch:
        switch.up() if up else switch.down()
        return switch.link_ids


def flap(switch: LinkSwitch, period_ms: float, count: int,
         on_change: Callable[[bool, float], None] | None = None) -> None:
    """Down, then up, `count` times, each half a period after the last (on the schedule's own clock,
    so a slow restore does not stretch the period). `on_change(up, ms since the start)`."""
    if period_ms <= 0 or count < 1:
        raise ValueError("a flap needs a period above 0 ms and at least one cycle")
    start = time.monotonic()
    half = period_ms / 2000
    for step in range(2 * count):
        up = step % 2 == 1
        switch.up() if up else switch.down()
        if on_change is not None:
            on_change(up, (time.monotonic() - start) * 1000)
        pause_until(start + (step + 1) * half)


def _operational(fabric: Fabric, node: str, intfs: set[str]) -> set[str]:
    with netns.entered(fabric.netns(node)):
        states = netlink.link_operstates()
    return {intf for intf in intfs if states.get(intf) == netlink.IF_OPER_UP}


def wait_carrier(fabric: Fabric, links: Sequence[Link], timeout: float = 5.0) -> None:
    """Wait until both ends of every link report carrier: the kernel raises it asynchronously
    (linkwatch, up to a second later), and a frame sent before then is dropped."""
    wanted: dict[str, set[str]] = {}
    for link in links:
        for node, intf in _ends(link):
            wanted.setdefault(node, set()).add(intf)

    def all_up() -> bool:
        for node in list(wanted):
            wanted[node] -= _operational(fabric, node, wanted[node])
            if not wanted[node]:
                del wanted[node]
        return not wanted

    try:
        until(all_up, timeout, lambda: f"carrier on {wanted}")
    except WaitTimeout as exc:
        raise FabricSetupError(f"links did not come up: {exc}") from None
