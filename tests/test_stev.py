"""The STEV EV format: flow label and UDP source port on the wire (scapy's bytes, tshark's fields),
its paths (ports, first hops, ACKs back with the same value), and a responder that finds a STEV
EV by its source port whatever the value."""

import hashlib
import os
import random
import shutil
import socket
import subprocess

import pytest
from scapy.compat import raw
from scapy.utils import PcapWriter

from mrc_emu.experiments.runtime.stev import ideal_coverage
from mrc_emu.fabric import config
from mrc_emu.io.memory import MemoryNetwork
from mrc_emu.topology import TopologyError, builtin
from mrc_emu.topology import addressing as ad
from mrc_emu.topology.evs import EvFormat, default_stev, stev_flow_label, stev_sport, udp_sport
from mrc_emu.transport.config import QpConfig
from mrc_emu.transport.multipath.paths import port_gateway, qp_paths
from mrc_emu.transport.requester import Requester
from mrc_emu.transport.responder import Responder
from mrc_emu.wire import encoder, headers, layers
from mrc_emu.wire import format as fmt

TOPO = builtin()
VALUE = 0xBEEFC005  # flow label 0xBEEF, UDP source port 0xC005


def test_stev_value_bit_layout():
    assert stev_sport(VALUE) == 0xC005 and stev_flow_label(VALUE) == 0xBEEF
    values = [default_stev(i) for i in range(4096)]
    assert [stev_sport(v) for v in values] == [udp_sport(i) for i in range(4096)]
    assert len({stev_flow_label(v) for v in values}) == 4096 and all(stev_flow_label(v) for v in values)


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("packet", [fmt.DataPacket(0x22, 7, 0x1000, 0x99, b"stev payload"),
                                    fmt.DataPacket(0x22, 8, 0x1000, 0x99, b"x" * 4001, imm=5),
                                    fmt.AckPacket(0x11, 7, echo_ev=1, sack_bitmap=b"\x80\0\0\0")])
def test_stev_template_equals_scapy(packet, native):
    """A STEV path's template makes scapy's bytes for a frame with that flow label and source port;
    the ICRC masks the flow label, so it equals that of the same frame with label 0."""
    paths = qp_paths(TOPO, "h0", "h2", EvFormat.STEV, stev_values=[(VALUE, 2), 0x00010001])
    path = paths.forward[0]
    ends = fmt.Endpoints(paths.src_address, paths.dst_address, 0xC005)
    template = encoder.FrameTemplate(ends, encoder.Encap.udp(), stev_flow_label(VALUE), native=native)
    frame = path.template.encode(packet)
    assert frame == raw(layers.udp_frame(packet, ends, 0xBEEF)) == template.encode(packet)
    assert int.from_bytes(frame[:4], "big") & 0xFFFFF == 0xBEEF and frame[40:42] == b"\xc0\x05"
    unlabelled = encoder.FrameTemplate(ends, encoder.Encap.udp()).encode(packet)
    assert frame[-4:] == unlabelled[-4:]  # ICRC
    assert frame[-4:] == headers.ICRC.pack(headers.icrc(headers.packed(ends.src), headers.packed(ends.dst), 0xC005,
                                                        4791, frame[48:-4]))


@pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark not installed (apt-get install tshark)")
def test_tshark_reads_the_flow_label_and_source_port(tmp_path):
    values = [VALUE, 0x00010001, 0xFFFFFFFF]
    paths = qp_paths(TOPO, "h0", "h2", EvFormat.STEV, stev_values=values)
    pcap = tmp_path / "stev.pcap"
    writer = PcapWriter(str(pcap), linktype=229)
    for ev in range(len(values)):
        writer.write(paths.forward[ev].template.encode(fmt.DataPacket(0x22, ev, 0x1000, 0x99, b"payload!")))
    writer.close()
    out = subprocess.run(["tshark", "-r", str(pcap), "-T", "fields", "-e", "ipv6.flow", "-e", "udp.srcport",
                          "-e", "udp.dstport", "-e", "infiniband.bth.opcode"], capture_output=True, text=True,
                         check=True).stdout.split("\n")
    got = [tuple(int(field, 0) for field in line.split("\t")) for line in out if line]
    assert got == [(0xBEEF, 0xC005, 4791, 0x0A), (0x0001, 0x0001, 4791, 0x0A), (0xFFFF, 0xFFFF, 4791, 0x0A)]


def test_stev_paths_ports_first_hops_and_acks_back():
    paths = qp_paths(TOPO, "h0", "h2", EvFormat.STEV)
    assert sorted(paths.forward) == list(range(8)) and all(p.plane == e.plane for p, e in zip(paths.forward.values(), paths.evs))
    for ev in paths.evs:
        forward, back = paths.forward[ev.index], paths.back[ev.index]
        assert ev.stev == default_stev(ev.index) and ev.plane == ev.index // 4 and ev.spine is None
        assert forward.first_hop == port_gateway(TOPO, "h0", ev.plane)
        assert back.first_hop == port_gateway(TOPO, "h2", ev.plane)
        assert forward.first_hop.startswith("fc00:f:")  # the leaf's end of the host's link
        for path, src in ((forward, "h0"), (back, "h2")):
            frame = path.template.encode(fmt.CnpPacket(1))
            assert int.from_bytes(frame[:4], "big") & 0xFFFFF == stev_flow_label(ev.stev)
            assert int.from_bytes(frame[40:42], "big") == stev_sport(ev.stev)
            assert frame[8:24] == socket.inet_pton(socket.AF_INET6, ad.host_address(TOPO, src))
    explicit = qp_paths(TOPO, "h0", "h2", EvFormat.STEV, stev_values=[1, 2, 3, (4, 1)], ev_indexes=[1, 3])
    assert [(e.index, e.stev, e.plane) for e in explicit.evs] == [(1, 2, 1), (3, 4, 0)]


def test_stev_values_must_differ_in_their_source_ports():
    with pytest.raises(TopologyError, match=r"STEV EVs 1 \(0x0001c001\) and 3 \(0x0002c001\) share UDP source port 0xc001"):
        qp_paths(TOPO, "h0", "h2", EvFormat.STEV, stev_values=[0xC000, 0x1C001, 0xC002, 0x2C001])
    with pytest.raises(TopologyError, match="does not fit in 32 bits"):
        qp_paths(TOPO, "h0", "h2", EvFormat.STEV, stev_values=[1 << 32])
    with pytest.raises(TopologyError, match="port 3 is not one of h0's ports 1..2"):
        qp_paths(TOPO, "h0", "h2", EvFormat.STEV, stev_values=[(1, 3)])
    with pytest.raises(ValueError, match="STEV values given for EV format SRV6"):
        qp_paths(TOPO, "h0", "h2", EvFormat.SRV6, stev_values=[1])


@pytest.mark.parametrize("c_path", [True, False])
def test_responder_finds_a_stev_ev_by_its_source_port(c_path):
    """Source ports far from 0xC000 + EV: every ACK names the EV the requester sent on (each EV gets
    RTT samples), CE counts and the ACK's way back follow the EV, and the bytes arrive."""
    values = [0x12340007, (0xABCD1000, 1), 0x0000FFFF, 0x77770001]
    paths = qp_paths(TOPO, "h0", "h2", EvFormat.STEV, stev_values=values)
    src, dst = (socket.inet_pton(socket.AF_INET6, a) for a in (paths.src_address, paths.dst_address))
    config = QpConfig(mtu=1024)
    responder = Responder(dst, config, random_bits=random.Random(1).getrandbits, c_path=c_path)
    buffer = bytearray(200_000)
    mr = responder.register(buffer)
    responder.accept(0x22, 0x11, 0, paths.back)
    requester = Requester(src, 0x11, 0x22, paths.forward, config, random_bits=random.Random(2).getrandbits)
    net = MemoryNetwork(3)
    net.fault(2).ce = 1.0
    acks_on: dict[int, int] = {}
    send = net.send

    def counting(frame, path):
        if path.template.ends.src == paths.dst_address:
            acks_on[path.ev] = acks_on.get(path.ev, 0) + 1
        return send(frame, path)

    net.send = counting
    data = os.urandom(len(buffer))
    requester.post_write(data, mr.va, mr.rkey)
    assert net.run([requester, responder], lambda: requester.done, limit_ns=60_000_000_000)
    assert hashlib.sha256(buffer).digest() == hashlib.sha256(data).digest()
    assert all(requester.profile.evs[k].rtt.srtt_ns for k in range(4)), "an ACK named an EV the requester has not"
    assert requester.drops.get("unknown_ev", 0) == 0 and set(acks_on) <= set(range(4))
    assert requester.profile.evs[2].ecn > requester.profile.evs[0].ecn == 0


def test_ideal_coverage_and_the_hash_fields():
    assert ideal_coverage(8, 1) == 1 and abs(ideal_coverage(8, 8) - 8 * (1 - (7 / 8) ** 8)) < 1e-12
    assert ideal_coverage(8, 64) > 7.99
    assert config.STEV_HASH_FIELDS == 0x3F
