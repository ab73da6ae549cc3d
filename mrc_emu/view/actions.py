"""What the page may do to a running fabric: a link down, up, blackholed, degraded or cleared; a spine drained or undrained.

Why it exists: clicking a link or a spine must do exactly what the CLI does (`link down`,
`fault blackhole`, `fault degrade`, `fault clear`, `ev deny|allow --spine`), through the same
fault record and controller record, so `mrc-emu fault list` and `ev list` show it, `fault
clear` undoes it and a running transfer follows it. A request is checked first, and one that
names no such link or spine, or would stack a fault on a link that already has one, is refused
with a sentence the page shows, changing nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..experiments.runtime.controller import DENY, ControlRecord, Selector
from ..fabric import links
from ..fabric.faults import fault_ops
from ..fabric.faults.fault_record import FaultRecord
from ..fabric.nodes import FabricSetupError
from ..fabric.running import Fabric
from ..topology import Role, TopologyError

LINK_ACTIONS = ("down", "up", "blackhole", "degrade", "clear")
SPINE_ACTIONS = ("drain", "undrain")
BY = "view"  # who the fault and controller records name


class ActionError(ValueError):
    """A request the page made that cannot be carried out; its text is shown as it is."""


@dataclass(frozen=True)
class Action:
    """One request: `link` A B with a LINK_ACTIONS verb (degrade: `rate`), or `spine` N with a SPINE_ACTIONS verb."""

    action: str
    a: str | None = None
    b: str | None = None
    spine: str | None = None
    rate: float | None = None

    @classmethod
    def from_request(cls, data: Any) -> Action:
        if not isinstance(data, dict):
            raise ActionError('an action is a JSON object: {"action": "down", "link": ["p0l0", "p0s1"]} or '
                              '{"action": "drain", "spine": "p0s1"}')
        action = data.get("action")
        if "link" in data:
            link = data["link"]
            if not (isinstance(link, list) and len(link) == 2 and all(isinstance(x, str) for x in link)):
                raise ActionError(f"link must name its two nodes, as [\"p0l0\", \"p0s1\"], not {link!r}")
            if action not in LINK_ACTIONS:
                raise ActionError(f"a link offers {', '.join(LINK_ACTIONS)}, not {action!r}")
            rate = data.get("rate", 0.25 if action == "degrade" else None)
            if action == "degrade" and not (isinstance(rate, (int, float)) and 0 < rate < 1):
                raise ActionError(f"a degrade keeps a fraction of the link's rate in (0, 1), not {rate!r}")
            return cls(action, a=link[0], b=link[1], rate=rate)
        if "spine" in data:
            if action not in SPINE_ACTIONS:
                raise ActionError(f"a spine offers {' and '.join(SPINE_ACTIONS)}, not {action!r}")
            return cls(action, spine=str(data["spine"]))
        raise ActionError('name a "link": [A, B] or a "spine": N')


def apply(fabric: Fabric, action: Action) -> str:
    """Carry out one action on the fabric; what it did, in one sentence (ActionError: nothing done)."""
    try:
        if action.spine is not None:
            return _spine(fabric, action)
        return _link(fabric, action)
    except (FabricSetupError, TopologyError) as exc:
        raise ActionError(str(exc)) from None


def _link(fabric: Fabric, action: Action) -> str:
    a, b = action.a, action.b
    found = links.between(fabric, a, b)  # no such link: FabricSetupError naming it
    name = f"{a}-{b}"
    held = FaultRecord(fabric).on_links([lk.link_id for lk in found])
    down = {lk.link_id for lk in found} & fabric.state().down_links
    if action.action == "clear":
        if not held:
            raise ActionError(f"{name} has no fault in force: nothing to clear")
        cleared = fault_ops.clear(fabric, a, b)
        return f"{name}: cleared {', '.join(e.describe() for e in cleared)}"
    if action.action == "up":
        if not down and not any(e.kind == "link-down" for e in held):
            raise ActionError(f"{name} is not down" + (f" (it has {_listed(held)}: clear it instead)" if held else ""))
        fault_ops.link_up(fabric, a, b)
        return f"{name} up (its configuration re-applied)"
    if held:
        raise ActionError(f"{name} already has {_listed(held)} in force: clear it first (or `mrc-emu fault clear {a} {b}`)")
    if down:
        raise ActionError(f"{name} is already down")
    if action.action == "down":
        fault_ops.link_down(fabric, a, b, by=BY)
        return f"{name} down"
    if action.action == "blackhole":
        entry = fault_ops.drop(fabric, a, b, 100.0, by=BY)
        return f"{name} blackholed (fault {entry.id})"
    entry = fault_ops.degrade(fabric, a, b, action.rate, by=BY)
    return f"{name} degraded to {action.rate:.0%} (fault {entry.id})"


def _listed(entries) -> str:
    return ", ".join(f"a {e.kind} (fault {e.id}, by {e.by})" for e in entries)


def _spine(fabric: Fabric, action: Action) -> str:
    topo = fabric.topology
    if action.spine not in topo.nodes or topo.node(action.spine).role is not Role.SPINE:
        raise ActionError(f"{action.spine!r} is not a spine of {topo.name}")
    record = ControlRecord(fabric)
    latest = None
    for op, selector, _by in record.state().rules:
        if selector.node == action.spine:
            latest = op
    drained = latest == DENY
    selector = Selector(node=action.spine)
    if action.action == "drain":
        if drained:
            raise ActionError(f"{action.spine} is already drained")
        record.deny(selector, by=BY)
        return f"{action.spine} drained: its EVs are DENIED for every host pair (running transfers follow at once)"
    if not drained:
        raise ActionError(f"{action.spine} is not drained")
    record.allow(selector, by=BY)
    return f"{action.spine} undrained: its EVs may carry data again (probed first)"
