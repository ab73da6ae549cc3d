"""The fast path: encode packets from pre-built byte templates, decode without scapy.

Why it exists: scapy builds about a thousand packets a second; the data path needs a
hundred times that. A FrameTemplate holds the outer and inner headers of one (QP, EV)
pair as bytes; encoding patches lengths, PSN, address, ICRC and UDP checksum in. The
golden tests (tests/test_wire_golden.py) prove the bytes equal scapy's for every packet
type and EV format. The decoder never raises on hostile input: every problem is a
DropReason, and every read is bounds-checked by struct.
"""

from __future__ import annotations

import functools
import ipaddress
import socket
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
from .format import AckPacket, DataPacket, DropReason, Endpoints, ProbePacket, RocePacket

_IPV6 = struct.Struct("!IHBB16s16s")
_UDP = struct.Struct("!HHHH")
_BTH = struct.Struct("!BBHII")
_RETH = struct.Struct("!QII")
_AETH = struct.Struct("!I")
_IMM = struct.Struct("!I")
_MRCX = struct.Struct("!BBH")
_SACK = struct.Struct("!IIHH")
_PROBE = struct.Struct("!IHHQ")
_SRH = struct.Struct("!BBBBBBH")
_ICRC = struct.Struct("<I")
_PSN_RETH = struct.Struct("!IQII")
_CSUM = struct.Struct("!H")
_PSN_RETH_IMM = struct.Struct("!IQIII")

NH_ROUTING = 43
NH_IPV6 = 41
NH_UDP = 17
_WRITE_ONLY = int(fmt.Opcode.RDMA_WRITE_ONLY)
_WRITE_IMM = int(fmt.Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE)
_ACK = int(fmt.Opcode.ACKNOWLEDGE)
_ICRC_MASKED_LEAD = b"\xff" * 8 + b"\x6f\xff\xff\xff"  # pseudo LRH, version + TC + flow label all ones


def _packed(address: str) -> bytes:
    return ipaddress.IPv6Address(address).packed


def _ones_sum(total: int) -> int:
    """Fold a sum of big-endian 16-bit words the way the Internet checksum does."""
    s = total % 0xFFFF
    return s or (0xFFFF if total else 0)


def _icrc_head(src: bytes, dst: bytes, sport: int, dport: int, udp_len: int) -> bytes:
    """What the ICRC covers before BTH: 8 bytes 0xFF, the inner IPv6 header with traffic class,
    flow label and hop limit all ones, the UDP header with checksum 0xFFFF."""
    return (_ICRC_MASKED_LEAD + struct.pack("!HBB", udp_len, NH_UDP, 0xFF) + src + dst
            + _UDP.pack(sport, dport, udp_len, 0xFFFF))


_prefix_cache: dict[tuple[bytes, bytes, int, int, int], int] = {}


def _icrc_prefix(src: bytes, dst: bytes, sport: int, dport: int, udp_len: int) -> int:
    """CRC-32 state after `_icrc_head`, cached per addresses, ports and length."""
    key = (src, dst, sport, dport, udp_len)
    crc = _prefix_cache.get(key)
    if crc is None:
        crc = zlib.crc32(_icrc_head(src, dst, sport, dport, udp_len))
        if len(_prefix_cache) >= 4096:
            _prefix_cache.clear()
        _prefix_cache[key] = crc
    return crc


def _masked_bth8(bth: bytes | memoryview) -> bytes:
    """BTH's first 8 bytes as the ICRC sees them: byte 4 (FECN, BECN, reserved) all ones."""
    return bytes(bth[:4]) + b"\xff" + bytes(bth[5:8])


def icrc(src: bytes, dst: bytes, sport: int, dport: int, roce: bytes) -> int:
    """RoCEv2 ICRC (CRC-32) over the masked inner IPv6/UDP headers, BTH and the rest (`roce`)."""
    udp_len = fmt.UDP_LEN + len(roce) + fmt.ICRC_LEN
    crc = zlib.crc32(_masked_bth8(roce), _icrc_prefix(src, dst, sport, dport, udp_len))
    return zlib.crc32(memoryview(roce)[8:], crc)


# ---- encapsulation -------------------------------------------------------------------------

def _srh(segments: list[str] | tuple[str, ...]) -> bytes:
    """An SRH over the inner IPv6 packet, first segment active (Segments Left = Last Entry)."""
    n = len(segments)
    return _SRH.pack(NH_IPV6, 2 * n, 4, n - 1, n - 1, 0, 0) + b"".join(_packed(s) for s in reversed(segments))


def _outer_ipv6(src: str, dst: str, flow_label: int) -> bytes:
    """The outer IPv6 header, followed by an SRH; payload length zero (patched per frame)."""
    return _IPV6.pack((6 << 28) | (fmt.TRAFFIC_CLASS << 20) | flow_label, 0, NH_ROUTING, fmt.OUTER_HOP_LIMIT,
                      _packed(src), _packed(dst))


@dataclass(frozen=True)
class Encap:
    """The outer headers of one EV format for one path (empty for the UDP format)."""

    outer: bytes  # outer IPv6 (+ SRH), payload length field zero
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

    def __init__(self, ends: Endpoints, encap: Encap, flow_label: int = 0, native: bool | None = None) -> None:
        self.native = _fastpath is not None if native is None else (native and _fastpath is not None)
        self.ends = ends
        self.encap = encap
        self.src = _packed(ends.src)
        self.dst = _packed(ends.dst)
        self._inner_word0 = (6 << 28) | (fmt.TRAFFIC_CLASS << 20) | flow_label
        self._pseudo_base = int.from_bytes(self.src + self.dst, "big") + NH_UDP + ends.sport + ends.dport
        self._outer = bytearray(encap.outer)
        self._cache: dict[tuple[int, int, int, int], _Prepared] = {}

    def _headers(self, udp_len: int, csum: int, word0: int) -> bytes:
        inner = _IPV6.pack(word0, udp_len, NH_UDP, fmt.INNER_HOP_LIMIT, self.src, self.dst) + _UDP.pack(
            self.ends.sport, self.ends.dport, udp_len, csum)
        if not self._outer:
            return inner
        outer = self._outer
        struct.pack_into("!H", outer, 4, self.encap.extra + fmt.IPV6_LEN + udp_len)
        return bytes(outer) + inner

    def frame(self, roce: bytes, ecn_ce: bool = False) -> bytes:
        """A full frame around BTH+rest (`roce`, without ICRC): the general, slower path."""
        udp_len = fmt.UDP_LEN + len(roce) + fmt.ICRC_LEN
        body = roce + _ICRC.pack(icrc(self.src, self.dst, self.ends.sport, self.ends.dport, roce))
        data = body + (b"\0" if len(body) & 1 else b"")
        total = self._pseudo_base + 2 * udp_len + int.from_bytes(data, "big")
        csum = (0xFFFF - _ones_sum(total)) or 0xFFFF
        word0 = self._inner_word0 | (0x300000 if ecn_ce else 0)
        return self._headers(udp_len, csum, word0) + body

    def _prepared(self, opcode: int, length: int, pkey: int, dest_qp: int) -> _Prepared:
        pad = -length % 4
        extra = fmt.IMMDT_LEN if opcode == _WRITE_IMM else 0
        udp_len = fmt.UDP_LEN + fmt.BTH_LEN + fmt.RETH_LEN + extra + length + pad + fmt.ICRC_LEN
        headers = self._headers(udp_len, 0, self._inner_word0)
        bth8 = _BTH.pack(opcode, pad << 4, pkey, dest_qp & fmt.QPN_MASK, 0)[:8]
        words = (self._pseudo_base + 2 * udp_len + int.from_bytes(bth8, "big") + length) % 0xFFFF
        scratch = bytearray(headers + bth8 + bytes(udp_len - fmt.UDP_LEN - 8))
        csum_at = len(headers) - 2
        fields_at = len(headers) + 8
        payload_at = fields_at + fmt.BTH_LEN - 8 + fmt.RETH_LEN + extra
        icrc_at = len(scratch) - fmt.ICRC_LEN
        crc = zlib.crc32(_masked_bth8(bth8), _icrc_prefix(self.src, self.dst, self.ends.sport, self.ends.dport,
                                                          udp_len))
        entry = _Prepared(scratch, memoryview(scratch)[fields_at:icrc_at], csum_at, fields_at, payload_at,
                          payload_at + length, icrc_at, crc, words,
                          (scratch, fields_at, payload_at, payload_at + length, icrc_at, csum_at, crc, words))
        if len(self._cache) >= self._CACHE_LIMIT:
            self._cache.clear()
        self._cache[(opcode == _WRITE_ONLY, length, pkey, dest_qp)] = entry
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
            e = self._prepared(_WRITE_ONLY if imm is None else _WRITE_IMM, length, pkey, dest_qp)
        psn_word = (ack_req << 31) | (psn & 0xFFFFFF)
        if self.native:  # everything else happens in C
            return _patch(e.head, psn_word, va, rkey, imm, payload)
        frame = e.frame
        if imm is None:
            _PSN_RETH.pack_into(frame, e.fields_at, psn_word, va, rkey, length)
        else:
            _PSN_RETH_IMM.pack_into(frame, e.fields_at, psn_word, va, rkey, length, imm)
        frame[e.payload_at:e.payload_end] = payload
        crc = zlib.crc32(e.covered, e.crc)  # PSN, RETH, payload and pad are contiguous
        if payload_sum is None:
            payload_sum = ones_sum_of(payload)
        # Every field starts at an even offset, so a field's value is congruent to the sum of its
        # 16-bit words modulo 0xFFFF; the ICRC goes out little-endian, which is x256 modulo 0xFFFF.
        s = (e.words + psn_word + va + rkey + (imm or 0) + payload_sum + (crc << 8)) % 0xFFFF
        _CSUM.pack_into(frame, e.csum_at, (0xFFFF - s) if s else 0xFFFF)  # never zero: the pseudo-header is not
        _ICRC.pack_into(frame, e.icrc_at, crc)
        return frame

    def writer(self, dest_qp: int, length: int, pkey: int = fmt.DEFAULT_PKEY):
        """A function for many WRITE_ONLY packets of one length and QP: w(psn_word, va, rkey, None,
        payload) -> frame, psn_word being AckReq << 31 | PSN. With the C extension it is the C call
        itself, bound to this shape's buffer (no Python frame per packet); else it wraps `write`."""
        e = self._cache.get((True, length, pkey, dest_qp)) or self._prepared(_WRITE_ONLY, length, pkey, dest_qp)
        if self.native:
            return functools.partial(_patch, e.head)

        def write_one(psn_word: int, va: int, rkey: int, imm: None, payload: bytes | memoryview) -> bytearray:
            return self.write(dest_qp, psn_word & 0xFFFFFF, va, rkey, payload, None, bool(psn_word >> 31), None, pkey)

        return write_one

    def data(self, packet: DataPacket) -> bytes:
        if packet.ecn_ce:
            return self.frame(encode_roce(packet), True)
        return bytes(self.write(packet.dest_qp, packet.psn, packet.va, packet.rkey, packet.payload, None,
                                packet.ack_req, packet.imm, packet.pkey))

    def encode(self, packet: RocePacket) -> bytes:
        if isinstance(packet, DataPacket):
            return self.data(packet)
        return self.frame(encode_roce(packet))


def ones_sum_of(payload: bytes | memoryview) -> int:
    """The payload's big-endian 16-bit words summed modulo 0xFFFF (padding is zeros)."""
    value = int.from_bytes(payload, "big")
    if len(payload) & 1:
        value <<= 8
    return value % 0xFFFF


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
    return _BTH.pack(opcode, pad << 4, pkey, dest_qp & fmt.QPN_MASK, (int(ack_req) << 31) | (psn & fmt.PSN_MASK))


def encode_roce(packet: RocePacket) -> bytes:
    """BTH and everything after it up to (not including) the ICRC."""
    if isinstance(packet, DataPacket):
        pad = -len(packet.payload) % 4
        head = _bth(packet.opcode, pad, packet.pkey, packet.dest_qp, packet.ack_req, packet.psn)
        head += _RETH.pack(packet.va, packet.rkey, len(packet.payload))
        if packet.imm is not None:
            head += _IMM.pack(packet.imm)
        return head + packet.payload + b"\0" * pad
    if isinstance(packet, AckPacket):
        bitmap = packet.sack_bitmap
        if len(bitmap) % 4:
            raise ValueError(f"SACK bitmap is {len(bitmap)} bytes: it must be whole 32-bit words")
        return (
            _bth(fmt.Opcode.ACKNOWLEDGE, 0, packet.pkey, packet.dest_qp, False, packet.psn)
            + _AETH.pack((packet.syndrome << 24) | (packet.msn & 0xFFFFFF))
            + _MRCX.pack(fmt.MrcxType.SACK, int(packet.ecn_echo), fmt.SACK_FIXED_LEN + len(bitmap))
            + _SACK.pack(packet.sack_base & fmt.PSN_MASK, packet.echo_psn & fmt.PSN_MASK, packet.echo_ev, 0)
            + bitmap
        )
    if isinstance(packet, ProbePacket):
        return (
            _bth(fmt.Opcode.ACKNOWLEDGE, 0, packet.pkey, packet.dest_qp, False, 0)
            + _AETH.pack(0)
            + _MRCX.pack(fmt.MrcxType.PROBE, 0, fmt.PROBE_LEN)
            + _PROBE.pack(packet.probe_id, packet.ev, 0, packet.send_time_ns)
        )
    raise TypeError(f"not a packet record: {packet!r}")


# ---- decoding ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Received:
    packet: RocePacket
    ends: Endpoints
    segments_left: int | None = None  # of the SRH, when the frame still had one


def decode_roce(payload: bytes, ends: Endpoints, ecn_ce: bool = False) -> RocePacket | DropReason:
    """Decode the UDP payload of a RoCEv2 packet (what a UDP socket on port 4791 receives)."""
    try:
        src, dst = _packed(ends.src), _packed(ends.dst)
    except ValueError:
        return DropReason.NOT_IPV6
    return _decode_roce(payload, src, dst, ends.sport, ends.dport, ecn_ce)


def _decode_roce(payload: bytes | memoryview, src: bytes, dst: bytes, sport: int, dport: int,
                 ecn_ce: bool) -> RocePacket | DropReason:
    n = len(payload)
    if n < fmt.BTH_LEN + fmt.ICRC_LEN:
        return DropReason.TRUNCATED
    view = memoryview(payload)
    crc = _icrc_prefix(src, dst, sport, dport, n + fmt.UDP_LEN)
    crc = zlib.crc32(view[5:n - 4], zlib.crc32(bytes(view[:4]) + b"\xff", crc))
    if _ICRC.unpack_from(view, n - 4)[0] != crc:
        return DropReason.BAD_ICRC
    opcode, flags, pkey, qp_word, psn_word = _BTH.unpack_from(view, 0)
    if flags & 0x0F:
        return DropReason.BAD_VERSION
    end = n - 4
    if opcode == _WRITE_ONLY or opcode == _WRITE_IMM:
        pad = (flags >> 4) & 0x3
        offset = fmt.BTH_LEN + fmt.RETH_LEN + (fmt.IMMDT_LEN if opcode == _WRITE_IMM else 0)
        if end < offset + pad:
            return DropReason.TRUNCATED
        va, rkey, dma_len = _RETH.unpack_from(view, fmt.BTH_LEN)
        imm = _IMM.unpack_from(view, offset - fmt.IMMDT_LEN)[0] if opcode == _WRITE_IMM else None
        if dma_len != end - pad - offset:
            return DropReason.BAD_LENGTH
        return DataPacket(qp_word & fmt.QPN_MASK, psn_word & fmt.PSN_MASK, va, rkey, view[offset:end - pad],
                          bool(psn_word >> 31), imm, pkey, ecn_ce)
    if opcode == _ACK:
        body = view[:end]
        dest_qp = qp_word & fmt.QPN_MASK
        psn = psn_word & fmt.PSN_MASK
        offset = fmt.BTH_LEN
        if end < offset + fmt.AETH_LEN:
            return DropReason.TRUNCATED
        (aeth,) = _AETH.unpack_from(body, offset)
        offset += fmt.AETH_LEN
        syndrome, msn = aeth >> 24, aeth & 0xFFFFFF
        if end == offset:
            return AckPacket(dest_qp, psn, syndrome, msn, pkey=pkey)
        if end < offset + fmt.MRCX_HEADER_LEN:
            return DropReason.TRUNCATED
        ext_type, ext_flags, ext_len = _MRCX.unpack_from(body, offset)
        if ext_len != end - offset:
            return DropReason.BAD_EXTENSION
        if ext_type == fmt.MrcxType.SACK and ext_len >= fmt.SACK_FIXED_LEN and ext_len % 4 == 0:
            base, echo, echo_ev, _ = _SACK.unpack_from(body, offset + fmt.MRCX_HEADER_LEN)
            bitmap = bytes(body[offset + fmt.SACK_FIXED_LEN:])
            return AckPacket(dest_qp, psn, syndrome, msn, base & fmt.PSN_MASK, echo & fmt.PSN_MASK, echo_ev,
                             bool(ext_flags & 1), bitmap, pkey)
        if ext_type == fmt.MrcxType.PROBE and ext_len == fmt.PROBE_LEN:
            probe_id, ev, _, send_time = _PROBE.unpack_from(body, offset + fmt.MRCX_HEADER_LEN)
            return ProbePacket(dest_qp, probe_id, ev, send_time, pkey)
        return DropReason.BAD_EXTENSION
    return DropReason.UNKNOWN_OPCODE


@dataclass(frozen=True)
class Opened:
    """What the kernel's UDP socket hands over for a frame: the inner addresses and UDP payload."""

    payload: memoryview
    src: bytes
    dst: bytes
    sport: int
    dport: int
    ecn_ce: bool
    segments_left: int | None


def open_frame(frame: bytes | memoryview) -> Opened | DropReason:
    """Strip outer IPv6 (+ SRH) and inner IPv6 + UDP, checking lengths and the UDP checksum.

    This is what the destination's kernel does for a real packet (decapsulate, check the
    checksum, deliver to port 4791); the in-memory link and pcap readers do it here.
    """
    frame = memoryview(frame)
    segments_left = None
    if len(frame) < fmt.IPV6_LEN:
        return DropReason.TRUNCATED
    word0, plen, nh, _hlim, src, dst = _IPV6.unpack_from(frame, 0)
    if word0 >> 28 != 6:
        return DropReason.NOT_IPV6
    if plen != len(frame) - fmt.IPV6_LEN:
        return DropReason.BAD_IP_LENGTH
    offset = fmt.IPV6_LEN
    if nh == NH_ROUTING:
        if len(frame) < offset + fmt.SRH_FIXED_LEN:
            return DropReason.TRUNCATED
        nh, hdr_len, rtype, segments_left, last_entry, _, _ = _SRH.unpack_from(frame, offset)
        srh_len = 8 + 8 * hdr_len
        if rtype != 4 or last_entry * 16 + 16 > srh_len - 8 or segments_left > last_entry:
            return DropReason.BAD_SRH
        if len(frame) < offset + srh_len:
            return DropReason.TRUNCATED
        offset += srh_len
    if nh == NH_IPV6:
        if len(frame) < offset + fmt.IPV6_LEN:
            return DropReason.TRUNCATED
        word0, plen, nh, _hlim, src, dst = _IPV6.unpack_from(frame, offset)
        if word0 >> 28 != 6:
            return DropReason.NOT_IPV6
        if plen != len(frame) - offset - fmt.IPV6_LEN:
            return DropReason.BAD_IP_LENGTH
        offset += fmt.IPV6_LEN
    if nh != NH_UDP:
        return DropReason.NOT_UDP
    if len(frame) < offset + fmt.UDP_LEN:
        return DropReason.TRUNCATED
    sport, dport, ulen, csum = _UDP.unpack_from(frame, offset)
    if dport != fmt.ROCE_UDP_PORT:
        return DropReason.NOT_ROCE_PORT
    if ulen != len(frame) - offset:
        return DropReason.BAD_UDP_LENGTH
    segment = frame[offset:]
    # a correct checksum makes the one's-complement sum over pseudo-header and segment 0xFFFF
    total = int.from_bytes(src + dst, "big") + ulen + NH_UDP + ones_sum_of(segment)
    if csum == 0 or _ones_sum(total) != 0xFFFF:
        return DropReason.BAD_UDP_CHECKSUM
    return Opened(segment[fmt.UDP_LEN:], src, dst, sport, dport, (word0 >> 20) & 0x3 == 0x3, segments_left)


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
