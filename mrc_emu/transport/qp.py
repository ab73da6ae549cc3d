"""MRC queue pairs: a requester that sprays RDMA WRITEs over EVs, a responder that places them.

Why it exists: this is MRC. The requester segments each WRITE at the path MTU into
packets that each carry their own address (RETH), sprays them over the GOOD EVs of its
EV profile, learns from SACKs which arrived, declares losses (RACK-style time order, and
per-EV order: a path does not reorder), resends lost packets on a different EV, marks
EVs ASSUMED_BAD and revives them with EV probes. The responder checks every packet
(QPN, P_Key, PSN window, R_Key, bounds), writes it straight into the registered buffer,
and acknowledges with a SACK bitmap over the MPR window.

Both are sans-IO state machines: datagrams in (`on_datagram`), frames out (`pump`), time
passed in as `now` (ns). mrc_emu.io drives them over memory or over sockets.
"""

from __future__ import annotations

import itertools
import os
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from ..topology.evs import ev_of_sport
from ..wire import format as fmt
from ..wire.decoder import decode_udp
from ..wire.encoder import payload_sums
from ..wire.format import AckPacket, DataPacket, DropReason, ProbePacket, Syndrome
from .cc import CcProfile, make_cc
from .ev import EvProfile, EvState
from .paths import Path, Send

try:  # the C send loop for first transmissions (optional; see _spray.c)
    from . import _spray
except ImportError:  # pragma: no cover - the extension was not built
    _spray = None

PSN_MOD = 1 << 24
HALF = 1 << 23
ACK_TIMEOUT_UNIT_NS = 1024  # the ACK timeout is 1.024 us x 2^t
INFINITE_RETRIES = 25
SAME_EV = "a later packet on the same EV arrived"
LOSS_CHECK_NS = 100_000


_FATAL_NAKS = {
    Syndrome.NAK_INVALID_REQUEST: "invalid request",
    Syndrome.NAK_REMOTE_ACCESS: "remote access error (wrong R_Key, or address and length outside the registered region)",
    Syndrome.NAK_REMOTE_OPERATIONAL: "remote operational error",
}


@dataclass
class QpConfig:
    mtu: int = 4096  # payload bytes per packet
    ack_timeout_exp: int = 14  # t: ACK timeout = 1.024 us * 2^t (14: 16.8 ms), t <= 24
    retry_linear: int = 7  # retries at the plain ACK timeout (OCP: <= 7)
    retry_exp: int = 4  # then retries with the timeout doubling each time (<= 25; 25 = infinite)
    mpr: int = 8  # max PSN range (the SACK window), in units of 128 PSNs
    ack_every: int = 32  # the responder acknowledges at least every this many data packets ...
    ack_delay_ns: int = 250_000  # ... or this long after the first packet it has not acknowledged
    probe_interval_ns: int = 1_000_000
    reorder_floor_ns: int = 500_000  # an EV's loss timer is at least this
    burst: int = 32  # packets per pump, so receiving is never starved
    pkey: int = fmt.DEFAULT_PKEY
    path_avoidance: bool = True  # False for the single-path baseline: no EV states, no probes
    recovery: str = "sack"  # "sack" (MRC: selective, per packet) or "go-back-n" (RoCEv2 RC as deployed)

    def __post_init__(self) -> None:
        if not 64 <= self.mtu <= 8192 or self.mtu % 4:
            raise ValueError(f"MTU {self.mtu}: must be a multiple of 4 between 64 and 8192")
        if not 0 <= self.ack_timeout_exp <= 24:
            raise ValueError(f"ACK timeout exponent {self.ack_timeout_exp}: must be 0..24")
        if not 0 <= self.retry_linear <= 7 or not 0 <= self.retry_exp <= INFINITE_RETRIES:
            raise ValueError("retries: linear 0..7, exponential 0..25 (25 = infinite)")
        if not 1 <= self.mpr <= 64:
            raise ValueError(f"MPR {self.mpr}: must be 1..64 (x128 PSNs)")
        if self.recovery not in ("sack", "go-back-n"):
            raise ValueError(f"recovery {self.recovery!r}: 'sack' or 'go-back-n'")

    @classmethod
    def baseline(cls, **kw) -> QpConfig:
        """RoCEv2 RC as deployed today: one path, go-back-N, no path avoidance, and the ACK
        timeout and retry count of a typical RoCE NIC set-up (t=15: 33.5 ms; 7 retries, then
        6 doubling ones: a budget of about 4.4 s, so that routing can repair the path)."""
        return cls(**{"path_avoidance": False, "recovery": "go-back-n", "ack_timeout_exp": 15, "retry_exp": 6,
                      **kw})

    @property
    def ack_timeout_ns(self) -> int:
        return ACK_TIMEOUT_UNIT_NS << self.ack_timeout_exp

    @property
    def window(self) -> int:
        return self.mpr * 128


def psn_abs(wire: int, near: int) -> int:
    """The unbounded PSN closest to `near` whose low 24 bits are `wire`."""
    diff = (wire - near) & (PSN_MOD - 1)
    if diff >= HALF:
        diff -= PSN_MOD
    return near + diff


# ---- memory --------------------------------------------------------------------------------

@dataclass
class MemoryRegion:
    """A registered buffer: remote writes land here if R_Key and bounds match and the writing QP
    belongs to the region's protection domain."""

    rkey: int
    va: int
    buffer: bytearray
    pd: int = 0
    view: memoryview = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.view = memoryview(self.buffer)

    @property
    def length(self) -> int:
        return len(self.buffer)

    def to_dict(self) -> dict:
        return {"rkey": self.rkey, "va": self.va, "length": self.length}


def new_rkey() -> int:
    return int.from_bytes(os.urandom(4), "big") or 1


# ---- requester -----------------------------------------------------------------------------

class _PyPkt:
    """One packet of a WRITE, as the requester tracks it (_spray.Pkt is the same in C)."""

    __slots__ = ("psn", "wr", "offset", "length", "ev", "sent_ns", "tx", "last")

    def __init__(self, psn: int, wr: WriteRequest, offset: int, length: int, last: bool) -> None:
        self.psn = psn
        self.wr = wr
        self.offset = offset
        self.length = length
        self.last = last
        self.ev = -1
        self.sent_ns = 0
        self.tx = 0


_Pkt = _spray.Pkt if _spray is not None else _PyPkt


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


@dataclass
class ImmCompletion:
    """A responder's WRITE_WITH_IMM whose data, and all data before it, is placed."""

    psn: int
    imm: int
    time_ns: int


class _Counts:
    """Drops by reason: counted, never raised."""

    drops: dict[str, int]

    def _drop(self, why: str) -> None:
        self.drops[why] = self.drops.get(why, 0) + 1


class Requester(_Counts):
    """The sending side of one MRC QP."""

    def __init__(self, address: bytes, qpn: int, dest_qp: int, paths: dict[int, Path],
                 probe_paths: dict[int, Path] | None = None, config: QpConfig | None = None,
                 cc: CcProfile | None = None, start_psn: int = 0, ev_min_active: int = 1,
                 c_loop: bool = True) -> None:
        if not paths:
            raise ValueError("a requester needs at least one path (EV)")
        self.address = address
        self.qpn = qpn
        self.dest_qp = dest_qp
        self.paths = paths
        self.probe_paths = probe_paths or {}
        self.config = config or QpConfig()
        self.cc = cc or make_cc("nscc", self.config.mtu)
        self.profile = EvProfile(sorted(paths), ev_min_active=ev_min_active)
        self.start_psn = start_psn
        self.next_psn = start_psn
        self.una = start_psn  # lowest PSN not known delivered (the responder's expected PSN)
        self.pkts: dict[int, _Pkt] = {}  # sent and not yet delivered
        self.flight: dict[int, None] = {}  # in flight, in order of (last) send time
        self.by_ev: dict[int, deque[tuple[int, int]]] = {k: deque() for k in paths}
        self.retx: deque[int] = deque()
        self.sacked = 0  # bit (W-1-i) <=> PSN una+i known delivered
        self.bytes_in_flight = 0
        self.rack_sent_ns = -1  # latest send time of any packet known delivered
        self.queue: deque[WriteRequest] = deque()  # posted, not all packets sent yet
        self.active: deque[WriteRequest] = deque()  # posted, not completed (in order)
        self.completions: list[Completion] = []
        self.error: str | None = None
        self.stats = {"duplicates_acked": 0, "naks": 0, "timeouts": 0, "send_failures": 0, "probes_sent": 0,
                      "probes_returned": 0}
        self.drops: dict[str, int] = {}
        self._wr_ids = itertools.count(1)
        self._probe_ids = itertools.count(int.from_bytes(os.urandom(2), "big") << 16)
        self._probes: dict[int, tuple[int, int]] = {}  # probe id -> (EV, send time)
        self._window_mask = (1 << self.config.window) - 1
        self._ev_flight: dict[int, int] = dict.fromkeys(paths, 0)  # bytes in flight per EV
        self.bytes_acked = 0
        self._gbn_timeouts = 0  # go-back-N: timeouts since the last progress
        self._loss_check_at = 0
        self._native = all(p.template.native for p in paths.values())
        # per EV: the C encoder bound to that EV's buffer for full-MTU WRITE_ONLY packets
        self._writers = {ev: p.template.writer(dest_qp, self.config.mtu, self.config.pkey)
                         for ev, p in paths.items()} if self._native else {}
        # the C send loop works on these very tables (None: qp.py's own loop sends every packet)
        self._spray_ctx = (self.pkts, self.flight, self.by_ev, self._writers, self.paths, self.config.mtu)
        self._spray = _spray.spray if c_loop and _spray is not None and self._writers else None
        self._last_now = 0

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
    def ev_events(self):
        return self.profile.events

    # ---- receiving -----------------------------------------------------------------------

    def on_datagram(self, payload: bytes | memoryview, src: bytes, sport: int, now: int) -> None:
        packet = decode_udp(payload, src, self.address, sport)
        if isinstance(packet, DropReason):
            self._drop(packet.value)
        elif isinstance(packet, AckPacket):
            if packet.dest_qp != self.qpn or packet.pkey != self.config.pkey:
                self._drop("unknown_qp" if packet.dest_qp != self.qpn else "bad_pkey")
            else:
                self._on_ack(packet, now)
        elif isinstance(packet, ProbePacket):
            self._on_probe(packet, now)
        else:
            self._drop("unexpected_data")

    def _on_probe(self, probe: ProbePacket, now: int) -> None:
        sent = self._probes.pop(probe.probe_id, None)
        if sent is None or sent[0] != probe.ev:
            self._drop("unknown_probe")
            return
        self.stats["probes_returned"] += 1
        self.profile.on_probe(probe.ev, now, now - sent[1])

    def _deliver(self, psns, seen: dict[int, list[int]]) -> int:
        """Mark PSNs delivered; per EV: [count, latest send time, that packet's transmissions].
        Returns bytes."""
        pkts, flight = self.pkts, self.flight
        acked = in_flight = 0
        for psn in psns:
            pkt = pkts.pop(psn, None)
            if pkt is None:
                continue
            length = pkt.length
            acked += length
            pkt.wr.acked += length
            if psn in flight:
                del flight[psn]
                in_flight += length
                self._ev_flight[pkt.ev] -= length
            entry = seen.get(pkt.ev)
            if entry is None:
                seen[pkt.ev] = [1, pkt.sent_ns, pkt.tx]
            else:
                entry[0] += 1
                if pkt.sent_ns > entry[1]:
                    entry[1] = pkt.sent_ns
                    entry[2] = pkt.tx
        self.bytes_in_flight -= in_flight
        return acked

    def _on_ack(self, ack: AckPacket, now: int) -> None:
        W = self.config.window
        una = self.una
        cum = psn_abs(ack.psn, una)  # every PSN up to this one has arrived
        if cum >= self.next_psn or cum < una - W - 1:
            self._drop("ack_out_of_range")
            return
        if ack.is_nak:
            self.stats["naks"] += 1
            meaning = _FATAL_NAKS.get(ack.syndrome)
            if meaning is not None:
                self.error = f"the responder refused the WRITE at PSN {ack.psn}: {meaning}"
                return
            if self.go_back_n and ack.syndrome == Syndrome.NAK_PSN_SEQUENCE:
                self._ack_cumulative(cum, now)
                self._go_back(now)
                return
        # an RTT sample from the echoed packet, if it was sent once on that EV (Karn)
        rtt = None
        sampled = None
        echo = self.pkts.get(psn_abs(ack.echo_psn, una))
        if echo is not None and echo.tx == 1 and echo.ev == ack.echo_ev:
            rtt = now - echo.sent_ns
            sampled = echo.ev
            self.profile.on_rtt(echo.ev, rtt, ack.ecn_echo)
        seen: dict[int, list[int]] = {}
        acked = 0
        if cum >= una:
            acked += self._deliver(range(una, cum + 1), seen)
            shift = cum + 1 - una
            self.sacked = (self.sacked << shift) & self._window_mask if shift < W else 0
            una = self.una = cum + 1
            self._gbn_timeouts = 0
        if ack.sack_bitmap:
            base = psn_abs(ack.sack_base, una)
            nbits = 8 * len(ack.sack_bitmap)
            bits = int.from_bytes(ack.sack_bitmap, "big") << (W - nbits) if nbits <= W else 0
            shift = base - una
            if 0 <= shift < W:
                bits >>= shift
            elif -W < shift < 0:
                bits = (bits << -shift) & self._window_mask
            else:
                bits = 0
            new = bits & ~self.sacked
            self.sacked |= bits
            psns = []
            top_psn = una + W - 1
            while new:
                top = new.bit_length() - 1
                new ^= 1 << top
                psns.append(top_psn - top)
            acked += self._deliver(psns, seen)
        self.bytes_acked += acked
        if acked == 0:
            self.stats["duplicates_acked"] += 1
        for ev, (count, latest_sent, latest_tx) in seen.items():
            self.profile.on_delivered(ev, latest_sent, count)
            if latest_sent > self.rack_sent_ns:
                self.rack_sent_ns = latest_sent
            # Every EV that delivered gets an RTT sample from its newest packet in this ACK (Karn:
            # not from a retransmission). One echo per ACK alone left EVs without any sample: the
            # ACK every 32nd packet echoes the same one or two EVs of a 8-EV schedule. The newest
            # packet of an EV arrived at most a few packets before the ACK was sent, so the
            # coalescing adds little; the echoed EV has its exact sample already.
            if latest_tx == 1 and ev != sampled:
                self.profile.on_rtt(ev, now - latest_sent, None)
        self.cc.on_ack(now, acked, rtt, ack.ecn_echo)
        self._complete(now)
        self._detect_losses(now, seen)

    def _lose(self, pkt: _Pkt, now: int, why: str) -> None:
        del self.flight[pkt.psn]
        self.bytes_in_flight -= pkt.length
        self._ev_flight[pkt.ev] -= pkt.length
        self.retx.append(pkt.psn)
        if self.config.path_avoidance:
            self.profile.on_lost(pkt.ev, now, why)
        else:
            self.profile.evs[pkt.ev].packets_lost += 1
        # An isolated loss, or one on a path that keeps delivering, is congestion: the window shrinks.
        # A run of losses on one EV is a failing path: the EV's state handles it, not the window.
        if why is SAME_EV or self.profile.evs[pkt.ev].consecutive_losses <= 1:
            self.cc.on_loss(now)

    def _front(self, ev: int) -> _Pkt | None:
        """The oldest packet still in flight on `ev` (stale entries are dropped on the way)."""
        queue = self.by_ev[ev]
        while queue:
            psn, sent = queue[0]
            pkt = self.pkts.get(psn)
            if pkt is not None and pkt.ev == ev and pkt.sent_ns == sent and psn in self.flight:
                return pkt
            queue.popleft()  # delivered, or resent elsewhere
        return None

    def ev_timer(self, ev: int) -> int:
        """How long a packet on `ev` may stay unacknowledged once later packets got through:
        srtt + 4 rttvar of that EV, as TCP's RTO (EVs differ: each plane queues on its own)."""
        s = self.profile.evs[ev]
        if s.srtt_ns:
            return max(self.config.reorder_floor_ns, int(s.srtt_ns + 4 * s.rttvar_ns))
        known = [x.srtt_ns for x in self.profile.evs.values() if x.srtt_ns]
        return max(self.config.reorder_floor_ns, int(3 * max(known))) if known else self.config.ack_timeout_ns

    def _detect_losses(self, now: int, touched=None) -> None:
        """Two rules, both per EV. (1) A path keeps order: once a later packet on the same EV is
        delivered, the earlier ones are lost. (2) A packet older than something already
        delivered (on any EV) is lost once its EV's timer has run out: how a dead path shows."""
        if self.go_back_n:
            return  # RC learns of losses only from NAKs and timeouts
        for ev in (touched if touched is not None else self.by_ev):
            delivered_up_to = self.profile.evs[ev].last_delivered_sent_ns
            while (pkt := self._front(ev)) is not None and pkt.sent_ns < delivered_up_to:
                self.by_ev[ev].popleft()
                self._lose(pkt, now, SAME_EV)
        if not self.flight:
            return
        rack = self.rack_sent_ns
        for ev in self.by_ev:
            timer = None
            while (pkt := self._front(ev)) is not None and pkt.sent_ns < rack:
                timer = timer or self.ev_timer(ev)
                if now < pkt.sent_ns + timer:
                    break
                self.by_ev[ev].popleft()
                self._lose(pkt, now, "not acknowledged while later packets were")

    def _loss_deadline(self) -> int | None:
        """When the next packet would be declared lost by rule (2), if nothing arrives."""
        deadlines = []
        for ev in self.by_ev:
            pkt = self._front(ev)
            if pkt is not None and pkt.sent_ns < self.rack_sent_ns:
                deadlines.append(pkt.sent_ns + self.ev_timer(ev))
        return min(deadlines) if deadlines else None

    # ---- sending -------------------------------------------------------------------------

    def _timeout_for(self, tx: int) -> int:
        base = self.config.ack_timeout_ns
        retries = tx - 1  # the packet's transmissions so far, less the first
        if retries <= self.config.retry_linear:
            return base
        return base << min(20, retries - self.config.retry_linear)

    def _retry_budget_spent(self, tx: int) -> bool:
        if self.config.retry_exp >= INFINITE_RETRIES:
            return False
        return tx - 1 >= self.config.retry_linear + self.config.retry_exp

    def _tries(self, pkt: _Pkt) -> int:
        """Transmissions that count against the retry budget: the packet's own under SACK; under
        go-back-N the QP's consecutive timeouts without progress (as an RC QP's retry counter)."""
        return self._gbn_timeouts + 1 if self.go_back_n else pkt.tx

    def _check_timeouts(self, now: int) -> None:
        while self.flight:
            psn = next(iter(self.flight))
            pkt = self.pkts[psn]
            tries = self._tries(pkt)
            if now < pkt.sent_ns + self._timeout_for(tries):
                break
            self.stats["timeouts"] += 1
            if self._retry_budget_spent(tries):
                evs = sorted({p.ev for p in self.pkts.values()})
                self.error = (f"retry budget spent: PSN {psn & (PSN_MOD - 1)} went unacknowledged after {tries} "
                              f"transmissions ({self.config.retry_linear} linear + {self.config.retry_exp} exponential "
                              f"retries, ACK timeout {self.config.ack_timeout_ns / 1e6:.1f} ms); "
                              f"EVs tried: {evs}. Every path to the responder seems dead.")
                return
            if self.go_back_n:
                self._gbn_timeouts += 1
                self._go_back(now)
                return
            self._lose(pkt, now, "ACK timeout")

    # ---- go-back-N (the baseline) ------------------------------------------------------

    @property
    def go_back_n(self) -> bool:
        return self.config.recovery == "go-back-n"

    def _ack_cumulative(self, cum: int, now: int) -> None:
        if cum >= self.una:
            seen: dict[int, list[int]] = {}
            self.bytes_acked += self._deliver(range(self.una, cum + 1), seen)
            self.una = cum + 1
            self._gbn_timeouts = 0
            for ev, (count, latest, _) in seen.items():
                self.profile.on_delivered(ev, latest, count)
            self._complete(now)

    def _complete(self, now: int) -> None:
        """Complete, in posting order, every WRITE whose bytes are all acknowledged."""
        active = self.active
        while active and active[0].acked >= active[0].length:
            wr = active.popleft()
            wr.completed_ns = now
            self.completions.append(Completion(wr.wr_id, wr.length, now, wr.imm))

    def _go_back(self, now: int) -> None:
        """Resend everything from the oldest unacknowledged PSN on, in order (RC's recovery)."""
        psns = sorted(p for p in self.pkts if p >= self.una)
        flight = self.flight
        for psn in psns:
            if psn in flight:
                pkt = self.pkts[psn]
                del flight[psn]
                self.bytes_in_flight -= pkt.length
                self._ev_flight[pkt.ev] -= pkt.length
                self.profile.evs[pkt.ev].packets_lost += 1
        self.retx = deque(psns)
        self.cc.on_loss(now)

    def _send_probes(self, now: int, send: Send) -> None:
        for ev, stats in self.profile.evs.items():
            if stats.state is EvState.ASSUMED_BAD and stats.probe_due_ns <= now and ev in self.probe_paths:
                stats.probe_due_ns = now + self.config.probe_interval_ns
                path = self.probe_paths[ev]
                probe_id = next(self._probe_ids) & 0xFFFFFFFF
                frame = path.template.encode(ProbePacket(self.qpn, probe_id, ev, now))
                if send(frame, path):
                    self._probes[probe_id] = (ev, now)
                    stats.probes_sent += 1
                    self.stats["probes_sent"] += 1
        if len(self._probes) > 1024:
            stale = now - 100 * self.config.probe_interval_ns
            self._probes = {k: v for k, v in self._probes.items() if v[1] > stale}

    def pump(self, now: int, send: Send, clock: Callable[[], int] | None = None) -> None:
        """Send what is due: timeouts' consequences, EV probes, then data while the window allows.

        `clock`, when given, stamps each data packet with its own send time (a burst of 32 full
        packets takes about 0.4 ms over sockets, which would otherwise skew RTT samples by as
        much); without it every packet of the burst is stamped `now` (virtual time)."""
        self._last_now = now
        if self.error is not None:
            return
        self._check_timeouts(now)
        if self.flight and now >= self._loss_check_at:  # ACKs run the checks too; the EV timers
            self._detect_losses(now)  # (>= 0.5 ms) need no finer look than this
            self._loss_check_at = now + LOSS_CHECK_NS
        if self.config.path_avoidance and self.probe_paths and self.profile.any_assumed_bad():
            self._send_probes(now, send)
        # the data path: locals only, one frame per iteration (this loop sets the packet rate)
        cfg = self.config
        mtu, burst, pkey, dest_qp = cfg.mtu, cfg.burst, cfg.pkey, self.dest_qp
        cwnd = self.cc.cwnd
        window_end = self.una + cfg.window
        pick, paths, pkts, flight, by_ev = self.profile.pick, self.paths, self.pkts, self.flight, self.by_ev
        ev_flight, evs, retx, queue = self._ev_flight, self.profile.evs, self.retx, self.queue
        writers, spray = self._writers, self._spray
        sent = 0
        bif = self.bytes_in_flight
        next_psn = self.next_psn
        while sent < burst and bif < cwnd:  # (nothing in this loop sets self.error)
            if retx:
                pkt = pkts.get(retx.popleft())
                if pkt is None or pkt.psn in flight:
                    continue  # delivered after all, or already resent
                ev = pick(pkt.ev)
                evs[ev].retransmits_sent += 1
            elif queue and next_psn < window_end:
                wr = queue[0]
                if spray is not None:  # a run of full-MTU first transmissions, in C
                    schedule, cursor = self.profile.schedule_at()
                    n, next_psn, bif, cursor, failed, counts = spray(
                        self._spray_ctx, wr, send, now, next_psn, window_end, burst - sent, bif, cwnd, schedule, cursor,
                        clock)
                    self.profile.advance(cursor)
                    for ev, count in counts.items():
                        evs[ev].packets_sent += count
                        ev_flight[ev] += count * mtu
                    sent += n
                    if wr.next_offset >= wr.length:
                        queue.popleft()
                    if failed is not None:
                        self._send_failed(failed, now if clock is None else clock())
                    if n:
                        continue
                offset = wr.next_offset
                length = wr.length - offset
                if length > mtu:
                    length = mtu
                wr.next_offset = offset + length
                last = wr.next_offset >= wr.length
                if last:
                    queue.popleft()
                pkt = pkts[next_psn] = _Pkt(next_psn, wr, offset, length, last)
                next_psn += 1
                ev = pick()
            else:
                break
            wr, offset, length = pkt.wr, pkt.offset, pkt.length
            path = paths[ev]
            last = pkt.last
            ack_req = last or pkt.tx > 0 or bif + 4 * length > cwnd  # a full window waits for no delayed ACK
            if length == mtu and writers and (not last or wr.imm is None):
                frame = writers[ev]((ack_req << 31) | (pkt.psn & 0xFFFFFF), wr.remote_va + offset, wr.rkey, None,
                               wr.local[offset:offset + length])
            else:
                frame = path.template.write(dest_qp, pkt.psn & 0xFFFFFF, wr.remote_va + offset, wr.rkey,
                                            wr.local[offset:offset + length],
                                            None if wr.sums is None else wr.sums[offset // mtu], ack_req,
                                            wr.imm if last else None, pkey)
            stamp = now if clock is None else clock()
            pkt.ev = ev
            pkt.sent_ns = stamp
            pkt.tx += 1
            evs[ev].packets_sent += 1
            sent += 1
            flight[pkt.psn] = None
            by_ev[ev].append((pkt.psn, stamp))
            bif += length
            ev_flight[ev] += length
            if not send(frame, path):
                self._send_failed(ev, stamp)
        self.bytes_in_flight = bif
        self.next_psn = next_psn

    def _send_failed(self, ev: int, now: int) -> None:
        """A frame never left (the host's own port is down): count it against the EV now. The
        packet stays in flight, so the ACK timeout resends it and spends its retries."""
        self.stats["send_failures"] += 1
        if self.config.path_avoidance:
            self.profile.on_lost(ev, now, "no route out of the host")

    def _can_send(self) -> bool:
        if self.error is not None or self.bytes_in_flight >= self.cc.cwnd:
            return False
        return bool(self.retx) or (bool(self.queue) and self.next_psn < self.una + self.config.window)

    @property
    def packets_sent(self) -> int:
        return sum(s.packets_sent for s in self.profile.evs.values())

    @property
    def retransmits(self) -> int:
        return sum(s.retransmits_sent for s in self.profile.evs.values())

    def summary(self) -> dict:
        """QP-wide counters (per-EV ones are in the profile)."""
        return {"packets_sent": self.packets_sent, "retransmits": self.retransmits, "bytes_acked": self.bytes_acked,
                **self.stats, "cwnd": int(self.cc.cwnd)}

    def ev_bytes_in_flight(self, ev: int) -> int:
        return self._ev_flight[ev]

    def next_wakeup(self) -> int | None:
        if self.error is not None:
            return None
        if self._can_send():
            return self._last_now
        wakes = []
        if self.flight:
            pkt = self.pkts[next(iter(self.flight))]
            wakes.append(pkt.sent_ns + self._timeout_for(self._tries(pkt)))
            if not self.go_back_n and (deadline := self._loss_deadline()) is not None:
                wakes.append(max(deadline, self._loss_check_at))
        if self.config.path_avoidance:
            wakes += [s.probe_due_ns for k, s in self.profile.evs.items()
                      if s.state is EvState.ASSUMED_BAD and k in self.probe_paths]
        return min(wakes) if wakes else None


# ---- responder -----------------------------------------------------------------------------

@dataclass
class _RQp:
    qpn: int
    peer_qpn: int
    peer: bytes | None  # the requester's packed address (None: accept any)
    epsn: int  # expected PSN (unbounded): everything below has arrived
    start_psn: int
    window: int
    paths_back: dict[int, Path]
    pkey: int
    pd: int = 0  # protection domain: the QP may write only regions registered in it
    received: int = 0  # bit (window-1-i) <=> PSN epsn+i arrived
    pending_imm: dict[int, int] = field(default_factory=dict)
    since_ack: int = 0
    unacked_since: int = -1  # arrival time of the first packet not yet acknowledged
    ack_due: bool = False
    nak: int | None = None  # syndrome to send with the next ACK
    nak_sent_at: int = -1  # go-back-N: the expected PSN a sequence NAK was sent for (one per gap)
    nak_psn: int = 0
    echo_psn: int = 0
    echo_ev: int = 0
    ecn: bool = False


class Responder(_Counts):
    """The receiving side: registered memory and the QPs that may write into it."""

    def __init__(self, address: bytes, config: QpConfig | None = None) -> None:
        self.address = address
        self.config = config or QpConfig()
        self.regions: dict[int, MemoryRegion] = {}
        self.qps: dict[int, _RQp] = {}
        self.completions: list[ImmCompletion] = []
        self.stats = {"packets_placed": 0, "bytes_placed": 0, "duplicates": 0, "acks_sent": 0, "naks_sent": 0}
        self.drops: dict[str, int] = {}
        self._last_now = 0

    def register(self, buffer: bytearray, va: int = 0x1000_0000, pd: int = 0) -> MemoryRegion:
        mr = MemoryRegion(new_rkey(), va, buffer, pd)
        while mr.rkey in self.regions:
            mr.rkey = new_rkey()
        self.regions[mr.rkey] = mr
        return mr

    def accept(self, qpn: int, peer_qpn: int, start_psn: int, paths_back: dict[int, Path],
               peer: bytes | None = None, pd: int = 0) -> None:
        if not paths_back:
            raise ValueError("a responder QP needs at least one path back to the requester")
        self.qps[qpn] = _RQp(qpn, peer_qpn, peer, start_psn, start_psn, self.config.window, paths_back,
                             self.config.pkey, pd)

    def on_datagram(self, payload: bytes | memoryview, src: bytes, sport: int, now: int) -> None:
        packet = decode_udp(payload, src, self.address, sport)
        if isinstance(packet, DropReason):
            self._drop(packet.value)
            return
        if not isinstance(packet, DataPacket):
            self._drop("unexpected_ack")
            return
        qp = self.qps.get(packet.dest_qp)
        if qp is None or (qp.peer is not None and qp.peer != src):
            self._drop("unknown_qp")
            return
        if packet.pkey != qp.pkey:
            self._drop("bad_pkey")
            return
        ev = ev_of_sport(sport)
        psn = psn_abs(packet.psn, qp.epsn)
        offset = psn - qp.epsn
        qp.echo_psn, qp.echo_ev, qp.ecn = packet.psn, ev, packet.ecn_ce
        if offset < 0 or (offset < qp.window and qp.received >> (qp.window - 1 - offset) & 1):
            self.stats["duplicates"] += 1
            qp.ack_due = True
            return
        if offset > 0 and self.config.recovery == "go-back-n":
            self._drop("out_of_sequence")  # RC: only the expected PSN is accepted
            if qp.nak_sent_at != qp.epsn:
                qp.nak_sent_at = qp.epsn
                self._nak(qp, Syndrome.NAK_PSN_SEQUENCE, qp.epsn - 1)
            return
        if offset >= qp.window:
            self._drop("psn_out_of_window")
            self._nak(qp, Syndrome.NAK_PSN_SEQUENCE, qp.epsn - 1)
            return
        mr = self.regions.get(packet.rkey)
        data = packet.payload
        if mr is None or mr.pd != qp.pd:  # another domain's R_Key is as invalid as an unknown one
            self._drop("bad_rkey")
            self._nak(qp, Syndrome.NAK_REMOTE_ACCESS, psn)
            return
        start = packet.va - mr.va
        if start < 0 or start + len(data) > mr.length:
            self._drop("out_of_bounds")
            self._nak(qp, Syndrome.NAK_REMOTE_ACCESS, psn)
            return
        mr.view[start:start + len(data)] = data
        self.stats["packets_placed"] += 1
        self.stats["bytes_placed"] += len(data)
        if packet.imm is not None:
            qp.pending_imm[psn] = packet.imm
        received = qp.received | (1 << (qp.window - 1 - offset))
        mask = (1 << qp.window) - 1
        run = qp.window - (~received & mask).bit_length()  # arrived in order from epsn on
        if run:
            received = (received << run) & mask
            qp.epsn += run
            if qp.pending_imm:
                for p in sorted(k for k in qp.pending_imm if k < qp.epsn):
                    self.completions.append(ImmCompletion(p & (PSN_MOD - 1), qp.pending_imm.pop(p), now))
        qp.received = received
        qp.since_ack += 1
        if qp.unacked_since < 0:
            qp.unacked_since = now
        if packet.ack_req or qp.since_ack >= self.config.ack_every:
            qp.ack_due = True

    def _nak(self, qp: _RQp, syndrome: Syndrome, psn: int) -> None:
        qp.nak, qp.nak_psn, qp.ack_due = syndrome, psn, True

    def _ack_for(self, qp: _RQp) -> AckPacket:
        bitmap = b""
        if qp.received:
            lowest = (qp.received & -qp.received).bit_length() - 1
            nbits = -(-(qp.window - lowest) // 32) * 32
            bitmap = (qp.received >> (qp.window - nbits)).to_bytes(nbits // 8, "big")
        if qp.nak is not None:
            syndrome, psn = qp.nak, qp.nak_psn
        else:
            syndrome, psn = Syndrome.ACK, qp.epsn - 1
        return AckPacket(qp.peer_qpn, psn & (PSN_MOD - 1), syndrome, (qp.epsn - qp.start_psn) & (PSN_MOD - 1),
                         qp.epsn & (PSN_MOD - 1), qp.echo_psn, qp.echo_ev & 0xFFFF, qp.ecn, bitmap, qp.pkey)

    def pump(self, now: int, send: Send, clock: Callable[[], int] | None = None) -> None:
        self._last_now = now
        for qp in self.qps.values():
            if not qp.ack_due and not (qp.unacked_since >= 0 and now >= qp.unacked_since + self.config.ack_delay_ns):
                continue
            path = qp.paths_back.get(qp.echo_ev) or next(iter(qp.paths_back.values()))
            ack = self._ack_for(qp)
            send(path.template.encode(ack), path)
            self.stats["naks_sent" if qp.nak is not None else "acks_sent"] += 1
            qp.ack_due, qp.nak, qp.since_ack, qp.unacked_since = False, None, 0, -1

    def next_wakeup(self) -> int | None:
        wakes = []
        for qp in self.qps.values():
            if qp.ack_due:
                return self._last_now
            if qp.unacked_since >= 0:
                wakes.append(qp.unacked_since + self.config.ack_delay_ns)
        return min(wakes) if wakes else None
