"""The MRC transport over the in-memory link: no root, virtual time, injected faults."""

from __future__ import annotations

import hashlib
import itertools
import os
import random
import socket
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mrc_emu.io.memory import MemoryNetwork
from mrc_emu.io.sockets import SocketLink
from mrc_emu.topology import builtin
from mrc_emu.topology.evs import EvFormat
from mrc_emu.transport import requester as requester_module
from mrc_emu.transport import responder as responder_module
from mrc_emu.transport import sent as sent_module
from mrc_emu.transport.cc.fixed import FixedWindow
from mrc_emu.transport.config import QpConfig, psn_abs
from mrc_emu.transport.multipath.ev import EvState
from mrc_emu.transport.multipath.paths import qp_paths
from mrc_emu.transport.requester import Requester
from mrc_emu.transport.responder import Responder
from mrc_emu.wire import format as fmt
from mrc_emu.wire.decoder import open_frame
from mrc_emu.wire.format import DataPacket

TOPO = builtin()
PATHS = qp_paths(TOPO, "h0", "h2")
SRC = socket.inet_pton(socket.AF_INET6, PATHS.src_address)
DST = socket.inet_pton(socket.AF_INET6, PATHS.dst_address)
needs_spray = pytest.mark.skipif(requester_module._spray is None, reason="the C send loop (mrc_emu.transport._spray) "
                                 "is not built: python setup.py build_ext --inplace")


def bits(seed: int = 0):
    """A seeded random source, as the transport takes one (R_Keys, probe ids)."""
    return random.Random(seed).getrandbits


def pair(size: int, config: QpConfig | None = None, start_psn: int = 0, **kw):
    """A responder with a region of `size` bytes and a requester that may write it (**kw: Requester's)."""
    config = config or QpConfig(mtu=1024)
    responder = Responder(DST, config, random_bits=bits(1))
    buffer = bytearray(size)
    mr = responder.register(buffer)
    responder.accept(0x22, 0x11, start_psn, PATHS.back)
    responder.post_recv(0x22, 64)  # for WRITE_WITH_IMMs: MRC has no RNR, receives come first
    requester = Requester(SRC, 0x11, 0x22, PATHS.forward, config, start_psn=start_psn,
                          random_bits=bits(2), **kw)
    return requester, responder, mr, buffer


def transfer(size: int, faults: dict[int, dict], seed: int = 0, config: QpConfig | None = None,
             start_psn: int = 0, imm: int | None = None, c_loop: bool = True):
    requester, responder, mr, buffer = pair(size, config, start_psn, c_loop=c_loop)
    net = MemoryNetwork(seed)
    for ev, settings_ in faults.items():
        for key, value in settings_.items():
            setattr(net.fault(ev), key, value)
    data = os.urandom(size)
    requester.post_write(data, mr.va, mr.rkey, imm)
    finished = net.run([requester, responder], lambda: requester.done, limit_ns=120_000_000_000)
    return finished, requester, responder, data, buffer, net


fault = st.fixed_dictionaries({}, optional={
    "loss": st.floats(0, 0.3), "duplicate": st.floats(0, 0.3), "reorder": st.floats(0, 0.5),
    "delay_ns": st.integers(1_000, 200_000), "dead": st.booleans(),
})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(size=st.integers(1, 200_000), faults=st.dictionaries(st.integers(0, 7), fault, max_size=8),
       seed=st.integers(0, 2**16), start_psn=st.sampled_from([0, 0xFFFFF0, 12345]), c_loop=st.booleans())
def test_any_loss_reorder_duplication_delivers_exactly_the_source(size, faults, seed, start_psn, c_loop):
    """c_loop: first transmissions sent by the C loop (_spray.c) or by the requester's own."""
    if all(faults.get(k, {}).get("dead") for k in range(8)):
        faults[0]["dead"] = False  # every EV dead is the next test
    finished, requester, responder, data, buffer, _ = transfer(size, faults, seed, start_psn=start_psn, c_loop=c_loop)
    assert finished and requester.error is None
    assert hashlib.sha256(buffer).digest() == hashlib.sha256(data).digest()
    assert requester.completions[0].length == size
    assert responder.stats["bytes_placed"] == size  # duplicates are placed once
    assert requester.packets_sent - requester.retransmits == -(-size // 1024)  # each packet sent new once


class _Recording(MemoryNetwork):
    """An in-memory network that keeps a copy of every frame sent, in order, and can refuse
    frames on some EVs as a host whose own port is down does."""

    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self.frames: list[tuple[int, bytes]] = []  # (EV, frame)
        self.refuse: set[int] = set()  # EVs whose frames cannot leave the host (its port is down)

    def send(self, frame, path) -> bool:
        self.frames.append((path.ev, bytes(frame)))
        if path.ev in self.refuse:
            return False
        return super().send(frame, path)


@needs_spray
@pytest.mark.parametrize("faults, refuse", [({}, ()), ({3: {"loss": 0.2}, 5: {"dead": True}}, ()), ({}, (2,))])
def test_c_send_loop_sends_the_same_frames_as_the_python_loop(faults, refuse):
    """Same WRITE, same virtual time, same faults: the C loop and the requester's own loop send the
    same frames on the same EVs in the same order, so the C loop changes nothing but the speed.
    (pair() seeds R_Keys and probe ids alike for both runs.)"""
    data = os.urandom(300_000 + 100)  # ends in a short packet, which the Python loop sends
    runs = []
    loops = []
    for c_loop in (True, False):
        requester, responder, mr, buffer = pair(len(data), c_loop=c_loop)
        loops.append(requester._spray is not None)
        requester.post_write(data, mr.va, mr.rkey, imm=7)
        net = _Recording(1)
        net.refuse = set(refuse)
        for ev, settings_ in faults.items():
            for key, value in settings_.items():
                setattr(net.fault(ev), key, value)
        assert net.run([requester, responder], lambda r=requester: r.done)
        assert buffer == data
        runs.append((net.frames, requester.summary(), [s.to_dict() for s in requester.profile.evs.values()],
                     [e.to_dict() for e in requester.ev_events]))
    assert loops == [True, False]  # both loops really ran
    assert runs[0] == runs[1]
    if refuse:
        assert runs[0][1]["send_failures"] > 0
        assert any(e["ev"] == 2 and "no route out of the host" in e["reason"] for e in runs[0][3])


def test_every_ev_gets_rtt_samples_that_follow_its_delay():
    """Each ACK gives every EV that delivered an RTT sample, not only the EV of the echoed packet
    (with an ACK every 32nd packet over 8 EVs, that was the same one or two EVs every time)."""
    delays = {k: {"delay_ns": 20_000 * (k + 1)} for k in range(8)}
    finished, requester, *_ = transfer(1_000_000, delays, seed=1)
    assert finished
    srtt = [s.srtt_ns for s in requester.profile.evs.values()]
    assert all(x > 0 for x in srtt)
    # a sample is the EV's way out plus the ACK's way back (whichever EV that takes): it grows with the EV's delay
    assert srtt == sorted(srtt) and srtt[-1] > 3 * srtt[0]


@pytest.mark.parametrize("c_loop", [True, False])
def test_each_packet_is_stamped_with_its_own_send_time(c_loop):
    """Over sockets a burst of 32 packets takes about 0.4 ms: given a clock, pump stamps each one,
    read when its send began (left_ns: its RTT is taken from there) and once it was done (sent_ns)."""
    requester, responder, mr, buffer = pair(64 * 1024, c_loop=c_loop)
    requester.post_write(os.urandom(64 * 1024), mr.va, mr.rkey)
    ticks = itertools.count(1_000_000, 7_000)
    sent = []
    requester.pump(1_000_000, lambda frame, path: sent.append(path.ev) or True, clock=lambda: next(ticks))
    table = requester.recovery.sent
    stamps = [table.pkts[psn].sent_ns for psn in table.flight]
    assert len(stamps) == len(sent) == requester.config.burst
    assert stamps == list(range(1_007_000, 1_007_000 + 14_000 * len(stamps), 14_000))
    assert [table.pkts[psn].left_ns for psn in table.flight] == [t - 7_000 for t in stamps]
    for ev, queue in table.by_ev.items():  # the per-EV order that loss detection walks
        assert all(table.pkts[psn].sent_ns == t and table.pkts[psn].ev == ev for psn, t in queue)


@pytest.mark.parametrize("c_loop", [True, False])
def test_a_packet_goes_only_if_it_fits_the_window_whole(c_loop):
    """UEC's CanSend, as uet-htsim's can_send_NSCC has it (cwnd >= in flight + the packet's size):
    a window of 2.5 packets (NSCC's is fractional) holds two full packets, not a third that would
    pass it; a short last packet goes if it fits. next_wakeup agrees with pump."""
    requester, responder, mr, buffer = pair(64 * 1024, cc=FixedWindow(2.5 * 1024, 1024), c_loop=c_loop)
    requester.post_write(os.urandom(8 * 1024), mr.va, mr.rkey)
    sent = []
    requester.pump(1_000, lambda frame, path: sent.append(path.ev) or True)
    assert len(sent) == 2 and requester.recovery.sent.bytes_in_flight == 2048
    assert requester.next_wakeup() != 1_000  # no busy wake: the third does not fit
    short, _, mr2, _ = pair(64 * 1024, cc=FixedWindow(2.5 * 1024, 1024), c_loop=c_loop)
    short.post_write(os.urandom(2560), mr2.va, mr2.rkey)  # 1024 + 1024 + 512: exactly the window
    sent.clear()
    short.pump(1_000, lambda frame, path: sent.append(path.ev) or True)
    assert len(sent) == 3 and short.recovery.sent.bytes_in_flight == 2560


def test_socket_driver_pumps_at_least_every_32_datagrams():
    """The responder sends its ACKs when pumped: the socket driver hands it at most 32 waiting
    datagrams between pumps (loopback UDP, no root)."""
    recv = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    recv.bind(("::1", 0))
    sender = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    try:
        for i in range(100):
            sender.sendto(i.to_bytes(2, "big"), recv.getsockname()[:2])
        link = SocketLink(sender, recv)
        got: list[int] = []

        class Counter:
            address = b""

            def on_datagram(self, payload, src, sport, now, tclass=0, port=0):
                got.append(int.from_bytes(payload, "big"))

        deadline = time.monotonic() + 5
        batches = []
        while len(got) < 100 and time.monotonic() < deadline:
            batches.append(link.receive(Counter(), time.monotonic_ns))
        assert got == list(range(100)) and max(batches) == 32
    finally:
        sender.close()
        recv.close()


def test_transfers_without_the_c_extensions(monkeypatch):
    """Where the C loop, packet record and placement were not built, the Python ones run the same transfer."""
    monkeypatch.setattr(requester_module, "_spray", None)
    monkeypatch.setattr(sent_module, "Pkt", sent_module.PyPkt)
    monkeypatch.setattr(responder_module, "_CQp", None)
    finished, requester, responder, data, buffer, _ = transfer(200_000, {2: {"loss": 0.2}, 6: {"dead": True}}, seed=3)
    assert finished and requester.error is None and buffer == data
    assert requester._spray is None and requester.recovery.sent.Pkt is sent_module.PyPkt
    assert responder._place is None


def test_every_ev_dead_fails_with_clear_error_after_retry_budget():
    config = QpConfig(mtu=1024, ack_timeout_exp=10, retry_linear=3, retry_exp=2)
    finished, requester, _, _, _, net = transfer(50_000, {k: {"dead": True} for k in range(8)}, config=config)
    assert finished  # done() is true because the requester failed; it did not hang
    assert requester.error is not None and "retry budget spent" in requester.error
    # 3 linear timeouts then 2 doubling ones, then the budget is spent
    timeout = config.ack_timeout_ns
    assert net.now <= timeout * (1 + 3 + 2 + 4) + 1_000_000
    assert requester.completions == []


def test_dead_ev_becomes_assumed_bad_and_gets_no_more_traffic():
    config = QpConfig(mtu=1024)
    finished, requester, _, data, buffer, _ = transfer(
        6_000_000, {2: {"dead": True}} | {k: {"delay_ns": 50_000, "rate_bps": 10e9} for k in (0, 1, 3, 4, 5, 6, 7)},
        config=config)
    assert finished and buffer == data
    states = {k: s.state for k, s in requester.profile.evs.items()}
    assert states[2] is EvState.ASSUMED_BAD
    assert all(states[k] is EvState.GOOD for k in states if k != 2)
    bad_at = next(e.time_ns for e in requester.ev_events if e.ev == 2)
    assert bad_at < 5_000_000  # detected in ms, not seconds
    # only what was sprayed on it before detection (an eighth of the first window)
    sent_on_dead = requester.profile.evs[2].packets_sent
    assert sent_on_dead <= QpConfig().window // 8 + 8
    assert sent_on_dead < 0.05 * requester.packets_sent


def test_probe_revives_assumed_bad_ev_when_path_heals():
    requester, responder, mr, buffer = pair(3_000_000)
    net = MemoryNetwork(3)
    for k in range(8):
        net.fault(k).delay_ns = 50_000
        net.fault(k).rate_bps = 5e9
    net.fault(4).dead = True
    data = os.urandom(len(buffer))
    requester.post_write(data, mr.va, mr.rkey)

    healed = []

    def heal_when_bad():
        if not healed and requester.profile.evs[4].state is EvState.ASSUMED_BAD:
            net.fault(4).dead = False
            healed.append(net.now)
        return requester.done

    assert net.run([requester, responder], heal_when_bad)
    assert buffer == data and healed
    # an idle QP keeps probing its ASSUMED_BAD EVs
    assert net.run([requester, responder], lambda: requester.profile.evs[4].state is EvState.GOOD,
                   limit_ns=net.now + 50_000_000)
    events = [(e.old, e.new, e.reason) for e in requester.ev_events if e.ev == 4]
    assert events[-1][1] is EvState.GOOD and events[-1][2] == "probe returned"
    revive = [e for e in requester.ev_events if e.ev == 4 and e.new is EvState.GOOD][-1]
    assert 100_000 <= revive.rtt_ns < 110_000  # out and back along EV 4: twice its 50 us delay


def test_lossy_ev_gets_less_traffic():
    faults = {k: {"delay_ns": 20_000, "rate_bps": 20e9} for k in range(8)}
    faults[0]["loss"] = faults[1]["loss"] = 0.05
    finished, requester, _, data, buffer, _ = transfer(4_000_000, faults, seed=5)
    assert finished and buffer == data
    share = requester.profile.share()
    clean = sum(share[k] for k in range(2, 8)) / 6
    assert share[0] < 0.8 * clean and share[1] < 0.8 * clean


def test_write_with_imm_completes_only_when_all_data_placed():
    requester, responder, mr, buffer = pair(10 * 1024)
    net = MemoryNetwork(0)
    # the last packet (with the immediate) overtakes the rest: EV 0 fast, others slow
    for k in range(8):
        net.fault(k).delay_ns = 10_000 if k == 1 else 500_000
    data = os.urandom(len(buffer))
    requester.post_write(data, mr.va, mr.rkey, imm=0xABCD)
    seen_early = []

    def watch():
        if responder.completions and buffer != data:
            seen_early.append(True)
        return requester.done

    assert net.run([requester, responder], watch)
    assert not seen_early
    assert [c.imm for c in responder.completions] == [0xABCD]
    assert buffer == data


def test_write_with_imm_without_a_posted_receive_fails_clearly_and_places_nothing_of_it():
    """MRC has no RNR: a WRITE_WITH_IMM that finds no receive posted is refused (NAK remote
    operational error) and the requester's QP goes to error, saying why; with receives for two of
    three WRITE_WITH_IMMs, the third fails."""
    config = QpConfig(mtu=1024)
    responder = Responder(DST, config, random_bits=bits(1))
    buffer = bytearray(3 * 4096)
    mr = responder.register(buffer)
    responder.accept(0x22, 0x11, 0, PATHS.back)
    responder.post_recv(0x22, 2)
    with pytest.raises(ValueError, match="no such QP"):
        responder.post_recv(0x99)
    requester = Requester(SRC, 0x11, 0x22, PATHS.forward, config, random_bits=bits(2))
    data = os.urandom(len(buffer))
    for i in range(3):
        requester.post_write(data[i * 4096:(i + 1) * 4096], mr.va + i * 4096, mr.rkey, imm=i)
    net = MemoryNetwork(0)
    assert net.run([requester, responder], lambda: requester.done or requester.error is not None)
    assert requester.error is not None and "no receive posted" in requester.error and "no RNR" in requester.error
    assert [c.imm for c in responder.completions] == [0, 1]
    assert responder.drops["imm_without_receive"] >= 1 and responder.recvs[0x22] == 0
    assert buffer[:8192] == data[:8192] and buffer[8192 + 3072:] == bytes(1024)  # its immediate packet: not placed


def test_several_outstanding_writes_complete_in_order():
    requester, responder, mr, buffer = pair(64 * 1024)
    net = MemoryNetwork(1)
    net.fault(3).reorder = 0.5
    pieces = [os.urandom(n) for n in (1, 5000, 20_000, 39_535)]
    offset = 0
    for i, piece in enumerate(pieces):
        requester.post_write(piece, mr.va + offset, mr.rkey, imm=i if i % 2 else None)
        offset += len(piece)
    assert net.run([requester, responder], lambda: requester.done)
    assert [c.wr_id for c in requester.completions] == [1, 2, 3, 4]
    assert bytes(buffer[:offset]) == b"".join(pieces)
    assert [c.imm for c in responder.completions] == [1, 3]


@pytest.mark.parametrize("mutate, reason", [
    (lambda p: setattr(p, "rkey", p.rkey ^ 1), "bad_rkey"),
    (lambda p: setattr(p, "va", p.va - 4096), "out_of_bounds"),
    (lambda p: setattr(p, "va", p.va + (1 << 40)), "out_of_bounds"),
    (lambda p: setattr(p, "dest_qp", 0x99), "unknown_qp"),
    (lambda p: setattr(p, "pkey", 0x7FFF), "bad_pkey"),
    (lambda p: setattr(p, "psn", 5000), "psn_out_of_window"),
])
def test_responder_refuses_hostile_writes_without_touching_memory(mutate, reason):
    requester, responder, mr, buffer = pair(8192)
    packet = DataPacket(0x22, 0, mr.va, mr.rkey, b"\xee" * 1024, ack_req=True)
    mutate(packet)
    frame = PATHS.forward[0].template.data(packet)
    net = MemoryNetwork(0)
    net.attach(responder)
    net.send(frame, PATHS.forward[0])
    net.run([responder], lambda: False)
    assert responder.drops == {reason: 1}
    assert buffer == bytearray(8192)
    if reason in ("bad_rkey", "out_of_bounds"):
        assert responder.stats["naks_sent"] == 1


class _Hostile:
    """A peer that floods the responder with writes it must refuse, every 0.5 us of virtual time."""

    def __init__(self, victim_qpn: int, own_qpn: int, victim_rkey: int, own_mr) -> None:
        paths = qp_paths(TOPO, "h1", "h2")
        self.address = socket.inet_pton(socket.AF_INET6, paths.src_address)
        self.path = paths.forward[0]
        self.now = 0
        self.victim_qpn, self.own_qpn, self.victim_rkey, self.own_mr = victim_qpn, own_qpn, victim_rkey, own_mr
        self.sent = 0
        self.stopped = False

    def packets(self, psn: int) -> list[DataPacket]:
        """One round; a new PSN each round, so that nothing is refused merely as a duplicate."""
        junk, own = b"\xee" * 1024, self.own_mr
        return [
            DataPacket(self.victim_qpn, psn, 0x1000_0000, self.victim_rkey, junk),  # the victim's QP, from elsewhere
            DataPacket(self.own_qpn, psn, 0x1000_0000, self.victim_rkey, junk),  # its own QP, another domain's R_Key
            DataPacket(self.own_qpn, psn, own.va + own.length, own.rkey, junk),  # past its own region
            DataPacket(self.own_qpn, psn + 0x400000, own.va, own.rkey, junk),  # far outside the PSN window
        ]

    def on_datagram(self, payload, src, sport, now, tclass=0, port=0) -> None:
        pass  # NAKs

    def pump(self, now: int, send) -> None:
        if now >= self.now and not self.stopped:
            for packet in self.packets(self.sent // 4):
                send(self.path.template.data(packet), self.path)
                self.sent += 1
            self.now = now + 500

    def next_wakeup(self) -> int | None:
        return None if self.stopped else self.now


def test_hostile_peer_neither_corrupts_memory_nor_stalls_another_qp():
    """Protection domains, peer addresses, bounds and the PSN window, all at once: a peer
    flooding refused writes while a real WRITE runs; the WRITE completes exactly."""
    config = QpConfig(mtu=1024)
    responder = Responder(DST, config, random_bits=bits(1))
    buffer, other = bytearray(200_000), bytearray(4096)
    mr = responder.register(buffer, pd=1)
    own = responder.register(other, va=0x2000_0000, pd=2)
    responder.accept(0x22, 0x11, 0, PATHS.back, peer=SRC, pd=1)
    hostile = _Hostile(0x22, 0x33, mr.rkey, own)
    responder.accept(0x33, 0x44, 0, qp_paths(TOPO, "h2", "h1").forward, peer=hostile.address, pd=2)
    requester = Requester(SRC, 0x11, 0x22, PATHS.forward, config, random_bits=bits(2))
    data = os.urandom(len(buffer))
    requester.post_write(data, mr.va, mr.rkey)
    net = MemoryNetwork(0)
    assert net.run([requester, responder, hostile], lambda: requester.done)
    hostile.stopped = True
    net.run([responder, hostile], lambda: False)  # deliver what is still on the way
    assert requester.error is None and buffer == data and other == bytearray(4096)
    assert hostile.sent >= 100
    for reason in ("unknown_qp", "bad_rkey", "out_of_bounds", "psn_out_of_window"):
        assert responder.drops.get(reason) == hostile.sent // 4, reason
    assert requester.retransmits == 0


def test_one_responder_serves_mrc_and_go_back_n_qps_at_once():
    """Recovery is per QP: an MRC QP sprayed over seven EVs of different delays (its packets arrive
    out of PSN order, and are placed as they come: no retransmission) and a go-back-N QP on a lossy
    EV 0 (out-of-sequence packets dropped and NAKed, then resent) write into one responder at once."""
    mrc, gbn = QpConfig(mtu=1024), QpConfig.baseline(mtu=1024, ack_timeout_exp=10)
    responder = Responder(DST, mrc, random_bits=bits(1))
    sprayed, in_order = bytearray(150_000), bytearray(60_000)
    mr_sprayed, mr_in_order = responder.register(sprayed, pd=1), responder.register(in_order, va=0x2000_0000, pd=2)
    other = qp_paths(TOPO, "h1", "h2")
    h1 = socket.inet_pton(socket.AF_INET6, other.src_address)
    responder.accept(0x22, 0x11, 0, PATHS.back, peer=SRC, pd=1)  # the responder's own config: MRC
    responder.accept(0x44, 0x33, 0, {0: other.back[0]}, peer=h1, pd=2, config=gbn)
    spray_paths = {k: p for k, p in PATHS.forward.items() if k != 0}
    requester_mrc = Requester(SRC, 0x11, 0x22, spray_paths, mrc, random_bits=bits(2))
    requester_gbn = Requester(h1, 0x33, 0x44, {0: other.forward[0]}, gbn, random_bits=bits(3))
    data_mrc, data_gbn = os.urandom(len(sprayed)), os.urandom(len(in_order))
    requester_mrc.post_write(data_mrc, mr_sprayed.va, mr_sprayed.rkey)
    requester_gbn.post_write(data_gbn, mr_in_order.va, mr_in_order.rkey)
    net = MemoryNetwork(4)
    net.fault(0).loss = 0.05
    for k in range(1, 8):
        net.fault(k).delay_ns = 20_000 * k
    assert net.run([requester_mrc, requester_gbn, responder], lambda: requester_mrc.done and requester_gbn.done)
    assert requester_mrc.error is None and requester_gbn.error is None
    assert sprayed == data_mrc and in_order == data_gbn
    assert requester_mrc.retransmits == 0  # nothing of the sprayed QP was refused for arriving early
    assert responder.drops["out_of_sequence"] > 0 and requester_gbn.retransmits > 0


def test_remote_access_error_fails_the_write_clearly():
    requester, responder, mr, buffer = pair(8192)
    requester.post_write(b"x" * 4000, mr.va + 6000, mr.rkey)  # runs past the region's end
    net = MemoryNetwork(0)
    assert net.run([requester, responder], lambda: requester.done)
    assert requester.error and "remote access error" in requester.error
    assert responder.drops.get("out_of_bounds") and len(buffer) == 8192


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.integers(0, 0xFFFF))
def test_garbage_datagrams_never_crash_either_side(payload, sport):
    requester, responder, mr, buffer = pair(4096)
    responder.on_datagram(payload, SRC, sport, 0)
    requester.on_datagram(payload, DST, sport, 0)
    assert buffer == bytearray(4096)
    # each is refused and counted exactly once (a random ICRC matching is a 2^-32 event)
    assert sum(responder.drops.values()) == 1 and sum(requester.drops.values()) == 1


def test_psn_wraps_around():
    assert psn_abs(2, 0xFFFFFE) == 0x1000002
    assert psn_abs(0xFFFFFE, 0x1000002) == 0xFFFFFE
    finished, requester, _, data, buffer, _ = transfer(300 * 1024, {}, start_psn=0xFFFFC0)
    assert finished and buffer == data


def test_ack_timeout_follows_ocp_formula():
    config = QpConfig(ack_timeout_exp=13, retry_linear=7, retry_exp=3)
    assert config.ack_timeout_ns == 1024 * 2**13
    requester, *_ = pair(1, config)
    assert requester.config is config
    assert [config.ack_timeout_for(tx) for tx in range(1, 12)] == [8388608] * 8 + [8388608 * 2**k for k in (1, 2, 3)]
    assert not config.retry_budget_spent(10) and config.retry_budget_spent(11)
    with pytest.raises(ValueError):
        QpConfig(ack_timeout_exp=25)
    with pytest.raises(ValueError):
        QpConfig(mtu=1001)


@pytest.mark.parametrize("topo_name, ev_format", [("default", EvFormat.SRV6_USID), ("fourplane", EvFormat.SRV6),
                                                  ("default", EvFormat.UDP)])
def test_every_ev_format_and_topology_transfers(topo_name, ev_format):
    topo = builtin(topo_name)
    paths = qp_paths(topo, "h1", "h3", ev_format)
    src = socket.inet_pton(socket.AF_INET6, paths.src_address)
    dst = socket.inet_pton(socket.AF_INET6, paths.dst_address)
    responder = Responder(dst, QpConfig(mtu=512), random_bits=bits(1))
    buffer = bytearray(50_000)
    mr = responder.register(buffer)
    responder.accept(5, 6, 0, paths.back)
    requester = Requester(src, 6, 5, paths.forward, QpConfig(mtu=512), random_bits=bits(2))
    data = os.urandom(50_000)
    requester.post_write(data, mr.va, mr.rkey)
    assert MemoryNetwork(0).run([requester, responder], lambda: requester.done)
    assert buffer == data


def test_recovery_metric_on_synthetic_timelines():
    from mrc_emu.experiments.analysis import metrics

    ms = 1_000_000
    rate = 1000  # bytes per ms
    steady = [(t * ms, t * rate) for t in range(200)]
    assert metrics.recovery(steady, 100 * ms).recovery_ms == 0.0
    # a 5 ms stall at the fault, then the old rate again
    stalled = [(t * ms, (t if t < 100 else max(100, t - 5)) * rate) for t in range(200)]
    rec = metrics.recovery(stalled, 100 * ms)
    assert 4.5 <= rec.recovery_ms <= 5.5 and rec.worst_gbps == 0.0
    # never recovers before the end
    dead = [(t * ms, min(t, 100) * rate) for t in range(200)]
    assert metrics.recovery(dead, 100 * ms).recovery_ms is None
    # what was past the failed link drains at the full rate for 20 ms, then an 800 ms stall (a VM
    # under TCG): by its goodput alone it "recovered" at once; not before its losses were repaired
    drained = [(t * ms, (t if t < 120 else 120 if t < 920 else t - 800) * rate) for t in range(1200)]
    assert metrics.recovery(drained, 100 * ms).recovery_ms == 0.0
    rec = metrics.recovery(drained, 100 * ms, settled_ns=921 * ms)
    assert 820 <= rec.recovery_ms <= 822 and rec.worst_gbps == 0.0
    # losses repaired while the goodput never dipped: nothing to recover from
    assert metrics.recovery(steady, 100 * ms, settled_ns=110 * ms).recovery_ms == 0.0


@settings(max_examples=15, deadline=None)
@given(loss=st.floats(0, 0.2), reorder=st.floats(0, 0.3), duplicate=st.floats(0, 0.2), seed=st.integers(0, 999),
       size=st.integers(1, 150_000))
def test_baseline_go_back_n_on_one_ev_delivers_exactly(loss, reorder, duplicate, seed, size):
    config = QpConfig.baseline(mtu=1024, ack_timeout_exp=10)
    responder = Responder(DST, config, random_bits=bits(1))
    buffer = bytearray(size)
    mr = responder.register(buffer)
    one = {0: PATHS.forward[0]}
    responder.accept(0x22, 0x11, 0, {0: PATHS.back[0]})
    requester = Requester(SRC, 0x11, 0x22, one, config, random_bits=bits(2))
    net = _CountingDataLoss(seed)
    f = net.fault(0)
    f.loss, f.reorder, f.duplicate = loss, reorder, duplicate
    data = os.urandom(size)
    requester.post_write(data, mr.va, mr.rkey)
    assert net.run([requester, responder], lambda: requester.done, limit_ns=600_000_000_000)
    assert requester.error is None and buffer == data
    assert requester.profile.evs[0].state is EvState.GOOD  # the baseline never avoids its path
    if net.data_lost:  # a lost data packet is resent (20 packets at 5.5 % loss may well lose none)
        assert requester.retransmits > 0


class _CountingDataLoss(MemoryNetwork):
    """A memory network that counts the data frames it lost."""

    data_lost = 0

    def send(self, frame, path) -> bool:
        before = self.frames_dropped
        sent = super().send(frame, path)
        if self.frames_dropped > before:
            opened = open_frame(bytes(frame))
            if not isinstance(opened, fmt.DropReason) and opened.payload[:1] in (b"\x0a", b"\x0b"):
                self.data_lost += 1
        return sent


def test_a_responder_slow_to_answer_does_not_lengthen_the_rtt():
    """The ACK says how long the responder held the echoed packet (here: the delayed-ACK timer,
    2 ms, far beyond the 10 us each way), and the requester takes that out of its samples: the
    EVs' RTTs are the network's 20 us, not the responder's 2 ms. Without it a slow endpoint
    (on a loaded machine: the emulator's own lag) reads as a queue, and the window collapses."""
    config = QpConfig(mtu=1024, ack_every=1000, ack_delay_ns=2_000_000)
    requester, responder, mr, buffer = pair(64 * 1024, config)
    data = os.urandom(len(buffer))
    requester.post_write(data, mr.va, mr.rkey)
    assert MemoryNetwork(0).run([requester, responder], lambda: requester.done)
    assert buffer == data and requester.error is None
    sampled = [s.rtt for s in requester.profile.evs.values() if s.rtt.samples]
    assert sampled, "no EV got an RTT sample"
    # each sample is 20 us plus at most the microsecond the service time is rounded down to
    assert all(20_000 <= r.min_rtt_ns and r.latest_ns <= 22_000 for r in sampled), [r.latest_ns for r in sampled]
    assert requester.cc.decreases == 0


# ---- a requester that loses its CPU inside a send: its timers count from when the packet left ----
# On a loaded machine a worker can be taken off the CPU for tens of milliseconds anywhere, also
# between reading the clock for a packet and handing it to the kernel. A stamp read before the
# send then says the packet left long before it did, and its ACK timeout (16.8 ms) fires on a
# packet that was in flight for a fraction of that: an EV event that is the emulator's. Measured
# with scratch runs that SIGSTOP a worker for 25 ms every ~150 ms beside a 16-QP ring: one run in
# three or four cascaded into thousands of ACK timeouts. The send here moves a fake clock, as a
# preempted sendto would.

HELD_NS = 25_000_000  # the worker is off the CPU this long inside one send


def _held_send(t: list[int], frames: list, hold_first: bool = True):
    def send(frame, path) -> bool:
        frames.append((bytes(frame), path))
        if hold_first and len(frames) == 1:
            t[0] += HELD_NS  # the scheduler takes the CPU away before the kernel has the frame
        return True
    return send


@pytest.mark.parametrize("c_loop", [True, False])
def test_a_send_held_up_by_the_scheduler_is_timed_from_when_it_left(c_loop):
    config = QpConfig(mtu=1024)
    requester, responder, mr, _ = pair(16 * 1024, config, c_loop=c_loop)
    requester.post_write(os.urandom(16 * 1024), mr.va, mr.rkey)
    t = [1_000_000]
    frames: list = []
    requester.pump(t[0], _held_send(t, frames), clock=lambda: t[0], horizon=t[0])
    table = requester.recovery.sent
    first = table.pkts[min(table.pkts)]
    assert first.sent_ns >= 1_000_000 + HELD_NS  # stamped when the send returned, not before it
    # 0.1 ms later nothing has come back yet, and nothing is due: the packet has been out 0.1 ms
    t[0] += 100_000
    requester.pump(t[0], _held_send(t, frames, hold_first=False), clock=lambda: t[0], horizon=t[0])
    assert requester.recovery.timeouts == 0
    assert requester.retransmits == 0
    # its ACK, 50 us after it really left, gives a sample of about that, not of 25 ms
    acks: list = []
    for frame, _ in frames:
        responder.on_datagram(*_datagram(frame), now=first.sent_ns + 50_000)
    responder.pump(first.sent_ns + 50_000, lambda frame, path: acks.append(frame) or True)
    assert acks
    for frame in acks:
        requester.on_datagram(*_datagram(frame), now=t[0])
    srtt = [s.rtt.srtt_ns for s in requester.profile.evs.values() if s.rtt.srtt_ns]
    assert srtt and max(srtt) < HELD_NS // 10


@pytest.mark.parametrize("c_loop", [True, False])
def test_an_ack_heard_before_its_packet_was_stamped_gives_no_rtt_sample(c_loop):
    """Taken off the CPU just after the kernel took the frame, the requester stamps late: the
    ACK (stamped by the kernel on arrival) seems to come back before the packet left. That is no
    sample (clamping it to a microsecond would pull the EV's RTT and the CC's base RTT down)."""
    config = QpConfig(mtu=1024)
    requester, responder, mr, _ = pair(4 * 1024, config, c_loop=c_loop)
    requester.post_write(os.urandom(4 * 1024), mr.va, mr.rkey)
    t = [1_000_000]
    frames: list = []
    requester.pump(t[0], _held_send(t, frames), clock=lambda: t[0], horizon=t[0])
    acks: list = []
    for frame, _ in frames:
        responder.on_datagram(*_datagram(frame), now=1_050_000)  # it left at 1 ms: answered at 1.05 ms
    responder.pump(1_060_000, lambda frame, path: acks.append(frame) or True)
    for frame in acks:
        requester.on_datagram(*_datagram(frame), now=1_100_000)  # the kernel's arrival stamp
    assert requester.recovery.bytes_acked == 4 * 1024
    assert all(s.rtt.srtt_ns == 0 for s in requester.profile.evs.values())


def _datagram(frame: bytes):
    """What the destination's kernel hands up: payload, source address, source port."""
    opened = open_frame(frame)
    return bytes(opened.payload), opened.src, opened.sport
