"""The RED port model without root: how a topology's `port:` block becomes each port's RED (the
mapping docs/congestion.md states), the request that carries it, the parsing of `tc -s qdisc`
(a sample in iproute2's format: tests/data/tc-s-qdisc-red.txt), and the refusals (model red
needs trim off; netem would replace RED, so delays are refused on its ports)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from mrc_emu.experiments.scenarios import scenario
from mrc_emu.experiments.scenarios.scenario import ScenarioError
from mrc_emu.fabric import registry
from mrc_emu.fabric.datapath import impair, red
from mrc_emu.fabric.faults import fault_ops
from mrc_emu.fabric.nodes import FabricSetupError
from mrc_emu.fabric.running import Fabric
from mrc_emu.topology import TopologyError, builtin, from_dict
from mrc_emu.topology.port import RED_AVPKT, with_model

SAMPLE = Path(__file__).parent / "data" / "tc-s-qdisc-red.txt"


def _incast(block: dict):
    return from_dict({**builtin("incast").to_dict(), "port": block}, "<test>")


# the port block of the `tc ... red ... burst 20 probability 0.2` line that iproute2 was captured sending
RED_LINE_BLOCK = {"model": "red", "trim": "off", "red": {"burst": 20}, "ecn": {"pmax": 0.2}}


def _lasthop(topo):
    return next(p for p in topo.egress_ports() if p.lasthop and p.node == "p0l0")


def test_the_port_block_maps_onto_red_one_to_one():
    """incast: BDP 50 KB at 400 Mbit/s x 1 ms; ECN 0.2-0.8 BDP with Pmax 1, buffer 4 BDP."""
    topo = _incast({"model": "red", "trim": "off"})
    port = _lasthop(topo)
    assert (port.model, port.trim) == ("red", False)
    params = red.red_params(port, topo.ports.red_avpkt, topo.ports.red_burst)
    assert (params.limit, params.qth_min, params.qth_max) == (200_000, 10_000, 40_000)
    assert params.max_p == 0xFFFFFFFF and params.ecn  # Pmax 1, as far as a u32 says it
    # the default: Wlog 0, the average is the backlog each arrival finds; an idle port forgets it at once
    assert (params.wlog, params.scell_log, params.stab) == (0, 0, bytes([31] * 256))
    assert "ewma 0" in params.tc_line("p0l0-eth0")
    # every served port: the same thresholds as the port program is given
    for p in topo.egress_ports():
        q = red.red_params(p, RED_AVPKT, None)
        assert (q.limit, q.qth_min, q.qth_max, q.probability) == (p.buffer, p.kmin, p.kmax, pytest.approx(p.pmax))


def test_a_burst_gives_iproutes_ewma_and_idle_table():
    """tc_red_eval_ewma: the smallest Wlog with burst + 1 - min/avpkt <= (1 - (1 - W)^burst) / W."""
    assert red.ewma_log(10_000, 3, 4250) == 1  # a = 1.65; W = 1/2 gives 1.75
    assert red.ewma_log(10_000, 20, 4250) == 8  # a = 18.65; W = 1/128 gives 18.61, 1/256 gives 19.25
    with pytest.raises(ValueError, match="at least 3"):
        red.ewma_log(10_000, 1, 4250)
    # idle decay: 4250 B at 50 MB/s is 85 us (1,328 ticks); W = 1/256 takes ln(256/255) of the average per packet time
    cell_log, stab = red.idle_table(8, 4250, 50e6)
    assert cell_log == 15 and stab[0] == 0 and stab[255] == 31 and list(stab[1:4]) == [0, 0, 0]
    assert all(a <= b for a, b in zip(stab[1:255], stab[2:255]))  # the longer idle, the larger the shift
    topo = _incast(RED_LINE_BLOCK)
    params = red.red_params(_lasthop(topo), topo.ports.red_avpkt, topo.ports.red_burst)
    assert (params.wlog, params.scell_log, params.plog) == (8, 15, 18)
    assert params.tc_line("p0l0-eth0") == ("tc qdisc replace dev p0l0-eth0 parent 2:2 handle 7265: red limit 200000 "
                                           "min 10000 max 40000 avpkt 4250 burst 20 probability 0.2 ecn")


def test_ecn_off_is_red_as_a_fifo_at_the_buffer():
    topo = _incast({"model": "red", "trim": "off", "ecn": "off"})
    params = red.red_params(_lasthop(topo), RED_AVPKT, None)
    assert (params.qth_min, params.qth_max, params.limit, params.ecn) == (200_000, 200_000, 200_000, False)


def test_the_red_request_is_tc_red_qopt_stab_and_max_p():
    topo = _incast(RED_LINE_BLOCK)
    params = red.red_params(_lasthop(topo), topo.ports.red_avpkt, topo.ports.red_burst)
    batch = red.RedBatch()
    batch.red(9, 0x20002, params)
    (raw,) = batch.messages()
    kind, msg_flags = struct.unpack_from("=HH", raw, 4)
    index, handle, parent = struct.unpack_from("=iII", raw, 16 + 4)
    assert (kind, msg_flags & 0x400, msg_flags & 0x100) == (impair.RTM_NEWQDISC, 0x400, 0x100)  # create, replace
    assert (index, handle, parent) == (9, red.RED_HANDLE, 0x20002)
    options = raw[raw.index(b"red\0") + 4:][4:]  # past TCA_KIND and TCA_OPTIONS' own header
    length, nla = struct.unpack_from("=HH", options)
    assert (length, nla) == (4 + 16, red.TCA_RED_PARMS)
    assert struct.unpack_from("=IIIBBBB", options, 4) == (200_000, 10_000, 40_000, 8, 18, 15, red.TC_RED_ECN)
    assert struct.unpack_from("=HH", options, 20) == (4 + 256, red.TCA_RED_STAB) and options[24:280] == params.stab
    assert struct.unpack_from("=HHI", options, 280) == (8, red.TCA_RED_MAX_P, round(0.2 * 2**32))


# TCA_OPTIONS of `tc qdisc add dev lo root handle 7265: red limit 200000 min 10000 max 40000 avpkt 4250
# burst 20 probability 0.2 bandwidth 400mbit ecn` as iproute2 6.1 sent it (captured with strace -xx here;
# the kernel refused it, having no sch_red): tc_red_qopt, TCA_RED_STAB, TCA_RED_MAX_P, then TCA_RED_FLAGS
IPROUTE2_RED = bytes.fromhex(
    "14000100400d030010270000409c000008120f00040102000000000000000000000000010101010101010101010202020202020202"
    "0202020303030303030303030304040404040404040404050505050505050505050506060606060606060606070707070707070707"
    "070808080808080808080808090909090909090909090a0a0a0a0a0a0a0a0a0a0b0b0b0b0b0b0b0b0b0b0b0c0c0c0c0c0c0c0c0c"
    "0c0d0d0d0d0d0d0d0d0d0d0e0e0e0e0e0e0e0e0e0e0e0f0f0f0f0f0f0f0f0f0f101010101010101010101011111111111111111111"
    "12121212121212121212131313131313131313131314141414141414141414151515151515151515151616161616161616161616"
    "171717171717171717171818181818181f08000300333333330c000400010000000f000000")


def test_the_red_request_is_what_tc_sends_for_the_same_line():
    """Byte for byte iproute2's, but for where ECN is said: tc 6.1 puts it in TCA_RED_FLAGS (a
    bitfield, kernels since 5.9), we in the tc_red_qopt flags every kernel reads."""
    topo = _incast(RED_LINE_BLOCK)
    params = red.red_params(_lasthop(topo), topo.ports.red_avpkt, topo.ports.red_burst)
    ours = red.red_options(params)
    assert len(ours) == 288 and IPROUTE2_RED[288:] == struct.pack("=HHII", 12, 4, red.TC_RED_ECN, 0x0F)
    assert ours[:19] + ours[20:] == IPROUTE2_RED[:19] + IPROUTE2_RED[20:288]  # byte 19: tc_red_qopt.flags
    assert (ours[19], IPROUTE2_RED[19]) == (red.TC_RED_ECN, 0)
    assert params.tc_line("lo").split("red ", 1)[1] == ("limit 200000 min 10000 max 40000 avpkt 4250 burst 20 "
                                                       "probability 0.2 ecn")


def test_tc_s_qdisc_is_parsed_as_iproute2_prints_it():
    qdiscs = red.parse_tc_stats(SAMPLE.read_text())
    assert [(q["kind"], q["handle"], q["parent"]) for q in qdiscs] == [
        ("tbf", "1:", None), ("htb", "2:", "1:1"), ("pfifo", "21:", "2:1"), ("red", "7265:", "2:2"),
        ("clsact", "ffff:", "ffff:fff1")]
    tbf, _, _, red_q, _ = qdiscs
    assert (tbf["sent_bytes"], tbf["sent_packets"], tbf["overlimits"], tbf["backlog_bytes"]) == (9135648, 2201, 1712, 46708)
    assert red_q["options"] == "limit 200000b min 10000b max 40000b ecn"
    assert (red_q["marked"], red_q["early"], red_q["pdrop"], red_q["other"], red_q["dropped"]) == (412, 0, 3, 0, 3)
    assert (red_q["backlog_bytes"], red_q["backlog_packets"]) == (41 * 1024, 10)  # "41Kb": within 16 B of it
    assert "marked" not in tbf
    assert red.parse_tc_stats("") == [] and red.parse_tc_stats("garbage\n  marked 1 early 2 pdrop 3 other 4") == []


def test_model_red_in_a_topology_names_what_is_wrong():
    for block, words in [({"model": "red"}, r"field 'port.trim': RED cannot trim"),
                         ({"model": "wred", "trim": "off"}, r"field 'port.model': 'wred' is not one of bpf, red"),
                         ({"red": {"burst": 3}}, r"field 'port.red': only model: red"),
                         ({"model": "red", "trim": "off", "red": {"burst": 0}}, r"'port.red.burst'"),
                         ({"model": "red", "trim": "off", "red": {"avpkt": "1bdp"}}, r"'port.red.avpkt'"),
                         ({"model": "red", "trim": "off", "links": [{"link": ["p0l0", "h0"], "trim": {}}]},
                          r"'port.links\[0\]': RED cannot trim")]:
        with pytest.raises(TopologyError, match=words):
            _incast(block)
    assert _incast(with_model(None, "red")).ports.model == "red"  # with_model turns trimming off
    assert with_model({"ecn": {"kmin": "0.1bdp"}, "links": [{"link": ["p0l0", "h0"], "trim": {}}]}, "red") == {
        "ecn": {"kmin": "0.1bdp"}, "model": "red", "trim": "off", "links": [{"link": ["p0l0", "h0"]}]}
    topo = _incast({"model": "red", "trim": "off"})
    assert from_dict(topo.to_dict(), "<again>").ports.model == "red"  # the journal's topology says so
    assert _lasthop(topo).to_dict()["model"] == "red"


@pytest.fixture
def state_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(registry, "STATE_DIR", tmp_path / "state")
    return tmp_path / "state"


def test_netem_is_refused_on_red_ports(state_dir, monkeypatch, tmp_path):
    topo = _incast({"model": "red", "trim": "off"})
    fabric = Fabric("fr", topo, registry.Journal.create("fr", {"topology": topo.to_dict(), "source": topo.source}))
    monkeypatch.setattr(impair, "netem_missing", lambda: None)
    with pytest.raises(FabricSetupError, match="netem would take the place of the RED qdisc on p0l0"):
        fault_ops.delay(fabric, "p0l0", "p0s0", 5)
    with pytest.raises(FabricSetupError, match="netem would take the place of the RED"):
        fault_ops.drop(fabric, "p0l0", "p0s0", 5, mechanism="netem")
    path = tmp_path / "t.yaml"
    path.write_text("name: redt\nplanes: 2\nspines_per_plane: 2\nleaves_per_plane: 5\nhosts_per_leaf: 4\n"
                    "link_rate: 400mbit\nport: {model: red, trim: off}\n")
    scn = tmp_path / "s.yaml"
    scn.write_text("topology: t.yaml\ntransports: [mrc]\nworkloads:\n  - {kind: write, src: h4, dst: h0, size: 1MiB}\n"
                   "faults:\n  - {kind: delay, link: [p0l0, p0s0], ms: 5}\n")
    with pytest.raises(ScenarioError, match="netem would take the place of RED"):
        scenario.load(scn)


def test_the_probe_names_the_module(monkeypatch):
    monkeypatch.setattr(red, "kernel_refuses", lambda build, what="netem": "No such file or directory")
    red.red_missing.cache_clear()
    try:
        assert red.red_missing().startswith("this kernel has no RED (module sch_red, CONFIG_NET_SCH_RED)")
    finally:
        red.red_missing.cache_clear()
