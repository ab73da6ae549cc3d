"""A pcap reader for the tests that owes nothing to mrc_emu: frames, RoCE data packets, reassembly.

Why it exists: a capture proves what crossed a host's links only if it is read by code other than
the code that wrote the packets. This reads the classic pcap format (Ethernet or Linux cooked v2
link types), walks the IPv6 headers (an SRv6 routing header and an inner IPv6 header, when the
packet is encapsulated), takes UDP to port 4791, and from each RDMA WRITE its BTH PSN and its
RETH VA and payload (the layout of docs/wire-format.md, written out again here from the RoCEv2
spec's field sizes). It never imports mrc_emu.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

LINKTYPE_ETHERNET, LINKTYPE_LINUX_SLL2 = 1, 276
ETHERTYPE_IPV6 = 0x86DD
IPPROTO_ROUTING, IPPROTO_IPV6, IPPROTO_UDP = 43, 41, 17
ROCE_PORT = 4791
WRITE_ONLY, WRITE_ONLY_IMM = 0x0A, 0x0B
BTH, RETH, IMM, ICRC = 12, 16, 4, 4


@dataclass
class Frame:
    ifindex: int | None  # Linux cooked v2 only
    data: bytes  # from the IPv6 header on
    wire_length: int  # the packet's length before the snaplen cut it


@dataclass
class Write:
    """One RDMA WRITE data packet as captured."""

    encapsulated: bool  # it had an SRv6 routing header (as it crossed a link), not the kernel's decapsulated copy
    psn: int
    va: int
    payload: bytes


def frames(path: Path) -> Iterator[Frame]:
    raw = Path(path).read_bytes()
    magic = raw[:4]
    endian = {b"\xd4\xc3\xb2\xa1": "<", b"\x4d\x3c\xb2\xa1": "<", b"\xa1\xb2\xc3\xd4": ">", b"\xa1\xb2\x3c\x4d": ">"}[magic]
    linktype = struct.unpack(endian + "I", raw[20:24])[0] & 0x0FFFFFFF
    offset = 24
    while offset + 16 <= len(raw):
        _, _, included, original = struct.unpack(endian + "IIII", raw[offset:offset + 16])
        record = raw[offset + 16:offset + 16 + included]
        offset += 16 + included
        if linktype == LINKTYPE_LINUX_SLL2:  # protocol (2), reserved (2), ifindex (4), ... 20 bytes
            protocol, ifindex = struct.unpack("!H2xI", record[:8])
            if protocol == ETHERTYPE_IPV6:
                yield Frame(ifindex, record[20:], original - 20)
        elif linktype == LINKTYPE_ETHERNET:
            if struct.unpack("!H", record[12:14])[0] == ETHERTYPE_IPV6:
                yield Frame(None, record[14:], original - 14)
        else:
            raise ValueError(f"{path}: link type {linktype} is neither Ethernet nor Linux cooked v2")


def count(path: Path) -> int:
    """Every record of the file, whatever it holds."""
    raw = Path(path).read_bytes()
    endian = "<" if raw[:4] in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1") else ">"
    offset, n = 24, 0
    while offset + 16 <= len(raw):
        offset += 16 + struct.unpack(endian + "I", raw[offset + 8:offset + 12])[0]
        n += 1
    return n


def writes(path: Path) -> Iterator[Write]:
    for frame in frames(path):
        data, encapsulated = frame.data, False
        next_header, at = data[6], 40
        while next_header in (IPPROTO_ROUTING, IPPROTO_IPV6):
            if next_header == IPPROTO_ROUTING:
                encapsulated = True
                next_header, at = data[at], at + (data[at + 1] + 1) * 8
            else:  # the inner IPv6 header
                next_header, at = data[at + 6], at + 40
        if next_header != IPPROTO_UDP or struct.unpack("!H", data[at + 2:at + 4])[0] != ROCE_PORT:
            continue
        roce = data[at + 8:]
        opcode = roce[0]
        if opcode not in (WRITE_ONLY, WRITE_ONLY_IMM):
            continue
        psn = struct.unpack("!I", roce[8:12])[0] & 0xFFFFFF
        va, _rkey, length = struct.unpack("!QII", roce[BTH:BTH + RETH])
        start = BTH + RETH + (IMM if opcode == WRITE_ONLY_IMM else 0)
        payload = roce[start:start + length]
        if len(payload) != length:
            raise ValueError(f"{path}: PSN {psn} carries {len(payload)} of its {length} bytes (snaplen or a trim)")
        yield Write(encapsulated, psn, va, payload)


def reassemble(packets: list[Write], size: int) -> tuple[bytes, int]:
    """Place every payload at its VA, from the lowest VA seen; (the bytes, how many were covered)."""
    base = min(w.va for w in packets)
    buffer, covered = bytearray(size), bytearray(size)
    for w in packets:
        start = w.va - base
        if start < 0 or start + len(w.payload) > size:
            raise ValueError(f"PSN {w.psn}: VA {w.va:#x} + {len(w.payload)} falls outside {size} bytes from {base:#x}")
        buffer[start:start + len(w.payload)] = w.payload
        covered[start:start + len(w.payload)] = b"\x01" * len(w.payload)
    return bytes(buffer), covered.count(1)


def sha256_of(path: Path, size: int, encapsulated_only: bool = True) -> tuple[str, int, int]:
    """SHA-256 of the WRITE reassembled from a pcap; (digest, data packets used, bytes covered)."""
    packets = [w for w in writes(path) if w.encapsulated or not encapsulated_only]
    data, covered = reassemble(packets, size)
    return hashlib.sha256(data).hexdigest(), len(packets), covered
