"""EV state lives in the api EV profile: the QPs bound to one profile share what one of them learned,
the controller's MODIFY_EV_STATE reaches them all, a DENIED EV never carries data (first sends,
retransmissions, probes), ev_min_active is the profile's across its QPs, and the EV events posted to
the host's queue respect the profile's mask. No root: the in-memory network, two QPs of one host."""

from __future__ import annotations

import os
import random
import socket

import pytest

from mrc_emu.api.events import EvEventQueue, EvState
from mrc_emu.api.evops import EvOp, EvOpEntry, ev_op
from mrc_emu.api.formats import EvFormatMode, EvFormatProfile, ProfileState
from mrc_emu.api.profiles import EvEventMask, EvField, EvProfileMode
from mrc_emu.api.profiles import EvProfile as ApiEvProfile
from mrc_emu.io.memory import MemoryNetwork
from mrc_emu.topology import builtin
from mrc_emu.transport.config import QpConfig
from mrc_emu.transport.multipath import evshare
from mrc_emu.transport.multipath.ev import EvProfile
from mrc_emu.transport.multipath.paths import qp_paths
from mrc_emu.transport.mux import HostMux
from mrc_emu.transport.requester import Requester
from mrc_emu.transport.responder import Responder
from mrc_emu.wire.decoder import decode_frame
from mrc_emu.wire.format import ProbePacket

PATHS = qp_paths(builtin(), "h0", "h2")
SRC = socket.inet_pton(socket.AF_INET6, PATHS.src_address)
DST = socket.inet_pton(socket.AF_INET6, PATHS.dst_address)
BOTH = EvEventMask.GOOD | EvEventMask.ASSUMED_BAD
QPS = ((0x11, 0x22), (0x13, 0x24))  # (requester QPN, responder QPN) of the host's two QPs


def value(ev: int) -> bytes:
    """EV `ev`'s value in the profile: its UDP source port (a UDP-format EXP profile, as a controller fills it)."""
    return PATHS.evs[ev].udp_sport.to_bytes(2, "big")


def slot(ev: int) -> dict:
    return {"ev": value(ev), "port": PATHS.evs[ev].plane + 1}


def api_profile(ev_min_active: int = 1, mask: int = BOTH, profile_id: int = 7) -> ApiEvProfile:
    """The host's EXP profile over the 8 EVs h0 -> h2 (slot i = EV i, port = its plane + 1), ONLINE."""
    fmt = EvFormatProfile(1)
    fmt.modify(state=ProfileState.OFFLINE, mode=EvFormatMode.UDP, fields=[16])
    fmt.modify(state=ProfileState.ONLINE)
    profile = ApiEvProfile(profile_id)
    profile.modify(state=ProfileState.OFFLINE, mode=EvProfileMode.EXP, fmt=fmt, ev_count=len(PATHS.evs),
                   fields=[EvField(16)])
    ev_op(profile, EvOp.REPLACE_EV, [EvOpEntry(ev_new=value(ev.index), port_new=ev.plane + 1, state=EvState.GOOD)
                                     for ev in PATHS.evs])
    profile.modify(state=ProfileState.ONLINE, ev_min_active=ev_min_active, ev_event_mask=mask)
    return profile


class Host:
    """The host's QPs behind its one address, as its mux serves them; every frame they send is logged
    as (time, QPN, EV, legs: 1 data, 2 probe)."""

    def __init__(self, qps: list[Requester]) -> None:
        self.address = SRC
        self.qps = qps
        self.mux = HostMux(SRC)
        for qp in qps:
            self.mux.add(qp.qpn, qp)
        self.frames: list[tuple[int, int, int, int]] = []

    def on_datagram(self, payload, src, sport, now, tclass=0, port=0) -> None:
        qp = self.mux.route(payload)
        if qp is not None:
            qp.on_datagram(payload, src, sport, now, tclass, port)

    def pump(self, now, send, clock=None, horizon=None) -> None:
        for qp in self.qps:
            def logged(frame, path, qpn=qp.qpn):
                self.frames.append((now, qpn, path.ev, 2 if isinstance(decode_frame(bytes(frame)).packet, ProbePacket) else 1))
                return send(frame, path)
            qp.pump(now, logged, clock, horizon)

    def next_wakeup(self):
        wakes = [w for w in (qp.next_wakeup() for qp in self.qps) if w is not None]
        return min(wakes) if wakes else None


def setup(size: int, profile: ApiEvProfile, events: EvEventQueue | None = None, config: QpConfig | None = None,
          evs: list[int] | None = None, qps: int = 2):
    """`qps` QPs of h0 bound to `profile` (over `evs`, default all), each writing its own region of h2's responder."""
    config = config or QpConfig(mtu=1024)
    forward = {k: PATHS.forward[k] for k in (range(len(PATHS.evs)) if evs is None else evs)}
    responder = Responder(DST, config, random_bits=random.Random(1).getrandbits)
    requesters, regions = [], []
    for k, (qpn, peer) in enumerate(QPS[:qps]):
        buffer = bytearray(size)
        mr = responder.register(buffer, va=0x1000_0000 * (k + 1), pd=k + 1)
        responder.accept(peer, qpn, 0, PATHS.back, peer=SRC, pd=k + 1)
        requesters.append(Requester(SRC, qpn, peer, forward, config,
                                    random_bits=random.Random(2 + k).getrandbits, ev_profile=profile, ev_events=events))
        regions.append((mr, buffer, os.urandom(size)))
    return Host(requesters), responder, requesters, regions


def slow_evs(net: MemoryNetwork) -> None:
    for k in range(len(PATHS.evs)):
        net.fault(k).delay_ns = 50_000
        net.fault(k).rate_bps = 10e9


def test_one_qp_learns_an_ev_is_bad_and_the_other_never_sends_on_it_then_one_probe_revives_it_for_both():
    profile, queue = api_profile(mask=EvEventMask.ASSUMED_BAD), EvEventQueue()
    host, responder, (a, b), regions = setup(2_000_000, profile, queue)
    net = MemoryNetwork(3)
    slow_evs(net)
    net.fault(2).dead = True
    (mr_a, buf_a, data_a), (mr_b, buf_b, data_b) = regions
    a.post_write(data_a, mr_a.va, mr_a.rkey)
    assert net.run([host, responder], lambda: profile.ev_states[2] is EvState.ASSUMED_BAD)
    assert a.profile.evs[2].state is EvState.ASSUMED_BAD and a.profile.evs[2].packets_lost >= 3
    b.post_write(data_b, mr_b.va, mr_b.rkey)  # B has sent nothing yet: the EV is bad for it already
    assert net.run([host, responder], lambda: a.done and b.done)
    assert a.error is None is b.error and buf_a == data_a and buf_b == data_b
    stats_b = b.profile.evs[2]
    assert stats_b.state is EvState.ASSUMED_BAD and stats_b.packets_sent == stats_b.packets_lost == 0
    assert not [f for f in host.frames if f[1] == b.qpn and f[2] == 2 and f[3] == 1]  # no data frame of B on it
    learned = [e for e in b.ev_events if e.ev == 2]
    assert learned[0].new is EvState.ASSUMED_BAD and learned[0].reason == "learned by another QP"
    # healed: whichever QP's probe comes back first revives the EV for both, and B sprays on it again
    net.fault(2).dead = False
    assert net.run([host, responder], lambda: profile.ev_states[2] is EvState.GOOD, limit_ns=net.now + 200_000_000)
    assert a.profile.evs[2].state is EvState.GOOD is b.profile.evs[2].state
    revived = [e for qp in (a, b) for e in qp.ev_events if e.ev == 2 and e.new is EvState.GOOD]
    assert sorted(e.reason for e in revived) == ["learned by another QP", "probe returned"]
    data_b = os.urandom(len(buf_b))
    b.post_write(data_b, mr_b.va, mr_b.rkey)
    assert net.run([host, responder], lambda: b.done) and buf_b == data_b and b.profile.evs[2].packets_sent > 0
    # one change of the profile, one event, whatever QP made it; GOOD is masked out
    assert [(e.profile_id, e.ev, e.port, e.state) for e in queue.poll(10)] == [
        (7, value(2).ljust(32, b"\0"), PATHS.evs[2].plane + 1, EvState.ASSUMED_BAD)]


def test_the_controller_denies_evs_mid_transfer_and_no_qp_sends_on_them_until_they_are_allowed():
    """EV 3 DENIED by MODIFY_EV_STATE, EV 5 by one QP's `deny` helper (through the profile): neither QP sends
    a first transmission, a retransmission (every EV loses 2 %) or a probe on them, until EV 3 is allowed
    GOOD (used at once) and EV 5 ASSUMED_BAD (probed first, then used)."""
    profile, queue = api_profile(), EvEventQueue(256)
    size = 3_000_000
    host, responder, (a, b), regions = setup(size, profile, queue)
    net = MemoryNetwork(5)
    slow_evs(net)
    for k in range(len(PATHS.evs)):
        net.fault(k).loss = 0.02
    for qp, (mr, _, data) in zip((a, b), regions):
        qp.post_write(data, mr.va, mr.rkey)
    assert net.run([host, responder], lambda: a.bytes_acked > size // 4)
    ev_op(profile, EvOp.MODIFY_EV_STATE, [EvOpEntry(**slot(3), state=EvState.DENIED)], events=queue)
    a.profile.deny(5, net.now)
    frames_before = len(host.frames)
    sent_before = {(qp.qpn, ev): qp.profile.evs[ev].packets_sent for qp in (a, b) for ev in (3, 5)}
    retx_before = a.retransmits + b.retransmits
    assert net.run([host, responder], lambda: a.bytes_acked > 3 * size // 4 and b.bytes_acked > 3 * size // 4)
    during = host.frames[frames_before:]
    assert during and not [f for f in during if f[2] in (3, 5)]  # no data, no probe
    assert {(qp.qpn, ev): qp.profile.evs[ev].packets_sent for qp in (a, b) for ev in (3, 5)} == sent_before
    assert a.retransmits + b.retransmits > retx_before  # retransmissions there were, elsewhere
    for qp in (a, b):
        assert qp.profile.evs[3].state is EvState.DENIED is qp.profile.evs[5].state
    assert [e.reason for e in b.ev_events if e.new is EvState.DENIED] == ["set by the controller"] * 2
    assert {e.reason for e in a.ev_events if e.new is EvState.DENIED} == {"set by the controller", "denied by controller"}
    allowed_at = len(host.frames)
    ev_op(profile, EvOp.MODIFY_EV_STATE, [EvOpEntry(**slot(3), state=EvState.GOOD)], events=queue)
    b.profile.allow(5, net.now)  # ASSUMED_BAD: probed before it carries data again
    assert profile.ev_states[5] is EvState.ASSUMED_BAD
    assert net.run([host, responder], lambda: a.done and b.done)
    assert a.error is None is b.error
    assert all(buffer == data for _, buffer, data in regions)
    assert net.run([host, responder], lambda: profile.ev_states[5] is EvState.GOOD, limit_ns=net.now + 200_000_000)
    (mr, buffer, _) = regions[1]
    data = os.urandom(len(buffer))
    b.post_write(data, mr.va, mr.rkey)  # EV 5 GOOD again (its probe came back): it carries data
    assert net.run([host, responder], lambda: b.done) and buffer == data
    after = host.frames[allowed_at:]
    first_data_on_5 = min(t for t, _, ev, legs in after if ev == 5 and legs == 1)
    assert min(t for t, _, ev, legs in after if ev == 5 and legs == 2) < first_data_on_5  # probed first
    assert any(ev == 3 and legs == 1 for _, _, ev, legs in after)
    states = [e.state for e in queue.poll(256)]
    assert EvState.DENIED not in states and EvState.GOOD in states  # DENIED is never an event; GOOD again is


def test_ev_min_active_is_the_profiles_across_its_qps():
    """Profile ev_min_active 7 of 8, EVs 2 and 5 dead: one of them goes ASSUMED_BAD (whichever QP saw it
    first), the other stays GOOD for both QPs however many losses either sees, and the transfers verify."""
    profile = api_profile(ev_min_active=7)
    host, responder, (a, b), regions = setup(1_500_000, profile)
    net = MemoryNetwork(7)
    slow_evs(net)
    net.fault(2).dead = net.fault(5).dead = True
    for qp, (mr, _, data) in zip((a, b), regions):
        qp.post_write(data, mr.va, mr.rkey)
    fewest = []

    def done() -> bool:
        fewest.append(sum(s is EvState.GOOD for s in profile.ev_states))
        return a.done and b.done

    assert net.run([host, responder], done)
    assert a.error is None is b.error and all(buffer == data for _, buffer, data in regions)
    assert min(fewest) == 7
    assert sorted(profile.ev_states[k] for k in (2, 5)) == [EvState.GOOD, EvState.ASSUMED_BAD]
    for qp in (a, b):
        assert [qp.profile.evs[k].state for k in range(8)] == list(profile.ev_states)
    assert a.profile.evs[2].packets_lost + a.profile.evs[5].packets_lost + b.profile.evs[2].packets_lost > 6


def test_two_profiles_bound_to_one_api_profile_share_states_and_read_it_only_when_it_changed(monkeypatch):
    shared = api_profile(ev_min_active=2)
    a, b = EvProfile([0, 1, 2], shared=shared), EvProfile([1, 2, 3], shared=shared)
    for _ in range(3):
        a.on_lost(1, 10, "test")
    assert shared.ev_states[1] is EvState.ASSUMED_BAD and 1 not in b.good()
    assert [(e.ev, e.new, e.reason, e.time_ns) for e in b.events] == [(1, EvState.ASSUMED_BAD, "learned by another QP", 0)]
    b.on_probe(1, 20, 5_000)
    assert a.good() == [0, 1, 2] and a.events[-1].reason == "learned by another QP"
    ev_op(shared, EvOp.MODIFY_EV_STATE, [EvOpEntry(**slot(k), state=EvState.DENIED) for k in (1, 2, 3)])
    assert b.stalled and not a.stalled and set(a.schedule_at()[0]) == {0}
    reads = []
    real = evshare.SharedStates.states
    monkeypatch.setattr(evshare.SharedStates, "states", lambda self: reads.append(1) or real(self))
    assert {a.pick() for _ in range(1000)} == {0} and reads == []  # no change: one integer compared per pick
    a.allow(2, 30)
    assert reads and not b.stalled and b.evs[2].state is EvState.ASSUMED_BAD  # `stalled` took the change in
    assert b.events[-1].reason == "set by the controller" and a.events[-1].reason == "allowed by controller; probe before use"
    # the device never lifts DENIED, nor takes a GOOD EV below ev_min_active (GOOD now: 0, 4, 5, 6, 7)
    assert not b.set_state(3, EvState.GOOD, 40, "test") and shared.ev_states[3] is EvState.DENIED
    for k in (4, 5, 6):
        EvProfile([0, 4, 5, 6, 7], shared=shared).set_state(k, EvState.ASSUMED_BAD, 50, "test")
    assert sum(s is EvState.GOOD for s in shared.ev_states) == 2


def test_a_private_profile_behaves_as_the_qps_own_and_a_bound_one_must_fit():
    profile = EvProfile([1, 2, 4], ev_min_active=5)
    assert profile.ev_min_active == 3 and profile.api.state is ProfileState.ONLINE
    assert [EvState(s).name for s in profile.api.ev_states] == ["DENIED", "GOOD", "GOOD", "DENIED", "GOOD"]
    assert profile.events == [] and not profile.stalled
    with pytest.raises(ValueError, match="has 8 EVs; the QP's paths name EVs"):
        EvProfile([0, 8], shared=api_profile())
    offline = api_profile()
    offline.modify(state=ProfileState.OFFLINE)
    with pytest.raises(ValueError, match="is OFFLINE: a QP takes an ONLINE profile"):
        EvProfile([0], shared=offline)


@pytest.mark.parametrize("recovery", ["go-back-N", "trim"])
def test_a_denied_ev_carries_neither_a_go_back_n_rewind_nor_a_trimmed_packets_resend(recovery):
    """The other ways a packet is sent again take their EV from the same schedule: a go-back-N rewind
    (sequence NAKs and ACK timeouts, EV 0 losing 5 %) and the resend of a packet trimmed by the fabric."""
    profile = api_profile()
    if recovery == "go-back-N":
        config, evs = QpConfig.baseline(mtu=1024, ack_timeout_exp=10), [0, 1, 2]
    else:
        config, evs = QpConfig(mtu=1024), list(range(8))
    size = 1_500_000
    host, responder, (a,), regions = setup(size, profile, config=config, evs=evs, qps=1)
    net = MemoryNetwork(11)
    if recovery == "go-back-N":
        net.fault(0).loss = 0.05
    else:
        for k in evs:
            net.fault(k).trim = 0.05
    mr, buffer, data = regions[0]
    a.post_write(data, mr.va, mr.rkey)
    assert net.run([host, responder], lambda: a.bytes_acked > size // 4)
    ev_op(profile, EvOp.MODIFY_EV_STATE, [EvOpEntry(**slot(1), state=EvState.DENIED)])
    before, resent = len(host.frames), a.retransmits
    assert net.run([host, responder], lambda: a.done) and a.error is None and buffer == data
    assert a.retransmits > resent and not [f for f in host.frames[before:] if f[2] == 1]
    assert a.profile.evs[1].state is EvState.DENIED
