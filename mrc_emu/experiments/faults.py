"""Fault kinds: what each fault of a scenario's schedule names, and how it is carried out and reverted.

Why it exists: the kinds of fault (link-down, flap, loss, blackhole, switch-reboot,
plane-down, congestion) are written once, here, each as a small subclass of `Fault` that
says what it targets (a link, a switch, a host's plane), which links a fault agent acts on,
the agent action that applies it and the one that reverts it. The scenario parser, the
runner, the report and the CLI's help take the list from `FAULT_KINDS`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, ClassVar

from ..topology import Topology, evs_between
from ..topology.model import Link
from .fault_agent import Action, Drop, DropOff, Flap, LinkDown, LinkUp


class Target(Enum):
    """What a fault names in a scenario file."""

    LINK = "link"  # link: [node, node], or baseline-path (the link under the baseline's flow)
    SWITCH = "switch"  # node: a leaf or spine
    HOST_PLANE = "host-plane"  # host and plane: that host's link into that plane


@dataclass
class Fault:
    """One fault of a schedule, at a fraction `at` of all workload bytes acknowledged."""

    kind: ClassVar[str]
    target: ClassVar[Target] = Target.LINK
    drops: ClassVar[bool] = False  # its agent needs the dropping program on the links
    needs_percent: ClassVar[bool] = False

    at: float
    link: tuple[str, str] | str | None = None  # a pair, or "baseline-path"
    node: str | None = None
    host: str | None = None
    plane: int | None = None
    percent: float = 100.0
    duration_ms: float | None = None  # reverted this long after it was applied (None: at the run's end)
    period_ms: float = 100.0
    count: int = 3
    flows: int = 1
    size: int = 32 * 2**20

    def agent_links(self, topo: Topology, link: tuple[str, str] | None) -> tuple[list[Link], str] | None:
        """The links its fault agent acts on and the node at whose end they go down (None: no agent)."""
        a, b = link
        return topo.links_between(a, b), a

    def apply(self) -> Action | None:
        raise NotImplementedError

    def revert(self) -> Action | None:
        """The action that undoes it (None: it undoes itself, like a flap)."""
        return None

    def competing(self, topo: Topology, link: tuple[str, str] | None) -> list[tuple[str, str, list[int]]]:
        """Extra WRITEs it starts (src, dst, EVs); only congestion has any."""
        return []

    def events_without_agent(self) -> list[dict[str, Any]]:
        """Timeline entries of a fault carried out by the transfers themselves, not by an agent."""
        return []

    def detail(self) -> str:
        return ""

    def describe(self) -> str:
        target = self.node or (f"{self.host} plane {self.plane}" if self.host else None)
        if target is None:
            target = "-".join(self.link) if isinstance(self.link, tuple) else str(self.link)
        until = f" for {self.duration_ms:g} ms" if self.duration_ms else ""
        return f"{self.kind}{self.detail()} {target} at {self.at:.0%}{until}"


class LinkDownFault(Fault):
    "A link loses carrier (taken down at its first node's end); reverted with its configuration."

    kind = "link-down"

    def apply(self) -> Action:
        return LinkDown()

    def revert(self) -> Action:
        return LinkUp()


class FlapFault(Fault):
    "A link goes down and up `count` times, half a period each."

    kind = "flap"

    def apply(self) -> Action:
        return Flap(self.period_ms, self.count)

    def detail(self) -> str:
        return f" every {self.period_ms:g} ms x{self.count}"


class LossFault(Fault):
    "A link stays up and drops `percent` % of the packets at both ends."

    kind = "loss"
    drops = True
    needs_percent = True

    def apply(self) -> Action:
        return Drop(self.percent / 100)

    def revert(self) -> Action:
        return DropOff()

    def detail(self) -> str:
        return f" {self.percent:g}%"


class BlackholeFault(Fault):
    "A link stays up and drops everything (a gray failure: only keepalives or endpoints notice)."

    kind = "blackhole"
    drops = True

    def apply(self) -> Action:
        return Drop(1.0)

    def revert(self) -> Action:
        return DropOff()


class SwitchRebootFault(Fault):
    "Every link of a switch goes down at the switch's end; back up, reconfigured, when reverted."

    kind = "switch-reboot"
    target = Target.SWITCH

    def agent_links(self, topo: Topology, link: tuple[str, str] | None) -> tuple[list[Link], str]:
        return topo.links_of(self.node), self.node

    def apply(self) -> Action:
        return LinkDown("reboot-down")

    def revert(self) -> Action:
        return LinkUp("reboot-up")


class PlaneDownFault(Fault):
    "A host loses its link into one plane (the NIC port or its cable)."

    kind = "plane-down"
    target = Target.HOST_PLANE

    def agent_links(self, topo: Topology, link: tuple[str, str] | None) -> tuple[list[Link], str]:
        return topo.links_between(self.host, topo.leaf_of(self.host, self.plane)), self.host

    def apply(self) -> Action:
        return LinkDown()

    def revert(self) -> Action:
        return LinkUp()


class CongestionFault(Fault):
    "`flows` extra MRC WRITEs between host pairs whose EVs cross the link, pinned to those EVs."

    kind = "congestion"

    def agent_links(self, topo: Topology, link: tuple[str, str] | None) -> None:
        return None

    def apply(self) -> None:
        return None

    def competing(self, topo: Topology, link: tuple[str, str] | None) -> list[tuple[str, str, list[int]]]:
        out = []
        hosts = [h.name for h in topo.hosts]
        for a in hosts:
            for b in hosts:
                if a == b or len(out) >= self.flows:
                    continue
                crossing = [ev.index for ev in evs_between(topo, a, b) if ev.crosses(*link)]
                if crossing:
                    out.append((a, b, crossing))
        if not out:
            raise RuntimeError(f"no host pair has an EV over {'-'.join(link)} for competing flows")
        return out

    def events_without_agent(self) -> list[dict[str, Any]]:
        return [{"action": "competing flows start", "at_progress": self.at}]

    def detail(self) -> str:
        return f" {self.flows} flow(s)"


FAULT_KINDS: dict[str, type[Fault]] = {cls.kind: cls for cls in (
    LinkDownFault, FlapFault, LossFault, BlackholeFault, SwitchRebootFault, PlaneDownFault, CongestionFault)}

