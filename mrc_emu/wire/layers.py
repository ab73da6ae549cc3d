"""scapy definitions of every packet MRC sends: the reference the fast path is checked against.

Why it exists: scapy 2.8's RoCE support has BTH and AETH but no RETH, ImmDt or our
SACK/probe extension, and it computes ICRC only when UDP sits right on the IPv6 header
that carries it. We add the missing layers, bind them so any frame or pcap dissects to the
full stack, and build frames in the encapsulation model (outer IPv6 [+ SRH] / inner IPv6 /
UDP / BTH ...), where the ICRC covers the inner headers that SRv6 hops never rewrite.
Slow (about 1k packets/s): never on the data path.
"""

from __future__ import annotations

from scapy.contrib.roce import AETH, BTH, CNPPadding
from scapy.fields import (
    BitField,
    ByteEnumField,
    ByteField,
    ConditionalField,
    FieldLenField,
    IntField,
    PacketListField,
    ShortField,
    StrLenField,
    XIntField,
    XLongField,
)
from scapy.layers.inet import UDP
from scapy.layers.inet6 import IPv6, IPv6ExtHdrSegmentRouting
from scapy.packet import Packet, Raw, bind_layers

from . import format as fmt


class RETH(Packet):
    """RDMA Extended Transport Header: where this packet's bytes go."""

    name = "RETH"
    fields_desc = [XLongField("va", 0), XIntField("rkey", 0), IntField("dma_len", 0)]


class ImmDt(Packet):
    """Immediate data of a WRITE_WITH_IMM, delivered with its completion."""

    name = "ImmDt"
    fields_desc = [XIntField("imm", 0)]


class MRCX(Packet):
    """MRC extension header after AETH: a SACK bitmap or an EV probe (docs/wire-format.md)."""

    name = "MRCX"
    fields_desc = [
        ByteEnumField("ext_type", fmt.MrcxType.SACK, {t.value: t.name for t in fmt.MrcxType}),
        ByteField("flags", 0),
        ShortField("length", None),
    ]

    def post_build(self, p: bytes, pay: bytes) -> bytes:
        if self.length is None:
            p = p[:2] + (len(p) + len(pay)).to_bytes(2, "big") + p[4:]
        return p + pay

    def guess_payload_class(self, payload: bytes):
        return {fmt.MrcxType.SACK: MRCXSack, fmt.MrcxType.PROBE: MRCXProbe, fmt.MrcxType.TRIM: MRCXTrim,
                fmt.MrcxType.PROBE_RESPONSE: MRCXProbeResponse,
                fmt.MrcxType.PORT_STATUS: MRCXPortStatus}.get(self.ext_type, Packet)


class MRCXCeCount(Packet):
    """One entry of a SACK's CE-count block: CE-marked data packets of one EV since the last ACK."""

    name = "MRCX CE count"
    fields_desc = [ShortField("ev", 0), ShortField("count", 0)]

    def extract_padding(self, s: bytes):
        return b"", s


def _has_ce_block(pkt: Packet) -> bool:
    return pkt.underlayer is not None and bool(pkt.underlayer.flags & fmt.SACK_CE_COUNTS)


def _bitmap_len(pkt: Packet) -> int:
    mrcx = pkt.underlayer
    if mrcx is None or not mrcx.length:
        return 0
    ce = 4 + fmt.CE_ENTRY_LEN * (pkt.ce_entries or 0) if _has_ce_block(pkt) else 0
    return mrcx.length - fmt.SACK_FIXED_LEN - ce


class MRCXSack(Packet):
    name = "MRCX SACK"
    fields_desc = [
        BitField("resv_base", 0, 8),
        BitField("sack_base", 0, 24),
        BitField("resv_echo", 0, 8),
        BitField("echo_psn", 0, 24),
        ShortField("echo_ev", 0),
        ShortField("service", 0),  # the responder's service time of the echoed packet (format.encode_service)
        # with MRCX flag SACK_CE_COUNTS: CE-marked packets per EV since the last ACK
        ConditionalField(FieldLenField("ce_entries", None, count_of="ce_counts"), _has_ce_block),
        ConditionalField(ShortField("ce_resv", 0), _has_ce_block),
        ConditionalField(PacketListField("ce_counts", [], MRCXCeCount, count_from=lambda pkt: pkt.ce_entries),
                         _has_ce_block),
        StrLenField("bitmap", b"", length_from=_bitmap_len),
    ]


class MRCXTrim(Packet):
    """A TRIM NACK's extension: the EV the trimmed packet came by (flags: CE, last hop)."""

    name = "MRCX Trim"
    fields_desc = [ShortField("ev", 0), ShortField("resv", 0)]


class MRCXProbe(Packet):
    name = "MRCX Probe"
    fields_desc = [
        XIntField("probe_id", 0),
        ShortField("ev", 0),
        ShortField("resv", 0),
        XLongField("send_time_ns", 0),
    ]


class MRCXProbeResponse(Packet):
    """An EV probe's answer: the probe echoed, the 1-based arrival port, the service time in ns."""

    name = "MRCX Probe Response"
    fields_desc = [
        XIntField("probe_id", 0),
        ShortField("ev", 0),
        ByteField("port", 0),
        ByteField("resv", 0),
        XLongField("send_time_ns", 0),
        IntField("service_ns", 0),
    ]


class MRCXPortStatus(Packet):
    """PORT_STATUS_UPDATE (or, MRCX flags bit0, its acknowledgement): the sender's 1-based port mask."""

    name = "MRCX Port Status"
    fields_desc = [IntField("req_id", 0), XIntField("port_status", 0)]


def _reth_payload(self: RETH, payload: bytes):
    bth = self.underlayer
    if isinstance(bth, BTH) and bth.opcode == fmt.Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE:
        return ImmDt
    return Packet.guess_payload_class(self, payload)


RETH.guess_payload_class = _reth_payload
bind_layers(BTH, RETH, opcode=fmt.Opcode.RDMA_WRITE_ONLY)
bind_layers(BTH, RETH, opcode=fmt.Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE)
bind_layers(AETH, MRCX)


# ---- building frames -----------------------------------------------------------------------

def roce_layers(packet: fmt.RocePacket) -> Packet:
    """BTH and what follows it, for one packet record (ICRC left for scapy to compute)."""
    if isinstance(packet, fmt.DataPacket):
        pad = -len(packet.payload) % 4  # IBA: payload padded to 4 bytes, PadCnt says how many
        bth = BTH(opcode=int(packet.opcode), padcount=pad, pkey=packet.pkey, dqpn=packet.dest_qp,
                  ackreq=int(packet.ack_req), psn=packet.psn)
        body = bth / RETH(va=packet.va, rkey=packet.rkey, dma_len=len(packet.payload))
        if packet.imm is not None:
            body = body / ImmDt(imm=packet.imm)
        padded = packet.payload + b"\0" * pad
        return body / Raw(padded) if padded else body
    if isinstance(packet, fmt.AckPacket):
        flags = int(packet.ecn_echo) | (fmt.SACK_CE_COUNTS if packet.ce_counts else 0)
        mrcx = MRCX(ext_type=fmt.MrcxType.SACK, flags=flags)
        sack = MRCXSack(sack_base=packet.sack_base, echo_psn=packet.echo_psn, echo_ev=packet.echo_ev,
                        service=fmt.encode_service(packet.service_ns), bitmap=packet.sack_bitmap)
        if packet.ce_counts:
            sack.ce_counts = [MRCXCeCount(ev=ev, count=count) for ev, count in packet.ce_counts]
        return (
            BTH(opcode=fmt.Opcode.ACKNOWLEDGE, pkey=packet.pkey, dqpn=packet.dest_qp, psn=packet.psn)
            / AETH(syndrome=packet.syndrome, msn=packet.msn) / mrcx / sack
        )
    if isinstance(packet, fmt.TrimNackPacket):
        flags = (fmt.TRIM_FLAG_CE if packet.ecn_ce else 0) | (fmt.TRIM_FLAG_LAST_HOP if packet.last_hop else 0)
        return (
            BTH(opcode=fmt.Opcode.ACKNOWLEDGE, pkey=packet.pkey, dqpn=packet.dest_qp, psn=packet.psn)
            / AETH(syndrome=fmt.Syndrome.NAK_TRIMMED, msn=packet.msn)
            / MRCX(ext_type=fmt.MrcxType.TRIM, flags=flags) / MRCXTrim(ev=packet.ev)
        )
    if isinstance(packet, fmt.CnpPacket):  # scapy's own CNP (contrib.roce.cnp), with our P_Key
        return BTH(opcode=fmt.Opcode.CNP, becn=1, pkey=packet.pkey, dqpn=packet.dest_qp, psn=0) / CNPPadding()
    if isinstance(packet, fmt.ProbePacket):
        return (
            BTH(opcode=fmt.Opcode.ACKNOWLEDGE, pkey=packet.pkey, dqpn=packet.dest_qp, psn=0)
            / AETH(syndrome=fmt.Syndrome.ACK, msn=0)
            / MRCX(ext_type=fmt.MrcxType.PROBE)
            / MRCXProbe(probe_id=packet.probe_id, ev=packet.ev, send_time_ns=packet.send_time_ns)
        )
    if isinstance(packet, fmt.ProbeResponsePacket):
        return (
            BTH(opcode=fmt.Opcode.ACKNOWLEDGE, pkey=packet.pkey, dqpn=packet.dest_qp, psn=0)
            / AETH(syndrome=fmt.Syndrome.ACK, msn=0)
            / MRCX(ext_type=fmt.MrcxType.PROBE_RESPONSE)
            / MRCXProbeResponse(probe_id=packet.probe_id, ev=packet.ev, port=packet.port,
                                send_time_ns=packet.send_time_ns,
                                service_ns=min(max(0, packet.service_ns), fmt.MAX_SERVICE_NS))
        )
    if isinstance(packet, fmt.PortStatusPacket):
        return (
            BTH(opcode=fmt.Opcode.ACKNOWLEDGE, pkey=packet.pkey, dqpn=packet.dest_qp, psn=0)
            / AETH(syndrome=fmt.Syndrome.ACK, msn=0)
            / MRCX(ext_type=fmt.MrcxType.PORT_STATUS, flags=fmt.PORT_STATUS_FLAG_ACK if packet.ack else 0)
            / MRCXPortStatus(req_id=packet.req_id, port_status=packet.port_status)
        )
    raise TypeError(f"not a packet record: {packet!r}")


def traffic_class(packet: fmt.RocePacket) -> int:
    """Data: DSCP_TRIMMABLE, ECT(0) (CE when marked); everything else: DSCP_CONTROL, Not-ECT."""
    if isinstance(packet, fmt.DataPacket):
        return fmt.TCLASS_DATA | (fmt.ECN_CE if packet.ecn_ce else 0)
    return fmt.TCLASS_CONTROL


def inner(packet: fmt.RocePacket, ends: fmt.Endpoints, flow_label: int = 0) -> Packet:
    """Inner IPv6 / UDP / RoCE: what the ICRC covers and the destination host receives."""
    return (
        IPv6(src=ends.src, dst=ends.dst, tc=traffic_class(packet), fl=flow_label, hlim=fmt.INNER_HOP_LIMIT)
        / UDP(sport=ends.sport, dport=ends.dport)
        / roce_layers(packet)
    )


def srv6_frame(packet: fmt.RocePacket, ends: fmt.Endpoints, segments: list[str], flow_label: int = 0) -> Packet:
    """SRV6 EV format: outer IPv6 + SRH (segments in path order; the SRH stores them reversed)."""
    return (
        IPv6(src=ends.src, dst=segments[0], tc=traffic_class(packet), fl=flow_label, hlim=fmt.OUTER_HOP_LIMIT)
        / IPv6ExtHdrSegmentRouting(addresses=list(reversed(segments)), segleft=len(segments) - 1,
                                   lastentry=len(segments) - 1, nh=41)
        / inner(packet, ends, flow_label)
    )


def usid_frame(packet: fmt.RocePacket, ends: fmt.Endpoints, carrier: str, final: str,
               flow_label: int = 0) -> Packet:
    """SRV6_USID EV format: the outer destination is the NEXT-C-SID carrier, plus the optional
    single-segment SRH (Segments Left 0) that lets the last host decapsulate natively."""
    return (
        IPv6(src=ends.src, dst=carrier, tc=traffic_class(packet), fl=flow_label, hlim=fmt.OUTER_HOP_LIMIT)
        / IPv6ExtHdrSegmentRouting(addresses=[final], segleft=0, lastentry=0, nh=41)
        / inner(packet, ends, flow_label)
    )


def udp_frame(packet: fmt.RocePacket, ends: fmt.Endpoints, flow_label: int = 0) -> Packet:
    """UDP EV format: plain RoCEv2, the fabric's hash on the source port picks the path."""
    return inner(packet, ends, flow_label)
