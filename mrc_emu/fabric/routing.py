"""Real routing for the baseline: FRR BGP (and BFD) in every switch namespace, RFC 7938 style.

Why it exists: MRC's claim is that endpoints route around a failed path in microseconds
while a BGP fabric takes far longer. To measure rather than assume the baseline's repair,
every leaf and spine runs FRR's zebra, bgpd and bfdd: eBGP on every leaf-spine link, one
ASN per plane's spine tier and one per leaf, `frr defaults datacenter` timers (keepalive
3 s, hold 9 s; connect retry 1 s), ECMP over all spines (multipath-relax), BFD on every session (300 ms x 3),
and each leaf announcing its hosts' /128s. Hosts do not run BGP: their ECMP route over their
planes' leaves is static (fabric/config.py), as servers in RFC 7938 fabrics.

Every daemon and directory is recorded in the fabric's journal before it exists; `down`
and `clean` remove them. SRv6 SIDs stay static: BGP carries only the host prefixes.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import time
from pathlib import Path

from pyroute2 import IPRoute

from ..topology import Role, Topology
from ..topology import addressing as ad
from . import registry
from .kernel import netns
from .kernel.waiting import WaitTimeout, until
from .nodes import FabricSetupError
from .running import Fabric

FRR_DIR = Path("/usr/lib/frr")
DAEMONS = ("zebra", "bfdd", "bgpd")
RTPROT_BGP = 186


def frr_missing() -> str | None:
    """Why FRR cannot run here, or None."""
    missing = [d for d in DAEMONS if not (FRR_DIR / d).exists()]
    if missing:
        return f"FRR is not installed ({', '.join(missing)} missing under {FRR_DIR}): apt-get install frr"
    try:
        pwd.getpwnam("frr")
    except KeyError:
        return "FRR's user 'frr' does not exist: reinstall the frr package"
    return None


def _asn(topo: Topology, node: str) -> int:
    n = topo.node(node)
    if n.role is Role.SPINE:
        return 65000 + n.plane  # one ASN per plane's spine tier (RFC 7938 section 5.2.1)
    return 65100 + n.node_id  # one per leaf


BFD_INTERVAL_MS = 300  # bfdd's default transmit and receive interval (x 3 to detect)
BFD_DETECT_MULTIPLIER = 3  # bfdd's default detect-multiplier (not configured here)
KEEPALIVE_S, HOLD_S = 3, 9  # frr defaults datacenter
CONNECT_RETRY_S = 1  # `timers connect`, below
BFD_PROFILE = "mrc-emu-dilated"


def bfd_config(node: str, dilation: float = 1.0) -> str:
    """bfdd's configuration for one switch: its defaults, or under time dilation K a profile
    whose intervals are K times longer in wall time, the same in the emulated time."""
    if dilation == 1.0:
        return f"hostname {node}\n"
    interval = round(BFD_INTERVAL_MS * dilation)
    return (f"hostname {node}\nbfd\n profile {BFD_PROFILE}\n  receive-interval {interval}\n"
            f"  transmit-interval {interval}\n !\n!\n")


def bgp_config(topo: Topology, node: str, bfd: bool = True, dilation: float = 1.0) -> str:
    """bgpd's configuration for one switch. Under time dilation K (the transport's clock K
    times slower than wall time) BGP's keepalive and hold timers and BFD's intervals are K
    times longer in wall time, so that in the emulated time they are FRR's own."""
    n = topo.node(node)
    lines = ["frr defaults datacenter", f"hostname {node}", "!", f"router bgp {_asn(topo, node)}",
             f" bgp router-id 10.{n.node_id >> 16 & 255}.{n.node_id >> 8 & 255}.{n.node_id & 255}",
             " no bgp ebgp-requires-policy", " bgp bestpath as-path multipath-relax"]
    peers = []
    for link in topo.links_of(node):
        peer, _, _ = topo.peer(link, node)
        if topo.node(peer).role is Role.HOST:
            continue
        address = ad.link_address(link, peer)
        peers.append(address)
        lines.append(f" neighbor {address} remote-as {_asn(topo, peer)}")
        # retry a lost session every second (FRR waits 10-120 s): a repaired link is used again
        # soon, so one run starts on a whole fabric after the last one's fault is reverted
        lines.append(f" neighbor {address} timers connect {CONNECT_RETRY_S}")
        if dilation != 1.0:
            lines.append(f" neighbor {address} timers {round(KEEPALIVE_S * dilation)} {round(HOLD_S * dilation)}")
        if bfd:
            lines.append(f" neighbor {address} bfd" + (f" profile {BFD_PROFILE}" if dilation != 1.0 else ""))
    lines.append(" address-family ipv6 unicast")
    if n.role is Role.LEAF:
        lines.append("  redistribute kernel route-map HOSTS")
    lines += [f"  neighbor {p} activate" for p in peers]
    lines += ["  maximum-paths 64", " exit-address-family", "!"]
    if n.role is Role.LEAF:
        lines += [f"ipv6 prefix-list HOSTS seq 5 permit {ad.HOST_PREFIX} le 128",
                  "route-map HOSTS permit 10", " match ipv6 address prefix-list HOSTS", "!"]
    return "\n".join(lines) + "\n"


def _switches(topo: Topology) -> list[str]:
    return [n.name for n in topo.nodes.values() if n.role is not Role.HOST]


def state_dir(name: str) -> Path:
    return registry.STATE_DIR / f"{name}-frr"


def start(fabric: Fabric, bfd: bool = True, timeout: float = 60.0, progress=None, dilation: float = 1.0) -> float:
    """Start FRR in every switch of the fabric; wait until every leaf has BGP routes to every
    other leaf's hosts. Returns the seconds convergence took. `dilation`: the runs' time
    dilation K, FRR's timers K times longer (bgp_config)."""
    reason = frr_missing()
    if reason:
        raise FabricSetupError(reason)
    topo = fabric.topology
    root = state_dir(fabric.name)
    frr = pwd.getpwnam("frr")
    fabric.journal.directory(root)
    root.mkdir(parents=True, exist_ok=True)
    os.chown(root, frr.pw_uid, frr.pw_gid)
    began = time.monotonic()
    for node in _switches(topo):
        folder = root / node
        folder.mkdir(exist_ok=True)
        # plain multipath routes, not kernel nexthop objects: after an interface flap FRR 8.4
        # left a shared nexthop group one path short in the kernel, while its own RIB was whole
        (folder / "zebra.conf").write_text(f"hostname {node}\nno zebra nexthop kernel enable\n")
        (folder / "bfdd.conf").write_text(bfd_config(node, dilation))
        (folder / "bgpd.conf").write_text(bgp_config(topo, node, bfd, dilation))
        for path in [folder, *folder.iterdir()]:
            os.chown(path, frr.pw_uid, frr.pw_gid)
        for daemon in DAEMONS if bfd else ("zebra", "bgpd"):
            _spawn(fabric, node, daemon, folder)
    if progress:
        progress(f"FRR started in {len(_switches(topo))} switches; waiting for BGP to converge")
    wait_converged(fabric, timeout)
    return time.monotonic() - began


def wait_bfd_heard(needed: bool, dilation: float = 1.0) -> None:
    """After a run whose faults silenced links, one BFD transmit interval (K times longer under time
    dilation K), so that every session has heard its peer again before the next run: BFD counts
    its detection time from the last packet it received, and a session that heard nothing between
    one run's fault and the next (4.8 s of wall time at K = 16 between an MRC run and the
    baseline's) went down 6.5 s of wall time after the second fault instead of 9.6-14.4 s."""
    if needed:
        time.sleep(BFD_INTERVAL_MS * dilation / 1000)


def _spawn(fabric: Fabric, node: str, daemon: str, folder: Path) -> None:
    args = [str(FRR_DIR / daemon), "-N", f"{fabric.name}-{node}", "--vty_socket", str(folder), "-i",
            str(folder / f"{daemon}.pid"), "-z", str(folder / "zserv.api"), "-f", str(folder / f"{daemon}.conf"),
            "-u", "frr", "-g", "frr", "--log", f"file:{folder / daemon}.log"]
    if daemon == "bfdd":
        args += ["--bfdctl", str(folder / "bfdd.sock")]
    fd = os.open(fabric.node_path(node), os.O_RDONLY)
    try:
        proc = subprocess.Popen(args, preexec_fn=lambda: netns.setns(fd), stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    finally:
        os.close(fd)
    fabric.journal.process(proc.pid, f"FRR {daemon} in {node}")
    if daemon == "zebra":  # the others connect to zebra's socket: wait for it
        socket_path = folder / "zserv.api"

        def listening() -> bool:
            if proc.poll() is not None:
                raise FabricSetupError(f"FRR zebra exited in {node}; see {folder / 'zebra.log'}")
            return socket_path.exists()

        try:
            until(listening, 10.0, f"FRR zebra's socket in {node} (see {folder / 'zebra.log'})")
        except WaitTimeout as exc:
            raise FabricSetupError(str(exc)) from None


def _bgp_host_routes(fabric: Fabric, node: str, paths: int) -> set[str]:
    """Host prefixes the node has a BGP route for, over `paths` next hops (full ECMP)."""
    with netns.entered(fabric.netns(node)), IPRoute() as ipr:
        out = set()
        for r in ipr.get_routes(family=10):
            if r["proto"] != RTPROT_BGP or not r.get("RTA_DST"):
                continue
            hops = r.get("RTA_MULTIPATH")
            if (len(hops) if hops else 1) >= paths:
                out.add(f"{r.get('RTA_DST')}/{r['dst_len']}")
        return out


def wait_converged(fabric: Fabric, timeout: float) -> None:
    """Every leaf has a BGP route to every host that is not its own, over every spine of its plane
    whose link is up (multipath grows session by session: a flow hashed earlier may move)."""
    topo = fabric.topology
    down = fabric.state().down_links
    leaves = [n.name for n in topo.nodes.values() if n.role is Role.LEAF]
    hosts_of = {leaf: {topo.peer(l, leaf)[0] for l in topo.links_of(leaf)} for leaf in leaves}  # noqa: E741
    missing: dict[str, int] = {}

    def converged() -> bool:
        missing.clear()
        for leaf in leaves:
            plane = topo.node(leaf).plane
            want = {ad.host_address(topo, h.name) + "/128" for h in topo.hosts
                    if h.name not in hosts_of[leaf] and topo.leaf_of(h.name, plane) != leaf}
            up_spines = sum(1 for link in topo.links_of(leaf) if link.link_id not in down
                            and topo.node(topo.peer(link, leaf)[0]).role is Role.SPINE)
            lacking = want - _bgp_host_routes(fabric, leaf, up_spines)
            if lacking:
                missing[leaf] = len(lacking)
        return not missing

    try:
        until(converged, timeout, lambda: f"BGP to converge (leaves missing host routes: {missing})", interval=0.1)
    except WaitTimeout as exc:
        raise FabricSetupError(str(exc)) from None


def running(fabric: Fabric) -> bool:
    """Whether the fabric's journal records live FRR daemons."""
    return any(e.get("what", "").startswith("FRR ") for e in fabric.state().processes.values())
