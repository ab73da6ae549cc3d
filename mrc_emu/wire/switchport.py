"""What a switch egress port reads of a frame and does to its bytes, as the port program does it.

Why it exists: the virtual fabric's ports must see and change frames exactly as the port
program (fabric/bpf/port.bpf.c) does in the namespace fabric, so that its marks and trims are
the same bytes: `classify` reads what the program's classify() reads (is it RoCEv2 data, may it
be trimmed, is it ECN-capable, where are its innermost IPv6 and UDP headers), `mark_ce` sets CE
in the outer and the inner traffic class (mark_ce()), `trim` cuts a data packet to its headers
and `trim_bytes` of UDP payload with the trimmed DSCP in both headers, every length and the UDP
checksum fixed (trim()). The verdict (which of these to do) is topology/port_verdict.py's.
Frames here start at the IPv6 header (the transport's frames have no Ethernet header); offsets
are from there, and `ETH_LEN` is what a link carries in front of each frame.

What it must never do: decide anything (thresholds, probabilities are the verdict's), keep
state, or raise on a hostile frame (what it cannot read is not data, and is left alone).
"""

from __future__ import annotations

from .format import DSCP_TRIMMABLE, DSCP_TRIMMED, DSCP_TRIMMED_LASTHOP, ECN_CE, IPV6_LEN, ROCE_UDP_PORT, UDP_LEN
from .headers import CSUM, NH_IPV6, NH_ROUTING, NH_UDP, WRITE_IMM, WRITE_ONLY, ones_sum, ones_sum_of

ETH_LEN = 14  # the Ethernet header in front of every frame on a link: what TBF and the port program count (skb->len)

# (innermost IPv6 offset, UDP offset, data, trim_ok, ect) of a frame that is no RoCEv2 data packet
NOT_DATA = (0, 0, False, False, False)
_TRIMMED = (DSCP_TRIMMED, DSCP_TRIMMED_LASTHOP)


def tclass(frame: bytes | bytearray, at: int) -> int:
    """The traffic class of the IPv6 header at `at`."""
    return ((frame[at] & 0x0F) << 4) | (frame[at + 1] >> 4)


def classify(frame: bytes | bytearray) -> tuple[int, int, bool, bool, bool]:
    """(innermost IPv6 offset, UDP offset, data, trim_ok, ect), as port.bpf.c's classify():
    outer IPv6, then an SRH, then an inner IPv6, then UDP to port 4791 and the BTH opcode. `data`:
    a WRITE_ONLY or WRITE_ONLY_WITH_IMMEDIATE (what is marked and trimmed, and queued behind the
    control class); `trim_ok`: DSCP_TRIMMABLE; `ect`: ECT(0) or ECT(1). A frame a switch trimmed
    already (either trimmed DSCP) is not data: it is never marked or trimmed again."""
    n = len(frame)
    if n < 8:
        return NOT_DATA
    nh, tc, inner, off = frame[6], tclass(frame, 0), 0, IPV6_LEN
    if nh == NH_ROUTING:
        if n < off + 2:
            return NOT_DATA
        nh, off = frame[off], off + 8 + 8 * frame[off + 1]
    if nh == NH_IPV6:
        if n < off + 8:
            return NOT_DATA
        nh, tc, inner, off = frame[off + 6], tclass(frame, off), off, off + IPV6_LEN
    if nh != NH_UDP or n < off + 9 or (frame[off + 2] << 8 | frame[off + 3]) != ROCE_UDP_PORT:
        return NOT_DATA
    dscp = tc >> 2
    if dscp in _TRIMMED:
        return NOT_DATA
    opcode = frame[off + 8]
    return inner, off, opcode == WRITE_ONLY or opcode == WRITE_IMM, dscp == DSCP_TRIMMABLE, (tc & 3) in (1, 2)


def _set_tclass(frame: bytearray, at: int, or_ecn: int, dscp: int | None) -> None:
    tc = tclass(frame, at) | or_ecn
    if dscp is not None:
        tc = (dscp << 2) | (tc & 3)
    frame[at] = (frame[at] & 0xF0) | (tc >> 4)
    frame[at + 1] = (frame[at + 1] & 0x0F) | ((tc << 4) & 0xF0)


def mark_ce(frame: bytearray, inner: int) -> None:
    """CE in the outer traffic class and, when there is one, the inner's (the destination's kernel
    decapsulates without copying it: the endpoint reads the inner one)."""
    _set_tclass(frame, 0, ECN_CE, None)
    if inner:
        _set_tclass(frame, inner, ECN_CE, None)


def trimmed_length(udp: int, trim_bytes: int) -> int:
    """A frame's length once trimmed: its headers up to UDP's, UDP's, and `trim_bytes` of payload."""
    return udp + UDP_LEN + trim_bytes


def trim(frame: bytearray, inner: int, udp: int, trim_bytes: int, lasthop: bool) -> None:
    """Cut `frame` to its headers and `trim_bytes` of UDP payload (BTH and RETH: what the receiver
    needs to NACK the PSN), DSCP_TRIMMED (DSCP_TRIMMED_LASTHOP on a port facing a host) in both
    traffic classes with their ECN kept, the IPv6 payload lengths, the UDP length and the UDP
    checksum (over the innermost header's pseudo header; never 0) set for what is left."""
    new_len = trimmed_length(udp, trim_bytes)
    del frame[new_len:]
    CSUM.pack_into(frame, 4, new_len - IPV6_LEN)
    if inner:
        CSUM.pack_into(frame, inner + 4, new_len - inner - IPV6_LEN)
    udp_len = UDP_LEN + trim_bytes
    CSUM.pack_into(frame, udp + 4, udp_len)
    dscp = DSCP_TRIMMED_LASTHOP if lasthop else DSCP_TRIMMED
    _set_tclass(frame, 0, 0, dscp)
    if inner:
        _set_tclass(frame, inner, 0, dscp)
    CSUM.pack_into(frame, udp + 6, 0)
    total = ones_sum_of(frame[inner + 8:inner + 40]) + udp_len + NH_UDP + ones_sum_of(frame[udp:new_len])
    check = 0xFFFF - ones_sum(total)
    CSUM.pack_into(frame, udp + 6, check or 0xFFFF)
