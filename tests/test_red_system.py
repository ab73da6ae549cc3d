"""The RED port model for real (root). Where the kernel has sch_red (the Vagrant VM): a `model:
red` fabric's ports are TBF -> HTB -> RED with the port block's numbers, the hosts carry RED's
outer CE inward, and an incast is marked by RED and seen by the receivers. Here (no sch_red):
`up --port-model red` is refused in one line naming the module, leaving nothing. Everywhere: the
ECN decapsulation program does what it says on crafted frames, and on a fabric it breaks nothing."""

from __future__ import annotations

import os
import struct
import subprocess
import sys

import pytest
from conftest import fabric_limited

from mrc_emu.experiments.runtime.transfer import run_transfers
from mrc_emu.experiments.scenarios.transports import Transport
from mrc_emu.fabric import build, registry
from mrc_emu.fabric.datapath import ecn_decap, ports, red
from mrc_emu.fabric.kernel import netns
from mrc_emu.fabric.running import Fabric
from mrc_emu.topology import builtin, from_dict
from mrc_emu.topology.port import with_model

pytestmark = pytest.mark.system
CLI = [sys.executable, "-m", "mrc_emu.cli"]
MiB = 1024 * 1024
BOTTLENECK_BPS = 2 * 400e6  # incast: leaf 0's port towards h0 in each plane
# the incast must fill the bottleneck for a queue to mark: a run where the emulator kept up and
# the flows carried 70 % of it
BUSY_BOTTLENECK = fabric_limited(BOTTLENECK_BPS, share=0.7)
RED_INCAST_MAX_DILATION = 256  # eight senders into one port: in a VM under TCG a worker saturated even at 64 (docs/vagrant.md)
needs_root = pytest.mark.skipif(os.getuid() != 0, reason="needs root (bpf(2))")


def _ip6(tclass: int, next_header: int, payload: int) -> bytes:
    return struct.pack("!IHBB", (6 << 28) | (tclass << 20), payload, next_header, 64) + bytes(range(32))


def _frame(outer_ecn: int, inner_ecn: int, srh_words: int | None) -> bytes:
    """Ethernet / IPv6 / [SRH of 8 + 8 x srh_words bytes] / IPv6 / UDP 4791, DSCP 26."""
    inner = _ip6((26 << 2) | inner_ecn, 17, 8) + struct.pack("!HHHH", 49152, 4791, 8, 0)
    if srh_words is None:
        outer = _ip6((26 << 2) | outer_ecn, 41, len(inner))
    else:
        srh = struct.pack("!BBBBBBH", 41, srh_words, 4, 0, 0, 0, 0) + bytes(8 * srh_words)
        outer = _ip6((26 << 2) | outer_ecn, 43, len(srh) + len(inner)) + srh
    return bytes(6) + bytes(6) + b"\x86\xdd" + outer + inner


@needs_root
@pytest.mark.parametrize("srh_words", [None, 2, 6])
def test_the_decap_program_carries_an_outer_ce_into_an_ect_inner_header(srh_words):
    fd = ecn_decap.load()
    try:
        inner_at = 14 + 40 + (0 if srh_words is None else 8 + 8 * srh_words)
        for outer, inner, expect in [(3, 2, 3), (3, 1, 3), (3, 3, 3), (3, 0, 0), (2, 2, 2), (1, 1, 1), (0, 2, 2)]:
            frame = _frame(outer, inner, srh_words)
            verdict, out = ecn_decap.test_run(fd, frame)
            assert verdict == ecn_decap.TC_ACT_OK and len(out) == len(frame)
            assert (out[inner_at + 1] >> 4) & 3 == expect, (outer, inner)
            assert out[:inner_at + 1] == frame[:inner_at + 1] and out[inner_at + 2:] == frame[inner_at + 2:]
        short = _frame(3, 2, srh_words)[:inner_at + 1]  # the inner ECN byte not there: left alone
        assert ecn_decap.test_run(fd, short) == (ecn_decap.TC_ACT_OK, short)
    finally:
        ecn_decap.close(fd)


def test_the_decap_program_on_every_host_port_breaks_nothing(fabric_name, at_a_dilation_that_keeps_up):
    """On a `model: bpf` incast fabric (the port program marks both headers itself), the program on
    every host's ingress leaves an incast verified and its marks as they were seen."""
    topo = builtin("incast")
    build.up(topo, fabric_name)
    try:
        with Fabric.open(fabric_name) as fabric:
            batches: dict = {}
            fd = ecn_decap.load()
            try:
                red.decap_requests(topo, batches, fd)
                for node, batch in batches.items():
                    with netns.entered(fabric.netns(node)):
                        batch.send()
            finally:
                ecn_decap.close(fd)
            from pyroute2 import IPRoute

            with netns.entered(fabric.netns("h0")), IPRoute() as ipr:
                names = [f.get_nested("TCA_OPTIONS", "TCA_BPF_NAME")
                         for f in ipr.get_filters(index=ports.index_of(topo, "h0", "h0-eth0"), parent=ports.CLSACT_INGRESS)]
            assert red.DECAP_FILTER in names
            specs = [Transport.MRC.spec(src, "h0", 1 * MiB, 4096, topology=topo) for src in ("h4", "h8", "h12", "h16")]
            run, k = at_a_dilation_that_keeps_up(lambda k: run_transfers(fabric, specs, dilation=k), good=BUSY_BOTTLENECK)
            assert all(r.ok for r in run), [r.error for r in run if not r.ok]
            assert sum(r.responder["stats"]["ce_received"] for r in run) > 0  # the program's inner marks get through
    finally:
        build.down(fabric_name)


@pytest.mark.skipif(red.red_missing() is None, reason="this kernel has RED: the RED fabric test runs instead")
def test_up_with_port_model_red_without_red_is_one_line_and_leaves_nothing(fabric_name):
    done = subprocess.run(CLI + ["up", "-t", "incast", "--port-model", "red", "-n", fabric_name],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert "sch_red" in done.stderr and not registry.journal_path(fabric_name).exists()
    assert not netns.netns_path(fabric_name, "h0").exists()


@pytest.mark.skipif(red.red_missing() is not None, reason=str(red.red_missing()))
def test_a_red_fabric_marks_by_red_and_the_receivers_see_it(fabric_name, at_a_dilation_that_keeps_up):
    topo = from_dict({**builtin("incast").to_dict(), "port": with_model(None, "red")}, "<test red>")
    build.up(topo, fabric_name)
    try:
        with Fabric.open(fabric_name) as fabric:
            qdiscs = red.tc_stats(fabric, "p0l0", "p0l0-eth0")
            assert [(q["kind"], q["parent"]) for q in qdiscs if q["kind"] != "clsact"] == [
                ("tbf", None), ("htb", "1:1"), ("pfifo", "2:1"), ("red", "2:2")]
            (red_q,) = [q for q in qdiscs if q["kind"] == "red"]
            assert red_q["handle"] == f"{red.RED_HANDLE >> 16:x}:"
            assert red_q["options"].split()[:6] == ["limit", "200000b", "min", "10000b", "max", "40000b"]
            assert "ecn" in red_q["options"].split()
            specs = [Transport.MRC.spec(src, "h0", 2 * MiB, 4096, topology=topo)
                     for src in ("h4", "h8", "h12", "h16", "h5", "h9", "h13", "h17")]
            bottleneck = (("p0l0", "p0l0-eth0"), ("p1l0", "p1l0-eth0"))
            seen_before: dict = {}

            def incast(k: int):
                seen_before.update(red={at: red.red_counters(fabric, *at) for at in bottleneck}, program=ports.counters(fabric))
                return run_transfers(fabric, specs, dilation=k)

            run, k = at_a_dilation_that_keeps_up(incast, (4, 16, 64, 256), good=BUSY_BOTTLENECK, cap=RED_INCAST_MAX_DILATION)
            assert all(r.ok for r in run), [r.error for r in run if not r.ok]
            before, program_before = seen_before["red"], seen_before["program"]
            marked = sum(red.red_counters(fabric, n, i)["marked"] - before[(n, i)]["marked"] for n, i in before)
            seen = sum(r.responder["stats"]["ce_received"] for r in run)
            program = ports.delta(program_before, ports.counters(fabric))
            print(f"\nRED marked {marked} at the bottleneck (time dilation {k}); the receivers saw {seen} CE; the program (marking off) "
                  f"marked {sum(program[n][i]['ce_marked'] for n, i in before)}")
            assert marked > 0 and seen > 0  # RED's outer marks reach the endpoints (ecn_decap)
            assert all(program[n][i]["ce_marked"] == 0 and program[n][i]["trimmed"] == 0 for n, i in before)
    finally:
        build.down(fabric_name)
    assert not registry.journal_path(fabric_name).exists()
