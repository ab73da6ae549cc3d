"""The encoder: packets into frames from pre-built byte templates, without scapy.

Why it exists: scapy builds about a thousand packets a second; the data path needs a
hundred times that. A FrameTemplate holds the outer and inner headers of one (QP, EV)
pair as bytes; encoding patches lengths, PSN, address, ICRC and UDP checksum in. The
golden tests (tests/test_wire.py) prove the bytes equal scapy's for every packet type and
EV format. Reading frames back is decoder.py's job.
"""

from __future__ import annotations

import functools
import struct
import zlib
from dataclasses import dataclass

import numpy as np

try:  # the optional C fast path (setup.py); the Python one below makes the same bytes
    from . import _fastpath

    _patch = _fastpath.patch
except ImportError:
    _fastpath = _patch = None

from . import format as fmt
from .format import (
    AckPacket,
    CnpPacket,
    DataPacket,
    Endpoints,
    PortStatusPacket,
    ProbePacket,
    ProbeResponsePacket,
    RocePacket,
    TrimNackPacket,
)
from .headers import (
    AETH_HDR,
    BTH_HDR,
    CE_BLOCK_HDR,
    CE_ENTRY,
    CSUM,
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
    PSN_RETH,
    PSN_RETH_IMM,
    RETH_HDR,
    SACK_HDR,
    SRH_HDR,
    TRIM_HDR,
    UDP_HDR,
    WRITE_IMM,
    WRITE_ONLY,
    icrc,
    icrc_prefix,
    masked_bth8,
    ones_sum,
    ones_sum_of,
    packed,
)

# ---- encapsulation -------------------------------------------------------------------------

def _srh(segments: list[str] | tuple[str, ...]) -> bytes:
    """An SRH over the inner IPv6 packet, first segment active (Segments Left = Last Entry)."""
    n = len(segments)
    return SRH_HDR.pack(NH_IPV6, 2 * n, 4, n - 1, n - 1, 0, 0) + b"".join(packed(s) for s in reversed(segments))


def _outer_ipv6(src: str, dst: str, flow_label: int) -> bytes:
    """The outer IPv6 header, followed by an SRH; payload length zero (patched per frame)."""
    return IPV6_HDR.pack((6 << 28) | (fmt.TCLASS_DATA << 20) | flow_label, 0, NH_ROUTING, fmt.OUTER_HOP_LIMIT,
                         packed(src), packed(dst))


@dataclass(frozen=True)
class Encap:
    """The outer headers of one EV format for one path (empty for the UDP format)."""

    outer: bytes  # outer IPv6 (+ SRH), payload length field zero, data's traffic class (a frame sets its own)
    extra: int  # bytes of outer payload before the inner IPv6 header (SRH size)

    @classmethod
    def srv6(cls, src: str, segments: list[str] | tuple[str, ...], flow_label: int = 0) -> Encap:
        srh = _srh(segments)
        return cls(_outer_ipv6(src, segments[0], flow_label) + srh, len(srh))

    @classmethod
    def usid(cls, src: str, carrier: str, final: str, flow_label: int = 0) -> Encap:
        """Carrier in the destination, plus a one-segment SRH (Segments Left 0) naming `final`,
        so the destination host's kernel decapsulates it like any spent SRH."""
        srh = _srh([final])
        return cls(_outer_ipv6(src, carrier, flow_label) + srh, len(srh))

    @classmethod
    def udp(cls) -> Encap:
        return cls(b"", 0)

    @property
    def outer_dst(self) -> bytes | None:
        return self.outer[24:40] if self.outer else None


@dataclass(slots=True)
class _Prepared:
    """One data packet shape of a template: a frame buffer and where its fields go."""

    frame: bytearray
    covered: memoryview  # the ICRC's part of the frame after the BTH's first 8 bytes
    csum_at: int
    fields_at: int
    payload_at: int
    payload_end: int
    icrc_at: int
    crc: int  # CRC-32 state after the constant, masked part
    words: int  # sum of the constant 16-bit words of the UDP checksum, modulo 0xFFFF
    head: tuple  # all of the above the C fast path needs, in its order


class FrameTemplate:
    """Headers of one (endpoints, EV) pair, ready to have a packet's fields patched in.

    `write` is the data path: per (opcode, length, QP) it caches the headers up to the
    UDP checksum, the first 8 bytes of BTH, the CRC-32 state of the ICRC over everything
    constant, and the one's-complement sum of the constant words. Per packet it then packs
    PSN and RETH, runs the CRC over those and the payload, and adds up the checksum from
    the payload's word sum (which the caller may have computed in bulk: `payload_sums`).
    With the C extension built (`native`), that per-packet work is one call into C.
    """

    _CACHE_LIMIT = 1024

    def __init__(self, ends: Endpoints, encap: Encap, flow_label: int = 0, native: bool | None = None,
                 data_tclass: int = fmt.TCLASS_DATA) -> None:
        self.native = _fastpath is not None if native is None else (native and _fastpath is not None)
        self.ends = ends
        self.encap = encap
        self.data_tclass = data_tclass  # TCLASS_DATA (trimmable), or TCLASS_DATA_NO_TRIM (the baseline)
        self.src = packed(ends.src)
        self.dst = packed(ends.dst)
        self._inner_word0 = (6 << 28) | flow_label  # | traffic class << 20, per frame kind
        self._pseudo_base = int.from_bytes(self.src + self.dst, "big") + NH_UDP + ends.sport + ends.dport
        self._outer = bytearray(encap.outer)
        self._outer_word0 = (6 << 28) | (int.from_bytes(encap.outer[:4], "big") & 0xFFFFF) if encap.outer else 0
        self._cache: dict[tuple[int, int, int, int], _Prepared] = {}

    @property
    def flow_label(self) -> int:
        """The inner IPv6 header's flow label (a STEV EV's upper 16 bits; 0 otherwise)."""
        return self._inner_word0 & 0xFFFFF

    def _headers(self, udp_len: int, csum: int, tclass: int) -> bytes:
        """Outer (if any) and inner IPv6 and UDP headers, both IPv6 headers with `tclass`."""
        inner = (IPV6_HDR.pack(self._inner_word0 | (tclass << 20), udp_len, NH_UDP, fmt.INNER_HOP_LIMIT, self.src, self.dst)
                 + UDP_HDR.pack(self.ends.sport, self.ends.dport, udp_len, csum))
        if not self._outer:
            return inner
        outer = self._outer
        struct.pack_into("!IH", outer, 0, self._outer_word0 | (tclass << 20), self.encap.extra + fmt.IPV6_LEN + udp_len)
        return bytes(outer) + inner

    def frame(self, roce: bytes, tclass: int = fmt.TCLASS_CONTROL) -> bytes:
        """A full frame around BTH+rest (`roce`, without ICRC): the general, slower path. Control
        packets travel as TCLASS_CONTROL; a data packet's frame says TCLASS_DATA (| CE)."""
        udp_len = fmt.UDP_LEN + len(roce) + fmt.ICRC_LEN
        body = roce + ICRC.pack(icrc(self.src, self.dst, self.ends.sport, self.ends.dport, roce))
        data = body + (b"\0" if len(body) & 1 else b"")
        total = self._pseudo_base + 2 * udp_len + int.from_bytes(data, "big")
        csum = (0xFFFF - ones_sum(total)) or 0xFFFF
        return self._headers(udp_len, csum, tclass) + body

    def _prepared(self, opcode: int, length: int, pkey: int, dest_qp: int) -> _Prepared:
        pad = -length % 4
        extra = fmt.IMMDT_LEN if opcode == WRITE_IMM else 0
        udp_len = fmt.UDP_LEN + fmt.BTH_LEN + fmt.RETH_LEN + extra + length + pad + fmt.ICRC_LEN
        headers = self._headers(udp_len, 0, self.data_tclass)
        bth8 = BTH_HDR.pack(opcode, pad << 4, pkey, dest_qp & fmt.QPN_MASK, 0)[:8]
        words = (self._pseudo_base + 2 * udp_len + int.from_bytes(bth8, "big") + length) % 0xFFFF
        scratch = bytearray(headers + bth8 + bytes(udp_len - fmt.UDP_LEN - 8))
        csum_at = len(headers) - 2
        fields_at = len(headers) + 8
        payload_at = fields_at + fmt.BTH_LEN - 8 + fmt.RETH_LEN + extra
        icrc_at = len(scratch) - fmt.ICRC_LEN
        crc = zlib.crc32(masked_bth8(bth8), icrc_prefix(self.src, self.dst, self.ends.sport, self.ends.dport,
                                                          udp_len))
        entry = _Prepared(scratch, memoryview(scratch)[fields_at:icrc_at], csum_at, fields_at, payload_at,
                          payload_at + length, icrc_at, crc, words,
                          (scratch, fields_at, payload_at, payload_at + length, icrc_at, csum_at, crc, words))
        if len(self._cache) >= self._CACHE_LIMIT:
            self._cache.clear()
        self._cache[(opcode == WRITE_ONLY, length, pkey, dest_qp)] = entry
        return entry

    def write(self, dest_qp: int, psn: int, va: int, rkey: int, payload: bytes | memoryview,
              payload_sum: int | None = None, ack_req: bool = False, imm: int | None = None,
              pkey: int = fmt.DEFAULT_PKEY) -> bytearray:
        """One RDMA WRITE data packet (WRITE_ONLY, or WRITE_ONLY_WITH_IMM when `imm` is set).

        The frame is patched into a buffer this template keeps per length and QP: it is valid
        until the next `write` of the same shape. Send it (or copy it) at once.
        """
        length = len(payload)
        e = self._cache.get((imm is None, length, pkey, dest_qp))
        if e is None:
            e = self._prepared(WRITE_ONLY if imm is None else WRITE_IMM, length, pkey, dest_qp)
        psn_word = (ack_req << 31) | (psn & 0xFFFFFF)
        if self.native:  # everything else happens in C
            return _patch(e.head, psn_word, va, rkey, imm, payload)
        frame = e.frame
        if imm is None:
            PSN_RETH.pack_into(frame, e.fields_at, psn_word, va, rkey, length)
        else:
            PSN_RETH_IMM.pack_into(frame, e.fields_at, psn_word, va, rkey, length, imm)
        frame[e.payload_at:e.payload_end] = payload
        crc = zlib.crc32(e.covered, e.crc)  # PSN, RETH, payload and pad are contiguous
        if payload_sum is None:
            payload_sum = ones_sum_of(payload)
        # Every field starts at an even offset, so a field's value is congruent to the sum of its
        # 16-bit words modulo 0xFFFF; the ICRC goes out little-endian, which is x256 modulo 0xFFFF.
        s = (e.words + psn_word + va + rkey + (imm or 0) + payload_sum + (crc << 8)) % 0xFFFF
        CSUM.pack_into(frame, e.csum_at, (0xFFFF - s) if s else 0xFFFF)  # never zero: the pseudo-header is not
        ICRC.pack_into(frame, e.icrc_at, crc)
        return frame

    def head(self, dest_qp: int, length: int, pkey: int = fmt.DEFAULT_PKEY) -> tuple:
        """The description of this template's WRITE_ONLY packets of one length and QP that the C
        fast paths encode from (wire/patch.h): its frame buffer and where each field goes."""
        e = self._cache.get((True, length, pkey, dest_qp)) or self._prepared(WRITE_ONLY, length, pkey, dest_qp)
        return e.head

    def writer(self, dest_qp: int, length: int, pkey: int = fmt.DEFAULT_PKEY):
        """A function for many WRITE_ONLY packets of one length and QP: w(psn_word, va, rkey, None,
        payload) -> frame, psn_word being AckReq << 31 | PSN. With the C extension it is the C call
        itself, bound to this shape's buffer (no Python frame per packet); else it wraps `write`."""
        e = self._cache.get((True, length, pkey, dest_qp)) or self._prepared(WRITE_ONLY, length, pkey, dest_qp)
        if self.native:
            return functools.partial(_patch, e.head)

        def write_one(psn_word: int, va: int, rkey: int, imm: None, payload: bytes | memoryview) -> bytearray:
            return self.write(dest_qp, psn_word & 0xFFFFFF, va, rkey, payload, None, bool(psn_word >> 31), None, pkey)

        return write_one

    def data(self, packet: DataPacket) -> bytes:
        if packet.ecn_ce or packet.rc_opcode is not None:  # CE as a marking switch leaves it, outer and inner
            return self.frame(encode_roce(packet), self.data_tclass | (fmt.ECN_CE if packet.ecn_ce else 0))
        return bytes(self.write(packet.dest_qp, packet.psn, packet.va, packet.rkey, packet.payload, None,
                                packet.ack_req, packet.imm, packet.pkey))

    def encode(self, packet: RocePacket) -> bytes:
        """Any packet's frame: data as TCLASS_DATA, every other packet as TCLASS_CONTROL."""
        if isinstance(packet, DataPacket):
            return self.data(packet)
        return self.frame(encode_roce(packet))


def payload_sums(buffer: bytes | bytearray | memoryview, chunk: int) -> list[int]:
    """`ones_sum_of` of every `chunk`-sized piece of a buffer (the last may be shorter), in bulk.

    numpy sums a whole message's words at C speed when the WRITE is posted, so the per
    packet cost of the UDP checksum is a few integer additions. It sums native (little
    endian) 32-bit words: modulo 0xFFFF that is the sum of the byte-swapped 16-bit words,
    and swapping bytes is multiplying by 256 (RFC 1071's byte-order independence).
    """
    if chunk <= 0 or chunk % 4:
        raise ValueError(f"chunk must be a positive multiple of 4, not {chunk}")
    view = memoryview(buffer).cast("B")
    n = len(view)
    full = n // chunk
    sums: list[int] = []
    if full:
        words = np.frombuffer(view[: full * chunk], dtype="<u4").reshape(full, chunk // 4)
        totals = words.sum(axis=1, dtype=np.uint64) % 0xFFFF * 256 % 0xFFFF
        sums = totals.tolist()
    if n % chunk:
        sums.append(ones_sum_of(view[full * chunk:]))
    return sums


def _bth(opcode: int, pad: int, pkey: int, dest_qp: int, ack_req: bool, psn: int) -> bytes:
    return BTH_HDR.pack(opcode, pad << 4, pkey, dest_qp & fmt.QPN_MASK, (int(ack_req) << 31) | (psn & fmt.PSN_MASK))


def encode_roce(packet: RocePacket) -> bytes:
    """BTH and everything after it up to (not including) the ICRC."""
    if isinstance(packet, DataPacket):
        pad = -len(packet.payload) % 4
        head = _bth(packet.opcode, pad, packet.pkey, packet.dest_qp, packet.ack_req, packet.psn)
        if packet.rc_opcode is not None:  # an RC peer's multi-packet WRITE (the tests' stand-in for one)
            if packet.rc_opcode == fmt.Opcode.RDMA_WRITE_FIRST:
                head += RETH_HDR.pack(packet.va, packet.rkey, packet.dma_len)
            elif packet.imm is not None:
                head += IMM_HDR.pack(packet.imm)
            return head + packet.payload + b"\0" * pad
        head += RETH_HDR.pack(packet.va, packet.rkey, len(packet.payload))
        if packet.imm is not None:
            head += IMM_HDR.pack(packet.imm)
        return head + packet.payload + b"\0" * pad
    if isinstance(packet, AckPacket):
        bitmap = packet.sack_bitmap
        if len(bitmap) % 4:
            raise ValueError(f"SACK bitmap is {len(bitmap)} bytes: it must be whole 32-bit words")
        flags, ce = int(packet.ecn_echo), b""
        if packet.ce_counts:
            if len(packet.ce_counts) > fmt.MAX_CE_ENTRIES:
                raise ValueError(f"{len(packet.ce_counts)} CE counts: at most {fmt.MAX_CE_ENTRIES} per ACK")
            flags |= fmt.SACK_CE_COUNTS
            ce = CE_BLOCK_HDR.pack(len(packet.ce_counts), 0) + b"".join(
                CE_ENTRY.pack(ev, count) for ev, count in packet.ce_counts)
        return (
            _bth(fmt.Opcode.ACKNOWLEDGE, 0, packet.pkey, packet.dest_qp, False, packet.psn)
            + AETH_HDR.pack((packet.syndrome << 24) | (packet.msn & 0xFFFFFF))
            + MRCX_HDR.pack(fmt.MrcxType.SACK, flags, fmt.SACK_FIXED_LEN + len(ce) + len(bitmap))
            + SACK_HDR.pack(packet.sack_base & fmt.PSN_MASK, packet.echo_psn & fmt.PSN_MASK, packet.echo_ev,
                           fmt.encode_service(packet.service_ns))
            + ce + bitmap
        )
    if isinstance(packet, TrimNackPacket):
        flags = (fmt.TRIM_FLAG_CE if packet.ecn_ce else 0) | (fmt.TRIM_FLAG_LAST_HOP if packet.last_hop else 0)
        return (
            _bth(fmt.Opcode.ACKNOWLEDGE, 0, packet.pkey, packet.dest_qp, False, packet.psn)
            + AETH_HDR.pack((fmt.Syndrome.NAK_TRIMMED << 24) | (packet.msn & 0xFFFFFF))
            + MRCX_HDR.pack(fmt.MrcxType.TRIM, flags, fmt.TRIM_EXT_LEN)
            + TRIM_HDR.pack(packet.ev, 0)
        )
    if isinstance(packet, CnpPacket):
        return (BTH_HDR.pack(fmt.Opcode.CNP, 0, packet.pkey, (fmt.BTH_BECN << 24) | (packet.dest_qp & fmt.QPN_MASK), 0)
                + bytes(fmt.CNP_PAD_LEN))
    if isinstance(packet, ProbePacket):
        return (
            _bth(fmt.Opcode.ACKNOWLEDGE, 0, packet.pkey, packet.dest_qp, False, 0)
            + AETH_HDR.pack(0)
            + MRCX_HDR.pack(fmt.MrcxType.PROBE, 0, fmt.PROBE_LEN)
            + PROBE_HDR.pack(packet.probe_id, packet.ev, 0, packet.send_time_ns)
        )
    if isinstance(packet, ProbeResponsePacket):
        return (
            _bth(fmt.Opcode.ACKNOWLEDGE, 0, packet.pkey, packet.dest_qp, False, 0)
            + AETH_HDR.pack(0)
            + MRCX_HDR.pack(fmt.MrcxType.PROBE_RESPONSE, 0, fmt.PROBE_RESPONSE_LEN)
            + PROBE_RSP_HDR.pack(packet.probe_id, packet.ev, packet.port, 0, packet.send_time_ns,
                                 min(max(0, packet.service_ns), fmt.MAX_SERVICE_NS))
        )
    if isinstance(packet, PortStatusPacket):
        return (
            _bth(fmt.Opcode.ACKNOWLEDGE, 0, packet.pkey, packet.dest_qp, False, 0)
            + AETH_HDR.pack(0)
            + MRCX_HDR.pack(fmt.MrcxType.PORT_STATUS, fmt.PORT_STATUS_FLAG_ACK if packet.ack else 0, fmt.PORT_STATUS_LEN)
            + PORT_STATUS_HDR.pack(packet.req_id, packet.port_status)
        )
    raise TypeError(f"not a packet record: {packet!r}")
