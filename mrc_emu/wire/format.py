"""Constants and records of the MRC wire format (one source of truth; docs/wire-format.md).

Why it exists: the scapy definitions (layers.py), the fast encoder (encoder.py), the decoder
(decoder.py) and the transport all speak of the same opcodes, syndromes and fields; they take them from
here. Pure data: no sockets, no scapy.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, IntEnum

ROCE_UDP_PORT = 4791
DEFAULT_PKEY = 0xFFFF
BTH_LEN = 12
RETH_LEN = 16
AETH_LEN = 4
IMMDT_LEN = 4
ICRC_LEN = 4
IPV6_LEN = 40
UDP_LEN = 8
SRH_FIXED_LEN = 8
MRCX_HEADER_LEN = 4
SACK_FIXED_LEN = 16  # MRCX header, base PSN, echo PSN, echo EV + service time; then the bitmap
SERVICE_MANTISSA_BITS = 11  # the ACK's service time: a 16-bit float of nanoseconds (5-bit exponent)


def encode_service(ns: int) -> int:
    """A service time in ns as the ACK's 16-bit field: exponent e (5 bits) and mantissa m (11
    bits) meaning m << e ns, rounded down: exact below 2.048 us, within 1/1024 above, up to
    about 73 minutes (a responder that lagged 300 ms still says so, to 0.3 ms)."""
    ns = max(0, int(ns))
    e = max(0, ns.bit_length() - SERVICE_MANTISSA_BITS)
    if e > 31:
        return 0xFFFF
    return (e << SERVICE_MANTISSA_BITS) | (ns >> e)


def decode_service(code: int) -> int:
    return (code & ((1 << SERVICE_MANTISSA_BITS) - 1)) << (code >> SERVICE_MANTISSA_BITS)
PROBE_LEN = 20
PROBE_RESPONSE_LEN = 24  # MRCX header, probe id, EV | port | resv, send time, service time
PORT_STATUS_LEN = 12  # MRCX header, request id, port-status mask
PORT_STATUS_FLAG_ACK = 0x01  # MRCX PORT_STATUS flag: this acknowledges the update it echoes
ENDPOINT_QPN = 0x2  # reserved QPN of a host's MRC endpoint (controller probes, PORT_STATUS_UPDATE)
MAX_SERVICE_NS = 0xFFFFFFFF  # a probe response's service time field (32 bits of ns, about 4.3 s)
PSN_MASK = 0xFFFFFF
QPN_MASK = 0xFFFFFF
INNER_HOP_LIMIT = 64
OUTER_HOP_LIMIT = 64
# Traffic classes (the IPv6 traffic class byte is DSCP << 2 | ECN), in the outer and the inner header alike
DSCP_TRIMMABLE = 26  # data: ECN-markable and trimmable by a congested switch port
DSCP_NO_TRIM = 24  # data that must not be trimmed (RoCEv2 RC, the baseline: its NIC knows no trims): markable, dropped
DSCP_CONTROL = 48  # ACK/NAK/SACK, probes, TRIM NACK, CNP: high priority, never marked or trimmed
DSCP_TRIMMED = 10  # set by a switch port that trimmed a data packet
DSCP_TRIMMED_LASTHOP = 11  # ... when that port faces the destination host
ECN_NOT_ECT, ECN_ECT0, ECN_CE = 0, 2, 3
ECN_MASK = 3
TCLASS_DATA = DSCP_TRIMMABLE << 2 | ECN_ECT0  # 0x6A
TCLASS_DATA_NO_TRIM = DSCP_NO_TRIM << 2 | ECN_ECT0  # 0x62
TCLASS_CONTROL = DSCP_CONTROL << 2 | ECN_NOT_ECT  # 0xC0
TRIMMED_LEN = BTH_LEN + RETH_LEN  # what a trimmed data packet keeps of its UDP payload, at least
SACK_CE_COUNTS = 0x02  # MRCX SACK flag: a CE-count block follows the fixed part
CE_ENTRY_LEN = 4  # one CE count: EV (16) | packets (16); the block starts with one more word (entries)
MAX_CE_ENTRIES = 64  # EVs one ACK reports CE counts for (the rest wait for the next ACK)
MAX_CE_COUNT = 0xFFFF
TRIM_EXT_LEN = 8  # MRCX TRIM: header and EV (16) | resv (16)
TRIM_FLAG_CE, TRIM_FLAG_LAST_HOP = 0x01, 0x02
CNP_PAD_LEN = 16  # a CNP's reserved bytes after BTH
BTH_BECN = 0x40  # BTH byte 4: FECN (0x80), BECN (0x40), then reserved


def is_trimmed(tclass: int) -> bool:
    """Whether a datagram's traffic class says a switch trimmed it (either trimmed DSCP)."""
    return (tclass >> 2) in (DSCP_TRIMMED, DSCP_TRIMMED_LASTHOP)


class Opcode(IntEnum):
    """The RC opcodes MRC uses (MRC has no READ, SEND, ATOMIC), and the multi-packet WRITE opcodes
    an RC peer sends (a real RoCE stack such as rdma_rxe: docs/interop.md), which MRC never sends
    but the responder of a go-back-N QP takes in order."""

    RDMA_WRITE_FIRST = 0x06  # RETH: the message's address and whole length
    RDMA_WRITE_MIDDLE = 0x07
    RDMA_WRITE_LAST = 0x08
    RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x09  # ImmDt
    RDMA_WRITE_ONLY = 0x0A
    RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x0B
    ACKNOWLEDGE = 0x11
    CNP = 0x81


class Syndrome(IntEnum):
    """AETH syndrome: bits 6:5 = 00 ACK, 11 NAK with the code in the low bits."""

    ACK = 0x00
    NAK_PSN_SEQUENCE = 0x60
    NAK_INVALID_REQUEST = 0x61
    NAK_REMOTE_ACCESS = 0x62
    NAK_REMOTE_OPERATIONAL = 0x63
    NAK_TRIMMED = 0x65  # MRC: a switch trimmed this PSN (IBA reserves NAK codes 5-31); with an MRCX TRIM


class MrcxType(IntEnum):
    """Type of the MRC extension header carried after AETH in an ACKNOWLEDGE."""

    SACK = 1
    PROBE = 2  # an EV probe (request): answered by the destination's MRC endpoint
    TRIM = 3
    PROBE_RESPONSE = 4  # the answer to a PROBE: echoes it, adds the arrival port and the service time
    PORT_STATUS = 5  # PORT_STATUS_UPDATE (flags bit0 clear) or its acknowledgement (bit0 set)


class DropReason(str, Enum):
    """Why a received frame was not handed to the transport (counted, never raised)."""

    TRUNCATED = "truncated"
    NOT_IPV6 = "not_ipv6"
    BAD_IP_LENGTH = "bad_ip_length"
    BAD_SRH = "bad_srh"
    NOT_UDP = "not_udp"
    NOT_ROCE_PORT = "not_roce_port"
    BAD_UDP_LENGTH = "bad_udp_length"
    BAD_UDP_CHECKSUM = "bad_udp_checksum"
    BAD_ICRC = "bad_icrc"
    UNKNOWN_OPCODE = "unknown_opcode"
    BAD_VERSION = "bad_transport_version"
    BAD_LENGTH = "bad_length"
    BAD_EXTENSION = "bad_extension"
    NOT_TRIMMED = "not_a_trimmed_data_packet"


@dataclass(frozen=True)
class Endpoints:
    """Inner addressing of a packet: what the ICRC and UDP checksum cover."""

    src: str
    dst: str
    sport: int
    dport: int = ROCE_UDP_PORT


# The packet records are slots classes, not frozen ones: the decoder builds one per received
# packet, and a frozen dataclass's __init__ costs three times as much. Treat them as values.


@dataclass(slots=True)
class DataPacket:
    """An RDMA WRITE packet: carries its own address, so it is placed on its own.

    `rc_opcode`: None for MRC's own packets (WRITE_ONLY, or WRITE_ONLY_WITH_IMMEDIATE with
    `imm`); an RC peer's multi-packet message is FIRST (RETH: `va`, `rkey`, and `dma_len` the
    whole message's length), MIDDLE and LAST (no RETH: `va` and `rkey` 0) or LAST_WITH_IMMEDIATE
    (`imm`), placed after the FIRST of its message (transport/responder.py)."""

    dest_qp: int
    psn: int
    va: int
    rkey: int
    payload: bytes | memoryview  # the decoder hands out a view into the received datagram
    ack_req: bool = False
    imm: int | None = None  # set on the last packet of a WRITE_WITH_IMM
    pkey: int = DEFAULT_PKEY
    ecn_ce: bool = False
    rc_opcode: int | None = None  # FIRST, MIDDLE, LAST or LAST_WITH_IMMEDIATE (None: ONLY)
    dma_len: int = -1  # a FIRST's RETH: the whole message's length

    @property
    def opcode(self) -> Opcode:
        if self.rc_opcode is not None:
            return Opcode(self.rc_opcode)
        return Opcode.RDMA_WRITE_ONLY if self.imm is None else Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE


@dataclass(slots=True)
class AckPacket:
    """ACKNOWLEDGE: cumulative PSN, AETH, and the MRC SACK extension.

    psn: every PSN up to and including this one has arrived (the RoCE meaning).
    sack_bitmap: bit i set <=> PSN sack_base + i has arrived (bytes, MSB first).
    echo_psn / echo_ev: the data packet that triggered this ACK, for per-EV RTT.
    service_ns: how long the responder held that packet before this ACK left (from its arrival
    to the ACK's send; a 16-bit float of ns on the wire, `encode_service`): the requester takes it out of the RTT sample,
    so a responder that is slow to answer does not read as a queue in the network.
    """

    dest_qp: int
    psn: int
    syndrome: int = Syndrome.ACK
    msn: int = 0
    sack_base: int = 0
    echo_psn: int = 0
    echo_ev: int = 0
    ecn_echo: bool = False
    sack_bitmap: bytes = b""
    pkey: int = DEFAULT_PKEY
    service_ns: int = 0
    ce_counts: tuple[tuple[int, int], ...] = ()  # (EV, CE-marked data packets since the last ACK)

    @property
    def is_nak(self) -> bool:
        return (self.syndrome & 0x60) == 0x60


@dataclass(slots=True)
class TrimNackPacket:
    """A TRIM NACK: a switch trimmed data packet `psn` on `ev`; resend it (docs/wire-format.md).

    last_hop: the trimming port faced the responder (DSCP_TRIMMED_LASTHOP); ecn_ce: the trimmed
    packet was CE-marked as well; msn as in the responder's ACKs."""

    dest_qp: int
    psn: int
    ev: int
    last_hop: bool = False
    ecn_ce: bool = False
    msn: int = 0
    pkey: int = DEFAULT_PKEY


@dataclass(slots=True)
class CnpPacket:
    """A RoCEv2 congestion notification packet (DCQCN's NP to its RP): a CE mark reached the QP."""

    dest_qp: int
    pkey: int = DEFAULT_PKEY


@dataclass(slots=True)
class TrimmedPacket:
    """What is left of a data packet a switch trimmed: BTH and RETH (no payload, no ICRC)."""

    dest_qp: int
    psn: int
    va: int
    rkey: int
    dma_len: int
    ack_req: bool = False
    pkey: int = DEFAULT_PKEY


@dataclass(slots=True)
class ProbePacket:
    """An EV probe request: an ACKNOWLEDGE that travels out along an EV (the data packets' own
    path) to the destination's MRC endpoint: the QP's responder (`dest_qp` its QPN) or the host's
    endpoint (ENDPOINT_QPN, a controller probe). The fabric check sends one to its own address
    through the destination's End SID, so that the kernel turns it around."""

    dest_qp: int
    probe_id: int
    ev: int
    send_time_ns: int
    pkey: int = DEFAULT_PKEY


@dataclass(slots=True)
class ProbeResponsePacket:
    """The answer to an EV probe, sent back along the reverse EV by the endpoint that got it:
    the probe's id, EV and send time echoed, the 1-based port it arrived at (port p + 1: the
    NIC on plane p; 0 unknown) and the responder's service time (the probe's arrival to this
    response's send, ns)."""

    dest_qp: int
    probe_id: int
    ev: int
    send_time_ns: int
    port: int = 0
    service_ns: int = 0
    pkey: int = DEFAULT_PKEY


@dataclass(slots=True)
class PortStatusPacket:
    """PORT_STATUS_UPDATE between two hosts' endpoints (ENDPOINT_QPN): `port_status` is the
    sender's port-status mask (bit p set: its 1-based port p is usable), `req_id` numbers the
    update; `ack`: the receiver's acknowledgement, echoing both."""

    dest_qp: int
    req_id: int
    port_status: int
    ack: bool = False
    pkey: int = DEFAULT_PKEY


RocePacket = DataPacket | AckPacket | ProbePacket | TrimNackPacket | CnpPacket | ProbeResponsePacket | PortStatusPacket
