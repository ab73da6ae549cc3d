"""Congestion signals at the endpoints (issue 12): traffic classes in, ECN echo, TRIM NACK, CNP.

Everything over the in-memory network (its per-EV `ce` and `trim` do what a congested switch
port does) or fed to one endpoint by hand: no root. The sockets' own traffic class reading is
checked on loopback.
"""

from __future__ import annotations

import os
import random
import socket
import time

import pytest

from mrc_emu.io import port as port_module
from mrc_emu.io.memory import MemoryNetwork
from mrc_emu.io.sockets import SocketLink
from mrc_emu.topology import builtin
from mrc_emu.transport.cc.fixed import FixedWindow
from mrc_emu.transport.cc.registry import make_cc
from mrc_emu.transport.config import QpConfig
from mrc_emu.transport.multipath.ev import EvState
from mrc_emu.transport.multipath.paths import qp_paths
from mrc_emu.transport.mux import HostMux
from mrc_emu.transport.requester import Requester
from mrc_emu.transport.responder import Responder
from mrc_emu.wire import format as fmt
from mrc_emu.wire.decoder import decode_frame, open_frame
from mrc_emu.wire.encoder import encode_roce

TOPO = builtin()
PATHS = qp_paths(TOPO, "h0", "h2")
SRC = socket.inet_pton(socket.AF_INET6, PATHS.src_address)
DST = socket.inet_pton(socket.AF_INET6, PATHS.dst_address)
TRIMMED = fmt.DSCP_TRIMMED << 2 | fmt.ECN_ECT0
TRIMMED_LASTHOP = fmt.DSCP_TRIMMED_LASTHOP << 2 | fmt.ECN_ECT0


def bits(seed: int = 0):
    return random.Random(seed).getrandbits


class RecordingCc(FixedWindow):
    """A fixed window that records what the requester tells its congestion control."""

    def __init__(self) -> None:
        super().__init__(256 * 1024)
        self.acked_ecn: dict[int, int] = {}
        self.trims: list[tuple[int, int, bool]] = []
        self.cnps: list[int] = []

    def on_acked(self, now, ev, nbytes, rtt_ns, srtt_ns, ecn):
        if ecn:
            self.acked_ecn[ev] = self.acked_ecn.get(ev, 0) + 1

    def on_trimmed(self, now, ev, nbytes, srtt_ns, last_hop=False):
        self.trims.append((ev, nbytes, last_hop))

    def on_cnp(self, now):
        self.cnps.append(now)


class Watching(MemoryNetwork):
    """Decodes every frame sent: who sent which data PSN on which EV when, and the TRIM NACKs."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__(seed)
        self.data: list[tuple[int, int, int]] = []  # (time, PSN, EV)
        self.nacks: list[fmt.TrimNackPacket] = []
        self.cnps = 0

    def send(self, frame, path) -> bool:
        got = decode_frame(bytes(frame))
        packet = getattr(got, "packet", None)
        if isinstance(packet, fmt.DataPacket):
            self.data.append((self.now, packet.psn, path.ev))
        elif isinstance(packet, fmt.TrimNackPacket):
            self.nacks.append(packet)
        elif isinstance(packet, fmt.CnpPacket):
            self.cnps += 1
        return super().send(frame, path)


def transfer(size: int, faults: dict[int, dict], config: QpConfig | None = None, seed: int = 0):
    config = config or QpConfig(mtu=1024)
    responder = Responder(DST, config, random_bits=bits(1))
    buffer = bytearray(size)
    mr = responder.register(buffer)
    responder.accept(0x22, 0x11, 0, PATHS.back, config=config)
    cc = RecordingCc()
    requester = Requester(SRC, 0x11, 0x22, PATHS.forward, config, cc=cc, random_bits=bits(2))
    net = Watching(seed)
    for ev, settings_ in faults.items():
        for key, value in settings_.items():
            setattr(net.fault(ev), key, value)
    data = os.urandom(size)
    requester.post_write(data, mr.va, mr.rkey)
    finished = net.run([requester, responder], lambda: requester.done, limit_ns=60_000_000_000)
    assert finished and requester.error is None and bytes(buffer) == data
    return requester, responder, net, cc


def test_ce_counts_per_ev_reach_the_cc_and_the_spray_weights():
    """EV 2 marks every data packet, EV 5 one in four, the rest none: the responder counts them
    per EV, the ACKs carry the counts, the CC hears ECN on those EVs only and their weights fall."""
    requester, responder, net, cc = transfer(2_000_000, {2: {"ce": 1.0}, 5: {"ce": 0.25}})
    evs = requester.profile.evs
    assert responder.stats["ce_received"] == net.frames_ce > 0
    assert sum(s.ce_marks for s in evs.values()) == net.frames_ce  # every mark reported, none twice
    assert set(cc.acked_ecn) == {2, 5}
    assert evs[2].ce_marks > evs[5].ce_marks > 0 and all(evs[k].ce_marks == 0 for k in evs if k not in (2, 5))
    assert evs[2].ecn > 0.5 and 0 < evs[5].ecn < evs[2].ecn
    best = min(s.srtt_ns for s in evs.values())
    assert requester.profile.weight(2, best) < requester.profile.weight(5, best) < requester.profile.weight(0, best)


def test_the_c_placement_counts_ce_as_python_does():
    """CE-marked packets are placed in C too (counted per EV, the newest one's bit echoed)."""
    for c_path in (True, False):
        responder = Responder(DST, QpConfig(mtu=1024), random_bits=bits(1), c_path=c_path)
        mr = responder.register(bytearray(64 * 1024))
        responder.accept(0x22, 0x11, 0, PATHS.back)
        for psn in range(10):
            frame = PATHS.forward[psn % 2].template.data(fmt.DataPacket(0x22, psn, mr.va + psn * 1024, mr.rkey,
                                                                         bytes(1024)))
            opened = open_frame(frame)
            responder.on_datagram(bytes(opened.payload), SRC, opened.sport, psn, fmt.TCLASS_DATA | (psn % 3 == 0) * 3)
        qp = responder.qps[0x22]
        assert responder.stats["packets_placed"] == 10 and responder.stats["ce_received"] == 4
        assert qp.ce_counts == {0: 2, 1: 2} and qp.ecn  # PSN 9 was the last and marked
        ack = _sent(responder)[-1][1]
        assert ack.ce_counts == ((0, 2), (1, 2)) and ack.ecn_echo and qp.ce_counts == {}


def test_ce_counts_that_do_not_fit_wait_for_the_next_ack():
    counts = {ev: 1 for ev in range(70)} | {3: 70_000}
    first = Responder._take_ce(counts)
    assert len(first) == fmt.MAX_CE_ENTRIES and dict(first)[3] == fmt.MAX_CE_COUNT
    assert counts == {3: 70_000 - fmt.MAX_CE_COUNT} | {ev: 1 for ev in range(64, 70)}
    left = dict(counts)
    assert dict(Responder._take_ce(counts)) == left and counts == {}
    # the largest ACK: a full MPR bitmap (8192 PSNs) and every CE entry, within 4 KiB
    assert len(encode_roce(fmt.AckPacket(1, 2, sack_bitmap=bytes(1024), ce_counts=first))) <= 4096


def test_a_trimmed_packet_is_resent_at_once_on_another_ev():
    """EV 3 trims every data packet: each trim gives exactly one TRIM NACK, the packet is resent on
    another EV as soon as the NACK arrives, the WRITE completes and verifies, without an ACK timeout
    and without making any EV ASSUMED_BAD; the CC hears every trim, the EV's weight falls."""
    requester, responder, net, cc = transfer(1_000_000, {3: {"trim": 1.0}})
    trimmed = net.frames_trimmed
    assert trimmed > 0
    assert responder.stats["trimmed_received"] == responder.stats["trim_nacks_sent"] == len(net.nacks) == trimmed
    assert requester.trim_nacks == requester.recovery.trims_resent == trimmed
    assert {nack.ev for nack in net.nacks} == {3} and not any(n.last_hop for n in net.nacks)
    assert [t[0] for t in cc.trims] == [3] * trimmed and not any(t[2] for t in cc.trims)
    assert requester.recovery.timeouts == 0 and requester.retransmits == trimmed
    assert not any(e.new is EvState.ASSUMED_BAD for e in requester.ev_events)
    assert responder.stats["packets_placed"] == 1_000_000 // 1024 + 1  # a trim is never placed
    sends: dict[int, list[tuple[int, int]]] = {}
    for at, psn, ev in net.data:
        sends.setdefault(psn, []).append((at, ev))
    delay = net.fault(3).delay_ns
    for nack in net.nacks:
        (first_at, first_ev), (again_at, again_ev) = sends[nack.psn]
        assert first_ev == 3 and again_ev != 3
        assert again_at - first_at <= 2 * delay + 1_000  # out, NACK back, resent: no timer involved
    best = min(s.srtt_ns for s in requester.profile.evs.values())
    assert requester.profile.weight(3, best) < 0.5 * requester.profile.weight(0, best)
    repair = requester.summary()["trim_repair"]  # each trim repaired: out, NACK back, resent, ACKed
    assert repair["count"] == trimmed and repair["max_us"] <= 4 * delay / 1e3 + 300


def test_a_last_hop_trim_is_an_ecn_echo_not_a_weight_cut():
    requester, responder, net, cc = transfer(300_000, {1: {"trim": 0.3, "trim_last_hop": True, "ce": 1.0}})
    assert net.frames_trimmed > 0 and all(n.last_hop and n.ecn_ce for n in net.nacks)
    assert all(t[2] for t in cc.trims) and len(cc.trims) == net.frames_trimmed
    stats = requester.profile.evs[1]
    assert stats.trim == 0 and stats.trims == net.frames_trimmed and stats.ecn > 0


def test_trims_and_losses_together_complete():
    requester, responder, net, cc = transfer(500_000, {0: {"trim": 0.2, "loss": 0.05}, 4: {"trim": 0.5, "ce": 0.5}}, seed=3)
    assert requester.trim_nacks == net.frames_trimmed > 0


def _responder(config: QpConfig | None = None):
    responder = Responder(DST, config or QpConfig(mtu=1024), random_bits=bits(1))
    mr = responder.register(bytearray(64 * 1024))
    responder.accept(0x22, 0x11, 0, PATHS.back)
    return responder, mr


def _data(mr, psn: int, ev: int = 0, length: int = 1024, **kw) -> tuple[bytes, int]:
    frame = PATHS.forward[ev].template.data(fmt.DataPacket(0x22, psn, mr.va + psn * 1024, mr.rkey, bytes(length), **kw))
    opened = open_frame(frame)
    return bytes(opened.payload), opened.sport


def _sent(responder: Responder, now: int = 10**9) -> list:
    out = []
    responder.pump(now, lambda frame, path: out.append((path.ev, decode_frame(bytes(frame)).packet)) or True)
    return out


def test_trim_of_a_received_psn_is_answered_with_an_ack():
    responder, mr = _responder()
    payload, sport = _data(mr, 0, ev=2)
    responder.on_datagram(payload, SRC, sport, 0)
    assert _sent(responder)[0][1].psn == 0  # acknowledged (AckReq-less: the delayed ACK)
    responder.on_datagram(payload[:fmt.TRIMMED_LEN], SRC, sport, 10, TRIMMED)
    sent = _sent(responder)
    assert [type(p) for _, p in sent] == [fmt.AckPacket] and responder.stats["trims_of_received"] == 1
    payload, sport = _data(mr, 1, ev=5, ack_req=True)
    responder.on_datagram(payload[:40], SRC, sport, 20, fmt.DSCP_TRIMMED_LASTHOP << 2 | fmt.ECN_CE)
    (ev, nack), = _sent(responder)
    assert ev == 5 and nack == fmt.TrimNackPacket(0x11, 1, 5, last_hop=True, ecn_ce=True, msn=1)
    assert responder.stats["packets_placed"] == 1 and responder.next_wakeup() is None


def test_a_whole_packet_at_the_trimmed_dscp_is_placed():
    responder, mr = _responder()
    payload, sport = _data(mr, 0)
    responder.on_datagram(payload, SRC, sport, 0, TRIMMED)
    assert responder.stats["packets_placed"] == 1 and responder.stats["trimmed_received"] == 0


def test_hostile_signals_are_counted_drops():
    responder, mr = _responder()
    payload, sport = _data(mr, 0)
    responder.on_datagram(payload[:fmt.TRIMMED_LEN], SRC, sport, 0, fmt.TCLASS_DATA)  # short, not trimmed: malformed
    responder.on_datagram(payload[:fmt.TRIMMED_LEN], SRC, sport, 0)
    responder.on_datagram(payload[:20], SRC, sport, 0, TRIMMED)  # trimmed into RETH
    other = bytearray(payload[:fmt.TRIMMED_LEN])
    other[7] ^= 0x55
    responder.on_datagram(bytes(other), SRC, sport, 0, TRIMMED)  # a trim for a QP it does not have
    far = bytearray(payload[:fmt.TRIMMED_LEN])
    far[9] ^= 0x40
    responder.on_datagram(bytes(far), SRC, sport, 0, TRIMMED)  # far outside the window
    assert responder.drops["bad_icrc"] == 2 and responder.drops["trimmed_truncated"] == 1
    assert responder.drops["unknown_qp"] == 1 and responder.drops["trim_out_of_window"] == 1
    assert _sent(responder) == [] and responder.stats["packets_placed"] == 0

    requester = Requester(SRC, 0x11, 0x22, PATHS.forward, QpConfig(mtu=1024), random_bits=bits(2))
    template = PATHS.back[0].template
    for packet in (fmt.TrimNackPacket(0x11, 5, 0), fmt.TrimNackPacket(0x11, 0, 99), fmt.TrimNackPacket(0x77, 0, 0),
                   fmt.CnpPacket(0x77), fmt.CnpPacket(0x11, pkey=0x1234)):
        opened = open_frame(template.encode(packet))
        requester.on_datagram(bytes(opened.payload), DST, opened.sport, 0, fmt.TCLASS_CONTROL)
    assert requester.drops == {"trim_unknown_psn": 1, "trim_unknown_ev": 1, "unknown_qp": 2, "bad_pkey": 1}
    assert requester.cnps == requester.trim_nacks == 0
    mux = HostMux(SRC)
    mux.add(0x11, requester)
    assert mux.route(encode_roce(fmt.CnpPacket(0x78)) + bytes(4)) is None and mux.unknown_qp == 1


def test_cnp_at_most_once_per_interval_per_qp():
    """CE marks every 10 us for 1 ms on a DCQCN QP: a CNP at the first and then one per 50 us."""
    responder, mr = _responder(QpConfig(mtu=1024, cnp=True))
    cnps = []
    for i in range(100):
        payload, sport = _data(mr, i % 60, length=64)
        responder.on_datagram(payload, SRC, sport, i * 10_000, fmt.TCLASS_DATA | fmt.ECN_CE)
        cnps += [i * 10_000 for _, p in _sent(responder, i * 10_000) if isinstance(p, fmt.CnpPacket)]
    assert cnps == list(range(0, 1_000_000, 50_000)) and responder.stats["cnps_sent"] == 20
    quiet, mr = _responder()  # not a DCQCN QP: no CNP
    payload, sport = _data(mr, 0, length=64)
    quiet.on_datagram(payload, SRC, sport, 0, fmt.TCLASS_DATA | fmt.ECN_CE)
    assert quiet.stats["cnps_sent"] == 0 and not any(isinstance(p, fmt.CnpPacket) for _, p in _sent(quiet))


def test_cnps_reach_the_requesters_cc():
    config = QpConfig(mtu=1024, cnp=True)
    requester, responder, net, cc = transfer(500_000, {k: {"ce": 0.5, "delay_ns": 20_000} for k in range(8)}, config)
    assert responder.stats["cnps_sent"] == net.cnps == requester.cnps == len(cc.cnps) > 0
    assert all(b - a >= 50_000 for a, b in zip(cc.cnps, cc.cnps[1:]))


def test_socket_link_reads_the_traffic_class():
    """The plain receive path (recvmsg) hands each datagram's traffic class to the endpoint."""
    recv = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    recv.bind(("::1", 0))
    sender = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    try:
        link = SocketLink(sender, recv)
        got = []

        class Endpoint:
            address = b""

            def on_datagram(self, payload, src, sport, now, tclass=0, port=0):
                got.append((bytes(payload), tclass))

        for tclass in (fmt.TCLASS_DATA | fmt.ECN_CE, TRIMMED, fmt.TCLASS_CONTROL):
            sender.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_TCLASS, tclass)
            sender.sendto(bytes([tclass]), recv.getsockname()[:2])
        deadline = time.monotonic() + 5
        while len(got) < 3 and time.monotonic() < deadline:
            link.receive(Endpoint(), time.monotonic_ns)
        assert got == [(bytes([t]), t) for t in (fmt.TCLASS_DATA | fmt.ECN_CE, TRIMMED, fmt.TCLASS_CONTROL)]
        if port_module._sockio is not None:  # the batched receive says the same
            port_module._sockio.enable_stamps(recv.fileno())
            sender.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_TCLASS, TRIMMED_LASTHOP)
            sender.sendto(b"x", recv.getsockname()[:2])
            batch = []
            while not batch and time.monotonic() < deadline:
                batch = port_module._sockio.recv_batch(recv.fileno(), 4)
            assert batch[0][4] == TRIMMED_LASTHOP
    finally:
        sender.close()
        recv.close()


@pytest.mark.parametrize("c_path", [True, False])
def test_trimmed_packets_never_reach_the_c_placement(c_path):
    responder = Responder(DST, QpConfig(mtu=1024), random_bits=bits(1), c_path=c_path)
    mr = responder.register(bytearray(8192))
    responder.accept(0x22, 0x11, 0, PATHS.back)
    payload, sport = _data(mr, 0, length=1024)
    responder.on_datagram(payload[:64], SRC, sport, 0, TRIMMED)
    assert responder.stats["trimmed_received"] == 1 and responder.qps[0x22].trims


def test_the_baseline_with_dcqcn_slows_down_on_cnps():
    """A go-back-N QP with DCQCN (cc 'dcqcn') and a responder that answers CE with CNPs: its CC
    hears every CNP and cuts its rate; the WRITE completes and verifies."""
    config = QpConfig.baseline(mtu=1024, cnp=True, link_rate_bps=1e9)
    responder = Responder(DST, config, random_bits=bits(1))
    buffer = bytearray(400_000)
    mr = responder.register(buffer)
    responder.accept(0x22, 0x11, 0, {0: PATHS.back[0]}, config=config)
    cc = make_cc("dcqcn", config.mtu, config.link_rate_bps)
    requester = Requester(SRC, 0x11, 0x22, {0: PATHS.forward[0]}, config, cc=cc, random_bits=bits(2))
    net = MemoryNetwork(0)
    net.fault(0).ce = 0.3
    data = os.urandom(len(buffer))
    requester.post_write(data, mr.va, mr.rkey)
    assert net.run([requester, responder], lambda: requester.done, limit_ns=60_000_000_000)
    assert requester.error is None and bytes(buffer) == data
    assert responder.stats["cnps_sent"] == requester.cnps == cc.cnps > 0 and cc.decreases > 0
    assert cc.rc < cc.line


def test_the_baseline_does_not_understand_trims_and_recovers_them_by_go_back_n():
    """RoCEv2 RC knows no trimming: its responder drops a trimmed packet as its NIC would (the
    ICRC is gone) and sends no TRIM NACK; the gap is found by the next packet's sequence NAK and
    go-back-N resends from it. The WRITE completes and verifies."""
    config = QpConfig.baseline(mtu=1024)
    responder = Responder(DST, config, random_bits=bits(1))
    buffer = bytearray(200_000)
    mr = responder.register(buffer)
    responder.accept(0x22, 0x11, 0, {0: PATHS.back[0]}, config=config)
    requester = Requester(SRC, 0x11, 0x22, {0: PATHS.forward[0]}, config, random_bits=bits(2))
    net = MemoryNetwork(0)
    net.fault(0).trim = 0.02
    data = os.urandom(len(buffer))
    requester.post_write(data, mr.va, mr.rkey)
    assert net.run([requester, responder], lambda: requester.done, limit_ns=60_000_000_000)
    assert requester.error is None and bytes(buffer) == data
    assert responder.drops["trimmed_not_understood"] > 0
    assert responder.stats["trim_nacks_sent"] == 0 and requester.trim_nacks == 0
    assert requester.naks > 0  # sequence NAKs did the repair


def test_a_trimmed_packet_is_resent_first_once_the_window_has_room():
    """The resend of a trimmed packet goes ahead of new data, but inside the window: the trim took
    its bytes out of flight, and a window cut by as much (NSCC) makes it wait for an ACK."""
    config = QpConfig(mtu=1024)
    window = FixedWindow(2 * 1024, 1024)
    requester = Requester(SRC, 0x11, 0x22, PATHS.forward, config, cc=window, random_bits=bits(2))
    requester.post_write(os.urandom(8 * 1024), 0x1000, 7)
    sent: list = []
    requester.pump(1_000, lambda frame, path: sent.append(path.ev) or True)
    assert len(sent) == 2  # the window is full
    pkts = requester.recovery.sent.pkts
    first, second = sorted(pkts)[:2]
    window.cwnd = 1024  # as NSCC's OnNACK cuts it: by the trimmed packet's size
    nack = fmt.TrimNackPacket(0x11, first, pkts[first].ev)
    opened = open_frame(PATHS.back[pkts[first].ev].template.encode(nack))
    requester.on_datagram(bytes(opened.payload), DST, opened.sport, 2_000, fmt.TCLASS_CONTROL)
    requester.pump(2_000, lambda frame, path: sent.append(path.ev) or True)
    assert len(sent) == 2 and not requester._can_send()  # 1 KiB in flight: a 1 KiB window is full
    ack = fmt.AckPacket(0x11, (first - 1) % (1 << 24), sack_base=second, sack_bitmap=b"\x80\0\0\0", echo_psn=second,
                        echo_ev=pkts[second].ev)  # the second arrived; the first's resend is what is missing
    opened = open_frame(PATHS.back[pkts[second].ev].template.encode(ack))
    requester.on_datagram(bytes(opened.payload), DST, opened.sport, 3_000, fmt.TCLASS_CONTROL)
    requester.pump(3_000, lambda frame, path: sent.append(path.ev) or True)
    assert len(sent) == 3 and requester.retransmits == 1  # the trimmed packet went first, new data waits
    assert first in requester.recovery.sent.flight and len(requester.recovery.sent.flight) == 1


def test_trim_repair_figures_count_trims_before_any_rtt_apart():
    from mrc_emu.transport.ledger import trim_repair

    figures = trim_repair([(5_000_000, 3_000_000.0, 2_000_000), (7_000_000, 3_000_000.0, 1_000_000),
                           (1_000_000, 0.0, 400_000)])
    assert figures["count"] == 3 and figures["before_rtt"] == 1
    assert figures["within_2_rtt"] == 0.5  # 5 ms within 2 x 3 ms, 7 ms not; the one before any RTT apart
    assert (figures["p50_us"], figures["max_us"]) == (5000.0, 7000.0)
    # split at the NACK: sent -> NACK 0.4, 1, 2 ms; NACK -> acknowledged 0.6, 3, 6 ms
    assert (figures["nack_p50_us"], figures["after_nack_p50_us"]) == (1000.0, 3000.0)
    assert trim_repair([]) is None and trim_repair([(1, 0.0, 0)])["within_2_rtt"] is None
