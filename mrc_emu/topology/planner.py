"""Capacity planner: what a multi-plane Clos of a given radix reaches, and what it costs.

Why it exists: MRC's case rests on arithmetic. Splitting an 800G NIC port into P ports of
800/P G lets one switch ASIC of bandwidth B offer radix B / (800/P G) instead of B / 800G,
and reach the same endpoint count in fewer tiers. Pure data, no I/O.

A folded Clos (fat tree) of radix R with T tiers, every switch but the top one using half its
ports down and half up, reaches

    endpoints(R, T) = 2 * (R/2)^T          (T=1: R, T=2: R^2/2, T=3: R^3/4)

per plane. Built for N <= endpoints(R, T) endpoints: ceil(N / (R/2)) switches at each of the
T-1 lower tiers and ceil(N / R) at the top (for the full Clos: (2T - 1) (R/2)^(T-1) in all).
Links per plane: N endpoint links plus N between each pair of adjacent tiers, T * N. With P
planes every endpoint has one port per plane: P times the switches and links, the same
endpoint count.
"""

from __future__ import annotations

from dataclasses import dataclass


def endpoints(radix: int, tiers: int) -> int:
    if radix < 2 or radix % 2:
        raise ValueError(f"radix must be an even number >= 2, not {radix}")
    if tiers < 1:
        raise ValueError(f"tiers must be >= 1, not {tiers}")
    return radix if tiers == 1 else 2 * (radix // 2) ** tiers


def tiers_needed(radix: int, target: int, max_tiers: int = 12) -> int | None:
    for tiers in range(1, max_tiers + 1):
        if endpoints(radix, tiers) >= target:
            return tiers
    return None


@dataclass(frozen=True)
class Plan:
    radix: int
    planes: int
    tiers: int
    endpoints: int
    switches_per_plane: int
    links_per_plane: int

    @property
    def switches(self) -> int:
        return self.switches_per_plane * self.planes

    @property
    def links(self) -> int:
        return self.links_per_plane * self.planes

    def to_dict(self) -> dict:
        return {"radix": self.radix, "planes": self.planes, "tiers": self.tiers, "endpoints": self.endpoints,
                "switches_per_plane": self.switches_per_plane, "switches": self.switches,
                "links_per_plane": self.links_per_plane, "links": self.links}


def plan(radix: int, planes: int, tiers: int, size: int | None = None) -> Plan:
    """The Clos of `tiers` tiers, for `size` endpoints (default: as many as it reaches)."""
    if planes < 1:
        raise ValueError(f"planes must be >= 1, not {planes}")
    most = endpoints(radix, tiers)
    n = most if size is None else size
    if not 1 <= n <= most:
        raise ValueError(f"{n:,} endpoints: a {tiers}-tier Clos of radix {radix} reaches 1..{most:,}")
    half = radix // 2
    switches = 1 if tiers == 1 else (tiers - 1) * -(-n // half) + -(-n // radix)
    return Plan(radix, planes, tiers, n, switches, tiers * n)


def single_plane_equivalent(radix: int, planes: int, target: int) -> Plan | None:
    """The same ASIC with its ports ganged `planes` at a time (one 800G port instead of 8 x 100G):
    radix / planes, one plane; the fewest tiers that reach `target` endpoints."""
    ganged = radix // planes
    ganged -= ganged % 2
    if ganged < 2:
        return None
    tiers = tiers_needed(ganged, target)
    return None if tiers is None else plan(ganged, 1, tiers, target)


def topology_fields(radix: int, planes: int, size: int | None = None) -> dict:
    """The two-tier fabric of plan(radix, planes, 2, size) as a topology file's fields (model.py),
    for the virtual fabric (`run`/`send --clock virtual -t FILE`): a leaf serves radix/2 hosts and
    has one link to each spine of its plane; ceil(N / (radix/2)) leaves (whole leaves: the hosts
    are rounded up) and ceil(N / radix) spines per plane, the planner's counts. Below the full
    size a leaf has fewer spines than hosts (the planner's switches, where a real fabric would
    give each leaf several links to a spine, which a topology here cannot have)."""
    chosen = plan(radix, planes, 2, size)
    half = radix // 2
    return {"name": f"r{radix}x{planes}-{chosen.endpoints}", "planes": planes,
            "spines_per_plane": -(-chosen.endpoints // radix), "leaves_per_plane": -(-chosen.endpoints // half),
            "hosts_per_leaf": half, "mtu": 9000}
