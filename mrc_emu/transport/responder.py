"""The receiving side of MRC QPs: registered memory, checks on every packet, placement, ACKs.

Why it exists: MRC places each packet straight into the registered buffer at its own
address, in whatever order packets arrive, so the responder must check every one (QPN, peer
address, P_Key, PSN window, R_Key and protection domain, bounds) before it writes a byte, and
acknowledge with a SACK bitmap over the MPR window. One responder serves any number of QPs,
each with its own attributes (QpConfig): MRC QPs (selective) and go-back-N QPs (RoCEv2 RC,
which accept only the expected PSN) side by side. A sans-IO state machine: datagrams in
(`on_datagram`), ACK frames out (`pump`), time passed in as `now` (ns); R_Keys come from an
injected random source.

It also hears congestion: each datagram's traffic class says whether a switch CE-marked it
(counted per EV and reported in the ACKs' SACK extension; with `QpConfig.cnp`, DCQCN's CNP at
most once per `cnp_interval_ns`) or trimmed it (the DSCP; then it is not placed, and a TRIM
NACK for its PSN leaves at the next pump, or a plain ACK when the PSN had arrived already).

It is the QP's MRC endpoint for EV probes too: a probe of one of its QPs' EVs is answered at
the next pump along that EV's back path (where its ACKs go) with the arrival port and the
service time (transport/endpoint.py's ProbeAnswers). With a port-status view (`ports`, given by
the host's endpoint), an ACK whose EV crosses a disabled port, here or at the peer, leaves by
another EV.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable

from ..stats import histogram_percentile
from ..topology.evs import UDP_SPORT_BASE, ev_of_sport
from ..wire import format as fmt
from ..wire.decoder import decode_trimmed, decode_udp
from ..wire.format import ROCE_UDP_PORT, AckPacket, CnpPacket, DataPacket, DropReason, ProbePacket, Syndrome, TrimNackPacket
from .config import PSN_MOD, QpConfig, RandomBits, RecoveryMode, psn_abs
from .endpoint import ProbeAnswers, packed_peer
from .multipath.paths import Path, Send
from .multipath.portstatus import PortStatus
from .regions import ImmCompletion, MemoryRegion, Message, next_of_message, reach

try:  # the C placement of the common data packet (optional; see _place.c)
    from . import _place
except ImportError:  # pragma: no cover - the extension was not built
    _place = None


# A responder QP's state: the fields the C placement (_place.c) reads and writes, and those only Python uses
_SHARED = ("peer", "epsn", "pd", "window", "pkey", "in_order_only", "received", "pending_imm", "since_ack",
           "ack_every", "unacked_since", "ack_due", "echo_psn", "echo_ev", "echo_at", "ecn", "ce_counts", "cnp",
           "cnp_due", "cnp_last", "cnp_interval", "top_psn", "reorder", "reorder_max", "message", "not_ends")
_PYTHON_ONLY = ("qpn", "peer_qpn", "start_psn", "paths_back", "config", "nak", "nak_sent_at", "nak_psn", "trims",
                "ev_of_wire")
_TRIMMED_DSCPS = (fmt.DSCP_TRIMMED, fmt.DSCP_TRIMMED_LASTHOP)
REORDER_BUCKETS = 16  # _place.c: placed packets by PSNs behind the highest: 0, then [2^(b-1), 2^b - 1]
MAX_PENDING_TRIMS = 1024  # TRIM NACKs a QP holds between two pumps (more: counted drops)


class _QpFields:
    """What a responder QP holds (one __init__ for both representations below).

    peer: the requester's packed address (None: accept any); epsn: expected PSN (unbounded),
    everything below has arrived; received: bit (window-1-i) <=> PSN epsn+i arrived; pd: the
    protection domain the QP may write in; in_order_only: go-back-N, only the expected PSN is
    accepted; unacked_since: arrival of the first packet not yet acknowledged (-1: none);
    nak: the syndrome to send with the next ACK; nak_sent_at: go-back-N, the expected PSN a
    sequence NAK was sent for (one per gap); echo_at: when the echoed packet arrived (the ACK
    says how long it was held since); ce_counts: EV -> CE-marked data packets not yet reported;
    cnp: send DCQCN CNPs (cnp_due: one is to leave; cnp_last: when the last was due); trims: the
    TRIM NACKs to send at the next pump; ev_of_wire: the EV of each source-port number (sport less
    UDP_SPORT_BASE, what echo_ev and ce_counts hold) where they differ, as a STEV EV's may (None: none do);
    message: an RC peer's WRITE under way after its FIRST (regions.Message; None: none); not_ends: placed
    FIRSTs and MIDDLEs, which end no message (the AETH's MSN counts messages: epsn - start_psn - not_ends)."""

    __slots__ = ()

    def __init__(self, qpn: int, peer_qpn: int, peer: bytes | None, start_psn: int, paths_back: dict[int, Path],
                 config: QpConfig, pd: int = 0) -> None:
        self.qpn, self.peer_qpn, self.peer, self.paths_back, self.config, self.pd = qpn, peer_qpn, peer, paths_back, config, pd
        self.epsn = self.start_psn = start_psn
        self.window, self.pkey, self.ack_every = config.window, config.pkey, config.ack_every
        self.in_order_only = config.recovery is RecoveryMode.GO_BACK_N
        self.received = 0
        self.pending_imm: dict[int, int] = {}
        self.since_ack, self.unacked_since, self.ack_due = 0, -1, False
        self.nak: Syndrome | None = None
        self.nak_sent_at, self.nak_psn = -1, 0
        self.echo_psn, self.echo_ev, self.echo_at, self.ecn = 0, 0, 0, False
        self.ce_counts: dict[int, int] = {}
        self.cnp, self.cnp_interval, self.cnp_due, self.cnp_last = config.cnp, config.cnp_interval_ns, False, -(1 << 62)
        self.trims: list[TrimNackPacket] = []
        wire = {path.template.ends.sport - UDP_SPORT_BASE: ev for ev, path in paths_back.items()}
        self.ev_of_wire = None if all(n == ev for n, ev in wire.items()) else wire
        self.top_psn, self.reorder, self.reorder_max = start_psn - 1, [0] * REORDER_BUCKETS, 0
        self.message, self.not_ends = None, 0


def _ev(qp: _QpFields, wire: int) -> int:
    """The EV a source-port number (sport less UDP_SPORT_BASE) stands for on this QP."""
    return wire if qp.ev_of_wire is None else qp.ev_of_wire.get(wire, wire)


class _PyQp(_QpFields):
    """A responder QP in plain Python attributes (no C extension, or the C path turned off)."""

    __slots__ = _SHARED + _PYTHON_ONLY


_CQp = None
if _place is not None:
    class _CQp(_QpFields, _place.QpState):
        """A responder QP whose shared state lives in C, where the placement reads it."""

        __slots__ = _PYTHON_ONLY


class Responder:
    """The receiving side: registered memory and the QPs that may write into it."""

    def __init__(self, address: bytes, config: QpConfig | None = None, *, random_bits: RandomBits,
                 c_path: bool = True) -> None:
        """`c_path`: place the common data packet in C (_place.c) when it is built; False: in Python."""
        self.address = address
        self.config = config or QpConfig()  # the attributes of QPs accepted without their own
        self.regions: dict[int, MemoryRegion] = {}
        self.qps: dict[int, _PyQp | _CQp] = {}
        self.completions: list[ImmCompletion] = []
        self.stats = {"packets_placed": 0, "bytes_placed": 0, "duplicates": 0, "acks_sent": 0, "naks_sent": 0,
                      "ce_received": 0, "trimmed_received": 0, "trims_of_received": 0, "trim_nacks_sent": 0,
                      "cnps_sent": 0}
        self._qp_class = _CQp if c_path and _CQp is not None else _PyQp
        self._place = (_place.Placer(self.qps, self.regions, self.stats, address, ROCE_UDP_PORT, UDP_SPORT_BASE).place
                       if self._qp_class is _CQp else None)
        self.drops: Counter[str] = Counter()
        self.recvs: dict[int, int] = {}  # QPN -> receives posted and not yet consumed (by WRITE_WITH_IMM)
        self._random_bits = random_bits
        self._last_now = 0
        self.answers = ProbeAnswers()  # EV probes of its QPs, answered at the next pump
        self.ports: PortStatus | None = None  # the host's port status (None: every port usable)

    def _new_rkey(self) -> int:
        while (rkey := self._random_bits(32)) == 0 or rkey in self.regions:
            pass
        return rkey

    def register(self, buffer: bytearray, va: int = 0x1000_0000, pd: int = 0) -> MemoryRegion:
        mr = MemoryRegion(self._new_rkey(), va, buffer, pd)
        self.regions[mr.rkey] = mr
        return mr

    def accept(self, qpn: int, peer_qpn: int, start_psn: int, paths_back: dict[int, Path],
               peer: bytes | None = None, pd: int = 0, config: QpConfig | None = None) -> None:
        """Accept QP `qpn` from the requester's `peer_qpn`, starting at `start_psn`, with its own
        attributes `config` (the requester's; default: the responder's)."""
        if not paths_back:
            raise ValueError("a responder QP needs at least one path back to the requester")
        self.qps[qpn] = self._qp_class(qpn, peer_qpn, peer, start_psn, paths_back, config or self.config, pd)
        self.recvs.setdefault(qpn, 0)

    def post_recv(self, qpn: int, count: int = 1) -> None:
        """Post `count` receives on QP `qpn`: each WRITE_WITH_IMM consumes one for its completion.
        MRC has no RNR: a WRITE_WITH_IMM that finds none is refused with a NAK (remote operational
        error), which puts the requester's QP into error; so receives are posted in advance."""
        if qpn not in self.qps or count < 0:
            raise ValueError(f"cannot post {count} receive(s) on QP {qpn:#x}: " +
                             ("a count is at least 0" if qpn in self.qps else "no such QP accepted"))
        self.recvs[qpn] += count

    def on_datagram(self, payload: bytes | memoryview, src: bytes, sport: int, now: int, tclass: int = 0,
                    port: int = 0) -> None:
        """`port`: the 1-based port of this host the datagram arrived at (0: unknown)."""
        if self._place is not None and self._place(payload, src, sport, now, tclass):
            return  # the common case, checked and placed in C exactly as below
        if tclass >> 2 in _TRIMMED_DSCPS:  # a trim, unless it is whole or no data packet
            trimmed = decode_trimmed(payload)
            if trimmed is not DropReason.NOT_TRIMMED:
                self._on_trimmed(trimmed, src, sport, now, tclass)
                return
        packet = decode_udp(payload, src, self.address, sport)
        if isinstance(packet, DropReason):
            self.drops[packet.value] += 1
            return
        if not isinstance(packet, DataPacket):
            if isinstance(packet, ProbePacket) and self._probe_qp(packet, src) is not None:
                self.answers.take(packet, src, port, now)
            else:
                self.drops["unknown_probe" if isinstance(packet, ProbePacket) else "unexpected_ack"] += 1
            return
        qp = self.qps.get(packet.dest_qp)
        if qp is None or (qp.peer is not None and qp.peer != src):
            self.drops["unknown_qp"] += 1
            return
        if packet.pkey != qp.pkey:
            self.drops["bad_pkey"] += 1
            return
        psn = psn_abs(packet.psn, qp.epsn)
        offset = psn - qp.epsn
        ev = ev_of_sport(sport)
        ce = tclass & fmt.ECN_MASK == fmt.ECN_CE
        qp.echo_psn, qp.echo_ev, qp.echo_at, qp.ecn = packet.psn, ev, now, ce
        if ce:
            qp.ce_counts[ev] = qp.ce_counts.get(ev, 0) + 1
            self.stats["ce_received"] += 1
            self._maybe_cnp(qp, now)
        if offset < 0 or (offset < qp.window and qp.received >> (qp.window - 1 - offset) & 1):
            self.stats["duplicates"] += 1
            qp.ack_due = True
            return
        # a PSN sequence NAK names the expected PSN (IBA; every PSN before it arrived), as rdma_rxe's does
        if offset > 0 and qp.in_order_only:
            self.drops["out_of_sequence"] += 1  # RC: only the expected PSN is accepted
            if qp.nak_sent_at != qp.epsn:
                qp.nak_sent_at = qp.epsn
                self._nak(qp, Syndrome.NAK_PSN_SEQUENCE, qp.epsn)
            return
        if offset >= qp.window:
            self.drops["psn_out_of_window"] += 1
            self._nak(qp, Syndrome.NAK_PSN_SEQUENCE, qp.epsn)
            return
        if offset and packet.rc_opcode is not None:  # an RC peer's message is placed in order only
            self.drops["rc_out_of_order"] += 1
            return
        data = packet.payload
        mr, start, message = self._target(qp, packet, psn)
        if start is None:
            return
        if packet.imm is not None:
            if self.recvs.get(qp.qpn, 0) <= 0:  # no RNR in MRC: refused, and the requester's QP errs
                self.drops["imm_without_receive"] += 1
                self._nak(qp, Syndrome.NAK_REMOTE_OPERATIONAL, psn)
                return
            self.recvs[qp.qpn] -= 1
        mr.view[start:start + len(data)] = data
        if packet.rc_opcode is not None:
            qp.message, qp.not_ends = message, qp.not_ends + (message is not None)
        late = qp.top_psn - psn if psn < qp.top_psn else 0  # how far out of PSN order it came
        if not late:
            qp.top_psn = psn
        reorder = qp.reorder  # a fresh list from the C state: written back
        reorder[min(late.bit_length(), REORDER_BUCKETS - 1)] += 1
        qp.reorder = reorder
        qp.reorder_max = max(qp.reorder_max, late)
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
        if packet.ack_req or qp.since_ack >= qp.ack_every:
            qp.ack_due = True

    def _target(self, qp: _PyQp | _CQp, packet: DataPacket, psn: int) -> tuple[MemoryRegion | None, int | None, Message | None]:
        """(region, offset, the RC peer's message after this packet) for a data packet's bytes;
        offset None: refused, with a NAK. MRC's packets each carry their address; an RC peer's
        FIRST opens a message at its RETH (the whole length checked, as an RC responder does;
        a FIRST always starts over, a retried message's too), its MIDDLE and LAST continue it."""
        op, n = packet.rc_opcode, len(packet.payload)
        if op is None or op == fmt.Opcode.RDMA_WRITE_FIRST:
            mr = self.regions.get(packet.rkey)
            start = reach(mr, qp.pd, packet.va, n if op is None else packet.dma_len)
            if isinstance(start, str):
                self.drops[start] += 1
                self._nak(qp, Syndrome.NAK_REMOTE_ACCESS, psn)
                return None, None, None
            return mr, start, None if op is None else (mr, start + n, packet.dma_len - n)
        step = next_of_message(qp.message, n, op != fmt.Opcode.RDMA_WRITE_MIDDLE)
        if isinstance(step, str):
            self.drops[step] += 1
            self._nak(qp, Syndrome.NAK_INVALID_REQUEST, psn)
            return None, None, None
        (mr, start, _), message = step
        return mr, start, message

    def _maybe_cnp(self, qp: _PyQp | _CQp, now: int) -> None:
        """DCQCN's NP: a CE mark makes a CNP due, unless one was due less than the interval ago."""
        if qp.cnp and now - qp.cnp_last >= qp.cnp_interval:
            qp.cnp_due, qp.cnp_last = True, now

    def _on_trimmed(self, trimmed, src: bytes, sport: int, now: int, tclass: int) -> None:
        """A data packet a switch trimmed: not placed; a TRIM NACK for its PSN, or, if that PSN
        arrived already (the trim was of a copy), a plain ACK."""
        if isinstance(trimmed, DropReason):
            self.drops[f"trimmed_{trimmed.value}"] += 1
            return
        qp = self.qps.get(trimmed.dest_qp)
        if qp is None or (qp.peer is not None and qp.peer != src):
            self.drops["unknown_qp"] += 1
            return
        if trimmed.pkey != qp.pkey:
            self.drops["bad_pkey"] += 1
            return
        self.stats["trimmed_received"] += 1
        ce = tclass & fmt.ECN_MASK == fmt.ECN_CE
        if ce:
            self._maybe_cnp(qp, now)  # the NACK itself echoes the mark to an MRC requester
        if not qp.config.trim_nack:  # its peer takes no TRIM NACK (TRIM_NACK_DEST_UNSUPPORTED): a loss to it
            self.drops["trimmed_no_trim_nack"] += 1
            return
        if qp.in_order_only:
            # RoCEv2 RC (the baseline) knows no trimming: its NIC drops a packet whose ICRC is
            # missing, and the gap it leaves is found by the next packet's sequence NAK
            self.drops["trimmed_not_understood"] += 1
            return
        offset = psn_abs(trimmed.psn, qp.epsn) - qp.epsn
        if offset < 0 or (offset < qp.window and qp.received >> (qp.window - 1 - offset) & 1):
            self.stats["trims_of_received"] += 1
            qp.ack_due = True
            return
        if offset >= qp.window:
            self.drops["trim_out_of_window"] += 1
            return
        if len(qp.trims) >= MAX_PENDING_TRIMS:
            self.drops["trim_nack_overflow"] += 1
            return
        qp.trims.append(TrimNackPacket(qp.peer_qpn, trimmed.psn, _ev(qp, ev_of_sport(sport)) & 0xFFFF,
                                       tclass >> 2 == fmt.DSCP_TRIMMED_LASTHOP, ce,
                                       (qp.epsn - qp.start_psn) & (PSN_MOD - 1), qp.pkey))

    def _signal(self, qp: _PyQp | _CQp, send: Send) -> None:
        """Send the QP's pending TRIM NACKs (each back along the trimmed packet's EV) and CNP."""
        for nack in qp.trims:
            path = self._back_path(qp, nack.ev)
            if path is not None and send(path.template.encode(nack), path):
                self.stats["trim_nacks_sent"] += 1
            else:
                self.drops["trim_nack_not_sent"] += 1
        qp.trims.clear()
        if qp.cnp_due:
            qp.cnp_due = False
            path = self._back_path(qp, _ev(qp, qp.echo_ev))
            if path is not None and send(path.template.encode(CnpPacket(qp.peer_qpn, qp.pkey)), path):
                self.stats["cnps_sent"] += 1
            else:
                self.drops["cnp_not_sent"] += 1

    @staticmethod
    def _take_ce(counts: dict[int, int], ev_of: Callable[[int], int] = int) -> tuple[tuple[int, int], ...]:
        """The CE counts one ACK reports (up to MAX_CE_ENTRIES EVs, each up to 0xFFFF), each EV as
        `ev_of` names its source-port number; what does not fit stays for the next ACK."""
        taken = []
        for ev in sorted(counts)[:fmt.MAX_CE_ENTRIES]:
            n = counts.pop(ev)
            sent = min(n, fmt.MAX_CE_COUNT)
            if n > sent:
                counts[ev] = n - sent
            taken.append((ev_of(ev) & 0xFFFF, sent))
        return tuple(taken)

    def _nak(self, qp: _PyQp | _CQp, syndrome: Syndrome, psn: int) -> None:
        qp.nak, qp.nak_psn, qp.ack_due = syndrome, psn, True

    def _ack_for(self, qp: _PyQp | _CQp, now: int) -> AckPacket:
        bitmap = b""
        if qp.received:
            lowest = (qp.received & -qp.received).bit_length() - 1
            nbits = -(-(qp.window - lowest) // 32) * 32
            bitmap = (qp.received >> (qp.window - nbits)).to_bytes(nbits // 8, "big")
        if qp.nak is not None:
            syndrome, psn = qp.nak, qp.nak_psn
        else:
            syndrome, psn = Syndrome.ACK, qp.epsn - 1
        return AckPacket(qp.peer_qpn, psn & (PSN_MOD - 1), syndrome, (qp.epsn - qp.start_psn - qp.not_ends) & (PSN_MOD - 1),
                         qp.epsn & (PSN_MOD - 1), qp.echo_psn, _ev(qp, qp.echo_ev) & 0xFFFF, qp.ecn, bitmap,
                         qp.pkey, now - qp.echo_at if qp.config.svc_time else 0,
                         self._take_ce(qp.ce_counts, functools.partial(_ev, qp)) if qp.ce_counts else ())

    def _probe_qp(self, probe: ProbePacket, src: bytes) -> _PyQp | _CQp | None:
        """The QP a probe is for: one of ours, from its peer, of an EV it has a way back for."""
        qp = self.qps.get(probe.dest_qp)
        if qp is None or (qp.peer is not None and qp.peer != src) or probe.pkey != qp.pkey or probe.ev not in qp.paths_back:
            return None
        return qp

    def _answer_way(self, probe: ProbePacket, src: bytes) -> tuple[Path, int, int] | None:
        qp = self._probe_qp(probe, src)
        if qp is None:
            return None
        path = qp.paths_back[probe.ev]
        if self.ports is not None and not self.ports.usable(src, path):
            return None  # a disabled port: the probe is not answered, its EV is not usable
        return path, qp.peer_qpn, qp.pkey

    def _back_path(self, qp: _PyQp | _CQp, ev: int) -> Path | None:
        """The way back for an ACK, TRIM NACK or CNP about a packet that came on `ev`: that EV's
        back path, or, when it crosses a disabled port, the first usable one (None: none is)."""
        path = qp.paths_back.get(ev) or next(iter(qp.paths_back.values()))
        ports = self.ports
        if ports is None or ports.all_up:
            return path
        peer = qp.peer if qp.peer is not None else packed_peer(path)
        if ports.usable(peer, path):
            return path
        return next((p for p in qp.paths_back.values() if ports.usable(peer, p)), None)

    def pump(self, now: int, send: Send, clock: Callable[[], int] | None = None, horizon: int | None = None) -> None:
        self._last_now = now
        if self.answers.due:
            self.answers.flush(now, send, clock, self._answer_way)
        for qp in self.qps.values():
            if qp.trims or qp.cnp_due:
                self._signal(qp, send)
            if not qp.ack_due and not (qp.unacked_since >= 0 and now >= qp.unacked_since + qp.config.ack_delay_ns):
                continue
            path = self._back_path(qp, _ev(qp, qp.echo_ev))
            if path is None:
                self.drops["ack_not_sent"] += 1
                qp.ack_due, qp.nak, qp.since_ack, qp.unacked_since = False, None, 0, -1
                continue
            ack = self._ack_for(qp, now)
            if send(path.template.encode(ack), path):
                self.stats["naks_sent" if qp.nak is not None else "acks_sent"] += 1
            else:  # it never left this host (no route out): the requester's timers cover it
                self.drops["ack_not_sent"] += 1
            qp.ack_due, qp.nak, qp.since_ack, qp.unacked_since = False, None, 0, -1

    def next_wakeup(self) -> int | None:
        wakes = []
        if self.answers.due:
            return self._last_now
        for qp in self.qps.values():
            if qp.ack_due or qp.trims or qp.cnp_due:
                return self._last_now
            if qp.unacked_since >= 0:
                wakes.append(qp.unacked_since + qp.config.ack_delay_ns)
        return min(wakes) if wakes else None

    def reorder(self) -> dict:
        """How far out of PSN order the placed data packets came, over this responder's QPs: a
        packet placed while a higher PSN already was came that many PSNs late (0: in order).
        The histogram's bucket 0 is in order, bucket b holds 2^(b-1)..2^b - 1 (the last one all
        beyond); p50 and p99 are bucket upper edges (nearest rank), max is exact."""
        hist = [sum(qp.reorder[b] for qp in self.qps.values()) for b in range(REORDER_BUCKETS)]

        def edge(p: int) -> int | None:
            bucket = histogram_percentile(hist, p)
            return None if bucket is None else (1 << bucket) - 1

        return {"hist": hist, "p50": edge(50), "p99": edge(99),
                "max": max((qp.reorder_max for qp in self.qps.values()), default=0), "packets": sum(hist)}
