"""Faults on a running fabric, applied and undone through its fault record.

Why it exists: `mrc-emu link down|up|flap` and `mrc-emu fault degrade|delay|blackhole|loss|clear`
act on a fabric that stays up between commands, so what each one did must be written down
(fault_record.py) and undoable by a later command, whoever made it: a CLI command, or a
scenario's fault agent that was killed. Each function here records first, then acts; `undo`
knows every mechanism's inverse and is safe to repeat (undoing what is already undone is
nothing).

Which end a fault acts on: a link A-B has two ends. A fault on what arrives (drops: nft or XDP
on ingress) acts at the receiving end, so `direction` A->B drops at B's end only; a fault on
what leaves (a degraded TBF, netem's delay or loss: egress qdiscs) acts at the sending end, A's.
Without a direction both ends act, so both directions are hit.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from pyroute2 import IPRoute

from ...topology.model import Link
from .. import build, links
from ..datapath import impair, xdp
from ..kernel import netns
from ..nodes import FabricSetupError
from ..running import Fabric
from . import nft
from .fault_record import LINK, NETEM, NFT, TBF, XDP, Entry, FaultRecord

Direction = tuple[str, str] | None


def ends(link_list: Sequence[Link], direction: Direction, receiving: bool) -> list[tuple[str, str]]:
    """The (node, interface) ends of the links a fault acts on: both, or for A->B the end that
    receives from A (B's, `receiving`) or the one that sends to B (A's)."""
    out = []
    for link in link_list:
        for node, intf in ((link.a, link.a_intf), (link.b, link.b_intf)):
            if direction is None or node == direction[1 if receiving else 0]:
                out.append((node, intf))
    return out


def target_name(a: str, b: str, direction: Direction) -> str:
    return f"{direction[0]}->{direction[1]}" if direction else f"{a}-{b}"


def _between(fabric: Fabric, a: str, b: str, direction: Direction) -> list[Link]:
    found = links.between(fabric, a, b)
    if direction is not None and set(direction) != {a, b}:
        raise FabricSetupError(f"direction {direction[0]}->{direction[1]} is not along the link {a}-{b}")
    return found


def _check_free(record: FaultRecord, mechanism: str, at: list[tuple[str, str]], what: str) -> None:
    """Refuse a second fault of one mechanism on the same end: which of the two would be in force?"""
    for entry in record.active():
        if entry.mechanism == mechanism and set(entry.ends) & set(at):
            since = time.strftime("%H:%M:%S", time.localtime(entry.since))
            raise FabricSetupError(f"{what} already has a {entry.kind} in force ({entry.describe()}, since {since}, "
                                   f"by {entry.by}, pid {entry.pid}): `mrc-emu fault clear` it first")


def _check_not_red(fabric: Fabric, at: list[tuple[str, str]], what: str) -> None:
    """netem goes where a port's data class keeps its queue, which under `port: {model: red}` is
    RED (fabric/datapath/red.py): refused there, rather than a RED gone for good once the netem comes off."""
    topo = fabric.topology
    if topo.ports.model != "red":
        return
    served = {(p.node, p.ifname) for p in topo.egress_ports()}
    if hit := sorted(set(at) & served):
        raise FabricSetupError(f"{what}: netem would take the place of the RED qdisc on {hit[0][0]} {hit[0][1]} (port "
                               f"model red); use the XDP or nft loss, or a fabric with port model bpf")


def _apply(fabric: Fabric, entry: Entry, act) -> Entry:
    record = FaultRecord(fabric)
    record.add(entry)
    try:
        act()
    except BaseException:
        undo(fabric, entry)  # whatever part of it was applied
        record.clear(entry.id)
        raise
    return entry


def degrade(fabric: Fabric, a: str, b: str, fraction: float, direction: Direction = None, by: str = "cli") -> Entry:
    """The link's TBF (both ends, or the sending end of `direction`) at `fraction` of the topology's
    link rate; the port program's virtual queues follow. An unshaped fabric has no rate to take a
    fraction of: refused, saying so."""
    if not 0 < fraction < 1:
        raise ValueError(f"a degrade keeps a fraction of the link's rate in (0, 1), not {fraction:g}")
    rate = fabric.topology.link_rate_bps
    if not rate:
        raise FabricSetupError(
            f"a degrade needs a link rate: topology {fabric.topology.name} has no link_rate, so its links run as fast "
            f"as the CPU forwards and there is no rate to take a fraction of (bring the fabric up with a topology that "
            f"sets link_rate, e.g. the built-in 'incast')")
    found = _between(fabric, a, b, direction)
    at = ends(found, direction, receiving=False)
    record = FaultRecord(fabric)
    _check_free(record, TBF, at, target_name(a, b, direction))
    entry = Entry.new("degrade", target_name(a, b, direction), TBF, at, [lk.link_id for lk in found],
                      {"rate": fraction, "rate_bps": rate * fraction}, by, undo={"rate_bps": rate})
    return _apply(fabric, entry, lambda: [build.shape_port(fabric, node, intf, rate * fraction) for node, intf in at])


def delay(fabric: Fabric, a: str, b: str, ms: float, direction: Direction = None, by: str = "cli") -> Entry:
    """`ms` more milliseconds on every packet leaving the link's ends (so a round trip over it
    takes 2 x ms more without a direction). Needs netem: refused before anything is touched
    where the kernel has none."""
    if not 0 < ms <= 10_000:
        raise ValueError(f"a delay is in (0, 10000] ms, not {ms:g}")
    impair.require_netem()
    found = _between(fabric, a, b, direction)
    at = ends(found, direction, receiving=False)
    _check_not_red(fabric, at, f"a delay on {target_name(a, b, direction)}")
    record = FaultRecord(fabric)
    _check_free(record, NETEM, at, target_name(a, b, direction))
    entry = Entry.new("delay", target_name(a, b, direction), NETEM, at, [lk.link_id for lk in found], {"ms": ms}, by)
    return _apply(fabric, entry, lambda: impair.set_delay(fabric, at, ms))


DROP_MECHANISMS = (NFT, NETEM)  # how `drop` drops: nft rules on ingress (the default), or netem's loss on egress


def drop(fabric: Fabric, a: str, b: str, percent: float = 100.0, direction: Direction = None,
         by: str = "cli", mechanism: str = NFT) -> Entry:
    """Drop `percent` % of what crosses the link (100: a blackhole), in both directions or only in
    `direction`; the link stays up. `mechanism` nft: nft rules on the receiving ends' ingress;
    netem: netem's random loss on the sending ends' egress (refused before anything is touched,
    naming the module, where the kernel has no netem; one netem per port, so not beside a delay)."""
    if not 0 < percent <= 100:
        raise ValueError(f"loss must be in (0, 100] percent, not {percent:g}")
    if mechanism not in DROP_MECHANISMS:
        raise ValueError(f"a loss is applied by {' or '.join(DROP_MECHANISMS)}, not {mechanism!r}")
    if mechanism == NETEM:
        impair.require_netem()
    found = _between(fabric, a, b, direction)
    at = ends(found, direction, receiving=mechanism == NFT)
    if mechanism == NETEM:
        _check_not_red(fabric, at, f"a netem loss on {target_name(a, b, direction)}")
    record = FaultRecord(fabric)
    _check_free(record, mechanism, at, target_name(a, b, direction))
    kind = "blackhole" if percent >= 100 else "loss"
    entry = Entry.new(kind, target_name(a, b, direction), mechanism, at, [lk.link_id for lk in found],
                      {} if kind == "blackhole" else {"percent": percent}, by)

    def act() -> None:
        if mechanism == NETEM:
            impair.set_delay(fabric, at, 0.0, percent / 100)
            return
        for node, intf in at:
            nft.loss(fabric, node, percent, [intf])

    return _apply(fabric, entry, act)


def degraded_ports(fabric: Fabric) -> list[tuple[str, str, float]]:
    """(node, interface, fraction) of every port a degrade in force holds below the link rate: a
    run that reshapes the whole fabric (time dilation) puts these back at their fraction."""
    return [(node, intf, entry.params["rate"]) for entry in FaultRecord(fabric).active() if entry.mechanism == TBF
            for node, intf in entry.ends]

def link_down(fabric: Fabric, a: str, b: str, plane: int | None = None, by: str = "cli") -> list[int]:
    """Take the link(s) down at both ends (recorded once: a link already recorded down stays as is)."""
    found = links.between(fabric, a, b, plane)
    recorded = {i for e in FaultRecord(fabric).on_links([lk.link_id for lk in found]) if e.mechanism == LINK
                for i in e.links}
    fresh = [lk for lk in found if lk.link_id not in recorded]
    if fresh:
        entry = Entry.new("link-down", f"{a}-{b}", LINK, ends(fresh, None, True), [lk.link_id for lk in fresh], {}, by)
        _apply(fabric, entry, lambda: links.set_state(fabric, a, b, False, plane))
    else:
        links.set_state(fabric, a, b, False, plane)
    return [lk.link_id for lk in found]


def link_up(fabric: Fabric, a: str, b: str, plane: int | None = None) -> list[int]:
    """Bring the link(s) up and clear the link-down records they end (one of a rebooted switch's
    many links coming up leaves that record in force)."""
    ids = links.set_state(fabric, a, b, True, plane)
    record = FaultRecord(fabric)
    for entry in record.on_links(ids):
        if entry.mechanism == LINK and set(entry.links) <= set(ids):
            record.clear(entry.id)
    return ids


def flap(fabric: Fabric, a: str, b: str, period_ms: float, count: int, plane: int | None = None,
         on_change=None, by: str = "cli") -> list[int]:
    """links.flap on the link(s), recorded while it runs (a flap ends with the links up)."""
    found = links.between(fabric, a, b, plane)
    entry = Entry.new("flap", f"{a}-{b}", LINK, ends(found, None, True), [lk.link_id for lk in found],
                      {"period_ms": period_ms, "count": count}, by)
    record = FaultRecord(fabric)
    with links.LinkSwitch(fabric, found) as switch:
        _apply(fabric, entry, lambda: links.flap(switch, period_ms, count, on_change))
    record.clear(entry.id)
    return switch.link_ids

def undo(fabric: Fabric, entry: Entry) -> None:
    """Undo one recorded fault, whatever made it (repeating an undo does nothing)."""
    if entry.mechanism == LINK:
        down = [lk for lk in fabric.topology.links if lk.link_id in set(entry.links)]
        with links.LinkSwitch(fabric, down) as switch:
            switch.up()
    elif entry.mechanism == NFT:
        for node, intf in entry.ends:
            nft.clear(fabric, node, [intf])
    elif entry.mechanism == XDP:
        for node, intf in entry.ends:
            with netns.entered(fabric.node_path(node)), IPRoute() as ipr:
                indexes = ipr.link_lookup(ifname=intf)
                if indexes:
                    xdp.attach(ipr, indexes[0], -1)
    elif entry.mechanism == TBF:
        for node, intf in entry.ends:
            build.shape_port(fabric, node, intf, entry.undo["rate_bps"])
    elif entry.mechanism == NETEM:
        impair.clear_delay(fabric, list(entry.ends))
    else:
        raise FabricSetupError(f"fault {entry.id} has an unknown mechanism {entry.mechanism!r}")


def clear(fabric: Fabric, a: str | None = None, b: str | None = None) -> list[Entry]:
    """Undo every fault in force (a and b: those on the link(s) between them); the ones cleared."""
    record = FaultRecord(fabric)
    if a is None:
        chosen = record.active()
    else:
        chosen = record.on_links([lk.link_id for lk in links.between(fabric, a, b)])
    for entry in reversed(chosen):  # the newest first: a reshaped TBF under a delay comes back as it was
        undo(fabric, entry)
        record.clear(entry.id)
    return chosen
