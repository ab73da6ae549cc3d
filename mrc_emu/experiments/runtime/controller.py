"""The controller record of a running fabric: which EVs are denied, which host ports disabled, and the EV events.

Why it exists: the OCP controller (mrc_ctl.h) denies EVs and disables ports on a host while QPs
run, and a user drives it from a shell (`mrc-emu ev deny --spine p0s1`, `port disable h0
--plane 1`) or a scenario does (`drain`, `undrain`, `port-disable`). Those commands end long
before the transfers they affect, and a transfer started later must obey them too. So every
controller operation is written here, append-only JSON lines in
/run/mrc-emu/<fabric>-ctl/record (one write per line, as the fault record does), and
whoever runs QPs reads it: at the start of a run, and again whenever the file grows (one
`stat` per watch step), pushing the changes to the QPs live (experiments/runtime/transfer.py).

A selector names EVs the way an operator thinks of them: a node (a spine or leaf: every EV
through it), a link (every EV over it), a plane, or one EV of a host pair. `deny` makes every
matching EV DENIED; `allow` lifts every deny that covers a matching EV: an EV is DENIED when
the latest deny/allow that matches it is a deny. The record never acts on the fabric.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...fabric import registry
from ...fabric.faults.fault_record import append_line
from ...fabric.running import Fabric
from ...topology import Role, Topology, TopologyError, evs_between
from ...topology.evs import Ev
from .worker import SetEvStates

RECORD = "record"
DENY, ALLOW, PORT, EVENTS, POLLED = "deny", "allow", "port", "events", "polled"


def directory(name: str) -> Path:
    return registry.STATE_DIR / f"{name}-ctl"


@dataclass(frozen=True)
class Selector:
    """EVs by node, link, plane, or one EV (src, dst, index); exactly one of them is set."""

    node: str | None = None
    link: tuple[str, str] | None = None
    plane: int | None = None
    ev: tuple[str, str, int] | None = None

    def matches(self, ev: Ev) -> bool:
        if self.node is not None:
            return self.node in ev.hops
        if self.link is not None:
            return ev.crosses(*self.link)
        if self.plane is not None:
            return ev.plane == self.plane
        return (ev.src, ev.dst, ev.index) == self.ev

    def to_dict(self) -> dict[str, Any]:
        for key in ("node", "link", "plane", "ev"):
            value = getattr(self, key)
            if value is not None:
                return {key: list(value) if isinstance(value, tuple) else value}
        raise ValueError("an empty selector")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Selector:
        (key, value), = data.items()
        return cls(**{key: tuple(value) if isinstance(value, list) else value})

    def describe(self) -> str:
        if self.node is not None:
            return self.node
        if self.link is not None:
            return "-".join(self.link)
        if self.plane is not None:
            return f"plane {self.plane}"
        src, dst, index = self.ev
        return f"EV {index} {src}->{dst}"

    def check(self, topo: Topology) -> Selector:
        """This selector, if it names things the topology has; else ValueError saying what is wrong."""
        try:
            if self.node is not None:
                role = topo.node(self.node).role
                if role is Role.HOST:
                    raise ValueError(f"{self.node} is a host: deny a host's plane with `port disable`, or name a "
                                     f"switch (spine or leaf)")
            elif self.link is not None:
                if not topo.links_between(*self.link):
                    raise ValueError(f"no link between {self.link[0]} and {self.link[1]}")
            elif self.plane is not None:
                if not 0 <= self.plane < topo.planes:
                    raise ValueError(f"plane {self.plane}: {topo.name} has planes 0..{topo.planes - 1}")
            else:
                src, dst, index = self.ev
                count = len(evs_between(topo, src, dst))
                if not 0 <= index < count:
                    raise ValueError(f"no EV {index} from {src} to {dst} (EVs 0..{count - 1})")
        except TopologyError as exc:
            raise ValueError(str(exc)) from None
        return self


@dataclass
class State:
    """The controller's state, replayed from the record."""

    rules: list[tuple[str, Selector, str]]  # (deny|allow, selector, by), in record order
    ports: dict[tuple[str, int], bool]  # (host, plane) -> enabled; absent: enabled
    events: dict[str, list[dict[str, Any]]]  # host -> EV events not yet polled, oldest first
    dropped: dict[str, int]  # host -> events dropped since the last poll

    def denied_by(self, ev: Ev) -> str | None:
        """What denies this EV now (the selector, described, and by whom), or None: it may carry data."""
        why = None
        for op, selector, by in self.rules:
            if selector.matches(ev):
                why = f"{selector.describe()} (by {by})" if op == DENY else None
        return why

    def port_enabled(self, host: str, plane: int) -> bool:
        return self.ports.get((host, plane), True)


class ControlRecord:
    """The controller record of one running fabric (opened from its `Fabric`, whose journal it joins)."""

    MAX_EVENTS = 1024  # EV events kept per host until polled; beyond, they are counted as dropped

    def __init__(self, fabric: Fabric) -> None:
        self.fabric = fabric
        self.directory = directory(fabric.name)
        self.path = self.directory / RECORD

    @property
    def topology(self) -> Topology:
        return self.fabric.topology

    def _append(self, line: dict[str, Any]) -> None:
        line.setdefault("time", time.time())
        append_line(self.fabric, self.directory, self.path, line)

    def size(self) -> int:
        """The record's length: it only grows, so a change of size is a change of state (one stat)."""
        try:
            return self.path.stat().st_size
        except FileNotFoundError:
            return 0

    def deny(self, selector: Selector, by: str = "cli") -> None:
        self._append({"op": DENY, "sel": selector.check(self.fabric.topology).to_dict(), "by": by})

    def allow(self, selector: Selector, by: str = "cli") -> None:
        self._append({"op": ALLOW, "sel": selector.check(self.fabric.topology).to_dict(), "by": by})

    def set_port(self, host: str, plane: int, enabled: bool, by: str = "cli") -> None:
        topo = self.fabric.topology
        try:
            if topo.node(host).role is not Role.HOST:
                raise ValueError(f"{host} is a {topo.node(host).role.value}, not a host: only hosts have MRC ports")
        except TopologyError as exc:
            raise ValueError(str(exc)) from None
        if not 0 <= plane < topo.planes:
            raise ValueError(f"plane {plane}: {topo.name} has planes 0..{topo.planes - 1} (ports 1..{topo.planes})")
        self._append({"op": PORT, "host": host, "plane": plane, "enabled": enabled, "by": by})

    def post_events(self, host: str, events: list[dict[str, Any]]) -> None:
        """EV events a run's QPs of `host` posted (already filtered by their profile's event mask)."""
        if events:
            self._append({"op": EVENTS, "host": host, "events": events})

    def poll(self, host: str, max_events: int) -> tuple[list[dict[str, Any]], int]:
        """Up to `max_events` of `host`'s queued events, oldest first, and how many were dropped
        before them; those returned are gone from the queue (mrc_ctl's poll)."""
        state = self.state()
        events = state.events.get(host, [])[:max_events]
        if events:
            self._append({"op": POLLED, "host": host, "count": len(events)})
        return events, state.dropped.get(host, 0) if events else 0

    def state(self) -> State:
        state = State([], {}, {}, {})
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return state
        for raw in text.splitlines():
            try:
                line = json.loads(raw)
                op = line["op"]
                if op in (DENY, ALLOW):
                    state.rules.append((op, Selector.from_dict(line["sel"]), line.get("by", "?")))
                elif op == PORT:
                    state.ports[(line["host"], int(line["plane"]))] = bool(line["enabled"])
                elif op == EVENTS:
                    queue = state.events.setdefault(line["host"], [])
                    queue += line["events"]
                    over = len(queue) - self.MAX_EVENTS
                    if over > 0:
                        del queue[:over]
                        state.dropped[line["host"]] = state.dropped.get(line["host"], 0) + over
                elif op == POLLED:
                    del state.events.setdefault(line["host"], [])[:int(line["count"])]
                    state.dropped.pop(line["host"], None)
            except (ValueError, KeyError, TypeError):
                continue  # a line cut short by a kill, or one this version does not know
        return state

    def listing(self, src: str | None = None, dst: str | None = None,
                selector: Selector | None = None) -> list[dict[str, Any]]:
        """Every EV between the hosts asked for (default: every ordered pair; with `selector`, only
        the EVs it matches), with its admin state."""
        topo = self.fabric.topology
        hosts = [h.name for h in topo.hosts]
        for name in (src, dst):
            if name is not None and name not in hosts:
                raise ValueError(f"{name!r} is not a host of {topo.name} (hosts: {', '.join(hosts)})")
        state = self.state()
        out = []
        for a in [src] if src else hosts:
            for b in [dst] if dst else hosts:
                if a == b:
                    continue
                for ev in evs_between(topo, a, b):
                    if selector is not None and not selector.matches(ev):
                        continue
                    why = state.denied_by(ev)
                    out.append({"src": a, "dst": b, "ev": ev.index, "plane": ev.plane, "spine": ev.spine,
                                "port": ev.plane + 1, "port_enabled": state.port_enabled(a, ev.plane),
                                "state": "DENIED" if why else "ALLOWED", "why": why})
        return out


class MemoryRecord:
    """A controller record held in memory, for a run without a fabric (virtual time): the same
    operations, checks and state as ControlRecord's, nothing written, no EV event queues."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self._state = State([], {}, {}, {})
        self._ops = 0

    def size(self) -> int:
        return self._ops

    def deny(self, selector: Selector, by: str = "cli") -> None:
        self._state.rules.append((DENY, selector.check(self.topology), by))
        self._ops += 1

    def allow(self, selector: Selector, by: str = "cli") -> None:
        self._state.rules.append((ALLOW, selector.check(self.topology), by))
        self._ops += 1

    def set_port(self, host: str, plane: int, enabled: bool, by: str = "cli") -> None:
        if self.topology.node(host).role is not Role.HOST or not 0 <= plane < self.topology.planes:
            raise ValueError(f"{host} plane {plane}: not a host's port of {self.topology.name}")
        self._state.ports[(host, plane)] = enabled
        self._ops += 1

    def state(self) -> State:
        return State(list(self._state.rules), dict(self._state.ports), {}, {})


class LiveControl:
    """What the record says, pushed to the QPs of a run: the changes since the last look, as
    (source host, what to set) pairs, read only when the record grew."""

    def __init__(self, record: ControlRecord | None, evs_by_key: dict[int, tuple[str, dict[int, Ev]]]) -> None:
        self.record = record
        self.evs_by_key = evs_by_key  # transfer key -> (source host, its QP's EVs by transport index)
        self.size = -1
        self.denied: dict[int, set[int]] = {key: set() for key in evs_by_key}
        self.ports: dict[tuple[str, int], bool] = {}

    def changes(self) -> tuple[list[tuple[int, str, tuple[int, ...], tuple[int, ...], str]], dict[str, int]]:
        """([(key, host, EVs to deny, EVs to allow, why)], {host: its port-status mask}) since the
        last call; a mask's bit p is 1-based port p (plane p - 1), set while the port is enabled.
        A disabled port is not a deny: the host's endpoint stops using its EVs and tells its peers."""
        if self.record is None:
            return [], {}
        size = self.record.size()
        if size == self.size:
            return [], {}
        self.size = size
        state = self.record.state()
        ev_changes = []
        for key, (host, evs) in self.evs_by_key.items():
            reasons = {index: state.denied_by(ev) for index, ev in evs.items()}
            now = {index for index, why in reasons.items() if why}
            deny, allow = tuple(sorted(now - self.denied[key])), tuple(sorted(self.denied[key] - now))
            if deny or allow:
                why = "; ".join(sorted({reasons[i] for i in deny})) or "allowed"
                ev_changes.append((key, host, deny, allow, why))
            self.denied[key] = now
        masks = {}
        hosts = {host for host, _ in self.evs_by_key.values()}
        for (host, plane), enabled in state.ports.items():
            if host in hosts and self.ports.get((host, plane), True) != enabled:
                self.ports[(host, plane)] = enabled
                masks[host] = 0
        planes = self.record.topology.planes
        for host in masks:
            masks[host] = sum(1 << (p + 1) for p in range(planes) if self.ports.get((host, p), True))
        return ev_changes, masks

    def push(self, worker_of: dict[str, Any], endpoint: Any, address_of: dict[str, str], topo: Topology) -> None:
        """Send the record's changes since the last look to the workers of the QPs they concern (EV
        states) and to the hosts' endpoints (port status, through the run's `endpoint_ops.EndpointOps`),
        then the endpoint operations other threads asked for."""
        ev_changes, port_masks = self.changes()
        for key, host, deny, allow, why in ev_changes:
            worker_of[host].send(SetEvStates(key, deny, allow, why))
        for host, mask in port_masks.items():
            endpoint.set_port_status(host, mask)
        endpoint.step(worker_of, address_of, topo)


def qp_evs(paths: Any) -> dict[int, Ev]:
    """A QP's EVs by transport index, as fabric EVs (what selectors match): the topology's EV list,
    or a profile's slots (evpaths.ProfileQpPaths: slot i is EV i, whatever fabric EV it names)."""
    slots = getattr(paths, "topology_evs", None)
    if slots is not None:
        return dict(enumerate(slots))
    return {ev.index: ev for ev in paths.evs}


def post_run_events(record: ControlRecord, finals: list, host_of: dict[str, str]) -> None:
    """Queue the EV events a run's hosts' controllers hold (each worker's `Final.ev_queues`: what the
    QPs' devices posted, by their profiles' ev_event_mask, so GOOD and ASSUMED_BAD only, never
    DENIED) on the fabric's record, for `mrc-emu ev events`. `host_of`: address -> host name."""
    for final in finals:
        for host, (events, dropped) in getattr(final, "ev_queues", {}).items():
            if events:
                named = [{**e, "dst": host_of.get(e["peer"], e["peer"])} for e in events]
                if dropped:
                    named[0]["drop_count"] = dropped
                record.post_events(host, named)
