"""Commands on the fabric itself: up, down, clean, status, exec, paths, probe, link, capture, stats, check,
stev-coverage.

Why it exists: these are the verbs of one running fabric (containerlab's deploy/destroy/
inspect/exec); each opens the fabric once (`Fabric.open`, which says how to start one when
none runs) and hands it to the fabric or experiments layer.
"""

from __future__ import annotations

import time

import click

from ..topology import evs_between, resolve
from .common import JSON_OPTION, NAME_OPTION, emit, fail, friendly, progress


def _open(name: str):
    from ..fabric.running import Fabric

    return Fabric.open(name)


@click.command()
@click.option("--topology", "-t", "topology", default=None, help="Topology YAML file or built-in name (default: the built-in default).")
@click.option("--routing", "routing_mode", type=click.Choice(["none", "static", "bgp"]), default=None,
              help="Plain IPv6 routing between hosts, for --format UDP (the baseline) or STEV: 'static' installs the routes "
                   "BGP converges to (no repair after a fault), 'bgp' runs FRR BGP+BFD in every switch. [default: none]")
@click.option("--bgp", is_flag=True, help="Same as --routing bgp.")
@click.option("--port-model", type=click.Choice(["bpf", "red"]), default=None,
              help="Who marks at a shaped fabric's switch ports: the port program's virtual queue, or the kernel's "
                   "RED qdisc with ECN (needs sch_red; trimming off). [default: the topology's port.model, bpf]")
@NAME_OPTION
@JSON_OPTION
@friendly
def up(topology: str | None, routing_mode: str | None, bgp: bool, port_model: str | None, name: str,
       as_json: bool) -> None:
    """Build the fabric and leave it running."""
    from ..fabric import build, routing, static_routes
    from ..topology import ev_count

    if bgp and routing_mode not in (None, "bgp"):
        raise click.UsageError(f"--bgp means --routing bgp, not --routing {routing_mode}: give one of them")
    mode = "bgp" if bgp else routing_mode or "none"
    topo = resolve(topology)
    if port_model is not None:
        from ..topology import from_dict
        from ..topology.port import with_model

        if not topo.link_rate_bps:
            raise click.UsageError(f"--port-model needs a shaped topology: {topo.name} has no link_rate, no queue to model")
        topo = from_dict({**topo.to_dict(), "port": with_model(topo.ports.raw, port_model)}, topo.source)
    if mode == "bgp" and (reason := routing.frr_missing()):
        raise routing.FabricSetupError(reason)
    result = build.up(topo, name, progress=None if as_json else progress)
    data = {"name": name, "seconds": round(result.seconds, 3), "phases": result.phases,
            "topology": topo.summary(), "ev_count": ev_count(topo), "routing": mode}
    try:
        with _open(name) as fabric:
            if mode == "bgp":
                data["bgp_converged_s"] = round(routing.start(fabric, progress=None if as_json else progress), 2)
            elif mode == "static":
                data["static_routes_s"] = round(static_routes.install(fabric), 3)
    except BaseException:
        build.down(name)  # nothing half-created
        raise
    s = topo.summary()
    emit(data, as_json,
         f"fabric {name!r} up in {result.seconds:.2f} s: {s['planes']} planes, {s['hosts']} hosts, "
         f"{s['nodes']} nodes, {s['links']} links, {ev_count(topo)} EVs between hosts on different leaves"
         + (f"; BGP converged in {data['bgp_converged_s']} s" if mode == "bgp" else "")
         + (f"; static routes installed in {data['static_routes_s']:.2f} s" if mode == "static" else "")
         + f"\ntry: mrc-emu paths h0 h{s['hosts'] - 1} --name {name}")


@click.command()
@NAME_OPTION
@JSON_OPTION
@friendly
def down(name: str, as_json: bool) -> None:
    """Tear the fabric down: every namespace, veth and process it made."""
    from ..fabric import build

    start = time.monotonic()
    record = build.down(name)
    seconds = time.monotonic() - start
    emit({"name": name, "namespaces_removed": len(record.namespaces), "seconds": round(seconds, 3)},
         as_json, f"fabric {name!r} down: {len(record.namespaces)} namespaces removed in {seconds:.2f} s")


@click.command()
@click.option("--name", "-n", default=None, help="Only this fabric (default: every fabric a journal records).")
@JSON_OPTION
@friendly
def clean(name: str | None, as_json: bool) -> None:
    """Remove what crashed or killed runs left, as their journals record it."""
    from ..fabric import build, registry

    if name is None:
        removed = build.clean()
    elif registry.journal_path(name).exists():
        build.down(name)  # what clean does for each journal, for this one
        removed = [name]
    else:
        removed = []
    nothing = "nothing to clean" + (f": no journal records a fabric {name!r}" if name else "")
    emit({"removed": removed}, as_json, f"removed fabrics: {', '.join(removed)}" if removed else nothing)


@click.command()
@NAME_OPTION
@JSON_OPTION
@friendly
def status(name: str, as_json: bool) -> None:
    """Nodes with role and plane, links with ends and state, the EV count."""
    from ..fabric import ops

    with _open(name) as fabric:
        data = ops.status(fabric)
    lines = [f"fabric {name!r} ({data['topology']['source']}): {len(data['nodes'])} nodes, "
             f"{len(data['links'])} links, {data['ev_count']} EVs between hosts on different leaves",
             f"port model: {data['topology']['port_model']} (mrc-emu stats --name {name})"]
    lines.append("nodes:")
    for node in data["nodes"]:
        plane = "all" if node["plane"] is None else node["plane"]
        lines.append(f"  {node['name']:<8} {node['role']:<6} plane {plane}")
    lines.append("links:")
    for link in data["links"]:
        lines.append(f"  {link['a']:>6} {link['a_intf']:<12} <-> {link['b_intf']:>12} {link['b']:<6} "
                     f"plane {link['plane']}  {link['state']}")
    if data["missing_namespaces"]:
        lines.append(f"missing namespaces: {', '.join(data['missing_namespaces'])} (run 'mrc-emu clean')")
    emit(data, as_json, "\n".join(lines))


@click.command(name="exec", context_settings={"ignore_unknown_options": True})
@click.argument("node")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@NAME_OPTION
@friendly
def exec_(node: str, command: tuple[str, ...], name: str) -> None:
    """Run COMMAND inside NODE's namespace: mrc-emu exec h0 -- ip -6 route."""
    from ..fabric import ops

    ops.exec_in(_open(name), node, command)  # replaces this process: nothing to close


@click.command()
@click.argument("src")
@click.argument("dst")
@NAME_OPTION
@JSON_OPTION
@friendly
def paths(src: str, dst: str, name: str, as_json: bool) -> None:
    """The EVs between two hosts, with their segment lists."""
    with _open(name) as fabric:
        evs = evs_between(fabric.topology, src, dst)
    lines = [f"{len(evs)} EVs from {src} to {dst}:"]
    for ev in evs:
        lines.append(f"  EV {ev.index:<3} plane {ev.plane}  {' > '.join(ev.hops)}")
        lines.append(f"         SRH:  {', '.join(ev.segments)}")
        lines.append(f"         uSID: {ev.usid_carrier}")
    emit({"src": src, "dst": dst, "evs": [ev.to_dict() for ev in evs]}, as_json, "\n".join(lines))


@click.command()
@click.argument("src")
@click.argument("dst")
@click.option("--ev", "ev_index", type=int, default=None, help="Probe this EV only.")
@click.option("--all", "all_evs", is_flag=True, help="Probe every EV (the default when --ev is not given).")
@click.option("--timeout", type=float, default=1.0, show_default=True, help="Seconds to wait for probes.")
@NAME_OPTION
@JSON_OPTION
@friendly
def probe(src: str, dst: str, ev_index: int | None, all_evs: bool, timeout: float, name: str, as_json: bool) -> None:
    """EV probes: send along exactly each EV and back; report reachable and rtt_ns."""
    from ..experiments.runtime.probes import probe_evs

    if ev_index is not None and all_evs:
        raise click.UsageError("give --ev K or --all, not both")
    with _open(name) as fabric:
        results = probe_evs(fabric, src, dst, None if ev_index is None else [ev_index], timeout)
    ok = sum(r.reachable for r in results)
    lines = [f"{ok}/{len(results)} EVs from {src} to {dst} reachable"]
    for r in results:
        rtt = f"{r.rtt_ns / 1000:.1f} us" if r.rtt_ns is not None else "-"
        lines.append(f"  EV {r.ev:<3} {'reachable' if r.reachable else 'UNREACHABLE':<12} rtt {rtt}")
    emit({"src": src, "dst": dst, "evs": [r.to_dict() for r in results]}, as_json, "\n".join(lines))


@click.group()
def link() -> None:
    """Fail and restore links (configuration is kept: after up, the same EVs work)."""


def _link_command(up_: bool):
    @click.argument("a")
    @click.argument("b")
    @click.option("--plane", type=int, default=None, help="Only the link of this plane.")
    @NAME_OPTION
    @JSON_OPTION
    @friendly
    def command(a: str, b: str, plane: int | None, name: str, as_json: bool) -> None:
        from ..fabric.faults import fault_ops

        with _open(name) as fabric:  # through the fault record: `fault list` shows a link down
            ids = (fault_ops.link_up if up_ else fault_ops.link_down)(fabric, a, b, plane)
        state = "up" if up_ else "down"
        emit({"a": a, "b": b, "links": ids, "state": state}, as_json, f"link {a} <-> {b} {state}")

    command.__doc__ = f"Take the link between A and B {'up' if up_ else 'down'}."
    return command


link.command(name="down")(_link_command(False))
link.command(name="up")(_link_command(True))


@link.command()
@click.argument("a")
@click.argument("b")
@click.option("--period", type=float, required=True, help="Milliseconds of one down+up cycle.")
@click.option("--count", type=int, default=3, show_default=True, help="How many cycles.")
@click.option("--plane", type=int, default=None, help="Only the link of this plane.")
@NAME_OPTION
@JSON_OPTION
@friendly
def flap(a: str, b: str, period: float, count: int, plane: int | None, name: str, as_json: bool) -> None:
    """Take the link down and up COUNT times, half a PERIOD each."""
    from ..fabric.faults import fault_ops

    if period <= 0 or count < 1:
        raise click.UsageError("--period must be above 0 and --count at least 1")
    events = []

    def changed(up_: bool, ms: float) -> None:
        events.append({"ms": round(ms, 1), "state": "up" if up_ else "down"})
        if up_ and not as_json:
            click.echo(f"  cycle {len(events) // 2}/{count} done", err=True)

    with _open(name) as fabric:
        link_ids = fault_ops.flap(fabric, a, b, period, count, plane, changed)
    emit({"a": a, "b": b, "link_ids": link_ids, "cycles": count, "period_ms": period, "events": events},
         as_json, f"link {a} <-> {b} flapped {count} times, now up")


@click.command()
@click.argument("node")
@click.option("--iface", "-i", default=None, help="One interface (default: every interface of the node).")
@click.option("--duration", "-d", type=float, default=5.0, show_default=True, help="Seconds to capture.")
@click.option("--output", "-o", required=True, help="pcap file to write.")
@NAME_OPTION
@JSON_OPTION
@friendly
def capture(node: str, iface: str | None, duration: float, output: str, name: str, as_json: bool) -> None:
    """Capture a node's traffic to a pcap that Wireshark opens; exit 1 if it lost any packet
    (tcpdump's own count of what the kernel dropped)."""
    from ..fabric import ops

    if duration <= 0:
        raise click.UsageError("--duration must be above 0")
    with _open(name) as fabric:
        if not as_json:
            progress(f"capturing on {node} for {duration:g} s")
        result = ops.capture(fabric, node, output, duration, iface)
    problem = result.problem()
    kept = "?" if result.packets is None else f"{result.packets:,}"
    emit(result.to_dict(), as_json, f"wrote {result.path}: {kept} packets from {', '.join(result.interfaces)}"
         + (f"\nINCOMPLETE: {problem}" if problem else ", none lost"))
    if problem:
        fail(f"the pcap {result.path} is incomplete: {problem}")


@click.command()
@click.argument("node", required=False)
@click.option("--reset", is_flag=True, help="Zero the counters after printing them (the next stats shows a fresh window).")
@NAME_OPTION
@JSON_OPTION
@friendly
def stats(node: str | None, reset: bool, name: str, as_json: bool) -> None:
    """Per-port counters of the switch egress ports (of NODE only, if given): packets and bytes
    passed, CE marked, trimmed, dropped, the largest queue and the queue arrivals found (p50/p99),
    since `up` or the last --reset. Needs a topology with a link_rate (no rate: no queue to model)."""
    from ..fabric.datapath import ports

    with _open(name) as fabric:
        data = ports.counters(fabric, node)
        if reset:
            ports.reset(fabric)
    lines = [f"{'port':<22} {'peer':<6} {'packets':>9} {'bytes':>12} {'ce':>7} {'trimmed':>7} {'dropped':>7} "
             f"{'max_q':>8} {'q_p50':>8} {'q_p99':>8}  (queues in bytes; ecn kmin..kmax, trim at, buffer)"]
    for node_name, ifaces in data.items():
        for ifname, c in ifaces.items():
            cfg = c["config"]
            ecn = f"{cfg['kmin']}..{cfg['kmax']}" if cfg["ecn"] else "off"
            trim = cfg["trim_threshold"] if cfg["trim"] else "off"
            lines.append(f"{node_name + ' ' + ifname:<22} {cfg['peer']:<6} {c['packets']:>9} {c['bytes']:>12} "
                         f"{c['ce_marked']:>7} {c['trimmed']:>7} {c['dropped']:>7} {c['max_queue']:>8} "
                         f"{c['queue_p50'] if c['queue_p50'] is not None else '-':>8} "
                         f"{c['queue_p99'] if c['queue_p99'] is not None else '-':>8}  ecn {ecn}, trim {trim}, "
                         f"buffer {cfg['buffer']}")
    emit(data, as_json, "\n".join(lines))


@click.command()
@click.option("--topology", "-t", "topology", default=None, help="Topology YAML file or built-in name (default: the built-in default).")
@click.option("--max-pairs", type=int, default=None, help="Probe at most this many host pairs.")
@NAME_OPTION
@JSON_OPTION
@friendly
def check(topology: str | None, max_pairs: int | None, name: str, as_json: bool) -> None:
    """Bring a fabric up, probe every EV between every pair of hosts, take it down."""
    from ..experiments.runtime.fabric_check import check as run_check

    topo = resolve(topology)
    result = run_check(topo, name, None if as_json else progress, max_pairs)
    median = f"{result.rtt_ns_median / 1000:.0f} us" if result.rtt_ns_median else "-"
    text = (f"{'OK' if result.ok else 'FAILED'}: {result.evs - len(result.unreachable)}/{result.evs} EVs reachable "
            f"over {result.pairs} host pairs (median probe RTT {median}); "
            f"up {result.up_seconds:.2f} s, down {result.down_seconds:.2f} s")
    for miss in result.unreachable[:10]:
        text += f"\n  unreachable: {miss['src']} -> {miss['dst']} EV {miss['ev']}"
    emit(result.to_dict(), as_json, text)
    if not result.ok:
        fail(f"{len(result.unreachable)} of {result.evs} EVs unreachable")


@click.command("stev-coverage")
@click.argument("src")
@click.argument("dst")
@click.option("--values", "count", type=click.IntRange(1, 4096), default=16, show_default=True,
              help="How many STEV values to try (EV i: UDP sport 0xC000+i, a flow label spread by i, port i % planes + 1).")
@click.option("--frames", type=click.IntRange(1, 1000), default=4, show_default=True, help="Frames sent per value.")
@NAME_OPTION
@JSON_OPTION
@friendly
def stev_coverage(src: str, dst: str, count: int, frames: int, name: str, as_json: bool) -> None:
    """How N STEV values cover the paths from SRC to DST, measured with real frames.

    A STEV EV carries a 32-bit value in the IPv6 flow label (high 16 bits) and the UDP source port
    (low 16 bits); its port picks the plane, and the leaf's ECMP hash on addresses, next header, flow
    label and ports picks the spine. One value at a time, this sends FRAMES frames (UDP 4791) from
    SRC to DST and reads which spine took them from the spines' interface counters. Prints the paths
    hit against what an ideal uniform hash would hit, the packets per path and where each value went.
    Needs plain IPv6 routes (mrc-emu up --routing static). Exit 1 unless every value's frames arrived
    through exactly one spine.
    """
    from ..experiments.runtime.stev import coverage

    with _open(name) as fabric:
        result = coverage(fabric, src, dst, count, frames=frames)
    emit(result.to_dict(), as_json, result.text())
    if not result.one_spine_each:
        fail("not every STEV value's frames all arrived through one spine of its own plane (see above)")


COMMANDS = [up, down, clean, status, exec_, paths, probe, link, capture, stats, check, stev_coverage]
