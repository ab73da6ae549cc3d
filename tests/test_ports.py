"""The port model without root: the `port:` block, its validation, the threshold arithmetic, and
the pieces of fabric/datapath/ports.py that need no kernel (value layouts, quantiles, deltas)."""

from __future__ import annotations

import ctypes
import json
import random
import shutil
import subprocess

import pytest

from mrc_emu.fabric.datapath import ports
from mrc_emu.topology import TopologyError, builtin, from_dict
from mrc_emu.topology.port import HIST_BUCKETS, histogram_width, plane_bdp, tbf_shape
from mrc_emu.topology.port_verdict import PORT_ECN, PORT_ENABLED, PORT_LASTHOP, PORT_TRIM
from mrc_emu.topology.units import parse_duration_ns

BASE = {**builtin().to_dict(), "link_rate": "400mbit"}
FLUID = ports.OBJECT.parent / "fluid.h"  # the port program's queue arithmetic
U64 = 2**64 - 1


def _topo(**extra):
    return from_dict({**BASE, **extra}, "t.yaml", {k: i + 1 for i, k in enumerate({**BASE, **extra})})


def _port(topo, node, peer):
    return next(p for p in topo.egress_ports() if p.node == node and p.peer == peer)


def test_defaults_follow_uec_relative_to_the_plane_bdp():
    topo = _topo()
    bdp = 400e6 / 8 * 1e-3  # 400 Mbit/s x the default base RTT of 1 ms = 50,000 bytes
    fabric_port, last_hop = _port(topo, "p0s0", "p0l0"), _port(topo, "p0l0", "h0")
    assert fabric_port.bdp_bytes == bdp
    assert (fabric_port.kmin, fabric_port.kmax, fabric_port.pmax) == (0.2 * bdp, 0.8 * bdp, 1.0)
    assert fabric_port.trim_threshold == last_hop.trim_threshold == bdp  # the last hop too, as uet-htsim's queues
    assert fabric_port.buffer == 4 * bdp and fabric_port.trim_bytes == 28
    assert last_hop.lasthop and not fabric_port.lasthop
    # the histogram's buckets: Kmax and the trim threshold are upper edges (2,000 B x 20 and x 25), the buffer covered
    assert fabric_port.hist_width == 2000 and fabric_port.kmax % 2000 == 0 == fabric_port.trim_threshold % 2000
    assert fabric_port.hist_width * (HIST_BUCKETS - 1) >= fabric_port.buffer


def test_the_histogram_width_spreads_the_buffer_and_puts_kmax_and_the_trim_threshold_on_edges():
    assert HIST_BUCKETS == 128 and histogram_width(200_000) == 1575  # no thresholds: the buffer over buckets 1..127
    assert histogram_width(200_000, 50_000, 40_000) == 2000  # both on edges: the median against Kmax is exact too
    assert histogram_width(200_000, 50_000) == 2000  # the threshold alone: its divisor nearest 1,575 within 0.9-1.5x
    assert histogram_width(200_000, 50_000, 40_001) == 2000  # Kmax with no common divisor near: the threshold alone
    assert histogram_width(200_000, 50_021) == 1575  # 50,021 = 11 x 4,547: no divisor near 1,575, as without
    assert histogram_width(127 * 1000, 7000) == 1000 and histogram_width(10, 3) == 1


def test_every_switch_port_is_served_and_host_ports_only_when_asked():
    topo = _topo()
    switch_ports = sum(len(topo.links_of(n)) for n, node in topo.nodes.items() if node.role.value != "host")
    assert len(topo.egress_ports()) == switch_ports
    assert len(_topo(port={"hosts": "on"}).egress_ports()) == 2 * len(topo.links)
    assert from_dict(builtin().to_dict(), "<x>").egress_ports() == []  # no link rate: no queue to model


def test_base_rtt_and_bdp_units_and_overrides():
    topo = _topo(base_rtt="2ms", port={
        "buffer": "100k", "ecn": {"kmin": "5k", "kmax": "0.5bdp", "pmax": 0.25},
        "links": [{"link": ["p0l0", "h0"], "ecn": "off"}, {"link": ["p0l0", "p0s0"], "from": "p0s0", "trim": "off"}]})
    bdp = 400e6 / 8 * 2e-3
    port = _port(topo, "p0s1", "p0l0")
    assert (port.buffer, port.kmin, port.kmax, port.pmax) == (100_000, 5000, 0.5 * bdp, 0.25)
    assert not _port(topo, "p0l0", "h0").ecn and _port(topo, "p0l0", "h1").ecn
    assert not _port(topo, "p0s0", "p0l0").trim and _port(topo, "p0l0", "p0s0").trim  # `from` picks one direction
    assert from_dict(topo.to_dict(), "<again>").egress_ports() == topo.egress_ports()


def test_the_last_hop_trims_at_the_threshold_unless_the_topology_says_otherwise():
    """Not given, a port facing a host trims where the others do (1 BDP by default, as every queue
    of uet-htsim); `lasthop_threshold` moves it alone, and a stored topology keeps it."""
    bdp = 50_000
    given = _topo(port={"trim": {"lasthop_threshold": "1.5bdp"}})
    assert _port(given, "p0l0", "h0").trim_threshold == 1.5 * bdp and _port(given, "p0s0", "p0l0").trim_threshold == bdp
    assert from_dict(given.to_dict(), "<again>").egress_ports() == given.egress_ports()
    shallow = _topo(port={"trim": {"threshold": "30000"}})
    assert _port(shallow, "p0l0", "h0").trim_threshold == _port(shallow, "p0s0", "p0l0").trim_threshold == 30_000


def test_a_tiny_bdp_is_floored_at_two_packets():
    assert plane_bdp(1e6, 1_000_000, 9000) == 18_000
    assert plane_bdp(400e6, 1_000_000, 9000) == 50_000


def test_tbf_shape_is_the_one_definition():
    assert tbf_shape(400e6, 9000) == (50_000_000, 50_000)
    assert tbf_shape(10e6, 9000) == (1_250_000, 36_000)
    # a topology's port: {bucket}: as given, but never below one whole frame (TBF drops a larger packet)
    assert tbf_shape(400e6, 9000, 20_000) == (50_000_000, 20_000)
    assert tbf_shape(400e6, 9000, 1) == (50_000_000, 9_014)
    topo = _topo(port={"bucket": "12k"})
    assert topo.ports.bucket == 12_000 and from_dict(topo.to_dict(), "<again>").ports.bucket == 12_000
    raw = ports._CFG.unpack(ports._cfg_bytes(topo.egress_ports()[0], 400e6, 9000, bucket=topo.ports.bucket))
    assert raw[2] == 12_000  # the port program subtracts the same bucket from its virtual queue


@pytest.mark.parametrize("extra, message", [
    ({"port": {"ecn": {"kmin": "1bdp", "kmax": "0.5bdp"}}}, "field 'port.ecn.kmax': kmax (0.5bdp) must be above kmin"),
    ({"port": {"ecn": {"pmax": 0}}}, "'port.ecn.pmax': 0 is not a probability"),
    ({"port": {"trim": {"bytes": 30}}}, "'port.trim.bytes': 30 is not a multiple of 4"),
    ({"port": {"bucket": "lots"}}, "'port.bucket': 'lots'"),
    ({"port": {"trim": {"bytes": 24}}}, "BTH + RETH at least"),
    ({"port": {"buffer": "lots"}}, "'port.buffer': 'lots' is not a size"),
    ({"port": {"color": "red"}}, "'port.color': unknown field"),
    ({"port": {"hosts": "maybe"}}, "'port.hosts': 'maybe' is not on or off"),
    ({"port": {"links": [{"link": ["h0", "h1"]}]}}, "'port.links[0].link': no link between h0 and h1"),
    ({"port": {"links": [{"link": ["p0l0", "zz"]}]}}, "no node 'zz'"),
    ({"port": {"links": [{"link": ["p0l0", "h0"], "from": "h1"}]}}, "'port.links[0].from': 'h1' is not an end"),
    ({"port": {"ecn": {"kmin": "50k", "kmax": "0.8bdp"}}}, "kmax (40000 B) must be above kmin (50000 B)"),
    ({"base_rtt": "fast"}, "field 'base_rtt': 'fast' is not a duration"),
    ({"port": "on"}, "'port': 'on' is not a mapping"),
])
def test_invalid_port_blocks_give_one_line_naming_file_line_and_field(extra, message):
    with pytest.raises(TopologyError) as err:
        _topo(**extra)
    text = str(err.value)
    assert message in text and text.startswith("t.yaml, line ") and "\n" not in text


def test_durations():
    assert parse_duration_ns("1ms") == 1_000_000 and parse_duration_ns("2.5us") == 2500
    with pytest.raises(ValueError):
        parse_duration_ns("0ms")


def test_config_values_pack_to_the_c_struct():
    port = _port(_topo(), "p0l0", "h0")
    raw = ports._cfg_bytes(port, 400e6, 9000, epoch=7)
    fields = ports._CFG.unpack(raw)
    assert fields[0] == 50_000_000 and fields[2] == 50_000  # the virtual queue drains at TBF's rate; its bucket
    assert fields[1] == PORT_ENABLED | PORT_ECN | PORT_TRIM | PORT_LASTHOP
    assert fields[6] == 0xFFFFFFFF and fields[-1] == 7  # pmax 1: every draw of a u32 but the largest marks at kmax
    assert ports._CFG.size == 48 and ports._STATE.size == 8 + 8 * (9 + HIST_BUCKETS)


@pytest.mark.skipif(ports.missing_object() is not None or shutil.which("bpftool") is None,
                    reason="needs the compiled port program and bpftool (scripts/install.sh)")
def test_python_layouts_match_the_compiled_object():
    btf = json.loads(subprocess.run(["bpftool", "-j", "btf", "dump", "file", str(ports.OBJECT)],
                                    capture_output=True, text=True, check=True).stdout)
    sizes = {t["name"]: t["size"] for t in btf["types"] if t.get("kind") == "STRUCT" and "name" in t}
    assert sizes["port_cfg"] == ports._CFG.size and sizes["port_state"] == ports._STATE.size


def test_quantiles_and_deltas():
    hist = [10] + [0] * (HIST_BUCKETS - 1)
    assert ports.quantile(hist, 100, 0.99) == 0  # bucket 0: the queue was empty
    hist[5] = 90
    assert ports.quantile(hist, 100, 0.5) == 500 and ports.quantile([0] * HIST_BUCKETS, 100, 0.5) is None
    cfg = {"buffer": 6300}
    before = {"n": {"e": {"packets": 5, "bytes": 50, "max_queue": 900, "ce_marked": 1, "trimmed": 0, "dropped": 0,
                          "queue_hist": [5] + [0] * (HIST_BUCKETS - 1), "hist_width": 100, "config": cfg}}}
    after_hist = [5, 0, 3] + [0] * (HIST_BUCKETS - 3)
    after = {"n": {"e": {**before["n"]["e"], "packets": 8, "ce_marked": 3, "queue_hist": after_hist}}}
    d = ports.delta(before, after)["n"]["e"]
    assert (d["packets"], d["ce_marked"], d["max_queue"], d["queue_p99"]) == (3, 2, 200, 200)


def test_tc_messages_equal_pyroute2():
    from pyroute2.netlink import NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST
    from pyroute2.netlink.rtnl.tcmsg import tcmsg

    def encode(msg, kind, seq):
        msg["header"].update(type=kind, flags=NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL, sequence_number=seq,
                             pid=0)
        msg.encode()
        return bytes(msg.data)

    qdisc = tcmsg()
    qdisc["family"], qdisc["index"], qdisc["handle"], qdisc["parent"], qdisc["info"] = 0, 40, 0xFFFF0000, 0xFFFFFFF1, 0
    qdisc["attrs"] = [("TCA_KIND", "clsact")]
    bpf = tcmsg()
    bpf["family"], bpf["index"], bpf["handle"], bpf["parent"], bpf["info"] = 0, 40, 1, 0xFFFFFFF3, (1 << 16) | 0x0300
    bpf["attrs"] = [("TCA_KIND", "bpf"), ("TCA_OPTIONS", {"attrs": [
        ("TCA_BPF_FD", 7), ("TCA_BPF_NAME", "mrc-port"), ("TCA_BPF_FLAGS", 1)]})]
    batch = ports.TcBatch()
    batch.clsact(40)
    batch.bpf_egress(40, 7)
    assert batch.messages() == [encode(qdisc, 36, 1), encode(bpf, 44, 2)]


def test_the_ordering_htb_requests_read_back_as_pyroute2_decodes_them():
    """ports.TcBatch.order_classes: the HTB under TBF's class 1:1, its two classes (2:1 prio 0,
    2:2 prio 1, both far above the port's rate, with an Ethernet link layer), a pfifo under each."""
    from pyroute2.netlink.rtnl.tcmsg import tcmsg

    batch = ports.TcBatch()
    batch.order_classes(40, 100_000_000, 2_550_000, 4096)
    got = []
    for raw in batch.messages():
        msg = tcmsg(raw)
        msg.decode()
        got.append((msg.get_attr("TCA_KIND"), msg["handle"], msg["parent"], msg))
    assert [(k, h, p) for k, h, p, _ in got] == [
        ("htb", ports.ORDER_HANDLE, ports.TBF_HANDLE | 1), ("htb", ports.CLASS_AHEAD, ports.ORDER_HANDLE),
        ("pfifo", 0x210000, ports.CLASS_AHEAD), ("htb", ports.CLASS_DATA, ports.ORDER_HANDLE),
        ("pfifo", 0x220000, ports.CLASS_DATA)]
    assert got[0][3].get_attr("TCA_OPTIONS").get_attr("TCA_HTB_INIT")["defcls"] == ports.CLASS_DATA & 0xFFFF
    for (_, _, _, msg), prio in ((got[1], 0), (got[3], 1)):
        parms = msg.get_attr("TCA_OPTIONS").get_attr("TCA_HTB_PARMS")
        # 16x the port's 100 MB/s; pyroute2 names the link layer byte 'reserved' (1: Ethernet)
        assert parms["prio"] == prio and parms["rate"] == parms["ceil"] == 16 * 100_000_000 and parms["rate___reserved"] == 1


@pytest.fixture(scope="module")
def fluid(tmp_path_factory):
    """fluid.h compiled for this host, as it is: its two functions, called through ctypes."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the port program's fluid.h for the host")
    where = tmp_path_factory.mktemp("fluid")
    (where / "shim.c").write_text('#include "fluid.h"\n'
                                  "__u64 supply(__u64 dt, __u64 rate) { return fluid_supply(dt, rate); }\n"
                                  "__u64 refill(__u64 t, __u64 r, __u64 b) { return fluid_refill(t, r, b); }\n")
    subprocess.run([cc, "-O2", "-Wall", "-Werror", "-shared", "-fPIC", "-I", str(FLUID.parent), str(where / "shim.c"),
                    "-o", str(where / "libfluid.so")], check=True)
    lib = ctypes.CDLL(str(where / "libfluid.so"))
    lib.supply.restype = lib.refill.restype = ctypes.c_uint64
    lib.supply.argtypes, lib.refill.argtypes = [ctypes.c_uint64] * 2, [ctypes.c_uint64] * 3
    return lib


def test_the_virtual_queue_drains_rate_x_time_exactly_at_800_gbit_and_beyond(fluid):
    """rate x dt overflowed 64 bits at 800 Gbit/s once a port idled 0.18 s (fluid.h): the split
    product is the exact floor(rate x dt / 1e9) for every 64-bit rate and dt up to the 1 s reset."""
    second = 10**9
    rate_800g = 800 * 10**9 // 8
    assert rate_800g * second > U64  # the product the program once formed
    rates = [0, 1, 999_999_999, second, second + 1, rate_800g, 1600 * 10**9 // 8, 10**12 + 12345, U64 // second, U64]
    dts = [0, 1, 184_467_441, 999_999_999, second]
    pick = random.Random(0)
    pairs = [(dt, rate) for dt in dts for rate in rates]
    pairs += [(pick.randrange(second + 1), pick.randrange(U64 + 1)) for _ in range(2000)]
    for dt, rate in pairs:
        assert fluid.supply(dt, rate) == dt * rate // second, (dt, rate)
    assert fluid.supply(5 * second, rate_800g) == rate_800g  # longer than the reset: clamped to it


def test_the_bucket_refills_to_its_burst_without_wrapping(fluid):
    burst = 50_000
    assert fluid.refill(10, 20, burst) == 30
    assert fluid.refill(10, burst - 10, burst) == burst
    assert fluid.refill(10, U64, burst) == burst  # 10 + U64 wraps to 9
    assert fluid.refill(80_000, 5, burst) == burst  # a burst lowered below what the bucket held
