"""`mrc-emu send`: one RDMA WRITE on a running fabric, with its figures and its SHA-256 check.

Why it exists: the transfer command has the most options and the longest report of all;
it turns them into one `experiments.runtime.transfer.send` call and its result into text or JSON.
"""

from __future__ import annotations

import contextlib
import sys

import click

from ..experiments.analysis.emulation import Report
from ..fabric.limits import available_memory
from ..topology import evs_between
from ..transport.cc.registry import profile_names
from .common import JSON_OPTION, NAME_OPTION, Size, emit, fail, friendly


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


WORKER_OVERHEAD = 256 * 2**20  # what the endpoint workers hold besides the two buffers (measured: ~0.2 GiB)


def memory_needed(size: int) -> int:
    """Bytes of RAM a WRITE of `size` needs: its source bytes (random, in the requester's worker)
    and the registered buffer they are placed into (in the responder's) are both held whole,
    side by side on this one machine. Nothing else bounds the size: each packet's RETH carries
    its own VA and DMA length (docs/wire-format.md), so no 32-bit message length applies."""
    return 2 * size + WORKER_OVERHEAD


def memory_problem(size: int, available: int | None) -> str | None:
    """None if a WRITE of `size` fits in `available` bytes of memory, else the one-line refusal."""
    if available is None or memory_needed(size) <= available:
        return None
    fits = max(0, (available - WORKER_OVERHEAD) // 2)
    return (f"--size {size / 2**30:.1f} GiB needs {memory_needed(size) / 2**30:.1f} GiB of memory (the source "
            f"bytes and the destination buffer are both held in RAM) and {available / 2**30:.1f} GiB is "
            f"available: send at most {fits / 2**30:.1f} GiB, or free memory first")


def _transfer_text(r) -> str:
    lines = []
    if r.ok:
        lines.append(f"{r.src} -> {r.dst}: {r.size / 2**20:.1f} MiB in {r.completion_ms:.1f} ms, goodput "
                     f"{r.goodput_gbps:.2f} Gbit/s ({r.goodput_pps:,} packets/s); MTU {r.mtu}, {len(r.evs)} EVs "
                     f"({r.ev_format}), CC {r.cc}")
    else:
        lines.append(f"{r.src} -> {r.dst}: FAILED: {r.error}")
    if r.ev_profile:
        lines.append(f"EV profile {r.ev_profile}: {len(r.evs)} EVs (EV = the profile's slot)")
    if r.base_rtt and r.base_rtt["ns"] is not None:
        rtt = r.base_rtt
        lines.append(f"base RTT {rtt['summary']}" if "summary" in rtt else f"base RTT {rtt['ns'] / 1000:.0f} us ({rtt['source']})")
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
    if r.emulation is not None:
        lines.append(Report(**r.emulation).line())
    if r.virtual is not None:
        lines += _virtual_lines(r.virtual)
    return "\n".join(lines)


def _virtual_lines(v: dict) -> list[str]:
    """What a virtual-time run's block says: the model, its faults, and this machine's speed."""
    lines = [f"fault {f['fault']}: in force at {f['applied_ns'] / 1e6:.3f} ms"
             + (f", undone at {f['reverted_ns'] / 1e6:.3f} ms" if f["reverted_ns"] is not None else "")
             for f in v["faults"]]
    busiest = v["busiest_port"]
    lines.append(f"virtual time: {v['virtual_ns'] / 1e6:.3f} ms on {v['topology']} (seed {v['seed']}), links "
                 f"{v['link_rate_bps'] / 1e9:g} Gbit/s ({v['link_rate_from']}), {v['link_delay_ns'] / 1e3:g} us each; "
                 f"busiest port {busiest['node']} {busiest['ifname']} (queue up to {busiest['max_queue']:,} B)"
                 + (f"; fabric drops {v['fabric_drops']}" if v["fabric_drops"] else ""))
    wall = v["wall"]
    lines.append(f"wall time {wall['seconds']:.2f} s: {v['events']:,} events, {v['packet_hops']:,} packet-hops "
                 f"({wall['packet_hops_per_s'] or 0:,} packet-hops/s)")
    return lines


@click.command()
@click.argument("src")
@click.argument("dst")
@click.option("--size", "-s", type=Size(), default="64MiB", show_default=True,
              help="Bytes to WRITE (4096, 100k, 64MiB, 1GiB).")
@click.option("--evs", default=None, help="EVs to spray over: a count (first N) or a list like 0,3,5 (default: all).")
@click.option("--ev-profile", "ev_profile", type=click.Path(dir_okay=False), default=None,
              help="Spray over the EVs of this OCP EV profile file (SRV6, STEV or UDP format, GEN or EXP; see 'mrc-emu "
                   "ev expand'), made on SRC's controller and bound by id: EV i = its slot i (SRV6: each carrier a "
                   "path of the fabric from SRC to DST; STEV and UDP need --routing); its ev_min_active is the "
                   "QP's. Instead of --evs, --format and --ev-min-active. "
                   "Example: mrc_emu/topologies/ev-profiles/default-h0-h2-gen.yaml.")
@click.option("--cc", type=click.Choice(profile_names()), default="nscc", show_default=True,
              help="Congestion control profile.")
@click.option("--cc-config", "cc_config", default=None, metavar="NAME=VALUE[,...]",
              help="The QP's CC profile config, by the OCP field names: NSCC's mrc_ctl_cc_nscc_cfg (max_cwnd, "
                   "base_rtt, target_delay, gamma, eta, fi, ...; bytes and ns), or DCQCN's parameters (window, "
                   "byte_counter, ...). E.g. --cc-config max_cwnd=16384. Emulated clock.")
@click.option("--qp-cap", "qp_caps", multiple=True,
              type=click.Choice(["TRIM_NACK_DEST_UNSUPPORTED", "SVC_TIME_DEST_UNSUPPORTED", "DYNAMIC_MPR"]),
              help="A cap of the destination's QP (mrc.h's enum mrc_qp_cap; repeatable): TRIM_NACK_DEST_UNSUPPORTED, "
                   "it sends no TRIM NACKs (a trimmed packet is a loss to the requester); SVC_TIME_DEST_UNSUPPORTED, "
                   "its ACKs report no service time. Emulated clock.")
@click.option("--mtu", type=int, default=4096, show_default=True, help="Payload bytes per packet (path MTU).")
@click.option("--format", "ev_format", type=click.Choice(["SRV6", "SRV6_USID", "UDP", "STEV"]),
              default="SRV6", show_default=True,
              help="EV format on the wire (UDP and STEV need plain IPv6 routing: up --routing static).")
@click.option("--ev-min-active", type=int, default=1, show_default=True,
              help="Never mark so many EVs ASSUMED_BAD that fewer than this stay GOOD.")
@click.option("--imm", type=int, default=None, help="Send a WRITE_WITH_IMM with this 32-bit immediate.")
@click.option("--recvs", type=click.IntRange(0, 1 << 20), default=None,
              help="Receives DST posts before the WRITE (default: 1 with --imm, else 0). MRC has no RNR: a "
                   "WRITE_WITH_IMM that finds none fails the QP (try --imm 7 --recvs 0).")
@click.option("--ack-timeout-exp", type=click.IntRange(0, 24), default=14, show_default=True,
              help="t in ACK timeout = 1.024 us x 2^t (14: 16.8 ms).")
@click.option("--retry-exp", type=click.IntRange(0, 25), default=4, show_default=True,
              help="Retries with doubling timeout after the 7 linear ones (25 = infinite).")
@click.option("--workers", type=click.IntRange(1, 256), default=None,
              help="Endpoint worker processes serving the hosts (default: one per CPU).")
@click.option("--time-dilation", "dilation", type=click.FloatRange(1.0, 10_000.0), default=1.0, show_default=True,
              help="K: the transport's clock runs K times slower than wall time (link rates shaped to rate/K); "
                   "times and rates are reported in emulated time.")
@click.option("--clock", type=click.Choice(["emulated", "virtual"]), default="emulated", show_default=True,
              help="emulated: on a running fabric, in wall time (root). virtual: the same transport over a model of "
                   "the topology in virtual time, no fabric and no root needed (docs/virtual.md).")
@click.option("--topology", "-t", default=None, help="Virtual clock: the topology, a file or a built-in name "
              "(default: default).")
@click.option("--seed", type=int, default=None, help="Virtual clock: the seed of every random choice (default 0): "
              "the same seed gives the same run.")
@click.option("--fault", "faults", multiple=True, metavar="'KIND LINK [VALUE] at WHEN [for D]'",
              help="Virtual clock: a fault on a link, e.g. 'blackhole p0l0 p0s1 at 0.3', 'loss p0l0->p0s1 5% at 1ms', "
                   "'degrade p0l1 p0s0 0.25 at 0.3', 'delay p0l0 p0s1 50us at 0.5', 'down h0 p0l0 at 2ms for 1ms' "
                   "(WHEN: a fraction of the bytes acknowledged, or a virtual time). Repeatable.")
@click.option("--link-delay", default=None, help="Virtual clock: each link's propagation delay (default 1us).")
@NAME_OPTION
@JSON_OPTION
@friendly
def send(src: str, dst: str, size: int, evs: str | None, ev_profile: str | None, cc: str, cc_config: str | None,
         qp_caps: tuple[str, ...], mtu: int, ev_format: str,
         ev_min_active: int, imm: int | None, recvs: int | None, ack_timeout_exp: int, retry_exp: int,
         workers: int | None, dilation: float, clock: str, topology: str | None, seed: int | None,
         faults: tuple[str, ...], link_delay: str | None, name: str, as_json: bool) -> None:
    """RDMA WRITE from SRC to a buffer at DST, sprayed over the EVs; verify by SHA-256.

    Starts the responder in DST's namespace and the requester in SRC's, on a running fabric; with
    --clock virtual, both over a model of the topology in virtual time instead (no root).
    Exit code 1 if the transfer fails or the placed bytes differ from the source.
    """
    from ..api.files import load as load_profile
    from ..api.qp import QpCap
    from ..experiments.runtime.spec import TransferError
    from ..experiments.runtime.transfer import send as run_send
    from ..fabric import routing, static_routes
    from ..fabric.running import Fabric
    from ..topology.evs import EvFormat
    from ..transport.config import QpConfig

    source = click.get_current_context().get_parameter_source
    if ev_profile is not None:
        given = [f"--{option.replace('_', '-')}" for option in ("evs", "ev_format", "ev_min_active")
                 if source(option) is not click.core.ParameterSource.DEFAULT]
        if given:
            raise click.UsageError(f"--ev-profile names the EVs, their format and ev_min_active itself: not with "
                                   f"{', '.join(given).replace('--ev-format', '--format')}")
        loaded = load_profile(ev_profile)  # before the fabric: a bad file is one line naming it and the field
    cc_fields = _cc_config(cc, cc_config) if cc_config is not None else None
    if problem := memory_problem(size, available_memory()):
        raise TransferError(problem)  # up front: short of memory, a worker fails or is killed mid-run
    virtual_only = [f"--{o.replace('_', '-')}" for o in ("topology", "seed", "faults", "link_delay")
                    if source(o) is not click.core.ParameterSource.DEFAULT]
    if clock == "virtual":
        flags = {"dilation": "time-dilation", "cc_config": "cc-config", "qp_caps": "qp-cap"}
        emulated_only = [f"--{flags.get(o, o)}" for o in ("workers", "dilation", "name", "cc_config", "qp_caps")
                         if source(o) is not click.core.ParameterSource.DEFAULT]
        if emulated_only:
            raise click.UsageError(f"{', '.join(emulated_only)}: no meaning in virtual time (--clock virtual runs no "
                                   f"fabric and no workers; its QPs take no CC profile config or QP caps yet)")
        config = QpConfig(mtu=mtu, ack_timeout_exp=ack_timeout_exp, retry_exp=retry_exp, cnp=cc == "dcqcn")
        result = _send_virtual(src, dst, size, evs, cc, ev_format, ev_min_active, imm, recvs, config, topology,
                               seed or 0, faults, link_delay, loaded if ev_profile is not None else None, as_json)
        emit(result.to_dict(), as_json, _transfer_text(result))
        if not result.verified:
            fail(f"{src} -> {dst} not verified: {result.error or 'the placed bytes differ from the source (SHA-256)'}")
        return
    if virtual_only:
        hint = " (on a running fabric, faults are 'mrc-emu fault ...')" if "--faults" in virtual_only else ""
        raise click.UsageError(f"{', '.join(virtual_only).replace('--faults', '--fault')} needs --clock virtual{hint}")
    with Fabric.open(name) as fabric:
        count = len(evs_between(fabric.topology, src, dst))
        wire = loaded.fmt.mode.name if ev_profile is not None else ev_format
        if wire in ("UDP", "STEV") and not (routing.running(fabric) or static_routes.installed(fabric)):
            raise click.UsageError(f"{'a ' + wire + ' EV profile' if ev_profile else '--format ' + wire} needs plain "
                                   f"IPv6 routing: bring the fabric up with 'mrc-emu up "
                                   f"--routing static' (or --routing bgp) (fabric {name!r} has neither)")
        selection = _ev_selection(evs, count)
        _check_imm(imm)
        config = QpConfig(mtu=mtu, ack_timeout_exp=ack_timeout_exp, retry_exp=retry_exp)
        with _progress_bar(size, f"{src} -> {dst}", as_json) as progress:
            result = run_send(fabric, src, dst, size, selection, cc, mtu, EvFormat(ev_format), ev_min_active, imm,
                              config, on_progress=progress, workers=workers, dilation=dilation, recvs=recvs,
                              ev_profile=loaded if ev_profile is not None else None, cc_config=cc_fields,
                              qp_caps=sum(int(QpCap[name]) for name in set(qp_caps)))
    emit(result.to_dict(), as_json, _transfer_text(result))
    if not result.verified:
        fail(f"{src} -> {dst} not verified: {result.error or 'the placed bytes differ from the source (SHA-256)'}")


def _cc_config(cc: str, text: str) -> dict:
    """--cc-config NAME=VALUE,...: the fields by name, numbers, checked against the CC's profile fields."""
    from ..api import cc as api_cc
    from ..api.errors import MrcApiError
    from ..experiments.runtime.hostctl import ALGORITHM

    fields = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        try:
            if not sep:
                raise ValueError
            fields[name.strip()] = int(value, 0) if value.strip().lstrip("-").isdigit() else float(value)
        except ValueError:
            raise click.BadParameter(f"{item!r} is not NAME=NUMBER", param_hint="--cc-config") from None
    try:
        return api_cc.check_config(ALGORITHM[cc], fields)
    except MrcApiError as exc:
        raise click.BadParameter(f"--cc {cc}: {exc}", param_hint="--cc-config") from None


def _check_imm(imm: int | None) -> None:
    if imm is not None and not 0 <= imm <= 0xFFFFFFFF:
        raise click.BadParameter("--imm must fit in 32 bits")


@contextlib.contextmanager
def _progress_bar(size: int, label: str, as_json: bool):
    """A progress bar on stderr (shown on a terminal, never with --json); yields the
    `on_progress(acked, total)` a transfer calls as bytes are acknowledged."""
    with click.progressbar(length=size, label=label, file=sys.stderr, show_pos=False,
                           hidden=as_json or not sys.stderr.isatty()) as bar:
        done = [0]

        def progress(acked: int, total: int) -> None:
            bar.update(acked - done[0])
            done[0] = acked

        yield progress


def _send_virtual(src: str, dst: str, size: int, evs: str | None, cc: str, ev_format: str, ev_min_active: int,
                  imm: int | None, recvs: int | None, config, topology: str | None, seed: int, faults: tuple[str, ...],
                  link_delay: str | None, profile, as_json: bool):
    """The WRITE in virtual time over the topology's model (experiments/runtime/virtual.py)."""
    from ..experiments.runtime.virtual import send_virtual
    from ..topology import resolve
    from ..topology.evs import EvFormat
    from ..topology.units import parse_duration_ns
    from ..vfabric.fabric import DEFAULT_LINK_DELAY_NS
    from ..vfabric.faults import FaultError, parse

    topo = resolve(topology)
    selection = _ev_selection(evs, len(evs_between(topo, src, dst)))
    _check_imm(imm)
    try:
        delay = DEFAULT_LINK_DELAY_NS if link_delay is None else parse_duration_ns(link_delay)
        parsed = [parse(line) for line in faults]
    except (FaultError, ValueError) as exc:
        raise click.BadParameter(str(exc)) from None
    with _progress_bar(size, f"{src} -> {dst} (virtual time)", as_json) as progress:
        return send_virtual(topo, src, dst, size, selection, cc, EvFormat(ev_format), ev_min_active, imm, config, recvs,
                            profile, seed, parsed, delay, on_progress=progress)


COMMANDS = [send]
