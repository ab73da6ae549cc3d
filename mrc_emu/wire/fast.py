"""The fast path: encode packets from pre-built byte templates, decode without scapy.

Why it exists: scapy builds about a thousand packets a second; the data path needs a
hundred times that. A FrameTemplate holds the outer and inner headers of one (QP, EV)
pair as bytes; encoding patches lengths, PSN, address, ICRC and UDP checksum in. The
golden tests (tests/test_wire_golden.py) prove the bytes equal scapy's for every packet
type and EV format. The decoder never raises on hostile input: every problem is a
DropReason, and every read is bounds-checked by struct.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
import zlib
from dataclasses import dataclass

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

NH_ROUTING = 43
NH_IPV6 = 41
NH_UDP = 17
_ICRC_MASKED_LEAD = b"\xff" * 8 + b"\x6f\xff\xff\xff"  # pseudo LRH, version + TC + flow label all ones


def _packed(address: str) -> bytes:
    return ipaddress.IPv6Address(address).packed


def _ones_sum(total: int) -> int:
    """Fold a sum of big-endian 16-bit words the way the Internet checksum does."""
    s = total % 0xFFFF
    return s or (0xFFFF if total else 0)


def icrc(src: bytes, dst: bytes, sport: int, dport: int, roce: bytes) -> int:
    """RoCEv2 ICRC (CRC-32) over the masked inner IPv6/UDP headers, BTH and the rest (`roce`)."""
    udp_len = fmt.UDP_LEN + len(roce) + fmt.ICRC_LEN
    head = (
        _ICRC_MASKED_LEAD
        + struct.pack("!HBB", udp_len, NH_UDP, 0xFF)
        + src + dst
        + _UDP.pack(sport, dport, udp_len, 0xFFFF)
        + roce[:4] + b"\xff" + roce[5:fmt.BTH_LEN]
    )
    return zlib.crc32(memoryview(roce)[fmt.BTH_LEN:], zlib.crc32(head))


# ---- encapsulation -------------------------------------------------------------------------

@dataclass(frozen=True)
class Encap:
    """The outer headers of one EV format for one path (empty for the UDP format)."""

    outer: bytes  # outer IPv6 (+ SRH), payload length field zero
    extra: int  # bytes of outer payload before the inner IPv6 header (SRH size)

    @classmethod
    def srv6(cls, src: str, segments: list[str] | tuple[str, ...], flow_label: int = 0) -> Encap:
        n = len(segments)
        srh = _SRH.pack(NH_IPV6, 2 * n, 4, n - 1, n - 1, 0, 0) + b"".join(
            _packed(s) for s in reversed(segments)
        )
        ipv6 = _IPV6.pack((6 << 28) | (fmt.TRAFFIC_CLASS << 20) | flow_label, 0, NH_ROUTING,
                          fmt.OUTER_HOP_LIMIT, _packed(src), _packed(segments[0]))
        return cls(ipv6 + srh, len(srh))

    @classmethod
    def usid(cls, src: str, carrier: str, final: str, flow_label: int = 0) -> Encap:
        """Carrier in the destination, plus a one-segment SRH (Segments Left 0) naming `final`,
        so the destination host's kernel decapsulates it like any spent SRH."""
        srh = _SRH.pack(NH_IPV6, 2, 4, 0, 0, 0, 0) + _packed(final)
        ipv6 = _IPV6.pack((6 << 28) | (fmt.TRAFFIC_CLASS << 20) | flow_label, 0, NH_ROUTING,
                          fmt.OUTER_HOP_LIMIT, _packed(src), _packed(carrier))
        return cls(ipv6 + srh, len(srh))

    @classmethod
    def udp(cls) -> Encap:
        return cls(b"", 0)

    @property
    def outer_dst(self) -> bytes | None:
        return self.outer[24:40] if self.outer else None


class FrameTemplate:
    """Headers of one (endpoints, EV) pair, ready to have a packet's fields patched in."""

    def __init__(self, ends: Endpoints, encap: Encap, flow_label: int = 0) -> None:
        self.ends = ends
        self.encap = encap
        self.src = _packed(ends.src)
        self.dst = _packed(ends.dst)
        self._inner_word0 = (6 << 28) | (fmt.TRAFFIC_CLASS << 20) | flow_label
        self._pseudo_base = int.from_bytes(self.src + self.dst, "big") + NH_UDP + ends.sport + ends.dport
        self._outer = bytearray(encap.outer)

    def frame(self, roce: bytes, ecn_ce: bool = False) -> bytes:
        """A full frame around BTH+rest (`roce`, without ICRC)."""
        udp_len = fmt.UDP_LEN + len(roce) + fmt.ICRC_LEN
        body = roce + _ICRC.pack(icrc(self.src, self.dst, self.ends.sport, self.ends.dport, roce))
        data = body + (b"\0" if len(body) & 1 else b"")
        total = self._pseudo_base + 2 * udp_len + int.from_bytes(data, "big")
        csum = (0xFFFF - _ones_sum(total)) or 0xFFFF
        word0 = self._inner_word0 | (0x300000 if ecn_ce else 0)
        inner = _IPV6.pack(word0, udp_len, NH_UDP, fmt.INNER_HOP_LIMIT, self.src, self.dst) + _UDP.pack(
            self.ends.sport, self.ends.dport, udp_len, csum
        )
        if not self._outer:
            return inner + body
        outer = self._outer
        struct.pack_into("!H", outer, 4, self.encap.extra + fmt.IPV6_LEN + udp_len)
        return bytes(outer) + inner + body

    def data(self, packet: DataPacket) -> bytes:
        return self.frame(encode_roce(packet), packet.ecn_ce)

    def encode(self, packet: RocePacket) -> bytes:
        return self.frame(encode_roce(packet), getattr(packet, "ecn_ce", False))


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


def _decode_roce(payload: bytes, src: bytes, dst: bytes, sport: int, dport: int,
                 ecn_ce: bool) -> RocePacket | DropReason:
    n = len(payload)
    if n < fmt.BTH_LEN + fmt.ICRC_LEN:
        return DropReason.TRUNCATED
    body = payload[:-4]
    if _ICRC.unpack_from(payload, n - 4)[0] != icrc(src, dst, sport, dport, body):
        return DropReason.BAD_ICRC
    opcode, flags, pkey, qp_word, psn_word = _BTH.unpack_from(body, 0)
    if flags & 0x0F:
        return DropReason.BAD_VERSION
    pad = (flags >> 4) & 0x3
    dest_qp = qp_word & fmt.QPN_MASK
    psn = psn_word & fmt.PSN_MASK
    ack_req = bool(psn_word >> 31)
    offset = fmt.BTH_LEN
    if opcode in (fmt.Opcode.RDMA_WRITE_ONLY, fmt.Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE):
        imm_len = fmt.IMMDT_LEN if opcode == fmt.Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE else 0
        if len(body) < offset + fmt.RETH_LEN + imm_len + pad:
            return DropReason.TRUNCATED
        va, rkey, dma_len = _RETH.unpack_from(body, offset)
        offset += fmt.RETH_LEN
        imm = _IMM.unpack_from(body, offset)[0] if imm_len else None
        offset += imm_len
        data = body[offset:len(body) - pad]
        if dma_len != len(data):
            return DropReason.BAD_LENGTH
        return DataPacket(dest_qp, psn, va, rkey, bytes(data), ack_req, imm, pkey, ecn_ce)
    if opcode == fmt.Opcode.ACKNOWLEDGE:
        if len(body) < offset + fmt.AETH_LEN:
            return DropReason.TRUNCATED
        (aeth,) = _AETH.unpack_from(body, offset)
        offset += fmt.AETH_LEN
        syndrome, msn = aeth >> 24, aeth & 0xFFFFFF
        if len(body) == offset:
            return AckPacket(dest_qp, psn, syndrome, msn, pkey=pkey)
        if len(body) < offset + fmt.MRCX_HEADER_LEN:
            return DropReason.TRUNCATED
        ext_type, ext_flags, ext_len = _MRCX.unpack_from(body, offset)
        if ext_len != len(body) - offset:
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


def decode_frame(frame: bytes) -> Received | DropReason:
    """Decode a whole IPv6 frame in any EV format (pcaps, the in-memory link, fuzzing)."""
    segments_left = None
    offset = 0
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
    total = int.from_bytes(src + dst, "big") + ulen + NH_UDP + int.from_bytes(
        segment + b"\0" if ulen & 1 else segment, "big")
    if csum == 0 or _ones_sum(total) != 0xFFFF:
        return DropReason.BAD_UDP_CHECKSUM
    ecn_ce = (word0 >> 20) & 0x3 == 0x3
    decoded = _decode_roce(segment[fmt.UDP_LEN:], src, dst, sport, dport, ecn_ce)
    if isinstance(decoded, DropReason):
        return decoded
    ends = Endpoints(socket.inet_ntop(socket.AF_INET6, src), socket.inet_ntop(socket.AF_INET6, dst), sport, dport)
    return Received(decoded, ends, segments_left)
