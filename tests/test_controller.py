"""The controller record (experiments/runtime/controller.py): selectors, replay, live diffs, the event queue (no root)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from mrc_emu.experiments.runtime import controller
from mrc_emu.experiments.runtime.controller import ControlRecord, LiveControl, Selector
from mrc_emu.fabric import registry
from mrc_emu.topology import builtin, evs_between


@pytest.fixture
def record(tmp_path, monkeypatch):
    monkeypatch.setattr(registry, "STATE_DIR", tmp_path)
    journaled = []
    fabric = SimpleNamespace(name="t1", topology=builtin(), journal=SimpleNamespace(directory=journaled.append))
    rec = ControlRecord(fabric)
    rec.journaled = journaled
    return rec


def test_selectors_match_the_evs_through_what_they_name():
    topo = builtin()
    evs = evs_between(topo, "h0", "h2")
    assert [e.index for e in evs if Selector(node="p0s1").matches(e)] == [1]
    assert [e.index for e in evs if Selector(node="p1l0").matches(e)] == [4, 5, 6, 7]
    assert [e.index for e in evs if Selector(link=("p0s2", "p0l0")).matches(e)] == [2]
    assert [e.index for e in evs if Selector(plane=0).matches(e)] == [0, 1, 2, 3]
    assert [e.index for e in evs if Selector(ev=("h0", "h2", 6)).matches(e)] == [6]
    assert not any(Selector(ev=("h1", "h2", 6)).matches(e) for e in evs)


@pytest.mark.parametrize("selector, problem", [
    (Selector(node="h0"), "is a host"),
    (Selector(node="p9s9"), "p9s9"),
    (Selector(link=("p0s0", "p0s1")), "no link between p0s0 and p0s1"),
    (Selector(plane=2), "planes 0..1"),
    (Selector(ev=("h0", "h2", 8)), "EVs 0..7"),
])
def test_a_selector_naming_what_the_fabric_lacks_is_refused(record, selector, problem):
    with pytest.raises(ValueError, match=problem):
        record.deny(selector)
    assert record.size() == 0  # nothing written


def test_the_latest_matching_rule_decides_and_allow_lifts_what_covers(record):
    topo = record.fabric.topology
    ev1, ev5 = evs_between(topo, "h0", "h2")[1], evs_between(topo, "h0", "h2")[5]
    record.deny(Selector(node="p0s1"), by="op")
    record.deny(Selector(plane=1))
    state = record.state()
    assert state.denied_by(ev1) == "p0s1 (by op)" and state.denied_by(ev5) == "plane 1 (by cli)"
    record.allow(Selector(ev=("h0", "h2", 5)))
    state = record.state()
    assert state.denied_by(ev5) is None and state.denied_by(evs_between(topo, "h0", "h2")[6]) == "plane 1 (by cli)"
    assert state.denied_by(evs_between(topo, "h0", "h3")[5]) == "plane 1 (by cli)"  # only that pair's EV 5 was allowed
    record.allow(Selector(plane=0))
    assert record.state().denied_by(ev1) is None
    assert record.journaled == [controller.directory("t1")]  # the directory is journaled once, before it exists


def test_ports_and_a_cut_line_are_replayed(record):
    record.set_port("h0", 1, False)
    with pytest.raises(ValueError, match="not a host"):
        record.set_port("p0s1", 0, False)
    with pytest.raises(ValueError, match="ports 1..2"):
        record.set_port("h0", 2, False)
    with open(record.path, "a") as f:
        f.write('{"op": "deny", "sel": {"node"')  # a line a kill cut short
    state = record.state()
    assert not state.port_enabled("h0", 1) and state.port_enabled("h0", 0) and state.rules == []


def test_live_control_sends_only_changes_and_only_when_the_record_grew(record):
    topo = record.fabric.topology
    live = LiveControl(record, {0: ("h0", {e.index: e for e in evs_between(topo, "h0", "h2")}),
                                1: ("h1", {e.index: e for e in evs_between(topo, "h1", "h3")})})
    assert live.changes() == ([], {})
    record.deny(Selector(node="p0s1"))
    evs, _ = live.changes()
    assert evs == [(0, "h0", (1,), (), "p0s1 (by cli)"), (1, "h1", (1,), (), "p0s1 (by cli)")]
    assert live.changes() == ([], {})  # nothing new
    record.set_port("h0", 1, False)
    evs, ports = live.changes()
    assert evs == [] and ports == {"h0": 0b010}  # a port is no deny: h0's endpoint gets its mask (port 1 only)
    record.set_port("h3", 0, False)  # a host with no QP of the run here: nothing to tell
    record.allow(Selector(node="p0s1"))
    record.set_port("h0", 1, True)
    evs, ports = live.changes()
    assert evs == [(0, "h0", (), (1,), "allowed"), (1, "h1", (), (1,), "allowed")]
    assert ports == {"h0": 0b110}


def test_event_queue_polls_in_order_counts_drops_and_forgets_what_was_taken(record, monkeypatch):
    monkeypatch.setattr(ControlRecord, "MAX_EVENTS", 3)
    record.post_events("h0", [{"ev": i, "state": "ASSUMED_BAD"} for i in range(5)])
    events, dropped = record.poll("h0", 2)
    assert [e["ev"] for e in events] == [2, 3] and dropped == 2
    events, dropped = record.poll("h0", 10)
    assert [e["ev"] for e in events] == [4] and dropped == 0
    assert record.poll("h0", 10) == ([], 0) and record.poll("h1", 10) == ([], 0)


def test_run_events_are_queued_from_the_hosts_controllers(record):
    final = SimpleNamespace(ev_queues={
        "h0": ([{"profile_id": 3, "peer": "fc00:2:1:0::1", "ev": 1, "value": "c001", "port": 1, "state": "ASSUMED_BAD"},
                {"profile_id": 3, "peer": "fc00:2:1:0::1", "ev": 1, "value": "c001", "port": 1, "state": "GOOD"}], 2),
        "h1": ([], 0)})
    controller.post_run_events(record, [final, SimpleNamespace()], {"fc00:2:1:0::1": "h2"})
    events, dropped = record.poll("h0", 10)
    assert [(e["dst"], e["state"]) for e in events] == [("h2", "ASSUMED_BAD"), ("h2", "GOOD")]
    assert events[0]["drop_count"] == 2 and record.poll("h1", 10) == ([], 0)


def test_replace_ev_in_the_record_reaches_the_runs_qps_once_and_a_refused_one_is_withdrawn(record):
    """`ev replace` lines: the run's QP from the EV's source to its destination is sent each new value once
    (a reset recorded before the run sends it nothing); one its QP refused is withdrawn from the state, so
    `ev list` and later runs keep the EV's value before it."""
    from mrc_emu.experiments.runtime.worker import Progress

    topo = record.fabric.topology
    record.replace("h0", "h2", 1, None, None)  # a reset before the run: nothing to send
    live = LiveControl(record, {0: ("h0", {e.index: e for e in evs_between(topo, "h0", "h2")}),
                                1: ("h1", {e.index: e for e in evs_between(topo, "h1", "h3")})})
    live.changes()
    assert live.replaces == []
    carrier = bytes.fromhex("fc0000000005000b00060003f0d60000")
    first = record.replace("h0", "h2", 1, carrier, None)
    live.changes()
    (sent,) = live.replaces
    assert sent[:2] == (0, "h0") and (sent[2].ev, sent[2].value, sent[2].port, sent[2].ident) == (1, carrier, None, first)
    live.asked[(0, 1)], live.replaces = first, []
    live.report(Progress({}, {}, ((0, 1, ""),)), {})
    assert record.replaced(first) == [{"key": 0, "error": None}]
    assert [r["value"] for r in record.listing("h0", "h2") if r["ev"] == 1] == [carrier.hex()]
    refused = record.replace("h0", "h2", 1, bytes(16) + carrier, 2)
    live.changes()
    (sent,) = live.replaces
    live.asked[(0, 1)], live.replaces = refused, []
    live.report(Progress({}, {}, ((0, 1, "an SRV6 value needs its outer destination"),)), {})
    assert record.replaced(refused)[0]["error"].startswith("an SRV6 value")
    assert record.state().values[("h0", "h2", 1)][2] == first  # withdrawn: the EV keeps the value before it
    live.changes()
    assert live.replaces == []  # and the run is not sent that again
    with pytest.raises(ValueError, match="EVs 0..7"):
        record.replace("h0", "h2", 8, carrier, None)
    with pytest.raises(ValueError, match="ports 1..2"):
        record.replace("h0", "h2", 1, carrier, 3)
