"""The baseline as the peer of a real RC stack (issue 31, docs/interop.md), without one: what
rdma_rxe sends and expects, made by hand here. The run against rxe itself is
tests/test_interop_rxe.py (scripts/interop-rxe.sh, where the module loads).

- an RC requester's multi-packet WRITE (FIRST with the message's RETH, MIDDLE, LAST, LAST WITH
  IMMEDIATE) is decoded and placed in order by the baseline's responder;
- a PSN sequence NAK names the expected PSN, as IBA and rxe have it, both ways;
- the baseline's requester asks for an ACK (AckReq) every 32 PSNs and on the last PSN its
  window lets out, in the Python and in the C send loop: rxe acknowledges only what asks.
"""

from __future__ import annotations

import random
import socket

import pytest

from mrc_emu.io.memory import MemoryNetwork
from mrc_emu.topology import builtin
from mrc_emu.topology.evs import EvFormat
from mrc_emu.transport import requester as requester_module
from mrc_emu.transport.cc.registry import make_cc
from mrc_emu.transport.config import QpConfig
from mrc_emu.transport.multipath.paths import qp_paths
from mrc_emu.transport.requester import Requester
from mrc_emu.transport.responder import Responder
from mrc_emu.wire import format as fmt
from mrc_emu.wire.decoder import decode_frame, open_frame
from mrc_emu.wire.format import DataPacket, Opcode, Syndrome

TOPO = builtin()
PATHS = qp_paths(TOPO, "h0", "h2")
SRC = socket.inet_pton(socket.AF_INET6, PATHS.src_address)
DST = socket.inet_pton(socket.AF_INET6, PATHS.dst_address)
MTU = 1024
FIRST, MIDDLE, LAST, LAST_IMM = (Opcode.RDMA_WRITE_FIRST, Opcode.RDMA_WRITE_MIDDLE, Opcode.RDMA_WRITE_LAST,
                                 Opcode.RDMA_WRITE_LAST_WITH_IMMEDIATE)


def rc_message(qpn: int, psn: int, va: int, rkey: int, data: bytes, imm: int | None = None) -> list[DataPacket]:
    """An RC requester's WRITE of `data` as its packets: FIRST (RETH: the whole length), MIDDLEs, LAST."""
    chunks = [data[i:i + MTU] for i in range(0, len(data), MTU)]
    out = []
    for i, chunk in enumerate(chunks):
        last = i == len(chunks) - 1
        op = FIRST if i == 0 else (LAST_IMM if imm is not None else LAST) if last else MIDDLE
        out.append(DataPacket(qpn, (psn + i) & 0xFFFFFF, va if op == FIRST else 0, rkey if op == FIRST else 0, chunk,
                              last, imm if op == LAST_IMM else None, rc_opcode=int(op),
                              dma_len=len(data) if op == FIRST else -1))
    return out


class Wire:
    """A responder fed frames as its UDP socket would hand them, its ACKs decoded."""

    def __init__(self, size: int) -> None:
        self.responder = Responder(DST, QpConfig.baseline(mtu=MTU), random_bits=random.Random(1).getrandbits)
        self.buffer = bytearray(size)
        self.mr = self.responder.register(self.buffer, va=0x2000_0000)
        self.responder.accept(0x33, 0x44, 100, PATHS.back, peer=SRC, config=QpConfig.baseline(mtu=MTU))
        self.acks: list[fmt.AckPacket] = []

    def deliver(self, packet: DataPacket, now: int = 0) -> None:
        opened = open_frame(PATHS.forward[0].template.encode(packet))
        self.responder.on_datagram(opened.payload, opened.src, opened.sport, now)

    def pump(self, now: int = 0) -> list[fmt.AckPacket]:
        sent = []
        self.responder.pump(now, lambda frame, path: sent.append(decode_frame(frame).packet) or True)
        self.acks += sent
        return sent


def test_every_rc_write_opcode_decodes_as_it_was_encoded():
    for packet in rc_message(0x33, 7, 0x1000, 0x99, bytes(range(256)) * 9, imm=0xABCD):
        frame = PATHS.forward[0].template.encode(packet)
        got = decode_frame(frame).packet
        assert (got.opcode, got.psn, got.va, got.rkey, bytes(got.payload), got.imm, got.dma_len, got.ack_req) == (
            packet.opcode, packet.psn, packet.va, packet.rkey, bytes(packet.payload), packet.imm, packet.dma_len,
            packet.ack_req)
    assert [p.opcode for p in rc_message(1, 0, 0, 0, bytes(3 * MTU))] == [FIRST, MIDDLE, LAST]


def test_a_first_shorter_than_its_own_payload_is_refused():
    packet = DataPacket(1, 0, 0x1000, 2, bytes(64), rc_opcode=int(FIRST), dma_len=32)
    assert decode_frame(PATHS.forward[0].template.encode(packet)) is fmt.DropReason.BAD_LENGTH


def test_an_rc_peers_write_and_write_with_immediate_are_placed_by_the_firsts_reth():
    size = 5 * MTU + 100  # a short LAST: pad bytes
    data, other = random.Random(2).randbytes(size), random.Random(3).randbytes(size)
    wire = Wire(2 * size)
    wire.responder.post_recv(0x33, 1)
    packets = rc_message(0x33, 100, wire.mr.va, wire.mr.rkey, data)
    packets += rc_message(0x33, 100 + len(packets), wire.mr.va + size, wire.mr.rkey, other, imm=0x1234)
    for packet in packets:
        wire.deliver(packet)
    wire.pump()
    assert bytes(wire.buffer) == data + other
    assert [c.imm for c in wire.responder.completions] == [0x1234]
    ack = wire.acks[-1]
    assert ack.syndrome == Syndrome.ACK and ack.psn == 100 + len(packets) - 1
    assert ack.msn == 2  # two messages, not twelve packets
    assert not wire.responder.drops


def test_a_gap_is_nakked_with_the_expected_psn_and_the_resent_packets_continue_the_message():
    data = random.Random(4).randbytes(4 * MTU)
    wire = Wire(len(data))
    packets = rc_message(0x33, 100, wire.mr.va, wire.mr.rkey, data)
    wire.deliver(packets[0])
    wire.deliver(packets[2])  # MIDDLE 101 lost
    (nak,) = wire.pump()
    assert nak.syndrome == Syndrome.NAK_PSN_SEQUENCE and nak.psn == 101  # IBA: the PSN it expects
    for packet in packets[1:]:  # go-back-N: everything from the gap on, in order
        wire.deliver(packet)
    wire.pump()
    assert bytes(wire.buffer) == data and wire.acks[-1].psn == 103


def test_a_middle_without_a_first_and_a_last_that_overruns_are_refused():
    wire = Wire(4 * MTU)
    wire.deliver(DataPacket(0x33, 100, 0, 0, bytes(MTU), rc_opcode=int(MIDDLE)))
    (nak,) = wire.pump()
    assert nak.syndrome == Syndrome.NAK_INVALID_REQUEST and wire.responder.drops["rc_no_first"] == 1
    wire = Wire(4 * MTU)
    wire.deliver(DataPacket(0x33, 100, wire.mr.va, wire.mr.rkey, bytes(MTU), rc_opcode=int(FIRST), dma_len=2 * MTU))
    wire.deliver(DataPacket(0x33, 101, 0, 0, bytes(2 * MTU), rc_opcode=int(LAST)))
    assert wire.pump()[-1].syndrome == Syndrome.NAK_INVALID_REQUEST and wire.responder.drops["rc_bad_length"] == 1
    wire = Wire(MTU)  # the FIRST's whole message must fit the region
    wire.deliver(DataPacket(0x33, 100, wire.mr.va, wire.mr.rkey, bytes(MTU), rc_opcode=int(FIRST), dma_len=2 * MTU))
    assert wire.pump()[-1].syndrome == Syndrome.NAK_REMOTE_ACCESS and wire.responder.drops["out_of_bounds"] == 1


@pytest.mark.parametrize("c_loop", [False, True], ids=["python-loop", "c-loop"])
def test_the_baseline_asks_for_an_ack_every_32_psns_and_at_its_windows_end(c_loop):
    if c_loop and requester_module._spray is None:
        pytest.skip("the C send loop (mrc_emu.transport._spray) is not built")
    config = QpConfig.baseline(mtu=MTU, mpr=1)  # a window of 128 PSNs
    req = Requester(SRC, 0x44, 0x33, {0: PATHS.forward[0]}, config, make_cc("fixed", MTU, window=1000 * MTU),
                    c_loop=c_loop, random_bits=random.Random(5).getrandbits)
    req.post_write(bytes(400 * MTU), 0x2000_0000, 7)
    frames = []
    for _ in range(10):
        req.pump(0, lambda frame, path: frames.append(decode_frame(frame).packet) or True)
    asked = [p.psn for p in frames if p.ack_req]
    assert len(frames) == 128  # the PSN window, no ACK yet
    assert asked == [31, 63, 95, 127]
    mrc = Requester(SRC, 0x44, 0x33, {0: PATHS.forward[0]}, QpConfig(mtu=MTU, mpr=1),
                    make_cc("fixed", MTU, window=1000 * MTU), c_loop=c_loop, random_bits=random.Random(5).getrandbits)
    mrc.post_write(bytes(400 * MTU), 0x2000_0000, 7)
    frames = []
    mrc.pump(0, lambda frame, path: frames.append(decode_frame(frame).packet) or True)
    assert frames and not any(p.ack_req for p in frames)  # MRC's own QPs: unchanged


def test_the_baseline_completes_against_its_own_responder_over_a_lossy_network():
    net = MemoryNetwork(seed=6)
    wire_size = 64 * MTU
    responder = Responder(DST, QpConfig.baseline(mtu=MTU), random_bits=random.Random(7).getrandbits)
    buffer = bytearray(wire_size)
    mr = responder.register(buffer)
    responder.accept(0x33, 0x44, 10, PATHS.back, peer=SRC, config=QpConfig.baseline(mtu=MTU))
    req = Requester(SRC, 0x44, 0x33, {0: PATHS.forward[0]}, QpConfig.baseline(mtu=MTU), make_cc("fixed", MTU),
                    start_psn=10, random_bits=random.Random(8).getrandbits)
    net.attach(req)
    net.attach(responder)
    net.fault(0).loss = 0.05
    data = random.Random(9).randbytes(wire_size)
    req.post_write(data, mr.va, mr.rkey)
    assert net.run([req, responder], lambda: req.done)
    assert req.error is None and req.completions and bytes(buffer) == data
    assert req.naks and req.retransmits  # the losses were found by sequence NAKs, and resent


def test_a_frame_without_a_udp_checksum_is_taken_as_rxe_sends_them_and_its_icrc_still_checked():
    udp = qp_paths(TOPO, "h0", "h2", EvFormat.UDP).forward[0]  # as the baseline and rxe send: no outer header
    frame = bytearray(udp.template.encode(DataPacket(0x33, 5, 0x1000, 9, b"rxe sends no UDP checksum")))
    frame[46:48] = b"\0\0"  # the UDP checksum
    got = decode_frame(bytes(frame))
    assert isinstance(got.packet, DataPacket) and bytes(got.packet.payload) == b"rxe sends no UDP checksum"
    frame[-5] ^= 1  # a payload byte: now only the ICRC can tell
    assert decode_frame(bytes(frame)) is fmt.DropReason.BAD_ICRC


def test_the_receive_socket_takes_datagrams_without_a_udp_checksum():
    from mrc_emu.io.sockets import UDP_NO_CHECK6_RX, udp_receiver

    sock = udp_receiver("::1", port=0, buffer=1 << 16)
    try:
        assert sock.getsockopt(socket.IPPROTO_UDP, UDP_NO_CHECK6_RX) == 1
    finally:
        sock.close()
