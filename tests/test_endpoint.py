"""EV probes answered by the destination's MRC endpoint, and PORT_STATUS_UPDATE, over the in-memory network."""

from __future__ import annotations

import os
import random
import socket

import pytest

from mrc_emu.io.memory import MemoryHost, MemoryNetwork
from mrc_emu.topology import addressing as ad
from mrc_emu.topology import builtin
from mrc_emu.transport.config import QpConfig
from mrc_emu.transport.endpoint import EpRequest, HostEndpoint, ProbeAnswers
from mrc_emu.transport.multipath.ev import EvState
from mrc_emu.transport.multipath.paths import qp_paths
from mrc_emu.transport.multipath.portstatus import PortStatus, all_ports
from mrc_emu.transport.mux import HostMux
from mrc_emu.transport.requester import Requester
from mrc_emu.transport.responder import Responder
from mrc_emu.wire import format as fmt
from mrc_emu.wire.decoder import decode_frame

TOPO = builtin()
PATHS = qp_paths(TOPO, "h0", "h2")
SRC = socket.inet_pton(socket.AF_INET6, PATHS.src_address)
DST = socket.inet_pton(socket.AF_INET6, PATHS.dst_address)
NAMES = {socket.inet_pton(socket.AF_INET6, ad.host_address(TOPO, h)): h for h in ("h0", "h1", "h2", "h3")}
PORTS = TOPO.planes


def bits(seed: int):
    return random.Random(seed).getrandbits


def paths_to(me: str):
    cache = {}

    def paths(peer: bytes):
        if peer not in cache:
            cache[peer] = qp_paths(TOPO, me, NAMES[peer]).forward if peer in NAMES else {}
        return cache[peer]
    return paths


def hosts(size: int, config: QpConfig | None = None):
    """h0 (a requester and its endpoint) writing to h2 (a responder and its endpoint)."""
    config = config or QpConfig(mtu=1024)
    muxes = {}
    for name, address in (("h0", SRC), ("h2", DST)):
        mux = HostMux(address)
        mux.serve(HostEndpoint(address, mux, paths_to(name), PORTS))
        muxes[name] = mux
    responder = Responder(DST, config, random_bits=bits(1))
    buffer = bytearray(size)
    mr = responder.register(buffer)
    responder.accept(0x22, 0x11, 0, PATHS.back, peer=SRC)
    muxes["h2"].add(0x22, responder)
    requester = Requester(SRC, 0x11, 0x22, PATHS.forward, config, random_bits=bits(2), probe_budget=muxes["h0"].probe_budget)
    muxes["h0"].add(0x11, requester)
    data = os.urandom(size)
    requester.post_write(data, mr.va, mr.rkey)
    return muxes, requester, responder, buffer, data


def recording(net: MemoryNetwork):
    """Every frame sent: (time, sender's address, EV, plane, decoded packet)."""
    log = []
    carry = net.send

    def send(frame, path):
        got = decode_frame(bytes(frame))
        log.append((net.now, path.template.ends.src, path.ev, path.plane, getattr(got, "packet", None)))
        return carry(frame, path)

    net.send = send
    return log


def test_an_assumed_bad_ev_is_revived_by_its_responders_answer():
    """The probe goes along the EV's own forward path to the responder's QP; the responder answers
    along that EV's back path, naming the port of the EV's plane; the EV is GOOD again."""
    muxes, requester, responder, buffer, data = hosts(300_000)
    ev = 5
    requester.profile.set_state(ev, EvState.ASSUMED_BAD, 0, "test")
    net = MemoryNetwork(0)
    log = recording(net)
    ends = [MemoryHost(muxes["h0"]), MemoryHost(muxes["h2"])]
    assert net.run(ends, lambda: requester.done)
    assert buffer == data
    probes = [(t, src, e, p) for t, src, e, p, pkt in log if isinstance(pkt, fmt.ProbePacket)]
    answers = [(t, src, e, pkt) for t, src, e, _, pkt in log if isinstance(pkt, fmt.ProbeResponsePacket)]
    assert probes and probes[0][1:] == (PATHS.src_address, ev, PATHS.forward[ev].plane)
    assert answers and answers[0][1:3] == (PATHS.dst_address, ev)  # from the responder, on the EV's back path
    assert answers[0][3].dest_qp == 0x11 and answers[0][3].port == PATHS.forward[ev].plane + 1
    assert requester.profile.evs[ev].state is EvState.GOOD
    revived = [e for e in requester.ev_events if e.ev == ev and e.new is EvState.GOOD]
    assert revived and revived[0].reason == "probe returned" and revived[0].rtt_ns == 2 * net.fault(ev).delay_ns
    assert requester.prober.answers[ev].port == PATHS.forward[ev].plane + 1
    assert requester.summary()["probe_answers"][ev]["rtt_ns"] == 2 * net.fault(ev).delay_ns
    assert responder.answers.answered >= 1


def test_probe_answers_time_their_service_and_refuse_strangers():
    answers = ProbeAnswers()
    probe = fmt.ProbePacket(0x22, 7, 3, 1_000)
    answers.take(probe, SRC, 2, now=5_000)
    sent = []
    clock = iter([12_345]).__next__
    answers.flush(6_000, lambda frame, path: sent.append(frame) or True, clock,
                  lambda p, src: (PATHS.back[p.ev], 0x11, fmt.DEFAULT_PKEY))
    (frame,) = sent
    rsp = decode_frame(frame).packet
    assert rsp == fmt.ProbeResponsePacket(0x11, 7, 3, 1_000, 2, 12_345 - 5_000)
    answers.take(probe, SRC, 2, now=5_000)
    answers.flush(6_000, lambda frame, path: sent.append(frame) or True, None, lambda p, src: None)
    assert answers.dropped == 1 and len(sent) == 1


def _deliver(endpoint, frame: bytes, src: bytes, port: int = 0) -> None:
    from mrc_emu.wire.decoder import open_frame
    opened = open_frame(frame)
    endpoint.on_datagram(bytes(opened.payload), src, opened.sport, 0, opened.tclass, port)


def test_a_responder_answers_only_its_own_qps_probes():
    responder = Responder(DST, random_bits=bits(1))
    responder.accept(0x22, 0x11, 0, PATHS.back, peer=SRC)
    other = qp_paths(TOPO, "h1", "h2").forward[3]  # another host's probe of the same QP
    h1 = socket.inet_pton(socket.AF_INET6, other.template.ends.src)
    for path, dest_qp, src, ev in ((PATHS.forward[3], 0x23, SRC, 3), (other, 0x22, h1, 3), (PATHS.forward[3], 0x22, SRC, 99)):
        _deliver(responder, path.template.encode(fmt.ProbePacket(dest_qp, 1, ev, 0)), src)
    assert responder.drops["unknown_probe"] == 3 and not responder.answers.due
    _deliver(responder, PATHS.forward[3].template.encode(fmt.ProbePacket(0x22, 1, 3, 0)), SRC, port=2)
    assert responder.answers.due and responder.next_wakeup() is not None


def test_controller_ev_probe_batch_is_answered_by_the_peer_endpoint():
    """EV_PROBE from h0's controller: one response per request, the arrival port 1-based, the RTT
    and the RTT less the peer's service time."""
    muxes, requester, _, _, _ = hosts(1024)
    requester.active.clear()  # no transfer: only the endpoints talk
    requester.queue.clear()
    endpoint = muxes["h0"].endpoint
    requests = [EpRequest(k, DST, ev) for k, ev in enumerate(range(len(PATHS.forward)))]
    endpoint.ev_probe(requests)
    with pytest.raises(ValueError, match="outstanding"):
        endpoint.ev_probe([EpRequest(0, DST, 1)])
    with pytest.raises(ValueError, match="no EV 99"):
        endpoint.ev_probe([EpRequest(100, DST, 99)])
    net = MemoryNetwork(0)
    net.fault(2).delay_ns = 30_000
    got = []
    assert net.run([MemoryHost(muxes["h0"]), MemoryHost(muxes["h2"])],
                   lambda: got.extend(endpoint.take_responses()) or len(got) == len(requests))
    assert [r.req_id for r in sorted(got, key=lambda r: r.req_id)] == [r.req_id for r in requests]
    for r in got:
        ev = requests[r.req_id].ev
        assert r.port == PATHS.forward[ev].plane + 1
        assert r.rtt_raw == 2 * net.fault(ev).delay_ns and r.rtt == r.rtt_raw - r.service_ns and r.adj_svc_time == 1
    assert muxes["h2"].endpoint.answers.answered == len(requests)
    assert endpoint.take_responses() == []  # not buffered between calls


def test_a_probe_of_an_ev_value_goes_out_on_that_value_and_is_answered():
    """EV_PROBE of a value no QP uses (OCP's req_ev): h0's endpoint sends it with the value's outer
    destination (here p0s2's short carrier, with its SRH segment left to the destination's
    decapsulation address) and EV VALUE_PROBE_EV; h2's endpoint answers along its first usable
    path; the response is the header's: the RTT corrected for h2's service time, flag 1."""
    import ipaddress

    from mrc_emu.api.formats import EvFormatMode
    from mrc_emu.topology.evs import udp_sport
    from mrc_emu.transport.endpoint import VALUE_PROBE_EV
    from mrc_emu.transport.multipath.evvalues import value_paths
    from mrc_emu.wire.decoder import open_frame

    muxes = {}
    for name, address in (("h0", SRC), ("h2", DST)):
        muxes[name] = HostMux(address)
        muxes[name].serve(HostEndpoint(address, muxes[name], paths_to(name), PORTS))
    carrier = ad.usid_carrier([TOPO.node("p0s2").node_id, TOPO.node("h2").node_id], ad.USID_DECAP_FUNCTION)
    value = ipaddress.IPv6Address(carrier).packed
    path = value_paths(TOPO, "h0", "h2", EvFormatMode.SRV6).path(VALUE_PROBE_EV, value, 1, udp_sport(0))
    endpoint = muxes["h0"].endpoint
    endpoint.ev_probe([EpRequest(7, DST, VALUE_PROBE_EV, path)])
    out, back = [], []
    endpoint.pump(1_000, lambda frame, p: out.append((bytes(frame), p)) or True)
    (frame, sent_on), = out
    assert frame[24:40] == value and sent_on is path and sent_on.first_hop == carrier
    assert frame[48:64] == ipaddress.IPv6Address(ad.decap_sid(TOPO.node("h2").node_id)).packed
    _deliver(muxes["h2"].endpoint, frame, SRC, port=1)
    muxes["h2"].endpoint.pump(5_000, lambda f, p: back.append((bytes(f), p)) or True)
    (answer, way), = back
    assert way.template.ends.dst == PATHS.src_address  # back to h0 along one of h2's paths
    opened = open_frame(answer)
    endpoint.on_datagram(bytes(opened.payload), DST, opened.sport, 21_000, opened.tclass, 1)
    (rsp,) = endpoint.take_responses()
    assert (rsp.req_id, rsp.port, rsp.adj_svc_time, rsp.rtt_raw) == (7, 1, 1, 20_000)
    assert rsp.rtt == rsp.rtt_raw - rsp.service_ns < rsp.rtt_raw


def test_port_status_masks():
    status = PortStatus(2)
    assert status.local == all_ports(2) == 0b110 and status.all_up
    plane0 = PATHS.forward[0]
    assert plane0.plane == 0 and status.usable(DST, plane0)
    assert status.set_local(0b100) and not status.usable(DST, plane0) and not status.set_local(0b100)
    status.set_local(0b110)
    assert status.set_peer(DST, 0b100) and not status.usable(DST, plane0) and status.usable(SRC, plane0)
    assert status.blocked(DST, PATHS.forward) == {ev for ev, p in PATHS.forward.items() if p.plane == 0}
    with pytest.raises(ValueError):
        PortStatus(0)


def _run_with_port_change(who: str, size: int = 8_000_000):
    """A transfer h0 -> h2; at 30 % host `who` disables its port 1 (plane 0), at 70 % enables it."""
    muxes, requester, responder, buffer, data = hosts(size)
    net = MemoryNetwork(0)
    log = recording(net)
    ends = [MemoryHost(muxes["h0"]), MemoryHost(muxes["h2"])]
    endpoint = muxes[who].endpoint
    assert net.run(ends, lambda: requester.bytes_acked >= 0.3 * size)
    off = len(log)  # log positions: several frames may leave at one virtual time
    endpoint.set_port_status(0b100, net.now)
    assert net.run(ends, lambda: requester.bytes_acked >= 0.7 * size)
    on = len(log)
    endpoint.set_port_status(0b110, net.now)
    assert net.run(ends, lambda: requester.done)
    assert requester.error is None and buffer == data
    return muxes, requester, responder, log, off, on


def _data(log, since, until, plane):
    return [e for t, src, e, p, pkt in log[since:until] if p == plane and isinstance(pkt, fmt.DataPacket)]


def test_a_port_disabled_here_mid_transfer_carries_nothing_more():
    """h0 disables its port 1: at once, its requester sends nothing on plane 0 (no data, no
    retransmission, no probe) and h2's ACKs stop coming back that way once it has heard the
    update; zero retransmissions; re-enabling brings plane 0 back."""
    muxes, requester, responder, log, off, on = _run_with_port_change("h0")
    during = [(i, x) for i, x in enumerate(log) if off <= i < on and x[3] == 0]
    assert not [x for i, x in during if x[1] == PATHS.src_address], "h0 sent on its disabled port"
    heard = min(i for i, x in enumerate(log) if isinstance(x[4], fmt.PortStatusPacket) and x[4].ack)
    assert not [x for i, x in during if x[1] == PATHS.dst_address and i >= heard], "h2 answered towards the disabled port"
    assert _data(log, 0, off, 0)  # plane 0 was in use before
    assert requester.retransmits == 0 and requester.summary()["timeouts"] == 0
    assert _data(log, on, len(log), 0), "plane 0 carried nothing after the port came back"
    assert muxes["h2"].endpoint.updates_heard == 2 and not muxes["h0"].endpoint._updates  # both acknowledged


def test_a_port_disabled_at_the_peer_is_avoided_once_heard():
    """h2 disables its port 1: h2's ACKs leave by port 2 at once; h0's requester stops sending
    data on plane 0 once the PORT_STATUS_UPDATE arrives; zero retransmissions."""
    muxes, requester, responder, log, off, on = _run_with_port_change("h2")
    heard = min(i for i, x in enumerate(log) if isinstance(x[4], fmt.PortStatusPacket) and x[4].ack and i >= off)
    assert not [x for x in log[off:on] if x[3] == 0 and x[1] == PATHS.dst_address]
    assert not [x for x in log[heard:on] if x[3] == 0 and x[1] == PATHS.src_address]
    # until h0 heard, it may send data on plane 0 (it does not know yet); after, the transfer goes on without it
    assert off <= heard < on and _data(log, heard, on, 1), "h0 heard of the change only after it was undone"
    assert requester.retransmits == 0 and requester.summary()["timeouts"] == 0
    assert _data(log, on, len(log), 0) and _data(log, 0, off, 0)
    assert requester.profile.excluded == frozenset()


def test_the_reserved_qpn_is_the_endpoints():
    mux = HostMux(SRC)
    with pytest.raises(ValueError, match="reserved"):
        mux.add(fmt.ENDPOINT_QPN, object())


def test_retransmissions_and_probes_avoid_a_disabled_port_too():
    """Port 1 of h0 disabled before the transfer, loss on a plane-1 EV, an EV of each plane
    ASSUMED_BAD: every resend and every probe goes by port 2; the data is verified. (Random loss
    on an EV that keeps delivering never makes it ASSUMED_BAD: the EVs are marked here.)"""
    muxes, requester, responder, buffer, data = hosts(1_000_000)
    muxes["h0"].endpoint.set_port_status(0b100, 0)
    requester.profile.set_state(0, EvState.ASSUMED_BAD, 0, "test")  # a plane-0 EV that would be probed
    requester.profile.set_state(6, EvState.ASSUMED_BAD, 0, "test")  # a plane-1 EV, probed by port 2
    net = MemoryNetwork(1)
    net.fault(5).loss = 0.05
    log = recording(net)
    assert net.run([MemoryHost(muxes["h0"]), MemoryHost(muxes["h2"])], lambda: requester.done)
    assert buffer == data and requester.retransmits > 0
    assert not [x for x in log if x[1] == PATHS.src_address and x[3] == 0]
    assert requester.prober.probes_sent and {PATHS.forward[e].plane for e in requester.prober.answers} == {1}


def test_both_receive_paths_name_the_arrival_port():
    """IPV6_PKTINFO: the interface a datagram came in by, mapped to the host's 1-based port, in the
    plain receive (recvmsg) and in the batched one (recvmmsg, C)."""
    import time

    from mrc_emu.io import port as port_module
    from mrc_emu.io.sockets import SocketLink

    lo = socket.if_nametoindex("lo")
    recv = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    recv.bind(("::1", 0))
    sender = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    try:
        link = SocketLink(sender, recv, ports_by_ifindex={lo: 3})
        got = []

        class Endpoint:
            address = b""

            def on_datagram(self, payload, src, sport, now, tclass=0, port=0):
                got.append(port)

        sender.sendto(b"x", recv.getsockname()[:2])
        deadline = time.monotonic() + 5
        while not got and time.monotonic() < deadline:
            link.receive(Endpoint(), time.monotonic_ns)
        assert got == [3]
        if port_module._sockio is not None:
            port_module._sockio.enable_stamps(recv.fileno())
            sender.sendto(b"y", recv.getsockname()[:2])
            batch = []
            while not batch and time.monotonic() < deadline:
                batch = port_module._sockio.recv_batch(recv.fileno(), 4)
            assert batch[0][5] == lo
    finally:
        sender.close()
        recv.close()


def test_a_hosts_raw_sender_has_a_send_buffer_for_a_window_of_frames():
    """The worker's raw socket is charged every frame waiting in its host's port queues: at the
    kernel's default a QP's window filled it and sendto blocked the worker (io/sockets.SEND_BUFFER)."""
    from mrc_emu.io.sockets import SEND_BUFFER, raw_sender

    try:
        sock = raw_sender()
    except PermissionError:
        pytest.skip("a raw socket needs root (CAP_NET_RAW)")
    with sock:
        got = sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
    assert got >= min(SEND_BUFFER, int(open("/proc/sys/net/core/wmem_max").read())) and got > 212992
