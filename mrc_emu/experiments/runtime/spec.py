"""A transfer as it is asked for and as it came out, and what a run makes of the asking.

Why it exists: a WRITE is the same whether the namespace fabric's workers carry it
(transfer.py) or the virtual fabric does (virtual.py): a `TransferSpec` names it, the spec is
checked and prepared the same way (a UDP EV without path avoidance, an EV profile loaded), its
paths come from the topology or its EV profile, its CC profile is configured from the fabric's
link rate and base RTT, and its `TransferResult` (goodput, per-EV share, EV events, both
SHA-256s) is made from the endpoints' reports by one function, so the two clocks give results
of one schema.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from ...api.files import ProfileFile
from ...api.files import load as load_profile
from ...api.formats import EvFormatMode
from ...topology import Topology
from ...topology.evs import EvFormat
from ...transport.cc.nscc import max_wnd_for
from ...transport.config import QpConfig
from ...transport.multipath.evpaths import ProfileQpPaths, profile_paths
from ...transport.multipath.evvalues import ValuePaths, value_paths
from ...transport.multipath.paths import QpPaths, qp_paths


class TransferError(RuntimeError):
    """A transfer could not be set up or run (bad arguments, no progress in time): raised by the
    spec checks here, by transfer.py and by stev.py (which import it from here, not each other),
    and turned into one line by the CLI."""


@dataclass
class TransferSpec:
    src: str
    dst: str
    size: int
    evs: list[int] | None = None
    ev_format: EvFormat = EvFormat.SRV6
    config: QpConfig = field(default_factory=QpConfig)
    cc: str = "nscc"
    ev_min_active: int = 1
    imm: int | None = None
    label: str = ""
    start_at: float | None = None  # start when the other transfers reach this progress (competing flows)
    recvs: int | None = None  # receives the destination posts first (None: one for a WRITE_WITH_IMM, else none)
    # an OCP EV profile (loaded, or its file; SRV6, STEV or UDP) whose EVs the QP sprays over instead of `evs`
    # and `ev_format`; its ev_min_active is the QP's (evpaths.py), and the source's controller holds it (by id)
    ev_profile: ProfileFile | str | None = None
    stev_values: list[int | tuple[int, int]] | None = None  # EvFormat.STEV: EV i's value [, port] (paths.stev_paths)
    # the QP's CC profile config (hostctl.py): NSCC's mrc_ctl_cc_nscc_cfg fields or DCQCN's parameters, by name
    cc_config: dict[str, Any] | None = None
    qp_caps: int = 0  # the destination QP's api.QpCap bits (TRIM_NACK_DEST_UNSUPPORTED: no TRIM NACKs, ...)


@dataclass
class TransferResult:
    ok: bool
    error: str | None
    src: str
    dst: str
    size: int
    mtu: int
    ev_format: str
    cc: str
    evs: list[int]
    start_ns: int
    end_ns: int
    completion_ms: float | None
    goodput_gbps: float | None
    goodput_pps: float | None
    sha256_source: str
    sha256_placed: str | None
    requester: dict[str, Any]
    responder: dict[str, Any]
    per_ev: list[dict[str, Any]]
    ev_events: list[dict[str, Any]]
    timeline: list[tuple[int, int]]  # (ns since start, bytes acknowledged so far), every ~1 ms
    imm_completions: list[dict[str, Any]] = field(default_factory=list)
    label: str = ""
    ev_timeline: list[tuple[int, list[int], list[int]]] = field(default_factory=list)  # (ns, sent, delivered per EV)
    emulation: dict[str, Any] | None = None  # the run's emulation report (send), see emulation.py
    ledger: dict[str, Any] = field(default_factory=dict)  # the requester's progress gaps and loss repairs (ns since start)
    ev_ops: list[dict[str, Any]] = field(default_factory=list)  # the controller's changes: time_ms, deny, allow, per-EV sent
    ev_profile: str | None = None  # the EV profile file the QP's EVs came from (EV = its slot), if any
    base_rtt: dict[str, Any] | None = None  # what its CC was told: {"ns": base RTT or None (unknown), "source"}
    virtual: dict[str, Any] | None = None  # a virtual-time run's model, counters and speed (virtual.py)

    @property
    def verified(self) -> bool:
        return self.ok and self.sha256_placed == self.sha256_source

    def to_dict(self, timeline: bool = False) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k not in ("timeline", "ev_timeline", "ledger")}
        out["verified"] = self.verified
        if timeline:
            out["timeline"] = [[round(t / 1e6, 3), b] for t, b in self.timeline]
        return out


def prepared_specs(specs: list[TransferSpec]) -> list[TransferSpec]:
    """The specs as a run carries them out (the caller's stay as they were): checked (TransferError),
    a UDP EV's QP without path avoidance (its EV is whatever path the fabric's ECMP hash picks: no
    EV states, no probes), an EV profile loaded, its ev_min_active the QP's."""
    for spec in specs:
        if spec.size <= 0:
            raise TransferError(f"size must be at least one byte, not {spec.size}")
    if all(s.start_at is not None for s in specs):
        raise TransferError("at least one transfer must start at once")
    specs = [_with_profile(s) for s in specs]
    return [replace(s, config=replace(s.config, path_avoidance=False)) if s.ev_format is EvFormat.UDP else s
            for s in specs]


def _with_profile(spec: TransferSpec) -> TransferSpec:
    """A spec on an EV profile: the profile loaded, its ev_min_active the QP's, the format its carriers'."""
    if spec.ev_profile is None:
        return spec
    if spec.evs is not None:
        raise TransferError("an EV profile names the EVs itself: give it or a selection of EVs, not both")
    profile = load_profile(spec.ev_profile) if isinstance(spec.ev_profile, str) else spec.ev_profile
    ev_format = {EvFormatMode.SRV6: EvFormat.SRV6_USID, EvFormatMode.STEV: EvFormat.STEV,
                 EvFormatMode.UDP: EvFormat.UDP}[profile.fmt.mode]
    return replace(spec, ev_profile=profile, ev_format=ev_format, ev_min_active=profile.profile.ev_min_active)


def plan_paths(topo: Topology, spec: TransferSpec) -> QpPaths:
    """The QP's paths: from its EV profile, or the topology's EVs in its format."""
    if isinstance(spec.ev_profile, ProfileFile):
        return profile_paths(topo, spec.ev_profile, spec.src, spec.dst, spec.config.trimmable)
    return qp_paths(topo, spec.src, spec.dst, spec.ev_format, spec.evs, spec.config.trimmable, spec.stev_values)


def plan_values(topo: Topology, spec: TransferSpec) -> ValuePaths:
    """How the QP's requester makes a path of an EV value of its profile (evvalues.py): in its EV profile's
    format mode, or its topology EV format's."""
    mode = spec.ev_profile.fmt.mode if isinstance(spec.ev_profile, ProfileFile) else spec.ev_format
    return value_paths(topo, spec.src, spec.dst, mode, spec.config.trimmable)


def result_of(spec: TransferSpec, paths: QpPaths, req: dict, resp: dict, kernel_udp: dict[str, int], unknown_qp: int,
              placed: str, base_rtt: dict[str, Any] | None = None) -> TransferResult:
    """A transfer's result from what its requester and responder reported (qps.WriteJob.report,
    qps.responder_report), the destination's kernel UDP drops and datagrams for no QP, the
    SHA-256 of the placed bytes, and what its CC was told of the base RTT (`base_rtt`)."""
    ok = req["error"] is None and req["completed_ns"] is not None
    elapsed = req["completed_ns"] - req["start_ns"] if ok else None
    packets = -(-spec.size // spec.config.mtu)
    per_ev = []
    for entry in req["per_ev"]:
        ev = next(e for e in paths.evs if e.index == entry["ev"])
        per_ev.append({**entry, "plane": ev.plane, "spine": ev.spine,
                       "first_hop": entry.get("first_hop", paths.forward[ev.index].first_hop)})
    return TransferResult(
        ok=ok, error=req["error"] or (None if ok else "the transfer was stopped before it completed"),
        src=spec.src, dst=spec.dst, size=spec.size, mtu=spec.config.mtu, ev_format=spec.ev_format.value, cc=req["cc"],
        evs=sorted(paths.forward), start_ns=req["start_ns"], end_ns=req["end_ns"],
        completion_ms=round(elapsed / 1e6, 3) if elapsed else None,
        goodput_gbps=round(spec.size * 8 / elapsed, 3) if elapsed else None,
        goodput_pps=round(packets / (elapsed / 1e9)) if elapsed else None,
        sha256_source=req["sha256_source"], sha256_placed=placed,
        requester={"stats": req["stats"], "drops": req["drops"]},
        responder={"stats": resp["stats"], "drops": resp["drops"], "reorder": resp["reorder"],
                   "kernel_udp": kernel_udp, "unknown_qp": unknown_qp},
        per_ev=per_ev, ev_events=req["ev_events"], timeline=req["timeline"],
        imm_completions=resp["imm_completions"], label=spec.label, ev_timeline=req["ev_timeline"],
        ledger=req["ledger"], ev_ops=req["ev_ops"],
        ev_profile=paths.profile if isinstance(paths, ProfileQpPaths) else None, base_rtt=base_rtt,
    )


def cc_options(cc: str, link_rate_bps: float | None, base_rtt_ns: int | None,
               plane_rate_bps: float | None = None, base_rtt_floor_ns: int = 0, unseen_ns: int = 0) -> dict | None:
    """What a QP's CC profile is configured with, beyond its link rate and base RTT (None: nothing).

    NSCC gets its MaxWnd configured (1.5 BDP of its link rate and base RTT), so that it stays put
    when RTT samples fall under that base RTT. UEC rescales MaxWnd to a new base RTT (and leaves a
    configured one open, NSCC.md), but here the samples are the network's alone (the responder's
    service time taken off): 10-60 us at time dilation 4, while the base RTT (the idle loop with
    the endpoints' answering in it, or the topology's) is what the endpoints need to close their
    loop; a window rescaled to the samples was one packet, and four senders filled half the
    bottleneck. Nothing without a link rate (unshaped) or a base RTT (not yet measured).

    `link_rate_bps` is the rate the QP sends at (a sprayed QP: its NIC's, over every plane), which
    MaxWnd covers; `plane_rate_bps`, one plane's link, is what UEC's scaling factor a is taken
    from, as uet-htsim does (initNsccParams gets the link speed; NSCC.md §11): from the NIC's rate
    every increase was twice htsim's, and a 16-to-1 incast held its median queue above Kmax.
    `base_rtt_floor_ns`: what no RTT sample takes NSCC's base_rtt under (Nscc), where known;
    `unseen_ns`: the serialisation the fabric's token-bucket ports leave out of every RTT sample,
    which NSCC adds back (Nscc), where known."""
    if cc != "nscc" or not link_rate_bps or base_rtt_ns is None:
        return None
    options = {"max_cwnd": max_wnd_for(link_rate_bps, base_rtt_ns)}
    if plane_rate_bps and plane_rate_bps != link_rate_bps:
        options["scale_rate_bps"] = plane_rate_bps
    if base_rtt_floor_ns:
        options["base_rtt_floor_ns"] = base_rtt_floor_ns
    if unseen_ns:
        options["unseen_ns"] = unseen_ns
    return options
