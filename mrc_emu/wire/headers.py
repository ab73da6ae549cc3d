"""Byte layouts of the headers and the two checksums, shared by the encoder and the decoder.

Why it exists: encoder.py writes these headers and decoder.py reads them; both must agree on
every offset and on how the UDP checksum (one's complement over 16-bit words) and the RoCEv2
ICRC (CRC-32 over masked headers) are computed. The field values come from format.py.
Pure functions over bytes: no sockets, no scapy.
"""

from __future__ import annotations

import ipaddress
import struct
import zlib

from . import format as fmt

IPV6_HDR = struct.Struct("!IHBB16s16s")
UDP_HDR = struct.Struct("!HHHH")
BTH_HDR = struct.Struct("!BBHII")
RETH_HDR = struct.Struct("!QII")
AETH_HDR = struct.Struct("!I")
IMM_HDR = struct.Struct("!I")
MRCX_HDR = struct.Struct("!BBH")
SACK_HDR = struct.Struct("!IIHH")
PROBE_HDR = struct.Struct("!IHHQ")
PROBE_RSP_HDR = struct.Struct("!IHBBQI")  # probe id | EV | port | resv | send time | service ns
PORT_STATUS_HDR = struct.Struct("!II")  # request id | port-status mask
CE_BLOCK_HDR = struct.Struct("!HH")  # entries | resv
CE_ENTRY = struct.Struct("!HH")  # EV | CE-marked packets
TRIM_HDR = struct.Struct("!HH")  # EV | resv
SRH_HDR = struct.Struct("!BBBBBBH")
ICRC = struct.Struct("<I")  # the ICRC goes out little-endian
PSN_RETH = struct.Struct("!IQII")  # BTH's PSN word then RETH: what a data packet patches per packet
PSN_RETH_IMM = struct.Struct("!IQIII")
CSUM = struct.Struct("!H")

NH_ROUTING = 43
NH_IPV6 = 41
NH_UDP = 17
WRITE_FIRST = int(fmt.Opcode.RDMA_WRITE_FIRST)
WRITE_LAST_IMM = int(fmt.Opcode.RDMA_WRITE_LAST_WITH_IMMEDIATE)
WRITE_ONLY = int(fmt.Opcode.RDMA_WRITE_ONLY)
WRITE_IMM = int(fmt.Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE)
ACK = int(fmt.Opcode.ACKNOWLEDGE)
_ICRC_MASKED_LEAD = b"\xff" * 8 + b"\x6f\xff\xff\xff"  # pseudo LRH, version + TC + flow label all ones


def packed(address: str) -> bytes:
    return ipaddress.IPv6Address(address).packed


def ones_sum(total: int) -> int:
    """Fold a sum of big-endian 16-bit words the way the Internet checksum does."""
    s = total % 0xFFFF
    return s or (0xFFFF if total else 0)


def ones_sum_of(payload: bytes | memoryview) -> int:
    """The payload's big-endian 16-bit words summed modulo 0xFFFF (padding is zeros)."""
    value = int.from_bytes(payload, "big")
    if len(payload) & 1:
        value <<= 8
    return value % 0xFFFF


def _icrc_head(src: bytes, dst: bytes, sport: int, dport: int, udp_len: int) -> bytes:
    """What the ICRC covers before BTH: 8 bytes 0xFF, the inner IPv6 header with traffic class,
    flow label and hop limit all ones, the UDP header with checksum 0xFFFF."""
    return (_ICRC_MASKED_LEAD + struct.pack("!HBB", udp_len, NH_UDP, 0xFF) + src + dst
            + UDP_HDR.pack(sport, dport, udp_len, 0xFFFF))


_prefix_cache: dict[tuple[bytes, bytes, int, int, int], int] = {}


def icrc_prefix(src: bytes, dst: bytes, sport: int, dport: int, udp_len: int) -> int:
    """CRC-32 state after `_icrc_head`, cached per addresses, ports and length."""
    key = (src, dst, sport, dport, udp_len)
    crc = _prefix_cache.get(key)
    if crc is None:
        crc = zlib.crc32(_icrc_head(src, dst, sport, dport, udp_len))
        if len(_prefix_cache) >= 4096:
            _prefix_cache.clear()
        _prefix_cache[key] = crc
    return crc


def masked_bth8(bth: bytes | memoryview) -> bytes:
    """BTH's first 8 bytes as the ICRC sees them: byte 4 (FECN, BECN, reserved) all ones."""
    return bytes(bth[:4]) + b"\xff" + bytes(bth[5:8])


def icrc(src: bytes, dst: bytes, sport: int, dport: int, roce: bytes) -> int:
    """RoCEv2 ICRC (CRC-32) over the masked inner IPv6/UDP headers, BTH and the rest (`roce`)."""
    udp_len = fmt.UDP_LEN + len(roce) + fmt.ICRC_LEN
    crc = zlib.crc32(masked_bth8(roce), icrc_prefix(src, dst, sport, dport, udp_len))
    return zlib.crc32(memoryview(roce)[8:], crc)
