"""Faults without root: the scenario syntax of degrade, delay and directions, the fault record, the
netem request a delay would send, which end of a link each fault acts on, the CLI's errors."""

from __future__ import annotations

import struct

import pytest
from click.testing import CliRunner
from pyroute2.netlink.rtnl.tcmsg import tcmsg

from mrc_emu import cli
from mrc_emu.experiments.runtime import fault_agent
from mrc_emu.experiments.scenarios import runner, scenario
from mrc_emu.experiments.scenarios.faults import FAULT_KINDS, parse_direction
from mrc_emu.experiments.scenarios.scenario import ScenarioError
from mrc_emu.fabric import registry
from mrc_emu.fabric.datapath import impair
from mrc_emu.fabric.faults import fault_ops, fault_record
from mrc_emu.fabric.nodes import FabricSetupError
from mrc_emu.fabric.running import Fabric
from mrc_emu.topology import builtin


@pytest.fixture
def state_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(registry, "STATE_DIR", tmp_path / "state")
    return tmp_path / "state"


def _fabric(name: str, topology: str = "default") -> Fabric:
    """A fabric handle with a journal and no namespaces: enough for the record and for refusals."""
    topo = builtin(topology)
    return Fabric(name, topo, registry.Journal.create(name, {"topology": topo.to_dict(), "source": topo.source}))


def test_direction_parses_along_the_link_only():
    assert parse_direction("p0l0->p0s1", ("p0l0", "p0s1")) == ("p0l0", "p0s1")
    assert parse_direction("p0s1 -> p0l0", ("p0l0", "p0s1")) == ("p0s1", "p0l0")
    for bad in ("p0l0-p0s1", "p0l0->p0s2", "p0l0->p0l0", 3, "a->b->c"):
        with pytest.raises(ValueError, match="p0l0->p0s1 or p0s1->p0l0"):
            parse_direction(bad, ("p0l0", "p0s1"))


def test_the_new_kinds_in_a_scenario(tmp_path):
    path = tmp_path / "gray.yaml"
    path.write_text("""topology: incast
transports: [mrc]
routing: none
workloads:
  - {kind: write, src: h4, dst: h0, size: 1MiB}
faults:
  - {kind: degrade, link: [p0l0, p0s0], rate: 0.25, at: 0.3}
  - {kind: delay, link: [p0l1, p0s0], ms: 5, at: 0.3, direction: p0s0->p0l1}
  - {kind: blackhole, link: [p1l1, p1s1], direction: p1l1->p1s1, at: 0.5}
  - {kind: loss, link: [p1l1, p1s0], percent: 5, direction: p1s0->p1l1}
""")
    degrade, delay, blackhole, loss = scenario.load(path).faults
    assert (degrade.kind, degrade.rate, degrade.direction) == ("degrade", 0.25, None)
    assert (delay.ms, delay.direction) == (5.0, ("p0s0", "p0l1"))
    assert blackhole.direction == ("p1l1", "p1s1") and loss.direction == ("p1s0", "p1l1")
    assert degrade.describe() == "degrade to 25% p0l0-p0s0 at 30%"
    assert delay.describe() == "delay +5 ms p0s0->p0l1 at 30%"
    assert blackhole.describe() == "blackhole p1l1->p1s1 at 50%"
    # the agent's actions: a degrade at its fraction under the run's dilation, back at 1; a delay of 5 emulated
    # ms is netem's 20 in wall time at K = 4, and labelled with the 5 the scenario asked for
    assert degrade.apply(4.0) == fault_agent.Reshape(0.25, 4.0) and degrade.revert() == fault_agent.Reshape(1.0, 1.0)
    assert delay.apply(4.0) == fault_agent.Delay(5.0, 4.0) and delay.revert() == fault_agent.DelayOff()
    assert (delay.apply(4.0).wall_ms, delay.apply(4.0).label) == (20.0, "delay:5ms")
    assert degrade.params() == {"rate": 0.25} and delay.params() == {"ms": 5.0}
    assert degrade.apply().label != degrade.revert().label  # the runner tells an applied fault from a reverted one


W = "workloads:\n  - {kind: write, src: h1, dst: h0}\nfaults:\n  - "


@pytest.mark.parametrize("topology, fault, field, words", [
    ("incast", "{kind: degrade, link: [p0l0, p0s0]}", "faults[0].rate", "needs rate: 0.25"),
    ("incast", "{kind: degrade, link: [p0l0, p0s0], rate: 1.5}", "faults[0].rate", "fraction of the link's rate"),
    ("incast", "{kind: degrade, link: [p0l0, p0s0], rate: 0}", "faults[0].rate", "in (0, 1)"),
    ("default", "{kind: degrade, link: [p0l0, p0s0], rate: 0.5}", "faults[0].kind", "no link_rate"),
    ("incast", "{kind: delay, link: [p0l0, p0s0]}", "faults[0].ms", "needs ms: 5"),
    ("incast", "{kind: delay, link: [p0l0, p0s0], ms: -1}", "faults[0].ms", "milliseconds"),
    ("incast", "{kind: loss, link: [p0l0, p0s0], percent: 5, ms: 3}", "faults[0].ms", "only a delay"),
    ("incast", "{kind: blackhole, link: [p0l0, p0s0], rate: 0.5}", "faults[0].rate", "only a degrade"),
    ("incast", "{kind: link-down, link: [p0l0, p0s0], direction: p0l0->p0s0}", "faults[0].direction",
     "only loss, blackhole, degrade, delay take a direction"),
    ("incast", "{kind: blackhole, link: [p0l0, p0s0], direction: p0l0->p0s1}", "faults[0].direction",
     "not along the link"),
    ("incast", "{kind: blackhole, link: [p0l0, p0s0], direction: p0l0}", "faults[0].direction", "give 'A->B'"),
])
def test_bad_new_faults_name_the_field(tmp_path, topology, fault, field, words):
    path = tmp_path / "bad.yaml"
    path.write_text(f"topology: {topology}\ntransports: [mrc]\nrouting: none\n{W}{fault}\n")
    with pytest.raises(ScenarioError) as err:
        scenario.load(path)
    message = str(err.value)
    assert str(path) in message and f"field '{field}'" in message and words in message and "line" in message


def test_a_direction_needs_named_nodes(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("topology: default\n" + W
                    + "{kind: blackhole, link: baseline-path, direction: p0l0->p0s0}\n")
    with pytest.raises(ScenarioError, match=r"field 'faults\[0\].direction'.*needs link: \[A, B\]"):
        scenario.load(path)


def test_the_shipped_gray_failure_scenario_loads():
    scn = scenario.load("gray-failure")
    kinds = {f.kind: f for f in scn.faults}
    assert {"degrade", "delay", "blackhole"} <= set(kinds) and kinds["blackhole"].direction is not None
    assert scn.topology.link_rate_bps


def test_a_fault_this_kernel_cannot_carry_out_is_skipped_with_its_reason(monkeypatch, tmp_path):
    scn = scenario.load("gray-failure")
    monkeypatch.setattr(impair, "netem_missing", lambda: "this kernel has no netem (module sch_netem, ...)")
    skipped = runner.skipped_faults(scn)
    assert [scn.faults[i].kind for i in skipped] == ["delay"] and "sch_netem" in next(iter(skipped.values()))
    monkeypatch.setattr(impair, "netem_missing", lambda: None)
    assert runner.skipped_faults(scn) == {}


def test_the_ends_each_fault_acts_on():
    topo = builtin()
    (link,) = topo.links_between("p0l0", "p0s1")
    a_end, b_end = (link.a, link.a_intf), (link.b, link.b_intf)
    assert fault_ops.ends([link], None, receiving=True) == [a_end, b_end]
    # p0l0->p0s1: dropped as it arrives at p0s1; degraded or delayed as it leaves p0l0
    towards_b = (link.a, link.b)
    assert fault_ops.ends([link], towards_b, receiving=True) == [b_end]
    assert fault_ops.ends([link], towards_b, receiving=False) == [a_end]
    assert fault_ops.ends([link], (link.b, link.a), receiving=True) == [a_end]


def test_netem_request_is_what_the_kernel_reads():
    """The message a delay sends, read back by pyroute2's decoder: netem under the given parent with
    our handle, the latency in 64 ns psched ticks (5 ms = 78,125) and exact in TCA_NETEM_LATENCY64."""
    batch = impair.QdiscBatch()
    batch.netem(7, 0x80010001, 5_000_000)
    (raw,) = batch.messages()
    msg = tcmsg(raw)
    msg.decode()
    assert msg["header"]["type"] == impair.RTM_NEWQDISC and msg["header"]["flags"] == 0x1 | 0x4 | 0x400 | 0x100
    assert (msg["index"], msg["handle"], msg["parent"], msg.get_attr("TCA_KIND")) == (7, impair.NETEM_HANDLE,
                                                                                      0x80010001, "netem")
    options = msg.get_attr("TCA_OPTIONS")
    assert (options["delay"], options["limit"], options["loss"], options["jitter"]) == (78125, impair.NETEM_LIMIT, 0, 0)
    latency64 = struct.pack("=HHq", 12, impair.TCA_NETEM_LATENCY64, 5_000_000)
    assert raw.endswith(latency64)
    # undoing it on a shaped port puts TBF's own default child back: a bfifo of the TBF's limit
    batch = impair.QdiscBatch()
    batch.bfifo(7, 0x80010001, 6_375_000)
    back = tcmsg(batch.messages()[0])
    back.decode()
    assert back.get_attr("TCA_KIND") == "bfifo" and back["parent"] == 0x80010001
    assert batch.messages()[0].endswith(struct.pack("=HHI", 8, 2, 6_375_000))


def test_the_record_replays_what_is_in_force(state_dir):
    fabric = _fabric("fr")
    record = fault_record.FaultRecord(fabric)
    assert record.active() == []
    one = record.add(fault_record.Entry.new("degrade", "p0l0-p0s1", fault_record.TBF, [("p0l0", "eth3")], [5],
                                            {"rate": 0.25}, "cli", undo={"rate_bps": 1e9}))
    two = record.add(fault_record.Entry.new("blackhole", "p0l0->p0s1", fault_record.NFT, [("p0s1", "eth0")], [5]))
    three = record.add(fault_record.Entry.new("link-down", "p1l0-p1s0", fault_record.LINK, [], [9], by="scenario x"))
    record.clear(two.id)
    assert [e.id for e in record.active()] == [one.id, three.id]
    assert record.active()[0] == one and one.owner_alive()  # this process applied it
    assert one.describe() == "degrade p0l0-p0s1 (rate 0.25)" and two.describe() == "blackhole p0l0->p0s1"
    shown = fault_record.Entry.new("degrade", "x-y", fault_record.TBF, [], [], {"rate": 0.25, "rate_bps": 1e8})
    assert shown.params_text() == "rate 0.25 (100 Mbit/s)"
    assert [e.id for e in record.on_links({9})] == [three.id]
    with open(record.path, "a") as f:
        f.write('{"op": "add", "entry": {"id"')  # a write cut short by a kill
    assert [e.id for e in fault_record.FaultRecord(fabric).active()] == [one.id, three.id]
    # the record's directory is in the journal before it exists, so down and clean remove it
    assert str(record.directory) in registry.read("fr").directories
    fabric.close()
    registry.remove("fr")
    assert not record.directory.exists()


def test_refusals_before_anything_is_touched(state_dir, monkeypatch):
    unshaped = _fabric("fu")
    with pytest.raises(FabricSetupError, match="a degrade needs a link rate: topology default has no link_rate"):
        fault_ops.degrade(unshaped, "p0l0", "p0s1", 0.25)
    with pytest.raises(ValueError, match=r"in \(0, 1\)"):
        fault_ops.degrade(unshaped, "p0l0", "p0s1", 1.0)
    monkeypatch.setattr(impair, "netem_missing", lambda: "this kernel has no netem (module sch_netem)")
    with pytest.raises(impair.NetemMissing, match="sch_netem"):
        fault_ops.delay(unshaped, "p0l0", "p0s1", 5)
    assert fault_record.FaultRecord(unshaped).active() == []  # nothing recorded, nothing made
    # a second fault of one mechanism on the same end is refused, naming the first
    shaped = _fabric("fs", "incast")
    (link,) = shaped.topology.links_between("p0l0", "p0s0")
    fault_record.FaultRecord(shaped).add(fault_record.Entry.new(
        "degrade", "p0l0-p0s0", fault_record.TBF, [(link.a, link.a_intf), (link.b, link.b_intf)], [link.link_id],
        {"rate": 0.5}))
    with pytest.raises(FabricSetupError, match=r"p0l0->p0s0 already has a degrade in force .*by cli"):
        fault_ops.degrade(shaped, "p0l0", "p0s0", 0.25, ("p0l0", "p0s0"))
    with pytest.raises(FabricSetupError, match="is not along the link"):
        fault_ops.drop(shaped, "p0l0", "p0s0", 100, ("p0l0", "p0s1"))


def _cli(*args):
    return CliRunner().invoke(cli.main, list(args))


@pytest.mark.parametrize("command", [["fault"], ["fault", "degrade"], ["fault", "delay"], ["fault", "blackhole"],
                                     ["fault", "loss"], ["fault", "list"], ["fault", "clear"]])
def test_fault_commands_have_help(command):
    result = _cli(*command, "--help")
    assert result.exit_code == 0 and "Usage:" in result.output


def test_fault_commands_on_no_fabric_and_bad_arguments(state_dir):
    for args in (["fault", "list", "-n", "nofab"], ["fault", "degrade", "p0l0", "p0s1", "--rate", "0.5", "-n", "nofab"],
                 ["fault", "clear", "all", "-n", "nofab"]):
        result = _cli(*args)
        assert result.exit_code == 1 and "no fabric named 'nofab'" in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1
    assert _cli("fault", "clear", "p0l0", "-n", "nofab").exit_code == 2  # one node is no link
    result = _cli("fault", "blackhole", "p0l0", "p0s1", "--direction", "p0l0->h0", "-n", "nofab")
    assert result.exit_code == 2 and "not along the link" in result.output
    result = _cli("fault", "blackhole", "p0l0", "p0s1", "--direction", "p0l0-", "-n", "nofab")  # `p0l0->p0s1` unquoted
    assert result.exit_code == 2 and "quote it" in result.output
    result = _cli("fault", "loss", "p0l0", "p0s1", "--percent", "5", "--one-way", "--direction", "p0l0->p0s1")
    assert result.exit_code == 2 and "not both" in result.output


def test_every_kind_is_documented_in_the_scenario_docstring():
    for kind in FAULT_KINDS:
        assert f"kind: {kind}" in scenario.__doc__


class _Qdisc(dict):
    """A qdisc as pyroute2 dumps it: parent and handle by key, kind and options by attribute."""

    def __init__(self, kind: str, handle: int, parent: int, limit: int | None = None) -> None:
        super().__init__(handle=handle, parent=parent)
        self.kind, self.limit = kind, limit

    def get_attr(self, name: str):
        if name == "TCA_KIND":
            return self.kind
        return _Options({"TCA_TBF_PARMS": {"limit": self.limit}})


class _Options(dict):
    def get_attr(self, name: str):
        return self[name]


class _Ipr:
    def __init__(self, *qdiscs: _Qdisc) -> None:
        self.qdiscs = list(qdiscs)

    def get_qdiscs(self, index: int):
        return self.qdiscs


def _sent(batch: impair.QdiscBatch) -> list[tuple[int, str, int]]:
    out = []
    for raw in batch.messages():
        msg = tcmsg(raw)
        msg.decode()
        out.append((msg["header"]["type"], msg.get_attr("TCA_KIND"), msg["parent"]))
    return out


def test_where_a_delay_goes_in_a_ports_qdiscs_and_how_it_comes_off():
    root, tbf = impair.TC_H_ROOT, 0x80010000
    new, delete = impair.RTM_NEWQDISC, impair.RTM_DELQDISC
    # unshaped (veth's noqueue): netem at the root; off: the root deleted, the kernel's default back
    assert _sent(impair.delay_batch(_Ipr(_Qdisc("noqueue", 0, root)), 3, 5_000_000)) == [(new, "netem", root)]
    assert _sent(impair.delay_batch(_Ipr(), 3, 5_000_000)) == [(new, "netem", root)]
    netem_root = _Qdisc("netem", impair.NETEM_HANDLE, root)
    assert _sent(impair.undelay_batch(_Ipr(netem_root), 3)) == [(delete, None, root)]
    # shaped: under the TBF's one class; off: a bfifo of the TBF's limit, the child TBF makes itself
    shaped = _Ipr(_Qdisc("tbf", tbf, root, limit=6_375_000))
    assert _sent(impair.delay_batch(shaped, 3, 5_000_000)) == [(new, "netem", tbf | 1)]
    assert _sent(impair.undelay_batch(shaped, 3)) == []  # nothing to take off
    delayed = _Ipr(_Qdisc("tbf", tbf, root, limit=6_375_000), _Qdisc("netem", impair.NETEM_HANDLE, tbf | 1))
    (off,) = impair.undelay_batch(delayed, 3).messages()
    assert _sent(impair.undelay_batch(delayed, 3)) == [(new, "bfifo", tbf | 1)]
    assert off.endswith(struct.pack("=HHI", 8, 2, 6_375_000))
    with pytest.raises(FabricSetupError, match="cannot add a delay under a htb root"):
        impair.delay_batch(_Ipr(_Qdisc("htb", 0x10000, root)), 3, 5_000_000)


def test_a_delay_on_a_port_that_sends_control_ahead_goes_under_both_of_its_classes():
    """A shaped port with port programs is TBF 1: with the ordering HTB under it (build.py): netem
    replaces each class's pfifo, so control still leaves ahead of data, and undo puts the pfifos back."""
    from mrc_emu.fabric.datapath import ports

    root, tbf, new = impair.TC_H_ROOT, 0x10000, impair.RTM_NEWQDISC
    classes = [ports.CLASS_AHEAD, ports.CLASS_DATA]
    plain = [_Qdisc("tbf", tbf, root, limit=2_550_000), _Qdisc("htb", ports.ORDER_HANDLE, tbf | 1),
             _Qdisc("pfifo", 0x210000, classes[0]), _Qdisc("pfifo", 0x220000, classes[1])]
    batch = impair.delay_batch(_Ipr(*plain), 3, 5_000_000)
    assert _sent(batch) == [(new, "netem", c) for c in classes]
    handles = set()
    for raw in batch.messages():
        msg = tcmsg(raw)
        msg.decode()
        handles.add(msg["handle"])
    assert len(handles) == 2  # two netems on one device need two handles
    assert all(h & 0xFFFF == 0 for h in handles)  # majors: the kernel refuses a qdisc handle with a minor
    assert _sent(impair.undelay_batch(_Ipr(*plain), 3)) == []  # no netem: nothing to take off
    delayed = plain[:2] + [_Qdisc("netem", impair.NETEM_HANDLE + (1 << 16), classes[0]),
                           _Qdisc("netem", impair.NETEM_HANDLE + (2 << 16), classes[1])]
    off = impair.undelay_batch(_Ipr(*delayed), 3)
    assert _sent(off) == [(new, "pfifo", c) for c in classes]
    assert all(m.endswith(struct.pack("=HHI", 8, 2, max(1000, 2_550_000 // 256))) for m in off.messages())


def test_a_faults_durations_are_emulated_time():
    """Under time dilation K a blackhole's duration_ms and a flap's period are emulated: the agent
    is asked for K times as long in wall time (as a delay's ms already are)."""
    from mrc_emu.experiments.runtime.fault_agent import After, Flap
    from mrc_emu.experiments.scenarios import runner
    from mrc_emu.experiments.scenarios.faults import FAULT_KINDS

    class Agent:
        def __init__(self):
            self.asked = []

        def trigger(self, action):
            self.asked.append(action)

    agent = Agent()
    runner._trigger(agent, FAULT_KINDS["blackhole"](at=0.3, link=("p0l0", "p0s1"), duration_ms=3000), 3.0)()
    (after,) = [a for a in agent.asked if isinstance(a, After)]
    assert after.ms == 9000
    agent = Agent()
    runner._trigger(agent, FAULT_KINDS["flap"](at=0.3, link=("p0l0", "p0s1"), period_ms=100, count=3), 2.0)()
    (flap,) = agent.asked
    assert isinstance(flap, Flap) and flap.period_ms == 200 and flap.count == 3
