"""The view without a fabric (no root): a demo run replayed from its results.json, the endpoint's
schema and refusals, the page in headless Chromium where there is one (issue 28).

tests/data/demo-run holds what `mrc-emu run demo` wrote here (without pcaps): results.json and
report.md, whose EV events table says when MRC marked the blackholed EV ASSUMED_BAD."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from pathlib import Path

import browser
import pytest
from click.testing import CliRunner

from mrc_emu import cli
from mrc_emu.topology import builtin, resolve
from mrc_emu.view.actions import Action, ActionError
from mrc_emu.view.model import RateMeter, topology_view
from mrc_emu.view.replay import ReplayError, ReplaySource
from mrc_emu.view.server import Server, View
from mrc_emu.view.stream import read_events

DEMO = Path(__file__).parent / "data" / "demo-run"


def report_events(transport: str) -> list[tuple[float, int, str, str]]:
    """(ms, EV, from, to) of report.md's 'EV events (<transport>)' table."""
    text = (DEMO / "report.md").read_text()
    table = text.split(f"## EV events ({transport})", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| ([\d.]+) \| (\d+) \| (\w+) \| (\w+) \|", table, re.M)
    return [(float(ms), int(ev), old, new) for ms, ev, old, new in rows]


def ev_state(state: dict, ev: int) -> str:
    (transfer,) = state["transfers"]
    return next(e["state"] for e in transfer["evs"] if e["ev"] == ev)


@pytest.fixture(scope="module")
def demo() -> ReplaySource:
    return ReplaySource(DEMO)


def test_the_replay_marks_the_ev_assumed_bad_at_the_time_the_report_gives(demo):
    (when, ev, old, new), = report_events("mrc")
    assert (old, new) == ("GOOD", "ASSUMED_BAD")
    assert ev_state(demo.state("mrc", when - 0.001), ev) == "GOOD"
    at = demo.state("mrc", when)
    assert ev_state(at, ev) == "ASSUMED_BAD"
    assert {e["ev"]: e["state"] for e in at["transfers"][0]["evs"] if e["ev"] != ev} == dict.fromkeys(
        [0, 1, 2, 4, 5, 6, 7], "GOOD")
    assert [(e["run_ms"], e["ev"], e["old"], e["new"]) for e in at["ev_log"]] == [(when, ev, old, new)]
    # the EV is the one over the blackholed link, which the replay shows faulted from the fault's moment on
    (fault,) = demo.results["runs"]["mrc"]["faults"]
    began = fault["events"][0]["began_ms"]
    key = "-".join(fault["link"])
    assert demo.state("mrc", began - 0.001)["links"][key]["state"] == "up"
    assert at["links"][key] == {"state": "faulted", "faults": [{"kind": "blackhole", "target": fault["description"],
                                                                 "by": "scenario"}], "bps": None}
    assert at["transfers"][0]["evs"][ev]["spine"] == fault["link"][1]
    assert sum(v["state"] != "up" for v in at["links"].values()) == 1
    # and the spray moves off it: of what was sent over the 10 ms after, nothing on that EV, the rest on the others
    after = {e["ev"]: e for e in demo.state("mrc", when + 15)["transfers"][0]["evs"]}
    assert after[ev]["share_recent"] == 0 and all(e["share_recent"] > 0.05 for k, e in after.items() if k != ev)


def test_the_replay_follows_the_transfer_from_start_to_completion(demo):
    transfer = demo.results["runs"]["mrc"]["transfers"][0]
    start, end = demo.state("mrc", 0.0)["transfers"][0], demo.state("mrc", demo.duration_ms("mrc"))["transfers"][0]
    assert start["bytes_acked"] == 0 and not start["done"]
    assert end["done"] and end["progress"] == 1.0 and end["bytes_acked"] == transfer["size"]
    assert [round(e["share"], 3) for e in end["evs"]] == [round(e["share"], 3) for e in transfer["per_ev"]]
    middle = demo.state("mrc", 30.0)["transfers"][0]
    assert 0 < middle["progress"] < 1 and middle["goodput_gbps"] > 0
    assert demo.state("baseline", 0.0)["run"] == "baseline"
    with pytest.raises(ReplayError, match="no run 'dcqcn'"):
        demo.state("dcqcn", 0.0)


def test_replay_refuses_what_is_not_a_results_file(tmp_path):
    with pytest.raises(ReplayError, match="no results.json"):
        ReplaySource(tmp_path)
    (tmp_path / "results.json").write_text('{"schema": "other/1"}')
    with pytest.raises(ReplayError, match="not an mrc-emu results.json"):
        ReplaySource(tmp_path)


def test_an_action_request_is_checked_before_anything_is_done():
    assert Action.from_request({"action": "degrade", "link": ["p0l0", "p0s1"]}) == Action("degrade", "p0l0", "p0s1",
                                                                                         rate=0.25)
    assert Action.from_request({"action": "drain", "spine": "p0s1"}).spine == "p0s1"
    for bad, said in [([], "JSON object"), ({"action": "explode", "link": ["a", "b"]}, "a link offers"),
                      ({"action": "down", "link": "p0l0"}, "two nodes"), ({"action": "down", "spine": "p0s1"}, "drain"),
                      ({"action": "degrade", "link": ["a", "b"], "rate": 1.5}, r"in \(0, 1\)"),
                      ({"action": "down"}, "name a")]:
        with pytest.raises(ActionError, match=said):
            Action.from_request(bad)


def test_the_topology_view_has_every_link_and_a_shaped_fabric_its_ports():
    plain = topology_view(builtin())
    assert len(plain["links"]) == 24 and plain["ports"] == [] and plain["planes"] == 2
    shaped = topology_view(resolve("incast"))
    assert shaped["ports"] and all(p["buffer"] > 0 for p in shaped["ports"])


def test_the_rate_meter_takes_the_last_half_second():
    meter = RateMeter(0.5)
    assert meter.rate_bps("x", 0.0, 0) is None
    assert meter.rate_bps("x", 0.25, 1_000) == pytest.approx(32_000)
    for i in range(2, 8):
        rate = meter.rate_bps("x", i * 0.25, i * 1_000 + (i > 4) * 1_000 * (i - 4))
    assert rate == pytest.approx(64_000)  # the last half second doubled its pace


@pytest.fixture(scope="module")
def served(demo):
    server = Server(View(demo), port=0).start()
    yield server.url
    server.stop()


def get(url: str):
    with urllib.request.urlopen(url, timeout=30) as answer:
        return json.load(answer)


def test_the_endpoint_serves_the_replay_and_refuses_actions(served):
    topo = get(f"{served}api/topology")
    assert topo["schema"] == "mrc-emu/view-topology/1" and topo["mode"] == "replay" and topo["read_only"]
    assert set(topo["replay"]) == {"mrc", "baseline"} and topo["replay"]["mrc"]["series"][0]["points"]
    (when, ev, *_), = report_events("mrc")
    state = get(f"{served}api/state?run=mrc&t={when}")
    assert state["schema"] == "mrc-emu/view-state/1" and ev_state(state, ev) == "ASSUMED_BAD"
    request = urllib.request.Request(f"{served}api/action", data=b'{"action": "down", "link": ["p0l0", "p0s1"]}',
                                     method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 403 and "a replay changes nothing" in json.load(refused.value)["error"]
    with urllib.request.urlopen(f"{served}static/vendor/uplot/LICENSE", timeout=30) as licence:
        assert b"MIT License" in licence.read()


def test_the_event_stream_plays_the_replay_to_its_end(served, demo):
    duration = demo.duration_ms("mrc")
    times, ended = [], None
    for event, data in read_events(f"{served}api/events?run=mrc&speed={duration * 2}"):
        if event == "state":
            times.append(data["t_ms"])
        elif event == "end":
            ended = data
            break
    assert times[0] == 0.0 and times == sorted(times) and times[-1] == duration and len(times) >= 5
    assert ended == {"run": "mrc", "t_ms": duration}


def test_the_page_shows_the_replayed_ev_event(served, tmp_path):
    if reason := browser.missing():
        pytest.skip(reason)
    (when, ev, *_), = report_events("mrc")
    before = round(when - 0.001, 3)
    state_of = f"document.querySelector('[data-ev=\"{ev}\"]')?.dataset.evState"
    with browser.Chromium(tmp_path / "profile") as page:
        page.navigate(f"{served}?run=mrc&t={before}")
        page.wait_until(f"window.mrcView?.state?.t_ms === {before}", what="the state just before the event")
        assert page.evaluate(state_of) == "GOOD"
        page.navigate(f"{served}?run=mrc&t={when}")
        page.wait_until(f"window.mrcView?.state?.t_ms === {when}", what="the state at the event")
        assert page.evaluate(state_of) == "ASSUMED_BAD"
        row = page.evaluate("[...document.querySelectorAll('#ev-log tbody tr td')].map(td => td.textContent)")
        assert row[:4] == [f"{when:.3f}", "h0→h2", str(ev), "GOOD → ASSUMED_BAD"]
        page.screenshot(tmp_path / "replay.png")


def test_the_view_command_says_what_is_wrong(served):
    runner = CliRunner()
    taken = runner.invoke(cli.main, ["view", "--results", str(DEMO), "--port", served.rsplit(":", 1)[1].strip("/")])
    assert taken.exit_code == 1 and "cannot listen on 127.0.0.1" in taken.output and "give another --port" in taken.output
    missing = runner.invoke(cli.main, ["view", "--results", "/nonexistent/run"])
    assert missing.exit_code == 1 and "no results.json at /nonexistent/run/results.json" in missing.output
    both = runner.invoke(cli.main, ["view", "--results", str(DEMO), "--name", "x"])
    assert both.exit_code == 2 and "takes no --name" in both.output
    helped = runner.invoke(cli.main, ["view", "--help"])
    assert "127.0.0.1" in helped.output and "--read-only" in helped.output and "--results" in helped.output


# ---- the live side, on a fabric that is only a journal (no namespaces, no root) ------------------

@pytest.fixture
def journal_fabric(tmp_path, monkeypatch):
    from mrc_emu.fabric import registry
    from mrc_emu.fabric.running import Fabric

    monkeypatch.setattr(registry, "STATE_DIR", tmp_path / "state")
    topo = builtin()
    fabric = Fabric("vw", topo, registry.Journal.create("vw", {"topology": topo.to_dict(), "source": topo.source}))
    yield fabric
    fabric.close()
    registry.remove("vw")


def test_the_live_board_keeps_one_snapshot_per_process_in_the_journal(journal_fabric):
    from mrc_emu.fabric import registry
    from mrc_emu.fabric.live import LiveBoard, read_board

    mine, other = LiveBoard(journal_fabric), LiveBoard(journal_fabric, pid=1)
    other.publish({"transfers": [], "finished": True})
    mine.publish({"transfers": [{"key": 0}], "finished": False})
    mine.publish({"transfers": [{"key": 0}], "finished": True})  # replaced, not added
    board = read_board("vw")
    assert [snap["finished"] for snap in board] == [True, True] and len(board) == 2
    assert board[0]["updated_unix"] >= board[1]["updated_unix"]
    assert str(mine.directory) in registry.read("vw").directories  # `down` removes it with the fabric
    assert not list(mine.directory.glob("*.tmp"))


def test_a_live_sample_joins_the_board_the_fault_record_and_the_controller(journal_fabric):
    from mrc_emu.experiments.runtime.controller import ControlRecord, Selector
    from mrc_emu.fabric.faults.fault_record import NFT, Entry, FaultRecord
    from mrc_emu.fabric.live import LiveBoard
    from mrc_emu.view.live import LiveSource

    board = LiveBoard(journal_fabric)
    evs = [{"ev": 0, "plane": 0, "spine": "p0s0", "state": "GOOD", "sent": 30},
           {"ev": 1, "plane": 0, "spine": "p0s1", "state": "ASSUMED_BAD", "sent": 10}]
    event = {"time_ms": 1.5, "ev": 1, "old": "GOOD", "new": "ASSUMED_BAD", "reason": "3 consecutive losses", "rtt_ns": None}
    snapshot = {"command": "mrc-emu send h0 h2", "finished": False, "time_dilation": 2.0, "transfers": [
        {"key": 0, "src": "h0", "dst": "h2", "size": 1000, "label": "", "started": True, "bytes_acked": 250,
         "done": False, "error": None, "evs": evs, "ev_events": [event]}]}
    board.publish(snapshot)
    link = journal_fabric.topology.links_between("p0l0", "p0s1")[0]
    FaultRecord(journal_fabric).add(Entry.new("blackhole", "p0l0-p0s1", NFT, [("p0s1", link.b_intf)], [link.link_id]))
    ControlRecord(journal_fabric).deny(Selector(node="p1s2"), by="test")
    source = LiveSource("vw")
    first = source.sample()
    (transfer,) = first["transfers"]
    assert transfer["run"] == "running" and transfer["progress"] == 0.25 and transfer["goodput_gbps"] is None
    assert [(e["ev"], e["state"], e["share"]) for e in transfer["evs"]] == [(0, "GOOD", 0.75), (1, "ASSUMED_BAD", 0.25)]
    assert first["ev_log"] == [{**event, "transfer": transfer["id"], "src": "h0", "dst": "h2"}]
    assert first["links"]["p0l0-p0s1"]["faults"][0]["kind"] == "blackhole"
    assert first["spines"]["p1s2"] == {"drained": True, "by": "test"} and not first["spines"]["p0s1"]["drained"]
    assert first["ports"] is None and "no link_rate" in first["ports_note"]
    snapshot["transfers"][0]["bytes_acked"] = 750
    evs[0]["sent"], evs[1]["sent"] = 60, 10  # since: 30 more on EV 0, none on EV 1
    board.publish(snapshot)
    later = source.sample()["transfers"][0]
    assert later["progress"] == 0.75 and later["goodput_gbps"] > 0  # 500 B over the snapshots' interval, x K = 2
    assert [(e["share"], e["share_recent"]) for e in later["evs"]] == [(round(60 / 70, 4), 1.0), (round(10 / 70, 4), 0.0)]
    source.close()


def test_a_read_only_live_view_refuses_actions_and_serves_the_state(journal_fabric):
    from mrc_emu.view.live import LiveSource

    server = Server(View(LiveSource("vw"), read_only=True), port=0).start()
    try:
        topo = get(f"{server.url}api/topology")
        assert topo["mode"] == "live" and topo["read_only"] and topo["fabric"] == "vw" and len(topo["links"]) == 24
        assert get(f"{server.url}api/state")["fabric"] == "vw"
        request = urllib.request.Request(f"{server.url}api/action", method="POST",
                                         data=b'{"action": "drain", "spine": "p0s1"}')
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=30)
        assert refused.value.code == 403 and "started with --read-only" in json.load(refused.value)["error"]
    finally:
        server.stop()
        server.view.source.close()
