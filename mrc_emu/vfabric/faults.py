"""Faults on the virtual fabric's links, and when they come into force.

Why it exists: the point of the fabric is what MRC does when a link fails, so every fault kind
of the namespace fabric that acts on a link has its model here, acting where it acts there:

    down        the link loses carrier: routes through it are gone at both ends, what waits in
                its queues or is on the wire is lost (both ways only)
    blackhole   the link stays up and drops everything, where the far end receives it
    loss F      the far end drops each frame with probability F (the run's seeded generator)
    degrade F   the sending end's port runs at F x the link rate (its queue drains slower)
    delay D     the sending end adds D to the link's propagation delay (each way: 2 D per round trip)

`A B` names both directions of the link between A and B, `A->B` only what A sends to B (not for
`down`). A fault comes into force at a virtual time after the transfers start (`at 2ms`) or
when a fraction of their bytes is acknowledged (`at 0.3`, as a scenario's faults), and is
undone after `for D` if given. It may repeat (a scenario's flap: down for half a period,
`repeat` times), and whoever listens (routing.py's model) is told when each comes into force
and is undone. One line each (`parse`), as the CLI's --fault takes them:

    blackhole p0l0 p0s1 at 0.3          loss p0l0->p0s1 5% at 1ms for 2ms
    degrade p0l1 p0s0 0.25 at 0.3       delay p0l0 p0s1 50us at 0.5       down p0l0 p0s1 at 0.2
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from ..topology.units import parse_duration_ns
from .engine import Engine
from .fabric import VirtualFabric
from .ports import EgressPort


class FaultKind(str, Enum):
    DOWN = "down"
    BLACKHOLE = "blackhole"
    LOSS = "loss"
    DEGRADE = "degrade"
    DELAY = "delay"


_TAKES_VALUE = {FaultKind.LOSS: "a probability like 5% or 0.05", FaultKind.DEGRADE: "a rate fraction like 0.25 or 25%",
                FaultKind.DELAY: "a delay like 50us or 5ms"}


class FaultError(ValueError):
    """A fault line that does not parse, or names no link of the topology."""


@dataclass(frozen=True)
class LinkFault:
    kind: FaultKind
    a: str
    b: str
    one_way: bool = False  # only what `a` sends to `b`
    value: float = 0.0  # loss: probability; degrade: rate fraction; delay: ns
    at_ns: int | None = None  # virtual time after the transfers start ...
    at_progress: float | None = None  # ... or the fraction of their bytes acknowledged
    duration_ns: int | None = None  # undone this long after it came into force
    repeat: int = 1  # a flap: applied this many times in all, ...
    period_ns: int = 0  # ... one period apart (each undone after its duration)
    tag: Any = None  # the caller's: which of its faults this is, in `record`

    def target(self) -> str:
        return f"{self.a}->{self.b}" if self.one_way else f"{self.a}-{self.b}"

    def describe(self) -> str:
        value = {FaultKind.LOSS: f" {self.value:.4g}", FaultKind.DEGRADE: f" x{self.value:g}",
                 FaultKind.DELAY: f" +{self.value / 1e3:g} us"}.get(self.kind, "")
        when = f"at {self.at_progress:.0%}" if self.at_progress is not None else f"at {self.at_ns / 1e6:g} ms"
        until = f" for {self.duration_ns / 1e6:g} ms" if self.duration_ns else ""
        again = f", {self.repeat} times every {self.period_ns / 1e6:g} ms" if self.repeat > 1 else ""
        return f"{self.kind.value}{value} {self.target()} {when}{until}{again}"

    def directions(self, fabric: VirtualFabric) -> list[EgressPort]:
        out = [fabric.towards(self.a, self.b)]
        return out if self.one_way else out + [fabric.towards(self.b, self.a)]

    def apply(self, fabric: VirtualFabric, undo: bool = False) -> None:
        for port in self.directions(fabric):
            if self.kind is FaultKind.DOWN:
                port.set_up(undo)
            elif self.kind is FaultKind.BLACKHOLE:
                port.blackholed = not undo
            elif self.kind is FaultKind.LOSS:
                port.loss = 0.0 if undo else self.value
            elif self.kind is FaultKind.DEGRADE:
                port.set_rate(port.nominal_bps if undo else max(1, int(port.nominal_bps * self.value)))
            else:
                port.delay_ns = fabric.link_delay_ns + (0 if undo else int(self.value))


def _fraction(text: str, what: str, upper_open: bool) -> float:
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise FaultError(f"{text!r} is not {what}") from None
    if not (0 < value < 1 if upper_open else 0 < value <= 1):
        raise FaultError(f"{text!r} is not {what} (in (0, 1{')' if upper_open else ']'})")
    return value


def parse(line: str) -> LinkFault:
    """One fault: 'KIND A B|A->B [VALUE] at WHEN [for DURATION]' (module docstring)."""
    words = line.split()
    try:
        kind = FaultKind(words[0].lower()) if words else None
    except ValueError:
        kind = None
    if kind is None:
        raise FaultError(f"{line!r}: a fault starts with its kind: {', '.join(k.value for k in FaultKind)}")
    rest = words[1:]
    if rest and "->" in rest[0]:
        a, _, b = rest.pop(0).partition("->")
        one_way = True
    elif len(rest) >= 2 and "at" not in rest[:2]:
        a, b, one_way = rest.pop(0), rest.pop(0), False
    else:
        raise FaultError(f"{line!r}: name the link as 'A B' (both ways) or 'A->B' (one way)")
    if one_way and kind is FaultKind.DOWN:
        raise FaultError(f"{line!r}: a link goes down both ways (blackhole A->B drops one way)")
    value = 0.0
    if kind in _TAKES_VALUE:
        if not rest or rest[0] == "at":
            raise FaultError(f"{line!r}: {kind.value} takes {_TAKES_VALUE[kind]}")
        text = rest.pop(0)
        if kind is FaultKind.DELAY:
            value = float(_duration(text, line))
        else:
            value = _fraction(text, _TAKES_VALUE[kind], upper_open=False)
    if len(rest) < 2 or rest[0] != "at":
        raise FaultError(f"{line!r}: say when: 'at 0.3' (of the bytes acknowledged) or 'at 2ms' (virtual time)")
    when = rest[1]
    at_ns = at_progress = None
    if when[-1:].isalpha():
        at_ns = _duration(when, line)
    else:
        at_progress = _fraction(when, "a fraction of the bytes acknowledged like 0.3 or 30%", True)
    duration = None
    if rest[2:]:
        if rest[2] != "for" or len(rest) != 4:
            raise FaultError(f"{line!r}: after 'at WHEN' only 'for DURATION' may follow")
        duration = _duration(rest[3], line)
    return LinkFault(kind, a, b, one_way, value, at_ns, at_progress, duration)


def _duration(text: str, line: str) -> int:
    try:
        return parse_duration_ns(text)
    except ValueError as exc:
        raise FaultError(f"{line!r}: {exc}") from None


class FaultTimeline:
    """The faults of a run, brought into force (and undone) on `fabric` as their time comes;
    `record` says what happened when (ns since the transfers started); each of `listeners` is
    told `(fault, applied)` after a fault came into force or was undone (routing.py's model)."""

    def __init__(self, engine: Engine, fabric: VirtualFabric, faults: list[LinkFault]) -> None:
        for fault in faults:
            try:
                fault.directions(fabric)
            except ValueError as exc:
                raise FaultError(f"{fault.describe()}: {exc}") from None
        self.engine, self.fabric = engine, fabric
        self._waiting = sorted((f for f in faults if f.at_progress is not None), key=lambda f: f.at_progress)
        self._timed = [f for f in faults if f.at_ns is not None]
        self.origin_ns = 0
        self.record: list[dict[str, Any]] = []
        self.listeners: list[Callable[[LinkFault, bool], None]] = []

    @property
    def waiting(self) -> bool:
        """Faults still waiting for progress."""
        return bool(self._waiting)

    def start(self, origin_ns: int) -> None:
        """The transfers started at `origin_ns`: timed faults are scheduled from there."""
        self.origin_ns = origin_ns
        for fault in self._timed:
            self.engine.at(origin_ns + fault.at_ns, self._apply, fault)

    def progress(self, fraction: float) -> None:
        """The transfers have acknowledged this fraction of their bytes."""
        while self._waiting and fraction >= self._waiting[0].at_progress:
            self._apply(self._waiting.pop(0))

    def _apply(self, fault: LinkFault) -> None:
        fault.apply(self.fabric)
        entry = {"fault": fault.describe(), "kind": fault.kind.value, "link": [fault.a, fault.b],
                 "one_way": fault.one_way, "tag": fault.tag, "applied_ns": self.engine.now - self.origin_ns, "reverted_ns": None}
        self.record.append(entry)
        for listener in self.listeners:
            listener(fault, True)
        if fault.duration_ns:
            self.engine.after(fault.duration_ns, self._revert, (fault, entry))
        if fault.repeat > 1:
            self.engine.after(fault.period_ns, self._apply, replace(fault, repeat=fault.repeat - 1))

    def _revert(self, item: tuple[LinkFault, dict[str, Any]]) -> None:
        fault, entry = item
        fault.apply(self.fabric, undo=True)
        entry["reverted_ns"] = self.engine.now - self.origin_ns
        for listener in self.listeners:
            listener(fault, False)
