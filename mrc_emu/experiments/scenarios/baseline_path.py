"""The baseline's path: which leaf-spine link its one ECMP-hashed flow takes, measured.

Why it exists: a scenario may fail "the link under the baseline's flow" (`link: baseline-path`,
the demo's), and the fabric's ECMP hash, not the topology, decides which link that is; so it
is seen in the leaves' packet counters during a short transfer with the same 5-tuple. It
must never guess the link from the topology alone.
"""

from __future__ import annotations

from pyroute2 import IPRoute

from ...fabric.kernel import netns
from ...fabric.running import Fabric
from ...topology import Role
from ..runtime.transfer import run_transfers
from .transports import Transport


def _tx_counts(fabric: Fabric, node: str) -> dict[str, int]:
    with netns.entered(fabric.node_path(node)), IPRoute() as ipr:
        return {link.get("ifname"): link.get("stats64").get("tx_packets") if link.get("stats64") else 0
                for link in ipr.get_links()}


def observe_baseline_path(fabric: Fabric, src: str, dst: str, mtu: int,
                          seen: dict[str, tuple[str, str]] | None = None) -> tuple[str, str]:
    """The leaf-spine link the baseline's flow from src to dst crosses, measured: packet counters
    of every leaf uplink on src's side before and after a short transfer with the same 5-tuple.
    `seen`, if given, gets "data" (that link) and "acks" (the uplink on dst's side its ACKs took,
    hashed on their own 5-tuple: a cross-validation gives the model the same two)."""
    topo = fabric.topology
    sides = {"data": src, "acks": dst}
    leaves = {side: [topo.leaf_of(host, p) for p in range(topo.planes)] for side, host in sides.items()}
    before = {leaf: _tx_counts(fabric, leaf) for side in leaves.values() for leaf in side}
    run_transfers(fabric, [Transport.BASELINE.spec(src, dst, 2 * 2**20, mtu)])
    found = {}
    for side, side_leaves in leaves.items():
        best, best_delta = None, -1
        for leaf in side_leaves:
            after = _tx_counts(fabric, leaf)
            for link in topo.links_of(leaf):
                peer, intf, _ = topo.peer(link, leaf)
                if topo.node(peer).role is not Role.SPINE:
                    continue
                delta = after.get(intf, 0) - before[leaf].get(intf, 0)
                if delta > best_delta:
                    best, best_delta = (leaf, peer), delta
        if best is not None and best_delta >= (100 if side == "data" else 10):
            found[side] = best
    if "data" not in found:
        raise RuntimeError(f"could not see the baseline's path from {src} to {dst} in the leaves' counters")
    if seen is not None:
        seen.update(found)
    return found["data"]
