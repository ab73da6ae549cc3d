"""Packet-level faults inside a node: random loss and blackholes, with nftables.

Why it exists: a link that is down is one failure; a link that stays up and drops some or
all packets is another, and the one SRv6 source routing is meant to survive. This kernel
has no netem, so loss is an nft rule in the node's namespace (`numgen random`), applied
on ingress of the chosen interfaces before routing (so it hits SRv6 End/End.X traffic).
Each node gets one table of ours, `mrc_emu_faults`; clearing removes exactly that table.
"""

from __future__ import annotations

import shutil
import subprocess

from ...topology import Role, Topology
from ..kernel import netns
from ..nodes import FabricSetupError
from ..running import Fabric

TABLE = "mrc_emu_faults"


def _nft(fabric: Fabric, node: str, script: str) -> None:
    nft = shutil.which("nft")
    if nft is None:
        raise FabricSetupError("nft not found: apt-get install nftables (or run scripts/install.sh)")
    with netns.entered(fabric.node_path(node)):  # the child process inherits this thread's namespace
        done = subprocess.run([nft, "-f", "-"], input=script, text=True, capture_output=True)
    if done.returncode != 0:
        raise FabricSetupError(f"nft in {node} failed: {done.stderr.strip()}")


def loss(fabric: Fabric, node: str, percent: float, intfs: list[str] | None = None) -> list[str]:
    """Drop `percent` % of the packets arriving at `node` on `intfs` (default: all its links).

    100 % is a blackhole: the links stay up, every packet vanishes. Each interface gets its
    own chain, so faults on several links of one node add up and are removed one by one.
    """
    if not 0 < percent <= 100:
        raise ValueError(f"loss must be in (0, 100] percent, not {percent}")
    topo = fabric.topology
    own = [topo.peer(link, node)[1] for link in topo.links_of(node)]
    intfs = intfs or own
    unknown = sorted(set(intfs) - set(own))
    if unknown:
        raise FabricSetupError(f"{node} has no interface {unknown[0]} (it has: {', '.join(own)})")
    threshold = round(percent * 100)  # in 1/10000
    chance = "" if threshold >= 10000 else f"numgen random mod 10000 < {threshold} "
    script = [f"add table inet {TABLE}"]
    for intf in intfs:
        chain = _chain(intf)
        script += [f"add chain inet {TABLE} {chain} {{ type filter hook prerouting priority -300; policy accept; }}",
                   f"flush chain inet {TABLE} {chain}",
                   f'add rule inet {TABLE} {chain} iifname "{intf}" {chance}counter drop']
    _nft(fabric, node, "\n".join(script) + "\n")
    return intfs


def _chain(intf: str) -> str:
    return "loss_" + intf.replace("-", "_")


def clear(fabric: Fabric, node: str, intfs: list[str] | None = None) -> None:
    """Remove our loss rules from the node: those of `intfs`, or all (nothing else is touched)."""
    if intfs is None:
        _nft(fabric, node, f"table inet {TABLE}\ndelete table inet {TABLE}\n")
        return
    script = [f"add table inet {TABLE}"]
    for intf in intfs:
        chain = _chain(intf)
        script += [f"add chain inet {TABLE} {chain}", f"delete chain inet {TABLE} {chain}"]
    _nft(fabric, node, "\n".join(script) + "\n")


def plane_nodes(topo: Topology, plane: int) -> list[str]:
    """The spines of one plane: every inter-leaf path of that plane crosses exactly one."""
    spines = [n.name for n in topo.nodes.values() if n.role is Role.SPINE and n.plane == plane]
    if not spines:
        raise FabricSetupError(f"no plane {plane} (planes: 0..{topo.planes - 1})")
    return spines
