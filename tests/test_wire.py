"""Wire format: the fast path equals scapy byte for byte; the decoder survives hostile input."""

import random
import shutil
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scapy.compat import raw
from scapy.contrib.roce import cnp as scapy_cnp
from scapy.packet import fuzz
from scapy.utils import PcapWriter

from mrc_emu.topology import addressing as ad
from mrc_emu.topology import builtin, evs_between
from mrc_emu.wire import decoder, encoder, headers, layers
from mrc_emu.wire import format as fmt

TOPO = builtin()
EV = evs_between(TOPO, "h0", "h2")[3]
SRC, DST = ad.host_address(TOPO, "h0"), ad.host_address(TOPO, "h2")

needs_fastpath = pytest.mark.skipif(encoder._fastpath is None, reason="the C fast path (mrc_emu.wire._fastpath) "
                                    "is not built: python setup.py build_ext --inplace")

u24 = st.integers(0, 0xFFFFFF)
u32 = st.integers(0, 0xFFFFFFFF)
data_packets = st.builds(
    fmt.DataPacket, dest_qp=u24, psn=u24, va=st.integers(0, 2**64 - 1), rkey=u32,
    payload=st.binary(min_size=0, max_size=1500), ack_req=st.booleans(),
    imm=st.none() | u32, pkey=st.integers(0, 0xFFFF),
)
ack_packets = st.builds(
    fmt.AckPacket, dest_qp=u24, psn=u24, syndrome=st.sampled_from(list(fmt.Syndrome)), msn=u24,
    sack_base=u24, echo_psn=u24, echo_ev=st.integers(0, 0xFFFF), ecn_echo=st.booleans(),
    sack_bitmap=st.integers(0, 8).flatmap(lambda n: st.binary(min_size=4 * n, max_size=4 * n)),
    service_ns=st.integers(0, 0xFFFF).map(fmt.decode_service),
    ce_counts=st.lists(st.tuples(st.integers(0, 0xFFFF), st.integers(0, 0xFFFF)), max_size=fmt.MAX_CE_ENTRIES).map(tuple),
)
trim_nacks = st.builds(fmt.TrimNackPacket, dest_qp=u24, psn=u24, ev=st.integers(0, 0xFFFF), last_hop=st.booleans(),
                       ecn_ce=st.booleans(), msn=u24, pkey=st.integers(0, 0xFFFF))
cnps = st.builds(fmt.CnpPacket, dest_qp=u24, pkey=st.integers(0, 0xFFFF))
probe_packets = st.builds(fmt.ProbePacket, dest_qp=u24, probe_id=u32, ev=st.integers(0, 0xFFFF),
                          send_time_ns=st.integers(0, 2**64 - 1))
probe_responses = st.builds(fmt.ProbeResponsePacket, dest_qp=u24, probe_id=u32, ev=st.integers(0, 0xFFFF),
                            send_time_ns=st.integers(0, 2**64 - 1), port=st.integers(0, 255), service_ns=u32,
                            pkey=st.integers(0, 0xFFFF))
port_statuses = st.builds(fmt.PortStatusPacket, dest_qp=u24, req_id=u32, port_status=u32, ack=st.booleans(),
                          pkey=st.integers(0, 0xFFFF))
packets = data_packets | ack_packets | probe_packets | trim_nacks | cnps | probe_responses | port_statuses
formats = st.sampled_from(["SRV6", "SRV6_USID", "UDP"])


def both(packet, ev_format, sport=0xC003, flow_label=0):
    ends = fmt.Endpoints(SRC, DST, sport)
    if ev_format == "SRV6":
        return (layers.srv6_frame(packet, ends, list(EV.segments), flow_label),
                encoder.Encap.srv6(SRC, EV.segments, flow_label), ends)
    if ev_format == "SRV6_USID":
        return (layers.usid_frame(packet, ends, EV.usid_carrier, EV.segments[-1], flow_label),
                encoder.Encap.usid(SRC, EV.usid_carrier, EV.segments[-1], flow_label), ends)
    return layers.udp_frame(packet, ends, flow_label), encoder.Encap.udp(), ends


@settings(max_examples=300, deadline=None)
@given(packets, formats, st.integers(0xC000, 0xFFFF), st.integers(0, 0xFFFFF), st.booleans())
def test_fast_encoder_equals_scapy(packet, ev_format, sport, flow_label, native):
    """Both fast paths, the C extension's (native) and the pure-Python one, make scapy's bytes."""
    reference, encap, ends = both(packet, ev_format, sport, flow_label)
    frame = encoder.FrameTemplate(ends, encap, flow_label, native=native).encode(packet)
    assert frame == raw(reference)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 0xFFFFFF), st.booleans(), st.integers(0, 2**64 - 1), st.integers(0, 2**32 - 1),
       st.binary(min_size=1, max_size=600), formats, st.booleans())
def test_per_shape_writer_equals_scapy(psn, ack_req, va, rkey, payload, ev_format, native):
    """The transport's per-shape writer (the C call bound to one buffer) makes scapy's bytes too."""
    packet = fmt.DataPacket(0x22, psn, va, rkey, payload, ack_req)
    reference, encap, ends = both(packet, ev_format)
    writer = encoder.FrameTemplate(ends, encap, native=native).writer(0x22, len(payload))
    assert bytes(writer((ack_req << 31) | psn, va, rkey, None, payload)) == raw(reference)


@needs_fastpath
@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.integers(0, 9100), st.integers(0, 2**32 - 1), st.integers(0, 15))
def test_native_crc32_equals_zlib(short, length, start, skew):
    """Short inputs, and payload-sized ones at any alignment (the carry-less multiply path)."""
    import random
    import zlib

    assert encoder._fastpath.crc32(short, start) == zlib.crc32(short, start)
    long = memoryview(random.Random(length).randbytes(length + skew))[skew:]
    assert encoder._fastpath.crc32(long, start) == zlib.crc32(long, start)


@settings(max_examples=300, deadline=None)
@given(packets, formats)
def test_decode_inverts_encode(packet, ev_format):
    _, encap, ends = both(packet, ev_format)
    got = decoder.decode_frame(encoder.FrameTemplate(ends, encap).encode(packet))
    assert isinstance(got, decoder.Received), got
    assert got.packet == packet and got.ends == ends


def test_icrc_is_little_endian_crc32_of_masked_headers():
    packet = fmt.DataPacket(1, 2, 3, 4, b"abcd")
    frame = raw(layers.udp_frame(packet, fmt.Endpoints(SRC, DST, 0xC000)))
    assert frame[-4:] == headers.ICRC.pack(headers.icrc(headers.packed(SRC), headers.packed(DST), 0xC000, 4791,
                                                    frame[48:-4]))


def test_scapy_dissects_full_stack():
    packet = fmt.DataPacket(9, 77, 0x1000, 0x42, b"xyz", imm=5)
    frame, _, _ = both(packet, "SRV6")
    again = layers.IPv6(raw(frame))
    for layer in (layers.IPv6ExtHdrSegmentRouting, layers.UDP, layers.BTH, layers.RETH, layers.ImmDt):
        assert layer in again
    ack, _, _ = both(fmt.AckPacket(1, 2, sack_bitmap=b"\x80\0\0\0"), "SRV6_USID")
    assert layers.MRCXSack in layers.IPv6(raw(ack))


def _valid_frames():
    rng = random.Random(7)
    out = []
    for ev_format in ("SRV6", "SRV6_USID", "UDP"):
        for packet in (fmt.DataPacket(1, 2, 3, 4, bytes(rng.randrange(256) for _ in range(64)), imm=9),
                       fmt.AckPacket(1, 2, sack_bitmap=b"\xff\0\0\1"), fmt.ProbePacket(1, 2, 3, 4)):
            reference, encap, ends = both(packet, ev_format)
            out.append(encoder.FrameTemplate(ends, encap).encode(packet))
    return out


@pytest.mark.parametrize("mutate, reason", [
    (lambda f: f[:30], fmt.DropReason.TRUNCATED),
    (lambda f: b"\x45" + f[1:], fmt.DropReason.NOT_IPV6),
    (lambda f: f + b"\0", fmt.DropReason.BAD_IP_LENGTH),
    (lambda f: f[:-1] + bytes([f[-1] ^ 1]), fmt.DropReason.BAD_UDP_CHECKSUM),
])
def test_typed_drop_reasons(mutate, reason):
    frame = _valid_frames()[0]
    assert decoder.decode_frame(mutate(frame)) == reason


def test_bad_icrc_and_unknown_opcode_and_length():
    ends = fmt.Endpoints(SRC, DST, 0xC000)
    tmpl = encoder.FrameTemplate(ends, encoder.Encap.udp())
    roce = encoder.encode_roce(fmt.DataPacket(1, 2, 3, 4, b"abcd"))
    good = tmpl.frame(roce)
    payload = good[48:]
    assert decoder.decode_roce(payload[:-1] + bytes([payload[-1] ^ 0xFF]), ends) == fmt.DropReason.BAD_ICRC
    assert decoder.decode_frame(tmpl.frame(b"\x1f" + roce[1:])) == fmt.DropReason.UNKNOWN_OPCODE
    wrong_len = roce[:24] + (9999).to_bytes(4, "big") + roce[28:]
    assert decoder.decode_frame(tmpl.frame(wrong_len)) == fmt.DropReason.BAD_LENGTH
    assert decoder.decode_frame(tmpl.frame(roce[:20])) == fmt.DropReason.TRUNCATED


def _udp_offset(frame: bytes) -> int:
    """Where the inner UDP header starts in a valid frame."""
    opened = decoder.open_frame(frame)
    return len(frame) - len(opened.payload) - 8


def test_fuzz_decoder_never_raises():
    """10,000 mutated frames (byte changes, truncations, scapy's fuzz()): each decodes to a packet or
    a DropReason, never an exception, and one changed byte at or after the inner UDP header is
    always caught (the UDP checksum covers it, with the inner addresses in its pseudo-header)."""
    rng = random.Random(1234)
    seeds = _valid_frames()
    reasons = set()
    single_changes = 0
    for _ in range(9000):
        original = rng.choice(seeds)
        frame = bytearray(original)
        changes = rng.randint(1, 6)
        for _ in range(changes):
            frame[rng.randrange(len(frame))] = rng.randrange(256)
        if rng.random() < 0.2:
            frame = frame[: rng.randrange(len(frame))]
        result = decoder.decode_frame(bytes(frame))
        assert isinstance(result, (fmt.DropReason, decoder.Received)), result
        reasons.add(result if isinstance(result, fmt.DropReason) else "decoded")
        diff = [i for i in range(min(len(frame), len(original))) if frame[i] != original[i]]
        if len(frame) == len(original) and len(diff) == 1 and diff[0] >= _udp_offset(original):
            single_changes += 1
            assert isinstance(result, fmt.DropReason), f"a change at byte {diff[0]} went unnoticed"
    ends = fmt.Endpoints(SRC, DST, 0xC000)
    for _ in range(1000):
        pkt = fuzz(layers.IPv6(src=SRC, dst=DST) / layers.UDP(sport=0xC000, dport=4791) / layers.BTH()
                   / layers.RETH())
        result = decoder.decode_frame(raw(pkt))
        assert isinstance(result, (fmt.DropReason, decoder.Received)), result
        reasons.add(result if isinstance(result, fmt.DropReason) else "decoded")
        assert isinstance(decoder.decode_roce(raw(pkt)[48:], ends), (fmt.DropReason, fmt.DataPacket, fmt.AckPacket, fmt.ProbePacket))
    assert single_changes > 100  # the property above was really exercised
    assert {fmt.DropReason.BAD_UDP_CHECKSUM, fmt.DropReason.TRUNCATED} <= reasons


@pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark not installed (apt-get install tshark)")
def test_tshark_decodes_every_packet_type(tmp_path):
    path = tmp_path / "mrc.pcap"
    writer = PcapWriter(str(path), linktype=229)  # LINKTYPE_IPV6: raw IPv6 frames
    samples = [fmt.DataPacket(1, 2, 0x1000, 4, b"payload!"), fmt.DataPacket(1, 3, 0x1008, 4, b"last", imm=7),
               fmt.AckPacket(1, 3, msn=1, sack_base=4, sack_bitmap=b"\xa0\0\0\0"),
               fmt.AckPacket(1, 3, syndrome=fmt.Syndrome.NAK_REMOTE_ACCESS), fmt.ProbePacket(1, 5, 3, 99),
               fmt.AckPacket(1, 3, ce_counts=((2, 5), (3, 1))), fmt.TrimNackPacket(1, 9, 2, True, True),
               fmt.CnpPacket(1), fmt.DataPacket(1, 4, 0x1000, 4, b"marked!!", ecn_ce=True)]
    n = 0
    for packet in samples:
        for ev_format in ("SRV6", "SRV6_USID", "UDP"):
            _, encap, ends = both(packet, ev_format)
            writer.write(encoder.FrameTemplate(ends, encap).encode(packet))
            n += 1
    writer.close()
    out = subprocess.run(["tshark", "-r", str(path), "-V", "-o", "ip.check_checksum:FALSE"],
                         capture_output=True, text=True, check=True).stdout
    assert "Malformed" not in out and "Expert Info (Error" not in out
    assert out.count("Base Transport Header") == n
    assert out.count("RETH - RDMA Extended Transport Header") == 9
    assert out.count("AETH - ACK Extended Transport Header") == 15
    assert out.count("Routing Header for IPv6 (Segment Routing)") == 18


@pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark not installed (apt-get install tshark)")
def test_tshark_decodes_a_trimmed_packet(tmp_path):
    """A data packet as a trimming switch leaves it (28 bytes of UDP payload, DSCP_TRIMMED, CE
    kept, lengths and UDP checksum consistent) decodes without a malformed error (docs/wire-format.md)."""
    roce = encoder.encode_roce(fmt.DataPacket(0x22, 77, 0x1000, 0x99, bytes(1024)))
    tclass = fmt.DSCP_TRIMMED << 2 | fmt.ECN_CE
    inner = (layers.IPv6(src=SRC, dst=DST, tc=tclass, hlim=64) / layers.UDP(sport=0xC003, dport=4791)
             / layers.Raw(roce[:fmt.TRIMMED_LEN]))
    outer = (layers.IPv6(src=SRC, dst=EV.segments[0], tc=tclass, hlim=64)
             / layers.IPv6ExtHdrSegmentRouting(addresses=list(reversed(EV.segments)), segleft=len(EV.segments) - 1,
                                               lastentry=len(EV.segments) - 1, nh=41) / inner)
    path = tmp_path / "trim.pcap"
    writer = PcapWriter(str(path), linktype=229)
    for frame in (inner, outer):
        writer.write(raw(frame))
    writer.close()
    out = subprocess.run(["tshark", "-r", str(path), "-V", "-o", "ip.check_checksum:FALSE"],
                         capture_output=True, text=True, check=True).stdout
    assert "Malformed" not in out and "Expert Info (Error" not in out
    assert out.count("RETH - RDMA Extended Transport Header") == 2 and "DMA Length: 1024" in out
    assert "Traffic Class: 0x2b" in out


@given(st.integers(0, 2**42))
def test_ack_service_time_is_a_16_bit_float_within_a_thousandth(held):
    """The ACK's service time: exact below 2 us, rounded down by less than 1/1024 above, and
    what the wire carries decodes to what the field says."""
    code = fmt.encode_service(held)
    assert 0 <= code <= 0xFFFF
    read = fmt.decode_service(code)
    assert read <= held and held - read <= held / 1024
    if held < 2048:
        assert read == held
    ends = fmt.Endpoints(SRC, DST, 0xC000)
    frame = encoder.FrameTemplate(ends, encoder.Encap.udp(), 0).encode(fmt.AckPacket(7, 9, service_ns=held))
    assert decoder.decode_frame(frame).packet.service_ns == read


def test_ack_service_time_rounds_negative_to_zero_and_saturates():
    assert fmt.encode_service(-5) == 0 and fmt.decode_service(fmt.encode_service(10**15)) == fmt.decode_service(0xFFFF)


@settings(max_examples=100, deadline=None)
@given(packets, formats)
def test_traffic_classes_outer_and_inner(packet, ev_format):
    """Data travels as DSCP_TRIMMABLE with ECT(0) (CE when marked), every control packet as
    DSCP_CONTROL, Not-ECT: in the outer header and the inner one alike."""
    _, encap, ends = both(packet, ev_format)
    frame = encoder.FrameTemplate(ends, encap).encode(packet)
    want = fmt.TCLASS_CONTROL
    if isinstance(packet, fmt.DataPacket):
        want = fmt.TCLASS_DATA | (fmt.ECN_CE if packet.ecn_ce else 0)
    assert decoder.open_frame(frame).tclass == want
    assert (int.from_bytes(frame[:4], "big") >> 20) & 0xFF == want
    assert fmt.TCLASS_DATA == 0x6A and fmt.TCLASS_CONTROL == 0xC0


def test_ce_counts_trim_nack_and_cnp_layouts():
    """The byte offsets docs/wire-format.md gives for the CE-count block, the TRIM NACK and the CNP."""
    ack = encoder.encode_roce(fmt.AckPacket(1, 2, ecn_echo=True, sack_bitmap=b"\x80\0\0\0", ce_counts=((3, 7), (9, 1))))
    assert ack[16:20] == bytes([fmt.MrcxType.SACK, 0x03]) + (16 + 4 + 8 + 4).to_bytes(2, "big")
    assert ack[32:36] == b"\0\x02\0\0" and ack[36:44] == b"\0\x03\0\x07\0\x09\0\x01" and ack[44:] == b"\x80\0\0\0"
    nack = encoder.encode_roce(fmt.TrimNackPacket(0x123456, 0xABCDEF, 5, last_hop=True, ecn_ce=False, msn=3))
    assert nack[0] == 0x11 and nack[9:12] == b"\xab\xcd\xef" and nack[12] == 0x65 and nack[13:16] == b"\0\0\x03"
    assert nack[16:] == bytes([fmt.MrcxType.TRIM, fmt.TRIM_FLAG_LAST_HOP, 0, 8, 0, 5, 0, 0])
    cnp = encoder.encode_roce(fmt.CnpPacket(0x42))
    assert cnp[0] == 0x81 and cnp[4] == 0x40 and cnp[5:8] == b"\0\0\x42" and cnp[12:] == bytes(16)
    ends = fmt.Endpoints(SRC, DST, 0xC000)
    reference = layers.IPv6(src=SRC, dst=DST, tc=fmt.TCLASS_CONTROL, hlim=64) / layers.UDP(sport=0xC000, dport=4791) / scapy_cnp(0x42)
    assert encoder.FrameTemplate(ends, encoder.Encap.udp()).encode(fmt.CnpPacket(0x42)) == raw(reference)


@pytest.mark.parametrize("keep", [28, 36, 64])
def test_trimmed_data_packet_decodes_without_icrc(keep):
    """A switch keeps the first `keep` bytes of the UDP payload: BTH and RETH survive and are read
    (no ICRC to check); a whole packet is NOT_TRIMMED, a cut RETH TRUNCATED, control NOT_TRIMMED."""
    packet = fmt.DataPacket(0x22, 77, 0x1000, 0x99, bytes(100), ack_req=True)
    whole = encoder.encode_roce(packet) + b"\0" * 4
    got = decoder.decode_trimmed(whole[:keep])
    assert got == fmt.TrimmedPacket(0x22, 77, 0x1000, 0x99, 100, True)
    assert decoder.decode_trimmed(whole) == fmt.DropReason.NOT_TRIMMED
    assert decoder.decode_trimmed(whole[:20]) == fmt.DropReason.TRUNCATED
    ack = encoder.encode_roce(fmt.AckPacket(1, 2)) + bytes(4)
    assert decoder.decode_trimmed(ack) == fmt.DropReason.NOT_TRIMMED
    assert fmt.is_trimmed(fmt.DSCP_TRIMMED << 2 | 3) and fmt.is_trimmed(fmt.DSCP_TRIMMED_LASTHOP << 2)
    assert not fmt.is_trimmed(fmt.TCLASS_DATA) and not fmt.is_trimmed(fmt.TCLASS_CONTROL)
    # without the trimmed DSCP the same bytes are a malformed packet: the ICRC check drops it
    assert isinstance(decoder.decode_roce(whole[:keep], fmt.Endpoints(SRC, DST, 0xC000)), fmt.DropReason)


def test_ce_block_that_overruns_the_extension_is_bad():
    ends = fmt.Endpoints(SRC, DST, 0xC000)
    roce = bytearray(encoder.encode_roce(fmt.AckPacket(1, 2, ce_counts=((1, 1),))))
    roce[33] = 5  # says 5 entries, carries 1
    frame = encoder.FrameTemplate(ends, encoder.Encap.udp()).frame(bytes(roce))
    assert decoder.decode_frame(frame) == fmt.DropReason.BAD_EXTENSION


def test_probe_response_and_port_status_layouts():
    """The MRCX PROBE_RESPONSE and PORT_STATUS bytes as docs/wire-format.md draws them."""
    ends = fmt.Endpoints(SRC, DST, 0xC001)
    rsp = encoder.encode_roce(fmt.ProbeResponsePacket(fmt.ENDPOINT_QPN, 0xA1B2C3D4, 5, 0x1122334455667788, 2, 70_000))
    assert rsp[12:16] == bytes(4)  # AETH: ACK, MSN 0
    assert rsp[16:20] == bytes([fmt.MrcxType.PROBE_RESPONSE, 0, 0, fmt.PROBE_RESPONSE_LEN])
    assert rsp[20:] == bytes.fromhex("a1b2c3d4" "0005" "02" "00" "1122334455667788") + (70_000).to_bytes(4, "big")
    assert rsp[5:8] == fmt.ENDPOINT_QPN.to_bytes(3, "big")
    upd = encoder.encode_roce(fmt.PortStatusPacket(fmt.ENDPOINT_QPN, 9, 0b101, ack=True))
    assert upd[16:] == bytes([fmt.MrcxType.PORT_STATUS, fmt.PORT_STATUS_FLAG_ACK, 0, fmt.PORT_STATUS_LEN]) + \
        (9).to_bytes(4, "big") + (0b101).to_bytes(4, "big")
    frame = encoder.FrameTemplate(ends, encoder.Encap.udp()).encode(fmt.ProbeResponsePacket(2, 1, 2, 3, 1, 4))
    assert layers.MRCXProbeResponse in layers.IPv6(frame)


@pytest.mark.parametrize("packet", [fmt.ProbeResponsePacket(2, 1, 3, 4, 2, 5), fmt.PortStatusPacket(2, 1, 6),
                                    fmt.PortStatusPacket(2, 1, 6, ack=True), fmt.ProbePacket(2, 1, 3, 4)])
def test_short_or_hostile_endpoint_messages_are_rejected(packet):
    """Every truncation, a wrong MRCX length and random bytes after the header: a DropReason or a
    record, never an exception."""
    ends = fmt.Endpoints(SRC, DST, 0xC000)
    body = encoder.encode_roce(packet)
    src, dst = headers.packed(SRC), headers.packed(DST)

    def sealed(roce: bytes) -> bytes:
        return roce + headers.ICRC.pack(headers.icrc(src, dst, 0xC000, 4791, roce))

    assert decoder.decode_roce(sealed(body), ends) == packet
    for cut in range(len(body)):
        got = decoder.decode_roce(sealed(body[:cut]), ends)
        assert isinstance(got, fmt.DropReason) or got != packet, cut
    wrong_len = body[:18] + (len(body) - 12).to_bytes(2, "big") + body[20:]
    assert decoder.decode_roce(sealed(wrong_len), ends) == fmt.DropReason.BAD_EXTENSION
    rng = random.Random(3)
    for _ in range(300):
        junk = body[:16] + bytes(rng.randrange(256) for _ in range(rng.randrange(0, 40)))
        assert isinstance(decoder.decode_roce(sealed(junk), ends), (fmt.DropReason, *fmt.RocePacket.__args__))
    assert decoder.decode_roce(body, ends) == fmt.DropReason.BAD_ICRC  # no ICRC


@pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark not installed (apt-get install tshark)")
def test_tshark_decodes_endpoint_messages(tmp_path):
    """Probe responses and PORT_STATUS_UPDATEs decode as RoCE ACKNOWLEDGEs (MRCX as data), no error."""
    path = tmp_path / "endpoint.pcap"
    writer = PcapWriter(str(path), linktype=229)
    samples = [fmt.ProbeResponsePacket(2, 5, 3, 99, 2, 1234), fmt.PortStatusPacket(2, 7, 0b110),
               fmt.PortStatusPacket(2, 7, 0b110, ack=True)]
    for packet in samples:
        for ev_format in ("SRV6", "SRV6_USID", "UDP"):
            _, encap, ends = both(packet, ev_format)
            writer.write(encoder.FrameTemplate(ends, encap).encode(packet))
    writer.close()
    out = subprocess.run(["tshark", "-r", str(path), "-V", "-o", "ip.check_checksum:FALSE"],
                         capture_output=True, text=True, check=True).stdout
    assert "Malformed" not in out and "Expert Info (Error" not in out
    assert out.count("AETH - ACK Extended Transport Header") == 9
