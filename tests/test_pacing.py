"""A rate-based CC profile paces the requester: over the in-memory network, a DCQCN QP delivers
at its rate, a CNP slows it, and next_wakeup says when the next packet may go."""

from __future__ import annotations

import os
import random
import socket

import pytest

from mrc_emu.io.memory import MemoryNetwork
from mrc_emu.topology import builtin
from mrc_emu.transport.cc.registry import make_cc
from mrc_emu.transport.config import QpConfig
from mrc_emu.transport.multipath.paths import qp_paths
from mrc_emu.transport.requester import Requester
from mrc_emu.transport.responder import Responder

MS = 1_000_000
MTU = 1024
PATHS = qp_paths(builtin(), "h0", "h2")


def paced_pair(rate_bps: float, size: int, c_loop: bool, profile: str = "dcqcn", **params):
    """A responder with a region of `size` bytes, and a requester (CC `profile`, on a line of
    `rate_bps`) with a WRITE of it posted."""
    config = QpConfig(mtu=MTU)
    responder = Responder(socket.inet_pton(socket.AF_INET6, PATHS.dst_address), config,
                          random_bits=random.Random(1).getrandbits)
    buffer = bytearray(size)
    mr = responder.register(buffer)
    responder.accept(0x22, 0x11, 0, PATHS.back)
    requester = Requester(socket.inet_pton(socket.AF_INET6, PATHS.src_address), 0x11, 0x22, PATHS.forward,
                          config, make_cc(profile, MTU, rate_bps, **params), c_loop=c_loop,
                          random_bits=random.Random(2).getrandbits)
    data = os.urandom(size)
    requester.post_write(data, mr.va, mr.rkey)
    return requester, responder, data, buffer


def wire_rate(requester: Requester, acked: int, elapsed_ns: int) -> float:
    """Bit/s on the wire for `acked` payload bytes (every packet full) over `elapsed_ns`."""
    return acked * (MTU + requester._frame_overhead) / MTU * 8e9 / elapsed_ns


@pytest.mark.parametrize("c_loop", [True, False], ids=["c-loop", "python-loop"])
def test_a_dcqcn_qp_delivers_at_its_rate(c_loop):
    rate = 100e6
    requester, responder, data, buffer = paced_pair(rate, 2_000_000, c_loop)
    net = MemoryNetwork(0)
    assert net.run([requester, responder], lambda: requester.done)
    assert buffer == data and requester.error is None
    # the first bucket's packet or two go at once, the ACK of the last one takes an RTT (20 us)
    assert wire_rate(requester, len(data), net.now) == pytest.approx(rate, rel=0.03)


def test_a_cnp_slows_the_qp_until_the_rate_climbs_back():
    rate = 100e6
    requester, responder, data, buffer = paced_pair(rate, 4_000_000, True, increase_timer_ns=20 * MS)
    net = MemoryNetwork(0)
    endpoints = [requester, responder]
    assert net.run(endpoints, lambda: requester.bytes_acked >= 1_000_000)
    t0, acked0 = net.now, requester.bytes_acked
    assert net.run(endpoints, lambda: net.now >= t0 + 10 * MS)
    before = wire_rate(requester, requester.bytes_acked - acked0, net.now - t0)
    requester.cc.on_cnp(net.now)  # as the responder's CNP would (for a CE-marked arrival)
    t1, acked1 = net.now, requester.bytes_acked
    assert net.run(endpoints, lambda: net.now >= t1 + 10 * MS)  # within the 20 ms before the first increase
    after = wire_rate(requester, requester.bytes_acked - acked1, net.now - t1)
    assert before == pytest.approx(rate, rel=0.03) and after == pytest.approx(rate / 2, rel=0.05)
    assert net.run(endpoints, lambda: requester.done)
    assert buffer == data and requester.cc.rc > rate / 2


def test_next_wakeup_is_when_the_bucket_allows_the_next_packet():
    rate = 100e6
    requester, responder, data, buffer = paced_pair(rate, 200_000, True)
    sent = []
    requester.pump(0, lambda frame, path: sent.append(len(frame)) or True)
    assert 1 <= len(sent) <= 2  # the bucket: the packet at zero tokens and at most one more
    wake = requester.next_wakeup()
    per_packet = (MTU + requester._frame_overhead) * 8e9 / rate
    assert 0 < wake <= 2 * per_packet + 1
    requester.pump(wake - 1, lambda frame, path: sent.append(len(frame)) or True)
    count = len(sent)
    requester.pump(wake, lambda frame, path: sent.append(len(frame)) or True)
    assert len(sent) == count + 1
    assert max(sent) == MTU + requester._frame_overhead  # the bucket counts wire bytes as they are


def test_a_window_only_profile_is_not_paced():
    requester, responder, data, buffer = paced_pair(100e6, 200_000, True, "nscc", base_rtt_ns=20_000, max_cwnd=1 << 20)
    sent = []
    requester.pump(0, lambda frame, path: sent.append(frame) or True)
    assert len(sent) == requester.config.burst and requester.next_wakeup() == 0


def test_a_go_back_n_rewind_resends_one_window_at_the_paced_rate():
    """The baseline QP (go-back-N, DCQCN on a line of known rate and base RTT) has one BDP in
    flight; its ACK timeout rewinds, and the rewind resends that window, no more, through the
    same pacing bucket as first transmissions."""
    rate, base_rtt = 100e6, 1 * MS
    config = QpConfig.baseline(mtu=MTU, link_rate_bps=rate, base_rtt_ns=base_rtt)
    cc = make_cc("dcqcn", MTU, rate, base_rtt)
    assert cc.cwnd == rate * base_rtt / 8e9  # one BDP: 12,500 bytes
    requester = Requester(socket.inet_pton(socket.AF_INET6, PATHS.src_address), 0x11, 0x22, {0: PATHS.forward[0]},
                          config, cc, random_bits=random.Random(2).getrandbits)
    requester.post_write(os.urandom(200_000), 0x1000_0000, 0x1234)
    sends: list[int] = []  # send times
    now = 0

    def send(frame, path) -> bool:
        sends.append(now)
        return True

    def run_until(stop: int) -> None:
        nonlocal now
        while now < stop:
            requester.pump(now, send)
            now = requester.next_wakeup()

    run_until(5 * MS)  # no ACK ever comes: the window fills, then the QP waits for its ACK timeout
    window = len(sends)
    assert window == int(cc.cwnd) // MTU and now >= config.ack_timeout_ns  # as many whole packets as the window holds
    per_packet = (MTU + requester._frame_overhead) * 8e9 / rate
    assert sends[-1] >= (window - 2) * per_packet  # paced: the bucket lets two go at once, no more
    first = sends[-1]
    run_until(now + 5 * MS)  # the timeout rewinds: everything from the oldest unacknowledged PSN again
    resent = [t for t in sends if t > first]
    assert requester.recovery.timeouts == 1 and requester.retransmits == len(resent) == window
    assert resent[-1] - resent[0] >= (window - 2) * per_packet
