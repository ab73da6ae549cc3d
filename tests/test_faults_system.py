"""Faults for real (root): each one acts on traffic, `fault list` shows it while it is in force, and
`fault clear` removes exactly it. Datagrams between the two ends of a link show which direction a
one-way fault hits; a transfer pinned to a degraded link shows its rate fall; a scenario's faults
appear in the fabric's fault record while its run holds them."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading

import pytest
from click.testing import CliRunner
from conftest import fabric_limited, wait_for

from mrc_emu import cli
from mrc_emu.experiments.runtime import fault_agent
from mrc_emu.experiments.runtime.transfer import send
from mrc_emu.experiments.scenarios import runner, scenario
from mrc_emu.fabric import build
from mrc_emu.fabric.datapath import impair, ports
from mrc_emu.fabric.faults import fault_ops
from mrc_emu.fabric.faults.fault_record import FaultRecord
from mrc_emu.fabric.kernel import netns
from mrc_emu.fabric.running import Fabric
from mrc_emu.topology import addressing, builtin, evs_between, from_dict

pytestmark = pytest.mark.system
CLI = [sys.executable, "-m", "mrc_emu.cli"]
MiB = 1024 * 1024
PORT = 47_000


def _listener(fabric: Fabric, node: str, address: str) -> socket.socket:
    with netns.entered(fabric.node_path(node)):
        sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, 33, 8 * MiB)  # SO_RCVBUFFORCE: every datagram fits until drained
    sock.bind((address, PORT))
    sock.setblocking(False)
    return sock


def _send(fabric: Fabric, node: str, address: str, count: int) -> None:
    with netns.entered(fabric.node_path(node)):
        sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    with sock:
        for i in range(count):
            try:
                sock.sendto(i.to_bytes(4, "big") * 64, (address, PORT))
            except OSError:  # ENETUNREACH: the link is down, its route gone with it
                return


def _drain(sock: socket.socket) -> int:
    got = 0
    while True:
        try:
            sock.recv(2048)
        except BlockingIOError:
            return got
        got += 1


def _both_ways(fabric: Fabric, a: str, b: str, count: int = 200) -> tuple[int, int]:
    """Datagrams A->B and B->A between the link's two end addresses: how many arrived each way.
    The B->A ones are sent after the A->B ones and waited for: the veth delivers in order in the
    sender's context, so once they are in, whatever of A->B was going to arrive has."""
    (link,) = fabric.topology.links_between(a, b)
    at_a, at_b = addressing.link_address(link, a), addressing.link_address(link, b)
    with _listener(fabric, a, at_a) as rx_a, _listener(fabric, b, at_b) as rx_b:
        _send(fabric, a, at_b, count)
        _send(fabric, b, at_a, count)
        got_b, got_a = [0], [0]

        def back_in() -> bool:
            got_a[0] += _drain(rx_a)
            return got_a[0] >= count

        try:
            wait_for(back_in, timeout=3, what=f"{count} datagrams {b}->{a}")
        except Exception:
            pass  # B->A was hit as well: the counts say so
        got_b[0] = _drain(rx_b)
        return got_b[0], got_a[0]


def _list(name: str) -> list[dict]:
    result = CliRunner().invoke(cli.main, ["fault", "list", "--json", "-n", name])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_a_one_way_blackhole_drops_one_direction_only_until_cleared(default_fabric):
    fabric = default_fabric
    assert _both_ways(fabric, "p0l0", "p0s1") == (200, 200)
    done = subprocess.run(CLI + ["fault", "blackhole", "p0l0", "p0s1", "--direction", "p0l0->p0s1", "-n", fabric.name],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert _both_ways(fabric, "p0l0", "p0s1") == (0, 200)  # p0l0->p0s1 gone, p0s1->p0l0 untouched
    loss = fault_ops.drop(fabric, "p0l0", "p0s2", 50.0, ("p0s2", "p0l0"))
    to_s2, to_l0 = _both_ways(fabric, "p0l0", "p0s2", 400)
    assert to_s2 == 400 and 120 < to_l0 < 280, (to_s2, to_l0)
    listed = _list(fabric.name)
    assert [(e["kind"], e["target"], e["params"]) for e in listed] == [
        ("blackhole", "p0l0->p0s1", {}), ("loss", "p0s2->p0l0", {"percent": 50.0})]
    assert listed[0]["by"] == "cli" and listed[0]["pid"] > 0 and not listed[0]["owner_alive"]  # that command ended
    # clearing one link's faults leaves the other's in force
    result = CliRunner().invoke(cli.main, ["fault", "clear", "p0s1", "p0l0", "-n", fabric.name])
    assert result.exit_code == 0 and "cleared 1 fault" in result.output, result.output
    assert [e["id"] for e in _list(fabric.name)] == [loss.id]
    assert _both_ways(fabric, "p0l0", "p0s1") == (200, 200)
    assert CliRunner().invoke(cli.main, ["fault", "clear", "all", "-n", fabric.name]).exit_code == 0
    assert _list(fabric.name) == [] and _both_ways(fabric, "p0l0", "p0s2", 400) == (400, 400)


def test_link_down_and_up_go_through_the_record(default_fabric):
    fabric = default_fabric
    for _ in range(2):  # twice down is one fault
        assert CliRunner().invoke(cli.main, ["link", "down", "p0l1", "p0s3", "-n", fabric.name]).exit_code == 0
    (entry,) = _list(fabric.name)
    assert (entry["kind"], entry["target"], entry["mechanism"]) == ("link-down", "p0l1-p0s3", "link")
    assert _both_ways(fabric, "p0l1", "p0s3", 20) == (0, 0)
    cleared = CliRunner().invoke(cli.main, ["fault", "clear", "-n", fabric.name])
    assert cleared.exit_code == 0, cleared.output  # clear brings it up
    assert _list(fabric.name) == [] and not fabric.state().down_links
    assert _both_ways(fabric, "p0l1", "p0s3", 20) == (20, 20)
    CliRunner().invoke(cli.main, ["link", "down", "p0l1", "p0s3", "-n", fabric.name])
    assert CliRunner().invoke(cli.main, ["link", "up", "p0l1", "p0s3", "-n", fabric.name]).exit_code == 0
    assert _list(fabric.name) == []


def test_a_scenario_agents_one_way_blackhole_is_recorded_while_in_force(default_fabric):
    """The XDP path of the scenarios: dropped at the receiving end only, in the record until undone."""
    fabric = default_fabric
    found = fabric.topology.links_between("p0l1", "p0s2")
    record_as = fault_agent.RecordAs("blackhole", "p0s2->p0l1", {}, "scenario test (mrc)")
    with fault_agent.LinkFaultAgent(fabric, found, "p0l1", drops=True, direction=("p0s2", "p0l1"),
                                    record_as=record_as) as agent:
        assert _both_ways(fabric, "p0l1", "p0s2") == (200, 200)  # attached at fraction 0: nothing dropped
        agent.trigger(fault_agent.Drop(1.0))
        agent.wait()
        (entry,) = _list(fabric.name)
        assert (entry["kind"], entry["target"], entry["mechanism"], entry["by"]) == (
            "blackhole", "p0s2->p0l1", "xdp", "scenario test (mrc)")
        assert entry["owner_alive"]
        assert _both_ways(fabric, "p0l1", "p0s2") == (200, 0)
        agent.trigger(fault_agent.DropOff())
        agent.wait()
        assert _list(fabric.name) == []
        assert _both_ways(fabric, "p0l1", "p0s2") == (200, 200)


def _shaped(name: str) -> Fabric:
    data = builtin().to_dict()
    data.update(name="default-20m", link_rate="20mbit")  # slow enough that one EV fills it on a busy machine
    build.up(from_dict(data), name)
    return Fabric.open(name)


def _least_rtt_ms(fabric: Fabric, ev: int, probes: int = 5) -> float:
    """The least RTT of `probes` EV probes from h0 towards h2 along EV `ev`: a late wake-up of the
    prober (a loaded host, a VM under TCG) only ever adds to one probe's time, while a netem delay
    is in every one of them."""
    from mrc_emu.experiments.runtime.probes import probe_evs

    rtts = []
    for _ in range(probes):
        (result,) = probe_evs(fabric, "h0", "h2", [ev], timeout=2.0)
        assert result.reachable
        rtts.append(result.rtt_ns / 1e6)
    return min(rtts)


def _netem_base_ms(fabric: Fabric, ev: int) -> float:
    """The RTT to measure a delay against: the least of ten probes with a 1 us delay in force on
    p0l0-p0s1, so that the path passes a netem at the same ports as under the delay under test. A
    netem queue ends the sender's run of in-kernel forwarding, which alone took 0.25 ms off the
    RTT in the Vagrant VM (least of ten: 2.00 ms without a netem, 1.75 ms with one of 1 us)."""
    fault_ops.delay(fabric, "p0l0", "p0s1", 0.001)
    try:
        return _least_rtt_ms(fabric, ev, probes=10)
    finally:
        fault_ops.clear(fabric)


def _tbf_rate(fabric: Fabric, node: str, intf: str) -> int:
    from pyroute2 import IPRoute

    with netns.entered(fabric.node_path(node)), IPRoute() as ipr:
        (index,) = ipr.link_lookup(ifname=intf)
        root = impair._root(ipr, index)
        return root.get_attr("TCA_OPTIONS").get_attr("TCA_TBF_PARMS")["rate"]


@pytest.mark.slow
def test_degrade_lowers_the_goodput_over_that_link_and_clear_restores_it(fabric_name, at_a_dilation_that_keeps_up):
    with _shaped(fabric_name) as fabric:
        topo = fabric.topology
        (link,) = topo.links_between("p0l0", "p0s1")
        ev = next(e.index for e in evs_between(topo, "h0", "h2") if e.crosses("p0l0", "p0s1"))
        # the 20 Mbit/s link, not the emulator, must be what limits the goodput: all three runs under
        # the first time dilation at which the emulator kept up and the flow filled half the link
        # (K = 1 here; more in a VM under TCG)
        link_limits = fabric_limited(20e6, share=0.5)
        before, k = at_a_dilation_that_keeps_up(lambda k: send(fabric, "h0", "h2", MiB, evs=[ev], dilation=k),
                                                (1, 4, 16, 64), good=link_limits)
        entry = fault_ops.degrade(fabric, "p0l0", "p0s1", 0.25)
        assert {_tbf_rate(fabric, n, i) for n, i in ((link.a, link.a_intf), (link.b, link.b_intf))} == {625_000}
        index = ports._indexes(topo)[(link.b, link.b_intf)]  # the spine's port towards the leaf: the program's
        assert ports._CFG.unpack(ports._maps_of(fabric).cfg.get(index))[0] == 625_000
        (listed,) = _list(fabric.name)
        assert (listed["kind"], listed["params"]["rate"], listed["id"]) == ("degrade", 0.25, entry.id)
        during = send(fabric, "h0", "h2", MiB, evs=[ev], dilation=k)
        # a run under time dilation reshapes every port to rate / K and back: the degrade stays
        assert send(fabric, "h0", "h2", MiB // 16, evs=[ev], dilation=2).verified
        assert _tbf_rate(fabric, link.a, link.a_intf) == 625_000
        fault_ops.clear(fabric, "p0l0", "p0s1")
        assert _tbf_rate(fabric, link.a, link.a_intf) == 2_500_000 and _list(fabric.name) == []
        assert ports._CFG.unpack(ports._maps_of(fabric).cfg.get(index))[0] == 2_500_000
        after = send(fabric, "h0", "h2", MiB, evs=[ev], dilation=k)
    build.down(fabric_name)
    rates = [r.goodput_gbps for r in (before, during, after)]
    print(f"\ngoodput over p0l0-p0s1 (Gbit/s, time dilation {k}): before {rates[0]}, degraded to 25 % {rates[1]}, "
          f"cleared {rates[2]}")
    assert all(r.verified for r in (before, during, after))
    assert rates[1] < 0.00625 and rates[1] < 0.5 * min(rates[0], rates[2]), rates  # 5 Mbit/s of 20


def test_delay_without_netem_is_one_clear_line_and_touches_nothing(default_fabric):
    if impair.netem_missing() is None:
        pytest.skip("this kernel has netem: the delay test below runs instead")
    done = subprocess.run(CLI + ["fault", "delay", "p0l0", "p0s1", "--ms", "5", "-n", default_fabric.name],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert "sch_netem" in done.stderr and "delay" in done.stderr
    assert _list(default_fabric.name) == [] and not FaultRecord(default_fabric).path.exists()


@pytest.mark.skipif(impair.netem_missing() is not None, reason=str(impair.netem_missing()))
def test_delay_adds_its_milliseconds_each_way_until_cleared(default_fabric):

    fabric = default_fabric
    ev = next(e.index for e in evs_between(fabric.topology, "h0", "h2") if e.crosses("p0l0", "p0s1"))

    def rtt_ms() -> float:
        return _least_rtt_ms(fabric, ev)

    base = _netem_base_ms(fabric, ev)
    fault_ops.delay(fabric, "p0l0", "p0s1", 5)
    (listed,) = _list(fabric.name)
    assert (listed["kind"], listed["params"]) == ("delay", {"ms": 5.0})
    assert 10 <= rtt_ms() - base < 20  # out and back over the link: 5 ms each way
    fault_ops.clear(fabric)
    one_way = fault_ops.delay(fabric, "p0l0", "p0s1", 5, ("p0l0", "p0s1"))
    assert 5 <= rtt_ms() - base < 10 and [node for node, _ in one_way.ends] == ["p0l0"]  # its sending end
    fault_ops.clear(fabric)
    assert rtt_ms() - base < 2 and _list(fabric.name) == []


@pytest.mark.slow
def test_the_gray_failure_scenario_runs_and_fault_list_shows_each_fault_in_force(tmp_path):
    scn = scenario.load("gray-failure")
    names: list[str] = []
    seen: dict[str, dict] = {}
    box: dict = {}

    def progress(message: str) -> None:
        if message.startswith("bringing up fabric '"):
            names.append(message.split("'")[1])

    def target() -> None:
        try:
            box["results"] = runner.run(scn, tmp_path / "out", progress)
        except BaseException as exc:  # surfaced by the test thread
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    wanted = {f.kind for f in scn.faults if f.unavailable() is None}

    def all_seen() -> bool:
        if names and "error" not in box:
            try:
                for entry in _list(names[0]):
                    seen.setdefault(entry["kind"], entry)
            except (AssertionError, json.JSONDecodeError):
                pass  # the fabric is not up yet, or gone
        return wanted <= set(seen) or not thread.is_alive()

    wait_for(all_seen, timeout=120, what=f"fault list to show {sorted(wanted)}")
    thread.join(timeout=120)
    assert "error" not in box, box.get("error")
    assert wanted <= set(seen), seen
    assert seen["degrade"]["target"] == "p0l1-p0s0" and seen["degrade"]["params"] == {"rate": 0.25}
    assert seen["blackhole"]["target"] == "p1l1->p1s0" and seen["blackhole"]["mechanism"] == "xdp"
    assert all(e["by"] == "scenario gray-failure (mrc)" for e in seen.values())
    run = box["results"]["runs"]["mrc"]
    assert run["verified"], [t["error"] for t in run["transfers"]]
    kinds = {f["kind"]: f for f in run["faults"]}
    assert [e["action"] for e in kinds["degrade"]["events"]] == ["rate:0.25", "rate:1"]
    assert [e["action"] for e in kinds["blackhole"]["events"]] == ["xdp:1", "xdp-off"]
    assert kinds["blackhole"]["direction"] == "p1l1->p1s0"
    reason = impair.netem_missing()
    if reason:  # skipped, said so, and the rest ran
        assert kinds["delay"]["skipped"] == reason and kinds["delay"]["events"] == []
        assert any("skipped" in n and "sch_netem" in n for n in box["results"]["notes"])
    else:
        assert [e["action"] for e in kinds["delay"]["events"]] == ["delay:5ms", "delay-off"]
    bad = {e["ev"] for t in run["transfers"] for e in t["ev_events"] if e["new"] == "ASSUMED_BAD"}
    assert bad, "the one-way blackhole marked no EV ASSUMED_BAD"


def test_fault_clear_undoes_what_a_killed_agent_left(default_fabric):
    """Crash safety: an agent killed with its blackhole in force leaves the program attached and the
    fault recorded; `fault list` still shows it and `fault clear` detaches it."""
    fabric = default_fabric
    found = fabric.topology.links_between("p0l0", "p0s3")
    agent = fault_agent.LinkFaultAgent(fabric, found, "p0l0", drops=True,
                                       record_as=fault_agent.RecordAs("blackhole", "p0l0-p0s3", {}, "scenario killed"))
    try:
        agent.trigger(fault_agent.Drop(1.0))
        agent.wait()
        agent._child.proc.kill()
        agent._child.proc.join()
    finally:
        agent.close()
    (entry,) = _list(fabric.name)
    assert entry["by"] == "scenario killed" and entry["mechanism"] == "xdp" and entry["ends"]
    assert _both_ways(fabric, "p0l0", "p0s3", 50) == (0, 0)  # still dropping, both ways
    result = CliRunner().invoke(cli.main, ["fault", "clear", "all", "-n", fabric.name])
    assert result.exit_code == 0 and "cleared 1 fault" in result.output, result.output
    assert _list(fabric.name) == [] and _both_ways(fabric, "p0l0", "p0s3", 50) == (50, 50)


@pytest.mark.skipif(impair.netem_missing() is not None, reason=str(impair.netem_missing()))
def test_delay_on_a_shaped_port_sits_under_its_tbf_with_a_degrade_beside_it(fabric_name):
    from pyroute2 import IPRoute


    def tree(fabric: Fabric, node: str, intf: str) -> list[tuple[str, int]]:
        with netns.entered(fabric.node_path(node)), IPRoute() as ipr:
            (index,) = ipr.link_lookup(ifname=intf)
            return [(q.get_attr("TCA_KIND"), q["parent"]) for q in ipr.get_qdiscs(index=index)
                    if q.get_attr("TCA_KIND") != "clsact"]

    with _shaped(fabric_name) as fabric:
        (link,) = fabric.topology.links_between("p0l0", "p0s1")
        ev = next(e.index for e in evs_between(fabric.topology, "h0", "h2") if e.crosses("p0l0", "p0s1"))
        plain = sorted(tree(fabric, link.a, link.a_intf))
        base = _netem_base_ms(fabric, ev)
        # TBF 1: at the root, the HTB 2: under it that sends control ahead of data, a pfifo per class
        assert plain == sorted([("tbf", impair.TC_H_ROOT), ("htb", ports.TBF_HANDLE | 1),
                                ("pfifo", ports.CLASS_AHEAD), ("pfifo", ports.CLASS_DATA)])
        fault_ops.delay(fabric, "p0l0", "p0s1", 5)
        fault_ops.degrade(fabric, "p0l0", "p0s1", 0.25)
        # the delay in place of each class's pfifo: under the TBF, so a packet waits and then for tokens
        assert sorted(tree(fabric, link.a, link.a_intf)) == sorted([
            ("tbf", impair.TC_H_ROOT), ("htb", ports.TBF_HANDLE | 1), ("netem", ports.CLASS_AHEAD), ("netem", ports.CLASS_DATA)])
        assert _tbf_rate(fabric, link.a, link.a_intf) == 625_000
        assert 10 <= _least_rtt_ms(fabric, ev) - base < 25
        assert {e["kind"] for e in _list(fabric.name)} == {"delay", "degrade"}
        fault_ops.clear(fabric)
        assert sorted(tree(fabric, link.a, link.a_intf)) == plain
        assert _tbf_rate(fabric, link.a, link.a_intf) == 2_500_000 and _list(fabric.name) == []
        assert _least_rtt_ms(fabric, ev) - base < 2
    build.down(fabric_name)
