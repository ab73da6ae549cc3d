"""The sending side of an MRC QP: RDMA WRITEs segmented, sprayed over EVs, acknowledged.

Why it exists: this is MRC's sender. It segments each WRITE at the path MTU into packets
that each carry their own address (RETH), sprays them over the GOOD EVs of its EV profile
(multipath/ev.py) within the congestion window (cc/), reads ACKs and probes, and completes WRITEs
in posting order. What happened to each packet, and what to resend, is recovery.py's (a TRIM
NACK too: the trimmed packet is resent at once, on another EV); EV probes are probing.py's;
a CNP goes to the congestion control (DCQCN's reaction point). A sans-IO state machine: datagrams in (`on_datagram`), frames out
(`pump`), time passed in as `now` (ns); randomness (probe ids) from an injected source.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass

from ..api.events import EvEventQueue
from ..api.profiles import EvProfile as ApiEvProfile
from ..wire import format as fmt
from ..wire.decoder import decode_udp
from ..wire.encoder import payload_sums
from ..wire.format import AckPacket, CnpPacket, DropReason, ProbeResponsePacket, Syndrome, TrimNackPacket
from .cc.base import CongestionControl
from .cc.registry import make_cc
from .config import QpConfig, RandomBits
from .ledger import trim_repair
from .multipath.ev import EvProfile
from .multipath.evvalues import FollowedValues, ValuePaths
from .multipath.paths import Path, Send
from .probing import EvProber, ProbeBudget
from .recovery import Recovery
from .witness import Witness

try:  # the C send loop for first transmissions (optional; see _spray.c)
    from . import _spray
except ImportError:  # pragma: no cover - the extension was not built
    _spray = None

RECHECK_NS = 100_000  # a timer put off for the driver's horizon is looked at again at least this much later,
RECHECK_MAX_NS = 2_000_000  # and at most this much later (a horizon seen far behind may be a moment's lag)
PACE_DEPTH_PACKETS = 1  # a paced QP's token bucket holds this many packets' bytes beyond the one it may send at 0,
PACE_DEPTH_NS = 50_000  # or this long at its rate if more (a loop cannot wake every few us to send one packet)
# per data packet on the wire beside its payload: inner IPv6, UDP, BTH, RETH, ICRC (the outer headers per path)
DATA_OVERHEAD = fmt.IPV6_LEN + fmt.UDP_LEN + fmt.BTH_LEN + fmt.RETH_LEN + fmt.ICRC_LEN

_FATAL_NAKS = {
    Syndrome.NAK_INVALID_REQUEST: "invalid request",
    Syndrome.NAK_REMOTE_ACCESS: "remote access error (wrong R_Key, or address and length outside the registered region)",
    Syndrome.NAK_REMOTE_OPERATIONAL: "remote operational error (a WRITE_WITH_IMM found no receive posted at the "
                                     "responder: MRC has no RNR, so the QP is in error; post receives in advance)",
}


@dataclass
class WriteRequest:
    wr_id: int
    local: memoryview
    remote_va: int
    rkey: int
    imm: int | None
    sums: list[int] | None  # payload word sums for the Python encoder; None when the C one sums itself
    length: int = 0
    next_offset: int = 0
    acked: int = 0
    posted_ns: int = 0
    completed_ns: int | None = None

    def __post_init__(self) -> None:
        self.length = len(self.local)


@dataclass
class Completion:
    """A requester's WRITE whose every byte is acknowledged."""

    wr_id: int
    length: int
    time_ns: int
    imm: int | None = None


class Requester:
    """The sending side of one MRC QP."""

    def __init__(self, address: bytes, qpn: int, dest_qp: int, paths: dict[int, Path], config: QpConfig | None = None,
                 cc: CongestionControl | None = None, start_psn: int = 0, ev_min_active: int = 1,
                 c_loop: bool = True, *, random_bits: RandomBits, probe_budget: ProbeBudget | None = None,
                 ev_profile: ApiEvProfile | None = None, ev_events: EvEventQueue | None = None,
                 value_paths: ValuePaths | None = None) -> None:
        """`ev_profile`: an ONLINE api EV profile (slot i = EV i) holding the EV states, shared with its other
        QPs, and its ev_min_active (else a private one); `ev_events`: the queue for this QP's EV events;
        `value_paths`: how an EV value of that profile becomes a path: given, each EV's frames follow the value
        its slot holds (a REPLACE_EV re-paths it at the next pump; multipath/evvalues.py)."""
        if not paths:
            raise ValueError("a requester needs at least one path (EV)")
        self.address = address
        self.qpn = qpn
        self.dest_qp = dest_qp
        self.paths = dict(paths)  # its own: a REPLACE_EV re-paths this QP's EVs, not the caller's dict
        self.config = config or QpConfig()
        self.cc = cc or make_cc("nscc", self.config.mtu, self.config.cc_rate_bps, self.config.base_rtt_ns,
                                **(self.config.cc_options or {}))
        self.profile = EvProfile(sorted(paths), ev_min_active=ev_min_active, shared=ev_profile, events=ev_events)
        self.recovery = Recovery(self.config, self.profile, self.cc, start_psn)
        self.sent = self.recovery.sent
        self.prober = EvProber(qpn, dest_qp, self.paths, self.profile, self.config.probe_interval_ns, random_bits, probe_budget)
        self.witness = None  # path failures decided by witness probes (witness.py) where the QP avoids paths
        if self.config.path_avoidance:  # and spray weights that compare an EV with its plane's best
            self.profile.planes = {ev: path.plane for ev, path in self.paths.items()}
            self.witness = Witness(self.recovery, self.prober)
        self.start_psn = start_psn
        self.queue: deque[WriteRequest] = deque()  # posted, not all packets sent yet
        self.active: deque[WriteRequest] = deque()  # posted, not completed (in order)
        self.completions: list[Completion] = []
        self.error: str | None = None
        self.naks = 0
        self.trim_nacks = 0  # TRIM NACKs heard for packets of this QP
        self.cnps = 0
        self.send_failures = 0
        self.drops: Counter[str] = Counter()
        self._wr_ids = itertools.count(1)
        self._native = all(p.template.native for p in paths.values())
        # per EV: the C encoder bound to that EV's buffer for full-MTU WRITE_ONLY packets
        self._writers = {ev: p.template.writer(dest_qp, self.config.mtu, self.config.pkey)
                         for ev, p in paths.items()} if self._native else {}
        # per EV: the same template's description, which the C send loop encodes from itself
        self._heads = {ev: p.template.head(dest_qp, self.config.mtu, self.config.pkey)
                       for ev, p in paths.items()} if self._native else {}
        # the C send loop records into the sent-packet table (None: the Python loop sends every packet)
        self._spray = _spray.spray if c_loop and _spray is not None and self._heads else None
        self._last_now = 0
        # pacing (a CC profile with a rate): a token bucket in wire bytes, refilled by `now`; it may
        # go below zero by the packet that emptied it, and the next packet waits until it is back at 0
        self._frame_overhead = DATA_OVERHEAD + max(len(p.template.encap.outer) for p in paths.values())
        self._pace_tokens = math.inf  # inf: not paced
        self._pace_at = 0
        self._pace_rate: float | None = None
        # its EVs' paths as its profile's values have them (None: the paths as given, always)
        self.values = FollowedValues(self.profile.api, self.paths, value_paths) if value_paths is not None else None

    # ---- API -----------------------------------------------------------------------------

    def post_write(self, local: bytes | bytearray | memoryview, remote_va: int, rkey: int,
                   imm: int | None = None, now: int = 0) -> int:
        """Queue an RDMA WRITE (WRITE_WITH_IMM when `imm` is given); returns its wr_id."""
        view = memoryview(local).cast("B")
        if len(view) == 0:
            raise ValueError("a WRITE carries at least one byte")
        # the pure-Python encoder takes the payload word sums computed here in bulk; the C one sums itself
        sums = None if self._native else payload_sums(view, self.config.mtu)
        wr = WriteRequest(next(self._wr_ids), view, remote_va, rkey, imm, sums, posted_ns=now)
        self.queue.append(wr)
        self.active.append(wr)
        return wr.wr_id

    @property
    def done(self) -> bool:
        return self.error is not None or not self.active

    @property
    def stalled(self) -> bool:
        """Every EV is DENIED: the QP sends no data (and its WRITEs wait) until one is allowed."""
        return self.profile.stalled

    @property
    def ev_events(self):
        return self.profile.events

    @property
    def bytes_acked(self) -> int:
        return self.recovery.bytes_acked

    # ---- receiving -----------------------------------------------------------------------

    def on_datagram(self, payload: bytes | memoryview, src: bytes, sport: int, now: int, tclass: int = 0,
                    port: int = 0) -> None:
        packet = decode_udp(payload, src, self.address, sport)
        if isinstance(packet, DropReason):
            self.drops[packet.value] += 1
        elif isinstance(packet, AckPacket):
            if packet.dest_qp != self.qpn or packet.pkey != self.config.pkey:
                self.drops["unknown_qp" if packet.dest_qp != self.qpn else "bad_pkey"] += 1
            else:
                self._on_ack(packet, now)
        elif isinstance(packet, ProbeResponsePacket):
            if packet.dest_qp != self.qpn or packet.pkey != self.config.pkey:
                self.drops["unknown_qp" if packet.dest_qp != self.qpn else "bad_pkey"] += 1
            elif (why := self.prober.on_response(packet, now)) is not None:
                self.drops[why] += 1
        elif isinstance(packet, (TrimNackPacket, CnpPacket)):
            if packet.dest_qp != self.qpn or packet.pkey != self.config.pkey:
                self.drops["unknown_qp" if packet.dest_qp != self.qpn else "bad_pkey"] += 1
            elif isinstance(packet, CnpPacket):
                self.cnps += 1
                self.cc.on_cnp(now)
            elif packet.ev not in self.profile.evs:
                self.drops["trim_unknown_ev"] += 1
            elif self.recovery.on_trimmed(packet, now):
                self.trim_nacks += 1
            else:
                self.drops["trim_unknown_psn"] += 1
        else:
            self.drops["unexpected_data"] += 1

    def _on_ack(self, ack: AckPacket, now: int) -> None:
        if not self.recovery.in_range(ack):
            self.drops["ack_out_of_range"] += 1
            return
        if ack.is_nak:
            self.naks += 1
            meaning = _FATAL_NAKS.get(ack.syndrome)
            if meaning is not None:
                self.error = f"the responder refused the WRITE at PSN {ack.psn}: {meaning}"
                return
        self.recovery.on_ack(ack, now)
        self._complete(now)

    def _complete(self, now: int) -> None:
        """Complete, in posting order, every WRITE whose bytes are all acknowledged."""
        active = self.active
        while active and active[0].acked >= active[0].length:
            wr = active.popleft()
            wr.completed_ns = now
            self.completions.append(Completion(wr.wr_id, wr.length, now, wr.imm))

    # ---- sending -------------------------------------------------------------------------

    def pump(self, now: int, send: Send, clock: Callable[[], int] | None = None, horizon: int | None = None) -> None:
        """Send what is due: timeouts' consequences, EV probes, then data while the window allows.

        `clock`, when given, stamps each data packet with its own send time (a burst of 32 full
        packets takes about 0.3 ms over sockets, which would otherwise skew RTT samples by as
        much), or, for a batch the C loop hands to a batch sender at once, the batch's; without it
        every packet of the burst is stamped `now` (virtual time).
        `horizon`, when given, is the time up to which the driver has seen everything that
        arrived anywhere in the emulation: loss timers are judged at min(now, horizon).
        A CC profile with a pacing rate (DCQCN) gets no more than that rate in wire bytes: a
        token bucket of a packet or two (or PACE_DEPTH_NS at the rate), refilled by `now`, caps
        each burst, and `next_wakeup` says when the next packet may go."""
        self._last_now = now
        self.profile.sync(now)  # what the QPs sharing its EV profile, or the controller, changed since
        if self.values is not None and self.values.changed:
            self._repath(self.values.follow(now))
        self.recovery.horizon = horizon
        if self.error is not None:
            return
        self.error = self.recovery.on_timer(now)
        if self.error is not None:
            return
        if self.witness is not None:
            self.witness.pump(now, send, clock)
        if self.config.path_avoidance and self.prober.paths and self.profile.any_assumed_bad():
            self.prober.send_due(now, send)
        if self.profile.stalled:
            return  # DENIED EVs never carry data
        # the data path: locals only, one frame per iteration (this loop sets the packet rate)
        cfg, rec = self.config, self.recovery
        table = rec.sent
        mtu, burst, pkey, dest_qp, every = cfg.mtu, cfg.burst, cfg.pkey, self.dest_qp, cfg.ack_req_every
        tokens, overhead = self._refill(now), self._frame_overhead
        cwnd = self.cc.cwnd
        window_end = rec.una + cfg.window
        pick, paths, pkts, flight, retx = self.profile.pick, self.paths, table.pkts, table.flight, table.retx
        record, new_pkt, cc_sent = table.record, table.new, self.cc.on_sent
        evs, queue, writers, heads, spray = self.profile.evs, self.queue, self._writers, self._heads, self._spray
        sent = 0
        next_psn = rec.next_psn
        # UEC's CanSend (uet-htsim's can_send_NSCC): a packet goes only if it fits the window whole,
        # bytes in flight + its length <= cwnd, the resend at the head of the queue included
        while sent < burst and tokens >= 0:
            if retx:
                pkt = pkts.get(retx[0])
                if pkt is None or pkt.psn in flight:
                    retx.popleft()
                    continue  # delivered after all, or already resent
                if table.bytes_in_flight + pkt.length > cwnd:
                    break
                retx.popleft()
                ev = pick(pkt.ev)
                evs[ev].retransmits_sent += 1
            elif queue and next_psn < window_end:
                wr = queue[0]
                offset = wr.next_offset
                length = wr.length - offset
                if length > mtu:
                    length = mtu
                if table.bytes_in_flight + length > cwnd:
                    break
                if spray is not None:  # a run of full-MTU first transmissions, in C (the same gate)
                    schedule, cursor = self.profile.schedule_at()
                    budget = burst - sent
                    if tokens != math.inf:  # paced: as many full packets as the bucket allows
                        budget = min(budget, int(tokens // (mtu + overhead)) + 1)
                    n, next_psn, table.bytes_in_flight, cursor, failed, counts = spray(
                        table, heads, paths, mtu, wr, send, now, next_psn, window_end, budget,
                        table.bytes_in_flight, cwnd, schedule, cursor, clock, cc_sent, every)
                    tokens -= n * (mtu + overhead)
                    self.profile.advance(cursor)
                    for ev, count in counts.items():
                        evs[ev].packets_sent += count
                        table.ev_flight[ev] += count * mtu
                    sent += n
                    if wr.next_offset >= wr.length:
                        queue.popleft()
                    if failed is not None:  # at the refused packet's stamp (the last one recorded), as below
                        self._send_failed(failed, pkts[next_psn - 1].sent_ns)
                    if n:
                        continue
                wr.next_offset = offset + length
                last = wr.next_offset >= wr.length
                if last:
                    queue.popleft()
                pkt = new_pkt(next_psn, wr, offset, length, last)
                next_psn += 1
                ev = pick()
            else:
                break
            wr, offset, length = pkt.wr, pkt.offset, pkt.length
            path = paths[ev]
            last = pkt.last
            # a full window waits for no delayed ACK
            ack_req = last or pkt.tx > 0 or table.bytes_in_flight + 4 * length > cwnd or (
                every > 0 and (pkt.psn % every == every - 1 or pkt.psn + 1 >= window_end))
            if length == mtu and writers and (not last or wr.imm is None):
                frame = writers[ev]((ack_req << 31) | (pkt.psn & 0xFFFFFF), wr.remote_va + offset, wr.rkey, None,
                                    wr.local[offset:offset + length])
            else:
                frame = path.template.write(dest_qp, pkt.psn & 0xFFFFFF, wr.remote_va + offset, wr.rkey,
                                            wr.local[offset:offset + length],
                                            None if wr.sums is None else wr.sums[offset // mtu], ack_req,
                                            wr.imm if last else None, pkey)
            began = now if clock is None else clock()
            accepted = send(frame, path)
            # stamped once the kernel has it: a worker taken off the CPU inside the send would
            # otherwise age the packet by as long, and its ACK timeout would fire on the emulator's
            # wait; its RTT is taken from when the send began (recovery.rtt_sample)
            stamp = now if clock is None else clock()
            record(pkt, ev, stamp, began)
            evs[ev].packets_sent += 1
            cc_sent(stamp, ev, length)
            sent += 1
            tokens -= length + overhead
            if not accepted:
                self._send_failed(ev, stamp)
        rec.next_psn = next_psn
        self._pace_tokens = tokens
        if sent:
            rec.ledger.started(now)

    def _repath(self, evs: list[int]) -> None:
        """EVs whose path `values` rebuilt (in `paths`, the prober's too): the C loop's heads and writers with it."""
        for ev in evs:
            if self._native:
                self._writers[ev] = self.paths[ev].template.writer(self.dest_qp, self.config.mtu, self.config.pkey)
                self._heads[ev] = self.paths[ev].template.head(self.dest_qp, self.config.mtu, self.config.pkey)
        self._frame_overhead = DATA_OVERHEAD + max(len(p.template.encap.outer) for p in self.paths.values())
        if self.witness is not None:
            self.profile.planes = {ev: path.plane for ev, path in self.paths.items()}
            self.witness.replan()

    def _refill(self, now: int) -> float:
        """The pacing bucket at `now` (inf when the CC profile does not pace)."""
        self.cc.advance(now)
        rate = self._pace_rate = self.cc.pacing_rate_bps
        if rate is None:
            self._pace_at = now
            return math.inf
        cost = self.config.mtu + self._frame_overhead
        depth = max(PACE_DEPTH_PACKETS * cost, rate * PACE_DEPTH_NS / 8e9)
        tokens = min(depth, self._pace_tokens + (now - self._pace_at) * rate / 8e9)
        self._pace_at = now
        return 0.0 if -1e-6 < tokens < 0 else tokens  # refills split over several pumps add up to rounding

    def _send_failed(self, ev: int, now: int) -> None:
        """A frame never left (the host's own port is down): count it against the EV now. The
        packet stays in flight, so the ACK timeout resends it and spends its retries."""
        self.send_failures += 1
        if self.config.path_avoidance:
            self.profile.on_lost(ev, now, "no route out of the host")

    def _can_send(self) -> bool:
        """Whether `pump` would send now: the packet it takes next fits the window whole (a
        trimmed packet's resend too: it goes first once the window has room for it)."""
        if self.error is not None or self.profile.stalled:
            return False
        table, rec = self.sent, self.recovery
        for psn in table.retx:
            pkt = table.pkts.get(psn)
            if pkt is not None and pkt.psn not in table.flight:
                return table.bytes_in_flight + pkt.length <= self.cc.cwnd
        if not self.queue or rec.next_psn >= rec.una + self.config.window:
            return False
        wr = self.queue[0]
        return table.bytes_in_flight + min(self.config.mtu, wr.length - wr.next_offset) <= self.cc.cwnd

    def next_wakeup(self) -> int | None:
        if self.error is not None:
            return None
        wakes = []
        if self._can_send():
            if self._pace_tokens >= 0:
                return self._last_now
            # paced: when the bucket is back at zero, or sooner if the profile's rate climbs first
            wakes.append(self._pace_at + math.ceil(-self._pace_tokens * 8e9 / self._pace_rate))
            if (climb := self.cc.next_timer()) is not None:
                wakes.append(max(climb, self._last_now))
        if (deadline := self.recovery.next_deadline()) is not None:
            if deadline <= self._last_now:
                # due already but put off: the emulation had seen only up to `known`, and its
                # horizon moves no faster than time, so it cannot reach the deadline sooner
                known = self.recovery.decide_at(self._last_now)
                deadline = self._last_now + min(max(RECHECK_NS, deadline - known), RECHECK_MAX_NS)
            wakes.append(deadline)
        if self.config.path_avoidance and (probe := self.prober.next_wakeup()) is not None:
            wakes.append(probe)
        if self.witness is not None and (witness := self.witness.next_wakeup(self._last_now)) is not None:
            wakes.append(witness)
        return min(wakes) if wakes else None

    # ---- reports -------------------------------------------------------------------------

    @property
    def packets_sent(self) -> int:
        return sum(s.packets_sent for s in self.profile.evs.values())

    @property
    def retransmits(self) -> int:
        return sum(s.retransmits_sent for s in self.profile.evs.values())

    def summary(self) -> dict:
        """QP-wide counters (per-EV ones are in the profile)."""
        rec = self.recovery
        return {"packets_sent": self.packets_sent, "retransmits": self.retransmits, "bytes_acked": rec.bytes_acked,
                "duplicates_acked": rec.duplicates_acked, "naks": self.naks, "timeouts": rec.timeouts,
                "lost_by": dict(rec.lost_by),  # packets declared lost, by the rule that found them (loss.py)
                "send_failures": self.send_failures, "trim_nacks": self.trim_nacks, "cnps": self.cnps,
                "trim_repair": trim_repair(rec.ledger.trim_repairs),
                "trim_repairs": [list(r) for r in rec.ledger.trim_repairs],  # (repair, srtt then, until its NACK), ns
                "probes_sent": self.prober.probes_sent,
                "probes_returned": self.prober.probes_returned, "probes_paced": self.prober.probes_paced,
                "probe_answers": {ev: a.to_dict() for ev, a in sorted(self.prober.answers.items())},
                "witness": None if self.witness is None else self.witness.summary(),
                "cwnd": int(self.cc.cwnd), "cc_decreases": self.cc.decreases, "stalled": self.stalled, "timers_deferred": rec.deferred,
                "psns_sent": rec.next_psn - self.start_psn, "psns_acked": rec.una - self.start_psn}

    def ev_bytes_in_flight(self, ev: int) -> int:
        return self.sent.ev_flight[ev]
