"""The port program on a real shaped fabric: CE marks, trims, drops and counters (needs root).

Two senders (h0 via spine 0, h1 via spine 1) burst to h2 at line rate each, so the last hop
p0l1 -> h2 sees twice its rate and its queue builds; frames come from the project's encoder
(qp_paths templates) and leave each host's raw socket, as scripts/bench_transport.py does.

    h0 --- p0l0 --- p0s0 --- p0l1 --- h2      (the bottleneck: p0l1's port to h2)
    h1 --- p0l0 --- p0s1 --- p0l1
"""

from __future__ import annotations

import json
import os
import socket
import struct
import time

import pytest

from mrc_emu.fabric import build, ops
from mrc_emu.fabric.datapath import ports
from mrc_emu.fabric.kernel import netns
from mrc_emu.fabric.running import Fabric
from mrc_emu.topology import EvFormat, from_dict
from mrc_emu.transport.multipath.paths import qp_paths
from mrc_emu.wire import format as fmt
from mrc_emu.wire.format import DataPacket

pytestmark = pytest.mark.system

IPV6_RECVTCLASS, IPV6_TCLASS = 66, 67
OP_ACK = 0x11
PAYLOAD = 8000
SHAPE = {"name": "ports", "planes": 1, "spines_per_plane": 2, "leaves_per_plane": 2, "hosts_per_leaf": 2,
         "mtu": 9000, "link_rate": "400mbit"}


@pytest.fixture(autouse=True)
def _needs_object():
    if reason := ports.missing_object():
        pytest.skip(reason)


def _fabric(name: str, **extra) -> Fabric:
    build.up(from_dict({**SHAPE, **extra}, "<test>"), name)
    return Fabric.open(name)


def _burst_fabric(name: str, **extra) -> Fabric:
    """The fabric, its ports slowed as a run under time dilation K slows them (rate / K, the same
    bytes of buffer and thresholds) where this machine cannot send a burst at 4x the link rate
    (ops.burst_dilation, measured with 30 frames from h0 to h3, through no port the tests read):
    the tests below look at the queue the two senders' burst builds at p0l1's port to h2. K is 1
    on this project's machine, 16 or more in a VM under TCG."""
    fabric = _fabric(name, **extra)
    k, bps = ops.burst_dilation(fabric, "h0", _frames(fabric, "h0", 0, 30, dst="h3"), factor=4.0)
    if k > 1:
        build.shape_every_node(fabric, fabric.topology.link_rate_bps / k)
    print(f"\nsending {bps / 1e6:.0f} Mbit/s: ports at 1/{k} of the link rate")
    return fabric


def _frames(fabric: Fabric, src: str, ev: int, count: int, control_every: int = 0,
            ev_format: EvFormat = EvFormat.SRV6, trimmable: bool = True, dst: str = "h2") -> list[tuple[bytes, str]]:
    path = qp_paths(fabric.topology, src, dst, ev_format, ev_indexes=[ev], trimmable=trimmable).forward[ev]
    out = []
    for psn in range(count):
        frame = bytearray(path.template.data(DataPacket(5, psn, 0x1000 + psn * PAYLOAD, 7, bytes(PAYLOAD))))
        if control_every and psn % control_every == 0:
            udp = len(frame) - 4 - PAYLOAD - 16 - 12 - 8  # ICRC, payload, RETH, BTH, UDP header
            frame[udp + 8] = OP_ACK  # an ACK's opcode: control, as big as data (its ICRC is wrong; no one checks)
            frame[udp + 6:udp + 8] = struct.pack("!H", _udp_checksum(bytes(frame), udp))
        out.append((bytes(frame), path.first_hop))
    return out


def _udp_checksum(frame: bytes, udp: int) -> int:
    """The UDP checksum of the datagram at `udp` in an IPv6 frame whose innermost header ends there."""
    inner = udp - 40
    length = struct.unpack_from("!H", frame, udp + 4)[0]
    data = frame[inner + 8:inner + 40] + struct.pack("!IxxxB", length, 17) + frame[udp:udp + 6] + b"\0\0" \
        + frame[udp + 8:udp + length]
    data += b"\0" * (len(data) % 2)
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return (~total & 0xFFFF) or 0xFFFF


def _receiver(fabric: Fabric) -> tuple[socket.socket, socket.socket]:
    """A UDP socket on h2:4791 that reports each datagram's traffic class, and a capture of h2's port."""
    with netns.entered(fabric.node_path("h2")):
        udp = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        udp.setsockopt(socket.SOL_SOCKET, 33, 64 << 20)  # SO_RCVBUFFORCE: hold the whole burst
        udp.setsockopt(socket.IPPROTO_IPV6, IPV6_RECVTCLASS, 1)
        udp.bind((qp_paths(fabric.topology, "h0", "h2").dst_address, 4791))
        cap = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x86DD))
        cap.setsockopt(socket.SOL_SOCKET, 33, 64 << 20)
        cap.bind(("h2-eth0", 0x86DD))  # Python swaps the protocol itself
    udp.setblocking(False)
    cap.setblocking(False)
    return udp, cap


def _burst(fabric: Fabric, per_sender: int, control_every: int = 0, ev_format: EvFormat = EvFormat.SRV6,
           trimmable: bool = True) -> int:
    streams = [_frames(fabric, "h0", 0, per_sender, control_every, ev_format, trimmable),
               _frames(fabric, "h1", 1, per_sender, control_every, ev_format, trimmable)]
    socks = []
    for host in ("h0", "h1"):
        raw, unused = ops.host_sockets(fabric, host)
        unused.close()
        raw.setsockopt(socket.SOL_SOCKET, 32, 64 << 20)  # SO_SNDBUFFORCE: never block mid-burst
        socks.append(raw)
    try:
        for i in range(per_sender):
            for raw, frames in zip(socks, streams):
                raw.sendto(frames[i][0], (frames[i][1], 0))
    finally:
        for raw in socks:
            raw.close()
    return 2 * per_sender


def _drain(udp: socket.socket, expected: int, timeout: float = 10.0, sources: list | None = None) -> list[tuple[bytes, int]]:
    """(payload, traffic class) of each datagram, in arrival order, until `expected` arrived or
    nothing came for a while; each one's source address goes to `sources` if given."""
    got: list[tuple[bytes, int]] = []
    deadline = time.monotonic() + timeout
    quiet_until = None
    while len(got) < expected and time.monotonic() < deadline:
        try:
            data, anc, _, source = udp.recvmsg(1 << 16, 64)
        except BlockingIOError:
            now = time.monotonic()
            quiet_until = quiet_until or now + 0.5  # dropped packets never come: stop once the port is quiet
            if now > quiet_until:
                break
            time.sleep(0.001)  # polling a non-blocking socket, bounded by the deadline above
            continue
        quiet_until = None
        tclass = next(struct.unpack("i", d[:4])[0] for lvl, typ, d in anc if typ == IPV6_TCLASS)
        got.append((data, tclass))
        if sources is not None:
            sources.append(source[0])
    return got


def _captured(cap: socket.socket) -> list[bytes]:
    out = []
    while True:
        try:
            out.append(cap.recv(1 << 16))
        except BlockingIOError:
            return out


def _port(fabric: Fabric, node: str, peer: str) -> dict:
    (link,) = fabric.topology.links_between(node, peer)
    return ports.counters(fabric, node)[node][fabric.topology.peer(link, node)[1]]


def _ce_marked_anywhere(fabric: Fabric) -> int:
    """CE marks of every port the program serves: a burst a host's TBF lets out at line speed may
    queue briefly at a spine's port too, which then marks some packets before the last hop does."""
    return sum(c["ce_marked"] for by_port in ports.counters(fabric).values() for c in by_port.values())


def _assert_ce_counted(last_hop: int, anywhere: int, seen: int) -> None:
    """Every CE mark the last hop made reached the receiver, and every CE the receiver saw was
    made by some port (one marked twice counts twice there)."""
    assert last_hop <= seen <= anywhere, (last_hop, seen, anywhere)


def test_a_queue_marks_ce_and_trims_to_dscp_lasthop_with_a_valid_checksum(fabric_name):
    with _burst_fabric(fabric_name) as fabric:
        udp, cap = _receiver(fabric)
        ports.reset(fabric)
        sent = _burst(fabric, 60, control_every=5)
        got = _drain(udp, sent)
        frames = _captured(cap)
        port = _port(fabric, "p0l1", "h2")
        anywhere = _ce_marked_anywhere(fabric)
    build.down(fabric_name)

    data = [(p, tc) for p, tc in got if p[0] != OP_ACK]
    control = [(p, tc) for p, tc in got if p[0] == OP_ACK]
    ce = [p for p, tc in data if tc & 3 == 3 and tc >> 2 == fmt.DSCP_TRIMMABLE]
    trimmed = [(p, tc) for p, tc in data if tc >> 2 == ports.DSCP_TRIMMED_LASTHOP]
    assert ce, f"no CE-marked data packet among {len(data)}: {port}"
    assert trimmed, f"no trimmed packet among {len(data)}: {port}"
    assert all(len(p) == 28 for p, _ in trimmed)  # BTH + RETH
    assert all(len(p) == 12 + 16 + PAYLOAD + 4 for p, tc in data if tc >> 2 == fmt.DSCP_TRIMMABLE)
    # control: an ACK's opcode in a data packet's class: the opcode decides
    assert len(control) == sent // 5 and all(tc == fmt.TCLASS_DATA and len(p) > 28 for p, tc in control), "control was touched"
    # the counters say what the receiver saw
    _assert_ce_counted(port["ce_marked"], anywhere, len(ce))
    assert port["trimmed"] == len(trimmed)
    assert port["packets"] - len(got) in (0, 1, 2)  # a stray MLD report may pass the port too
    assert port["dropped"] == sent - len(got)
    assert port["max_queue"] <= port["config"]["buffer"]
    # trimmed packets on h2's wire: every length consistent and the UDP checksum valid
    short = [f for f in frames if len(f) < 400 and f[12:14] == b"\x86\xdd" and f[14 + 6] == 43]  # SRv6, short
    assert len(short) >= len(trimmed)
    for frame in short:
        outer = frame[14:]
        srh = 40 + 8 + 8 * outer[41]
        inner = srh
        udp_at = 14 + inner + 40
        assert struct.unpack_from("!H", outer, 4)[0] == len(outer) - 40
        assert struct.unpack_from("!H", outer, inner + 4)[0] == 8 + 28
        assert struct.unpack_from("!H", frame, udp_at + 4)[0] == 8 + 28
        assert struct.unpack_from("!H", frame, udp_at + 6)[0] == _udp_checksum(frame, udp_at)


def test_control_packets_and_trimmed_headers_overtake_the_data_queued_before_them(fabric_name):
    """HTB under TBF serves the class the program puts them in first: with FIFO service no packet
    of one sender could arrive before an earlier one of the same sender (one path, FIFO hops)."""
    with _burst_fabric(fabric_name) as fabric:
        udp, _ = _receiver(fabric)
        sent = _burst(fabric, 60, control_every=5)
        sources: list = []
        got = _drain(udp, sent, sources=sources)
    build.down(fabric_name)
    psn = [struct.unpack_from("!I", p, 8)[0] & 0xFFFFFF for p, _ in got]
    ahead = {"control": 0, "trimmed": 0}
    for i, (payload, tc) in enumerate(got):
        kind = "control" if payload[0] == OP_ACK else "trimmed" if tc >> 2 == ports.DSCP_TRIMMED_LASTHOP else None
        # overtook: a data packet of the same sender with a lower PSN arrived after it
        if kind and any(sources[j] == sources[i] and psn[j] < psn[i] and got[j][0][0] != OP_ACK
                        for j in range(i + 1, len(got))):
            ahead[kind] += 1
    assert ahead["control"] > 0 and ahead["trimmed"] > 0, f"nothing went ahead of queued data: {ahead}"


def test_usid_frames_without_an_srh_are_marked_and_trimmed_too(fabric_name):
    with _burst_fabric(fabric_name) as fabric:
        udp, _ = _receiver(fabric)
        ports.reset(fabric)
        sent = _burst(fabric, 60, ev_format=EvFormat.SRV6_USID)
        got = _drain(udp, sent)
        port = _port(fabric, "p0l1", "h2")
        anywhere = _ce_marked_anywhere(fabric)
    build.down(fabric_name)
    ce = sum(1 for _, tc in got if tc == fmt.TCLASS_DATA | fmt.ECN_CE)
    trimmed = [p for p, tc in got if tc >> 2 == ports.DSCP_TRIMMED_LASTHOP]
    assert ce and trimmed and all(len(p) == 28 for p in trimmed)
    _assert_ce_counted(port["ce_marked"], anywhere, ce)
    assert (port["trimmed"], port["dropped"]) == (len(trimmed), sent - len(got))


def test_ecn_off_and_trim_off_drop_above_the_buffer_and_down_removes_the_pins(fabric_name):
    with _burst_fabric(fabric_name, port={"ecn": "off", "trim": "off", "buffer": "100k"}) as fabric:
        udp, _ = _receiver(fabric)
        ports.reset(fabric)
        sent = _burst(fabric, 60)
        got = _drain(udp, sent)
        port = _port(fabric, "p0l1", "h2")
        pins = ports.pin_dir(fabric_name)
        assert pins.exists()
    build.down(fabric_name)
    assert not pins.exists(), "down left the pinned program and maps behind"
    assert port["dropped"] > 0 and port["ce_marked"] == 0 and port["trimmed"] == 0
    assert all(tc == fmt.TCLASS_DATA for _, tc in got)
    assert port["dropped"] == sent - len(got)
    assert port["max_queue"] <= 100_000


def test_no_link_rate_attaches_nothing(fabric_name):
    shape = {k: v for k, v in SHAPE.items() if k != "link_rate"}
    build.up(from_dict(shape, "<test>"), fabric_name)
    with Fabric.open(fabric_name) as fabric:
        assert not ports.attached(fabric)
        with pytest.raises(ports.PortsError, match="no link_rate"):
            ports.counters(fabric)
    build.down(fabric_name)
    assert not os.path.exists(ports.pin_dir(fabric_name))


def test_stats_command(fabric_name):
    from click.testing import CliRunner

    from mrc_emu.cli import main

    with _fabric(fabric_name):
        runner = CliRunner()
        shown = runner.invoke(main, ["stats", "p0l1", "--json", "--name", fabric_name])
        assert shown.exit_code == 0, shown.output
        data = json.loads(shown.output)
        assert set(data) == {"p0l1"} and all("ce_marked" in c and "queue_p99" in c for c in data["p0l1"].values())
        table = runner.invoke(main, ["stats", "--name", fabric_name])
        assert table.exit_code == 0 and "p0s1" in table.output and "trim 50000" in table.output  # last hop at 1 BDP too
        host = runner.invoke(main, ["stats", "h0", "--name", fabric_name])
        assert host.exit_code == 1 and "hosts: on" in host.output
    build.down(fabric_name)


@pytest.mark.slow
def test_large_attaches_every_switch_port(fabric_name):
    """All 3,072 egress ports of a shaped `large` get the program (how long it takes is
    scripts/bench_fabric.py large@1gbit's business: no timed assertion here)."""
    from mrc_emu.topology import builtin

    topo = from_dict({**builtin("large").to_dict(), "link_rate": "1gbit"}, "<large>")
    result = build.up(topo, fabric_name)
    try:
        assert "ports" in result.phases, result.phases
        with Fabric.open(fabric_name) as fabric:
            assert sum(len(p) for p in ports.counters(fabric).values()) == len(topo.egress_ports()) == 3072
    finally:
        build.down(fabric_name)
    assert not ports.pin_dir(fabric_name).exists()


def test_a_crashed_runs_pins_go_with_its_journal(fabric_name):
    from mrc_emu.fabric import registry

    with _fabric(fabric_name) as fabric:
        pins = ports.pin_dir(fabric_name)
        assert str(pins) in fabric.state().bpf_pins and (pins / "prog").exists()
    registry.remove(fabric_name)  # what `clean` does for each journal a killed run left
    assert not pins.exists()


def _tbf_parms(fabric: Fabric, node: str, intf: str) -> dict:
    from pyroute2 import IPRoute

    with netns.entered(fabric.node_path(node)), IPRoute() as ipr:
        (index,) = ipr.link_lookup(ifname=intf)
        (tbf,) = [q for q in ipr.get_qdiscs(index=index) if q.get_attr("TCA_KIND") == "tbf"]
        return tbf.get_attr("TCA_OPTIONS").get_attr("TCA_TBF_PARMS")


def test_a_reshaped_port_drains_its_virtual_queue_at_the_new_rate(fabric_name):
    with _fabric(fabric_name) as fabric:
        index = ports._indexes(fabric.topology)[("p0l1", "p0l1-eth0")]
        full = _tbf_parms(fabric, "p0l1", "p0l1-eth0")
        build.shape_node(fabric, "p0l1", 100e6)  # what a run under time dilation 4 does
        rate, _, burst = ports._CFG.unpack(ports._maps_of(fabric).cfg.get(index))[:3]
        assert (rate, burst) == (12_500_000, 36_000)
        slowed = _tbf_parms(fabric, "p0l1", "p0l1-eth0")
        # TBF's rate follows, its limit in bytes does not: the port holds what it holds at full rate
        assert (slowed["rate"], slowed["limit"]) == (12_500_000, full["limit"]) and full["limit"] >= 2_500_000
        build.shape_node(fabric, "p0l1", 400e6)
        assert ports._CFG.unpack(ports._maps_of(fabric).cfg.get(index))[0] == 50_000_000
    build.down(fabric_name)


def test_data_that_must_not_be_trimmed_is_marked_and_dropped_never_trimmed(fabric_name):
    """RoCEv2 RC (the baseline) sends DSCP_NO_TRIM: its NIC knows no trims, so a switch marks
    such packets and drops them above the buffer, as a RoCE fabric without PFC would."""
    with _burst_fabric(fabric_name) as fabric:
        udp, _ = _receiver(fabric)
        ports.reset(fabric)
        sent = _burst(fabric, 80, trimmable=False)
        got = _drain(udp, sent)
        port = _port(fabric, "p0l1", "h2")
    build.down(fabric_name)
    assert port["trimmed"] == 0 and port["ce_marked"] > 0
    assert all(tc >> 2 == fmt.DSCP_NO_TRIM and len(p) == 12 + 16 + PAYLOAD + 4 for p, tc in got)
    assert port["dropped"] == sent - len(got)
