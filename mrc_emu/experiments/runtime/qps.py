"""The QPs of one WRITE, made, posted, followed and reported the one way, whoever drives them.

Why it exists: a transfer's two QPs are built the same whether an endpoint worker drives them
over sockets (worker.py) or the virtual fabric's engine does (virtual.py): the destination
registers a buffer and accepts the QP through its host's OCP controller (hostctl.py: INIT ->
RTR on the EV profile of its ACK paths, receives posted); the source's QP goes RST -> RTS on
its EV and CC profiles and its requester takes the transport config the api gives; the WRITE
is posted against max_wimm; a timeline of bytes acknowledged (and per-EV packets) is sampled
every tick; the requester's and the responder's figures are reported in the shape
transfer.py's results read. The driver gives the randomness (R_Keys, probe ids) and the time.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any

from ...api.formats import EvFormatMode
from ...api.qp import WrOpcode
from ...transport.cc.registry import make_cc
from ...transport.config import QpConfig, RandomBits
from ...transport.multipath.evvalues import ValuePaths
from ...transport.multipath.paths import Path
from ...transport.requester import Requester
from ...transport.responder import Responder
from .hostctl import HostControl

TIMELINE_TICK_NS = 1_000_000  # goodput timeline resolution (transport time)
EV_TIMELINE_EVERY = 5  # per-EV packet counters every 5 timeline ticks
EV_TIMELINE_JOBS = 4  # ... of the first few WRITEs only (the report plots the first)


def since(ledger: dict, start_ns: int) -> dict:
    """A requester's ledger (transport/ledger.py) with its times made relative to the job's start,
    as its timeline and EV events are (EVs stay as they are: the first field of each repair)."""
    last = ledger["last_progress"]
    return {"gaps": [[a - start_ns, b - start_ns] for a, b in ledger["gaps"]],
            "last_progress": None if last is None else last - start_ns,
            "repairs": [[ev, *(t - start_ns for t in rest)] for ev, *rest in ledger["repairs"]],
            "unrepaired": [[ev, *(t - start_ns for t in rest)] for ev, *rest in ledger["unrepaired"]]}


def accept_write(mux: Any, control: HostControl, key: int, size: int, qpn: int, peer_qpn: int, start_psn: int,
                 back: dict[int, Path], peer: str, config: QpConfig, recvs: int,
                 random_bits: RandomBits, mode: EvFormatMode | None = None, caps: int = 0) -> tuple[Responder, Any]:
    """At the destination host (`mux`, its controller `control`): register `size` bytes for
    transfer `key` (its own protection domain) and accept the QP that writes them, with `recvs`
    receives posted and its QP caps `caps` (api.QpCap: without TRIM NACKs or service times, as
    the header's *_DEST_UNSUPPORTED say); (the responder, its memory region)."""
    _, config = control.responder_qp(peer, back, config, recvs, mode, caps)  # INIT -> RTR, receives posted
    responder = Responder(mux.address, config, random_bits=random_bits)
    region = responder.register(bytearray(size), va=0x1000_0000 + (key << 36), pd=key)
    responder.accept(qpn, peer_qpn, start_psn, back, peer=ipaddress.IPv6Address(peer).packed, pd=key)
    responder.post_recv(qpn, recvs)
    mux.add(qpn, responder)
    return responder, region


@dataclass
class WriteJob:
    """One WRITE at its source: the requester, its bytes, and what is recorded while it runs."""

    key: int
    host: str
    requester: Requester
    data: bytes
    region: dict[str, Any]
    imm: int | None
    sha256_source: str
    api_qp: Any = None  # its api.Qp (hostctl.py): RTS, the WRs posted on it counted against max_wimm
    start_ns: int = 0
    end_ns: int | None = None
    timeline: list[tuple[int, int]] = field(default_factory=list)
    ev_timeline: list[tuple[int, list[int], list[int]]] = field(default_factory=list)  # (ns, sent, delivered per EV)
    ev_ops: list[dict[str, Any]] = field(default_factory=list)  # the controller's changes, with per-EV packets sent then

    def post(self, now: int) -> None:
        """Post the WRITE (a WRITE_WITH_IMM with an immediate) at `now`."""
        self.start_ns = now
        self.api_qp.post_send(WrOpcode.RDMA_WRITE if self.imm is None else WrOpcode.RDMA_WRITE_WITH_IMM)  # max_wimm
        self.requester.post_write(self.data, self.region["va"], self.region["rkey"], self.imm, now=now)

    def sample(self, now: int) -> bool:
        """One timeline tick at `now`; True once the WRITE is done (then `end_ns` is set)."""
        r = self.requester
        # a WRITE's last sample is at its completion, not at the tick that noticed it
        at = min(now, r.completions[-1].time_ns) if r.done and r.completions and r.error is None else now
        self.timeline.append((at - self.start_ns, r.bytes_acked))
        if self.key < EV_TIMELINE_JOBS and len(self.timeline) % EV_TIMELINE_EVERY == 1:
            evs = r.profile.evs.values()
            self.ev_timeline.append((now - self.start_ns, [e.packets_sent for e in evs],
                                     [e.packets_delivered for e in evs]))
        if r.done:
            self.end_ns = now
        return r.done

    def set_ev_states(self, deny: tuple[int, ...], allow: tuple[int, ...], reason: str, now: int) -> None:
        """The controller's word on this WRITE's EVs at `now`: deny these, allow those (an allowed EV
        is probed before it carries data again); recorded with the per-EV packets sent then."""
        profile = self.requester.profile
        for ev in deny:
            profile.deny(ev, now, reason)
        for ev in allow:
            profile.allow(ev, now)
        self.ev_ops.append({"time_ns": now, "deny": list(deny), "allow": list(allow), "reason": reason,
                            "sent": {str(ev): s.packets_sent for ev, s in profile.evs.items()}})  # str: as JSON has it

    def port_excluded(self, mask: int) -> set[int]:
        """Its EVs whose port (plane + 1) a port-status `mask` has disabled."""
        return {ev for ev, path in self.requester.paths.items() if not mask >> ((path.plane or 0) + 1) & 1}

    def record_port_status(self, was: int, mask: int, now: int, port_admin: Any = None) -> None:
        """Its host's port-status mask went from `was` to `mask` at `now`: the EVs that took out of
        use or gave back, with the per-EV packets sent then (the report's controller table), and
        the host controller's port admin state then (`port_admin`, HostControl.follow_ports)."""
        off, before = self.port_excluded(mask), self.port_excluded(was)
        ports = {(path.plane or 0) + 1 for path in self.requester.paths.values()}
        disabled = sorted(p for p in ports if not mask >> p & 1)
        self.ev_ops.append({"time_ns": now, "deny": sorted(off - before), "allow": sorted(before - off),
                            "reason": f"{self.host} port(s) {', '.join(map(str, disabled))} disabled" if disabled
                            else f"{self.host} ports enabled", "port_admin": port_admin,
                            "sent": {str(ev): s.packets_sent for ev, s in self.requester.profile.evs.items()}})

    def report(self, now: int) -> dict[str, Any]:
        """What the requester saw, as transfer.py's results read it (`now`: the run's end)."""
        r = self.requester
        done_ns = r.completions[-1].time_ns if r.completions and r.error is None else None
        share = r.profile.share()
        per_ev = [{**stats.to_dict(), "share": round(share[ev], 4), "bytes_in_flight": r.ev_bytes_in_flight(ev),
                   "first_hop": r.paths[ev].first_hop}  # where its value sends it now (a REPLACE_EV moves it)
                  for ev, stats in r.profile.evs.items()]
        return {
            "error": r.error, "start_ns": self.start_ns, "end_ns": self.end_ns or now,
            "completed_ns": done_ns, "sha256_source": self.sha256_source, "stats": r.summary(), "drops": r.drops,
            "per_ev": per_ev, "ev_events": [e.to_dict(self.start_ns) for e in r.ev_events],
            "timeline": self.timeline, "ev_timeline": self.ev_timeline, "cc": r.cc.name,
            "ledger": since(r.recovery.ledger.to_dict(), self.start_ns),
            "ev_ops": [{k: v for k, v in op.items() if k != "time_ns"}
                       | {"time_ms": round((op["time_ns"] - self.start_ns) / 1e6, 3)} for op in self.ev_ops],
        }


def prepare_write(mux: Any, control: HostControl, key: int, host: str, qpn: int, dest_qp: int,
                  forward: dict[int, Path], config: QpConfig, cc: str, ev_min_active: int, start_psn: int,
                  region: dict[str, Any], data: bytes, sha256_source: str, imm: int | None,
                  random_bits: RandomBits, values: ValuePaths | None = None, cc_config: dict[str, Any] | None = None,
                  ev_profile_id: int | None = None) -> WriteJob:
    """At the source host: the QP to RTS on its EV and CC profiles by id (hostctl.py; its EV
    states are its EV profile's, shared with the host's other QPs towards that peer; the EV
    profile `ev_profile_id` when given), and its requester, given the transport config the api
    gave and a CC made with the CC profile's config (`cc_config`: NSCC or DCQCN fields by name,
    over the run's own options). With `values`, the requester sends each EV on the value its
    profile holds now (a REPLACE_EV re-paths it); nothing posted yet."""
    profile, api_qp, config, profile_cc = control.requester_qp(
        next(iter(forward.values())).template.ends.dst, forward, config, cc, ev_min_active,
        values.mode if values is not None else None, cc_config, ev_profile_id)
    options = {**(config.cc_options or {}), **profile_cc}
    requester = Requester(mux.address, qpn, dest_qp, forward, config,
                          make_cc(cc, config.mtu, config.cc_rate_bps, config.base_rtt_ns, **options),
                          start_psn=start_psn, random_bits=random_bits, probe_budget=mux.probe_budget,
                          ev_profile=profile, ev_events=control.ctl.events, value_paths=values)
    mux.add(qpn, requester)
    return WriteJob(key, host, requester, data, region, imm, sha256_source, api_qp=api_qp)


def responder_report(responder: Responder) -> dict[str, Any]:
    """What a responder saw, as transfer.py's results read it."""
    return {"stats": responder.stats, "drops": responder.drops, "reorder": responder.reorder(),
            "imm_completions": [{"psn": c.psn, "imm": c.imm, "time_ns": c.time_ns} for c in responder.completions]}
