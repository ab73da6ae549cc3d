"""Routing repair in the virtual fabric: BGP sessions between leaves and spines, BFD, as timers.

Why it exists: the baseline (RoCEv2 on one ECMP path) survives a failed link only once routing
moves its flow elsewhere, so its stall is routing's repair time. The namespace fabric runs FRR
(fabric/routing.py: eBGP on every leaf-spine link, BFD on every session); the virtual fabric has
no daemons, so this is a model of what they do, from the same timers (the caller passes
fabric/routing.py's values; this package may not import the fabric):

    a link loses carrier      both ends' sessions go down at once (the kernel drops the nexthop,
                              BGP's fast external fallover resets the session)
    blackhole (either way)    BFD declares the session down `multiplier` x `interval` after the
                              last BFD packet that got through, which left at a seeded uniform
                              phase within one interval before the fault (so 2-3 intervals after
                              it); a one-way blackhole takes both ends down (the side that stops
                              hearing tells the other: BFD's Down state still crosses). Without
                              BFD the hold timer does the same with the keepalive interval.
    loss, degrade, delay      not detected (BFD misses three packets in a row rarely; the model
                              says never)

A session that goes down withdraws at both ends: the leaf stops using the spine for every host
behind other leaves, the spine loses its one route to the leaf's hosts; one UPDATE hop later
(`update_hop_ns`, the model's figure for an UPDATE's processing and installation) every other
leaf of the plane stops using that spine for those hosts. A repaired link brings its session
back a connect-retry later, and the routes come back the same way. Only leaf-spine sessions
exist: hosts run no BGP (their ECMP over their uplinks is static), as in the namespace fabric.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..topology import Role
from .engine import Engine
from .fabric import VirtualFabric
from .faults import FaultKind, LinkFault


@dataclass(frozen=True)
class RoutingTimers:
    """The routing daemons' timers the model follows (ns)."""

    bfd_interval_ns: int | None  # None: no BFD (the BGP hold timer detects a silent link)
    bfd_multiplier: int
    keepalive_ns: int
    hold_ns: int
    connect_retry_ns: int
    update_hop_ns: int

    def describe(self) -> str:
        detect = (f"BFD {self.bfd_interval_ns / 1e6:g} ms x {self.bfd_multiplier}" if self.bfd_interval_ns
                  else f"BGP hold {self.hold_ns / 1e9:g} s (keepalive {self.keepalive_ns / 1e9:g} s), no BFD")
        return (f"{detect} to detect a silent link, at once on loss of carrier; an UPDATE {self.update_hop_ns / 1e6:g} ms "
                f"per BGP hop; a session back {self.connect_retry_ns / 1e9:g} s (connect retry) after its link is")


class BgpRepair:
    """The leaf-spine sessions of `fabric` and the routes they carry, following the link faults
    it is told of (`on_fault`, a FaultTimeline listener); `rng` draws BFD's phase."""

    def __init__(self, engine: Engine, fabric: VirtualFabric, timers: RoutingTimers, rng: Any) -> None:
        self.engine, self.fabric, self.timers, self.rng = engine, fabric, timers, rng
        self.topo = fabric.topo
        self.down: set[tuple[str, str]] = set()
        self._epoch: dict[tuple[str, str], int] = {}
        self.events: list[dict[str, Any]] = []  # what the model did, when (ns of the engine)

    def _session(self, a: str, b: str) -> tuple[str, str] | None:
        roles = {self.topo.node(a).role: a, self.topo.node(b).role: b}
        if set(roles) != {Role.LEAF, Role.SPINE}:
            return None
        return roles[Role.LEAF], roles[Role.SPINE]

    def on_fault(self, fault: LinkFault, applied: bool) -> None:
        """A fault came into force (`applied`) or was undone on the link fault.a-fault.b."""
        session = self._session(fault.a, fault.b)
        if session is None or fault.kind not in (FaultKind.DOWN, FaultKind.BLACKHOLE):
            return
        epoch = self._epoch[session] = self._epoch.get(session, 0) + 1
        if not applied:
            self.engine.after(self.timers.connect_retry_ns, self._up, (session, epoch))
            return
        if fault.kind is FaultKind.DOWN:
            self._down((session, epoch, "loss of carrier"))
            return
        if self.timers.bfd_interval_ns:
            every, why = self.timers.bfd_interval_ns, "BFD detection"
            silent = self.timers.bfd_multiplier * every
        else:
            every, why = self.timers.keepalive_ns, "BGP hold timer"
            silent = self.timers.hold_ns
        phase = int(self.rng.random() * every)  # the last packet that got through left this long before
        self.engine.after(max(0, silent - phase), self._down, (session, epoch, why))

    def _down(self, item: tuple[tuple[str, str], int, str]) -> None:
        session, epoch, why = item
        if self._epoch.get(session) != epoch or session in self.down:
            return
        self.down.add(session)
        self.events.append({"time_ns": self.engine.now, "session": "-".join(session), "event": f"down ({why})"})
        self._routes(session, withdraw=True)

    def _up(self, item: tuple[tuple[str, str], int]) -> None:
        session, epoch = item
        if self._epoch.get(session) != epoch or session not in self.down:
            return
        self.down.discard(session)
        self.events.append({"time_ns": self.engine.now, "session": "-".join(session), "event": "up"})
        self._routes(session, withdraw=False)

    def _routes(self, session: tuple[str, str], withdraw: bool) -> None:
        """The routes the session carried, withdrawn or restored at its ends now and at the plane's
        other leaves one UPDATE hop later."""
        leaf, spine = session
        fabric, rack = self.fabric, self.topo.node(leaf).index
        fabric.set_route(leaf, spine, None, not withdraw)  # the leaf: every remote host via this spine
        fabric.set_route(spine, leaf, None, not withdraw)  # the spine: the leaf's hosts
        others = [peer for link in self.topo.links_of(spine) if (peer := self.topo.peer(link, spine)[0]) != leaf]
        self.engine.after(self.timers.update_hop_ns, self._remote, (others, spine, rack, withdraw))

    def _remote(self, item: tuple[list[str], str, int, bool]) -> None:
        others, spine, rack, withdraw = item
        for leaf in others:
            self.fabric.set_route(leaf, spine, rack, not withdraw)
