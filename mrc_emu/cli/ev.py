"""`mrc-emu ev ...` and `mrc-emu port ...`: the OCP controller's EVs and ports, offline and on a running fabric.

Why it exists: a user writing an OCP-style EV profile wants to see the EVs it yields before any
QP uses them: `ev expand` reads a profile file (mrc_emu.api.files) and prints each EV's compact
value and its 32 expanded bytes (and, for SRV6, the addresses they mean), no fabric, no root.
On a running fabric, `ev list|deny|allow`, `ev events` and `port disable|enable` drive the
fabric's controller record (experiments/runtime/controller.py): a deny or a disabled port holds for
every transfer started later and reaches running ones at once. Every error is one line, exit 1.
"""

from __future__ import annotations

import click

from .common import JSON_OPTION, NAME_OPTION, emit, friendly


@click.group()
def ev() -> None:
    """EV profiles (OCP mrc_ctl.h): formats STEV/SRV6/UDP, profiles AUTO/EXP/GEN (docs/api.md)."""


@ev.command()
@click.argument("profile_file", metavar="PROFILE.yaml", type=click.Path(dir_okay=False))
@JSON_OPTION
@friendly
def expand(profile_file: str, as_json: bool) -> None:
    """The EVs a GEN or EXP profile yields: compact value, 32 expanded bytes (hex), SRV6 addresses.

    Example (shipped): mrc_emu/topologies/ev-profiles/example-gen.yaml, the worked example of the
    OCP API's GENERATED expansion with 16 EVs.
    """
    from ..api import files

    loaded = files.load(profile_file)
    evs = loaded.expanded()
    fmt, profile = loaded.fmt, loaded.profile
    data = {"file": profile_file, "format": {"mode": fmt.mode.name, "fields": list(fmt.fields)},
            "profile": {"mode": profile.mode.name, "ev_count": profile.ev_count, "ev_min_active": profile.ev_min_active,
                        "generated_bits": profile.generated_bits},
            "evs": [item.to_dict(fmt.mode) for item in evs]}
    lines = [f"{profile_file}: {profile.mode.name} profile over a {fmt.mode.name} format {list(fmt.fields)}: "
             f"{len(evs)} EV(s), {profile.generated_bits} generated bit(s) each"]
    used = max(1, (profile.generated_bits + 7) // 8 if profile.mode.name == "GEN" else (fmt.total_width + 7) // 8)
    for item in evs:
        shown = "0x" + item.compact[:used].hex()  # the compact EV's leading bytes: the rest are zero
        line = f"  {item.index:3d}  compact {shown}  expanded {item.expanded.hex()}"
        if fmt.mode.name == "SRV6":
            address = item.to_dict(fmt.mode)
            line += f"  da {address['ipv6_da']}  srh {address['srh_segment']}"
        lines.append(line)
    emit(data, as_json, "\n".join(lines))


def _selector_options(command):
    command = click.option("--ev", "one_ev", nargs=3, default=None, metavar="SRC DST K",
                           help="One EV: index K of the EVs from SRC to DST (`mrc-emu paths SRC DST`).")(command)
    command = click.option("--link", nargs=2, default=None, metavar="A B", help="Every EV over the link A-B.")(command)
    command = click.option("--plane", type=int, default=None, help="Every EV in this plane.")(command)
    command = click.option("--node", default=None, help="Every EV through this switch (leaf or spine).")(command)
    return click.option("--spine", default=None, help="Every EV through this spine (a drain).")(command)


def _selector(spine, node, plane, link, one_ev):
    from ..experiments.runtime.controller import Selector

    given = [x for x in (spine, node, plane, link, one_ev) if x is not None]
    if len(given) != 1:
        raise click.UsageError("name the EVs with exactly one of --spine, --node, --plane, --link A B, --ev SRC DST K")
    if one_ev is not None:
        src, dst, index = one_ev
        try:
            return Selector(ev=(src, dst, int(index)))
        except ValueError:
            raise click.BadParameter(f"{index!r} is not an EV index", param_hint="--ev") from None
    return Selector(node=spine or node, plane=plane, link=tuple(link) if link else None)


def _record(name: str):
    from ..experiments.runtime.controller import ControlRecord
    from ..fabric.running import Fabric

    fabric = Fabric.open(name)
    return fabric, ControlRecord(fabric)


def _change(allow: bool, name: str, as_json: bool, **sel) -> None:
    selector = _selector(**sel)
    fabric, record = _record(name)
    with fabric:
        if sel["spine"] and sel["spine"] not in {n.name for n in fabric.topology.nodes.values() if n.role.value == "spine"}:
            raise ValueError(f"{sel['spine']!r} is not a spine of {fabric.topology.name} (--node takes a leaf)")
        (record.allow if allow else record.deny)(selector)
        hit = record.listing(selector=selector)
    verb = "allowed" if allow else "denied"
    emit({"selector": selector.to_dict(), "state": verb, "evs": len(hit)}, as_json,
         f"{selector.describe()}: {verb} ({len(hit)} EV(s) of {len({(e['src'], e['dst']) for e in hit})} host pair(s); "
         f"running transfers follow at once, later ones start so"
         + (")" if allow else "; `mrc-emu ev allow` lifts it)"))


@ev.command(name="deny")
@_selector_options
@NAME_OPTION
@JSON_OPTION
@friendly
def deny_cmd(spine, node, plane, link, one_ev, name: str, as_json: bool) -> None:
    """Deny EVs on a running fabric (DENIED: they carry no data), across every host pair that has
    such EVs: `ev deny --spine p0s1` drains a spine; running transfers stop using them at once."""
    _change(False, name, as_json, spine=spine, node=node, plane=plane, link=link, one_ev=one_ev)


@ev.command(name="allow")
@_selector_options
@NAME_OPTION
@JSON_OPTION
@friendly
def allow_cmd(spine, node, plane, link, one_ev, name: str, as_json: bool) -> None:
    """Allow EVs again (lifts every deny that covers them); a QP probes an allowed EV before it
    carries data on it."""
    _change(True, name, as_json, spine=spine, node=node, plane=plane, link=link, one_ev=one_ev)


@ev.command(name="list")
@click.option("--src", default=None, help="Only EVs from this host.")
@click.option("--dst", default=None, help="Only EVs to this host.")
@click.option("--all", "show_all", is_flag=True, help="Also the allowed EVs (default: only the denied, and a count).")
@NAME_OPTION
@JSON_OPTION
@friendly
def list_cmd(src, dst, show_all: bool, name: str, as_json: bool) -> None:
    """The EVs of a running fabric's host pairs and their admin state (ALLOWED or DENIED, and why),
    with the state of each EV's port."""
    fabric, record = _record(name)
    with fabric:
        rows = record.listing(src, dst)
    denied = [r for r in rows if r["state"] == "DENIED" or not r["port_enabled"]]
    shown = rows if show_all else denied
    lines = [f"{len(rows)} EV(s), {sum(r['state'] == 'DENIED' for r in rows)} DENIED, "
             f"{sum(not r['port_enabled'] for r in rows)} on a disabled port"]
    for r in shown:
        port = "" if r["port_enabled"] else " (port disabled)"
        lines.append(f"  {r['src']}->{r['dst']}  EV {r['ev']:2d}  plane {r['plane']} {r['spine'] or '-':6s}  port {r['port']}"
                     f"  {r['state']}{port}" + (f"  by {r['why']}" if r["why"] else ""))
    emit(shown, as_json, "\n".join(lines))


@ev.command(name="events")
@click.option("--host", required=True, help="The host whose controller's EV event queue to poll.")
@click.option("--max", "max_events", type=click.IntRange(1, 4096), default=64, show_default=True,
              help="Events to take at most (those taken are gone from the queue, as mrc_ctl's poll).")
@NAME_OPTION
@JSON_OPTION
@friendly
def events_cmd(host: str, max_events: int, name: str, as_json: bool) -> None:
    """Poll a host's EV event queue: each EV change to GOOD or ASSUMED_BAD its QPs saw (ev_event_mask;
    DENIED is the controller's own doing and never an event), oldest first, with the drop count."""
    fabric, record = _record(name)
    with fabric:
        if host not in [h.name for h in fabric.topology.hosts]:
            raise ValueError(f"{host!r} is not a host of {fabric.topology.name}")
        events, dropped = record.poll(host, max_events)
    lines = [f"{host}: {len(events)} event(s)" + (f", {dropped} dropped before them (queue full)" if dropped else "")]
    lines += [f"  ->{e['dst']}  EV {e['ev'] if e['ev'] is not None else '?':>2}  port {e['port']}  {e['state']:11s}"
              f"  (profile {e['profile_id']}, value {e['value']})" for e in events]
    emit({"host": host, "drop_count": dropped, "events": events}, as_json, "\n".join(lines))


@click.group()
def port() -> None:
    """A host's MRC ports (port p+1 = its NIC into plane p): admin state of the OCP controller."""


def _port(host: str, plane: int, enabled: bool, name: str, as_json: bool) -> None:
    fabric, record = _record(name)
    with fabric:
        record.set_port(host, plane, enabled)
    state = "ENABLED" if enabled else "DISABLED"
    emit({"host": host, "plane": plane, "port": plane + 1, "state": state}, as_json,
         f"{host} port {plane + 1} (plane {plane}) {state}: " + (
             "its EVs may carry data again (probed first)" if enabled else
             "its EVs carry nothing from now on (the link stays up); `mrc-emu port enable` undoes it"))


@port.command()
@click.argument("host")
@click.option("--plane", type=int, required=True, help="The plane whose port to disable.")
@NAME_OPTION
@JSON_OPTION
@friendly
def disable(host: str, plane: int, name: str, as_json: bool) -> None:
    """Admin-disable HOST's MRC port into a plane: its QPs stop using that port's EVs at once."""
    _port(host, plane, False, name, as_json)


@port.command()
@click.argument("host")
@click.option("--plane", type=int, required=True, help="The plane whose port to enable.")
@NAME_OPTION
@JSON_OPTION
@friendly
def enable(host: str, plane: int, name: str, as_json: bool) -> None:
    """Enable HOST's MRC port into a plane again."""
    _port(host, plane, True, name, as_json)


COMMANDS = [ev, port]
