"""`mrc-emu ev ...` and `mrc-emu port ...`: the OCP controller's EVs and ports, offline and on a running fabric.

Why it exists: a user writing an OCP-style EV profile wants to see the EVs it yields before any
QP uses them: `ev expand` reads a profile file (mrc_emu.api.files) and prints each EV's compact
value and its 32 expanded bytes (and, for SRV6, the addresses they mean), no fabric, no root.
On a running fabric, `ev list|deny|allow|replace`, `ev events` and `port disable|enable` drive the
fabric's controller record (experiments/runtime/controller.py): a deny, a replaced EV value or a
disabled port holds for every transfer started later and reaches running ones at once; `ev events
--follow` prints EV events as the running QPs post them. `ev probe` sends one EV_PROBE through
the hosts' MRC endpoints (OCP's endpoint batch), of an EV or of any EV value. Every error is one
line, exit 1.
"""

from __future__ import annotations

import click

from .common import JSON_OPTION, NAME_OPTION, emit, fail, friendly


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
    with the state of each EV's port and the value `ev replace` gave it, if any."""
    fabric, record = _record(name)
    with fabric:
        rows = record.listing(src, dst)
    denied = [r for r in rows if r["state"] == "DENIED" or not r["port_enabled"] or r["value"]]
    shown = rows if show_all else denied
    lines = [f"{len(rows)} EV(s), {sum(r['state'] == 'DENIED' for r in rows)} DENIED, "
             f"{sum(not r['port_enabled'] for r in rows)} on a disabled port, {sum(bool(r['value']) for r in rows)} "
             f"replaced"]
    for r in shown:
        port = "" if r["port_enabled"] else " (port disabled)"
        lines.append(f"  {r['src']}->{r['dst']}  EV {r['ev']:2d}  plane {r['plane']} {r['spine'] or '-':6s}  port {r['port']}"
                     f"  {r['state']}{port}" + (f"  by {r['why']}" if r["why"] else "")
                     + (f"  value 0x{r['value']}" + (f" on port {r['value_port']}" if r["value_port"] else "") + " (replaced)"
                        if r["value"] else ""))
    emit(shown, as_json, "\n".join(lines))


def _event_line(e: dict) -> str:
    return (f"  ->{e['dst']}  EV {e['ev'] if e['ev'] is not None else '?':>2}  port {e['port']}  {e['state']:11s}"
            f"  (profile {e['profile_id']}, value 0x{bytes.fromhex(e['value']).rstrip(bytes(1)).hex() or '00'})")


@ev.command(name="events")
@click.option("--host", required=True, help="The host whose controller's EV event queue to poll.")
@click.option("--max", "max_events", type=click.IntRange(1, 4096), default=64, show_default=True,
              help="Events to take at most (those taken are gone from the queue, as mrc_ctl's poll).")
@click.option("--follow", "-f", is_flag=True, help="Keep polling: print each event as the running QPs post it "
              "(within tens of milliseconds of the change), until Ctrl-C or --for.")
@click.option("--for", "follow_s", type=click.FloatRange(0.0), default=None, help="With --follow: stop after this "
              "many seconds.")
@NAME_OPTION
@JSON_OPTION
@friendly
def events_cmd(host: str, max_events: int, follow: bool, follow_s: float | None, name: str, as_json: bool) -> None:
    """Poll a host's EV event queue: each EV change to GOOD or ASSUMED_BAD its QPs saw (ev_event_mask;
    DENIED is the controller's own doing and never an event), oldest first, with the drop count.
    With --follow, one line (or JSON object) per event as it comes."""
    if follow_s is not None and not follow:
        raise click.UsageError("--for goes with --follow")
    fabric, record = _record(name)
    with fabric:
        if host not in [h.name for h in fabric.topology.hosts]:
            raise ValueError(f"{host!r} is not a host of {fabric.topology.name}")
        if follow:
            _follow(record, host, max_events, follow_s, as_json)
            return
        events, dropped = record.poll(host, max_events)
    lines = [f"{host}: {len(events)} event(s)" + (f", {dropped} dropped before them (queue full)" if dropped else "")]
    lines += [_event_line(e) for e in events]
    emit({"host": host, "drop_count": dropped, "events": events}, as_json, "\n".join(lines))


def _follow(record, host: str, max_events: int, follow_s: float | None, as_json: bool) -> None:
    """Print `host`'s EV events as they are posted, waiting on the record's growth (no fixed sleep)."""
    import json
    import time

    from ..fabric.kernel.waiting import WaitTimeout, until

    end = None if follow_s is None else time.monotonic() + follow_s
    if not as_json:
        click.echo(f"{host}: following EV events (Ctrl-C to stop)")
    while True:
        events, dropped = record.poll(host, max_events)
        stamp = time.strftime("%H:%M:%S")
        if dropped:
            click.echo(json.dumps({"drop_count": dropped}) if as_json else f"{stamp}  {dropped} event(s) dropped (queue full)")
        for e in events:
            click.echo(json.dumps(e) if as_json else f"{stamp}{_event_line(e)}")
        size = record.size()
        left = 3600.0 if end is None else end - time.monotonic()
        if left <= 0:
            return
        try:
            until(lambda size=size: record.size() != size, left, "the next EV event", interval=0.02)
        except WaitTimeout:
            if end is not None:
                return


def _ev_value(text: str) -> bytes:
    """An EV value from the command line: hex digits (the value's bytes from byte 0: a STEV value 8 digits,
    UDP 4, SRV6 up to 64), or an IPv6 address (SRV6 bytes 0-15), or two of them, 'DA,SEGMENT'."""
    import ipaddress

    try:
        if ":" in text:
            parts = text.split(",")
            if len(parts) > 2:
                raise ValueError
            return b"".join(ipaddress.IPv6Address(part.strip()).packed for part in parts)
        digits = text[2:] if text.lower().startswith("0x") else text
        value = bytes.fromhex(digits if len(digits) % 2 == 0 else "0" + digits)
    except ValueError:
        raise click.BadParameter(f"{text!r} is neither hex digits nor an IPv6 address (or 'DA,SEGMENT')",
                                 param_hint="--value") from None
    if not value or len(value) > 32 or not any(value):
        raise click.BadParameter(f"{text!r}: an EV value is 1..32 bytes, not all zero", param_hint="--value")
    return value


@ev.command(name="replace")
@click.argument("src")
@click.argument("dst")
@click.option("--ev", "index", type=click.IntRange(0), required=True, help="The EV (its index between SRC and DST, "
              "`mrc-emu paths SRC DST`) whose value to replace.")
@click.option("--reset", is_flag=True, help="Instead of --value: put the EV's first value back (what its QPs were "
              "set up with).")
@click.option("--value", "text", default=None, metavar="HEX|IPV6[,SEG]", help="The new value: hex (STEV: 8 digits, "
              "the low 4 the EV's UDP source port as before; SRV6: up to 64) or, for SRV6, the outer destination as "
              "an IPv6 address (a uSID carrier, e.g. fc00:0:5:b:6:3:f0d6::), optionally ',SEGMENT'.")
@click.option("--port", type=click.IntRange(1, 255), default=None, help="Its 1-based port (default: the EV's own).")
@click.option("--wait", "wait_s", type=click.FloatRange(0.0), default=5.0, show_default=True,
              help="Seconds to wait for a running transfer from SRC to DST to take it.")
@NAME_OPTION
@JSON_OPTION
@friendly
def replace_cmd(src: str, dst: str, index: int, reset: bool, text: str | None, port: int | None, wait_s: float,
                name: str, as_json: bool) -> None:
    """REPLACE_EV on a running fabric: EV K from SRC to DST takes a new value (GOOD). A running QP from
    SRC to DST sends the EV's next packet on it (its ACKs come back as before); transfers started later
    start with it. Example: mrc-emu ev replace h0 h2 --ev 1 --value fc00:0:5:b:6:3:f0d6:: moves
    EV 1 of `default` from spine p0s1 to p0s2."""
    from ..fabric.kernel.waiting import WaitTimeout, until

    if reset == (text is not None):
        raise click.UsageError("give --value HEX|IPV6 or --reset")
    if reset and port is not None:
        raise click.UsageError("--reset puts the first port back too: no --port with it")
    value = None if reset else _ev_value(text)
    fabric, record = _record(name)
    with fabric:
        ident = record.replace(src, dst, index, value, port)
        try:
            taken = until(lambda: record.replaced(ident), wait_s, "a running QP", interval=0.02) if wait_s else []
        except WaitTimeout:
            taken = []
    errors = [t["error"] for t in taken if t["error"]]
    data = {"src": src, "dst": dst, "ev": index, "value": value and value.hex(), "port": port, "reset": reset,
            "running_qps": len(taken), "errors": errors}
    head = f"EV {index} {src}->{dst}: " + ("back to its first value" if reset else f"value 0x{value.hex()}"
                                          + (f" on port {port}" if port else ""))
    if errors:
        emit(data, as_json, f"{head}: refused by the running QP: {errors[0]}")
        fail(f"REPLACE_EV refused: {errors[0]}")
    if taken:
        emit(data, as_json, f"{head}: taken by {len(taken)} running QP(s), at their next packet; later transfers "
                            "start with it")
    else:
        emit(data, as_json, f"{head}: recorded; no running transfer from {src} to {dst} took it within {wait_s:g} s, "
                            "transfers started later start with it")


@ev.command(name="probe")
@click.argument("src")
@click.argument("dst")
@click.option("--ev", "index", type=click.IntRange(0), default=None, help="Probe EV K of the fabric from SRC to DST.")
@click.option("--value", "text", default=None, metavar="HEX|IPV6[,SEG]", help="Probe this EV value instead (OCP req_ev; "
              "as `ev replace --value` takes it), which no QP need use.")
@click.option("--format", "mode", type=click.Choice(["SRV6", "STEV", "UDP"]), default="SRV6", show_default=True,
              help="The value's EV format.")
@click.option("--port", type=click.IntRange(1, 255), default=None,
              help="The value's 1-based port (default: SRV6 the plane its carrier's first node is in, else 1).")
@click.option("--timeout", "timeout_ms", type=click.FloatRange(0.001), default=100.0, show_default=True,
              help="Milliseconds to wait for the response (rsp_timeout): none by then is unreachable.")
@NAME_OPTION
@JSON_OPTION
@friendly
def probe_cmd(src: str, dst: str, index: int | None, text: str | None, mode: str, port: int | None,
              timeout_ms: float, name: str, as_json: bool) -> None:
    """EV_PROBE from SRC to DST through the hosts' MRC endpoints (OCP's endpoint batch): of EV K, or of
    any EV value; prints whether it came back, its RTT corrected for DST's service time (the header's
    rtt, with adj_svc_time 1), the RTT as measured, and DST's port it arrived at. Needs no running
    transfer: SRC's and DST's endpoints are served for the probe, or, while a transfer serves them, the
    transfer's workers send it (asked through the controller record). Example: mrc-emu ev probe h0 h2
    --value fc00:0:5:b:6:3:f0d6::"""
    if (index is None) == (text is None):
        raise click.UsageError("give --ev K or --value HEX")
    import ipaddress

    value = None
    from ..api.formats import EvFormatMode
    from ..experiments.runtime.transfer import EndpointBusy, probe
    from ..fabric import routing, static_routes
    from ..fabric.running import Fabric
    from ..topology.evs import evs_between
    from ..transport.multipath.evvalues import VALUE_PROBE_EV, value_probe_path

    fabric = Fabric.open(name)
    with fabric:
        topo = fabric.topology
        evs = evs_between(topo, src, dst)
        if index is not None:
            if index >= len(evs):
                raise ValueError(f"no EV {index} from {src} to {dst} (EVs 0..{len(evs) - 1})")
            request, what = (1, dst, index), f"EV {index} ({' > '.join(evs[index].hops)})"
        else:
            value = _ev_value(text)
            if mode != "SRV6" and not (routing.running(fabric) or static_routes.installed(fabric)):
                raise click.UsageError(f"a {mode} value needs plain IPv6 routing: bring the fabric up with 'mrc-emu up "
                                       f"--routing static' (fabric {name!r} has none)")
            path = value_probe_path(topo, src, dst, EvFormatMode[mode], value, port)
            request = (1, dst, VALUE_PROBE_EV, path)
            shown = (",".join(str(ipaddress.IPv6Address(value.ljust(32, b"\0")[k:k + 16])) for k in (0, 16)
                              if any(value[k:k + 16])) if mode == "SRV6" else f"0x{value.hex()}")
            what = f"value {shown} ({mode}, port {path.plane + 1})"
        try:
            responses, via = probe(fabric, src, dst, [request], int(timeout_ms * 1e6)).responses, "endpoint worker"
        except EndpointBusy as busy:  # a transfer serves them: ask it, through the controller record
            responses, via = _probe_in_run(fabric, busy, src, dst, index, text and value, mode, port, timeout_ms), "run"
    rsp = responses[0] if responses else None
    data = {"src": src, "dst": dst, "probed": what, "reachable": rsp is not None, "timeout_ms": timeout_ms, "via": via}
    if rsp is None:
        emit(data, as_json, f"{src} -> {dst} {what}: unreachable (no response within {timeout_ms:g} ms)")
        return
    data |= {"rtt_ns": rsp["rtt_raw"], "adjusted_rtt_ns": rsp["rtt"], "adj_svc_time": rsp["adj_svc_time"],
             "service_ns": rsp["service_ns"], "port": rsp["port"]}
    emit(data, as_json, f"{src} -> {dst} {what}: reachable, rtt_ns {rsp['rtt_raw']}, adjusted rtt {rsp['rtt']} ns "
                        f"(adj_svc_time {rsp['adj_svc_time']}: less {dst}'s service time {rsp['service_ns']} ns), "
                        f"arrived at {dst}'s port {rsp['port']}" + (" (asked of the running transfer)"
                                                                     if via == "run" else ""))


def _probe_in_run(fabric, busy: Exception, src: str, dst: str, index: int | None, value: bytes | None, mode: str,
                  port: int | None, timeout_ms: float) -> list[dict]:
    """The probe asked of the transfer whose workers serve SRC, through the controller record: its responses."""
    from ..experiments.runtime.controller import ControlRecord
    from ..fabric.kernel.waiting import WaitTimeout, until

    record = ControlRecord(fabric)
    ident = record.probe(src, dst, index, value, mode, port, int(timeout_ms * 1e6))
    try:
        answer = until(lambda: record.probed(ident), 5.0 + timeout_ms / 1e3, "the running transfer's probe")
    except WaitTimeout:
        raise ValueError(f"{busy}, and no running transfer serving {src} took the probe") from None
    if answer.get("error"):
        raise ValueError(answer["error"])
    return answer["responses"]


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
