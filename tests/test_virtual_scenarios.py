"""Scenarios in virtual time (no root, no namespaces): the same scenario files and results.json,
byte for byte the same for one seed, every fault kind either modelled or refused by name, the
baseline's routing repair from FRR's timers, the controller's steps through an in-memory record."""

from __future__ import annotations

import json
import random
import struct

import jsonschema
import pytest
from click.testing import CliRunner

from mrc_emu.cli import main
from mrc_emu.experiments.analysis import report
from mrc_emu.experiments.scenarios import scenario, virtual_run
from mrc_emu.experiments.scenarios.faults import Fault
from mrc_emu.experiments.scenarios.schema import RESULTS_SCHEMA
from mrc_emu.fabric import routing as frr
from mrc_emu.topology import builtin
from mrc_emu.vfabric.engine import Engine
from mrc_emu.vfabric.fabric import VirtualFabric
from mrc_emu.vfabric.faults import FaultKind, LinkFault
from mrc_emu.vfabric.routing import BgpRepair

DEFAULT = builtin()


def _scenario(faults: list[dict], transports=("mrc", "baseline"), size="2MiB", **extra) -> scenario.Scenario:
    data = {"name": "t", "topology": "default", "transports": list(transports), "reference": False,
            "clock": "virtual", "workloads": [{"kind": "write", "src": "h0", "dst": "h2", "size": size}],
            "faults": faults, **extra}
    return scenario.from_dict(data)


def test_a_scenario_in_virtual_time_gives_one_results_json_per_seed_byte_for_byte(tmp_path):
    scn = _scenario([{"kind": "blackhole", "link": "baseline-path", "at": 0.3}])
    texts = []
    for run in ("a", "b"):
        results = virtual_run.run(scn, tmp_path / run, seed=3)
        jsonschema.validate(results, RESULTS_SCHEMA)
        report.write(results, tmp_path / run)  # results.json, report.md and the plots, as `mrc-emu run` writes them
        texts.append((tmp_path / run / "results.json").read_text())
        assert (tmp_path / run / "wall.json").exists()  # this machine's time, apart
    assert texts[0] == texts[1]
    assert "wall" not in texts[0] and "started_unix" not in texts[0]
    results = json.loads(texts[0])
    mrc, base = results["runs"]["mrc"], results["runs"]["baseline"]
    assert mrc["verified"] and base["verified"]
    # MRC: the EV over the link found in well under a millisecond, nothing stalled for long
    assert mrc["fault_figures"]["detection_ms"] < 1 and mrc["fault_figures"]["stall_ms"] < 1
    # the baseline waits for BFD (300 ms x 3, the last packet up to one interval before) and go-back-N
    assert base["fault_figures"]["stall_ms"] >= 600
    routing = base["virtual"]["routing"]
    assert routing["events"][0]["event"] == "down (BFD detection)"
    assert 600e6 <= routing["events"][0]["time_ns"] - base["faults"][0]["events"][0]["began_ms"] * 1e6 <= 900e6
    other = json.dumps(virtual_run.run(scn, tmp_path / "c", seed=4), indent=1)
    assert other != texts[0]


def test_every_fault_kind_of_the_scenarios_has_a_model_or_is_refused_by_name():
    scn = _scenario([
        {"kind": "flap", "link": ["p0l0", "p0s1"], "at": 0.2, "period_ms": 10, "count": 3},
        {"kind": "switch-reboot", "node": "p0s1", "at": 0.3, "duration_ms": 5},
        {"kind": "plane-down", "host": "h0", "plane": 1, "at": 0.3},
        {"kind": "blackhole", "link": ["p0l0", "p0s1"], "direction": "p0l0->p0s1", "at": 0.4},
        {"kind": "loss", "link": ["p1l0", "p1s0"], "percent": 5, "at": 0.0},
        {"kind": "delay", "link": ["p0l0", "p0s0"], "ms": 2, "at": 0.5},
    ], transports=("mrc",), routing="none")
    made = [virtual_run.link_faults(scn, f, f.link if isinstance(f.link, tuple) else None, i)
            for i, f in enumerate(scn.faults)]
    flap, reboot, plane, one_way, loss, delay = made
    assert flap == [LinkFault(FaultKind.DOWN, "p0l0", "p0s1", at_progress=0.2, duration_ns=5_000_000, repeat=3,
                              period_ns=10_000_000, tag=0)]
    assert sorted(f.b for f in reboot) == sorted(DEFAULT.peer(link, "p0s1")[0] for link in DEFAULT.links_of("p0s1"))
    assert all(f.duration_ns == 5_000_000 and f.kind is FaultKind.DOWN for f in reboot)
    assert [(f.a, f.b) for f in plane] == [("h0", DEFAULT.leaf_of("h0", 1))]
    assert one_way[0].one_way and (one_way[0].a, one_way[0].b) == ("p0l0", "p0s1")
    assert loss[0].value == 0.05 and loss[0].at_ns == 0 and loss[0].at_progress is None
    assert delay[0].value == 2_000_000
    shaped = scenario.load("gray-failure")  # a degrade needs a topology with a link rate
    assert virtual_run.link_faults(shaped, shaped.faults[0], shaped.faults[0].link, 0) == [
        LinkFault(FaultKind.DEGRADE, "p0l1", "p0s0", False, 0.25, at_progress=0.2, tag=0)]

    class Mystery(Fault):
        kind = "mystery"

    virtual_run.check(scn, available=2**30)
    with pytest.raises(virtual_run.NotModelled, match="move 0.0 GiB.*give the workloads a smaller size"):
        virtual_run.check(scn, available=2**20)  # 2 MiB of WRITEs need more than 1 MiB
    scn.faults.append(Mystery(0.5, link=("p0l0", "p0s1")))
    with pytest.raises(virtual_run.NotModelled, match="'mystery' has no model in virtual time"):
        virtual_run.check(scn, available=2**30)


def test_the_routing_model_withdraws_at_both_ends_then_one_update_later_at_the_planes_other_leaves():
    engine = Engine()
    fabric = VirtualFabric(DEFAULT, engine, random.Random(0))
    timers = virtual_run.routing_timers(_scenario([], routing="bgp"))
    assert timers.bfd_interval_ns == frr.BFD_INTERVAL_MS * 1_000_000 and timers.bfd_multiplier == 3
    repair = BgpRepair(engine, fabric, timers, random.Random(1))
    fault = LinkFault(FaultKind.BLACKHOLE, "p0s1", "p0l0", at_ns=0)
    repair.on_fault(fault, True)
    engine.run(until_ns=599_999_999)
    assert not fabric.withdrawn.get("p0l0")  # BFD has not given up yet
    engine.run(until_ns=900_000_000)
    (down,) = repair.events
    assert down["session"] == "p0l0-p0s1" and 600e6 <= down["time_ns"] <= 900e6
    port = fabric.ribs["p0l0"].port_to["p0s1"]
    assert fabric.withdrawn["p0l0"] == {(port, None)}
    assert fabric.withdrawn["p0s1"] == {(fabric.ribs["p0s1"].port_to["p0l0"], None)}
    others = [leaf for leaf in fabric.withdrawn if leaf not in ("p0l0", "p0s1")]
    assert others and all(fabric.withdrawn[leaf] == {(fabric.ribs[leaf].port_to["p0s1"], 0)} for leaf in others)
    silent = BgpRepair(Engine(), VirtualFabric(DEFAULT, Engine(), random.Random(0)),
                       virtual_run.routing_timers(_scenario([], routing="bgp", bfd=False)), random.Random(1))
    silent.on_fault(fault, True)  # without BFD the hold timer (9 s, keepalives every 3 s) gives up
    silent.engine.run()
    assert 6e9 <= silent.events[0]["time_ns"] <= 9e9
    repair.on_fault(fault, False)  # repaired: back a connect retry later
    engine.run(until_ns=engine.now + timers.connect_retry_ns + timers.update_hop_ns)
    assert repair.events[-1]["event"] == "up" and not any(fabric.withdrawn.values())


def test_a_drain_and_a_port_disable_go_through_the_controller_in_virtual_time(tmp_path):
    scn = _scenario([{"kind": "drain", "node": "p0s1", "at": 0.2}, {"kind": "undrain", "node": "p0s1", "at": 0.6},
                     {"kind": "port-disable", "host": "h0", "plane": 1, "at": 0.3},
                     {"kind": "port-enable", "host": "h0", "plane": 1, "at": 0.5}], transports=("mrc",),
                    routing="none", size="8MiB")
    results = virtual_run.run(scn, tmp_path, seed=0)
    run = results["runs"]["mrc"]
    transfer = run["transfers"][0]
    assert run["verified"] and transfer["requester"]["stats"]["retransmits"] == 0
    ops = transfer["ev_ops"]
    assert [bool(op["deny"]) for op in ops[:2]] == [True, True] and "p0s1" in ops[0]["reason"]
    assert "h0 port(s) 2 disabled" in ops[1]["reason"]
    drained = set(ops[0]["deny"])
    undrain = next(op for op in ops if op["allow"] and set(op["allow"]) & drained and "allowed" in op["reason"])
    assert all(undrain["sent"][str(ev)] == ops[0]["sent"][str(ev)] for ev in drained)  # nothing sent while drained


def test_the_cli_runs_a_shipped_scenario_in_virtual_time_and_refuses_what_means_nothing_there(tmp_path):
    runner = CliRunner()
    bad = runner.invoke(main, ["run", "link-down", "--seed", "1", "-o", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "--seed is for virtual time" in bad.output
    small = tmp_path / "small.yaml"  # link-down, smaller
    small.write_text((scenario.SCENARIO_DIR / "link-down.yaml").read_text().replace("64MiB", "2MiB"))
    ok = runner.invoke(main, ["run", str(small), "--clock", "virtual", "-o", str(tmp_path / "ld")])
    assert ok.exit_code == 0, ok.output
    assert "[virtual time, seed 0]" in ok.output and "virtual time (seed 0)" in ok.output
    assert "**Virtual time**" in (tmp_path / "ld" / "report.md").read_text()


def test_a_virtual_run_captures_its_source_hosts_ports_in_a_pcap_an_independent_reader_reassembles(tmp_path):
    import pcap_reader

    scn = _scenario([{"kind": "link-down", "link": ["p0l0", "p0s1"], "at": 0.3}], transports=("mrc",),
                    routing="none", size="1MiB", capture=True)
    results = virtual_run.run(scn, tmp_path, seed=2)
    jsonschema.validate(results, RESULTS_SCHEMA)
    run = results["runs"]["mrc"]
    cap = run["capture"]
    assert cap["run"] == "same" and cap["path"] == "mrc.pcap" and cap["host"] == "h0" and cap["lost"] == 0
    path = tmp_path / "mrc.pcap"
    assert pcap_reader.count(path) == cap["packets"] > 256  # the WRITE's 256 packets, its resends, the ACKs
    digest, used, covered = pcap_reader.sha256_of(path, 2**20)
    assert digest == run["transfers"][0]["sha256_source"] and covered == 2**20 and used >= 256
    raw, offset, times = path.read_bytes(), 24, []
    assert raw[:4] == bytes.fromhex("4d3cb2a1")  # nanosecond timestamps: virtual time, exact
    while offset < len(raw):
        sec, ns, included, _ = struct.unpack_from("<IIII", raw, offset)
        times.append(sec * 10**9 + ns)
        offset += 16 + included
    assert times == sorted(times) and 0 < times[-1] - times[0] < 4 * 10**9  # as they happened (3 s of lingering)
    assert report.pcap_line("mrc", run, markdown=False).startswith("pcap (mrc): mrc.pcap, ")


def test_a_cross_validation_can_choose_the_ecmp_salt_and_keep_the_emulated_workers_guards():
    scn = _scenario([{"kind": "link-down", "link": "baseline-path", "at": 0.3}], transports=("baseline",))
    links = {virtual_run.baseline_link(scn, 1, salt) for salt in range(8)}
    assert len(links) > 1  # the salt moves the flow; a seed's own salt is the seed
    both = set()
    for salt in range(32):
        seen: dict = {}
        virtual_run.baseline_link(scn, 1, salt, seen)
        both.add((seen["data"][0][:2], seen["acks"][0][:2]))  # the planes of the flow's and its ACKs' uplinks
    # the nodes' hashes are independent (a plain salted CRC-32 tied them: the ACKs always took the other plane)
    assert both == {("p0", "p0"), ("p0", "p1"), ("p1", "p0"), ("p1", "p1")}
    assert virtual_run.baseline_link(scn, 1) == virtual_run.baseline_link(scn, 1, 1)
    from mrc_emu.experiments.runtime.virtual import _configured
    from mrc_emu.experiments.scenarios.transports import Transport
    from mrc_emu.transport.config import QpConfig

    spec = Transport.MRC.spec("h0", "h2", 1 << 20, 4096, topology=DEFAULT)
    fabric = VirtualFabric(DEFAULT, Engine(), random.Random(0))
    model = _configured(spec, fabric, 9_440, 0).config
    kept = _configured(spec, fabric, 9_440, 0, emulator_guards=True).config
    assert (model.witnesses, model.reorder_floor_ns) == (1, 1_000)  # the model's own: it reorders nothing
    assert (kept.witnesses, kept.reorder_floor_ns) == (QpConfig.witnesses, QpConfig.reorder_floor_ns)


def test_progress_reports_come_every_10_ms_of_wall_time_at_any_time_dilation():
    from mrc_emu.experiments.runtime.worker import report_interval_ns

    assert report_interval_ns(1.0) == 10_000_000
    assert report_interval_ns(16.0) == 625_000  # of emulated time: a fault at 30 % of a 12 ms ring fires near it


def test_a_run_reports_the_share_of_packets_on_the_evs_through_each_fault_while_it_held(tmp_path):
    from mrc_emu.experiments.analysis import metrics
    timeline = [[0.0, [0, 0], [0, 0]], [10.0, [50, 50], [50, 50]], [20.0, [60, 140], [60, 140]], [30.0, [61, 239], [0, 0]]]
    assert metrics.share_of(timeline, {0}, 0.0, 10.0) == 0.5 and metrics.share_of(timeline, {0}, 10.0) == 0.055
    assert metrics.share_of(timeline, {0}, 10.0, 20.0) == 0.1 and metrics.share_of(timeline, {0}, 30.0) is None
    result = CliRunner().invoke(main, ["run", "gray-failure", "--clock", "virtual", "-o", str(tmp_path / "gf")])
    assert result.exit_code == 0, result.output
    shares = json.loads((tmp_path / "gf" / "results.json").read_text())["runs"]["mrc"]["transfers"][0]["fault_shares"]
    degrade, delay, blackhole = shares  # the three gray failures of h4 -> h0, each on one of its four EVs
    assert [s["evs"] for s in shares] == [[0], [1], [2]] and all(0.2 < s["before"] < 0.35 for s in shares)
    assert degrade["share"] < 0.8 * degrade["before"] and delay["share"] < 0.1 and blackhole["share"] < 0.01
    assert "spray share: mrc h4->h0: while `degrade to 25% p0l1-p0s0 at 20%` held, EV 0 through it carried" in result.output
    assert "- Spray share: mrc h4->h0" in (tmp_path / "gf" / "report.md").read_text()
