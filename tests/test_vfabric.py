"""The virtual fabric: its event engine, its ports and links, and MRC WRITEs over it in virtual
time (no root): verified, the same run from the same seed, a blackholed link detected within a
few base RTTs, an incast that the port rule marks at the bottleneck."""

from __future__ import annotations

import random

import pytest

from mrc_emu.experiments.runtime.spec import TransferSpec
from mrc_emu.experiments.runtime.virtual import run_virtual, send_virtual
from mrc_emu.topology import builtin
from mrc_emu.topology.evs import EvFormat
from mrc_emu.transport.config import QpConfig
from mrc_emu.transport.multipath.ev import EvState
from mrc_emu.vfabric.engine import Engine
from mrc_emu.vfabric.fabric import VirtualFabric
from mrc_emu.vfabric.faults import FaultError, FaultKind, parse

DEFAULT = builtin()


# ---- the engine ---------------------------------------------------------------------------------

def test_events_run_in_time_order_and_ties_in_the_order_they_were_scheduled():
    engine, ran = Engine(), []
    for time_ns, name in [(30, "c"), (10, "a"), (30, "d"), (20, "b"), (10, "a2")]:
        engine.at(time_ns, ran.append, (time_ns, name))
    engine.at(20, lambda _: engine.after(0, ran.append, (engine.now, "b-then")))  # scheduled while running: after b
    assert engine.run() is False and engine.pending == 0
    assert ran == [(10, "a"), (10, "a2"), (20, "b"), (20, "b-then"), (30, "c"), (30, "d")]
    assert engine.now == 30 and engine.events == 7  # the six, and the one that scheduled b-then
    with pytest.raises(ValueError, match="in the past"):
        engine.at(29, ran.append)


def test_the_engine_stops_when_told_or_at_a_time_and_goes_on_from_there():
    engine, ran = Engine(), []
    for t in range(0, 100, 10):
        engine.at(t, ran.append, t)
    engine.at(35, lambda _: engine.stop())
    assert engine.run() is True and ran == [0, 10, 20, 30] and engine.now == 35
    assert engine.run(until_ns=60) is False and ran[-1] == 60 and engine.now == 60
    assert engine.next_time() == 70
    assert engine.run(until_ns=65) is False and engine.now == 65  # nothing until 70: time moves to the limit


def test_the_same_schedule_runs_the_same_way():
    def order(seed: int) -> list[int]:
        pick, engine, ran = random.Random(seed), Engine(), []
        for k in range(500):
            engine.at(pick.randrange(50), ran.append, k)
        engine.run()
        return ran

    assert order(1) == order(1) and order(1) != order(2)


# ---- ports and links ----------------------------------------------------------------------------

def _fabric(topo=DEFAULT, **kw) -> tuple[Engine, VirtualFabric]:
    engine = Engine()
    return engine, VirtualFabric(topo, engine, random.Random(0), **kw)


def test_a_port_serialises_at_its_rate_and_the_link_adds_its_delay_exactly():
    engine, fabric = _fabric(link_delay_ns=1_000)
    port = fabric.towards("p0l0", "p0s1")
    got = []
    port._arrive = lambda arrival: got.append((engine.now, len(arrival[1])))
    for size in (4186, 4186, 100):  # 4,200 bytes on the wire each (with the Ethernet header), then 114
        port.offer(bytearray(size))
    engine.run()
    # one busy period at 100 Gbit/s: each ends at ceil(bytes so far x 8 / 100) ns, then 1 us of propagation
    assert got == [(1_336, 4186), (1_672, 4186), (1_682, 100)]  # 8,514 bytes: 681.12 ns, the next whole one
    assert port.packets == 3 and port.max_queue == 8_514


def _bucket_topology(bucket: int | None, rate: str = "400mbit"):
    from mrc_emu.topology import from_dict

    data = {**DEFAULT.to_dict(), "link_rate": rate, "name": "bucket"}
    if bucket is not None:
        data["port"] = {"bucket": bucket}
    return from_dict(data, "<bucket>")


def test_a_port_with_tbfs_bucket_lets_a_burst_through_at_once_then_the_rate():
    # port: {bucket: 10000} at 400 Mbit/s (50 bytes a us): the namespace fabric's TBF lets 10,000
    # bytes through an idle port at once, then one byte per 20 ns; the model's port does the same
    engine, fabric = _fabric(_bucket_topology(10_000), link_delay_ns=1_000)
    port = fabric.towards("p0l0", "p0s1")
    assert port.bucket == 10_000
    got = []
    port._arrive = lambda arrival: got.append(engine.now)
    for _ in range(4):  # 4,200 bytes on the wire each
        port.offer(bytearray(4186))
    engine.run()
    # two within the bucket at once; the third when 2,600 more bytes are paid for (52 us), the fourth 6,800 (136 us)
    assert got == [1_000, 1_000, 53_000, 137_000]
    # what the port rule sees is what TBF holds (the port program's fluid queue: backlog less the bucket)
    assert port.max_queue == 6_800  # the fourth found 12,600 bytes unpaid, 2,600 of them beyond the bucket
    engine, fabric = _fabric(_bucket_topology(10_000), link_delay_ns=1_000)
    port, got = fabric.towards("p0l0", "p0s1"), []
    port._arrive = lambda arrival: got.append(engine.now)
    for at in (0, 0, 0, 10_000, 500_000):  # after 500 us idle the bucket is full again
        engine.at(at, lambda _: port.offer(bytearray(4186)))
    engine.run()
    assert got == [1_000, 1_000, 53_000, 137_000, 501_000]


def test_without_a_bucket_a_port_serialises_and_a_degrade_reshapes_the_bucket():
    engine, fabric = _fabric(_bucket_topology(None), link_delay_ns=0)
    port = fabric.towards("p0l0", "p0s1")
    got = []
    port._arrive = lambda arrival: got.append(engine.now)
    port.offer(bytearray(4186))
    engine.run()
    assert port.bucket == 0 and got == [84_000]  # 4,200 bytes at 400 Mbit/s: serialised before it leaves
    _, shaped = _fabric(_bucket_topology(1), link_delay_ns=0)
    port = shaped.towards("p0l0", "p0s1")
    assert port.bucket == 9_014  # at least one frame of the topology's MTU (TBF drops a larger one)
    port.set_rate(100_000_000)
    assert port.rate_bps == 100_000_000 and port.bucket == 9_014


def test_a_bucket_hides_the_serialisation_of_idle_hops_only_and_the_model_says_how_much():
    # TBF's bucket (a 9,014-byte frame at 400 Mbit/s, 50 bytes a us): an idle port lets a frame
    # through at once, where a switch port takes its serialisation; a port holding more than its
    # bucket delays a frame by the queue its rule sees (backlog less the bucket) and its own
    # serialisation, as a switch holding that queue does
    engine, fabric = _fabric(_bucket_topology(1), link_delay_ns=0)
    port = fabric.towards("p0l0", "p0s1")
    got, seen = [], []
    port._arrive = lambda arrival: got.append(engine.now)

    def offer(_):
        seen.append((engine.now, max(0, port.backlog(engine.now) - port.bucket)))
        port.offer(bytearray(4186))
    for at in (0, 0, 0, 0, 1_000_000):
        engine.at(at, offer)
    engine.run()
    delays = [done - at for done, (at, _) in zip(got, seen)]
    assert delays[0] == 0 and delays[-1] == 0  # idle: no serialisation at all (a switch: 84 us)
    assert seen[3][1] == 12_600 - 9_014 and delays[3] == (seen[3][1] + 4_200) * 20  # busy: queue and own frame
    # so a round trip over 4 links with one busy port lacks every serialisation but its data frame's
    out, back = 4_302, 224
    assert fabric.path_unseen_ns(4, out, back) == 4 * (out + back) * 20 - out * 20
    _, serialising = _fabric(_bucket_topology(None))
    assert serialising.path_unseen_ns(4, out, back) == 0  # without a bucket every port serialises


def test_control_frames_leave_ahead_of_queued_data():
    from mrc_emu.transport.multipath.paths import qp_paths
    from mrc_emu.wire.format import AckPacket, DataPacket

    engine, fabric = _fabric()
    path = qp_paths(DEFAULT, "h0", "h2").forward[1]
    data, ack = path.template.encode(DataPacket(1, 0, 0, 1, b"x" * 4096)), path.template.encode(AckPacket(1, 0, 0, 1))
    port, got = fabric.towards("p0l0", "p0s1"), []
    port._arrive = lambda arrival: got.append(arrival[1][-20:] == bytes(ack)[-20:])
    for frame in (data, data, data, ack):
        port.offer(bytearray(frame))
    engine.run()
    assert got == [False, True, False, False]  # the first was on the wire already; the ACK overtook the rest


def test_faults_act_where_the_namespace_fabric_has_them():
    engine, fabric = _fabric()
    a, b = fabric.towards("p0l0", "p0s1"), fabric.towards("p0s1", "p0l0")
    parse("degrade p0l0->p0s1 25% at 1ms").apply(fabric)
    assert (a.rate_bps, b.rate_bps) == (25_000_000_000, 100_000_000_000)
    parse("delay p0l0 p0s1 50us at 1ms").apply(fabric)
    assert a.delay_ns == b.delay_ns == 51_000
    parse("loss p0s1->p0l0 0.5 at 1ms").apply(fabric)
    assert (a.loss, b.loss) == (0.0, 0.5)
    down = parse("down p0l0 p0s1 at 0.5")
    a.offer(bytearray(4000))
    a.offer(bytearray(4000))
    down.apply(fabric)  # one frame on the wire, one queued: both lost
    assert not a.up and not b.up and a.flushed == 1
    engine.run()
    assert fabric.drops["link down"] == 1 and fabric.packet_hops == 0
    down.apply(fabric, undo=True)
    parse("degrade p0l0->p0s1 25% at 1ms").apply(fabric, undo=True)
    assert a.up and a.rate_bps == 100_000_000_000


@pytest.mark.parametrize("line, message", [
    ("flood p0l0 p0s1 at 0.3", "starts with its kind"),
    ("blackhole p0l0 at 0.3", "name the link"),
    ("down p0l0->p0s1 at 0.3", "both ways"),
    ("loss p0l0 p0s1 at 0.3", "takes a probability"),
    ("loss p0l0 p0s1 150% at 0.3", "not a probability"),
    ("degrade p0l0 p0s1 0 at 0.3", "not a rate fraction"),
    ("blackhole p0l0 p0s1", "say when"),
    ("blackhole p0l0 p0s1 at 1.5", "fraction of the bytes"),
    ("blackhole p0l0 p0s1 at 2ms for", "only 'for DURATION'"),
    ("delay p0l0 p0s1 5 at 0.3", "is not a duration"),
])
def test_a_bad_fault_line_says_what_is_wrong_in_one_line(line, message):
    with pytest.raises(FaultError, match=message) as err:
        parse(line)
    assert "\n" not in str(err.value)


def test_a_fault_on_no_link_is_refused_before_anything_runs():
    with pytest.raises(FaultError, match="no link between p0l0 and p1s0"):
        send_virtual(DEFAULT, "h0", "h2", 4096, faults=[parse("blackhole p0l0 p1s0 at 0.5")])


def test_fault_lines_parse_to_what_they_say():
    fault = parse("loss p0l0->p0s1 5% at 1ms for 2ms")
    assert (fault.kind, fault.a, fault.b, fault.one_way, fault.value) == (FaultKind.LOSS, "p0l0", "p0s1", True, 0.05)
    assert (fault.at_ns, fault.at_progress, fault.duration_ns) == (1_000_000, None, 2_000_000)
    assert parse("blackhole p0l0 p0s1 at 30%").at_progress == 0.3
    assert parse("delay p0l0 p0s1 50us at 0.5").value == 50_000


# ---- driving endpoints ------------------------------------------------------------------------------

class _Clockwork:
    """An endpoint that wants pumping at given times (or at once, `spin`), and records when it was."""

    address = b"\0" * 16

    def __init__(self, wakeups: list[int], spin: bool = False) -> None:
        self.wakeups, self.spin, self.pumped = wakeups, spin, []

    def pump(self, now, send, clock=None, horizon=None) -> None:
        self.pumped.append(now)
        while self.wakeups and self.wakeups[0] <= now:
            self.wakeups.pop(0)

    def next_wakeup(self):
        if self.spin:
            return self.pumped[-1]
        return self.wakeups[0] if self.wakeups else None


def _driver():
    from mrc_emu.transport.mux import HostMux
    from mrc_emu.vfabric.hosts import HostDriver

    engine, fabric = _fabric()
    driver = HostDriver(engine, fabric)
    driver.add_host("h0", HostMux(b"\0" * 16))
    return engine, driver


def test_an_endpoint_is_pumped_at_once_and_then_exactly_at_each_wakeup_it_asks_for():
    engine, driver = _driver()
    endpoint = _Clockwork([500, 1_200, 1_200, 9_000])
    driver.add_endpoint(endpoint, "h0")
    engine.at(700, lambda _: driver.wake(endpoint))  # new work: pumped then too
    engine.run()
    assert endpoint.pumped == [0, 500, 700, 1_200, 9_000]


def test_an_endpoint_that_asks_for_a_pump_at_once_and_does_nothing_is_a_clear_error():
    from mrc_emu.vfabric.hosts import SpinError

    engine, driver = _driver()
    driver.add_endpoint(_Clockwork([], spin=True), "h0")
    with pytest.raises(SpinError, match="_Clockwork of h0 asked to be pumped at once 1000 times at 0 ns"):
        engine.run()


# ---- WRITEs in virtual time -----------------------------------------------------------------------

def _comparable(result) -> dict:
    """A result as a dict, without the one thing a run may not repeat: this machine's wall time."""
    out = result.to_dict(timeline=True)
    out["virtual"] = {k: v for k, v in out["virtual"].items() if k != "wall"}
    return out


def test_a_write_is_verified_in_virtual_time_and_sprayed_over_every_ev():
    result = send_virtual(DEFAULT, "h0", "h2", 4 << 20, seed=1)
    assert result.verified and result.sha256_placed == result.sha256_source
    assert len(result.per_ev) == 8 and all(abs(e["share"] - 1 / 8) < 0.01 for e in result.per_ev)
    assert result.requester["stats"]["retransmits"] == 0 and result.ev_events == []
    block = result.virtual
    assert block["link_rate_bps"] == 100_000_000_000 and "default" in block["link_rate_from"]
    # two 100 Gbit/s planes: the WRITE takes at least its bytes at 200 Gbit/s, and the model's base RTT more
    assert 4 * 2**20 * 8 / 200e9 * 1e3 < result.completion_ms < 0.5
    # every data packet crosses 4 links (host, leaf, spine, leaf, host), its ACKs too
    assert block["packet_hops"] == 4 * block["frames_delivered"] and block["fabric_drops"] == {}


def test_the_same_seed_gives_the_same_run_and_another_seed_only_other_random_choices():
    first, again = (_comparable(send_virtual(DEFAULT, "h0", "h2", 2 << 20, seed=5)) for _ in range(2))
    assert first == again  # every timestamp, counter, EV share and both SHA-256s
    other = _comparable(send_virtual(DEFAULT, "h0", "h2", 2 << 20, seed=6))
    assert other["sha256_source"] != first["sha256_source"]  # the source bytes are the seed's
    # nothing else random happens without faults: the same packets at the same nanoseconds
    assert {k for k in first if first[k] != other[k]} == {"sha256_source", "sha256_placed", "virtual"}
    assert {k for k in first["virtual"] if first["virtual"][k] != other["virtual"][k]} == {"seed"}


def test_a_lossy_link_draws_from_the_seed():
    lossy = [parse("loss p0l0 p0s1 5% at 0.2")]
    runs = [_comparable(send_virtual(DEFAULT, "h0", "h2", 2 << 20, seed=s, faults=lossy)) for s in (7, 7, 8)]
    assert runs[0] == runs[1] and all(r["verified"] for r in runs)
    assert runs[0]["virtual"]["fabric_drops"]["loss"] > 0
    assert runs[0]["virtual"]["fabric_drops"] != runs[2]["virtual"]["fabric_drops"] or runs[0]["timeline"] != runs[2]["timeline"]


def test_a_blackholed_leaf_spine_link_takes_its_ev_out_within_a_few_base_rtts():
    run = run_virtual(DEFAULT, [TransferSpec("h0", "h2", 16 << 20)], seed=2,
                      faults=[parse("blackhole p0l0 p0s1 at 0.3")])
    result, job = run[0], run.jobs[0]
    assert result.verified
    (fault,) = run.virtual["faults"]
    requester = job.requester
    (event,) = [e for e in requester.ev_events if e.new is EvState.ASSUMED_BAD]
    assert event.ev == 1 and requester.profile.evs[1].state is EvState.ASSUMED_BAD  # plane 0, spine 1: that link
    assert all(s.state is EvState.GOOD for ev, s in requester.profile.evs.items() if ev != 1)
    base_rtt = run.virtual["qp_base_rtt_ns"][0]
    detection = event.time_ns - job.start_ns - fault["applied_ns"]
    # across EVs the loss timer waits for the responder's ACK delay too (transport/loss.py, rule 2),
    # 250 us against a 9.4 us base RTT here: within 4 base RTTs and that delay (measured: 29.2 RTTs)
    ack_delay = requester.config.ack_delay_ns
    assert 0 < detection < 4 * base_rtt + ack_delay, f"detected {detection / base_rtt:.1f} base RTTs after the fault"
    assert result.requester["stats"]["timeouts"] == 0 and run.virtual["fabric_drops"]["blackhole"] > 0


def test_an_incast_queues_and_is_marked_at_the_bottleneck():
    """4 -> 1 on `incast` (400 Mbit/s links, ECN and trimming on every switch port): the ports into
    h0 (its leaf's, one per plane) queue past kmin and mark CE; every WRITE is verified."""
    topo = builtin("incast")
    specs = [TransferSpec(src, "h0", 1 << 20) for src in ("h4", "h8", "h12", "h16")]
    run = run_virtual(topo, specs, seed=3)
    assert all(r.verified for r in run)
    into_h0 = [run.fabric.towards(f"p{plane}l0", "h0") for plane in range(topo.planes)]
    kmin = next(p for p in topo.egress_ports() if p.node == "p0l0" and p.peer == "h0").kmin
    assert all(port.max_queue > kmin and port.ce_marked > 0 for port in into_h0)
    marked = sum(port.ce_marked for ports in run.fabric.ports.values() for port in ports.values())
    trimmed = sum(port.trimmed for ports in run.fabric.ports.values() for port in ports.values())
    # every CE mark reaches the responder, but on a packet a later port trimmed (its header is a trim)
    received = sum(r.responder["stats"]["ce_received"] for r in run)
    assert marked - trimmed <= received <= marked and marked >= sum(port.ce_marked for port in into_h0)
    assert sum(r.responder["stats"]["trimmed_received"] for r in run) == trimmed
    assert run.virtual["busiest_port"]["node"] in ("p0l0", "p1l0")
    assert "p0l0" in run.virtual["ports_signalled"]


@pytest.mark.parametrize("ev_format", [EvFormat.SRV6_USID, EvFormat.UDP, EvFormat.STEV])
def test_every_ev_format_is_forwarded_to_its_destination(ev_format):
    result = send_virtual(DEFAULT, "h0", "h3", 1 << 20, ev_format=ev_format, seed=4)
    assert result.verified and result.virtual["fabric_drops"] == {}
    if ev_format is EvFormat.UDP:  # the fabric's ECMP hash picks each EV's path: spread over both planes
        used = {e["plane"] for e in result.per_ev if e["packets_sent"]}
        assert result.virtual["frames_refused"] == 0 and used == {0, 1}


def test_a_host_whose_port_is_down_cannot_send_on_that_plane():
    result = send_virtual(DEFAULT, "h0", "h2", 2 << 20, seed=1, faults=[parse("down h0 p0l0 at 0.25")],
                          config=QpConfig(ack_timeout_exp=10))
    assert result.verified and result.virtual["frames_refused"] > 0
    assert {e["ev"] for e in result.per_ev if e["state"] == "ASSUMED_BAD"} == {0, 1, 2, 3}  # every plane-0 EV


def test_huge_is_modelled_whole_and_a_write_across_it_uses_all_64_evs():
    """512 hosts, 1,088 nodes, 16,384 egress ports; h0 -> h511 crosses leaves of every plane."""
    result = send_virtual(builtin("huge"), "h0", "h511", 1 << 20, seed=1)
    assert result.verified and len(result.per_ev) == 64
    assert all(e["packets_sent"] for e in result.per_ev) and result.virtual["fabric_drops"] == {}
