"""The responder's C placement (_place.c) against its Python path: same placement, ACKs, drops.

The Python path of responder.py is the reference; the C one may only be faster. Each test runs
the same datagrams (or the same whole transfer, in the same virtual time) through a responder
with the C path and one without, and compares everything either can be seen to do.
"""

from __future__ import annotations

import os
import random
import socket

import pytest
from conftest import CountingPlacer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mrc_emu.io.memory import MemoryNetwork
from mrc_emu.topology import builtin
from mrc_emu.transport import responder as responder_module
from mrc_emu.transport.config import QpConfig
from mrc_emu.transport.multipath.paths import qp_paths
from mrc_emu.transport.requester import Requester
from mrc_emu.transport.responder import Responder
from mrc_emu.wire import format as fmt
from mrc_emu.wire.decoder import open_frame
from mrc_emu.wire.format import DataPacket

TOPO = builtin()
PATHS = qp_paths(TOPO, "h0", "h2")
OTHER = qp_paths(TOPO, "h1", "h2")
SRC = socket.inet_pton(socket.AF_INET6, PATHS.src_address)
DST = socket.inet_pton(socket.AF_INET6, PATHS.dst_address)
H1 = socket.inet_pton(socket.AF_INET6, OTHER.src_address)
needs_place = pytest.mark.skipif(responder_module._place is None, reason="the C placement (mrc_emu.transport._place) "
                                 "is not built: python setup.py build_ext --inplace")
pytestmark = needs_place


def bits(seed: int):
    return random.Random(seed).getrandbits


class _Recording(MemoryNetwork):
    """Keeps a copy of every frame sent, in order (the responder's ACKs among them)."""

    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self.frames: list[tuple[int, bytes]] = []

    def send(self, frame, path) -> bool:
        self.frames.append((path.ev, bytes(frame)))
        return super().send(frame, path)


def _responders(config: QpConfig, size: int):
    """The same responder twice, C path on and off: two regions (pd 1 and 2) and two QPs."""
    out = []
    for c_path in (True, False):
        responder = Responder(DST, config, random_bits=bits(1), c_path=c_path)
        buffer, other = bytearray(size), bytearray(8192)
        mr = responder.register(buffer, pd=1)
        own = responder.register(other, va=0x2000_0000, pd=2)
        responder.accept(0x22, 0x11, 0xFFFFF0, PATHS.back, peer=SRC, pd=1)
        responder.accept(0x44, 0x33, 0, {0: OTHER.back[0]}, peer=H1, pd=2,
                         config=QpConfig.baseline(mtu=config.mtu, cnp=True, cnp_interval_ns=5_000))
        responder.post_recv(0x22, 1 << 20)
        responder.post_recv(0x44, 1 << 20)
        out.append((responder, mr, own, buffer, other))
    return out


def _state(responder: Responder) -> dict:
    fields = ("epsn", "received", "since_ack", "unacked_since", "ack_due", "echo_psn", "echo_ev", "echo_at", "ecn",
              "nak", "nak_sent_at", "nak_psn", "pending_imm", "ce_counts", "cnp_due", "cnp_last", "trims",
              "top_psn", "reorder", "reorder_max")
    # copies: a Python QP's lists go on changing after this snapshot (the C state's getters copy)
    return {qpn: {f: (list(v) if isinstance(v := getattr(qp, f), list) else v) for f in fields}
            for qpn, qp in responder.qps.items()}


# one datagram: which QP, its PSN less the QP's expected one, what is wrong with it (if anything), AckReq,
# and whether the responder is pumped after it
_KINDS = ["ok", "ok", "ok", "ok", "imm", "bad_rkey", "other_pd", "out_of_bounds", "bad_pkey", "bad_icrc",
          "unknown_qp", "wrong_peer", "truncated", "short"]
# and the traffic class it arrives with: as sent, CE-marked, trimmed (fabric or last hop, CE or not), or none
_TCLASSES = [fmt.TCLASS_DATA] * 4 + [fmt.TCLASS_DATA | fmt.ECN_CE] * 2 + [
    fmt.DSCP_TRIMMED << 2 | fmt.ECN_ECT0, fmt.DSCP_TRIMMED_LASTHOP << 2 | fmt.ECN_CE, 0]
datagram = st.tuples(st.sampled_from([0x22, 0x44]), st.one_of(st.integers(-3, 12), st.integers(-40, 1100)), st.sampled_from(_KINDS),
                     st.booleans(), st.booleans(), st.sampled_from(_TCLASSES), st.booleans())


def _payload(qpn: int, offset: int, kind: str, ack_req: bool, mr, own, mtu: int) -> tuple[bytes, bytes, int]:
    start = 0xFFFFF0 if qpn == 0x22 else 0
    region = mr if qpn == 0x22 else own
    slot = offset % (region.length // mtu)
    length = mtu if kind != "short" else mtu - 6  # a short packet carries pad bytes
    packet = DataPacket(qpn, (start + offset) & 0xFFFFFF, region.va + slot * mtu, region.rkey,
                        bytes([offset & 0xFF]) * length, ack_req)
    src, path = (SRC, PATHS.forward[offset % 8]) if qpn == 0x22 else (H1, OTHER.forward[0])
    if kind == "imm":
        packet.imm = offset
    elif kind == "bad_rkey":
        packet.rkey ^= 1
    elif kind == "other_pd":
        packet.rkey = (own if qpn == 0x22 else mr).rkey
    elif kind == "out_of_bounds":
        packet.va = region.va + region.length - 8
    elif kind == "bad_pkey":
        packet.pkey = 0x7FFF
    elif kind == "unknown_qp":
        packet.dest_qp = 0x99
    elif kind == "wrong_peer":
        src = H1 if qpn == 0x22 else SRC
    opened = open_frame(path.template.data(packet))
    payload = bytes(opened.payload)
    if kind == "bad_icrc":
        payload = payload[:-1] + bytes([payload[-1] ^ 0x40])
    elif kind == "truncated":
        payload = payload[:40]
    return payload, src, opened.sport


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(datagram, min_size=100, max_size=300))
def test_c_placement_does_what_the_python_path_does_datagram_by_datagram(datagrams):
    """Valid, duplicate, out-of-window and out-of-sequence packets, and every kind of refusal, in
    any order, CE-marked or trimmed (cut to BTH + RETH or not: a whole packet at the trimmed DSCP),
    with pumps in between: the same bytes placed, the same ACK, TRIM NACK and CNP frames, the same
    counters, drops, completions and QP state after every datagram."""
    mtu = 256
    runs = _responders(QpConfig(mtu=mtu), 64 * mtu)
    counting = CountingPlacer(runs[0][0]._place)
    runs[0][0]._place = counting
    results = []
    for responder, mr, own, buffer, other in runs:
        net = _Recording(0)
        trace = []
        for i, (qpn, offset, kind, ack_req, pump, tclass, cut) in enumerate(datagrams):
            qp = responder.qps[qpn]
            payload, src, sport = _payload(qpn, qp.epsn - qp.start_psn + offset, kind, ack_req, mr, own, mtu)
            if cut and fmt.is_trimmed(tclass):
                payload = payload[:fmt.TRIMMED_LEN]
            responder.on_datagram(payload, src, sport, 1000 * i, tclass)
            if pump:
                responder.pump(1000 * i + 500, net.send)
            trace.append((dict(responder.stats), dict(responder.drops), _state(responder)))
        responder.pump(10**12, net.send)
        results.append((trace, net.frames, bytes(buffer), bytes(other), responder.completions))
    assert results[0] == results[1]
    assert counting.placed <= runs[0][0].stats["packets_placed"]
    if datagrams[:1] and datagrams[0][1:3] == (0, "ok"):
        assert counting.placed > 0  # the C path really placed packets


def _transfer(c_path: bool, size: int, faults: dict, seed: int, config: QpConfig, imm: int | None):
    responder = Responder(DST, config, random_bits=bits(1), c_path=c_path)
    counting = None
    if responder._place is not None:
        counting = responder._place = CountingPlacer(responder._place)
    buffer = bytearray(size)
    mr = responder.register(buffer)
    responder.accept(0x22, 0x11, 12345, PATHS.back, config=config)
    responder.post_recv(0x22)  # the WRITE_WITH_IMM's receive, posted first (MRC has no RNR)
    requester = Requester(SRC, 0x11, 0x22, PATHS.forward, config, start_psn=12345, random_bits=bits(2))
    net = _Recording(seed)
    for ev, settings_ in faults.items():
        for key, value in settings_.items():
            setattr(net.fault(ev), key, value)
    data = random.Random(seed).randbytes(size)
    requester.post_write(data, mr.va, mr.rkey, imm)
    finished = net.run([requester, responder], lambda: requester.done, limit_ns=120_000_000_000)
    return (finished, net.frames, bytes(buffer) == data, responder.stats, dict(responder.drops),
            [(c.psn, c.imm, c.time_ns) for c in responder.completions], requester.summary()), counting


fault = st.fixed_dictionaries({}, optional={
    "loss": st.floats(0, 0.3), "duplicate": st.floats(0, 0.3), "reorder": st.floats(0, 0.5),
    "delay_ns": st.integers(1_000, 200_000), "ce": st.floats(0, 0.5), "trim": st.floats(0, 0.2),
    "trim_last_hop": st.booleans(),
})


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(size=st.integers(1, 150_000), faults=st.dictionaries(st.integers(0, 7), fault, max_size=8),
       seed=st.integers(0, 2**16), imm=st.sampled_from([None, 7]), go_back_n=st.booleans())
def test_transfers_are_the_same_frame_for_frame_with_and_without_the_c_placement(size, faults, seed, imm, go_back_n):
    """A whole WRITE over random loss, reordering and duplication, in virtual time: every frame
    both sides send (so every ACK and NAK), every counter and the placed bytes are the same."""
    config = QpConfig.baseline(mtu=1024, ack_timeout_exp=10, cnp=True) if go_back_n else QpConfig(mtu=1024)
    (with_c, counting), (without_c, _) = (_transfer(c, size, faults, seed, config, imm) for c in (True, False))
    assert with_c == without_c
    assert with_c[0] and with_c[2]
    if imm is None and size > 1024 and not go_back_n:
        assert counting.placed > 0  # the C path really placed packets


def test_the_c_placement_takes_the_common_case():
    """Over a clean network, every full packet but the last (which carries the immediate) is placed in C."""
    (result, counting) = _transfer(True, 100 * 1024, {}, 1, QpConfig(mtu=1024), 9)
    assert result[0] and result[2]
    assert counting.placed == 99 and result[3]["packets_placed"] == 100


@pytest.mark.parametrize("order", ["reversed", "shuffled"])
def test_long_runs_arriving_at_once_advance_alike(order):
    """PSNs 1..N arrive before PSN 0 (reversed, or shuffled), so one packet completes a run of
    hundreds: the expected PSN, the bitmap and the ACKs move alike in C and in Python."""
    mtu = 64
    psns = list(range(1, 700))
    if order == "reversed":
        psns.reverse()
    else:
        random.Random(5).shuffle(psns)
    results = []
    for responder, mr, own, buffer, _ in _responders(QpConfig(mtu=mtu), 1024 * mtu):
        net = _Recording(0)
        trace = []
        for i, offset in enumerate(psns + [0, 700, 701]):
            responder.on_datagram(*_payload(0x22, offset, "ok", i % 50 == 0, mr, own, mtu), 1000 * i)
            if i % 64 == 0:
                responder.pump(1000 * i + 1, net.send)
            trace.append(_state(responder)[0x22])
        responder.pump(10**12, net.send)
        results.append((trace, responder.stats, net.frames, bytes(buffer)))
    assert results[0] == results[1]
    assert results[0][0][-3]["epsn"] == 0xFFFFF0 + 700 and results[0][0][-1]["epsn"] == 0xFFFFF0 + 702


def test_received_reads_and_writes_as_the_python_int():
    """`received` is the Python int responder.py works with, whatever C keeps underneath."""
    responder = Responder(DST, QpConfig(mpr=2), random_bits=bits(1))
    responder.accept(0x22, 0x11, 0, PATHS.back)
    qp = responder.qps[0x22]
    assert type(qp).__name__ == "_CQp" and qp.window == 256
    for value in (0, 1, 1 << 255, (1 << 256) - 1, int.from_bytes(os.urandom(32), "big")):
        qp.received = value
        assert qp.received == value
    with pytest.raises(OverflowError):
        qp.received = 1 << 256
    with pytest.raises(ValueError):
        qp.window = 100


def test_without_the_extension_the_python_qp_is_used(monkeypatch):
    monkeypatch.setattr(responder_module, "_CQp", None)
    responder = Responder(DST, QpConfig(), random_bits=bits(1))
    responder.accept(0x22, 0x11, 0, PATHS.back)
    assert responder._place is None and type(responder.qps[0x22]).__name__ == "_PyQp"


def test_the_reorder_histogram_counts_how_far_behind_the_highest_each_packet_came():
    """PSNs 0, 1, 5, 2, 3, 4, 6 (offsets from the QP's first): 2 came 3 behind 5, 3 came 2, 4 came 1;
    the same in C and in Python, and the responder's summary reads it."""
    got = []
    for responder, mr, own, _, _ in _responders(QpConfig(mtu=1024), 64 * 1024):
        for offset in (0, 1, 5, 2, 3, 4, 6):
            payload, src, sport = _payload(0x22, offset, "ok", False, mr, own, 1024)
            responder.on_datagram(payload, src, sport, now=1_000, tclass=fmt.TCLASS_DATA)
        got.append(responder.reorder())
    assert got[0] == got[1]
    hist = got[0]["hist"]
    assert hist[:3] == [4, 1, 2] and sum(hist) == got[0]["packets"] == 7  # 0 late: 0 1 5 6; 1: 4; 2-3: 3 and 2
    assert (got[0]["p50"], got[0]["p99"], got[0]["max"]) == (0, 3, 3)
