"""The mrc-emu command line: thin wrappers over the fabric, probes and captures.

Why it exists: users drive everything from here. It holds no logic a test cannot call
directly; it turns arguments into calls, results into text or JSON, and every known
error into one clear line and exit code 1.
"""

from __future__ import annotations

import functools
import json
import sys
import time
from typing import Any

import click

from .topology import TopologyError, evs_between, model, resolve
from .transport.cc import profile_names

NAME_OPTION = click.option("--name", "-n", default="mrc", show_default=True, help="Fabric name (namespaces are <name>-<node>).")
JSON_OPTION = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")


def _known_errors() -> tuple[type[BaseException], ...]:
    from .experiments.transfer import TransferError
    from .fabric.netlink import NetlinkError
    from .fabric.nodes import FabricSetupError
    from .fabric.registry import RegistryError

    return (TopologyError, FabricSetupError, RegistryError, NetlinkError, TransferError, ValueError,
            PermissionError)


def friendly(func):
    """Print known errors as one line, exit 1; Ctrl-C exits 130 after cleanup ran."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)
        except _known_errors() as exc:
            click.echo(f"mrc-emu: error: {exc}", err=True)
            sys.exit(1)

    return wrapper


def _emit(data: Any, as_json: bool, text: str) -> None:
    click.echo(json.dumps(data, indent=2) if as_json else text)


def _progress(message: str) -> None:
    click.echo(f"  .. {message}", err=True)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="mrc-emu")
def main() -> None:
    """mrc-emu: MRC (Multipath Reliable Connection) on a multi-plane SRv6 fabric in namespaces.

    Typical session: `up`, `status`, `paths h0 h2`, `probe h0 h2 --all`, `link down p0l0 p0s1`,
    `capture p0s0 -o spine.pcap`, `down`. Needs root for everything that touches the fabric.
    """


@main.command()
@click.option("--topology", "-t", "topology", default=None, help="Topology YAML file or built-in name (default: the built-in default).")
@click.option("--routing", "routing_mode", type=click.Choice(["none", "static", "bgp"]), default=None,
              help="Plain IPv6 routing between hosts, for --format UDP (the baseline): 'static' installs the routes "
                   "BGP converges to (no repair after a fault), 'bgp' runs FRR BGP+BFD in every switch. [default: none]")
@click.option("--bgp", is_flag=True, help="Same as --routing bgp.")
@NAME_OPTION
@JSON_OPTION
@friendly
def up(topology: str | None, routing_mode: str | None, bgp: bool, name: str, as_json: bool) -> None:
    """Build the fabric and leave it running."""
    from .fabric import build, routing, static_routes
    from .topology import ev_count

    if bgp and routing_mode not in (None, "bgp"):
        raise click.UsageError(f"--bgp means --routing bgp, not --routing {routing_mode}: give one of them")
    mode = "bgp" if bgp else routing_mode or "none"
    topo = resolve(topology)
    if mode == "bgp" and (reason := routing.frr_missing()):
        raise routing.FabricSetupError(reason)
    result = build.up(topo, name, progress=None if as_json else _progress)
    data = {"name": name, "seconds": round(result.seconds, 3), "phases": result.phases,
            "topology": topo.summary(), "ev_count": ev_count(topo), "routing": mode}
    try:
        if mode == "bgp":
            data["bgp_converged_s"] = round(routing.start(name, progress=None if as_json else _progress), 2)
        elif mode == "static":
            data["static_routes_s"] = round(static_routes.install(name, topo), 3)
    except BaseException:
        build.down(name)  # nothing half-created
        raise
    s = topo.summary()
    _emit(data, as_json,
          f"fabric {name!r} up in {result.seconds:.2f} s: {s['planes']} planes, {s['hosts']} hosts, "
          f"{s['nodes']} nodes, {s['links']} links, {ev_count(topo)} EVs between hosts on different leaves"
          + (f"; BGP converged in {data['bgp_converged_s']} s" if mode == "bgp" else "")
          + (f"; static routes installed in {data['static_routes_s']:.2f} s" if mode == "static" else "")
          + f"\ntry: mrc-emu paths h0 h{s['hosts'] - 1} --name {name}")


@main.command()
@NAME_OPTION
@JSON_OPTION
@friendly
def down(name: str, as_json: bool) -> None:
    """Tear the fabric down: every namespace, veth and process it made."""
    from .fabric import build

    start = time.monotonic()
    record = build.down(name)
    seconds = time.monotonic() - start
    _emit({"name": name, "namespaces_removed": len(record.namespaces), "seconds": round(seconds, 3)},
          as_json, f"fabric {name!r} down: {len(record.namespaces)} namespaces removed in {seconds:.2f} s")


@main.command()
@JSON_OPTION
@friendly
def clean(as_json: bool) -> None:
    """Remove what crashed or killed runs left, as their journals record it."""
    from .fabric import build

    removed = build.clean()
    _emit({"removed": removed}, as_json, f"removed fabrics: {', '.join(removed)}" if removed else "nothing to clean")


@main.command()
@NAME_OPTION
@JSON_OPTION
@friendly
def status(name: str, as_json: bool) -> None:
    """Nodes with role and plane, links with ends and state, the EV count."""
    from .fabric import ops

    data = ops.status(name)
    lines = [f"fabric {name!r} ({data['topology']['source']}): {len(data['nodes'])} nodes, "
             f"{len(data['links'])} links, {data['ev_count']} EVs between hosts on different leaves"]
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
    _emit(data, as_json, "\n".join(lines))


@main.command(name="exec", context_settings={"ignore_unknown_options": True})
@click.argument("node")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@NAME_OPTION
@friendly
def exec_(node: str, command: tuple[str, ...], name: str) -> None:
    """Run COMMAND inside NODE's namespace: mrc-emu exec h0 -- ip -6 route."""
    from .fabric import ops

    ops.exec_in(name, node, command)


@main.command()
@click.argument("src")
@click.argument("dst")
@NAME_OPTION
@JSON_OPTION
@friendly
def paths(src: str, dst: str, name: str, as_json: bool) -> None:
    """The EVs between two hosts, with their segment lists."""
    from .fabric.build import load_topology

    evs = evs_between(load_topology(name), src, dst)
    lines = [f"{len(evs)} EVs from {src} to {dst}:"]
    for ev in evs:
        lines.append(f"  EV {ev.index:<3} plane {ev.plane}  {' > '.join(ev.hops)}")
        lines.append(f"         SRH:  {', '.join(ev.segments)}")
        lines.append(f"         uSID: {ev.usid_carrier}")
    _emit({"src": src, "dst": dst, "evs": [ev.to_dict() for ev in evs]}, as_json, "\n".join(lines))


@main.command()
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
    from .experiments.probes import probe_evs

    if ev_index is not None and all_evs:
        raise click.UsageError("give --ev K or --all, not both")
    results = probe_evs(name, src, dst, None if ev_index is None else [ev_index], timeout)
    ok = sum(r.reachable for r in results)
    lines = [f"{ok}/{len(results)} EVs from {src} to {dst} reachable"]
    for r in results:
        rtt = f"{r.rtt_ns / 1000:.1f} us" if r.rtt_ns is not None else "-"
        lines.append(f"  EV {r.ev:<3} {'reachable' if r.reachable else 'UNREACHABLE':<12} rtt {rtt}")
    _emit({"src": src, "dst": dst, "evs": [r.to_dict() for r in results]}, as_json, "\n".join(lines))


@main.group()
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
        from .fabric import build

        ids = build.set_link(name, a, b, up_, plane)
        state = "up" if up_ else "down"
        _emit({"a": a, "b": b, "links": ids, "state": state}, as_json, f"link {a} <-> {b} {state}")

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
    from .fabric import build

    if period <= 0 or count < 1:
        raise click.UsageError("--period must be above 0 and --count at least 1")
    started = time.monotonic()
    next_at = started
    events = []
    for cycle in range(count):
        for up_ in (False, True):
            next_at += period / 2000
            links = build.set_link(name, a, b, up_, plane)
            events.append({"ms": round((time.monotonic() - started) * 1000, 1), "state": "up" if up_ else "down"})
            time.sleep(max(0.0, next_at - time.monotonic()))  # the flap's period is the point
        if not as_json:
            click.echo(f"  cycle {cycle + 1}/{count} done", err=True)
    _emit({"a": a, "b": b, "link_ids": links, "cycles": count, "period_ms": period, "events": events}, as_json,
          f"link {a} <-> {b} flapped {count} times, now up")


@main.command()
@click.argument("node")
@click.option("--iface", "-i", default=None, help="One interface (default: every interface of the node).")
@click.option("--duration", "-d", type=float, default=5.0, show_default=True, help="Seconds to capture.")
@click.option("--output", "-o", required=True, help="pcap file to write.")
@NAME_OPTION
@JSON_OPTION
@friendly
def capture(node: str, iface: str | None, duration: float, output: str, name: str, as_json: bool) -> None:
    """Capture a node's traffic to a pcap that Wireshark opens."""
    from .fabric import ops

    if duration <= 0:
        raise click.UsageError("--duration must be above 0")
    if not as_json:
        _progress(f"capturing on {node} for {duration:g} s")
    result = ops.capture(name, node, output, duration, iface)
    _emit({"path": result.path, "packets": result.packets, "interfaces": result.interfaces}, as_json,
          f"wrote {result.path}: {result.packets} packets from {', '.join(result.interfaces)}")


@main.command()
@click.option("--topology", "-t", "topology", default=None, help="Topology YAML file or built-in name (default: the built-in default).")
@click.option("--max-pairs", type=int, default=None, help="Probe at most this many host pairs.")
@NAME_OPTION
@JSON_OPTION
@friendly
def check(topology: str | None, max_pairs: int | None, name: str, as_json: bool) -> None:
    """Bring a fabric up, probe every EV between every pair of hosts, take it down."""
    from .experiments.fabric_check import check as run_check

    topo = resolve(topology)
    result = run_check(topo, name, None if as_json else _progress, max_pairs)
    median = f"{result.rtt_ns_median / 1000:.0f} us" if result.rtt_ns_median else "-"
    text = (f"{'OK' if result.ok else 'FAILED'}: {result.evs - len(result.unreachable)}/{result.evs} EVs reachable "
            f"over {result.pairs} host pairs (median probe RTT {median}); "
            f"up {result.up_seconds:.2f} s, down {result.down_seconds:.2f} s")
    for miss in result.unreachable[:10]:
        text += f"\n  unreachable: {miss['src']} -> {miss['dst']} EV {miss['ev']}"
    _emit(result.to_dict(), as_json, text)
    if not result.ok:
        sys.exit(1)


@main.command()
@click.option("--radix", "-r", type=int, required=True, help="Ports per switch at the plane's port speed (51.2T / 100G = 512).")
@click.option("--planes", "-p", type=int, default=1, show_default=True, help="Planes (ports per endpoint NIC).")
@click.option("--tiers", "-t", type=int, default=2, show_default=True, help="Switch tiers of each plane's Clos.")
@click.option("--endpoints", "-e", "target", type=int, default=None,
              help="Target endpoint count: also say how many tiers it needs (default: what --tiers reaches).")
@JSON_OPTION
@friendly
def plan(radix: int, planes: int, tiers: int, target: int | None, as_json: bool) -> None:
    """Capacity planner: endpoints, switches and links of a multi-plane Clos (formula: docs/planner.md).

    Example, the published MRC figure: --radix 512 --planes 8 --tiers 2 -> 131,072 endpoints,
    where the same 51.2T switch with 800G ports (radix 64, one plane) needs 4 tiers.
    """
    from .topology import planner

    chosen = planner.plan(radix, planes, tiers)
    goal = target or chosen.endpoints
    needed = planner.tiers_needed(radix, goal)
    sized = planner.plan(radix, planes, needed, goal) if needed else None
    single = planner.single_plane_equivalent(radix, planes, goal) if planes > 1 else None
    data = {"plan": chosen.to_dict(), "target_endpoints": goal, "tiers_needed": needed,
            "plan_for_target": sized.to_dict() if sized else None,
            "single_plane_same_asic": single.to_dict() if single else None}
    lines = [f"radix {radix}, {planes} plane(s), {tiers} tier(s): {chosen.endpoints:,} endpoints; "
             f"{chosen.switches:,} switches ({chosen.switches_per_plane:,} per plane), {chosen.links:,} links"]
    if sized:
        lines.append(f"{goal:,} endpoints need {needed} tier(s) at radix {radix}: {sized.switches:,} switches, "
                     f"{sized.links:,} links")
    else:
        lines.append(f"{goal:,} endpoints need more than 12 tiers at radix {radix}")
    if single:
        lines.append(f"the same ASIC as one plane with {planes}x faster ports (radix {single.radix}) needs "
                     f"{single.tiers} tiers for {goal:,} endpoints: {single.switches:,} switches, {single.links:,} links")
    _emit(data, as_json, "\n".join(lines))


def _run_scenario(spec: str, out: str | None, pcap: bool, as_json: bool) -> dict:
    from pathlib import Path

    from .experiments import report, runner, scenario
    from .fabric.nodes import check_prerequisites

    scn = scenario.load(spec)
    if pcap:
        scn.capture = True
    check_prerequisites()
    out_dir = Path(out or f"results/{scn.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    show = not as_json
    bars: dict[str, Any] = {}

    def bar_for(transport: str):
        if not (show and sys.stderr.isatty()):
            return None
        done = [0]

        def update(acked: int, total: int) -> None:
            if transport not in bars:
                bars[transport] = click.progressbar(length=total, label=f"  {transport:<8}", file=sys.stderr)
                bars[transport].__enter__()
            bars[transport].update(acked - done[0])
            done[0] = acked
            if acked >= total:
                bars.pop(transport).__exit__(None, None, None)

        return update

    results = runner.run(scn, out_dir, _progress if show else runner._quiet, bar_for)
    for bar in bars.values():
        bar.__exit__(None, None, None)
    files = report.write(results, out_dir)
    results["files"] = files
    return results


def _scenario_text(results: dict) -> str:
    from .experiments import report

    lines = [f"scenario {results['scenario']['name']}: {', '.join(results['scenario']['faults']) or 'no faults'}", "",
             report.table(report.summary_rows(results))]
    if (sentence := report.headline(results)) is not None:
        lines += ["", sentence]
    for note in results["notes"]:
        lines.append(f"note: {note}")
    files = results["files"]
    lines += ["", f"results: {files['results']}", f"report:  {files['report']}",
              "plots:   " + ", ".join(v for k, v in files.items() if k not in ("results", "report"))]
    pcaps = [run["pcap"] for run in results["runs"].values() if run.get("pcap")]
    if pcaps:
        lines.append("pcaps:   " + ", ".join(pcaps))
    return "\n".join(lines)


@main.command(name="run")
@click.argument("scenario_file", metavar="SCENARIO")
@click.option("--out", "-o", default=None, help="Output folder (default: results/<name>-<time>).")
@click.option("--pcap", is_flag=True, help="Also capture pcaps of the source host (headers only).")
@JSON_OPTION
@friendly
def run_(scenario_file: str, out: str | None, pcap: bool, as_json: bool) -> None:
    """Run a scenario (a YAML file or a shipped name: demo, link-down, lossy-link, collectives).

    Builds its own fabric, runs each transport with the fault schedule, tears down, and writes
    results.json, plots (PNG) and report.md to --out. Exit 1 if a transfer is not verified.
    """
    results = _run_scenario(scenario_file, out, pcap, as_json)
    _emit(results, as_json, _scenario_text(results))
    if not all(run["verified"] for run in results["runs"].values()):
        sys.exit(1)


@main.command()
@click.option("--out", "-o", default="mrc-emu-demo", show_default=True, help="Output folder.")
@JSON_OPTION
@friendly
def demo(out: str, as_json: bool) -> None:
    """The headline: a 128 MiB WRITE while a leaf-spine link fails, with MRC and with the baseline.

    On the built-in default topology: the link under the baseline's flow (measured) is
    blackholed at 30 %. Prints goodput, completion, recovery and the SHA-256 check of both,
    and where the plots and pcaps are. About a minute on a 2-core VM.
    """
    results = _run_scenario("demo", out, True, as_json)
    _emit(results, as_json, _scenario_text(results))
    if not all(run["verified"] for run in results["runs"].values()):
        sys.exit(1)


def parse_size(text: str) -> int:
    """'64MiB', '1.5GB', '4096', '100k' -> bytes (topology.model.parse_size, as a usage error)."""
    try:
        return model.parse_size(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


class Size(click.ParamType):
    name = "size"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        try:
            return parse_size(value)
        except click.BadParameter as exc:
            self.fail(exc.message, param, ctx)


def _ev_selection(text: str | None, count: int) -> list[int] | None:
    """--evs 4 (the first four EVs) or --evs 0,3,5 (exactly these)."""
    if text is None:
        return None
    try:
        if "," in text:
            return [int(x) for x in text.split(",") if x.strip()]
        n = int(text)
    except ValueError:
        raise click.BadParameter(f"--evs {text!r}: give a count (4) or a list of EV indexes (0,3,5)") from None
    if not 1 <= n <= count:
        hint = " (for EV 0 alone, give the list '0,')" if n == 0 else ""
        raise click.BadParameter(f"--evs {n}: a count must be 1..{count}, the EVs between these hosts{hint}")
    return list(range(n))


def _transfer_text(r) -> str:
    lines = []
    if r.ok:
        lines.append(f"{r.src} -> {r.dst}: {r.size / 2**20:.1f} MiB in {r.completion_ms:.1f} ms, goodput "
                     f"{r.goodput_gbps:.2f} Gbit/s ({r.goodput_pps:,} packets/s); MTU {r.mtu}, {len(r.evs)} EVs "
                     f"({r.ev_format}), CC {r.cc}")
    else:
        lines.append(f"{r.src} -> {r.dst}: FAILED: {r.error}")
    stats = r.requester["stats"]
    lines.append(f"packets sent {stats['packets_sent']:,}, retransmits {stats['retransmits']:,}, ACK timeouts "
                 f"{stats['timeouts']}, duplicates placed-once {r.responder['stats']['duplicates']:,}, "
                 f"probes {stats['probes_sent']} sent / {stats['probes_returned']} back")
    lines.append("  EV  plane spine   share  sent     lost  srtt_us  state")
    for e in r.per_ev:
        lines.append(f"  {e['ev']:<3} {e['plane']:<5} {str(e['spine'] or '-'):<7} {e['share'] * 100:5.1f}% "
                     f"{e['packets_sent']:<8} {e['packets_lost']:<5} {e['srtt_us']:<8} {e['state']}")
    if r.ev_events:
        lines.append(f"EV events ({len(r.ev_events)}):")
        for ev in r.ev_events[:20]:
            rtt = f", probe rtt {ev['rtt_ns'] / 1000:.0f} us" if ev["rtt_ns"] else ""
            lines.append(f"  {ev['time_ms']:9.3f} ms  EV {ev['ev']}: {ev['old']} -> {ev['new']} ({ev['reason']}{rtt})")
        if len(r.ev_events) > 20:
            lines.append(f"  ... {len(r.ev_events) - 20} more (--json has all)")
    else:
        lines.append("EV events: none")
    drops = {**r.requester["drops"], **r.responder["drops"]}
    kernel = {k: v for k, v in r.responder.get("kernel_udp", {}).items() if v}
    if drops or kernel:
        lines.append(f"dropped: {drops} kernel: {kernel}")
    lines.append(f"sha256 source {r.sha256_source}")
    lines.append(f"sha256 placed {r.sha256_placed}  {'MATCH' if r.verified else 'MISMATCH'}")
    return "\n".join(lines)


@main.command()
@click.argument("src")
@click.argument("dst")
@click.option("--size", "-s", type=Size(), default="64MiB", show_default=True,
              help="Bytes to WRITE (4096, 100k, 64MiB, 1GiB).")
@click.option("--evs", default=None, help="EVs to spray over: a count (first N) or a list like 0,3,5 (default: all).")
@click.option("--cc", type=click.Choice(profile_names()), default="nscc", show_default=True,
              help="Congestion control profile.")
@click.option("--mtu", type=int, default=4096, show_default=True, help="Payload bytes per packet (path MTU).")
@click.option("--format", "ev_format", type=click.Choice(["SRV6", "SRV6_USID", "UDP"]), default="SRV6",
              show_default=True, help="EV format on the wire.")
@click.option("--ev-min-active", type=int, default=1, show_default=True,
              help="Never mark so many EVs ASSUMED_BAD that fewer than this stay GOOD.")
@click.option("--imm", type=int, default=None, help="Send a WRITE_WITH_IMM with this 32-bit immediate.")
@click.option("--ack-timeout-exp", type=click.IntRange(0, 24), default=14, show_default=True,
              help="t in ACK timeout = 1.024 us x 2^t (14: 16.8 ms).")
@click.option("--retry-exp", type=click.IntRange(0, 25), default=4, show_default=True,
              help="Retries with doubling timeout after the 7 linear ones (25 = infinite).")
@NAME_OPTION
@JSON_OPTION
@friendly
def send(src: str, dst: str, size: int, evs: str | None, cc: str, mtu: int, ev_format: str, ev_min_active: int,
         imm: int | None, ack_timeout_exp: int, retry_exp: int, name: str, as_json: bool) -> None:
    """RDMA WRITE from SRC to a buffer at DST, sprayed over the EVs; verify by SHA-256.

    Starts the responder in DST's namespace and the requester in SRC's, on a running fabric.
    Exit code 1 if the transfer fails or the placed bytes differ from the source.
    """
    from .experiments.transfer import send as run_send
    from .fabric import routing, static_routes
    from .fabric.build import load_topology
    from .topology.evs import EvFormat
    from .transport.config import QpConfig

    nbytes = size
    count = len(evs_between(load_topology(name), src, dst))
    if ev_format == "UDP" and not (routing.running(name) or static_routes.installed(name)):
        raise click.UsageError(f"--format UDP needs plain IPv6 routing: bring the fabric up with 'mrc-emu up --routing "
                               f"static' (or --routing bgp) (fabric {name!r} has neither)")
    selection = _ev_selection(evs, count)
    if imm is not None and not 0 <= imm <= 0xFFFFFFFF:
        raise click.BadParameter("--imm must fit in 32 bits")
    config = QpConfig(mtu=mtu, ack_timeout_exp=ack_timeout_exp, retry_exp=retry_exp)
    show_bar = not as_json and sys.stderr.isatty()
    with click.progressbar(length=nbytes, label=f"{src} -> {dst}", file=sys.stderr, show_pos=False,
                           hidden=not show_bar) as bar:
        done = [0]

        def progress(acked: int, total: int) -> None:
            bar.update(acked - done[0])
            done[0] = acked

        result = run_send(name, src, dst, nbytes, selection, cc, mtu, EvFormat(ev_format), ev_min_active, imm,
                          config, on_progress=progress)
    _emit(result.to_dict(), as_json, _transfer_text(result))
    if not result.verified:
        sys.exit(1)


if __name__ == "__main__":
    main()
