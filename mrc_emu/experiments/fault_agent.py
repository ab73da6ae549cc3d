"""A fault agent: a child process that fails or restores links on cue, timed exactly.

Why it exists: the moment of a fault must be known to the microsecond to measure recovery,
and the fault must not stall the transfer it disturbs. Done in the requester's own loop, a
netlink request (about 2 ms, as the kernel flushes routes) blocks sending; done in another
thread, it waits for the GIL. So a child process (fabric/procs.py) holds the link helper's
netlink sockets, opened in the nodes' namespaces with their requests encoded in advance
(fabric/links.py), and acts when told; it reports when each action started and returned
(CLOCK_MONOTONIC, shared by all processes). Its actions are the dataclasses below.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from ..fabric import links as link_state
from ..fabric import netns, xdp
from ..fabric.nodes import FabricSetupError
from ..fabric.procs import Child, Parent, Stop
from ..fabric.running import Fabric
from ..fabric.waiting import pause_until
from ..topology.model import Link


@dataclass(frozen=True)
class LinkDown:
    """Take the agent's links down at its node's end (one request per namespace)."""

    label: str = "down"  # the name of the action in a run's timeline


@dataclass(frozen=True)
class LinkUp:
    """Bring the agent's links up at both ends and give them their configuration back."""

    label: str = "restore"


@dataclass(frozen=True)
class Flap:
    """Down and up `count` times, half a period each."""

    period_ms: float
    count: int

    @property
    def label(self) -> str:
        return "flap"


@dataclass(frozen=True)
class Drop:
    """Drop this fraction of the packets arriving at both ends of the links (1: a blackhole)."""

    fraction: float

    @property
    def label(self) -> str:
        return f"xdp:{self.fraction:g}"


@dataclass(frozen=True)
class DropOff:
    """Stop dropping."""

    @property
    def label(self) -> str:
        return "xdp-off"


@dataclass(frozen=True)
class After:
    """Carry out `action` `ms` milliseconds from now: the fault's own schedule (a duration)."""

    ms: float
    action: LinkDown | LinkUp | Flap | Drop | DropOff

    @property
    def label(self) -> str:
        return self.action.label


Action = LinkDown | LinkUp | Flap | Drop | DropOff | After


@dataclass(frozen=True)
class Done:
    """From the agent: `action` ran from `began_ns` to `returned_ns`."""

    action: Action
    began_ns: int
    returned_ns: int


@dataclass(frozen=True)
class ActionFailed:
    action: Action
    error: str


class _Agent:
    """The agent's side: the encoded link requests and, if asked for, the dropping program."""

    def __init__(self, fabric: Fabric, links: Sequence[Link], at: str, drops: bool) -> None:
        self.switch = link_state.LinkSwitch(fabric, links, at)
        self.attached: list[tuple[object, int]] = []
        self.dropper = None
        if drops:
            # The dropping program is attached to both ends from the start (drop fraction 0): the
            # first generic XDP program switches a static key, which stalls every CPU, and swapping
            # programs waits for RCU. Done now, before any transfer runs, a fault is one map write.
            from pyroute2 import IPRoute

            self.dropper = xdp.Dropper()
            for link in links:
                for node, intf in ((link.a, link.a_intf), (link.b, link.b_intf)):
                    with netns.entered(fabric.node_path(node)):
                        ipr = IPRoute()  # stays in the namespace it was opened in
                    index = ipr.link_lookup(ifname=intf)[0]
                    self.attached.append((ipr, index))
                    xdp.attach(ipr, index, self.dropper.prog_fd)
        self.run = {LinkDown: lambda _: self.switch.down(), LinkUp: lambda _: self.switch.up(),
                    Flap: lambda a: link_state.flap(self.switch, a.period_ms, a.count),
                    Drop: lambda a: self._drop(a.fraction), DropOff: lambda _: self._drop(0.0)}

    def _drop(self, fraction: float) -> None:
        if self.dropper is None:
            raise FabricSetupError("this agent was started without the dropping program")
        self.dropper.set(fraction)

    def close(self) -> None:
        for ipr, index in self.attached:
            try:
                xdp.attach(ipr, index, -1)
            except OSError:
                pass  # the interface is gone with its namespace
            ipr.close()
        if self.dropper is not None:
            self.dropper.close()
        self.switch.close()


def _serve(parent: Parent, fabric: Fabric, links: Sequence[Link], at: str, drops: bool) -> None:
    agent = _Agent(fabric, links, at, drops)
    try:
        parent.ready()
        while not isinstance(message := parent.recv(), Stop):
            action = message
            if isinstance(action, After):
                pause_until(time.monotonic() + action.ms / 1000)
                action = action.action
            try:
                began = time.monotonic_ns()
                agent.run[type(action)](action)
            except Exception as exc:  # reported to the parent, which raises it
                parent.send(ActionFailed(action, f"{type(exc).__name__}: {exc}"))
                continue
            parent.send(Done(action, began, time.monotonic_ns()))
    finally:
        agent.close()


class LinkFaultAgent:
    """Faults on some links, all with one end at node `at`, from a process of their own.

    `drops`: attach the dropping program (for Drop/DropOff) to both ends of every link.
    """

    def __init__(self, fabric: Fabric, links: Sequence[Link], at: str, drops: bool = False) -> None:
        names = ", ".join(f"{link.a}-{link.b}" for link in links)
        self._child = Child(fabric, f"fault agent for {names}", _serve, (fabric, list(links), at, drops),
                            ready_timeout=10)
        self.results: list[Done] = []
        self._sent = 0
        self._failed = 0

    def trigger(self, action: Action) -> None:
        """Ask for an action; returns at once (`wait` gets its timing)."""
        self._child.send(action)
        self._sent += 1

    def pending(self) -> int:
        """Actions asked for whose answer has not been read yet."""
        return self._sent - len(self.results) - self._failed

    def wait(self, timeout: float = 10.0) -> Done:
        """The next action carried out: what, when its request started and when it returned."""
        result = self._child.expect((Done, ActionFailed), timeout)
        if isinstance(result, ActionFailed):
            self._failed += 1
            raise FabricSetupError(f"the fault failed: {result.error}")
        self.results.append(result)
        return result

    def close(self) -> None:
        self._child.stop()

    def __enter__(self) -> LinkFaultAgent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
