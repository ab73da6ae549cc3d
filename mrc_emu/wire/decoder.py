"""The decoder: frames and UDP payloads back into packet records, without scapy.

Why it exists: the responder and the requester read every datagram they receive, the
in-memory network opens every frame as a destination kernel would, and pcaps and fuzzers
feed it anything. It never raises on hostile input: every problem is a DropReason, and
every read is bounds-checked by struct. Building frames is encoder.py's job.
"""

from __future__ import annotations

import socket
import zlib
from dataclasses import dataclass

from . import format as fmt
from .format import (
    AckPacket,
    CnpPacket,
    DataPacket,
    DropReason,
    Endpoints,
    PortStatusPacket,
    ProbePacket,
    ProbeResponsePacket,
    RocePacket,
    TrimmedPacket,
    TrimNackPacket,
)
from .headers import (
    ACK,
    AETH_HDR,
    BTH_HDR,
    CE_BLOCK_HDR,
    CE_ENTRY,
    ICRC,
    IMM_HDR,
    IPV6_HDR,
    MRCX_HDR,
    NH_IPV6,
    NH_ROUTING,
    NH_UDP,
    PORT_STATUS_HDR,
    PROBE_HDR,
    PROBE_RSP_HDR,
    RETH_HDR,
    SACK_HDR,
    SRH_HDR,
    TRIM_HDR,
    UDP_HDR,
    WRITE_FIRST,
    WRITE_IMM,
    WRITE_LAST_IMM,
    WRITE_ONLY,
    icrc_prefix,
    ones_sum,
    ones_sum_of,
    packed,
)


@dataclass(frozen=True)
class Received:
    packet: RocePacket
    ends: Endpoints
    segments_left: int | None = None  # of the SRH, when the frame still had one


def decode_roce(payload: bytes, ends: Endpoints, ecn_ce: bool = False) -> RocePacket | DropReason:
    """Decode the UDP payload of a RoCEv2 packet (what a UDP socket on port 4791 receives)."""
    try:
        src, dst = packed(ends.src), packed(ends.dst)
    except ValueError:
        return DropReason.NOT_IPV6
    return _decode_roce(payload, src, dst, ends.sport, ends.dport, ecn_ce)


def _decode_roce(payload: bytes | memoryview, src: bytes, dst: bytes, sport: int, dport: int,
                 ecn_ce: bool) -> RocePacket | DropReason:
    n = len(payload)
    if n < fmt.BTH_LEN + fmt.ICRC_LEN:
        return DropReason.TRUNCATED
    view = memoryview(payload)
    crc = icrc_prefix(src, dst, sport, dport, n + fmt.UDP_LEN)
    crc = zlib.crc32(view[5:n - 4], zlib.crc32(bytes(view[:4]) + b"\xff", crc))
    if ICRC.unpack_from(view, n - 4)[0] != crc:
        return DropReason.BAD_ICRC
    opcode, flags, pkey, qp_word, psn_word = BTH_HDR.unpack_from(view, 0)
    if flags & 0x0F:
        return DropReason.BAD_VERSION
    end = n - 4
    if opcode == WRITE_ONLY or opcode == WRITE_IMM:
        pad = (flags >> 4) & 0x3
        offset = fmt.BTH_LEN + fmt.RETH_LEN + (fmt.IMMDT_LEN if opcode == WRITE_IMM else 0)
        if end < offset + pad:
            return DropReason.TRUNCATED
        va, rkey, dma_len = RETH_HDR.unpack_from(view, fmt.BTH_LEN)
        imm = IMM_HDR.unpack_from(view, offset - fmt.IMMDT_LEN)[0] if opcode == WRITE_IMM else None
        if dma_len != end - pad - offset:
            return DropReason.BAD_LENGTH
        return DataPacket(qp_word & fmt.QPN_MASK, psn_word & fmt.PSN_MASK, va, rkey, view[offset:end - pad],
                          bool(psn_word >> 31), imm, pkey, ecn_ce)
    if WRITE_FIRST <= opcode <= WRITE_LAST_IMM:
        return _rc_data(view, opcode, flags, pkey, qp_word, psn_word, end, ecn_ce)
    if opcode == ACK:
        body = view[:end]
        dest_qp = qp_word & fmt.QPN_MASK
        psn = psn_word & fmt.PSN_MASK
        offset = fmt.BTH_LEN
        if end < offset + fmt.AETH_LEN:
            return DropReason.TRUNCATED
        (aeth,) = AETH_HDR.unpack_from(body, offset)
        offset += fmt.AETH_LEN
        syndrome, msn = aeth >> 24, aeth & 0xFFFFFF
        if end == offset:
            return AckPacket(dest_qp, psn, syndrome, msn, pkey=pkey)
        if end < offset + fmt.MRCX_HEADER_LEN:
            return DropReason.TRUNCATED
        ext_type, ext_flags, ext_len = MRCX_HDR.unpack_from(body, offset)
        if ext_len != end - offset:
            return DropReason.BAD_EXTENSION
        if ext_type == fmt.MrcxType.SACK and ext_len >= fmt.SACK_FIXED_LEN and ext_len % 4 == 0:
            base, echo, echo_ev, service = SACK_HDR.unpack_from(body, offset + fmt.MRCX_HEADER_LEN)
            at = offset + fmt.SACK_FIXED_LEN
            ce_counts: tuple[tuple[int, int], ...] = ()
            if ext_flags & fmt.SACK_CE_COUNTS:
                if end < at + CE_BLOCK_HDR.size:
                    return DropReason.BAD_EXTENSION
                entries = CE_BLOCK_HDR.unpack_from(body, at)[0]
                at += CE_BLOCK_HDR.size
                if entries > fmt.MAX_CE_ENTRIES or end < at + entries * fmt.CE_ENTRY_LEN:
                    return DropReason.BAD_EXTENSION
                ce_counts = tuple(CE_ENTRY.unpack_from(body, at + i * fmt.CE_ENTRY_LEN) for i in range(entries))
                at += entries * fmt.CE_ENTRY_LEN
            return AckPacket(dest_qp, psn, syndrome, msn, base & fmt.PSN_MASK, echo & fmt.PSN_MASK, echo_ev,
                             bool(ext_flags & 1), bytes(body[at:]), pkey, fmt.decode_service(service), ce_counts)
        if ext_type == fmt.MrcxType.PROBE and ext_len == fmt.PROBE_LEN:
            probe_id, ev, _, send_time = PROBE_HDR.unpack_from(body, offset + fmt.MRCX_HEADER_LEN)
            return ProbePacket(dest_qp, probe_id, ev, send_time, pkey)
        if ext_type == fmt.MrcxType.PROBE_RESPONSE and ext_len == fmt.PROBE_RESPONSE_LEN:
            probe_id, ev, port, _, send_time, service = PROBE_RSP_HDR.unpack_from(body, offset + fmt.MRCX_HEADER_LEN)
            return ProbeResponsePacket(dest_qp, probe_id, ev, send_time, port, service, pkey)
        if ext_type == fmt.MrcxType.PORT_STATUS and ext_len == fmt.PORT_STATUS_LEN:
            req_id, mask = PORT_STATUS_HDR.unpack_from(body, offset + fmt.MRCX_HEADER_LEN)
            return PortStatusPacket(dest_qp, req_id, mask, bool(ext_flags & fmt.PORT_STATUS_FLAG_ACK), pkey)
        if ext_type == fmt.MrcxType.TRIM and ext_len == fmt.TRIM_EXT_LEN and syndrome == fmt.Syndrome.NAK_TRIMMED:
            ev = TRIM_HDR.unpack_from(body, offset + fmt.MRCX_HEADER_LEN)[0]
            return TrimNackPacket(dest_qp, psn, ev, bool(ext_flags & fmt.TRIM_FLAG_LAST_HOP),
                                  bool(ext_flags & fmt.TRIM_FLAG_CE), msn, pkey)
        return DropReason.BAD_EXTENSION
    if opcode == fmt.Opcode.CNP:
        if end != fmt.BTH_LEN + fmt.CNP_PAD_LEN:
            return DropReason.BAD_LENGTH
        return CnpPacket(qp_word & fmt.QPN_MASK, pkey)
    return DropReason.UNKNOWN_OPCODE


def _rc_data(view: memoryview, opcode: int, flags: int, pkey: int, qp_word: int, psn_word: int, end: int,
             ecn_ce: bool) -> DataPacket | DropReason:
    """A packet of an RC peer's multi-packet WRITE: FIRST (RETH, the message's whole length),
    MIDDLE, LAST (neither RETH nor ImmDt) or LAST_WITH_IMMEDIATE (ImmDt); pad bytes only in a last."""
    pad = (flags >> 4) & 0x3
    offset, va, rkey, dma_len, imm = fmt.BTH_LEN, 0, 0, -1, None
    if opcode == WRITE_FIRST:
        offset += fmt.RETH_LEN
    elif opcode == WRITE_LAST_IMM:
        offset += fmt.IMMDT_LEN
    if end < offset + pad:
        return DropReason.TRUNCATED
    if opcode == WRITE_FIRST:
        va, rkey, dma_len = RETH_HDR.unpack_from(view, fmt.BTH_LEN)
        if dma_len < end - pad - offset:
            return DropReason.BAD_LENGTH
    elif opcode == WRITE_LAST_IMM:
        imm = IMM_HDR.unpack_from(view, fmt.BTH_LEN)[0]
    return DataPacket(qp_word & fmt.QPN_MASK, psn_word & fmt.PSN_MASK, va, rkey, view[offset:end - pad],
                      bool(psn_word >> 31), imm, pkey, ecn_ce, opcode, dma_len)


def decode_trimmed(payload: bytes | memoryview) -> TrimmedPacket | DropReason:
    """A data packet a switch trimmed, as the responder's socket receives it (the caller saw a
    trimmed DSCP, `fmt.is_trimmed`): BTH and RETH survive, payload and ICRC are gone, so no ICRC
    is checked; the kernel checked the UDP checksum the switch recomputed. NOT_TRIMMED: not a
    data opcode, or not shorter than the packet its RETH describes (then it is decoded as any
    packet). A trimmed packet that lost part of BTH or RETH is TRUNCATED."""
    n = len(payload)
    if n < fmt.BTH_LEN:
        return DropReason.TRUNCATED
    opcode, flags, pkey, qp_word, psn_word = BTH_HDR.unpack_from(payload, 0)
    if opcode != WRITE_ONLY and opcode != WRITE_IMM:
        return DropReason.NOT_TRIMMED
    if flags & 0x0F:
        return DropReason.BAD_VERSION
    if n < fmt.TRIMMED_LEN:
        return DropReason.TRUNCATED
    va, rkey, dma_len = RETH_HDR.unpack_from(payload, fmt.BTH_LEN)
    whole = fmt.TRIMMED_LEN + (fmt.IMMDT_LEN if opcode == WRITE_IMM else 0) + dma_len + ((flags >> 4) & 3) + fmt.ICRC_LEN
    if n >= whole:
        return DropReason.NOT_TRIMMED
    return TrimmedPacket(qp_word & fmt.QPN_MASK, psn_word & fmt.PSN_MASK, va, rkey, dma_len, bool(psn_word >> 31), pkey)


@dataclass(frozen=True)
class Opened:
    """What the kernel's UDP socket hands over for a frame: the inner addresses and UDP payload."""

    payload: memoryview
    src: bytes
    dst: bytes
    sport: int
    dport: int
    tclass: int  # the inner IPv6 header's traffic class (what IPV6_RECVTCLASS reports)
    segments_left: int | None

    @property
    def ecn_ce(self) -> bool:
        return self.tclass & fmt.ECN_MASK == fmt.ECN_CE


def open_frame(frame: bytes | memoryview) -> Opened | DropReason:
    """Strip outer IPv6 (+ SRH) and inner IPv6 + UDP, checking lengths and the UDP checksum.

    This is what the destination's kernel does for a real packet (decapsulate, check the
    checksum, deliver to port 4791); the in-memory link and pcap readers do it here.
    """
    frame = memoryview(frame)
    segments_left = None
    if len(frame) < fmt.IPV6_LEN:
        return DropReason.TRUNCATED
    word0, plen, nh, _hlim, src, dst = IPV6_HDR.unpack_from(frame, 0)
    if word0 >> 28 != 6:
        return DropReason.NOT_IPV6
    if plen != len(frame) - fmt.IPV6_LEN:
        return DropReason.BAD_IP_LENGTH
    offset = fmt.IPV6_LEN
    if nh == NH_ROUTING:
        if len(frame) < offset + fmt.SRH_FIXED_LEN:
            return DropReason.TRUNCATED
        nh, hdr_len, rtype, segments_left, last_entry, _, _ = SRH_HDR.unpack_from(frame, offset)
        srh_len = 8 + 8 * hdr_len
        if rtype != 4 or last_entry * 16 + 16 > srh_len - 8 or segments_left > last_entry:
            return DropReason.BAD_SRH
        if len(frame) < offset + srh_len:
            return DropReason.TRUNCATED
        offset += srh_len
    if nh == NH_IPV6:
        if len(frame) < offset + fmt.IPV6_LEN:
            return DropReason.TRUNCATED
        word0, plen, nh, _hlim, src, dst = IPV6_HDR.unpack_from(frame, offset)
        if word0 >> 28 != 6:
            return DropReason.NOT_IPV6
        if plen != len(frame) - offset - fmt.IPV6_LEN:
            return DropReason.BAD_IP_LENGTH
        offset += fmt.IPV6_LEN
    if nh != NH_UDP:
        return DropReason.NOT_UDP
    if len(frame) < offset + fmt.UDP_LEN:
        return DropReason.TRUNCATED
    sport, dport, ulen, csum = UDP_HDR.unpack_from(frame, offset)
    if dport != fmt.ROCE_UDP_PORT:
        return DropReason.NOT_ROCE_PORT
    if ulen != len(frame) - offset:
        return DropReason.BAD_UDP_LENGTH
    segment = frame[offset:]
    # a correct checksum makes the one's-complement sum over pseudo-header and segment 0xFFFF; a zero
    # one is none at all, which a RoCEv2 sender over IPv6 may send (rdma_rxe does: the ICRC covers the
    # packet) and the receiving socket takes (UDP_NO_CHECK6_RX, io/sockets.py; docs/interop.md)
    if csum and ones_sum(int.from_bytes(src + dst, "big") + ulen + NH_UDP + ones_sum_of(segment)) != 0xFFFF:
        return DropReason.BAD_UDP_CHECKSUM
    return Opened(segment[fmt.UDP_LEN:], src, dst, sport, dport, (word0 >> 20) & 0xFF, segments_left)


def decode_udp(payload: bytes | memoryview, src: bytes, dst: bytes, sport: int,
               dport: int = fmt.ROCE_UDP_PORT, ecn_ce: bool = False) -> RocePacket | DropReason:
    """The data path's decoder: a UDP payload as a socket on port 4791 receives it.

    The kernel has checked the UDP checksum already; this checks the ICRC and every length.
    `src` and `dst` are the packed inner addresses (the ICRC covers them).
    """
    return _decode_roce(payload, src, dst, sport, dport, ecn_ce)


def decode_frame(frame: bytes | memoryview) -> Received | DropReason:
    """Decode a whole IPv6 frame in any EV format (pcaps, the in-memory link, fuzzing)."""
    opened = open_frame(frame)
    if isinstance(opened, DropReason):
        return opened
    decoded = _decode_roce(opened.payload, opened.src, opened.dst, opened.sport, opened.dport, opened.ecn_ce)
    if isinstance(decoded, DropReason):
        return decoded
    ends = Endpoints(socket.inet_ntop(socket.AF_INET6, opened.src), socket.inet_ntop(socket.AF_INET6, opened.dst),
                     opened.sport, opened.dport)
    return Received(decoded, ends, opened.segments_left)
