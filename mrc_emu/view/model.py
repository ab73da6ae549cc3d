"""What the live view and the replay share: the topology as the page draws it, link keys, goodput.

Why it exists: the page draws the same picture for a running fabric and for a finished run's
results.json; both sources describe links by one key ("p0l0-p0s1", the topology's order of
the two ends) and compute a transfer's goodput the same way. Pure data: no fabric, no I/O.
"""

from __future__ import annotations

from typing import Any

from ..topology import Role, Topology
from ..topology.model import Link

SCHEMA_TOPOLOGY = "mrc-emu/view-topology/1"
SCHEMA_STATE = "mrc-emu/view-state/1"
EV_LOG_MAX = 200  # EV events a state carries (the newest)


def link_key(link: Link) -> str:
    return f"{link.a}-{link.b}"


def topology_view(topo: Topology) -> dict[str, Any]:
    """The static picture: nodes by role and plane, links by plane with their interfaces, ports."""
    nodes = [{"name": n.name, "role": n.role.value, "plane": n.plane} for n in topo.nodes.values()]
    links = [{"key": link_key(lk), "id": lk.link_id, "a": lk.a, "b": lk.b, "a_intf": lk.a_intf, "b_intf": lk.b_intf,
              "plane": lk.plane} for lk in topo.links]
    ports = [{"node": p.node, "ifname": p.ifname, "peer": p.peer, "buffer": p.buffer, "kmin": p.kmin, "kmax": p.kmax,
              "ecn": p.ecn, "trim": p.trim, "trim_threshold": p.trim_threshold} for p in topo.egress_ports()]
    return {"schema": SCHEMA_TOPOLOGY, "topology": topo.summary(), "planes": topo.planes, "nodes": nodes,
            "links": links, "ports": ports, "link_rate_bps": topo.link_rate_bps or None}


def spines(topo: Topology) -> list[str]:
    return [n.name for n in topo.nodes.values() if n.role is Role.SPINE]


class RateMeter:
    """Goodput from successive (seconds, bytes) samples: the rate over the last `window_s`."""

    def __init__(self, window_s: float = 0.5) -> None:
        self.window_s = window_s
        self.samples: dict[Any, list[tuple[float, int]]] = {}

    def rate_bps(self, key: Any, at_s: float, value: int) -> float | None:
        samples = self.samples.setdefault(key, [])
        if not samples or at_s > samples[-1][0]:
            samples.append((at_s, value))
        while len(samples) > 2 and samples[-1][0] - samples[1][0] >= self.window_s:
            samples.pop(0)
        if len(samples) < 2 or samples[-1][0] <= samples[0][0]:
            return None
        return max(0.0, (samples[-1][1] - samples[0][1]) * 8 / (samples[-1][0] - samples[0][0]))


def ev_shares(evs: list[dict[str, Any]], before: dict[int, int] | None = None) -> None:
    """Each EV's share of the packets sent so far ('share', from 'sent'), and with the counts of a
    moment `before`, of those sent since ('share_recent': where the spray goes now; None if none
    was sent since), in place."""
    total = sum(e.get("sent", 0) for e in evs) or 1
    recent = {e["ev"]: e.get("sent", 0) - before.get(e["ev"], 0) for e in evs} if before is not None else {}
    recent_total = sum(recent.values())
    for e in evs:
        e["share"] = round(e.get("sent", 0) / total, 4)
        e["share_recent"] = round(recent[e["ev"]] / recent_total, 4) if recent_total > 0 else None


class SentHistory:
    """Per transfer, its EVs' packets sent at successive moments: the counts `window_s` ago."""

    def __init__(self, window_s: float = 0.5) -> None:
        self.window_s = window_s
        self.samples: dict[Any, list[tuple[float, dict[int, int]]]] = {}

    def before(self, key: Any, at_s: float, sent: dict[int, int]) -> dict[int, int] | None:
        samples = self.samples.setdefault(key, [])
        if not samples or at_s > samples[-1][0]:
            samples.append((at_s, sent))
        while len(samples) > 2 and samples[-1][0] - samples[1][0] >= self.window_s:
            samples.pop(0)
        return samples[0][1] if len(samples) > 1 else None
