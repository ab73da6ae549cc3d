"""Fault kinds: what each fault of a scenario's schedule names, and how it is carried out and reverted.

Why it exists: the kinds of fault (link-down, flap, loss, blackhole, degrade, delay,
switch-reboot, plane-down, congestion) are written once, here, each as a small subclass of
`Fault` that says what it targets (a link, a switch, a host's plane), which links a fault
agent acts on, the agent action that applies it and the one that reverts it, and what it
needs that a kernel may lack (`unavailable`). The scenario parser, the runner, the report and
the CLI's help take the list from `FAULT_KINDS`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, ClassVar

from ...fabric.datapath import impair
from ...topology import Topology, evs_between
from ...topology.model import Link
from ..runtime.fault_agent import Action, Delay, DelayOff, Drop, DropOff, Flap, LinkDown, LinkUp, NetemLoss, NetemLossOff, Reshape

LOSS_MECHANISMS = ("xdp", "netem")  # a loss fault's `mechanism:` (xdp the default: any kernel has it)


class Target(Enum):
    """What a fault names in a scenario file."""

    LINK = "link"  # link: [node, node], or baseline-path (the link under the baseline's flow)
    SWITCH = "switch"  # node: a leaf or spine
    HOST_PLANE = "host-plane"  # host and plane: that host's link into that plane
    SWITCH_OR_LINK = "switch-or-link"  # node: a leaf or spine, or link: [node, node]


@dataclass
class Fault:
    """One fault of a schedule, at a fraction `at` of all workload bytes acknowledged."""

    kind: ClassVar[str]
    target: ClassVar[Target] = Target.LINK
    drops: ClassVar[bool] = False  # its agent needs the dropping program on the links
    qdiscs: ClassVar[bool] = False  # its agent changes the links' egress qdiscs (TBF, netem)
    directed: ClassVar[bool] = False  # it may act in one direction only (`direction: A->B`)
    needs_percent: ClassVar[bool] = False
    controller: ClassVar[bool] = False  # a step of MRC's controller (experiments/runtime/controller.py), not of the fabric

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
    direction: tuple[str, str] | None = None  # (A, B): only what A sends to B
    rate: float = 1.0  # degrade: the fraction of the link's rate left
    ms: float = 0.0  # delay: milliseconds added each way
    mechanism: str = "xdp"  # loss: the agent's XDP program on ingress, or netem's loss on egress (LOSS_MECHANISMS)

    @classmethod
    def unavailable(cls) -> str | None:
        """Why this kernel cannot carry it out (one line), or None."""
        return None

    def agent_links(self, topo: Topology, link: tuple[str, str] | None) -> tuple[list[Link], str] | None:
        """The links its fault agent acts on and the node at whose end they go down (None: no agent)."""
        a, b = link
        return topo.links_between(a, b), a

    def apply(self, dilation: float = 1.0) -> Action | None:
        """The agent's action that applies it (`dilation`: the run's time dilation K, whose links
        run at rate / K)."""
        raise NotImplementedError

    def revert(self, dilation: float = 1.0) -> Action | None:
        """The action that undoes it (None: it undoes itself, like a flap)."""
        return None

    def params(self) -> dict[str, Any]:
        """Its parameters, as the fault record lists them."""
        return {}

    def target_name(self, link: tuple[str, str] | None) -> str:
        if self.node:
            return self.node
        if self.host:
            return f"{self.host} plane {self.plane}"
        if self.direction:
            return f"{self.direction[0]}->{self.direction[1]}"
        return "-".join(link) if link else str(self.link)

    def competing(self, topo: Topology, link: tuple[str, str] | None) -> list[tuple[str, str, list[int]]]:
        """Extra WRITEs it starts (src, dst, EVs); only congestion has any."""
        return []

    def events_without_agent(self) -> list[dict[str, Any]]:
        """Timeline entries of a fault carried out by the transfers themselves, not by an agent."""
        return []

    def detail(self) -> str:
        return ""

    def describe(self) -> str:
        target = self.target_name(self.link if isinstance(self.link, tuple) else None)
        until = f" for {self.duration_ms:g} ms" if self.duration_ms else ""
        return f"{self.kind}{self.detail()} {target} at {self.at:.0%}{until}"


class LinkDownFault(Fault):
    "A link loses carrier (taken down at its first node's end); reverted with its configuration."

    kind = "link-down"

    def apply(self, dilation: float = 1.0) -> Action:
        return LinkDown()

    def revert(self, dilation: float = 1.0) -> Action:
        return LinkUp()


class FlapFault(Fault):
    "A link goes down and up `count` times, half a period each."

    kind = "flap"

    def apply(self, dilation: float = 1.0) -> Action:
        return Flap(self.period_ms * dilation, self.count)  # emulated ms: K times as long in wall time

    def detail(self) -> str:
        return f" every {self.period_ms:g} ms x{self.count}"

    def params(self) -> dict[str, Any]:
        return {"period_ms": self.period_ms, "count": self.count}


class LossFault(Fault):
    """A link stays up and drops `percent` % of the packets at both ends (or of those from A to B):
    by the agent's XDP program on the receiving ends' ingress (`mechanism: xdp`, the default), or
    by netem's own random loss on the sending ends' egress (`mechanism: netem`, where the kernel
    has sch_netem; skipped, saying why, elsewhere)."""

    kind = "loss"
    directed = True
    needs_percent = True

    @property
    def drops(self) -> bool:  # type: ignore[override]
        return self.mechanism == "xdp"

    @property
    def qdiscs(self) -> bool:  # type: ignore[override]
        return self.mechanism == "netem"

    def unavailable(self) -> str | None:  # type: ignore[override]
        return impair.netem_missing() if self.mechanism == "netem" else None

    def apply(self, dilation: float = 1.0) -> Action:
        return NetemLoss(self.percent / 100) if self.mechanism == "netem" else Drop(self.percent / 100)

    def revert(self, dilation: float = 1.0) -> Action:
        return NetemLossOff() if self.mechanism == "netem" else DropOff()

    def detail(self) -> str:
        return f" {self.percent:g}%" + (" by netem" if self.mechanism == "netem" else "")

    def params(self) -> dict[str, Any]:
        return {"percent": self.percent}


class BlackholeFault(Fault):
    "A link stays up and drops everything (a gray failure: only keepalives or endpoints notice)."

    kind = "blackhole"
    drops = True
    directed = True

    def apply(self, dilation: float = 1.0) -> Action:
        return Drop(1.0)

    def revert(self, dilation: float = 1.0) -> Action:
        return DropOff()


class DegradeFault(Fault):
    """A link stays up at a fraction `rate` of its rate (a gray failure: a port that trained at a
    lower speed, lanes lost; htsim's `-failed`): both ends' TBF, or the sending end of a direction."""

    kind = "degrade"
    qdiscs = True
    directed = True

    def apply(self, dilation: float = 1.0) -> Action:
        return Reshape(self.rate, dilation)

    def revert(self, dilation: float = 1.0) -> Action:
        return Reshape(1.0, dilation)

    def detail(self) -> str:
        return f" to {self.rate:.0%}"

    def params(self) -> dict[str, Any]:
        return {"rate": self.rate}


class DelayFault(Fault):
    "`ms` milliseconds more on every packet over a link, each way (or only from A to B): netem."

    kind = "delay"
    qdiscs = True
    directed = True

    @classmethod
    def unavailable(cls) -> str | None:
        return impair.netem_missing()

    def apply(self, dilation: float = 1.0) -> Action:
        return Delay(self.ms, dilation)  # emulated ms: under dilation K netem holds them K times as long

    def revert(self, dilation: float = 1.0) -> Action:
        return DelayOff()

    def detail(self) -> str:
        return f" +{self.ms:g} ms"

    def params(self) -> dict[str, Any]:
        return {"ms": self.ms}


class SwitchRebootFault(Fault):
    "Every link of a switch goes down at the switch's end; back up, reconfigured, when reverted."

    kind = "switch-reboot"
    target = Target.SWITCH

    def agent_links(self, topo: Topology, link: tuple[str, str] | None) -> tuple[list[Link], str]:
        return topo.links_of(self.node), self.node

    def apply(self, dilation: float = 1.0) -> Action:
        return LinkDown("reboot-down")

    def revert(self, dilation: float = 1.0) -> Action:
        return LinkUp("reboot-up")


class PlaneDownFault(Fault):
    "A host loses its link into one plane (the NIC port or its cable)."

    kind = "plane-down"
    target = Target.HOST_PLANE

    def agent_links(self, topo: Topology, link: tuple[str, str] | None) -> tuple[list[Link], str]:
        return topo.links_between(self.host, topo.leaf_of(self.host, self.plane)), self.host

    def apply(self, dilation: float = 1.0) -> Action:
        return LinkDown()

    def revert(self, dilation: float = 1.0) -> Action:
        return LinkUp()


class CongestionFault(Fault):
    "`flows` extra MRC WRITEs between host pairs whose EVs cross the link, pinned to those EVs."

    kind = "congestion"

    def agent_links(self, topo: Topology, link: tuple[str, str] | None) -> None:
        return None

    def apply(self, dilation: float = 1.0) -> None:
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


class ControllerStep(Fault):
    """A step of MRC's controller: it changes EV or port states in the controller record, which
    the running QPs follow; the fabric is not touched (no agent). The baseline has no controller."""

    controller = True

    def agent_links(self, topo: Topology, link: tuple[str, str] | None) -> None:
        return None

    def apply(self, dilation: float = 1.0) -> None:
        return None

    def selector(self):
        from ..runtime.controller import Selector

        return Selector(node=self.node) if self.node else Selector(link=self.link)

    def act(self, record, by: str) -> None:
        raise NotImplementedError


class DrainStep(ControllerStep):
    "Maintenance: every EV through a switch or link is DENIED (it carries nothing until undrained)."

    kind = "drain"
    target = Target.SWITCH_OR_LINK

    def act(self, record, by: str) -> None:
        record.deny(self.selector(), by)


class UndrainStep(ControllerStep):
    "The end of a drain: the EVs through the switch or link are allowed again (probed before use)."

    kind = "undrain"
    target = Target.SWITCH_OR_LINK

    def act(self, record, by: str) -> None:
        record.allow(self.selector(), by)


class PortDisableStep(ControllerStep):
    "A host's MRC port into one plane is admin-disabled: its EVs stop at once (the link stays up)."

    kind = "port-disable"
    target = Target.HOST_PLANE

    def act(self, record, by: str) -> None:
        record.set_port(self.host, self.plane, False, by)


class PortEnableStep(ControllerStep):
    "A disabled port is enabled again."

    kind = "port-enable"
    target = Target.HOST_PLANE

    def act(self, record, by: str) -> None:
        record.set_port(self.host, self.plane, True, by)


FAULT_KINDS: dict[str, type[Fault]] = {cls.kind: cls for cls in (
    LinkDownFault, FlapFault, LossFault, BlackholeFault, DegradeFault, DelayFault, SwitchRebootFault, PlaneDownFault,
    CongestionFault, DrainStep, UndrainStep, PortDisableStep, PortEnableStep)}


def parse_direction(text: object, link: tuple[str, str]) -> tuple[str, str]:
    """'A->B' along the link (A, B) or (B, A) -> (A, B); ValueError saying what is wrong otherwise."""
    if not isinstance(text, str) or text.count("->") != 1:
        raise ValueError(f"{text!r}: give 'A->B' with A and B the link's two nodes ({link[0]}->{link[1]} or "
                         f"{link[1]}->{link[0]})")
    a, b = (part.strip() for part in text.split("->"))
    if {a, b} != set(link) or a == b:
        raise ValueError(f"{text!r} is not along the link {link[0]}-{link[1]} (give {link[0]}->{link[1]} or "
                         f"{link[1]}->{link[0]})")
    return a, b

