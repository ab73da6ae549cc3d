"""A fault agent: a child process that fails or restores links on cue, timed exactly.

Why it exists: the moment of a fault must be known to the microsecond to measure recovery,
and the fault must not stall the transfer it disturbs. Done in the requester's own loop, a
netlink request (about 2 ms, as the kernel flushes routes) blocks sending; done in another
thread, it waits for the GIL. So a child process (fabric/procs.py) holds the link helper's
netlink sockets, opened in the nodes' namespaces with their requests encoded in advance
(fabric/links.py), and acts when told; it reports when each action started and returned
(CLOCK_MONOTONIC, shared by all processes). Its actions are the dataclasses below.

Every fault it applies is written to the fabric's fault record (fabric/faults/fault_record.py) just
before it acts and cleared once it is undone, so `mrc-emu fault list` shows a scenario's
faults while they are in force, and `fault clear` can undo them if the run was killed.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ...fabric import build
from ...fabric import links as link_state
from ...fabric.datapath import impair, xdp
from ...fabric.faults import fault_ops
from ...fabric.faults import fault_record as rec
from ...fabric.kernel import netns
from ...fabric.kernel.waiting import pause_until
from ...fabric.nodes import FabricSetupError
from ...fabric.procs import Child, Parent, Stop
from ...fabric.running import Fabric
from ...topology.model import Link


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
class Reshape:
    """The links' egress TBF (the agent's sending ends) at `fraction` of the topology's link rate,
    under time dilation `dilation` (links at rate / K); 1: the link's full rate back."""

    fraction: float
    dilation: float = 1.0

    @property
    def label(self) -> str:
        return f"rate:{self.fraction:g}"


@dataclass(frozen=True)
class Delay:
    """netem on the links' egress (the agent's sending ends): `ms` emulated milliseconds more, under
    time dilation `dilation` (ms x K of wall time in netem). The label, like Reshape's, is the
    emulated figure: what the scenario asked for and what the run's times are in."""

    ms: float
    dilation: float = 1.0

    @property
    def wall_ms(self) -> float:
        return self.ms * self.dilation

    @property
    def label(self) -> str:
        return f"delay:{self.ms:g}ms"


@dataclass(frozen=True)
class DelayOff:
    """Take the delay off."""

    @property
    def label(self) -> str:
        return "delay-off"


@dataclass(frozen=True)
class NetemLoss:
    """netem on the links' egress (the agent's sending ends) dropping this fraction at random."""

    fraction: float

    @property
    def label(self) -> str:
        return f"netem-loss:{self.fraction:g}"


@dataclass(frozen=True)
class NetemLossOff:
    """Take the netem loss off."""

    @property
    def label(self) -> str:
        return "netem-loss-off"


@dataclass(frozen=True)
class After:
    """Carry out `action` `ms` milliseconds from now: the fault's own schedule (a duration)."""

    ms: float
    action: LinkDown | LinkUp | Flap | Drop | DropOff | Reshape | Delay | DelayOff | NetemLoss | NetemLossOff

    @property
    def label(self) -> str:
        return self.action.label


Action = LinkDown | LinkUp | Flap | Drop | DropOff | Reshape | Delay | DelayOff | NetemLoss | NetemLossOff | After


@dataclass(frozen=True)
class RecordAs:
    """How the agent's fault appears in the fault record: kind, target, parameters, by whom."""

    kind: str
    target: str
    params: dict[str, Any] = field(default_factory=dict)
    by: str = "scenario"
    pid: int = 0  # the run's process (the agent is its child)


@dataclass(frozen=True)
class Done:
    """From the agent: `action` ran from `began_ns` (its record written) to `returned_ns`."""

    action: Action
    began_ns: int
    returned_ns: int


@dataclass(frozen=True)
class ActionFailed:
    action: Action
    error: str


def _applies(action: Action) -> bool | None:
    """True: the action puts a fault in force; False: it ends one; None: both (a flap)."""
    if isinstance(action, Flap):
        return None
    if isinstance(action, Reshape):
        return action.fraction < 1
    return isinstance(action, (LinkDown, Drop, Delay, NetemLoss))


class _Agent:
    """The agent's side: the encoded link requests and, if asked for, the dropping program on the
    links' receiving ends and netlink sockets in the namespaces of their sending ends."""

    def __init__(self, fabric: Fabric, links: Sequence[Link], at: str, drops: bool, qdiscs: bool,
                 direction: tuple[str, str] | None, record_as: RecordAs | None) -> None:
        self.fabric = fabric
        self.switch = link_state.LinkSwitch(fabric, links, at)
        self.links = list(links)
        self.ingress = fault_ops.ends(links, direction, receiving=True)
        self.egress = fault_ops.ends(links, direction, receiving=False)
        self.record = rec.FaultRecord(fabric) if record_as is not None else None
        self.record_as = record_as
        self.entry: rec.Entry | None = None
        self.attached: list[tuple[object, int]] = []
        self.qdisc_sockets: dict[str, object] = {}
        self.dropper = None
        from pyroute2 import IPRoute

        if drops:
            # The dropping program is attached to the receiving ends from the start (drop fraction 0):
            # the first generic XDP program switches a static key, which stalls every CPU, and swapping
            # programs waits for RCU. Done now, before any transfer runs, a fault is one map write.
            self.dropper = xdp.Dropper()
            for node, intf in self.ingress:
                with netns.entered(fabric.node_path(node)):
                    ipr = IPRoute()  # stays in the namespace it was opened in
                index = ipr.link_lookup(ifname=intf)[0]
                self.attached.append((ipr, index))
                xdp.attach(ipr, index, self.dropper.prog_fd)
        if qdiscs:
            for node, _ in self.egress:
                if node not in self.qdisc_sockets:
                    with netns.entered(fabric.node_path(node)):
                        self.qdisc_sockets[node] = IPRoute()
        self.run = {LinkDown: lambda _: self.switch.down(), LinkUp: lambda _: self.switch.up(),
                    Flap: lambda a: link_state.flap(self.switch, a.period_ms, a.count),
                    Drop: lambda a: self._drop(a.fraction), DropOff: lambda _: self._drop(0.0),
                    Reshape: self._reshape, Delay: self._delay, DelayOff: self._undelay,
                    NetemLoss: self._delay, NetemLossOff: self._undelay}

    def _drop(self, fraction: float) -> None:
        if self.dropper is None:
            raise FabricSetupError("this agent was started without the dropping program")
        self.dropper.set(fraction)

    def _reshape(self, action: Reshape) -> None:
        rate = self.fabric.topology.link_rate_bps
        if not rate:
            raise FabricSetupError(f"a degrade needs a link rate: topology {self.fabric.topology.name} has no link_rate")
        for node, intf in self.egress:
            build.shape_port(self.fabric, node, intf, rate * action.fraction / action.dilation, self.qdisc_sockets[node])

    def _delay(self, action: Delay | NetemLoss) -> None:
        ms, loss = (action.wall_ms, 0.0) if isinstance(action, Delay) else (0.0, action.fraction)
        for node, intf in self.egress:
            ipr = self.qdisc_sockets[node]
            batch = impair.delay_batch(ipr, ipr.link_lookup(ifname=intf)[0], round(ms * 1e6), loss)
            with netns.entered(self.fabric.node_path(node)):
                batch.send()

    def _undelay(self, _: DelayOff | NetemLossOff) -> None:
        for node, intf in self.egress:
            ipr = self.qdisc_sockets[node]
            batch = impair.undelay_batch(ipr, ipr.link_lookup(ifname=intf)[0])
            with netns.entered(self.fabric.node_path(node)):
                batch.send()

    def _mechanism(self, action: Action) -> tuple[str, list[tuple[str, str]], dict[str, Any]]:
        if isinstance(action, (Drop, DropOff)):
            return rec.XDP, self.ingress, {}
        if isinstance(action, Reshape):
            return rec.TBF, self.egress, {"rate_bps": self.fabric.topology.link_rate_bps}
        if isinstance(action, (Delay, DelayOff, NetemLoss, NetemLossOff)):
            return rec.NETEM, self.egress, {}
        return rec.LINK, self.ingress, {}

    def act(self, action: Action) -> int:
        """Carry out one action, recorded: a fault in force is in the record before it acts.
        Returns when (CLOCK_MONOTONIC ns) the action itself began, after its record was written."""
        applies = _applies(action)
        if self.record is not None and applies is not False and self.entry is None:
            mechanism, ends, undo = self._mechanism(action)
            r = self.record_as
            self.entry = self.record.add(rec.Entry.new(r.kind, r.target, mechanism, ends,
                                                       [lk.link_id for lk in self.links], r.params, r.by,
                                                       r.pid or os.getppid(), undo))
        try:
            began = time.monotonic_ns()
            self.run[type(action)](action)
            return began
        finally:
            if self.entry is not None and applies is not True:
                self.record.clear(self.entry.id)
                self.entry = None

    def close(self) -> None:
        for ipr, index in self.attached:
            try:
                xdp.attach(ipr, index, -1)
            except OSError:
                pass  # the interface is gone with its namespace
            ipr.close()
        for ipr in self.qdisc_sockets.values():
            ipr.close()
        if self.dropper is not None:
            self.dropper.close()
        if self.entry is not None and self.entry.mechanism == rec.XDP:
            self.record.clear(self.entry.id)  # the program is detached: nothing of it is in force
        self.switch.close()


def _serve(parent: Parent, fabric: Fabric, links: Sequence[Link], at: str, drops: bool, qdiscs: bool,
           direction: tuple[str, str] | None, record_as: RecordAs | None) -> None:
    agent = _Agent(fabric, links, at, drops, qdiscs, direction, record_as)
    try:
        parent.ready()
        while not isinstance(message := parent.recv(), Stop):
            action = message
            if isinstance(action, After):
                pause_until(time.monotonic() + action.ms / 1000)
                action = action.action
            try:
                began = agent.act(action)
            except Exception as exc:  # reported to the parent, which raises it
                parent.send(ActionFailed(action, f"{type(exc).__name__}: {exc}"))
                continue
            parent.send(Done(action, began, time.monotonic_ns()))
    finally:
        agent.close()


class LinkFaultAgent:
    """Faults on some links, all with one end at node `at`, from a process of their own.

    `drops`: attach the dropping program (for Drop/DropOff) to the links' receiving ends (both, or
    for `direction` (A, B) B's); `qdiscs`: open what Reshape and Delay need at their sending ends
    (both, or A's). `record_as`: write the faults to the fabric's fault record as this.
    """

    def __init__(self, fabric: Fabric, links: Sequence[Link], at: str, drops: bool = False, qdiscs: bool = False,
                 direction: tuple[str, str] | None = None, record_as: RecordAs | None = None) -> None:
        names = ", ".join(f"{link.a}-{link.b}" for link in links)
        self._child = Child(fabric, f"fault agent for {names}", _serve,
                            (fabric, list(links), at, drops, qdiscs, direction, record_as), ready_timeout=10)
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
