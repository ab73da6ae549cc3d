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
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...api.formats import EvFormatMode
from ...fabric import registry
from ...fabric.faults.fault_record import append_line
from ...fabric.running import Fabric
from ...topology import Role, Topology, TopologyError, evs_between
from ...topology.evs import Ev
from ...transport.multipath.evvalues import VALUE_PROBE_EV, value_probe_path
from .worker import Progress, ReplaceEv, SetEvStates

RECORD = "record"
DENY, ALLOW, PORT, EVENTS, POLLED = "deny", "allow", "port", "events", "polled"
REPLACE, REPLACED = "replace", "replaced"  # REPLACE_EV asked for; what a running QP made of it
PROBE, PROBED = "probe", "probed"  # an EV_PROBE asked of the run serving its source; its answer


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
    # (src, dst, EV) -> (value, port or None, the asking line's id): the latest REPLACE_EV of each EV
    values: dict[tuple[str, str, int], tuple[bytes, int | None, str]] = field(default_factory=dict)
    replaced: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # asking id -> what the QPs said
    probes: dict[str, dict[str, Any]] = field(default_factory=dict)  # id -> an EV_PROBE asked of a run
    probed: dict[str, dict[str, Any]] = field(default_factory=dict)  # id -> its answer (responses, or error)

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
        self._offset = 0  # bytes of the record parsed into _state
        self._state = State([], {}, {}, {})
        self._replaces: list[tuple[tuple[str, str, int], tuple[bytes | None, int | None, str]]] = []

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

    def replace(self, src: str, dst: str, ev: int, value: bytes | None, port: int | None, by: str = "cli") -> str:
        """REPLACE_EV of EV `ev` from `src` to `dst` (its QPs' EV profile slot `ev`): `value` on `port`
        (None: the EV's own; `value` None: back to its first value, what its QPs were set up with). Running
        QPs take it at once, later ones start with it. The line's id."""
        topo = self.fabric.topology
        Selector(ev=(src, dst, ev)).check(topo)
        if value is not None and (not value or len(value) > 32 or not any(value)):
            raise ValueError(f"an EV value is 1..32 bytes, not all zero (got {len(value)} bytes)")
        if port is not None and not 1 <= port <= topo.planes:
            raise ValueError(f"port {port}: {src} has ports 1..{topo.planes}")
        ident = f"{os.getpid()}-{time.monotonic_ns()}"
        self._append({"op": REPLACE, "src": src, "dst": dst, "ev": ev, "value": value and value.hex(), "port": port,
                      "id": ident, "by": by})
        return ident

    def replaced(self, ident: str) -> list[dict[str, Any]]:
        """What running QPs reported of the REPLACE_EV `ident`: [{"key", "error"}] (empty: none yet)."""
        return self.state().replaced.get(ident, [])

    def probe(self, src: str, dst: str, ev: int | None, value: bytes | None, mode: str, port: int | None,
              rsp_timeout_ns: int) -> str:
        """Ask the running transfer whose workers serve `src` for one EV_PROBE (of EV `ev`, or of `value` in
        format `mode`); its id, for `probed`."""
        ident = f"{os.getpid()}-{time.monotonic_ns()}"
        self._append({"op": PROBE, "id": ident, "src": src, "dst": dst, "ev": ev, "mode": mode, "port": port,
                      "value": None if value is None else value.hex(), "timeout_ns": rsp_timeout_ns})
        return ident

    def probed(self, ident: str) -> dict[str, Any] | None:
        """The answer to probe `ident`: {"responses": [...], "timed_out"} or {"error"}; None while none came."""
        return self.state().probed.get(ident)

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
        """The state the record's lines make, read incrementally: the record only grows, so only the lines
        written since the last call are parsed (a run's watch looks at it every step, and its EV events
        are written to it as they happen)."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            data = b""
        end = data.rfind(b"\n") + 1  # a line still being written (or cut by a kill) waits for its newline
        for raw in data[:end].decode(errors="replace").splitlines():
            self._apply(raw)
        self._offset += end
        state = self._state
        refused = {ident for ident, answers in state.replaced.items() if any(a["error"] for a in answers)}
        state.values = {}
        for key, value in self._replaces:  # a REPLACE_EV a running QP refused is withdrawn: the EV keeps its value
            if value[2] not in refused:
                state.values[key] = value
        return state

    def _apply(self, raw: str) -> None:
        """One line of the record into the state."""
        state = self._state
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
            elif op == REPLACE:
                port = line.get("port")
                value = None if line["value"] is None else bytes.fromhex(line["value"])  # None: back to the first
                self._replaces.append(((line["src"], line["dst"], int(line["ev"])),
                                       (value, None if port is None else int(port), line.get("id", ""))))
            elif op == PROBE:
                state.probes[line["id"]] = line
            elif op == PROBED:
                state.probed[line["id"]] = line
            elif op == REPLACED:
                state.replaced.setdefault(line["id"], []).append({"key": line.get("key"), "error": line.get("error")})
            elif op == POLLED:
                del state.events.setdefault(line["host"], [])[:int(line["count"])]
                state.dropped.pop(line["host"], None)
        except (ValueError, KeyError, TypeError):
            pass  # a line cut short by a kill, or one this version does not know

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
                    value = state.values.get((a, b, ev.index))
                    value = None if value is None or value[0] is None else value
                    out.append({"src": a, "dst": b, "ev": ev.index, "plane": ev.plane, "spine": ev.spine,
                                "port": ev.plane + 1, "port_enabled": state.port_enabled(a, ev.plane),
                                "state": "DENIED" if why else "ALLOWED", "why": why,
                                "value": None if value is None else value[0].hex(),  # REPLACE_EV's, if any
                                "value_port": None if value is None else value[1]})
        return out


class LiveControl:
    """What the record says, pushed to the QPs of a run: the changes since the last look, as
    (source host, what to set) pairs, read only when the record grew."""

    def __init__(self, record: ControlRecord | None, evs_by_key: dict[int, tuple[str, dict[int, Ev]]],
                 since: float | None = None) -> None:
        """`since`: when the run began (time.time()); EV_PROBEs asked before it are not its."""
        self.record = record
        self.evs_by_key = evs_by_key  # transfer key -> (source host, its QP's EVs by transport index)
        self.size = -1
        self.denied: dict[int, set[int]] = {key: set() for key in evs_by_key}
        self.ports: dict[tuple[str, int], bool] = {}
        self.values: dict[tuple[int, int], set[str]] = {}  # (key, EV) -> the REPLACE_EV ids pushed to it
        self.replaces: list[tuple[int, str, ReplaceEv]] = []  # found by `changes`, sent by `push`
        self.asked: dict[tuple[int, int], str] = {}  # (key, EV) -> REPLACE_EV id sent, its answer awaited
        self.probes_seen: set[str] = set()
        self.since = time.time() if since is None else since
        self.probes: list[dict[str, Any]] = []  # EV_PROBEs asked of this run, not yet sent
        self.batches: dict[str, Any] = {}  # probe id -> its endpoint_ops.EpBatch, until answered

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
        for key, (host, evs) in self.evs_by_key.items():
            for index, ev in evs.items():
                value = state.values.get((host, ev.dst, index))
                pushed = self.values.setdefault((key, index), set())
                if value is not None and value[2] not in pushed:
                    first = not pushed
                    pushed.add(value[2])
                    if value[0] is None and first:
                        continue  # put back before this run: its QP has its first value already
                    self.replaces.append((key, host, ReplaceEv(key, index, value[0], value[1], value[2])))
        for ident, line in state.probes.items():
            # a probe asked before this run began was another run's (left unanswered when it ended)
            if ident not in self.probes_seen and ident not in state.probed and line.get("time", 0) >= self.since:
                self.probes_seen.add(ident)
                self.probes.append(line)
        masks = {}
        hosts = {host for host, _ in self.evs_by_key.values()}
        for (host, plane), enabled in state.ports.items():
            if host in hosts and self.ports.get((host, plane), True) != enabled:
                self.ports[(host, plane)] = enabled
                masks[host] = 0
        planes = self.record.fabric.topology.planes
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
        for key, host, message in self.replaces:
            worker_of[host].send(message)
            self.asked[(key, message.ev)] = message.ident
        self.replaces = []
        for line in self.probes:
            if line["src"] in worker_of:  # a probe from a host of another run is that run's
                self._ask_probe(line, endpoint, topo)
        self.probes = []
        endpoint.step(worker_of, address_of, topo)
        for ident, batch in list(self.batches.items()):
            if batch.done.is_set():
                del self.batches[ident]
                self.record._append({"op": PROBED, "id": ident, "responses": batch.responses,
                                     "timed_out": batch.timed_out})

    def _ask_probe(self, line: dict[str, Any], endpoint: Any, topo: Topology) -> None:
        """One EV_PROBE the record asks for, through the run's endpoint operations."""
        try:
            if line.get("value") is None:
                request = (1, line["dst"], int(line["ev"]))
            else:
                path = value_probe_path(topo, line["src"], line["dst"], EvFormatMode[line["mode"]],
                                        bytes.fromhex(line["value"]), line.get("port"))
                request = (1, line["dst"], VALUE_PROBE_EV, path)
        except (ValueError, KeyError, TypeError) as exc:
            self.record._append({"op": PROBED, "id": line["id"], "error": f"the probe: {exc}"})
            return
        self.batches[line["id"]] = endpoint.ev_probe(line["src"], [request], int(line["timeout_ns"]))

    def report(self, progress: Progress, host_of: dict[str, str]) -> None:
        """A worker's progress report: its hosts' EV events go on the record as they happen (`ev events
        --follow`), and what each QP made of a REPLACE_EV (done, or why not) is written for the asker."""
        if self.record is None:
            return
        post_host_events(self.record, progress.ev_queues, host_of)
        for key, ev, error in progress.replaced:
            ident = self.asked.pop((key, ev), None)
            if ident:
                self.record._append({"op": REPLACED, "id": ident, "key": key, "ev": ev, "error": error or None})


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
        post_host_events(record, getattr(final, "ev_queues", {}), host_of)


def post_host_events(record: ControlRecord, queues: dict[str, tuple[list[dict[str, Any]], int]],
                     host_of: dict[str, str]) -> None:
    """Queue hosts' EV events (host -> (events, drops before them)) on the record, each named by its peer host."""
    for host, (events, dropped) in queues.items():
        if events:
            named = [{**e, "dst": host_of.get(e["peer"], e["peer"])} for e in events]
            if dropped:
                named[0]["drop_count"] = dropped
            record.post_events(host, named)
