"""The port program's rule in one place: fabric/bpf/verdict.h compiled for the host, held equal to
topology/port_verdict.py on the same packet sequences; and what a port reads of a frame and does
to its bytes (wire/switchport.py), against what port.bpf.c's classify, mark_ce and trim do."""

from __future__ import annotations

import ctypes
import random
import shutil
import subprocess

import pytest

from mrc_emu.fabric.datapath import ports
from mrc_emu.topology import builtin
from mrc_emu.topology.port_verdict import PORT_ECN, PORT_ENABLED, PORT_LASTHOP, PORT_TRIM, PortRule, Verdict, pmax_fixed, port_verdict
from mrc_emu.transport.multipath.paths import qp_paths
from mrc_emu.wire import format as fmt
from mrc_emu.wire import switchport
from mrc_emu.wire.decoder import decode_trimmed, open_frame
from mrc_emu.wire.format import AckPacket, DataPacket, TrimmedPacket

VERDICT_H = ports.OBJECT.parent / "verdict.h"


@pytest.fixture(scope="module")
def c_verdict(tmp_path_factory):
    """verdict.h compiled for this host, as it is: port_verdict through a ctypes shim that hands
    back the verdict and the length the packet enters the queue with."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the port program's verdict.h for the host")
    where = tmp_path_factory.mktemp("verdict")
    (where / "shim.c").write_text(
        '#include "verdict.h"\n'
        "int verdict(__u64 q, __u32 *len, __u32 trim_len, int data, int trim_ok, int ect, __u32 flags, __u64 thr,\n"
        "            __u64 buf, __u64 kmin, __u64 kmax, __u64 pmax, __u32 rnd)\n"
        "{ return port_verdict(q, len, trim_len, data, trim_ok, ect, flags, thr, buf, kmin, kmax, pmax, rnd); }\n")
    subprocess.run([cc, "-O2", "-Wall", "-Werror", "-shared", "-fPIC", "-I", str(VERDICT_H.parent), str(where / "shim.c"),
                    "-o", str(where / "libverdict.so")], check=True)
    lib = ctypes.CDLL(str(where / "libverdict.so"))
    u64, u32 = ctypes.c_uint64, ctypes.c_uint32
    lib.verdict.restype = ctypes.c_int
    lib.verdict.argtypes = [u64, ctypes.POINTER(u32), u32, ctypes.c_int, ctypes.c_int, ctypes.c_int, u32,
                            u64, u64, u64, u64, u64, u32]

    def call(queue, length, trim_length, data, trim_ok, ect, flags, threshold, buffer, kmin, kmax, pmax, random32):
        n = u32(length)
        got = lib.verdict(queue, ctypes.byref(n), trim_length, data, trim_ok, ect, flags, threshold, buffer, kmin, kmax,
                          pmax, random32)
        return Verdict(got), n.value

    return call


def _both(c_verdict, *args):
    python = port_verdict(*args)
    assert c_verdict(*args) == python, args
    return python


def test_each_branch_of_the_rule_in_c_and_python(c_verdict):
    cfg = dict(flags=PORT_ENABLED | PORT_ECN | PORT_TRIM, threshold=50_000, buffer=200_000, kmin=10_000, kmax=40_000,
               pmax=pmax_fixed(0.2))

    def run(queue, length=4200, trim_length=100, data=True, trim_ok=True, ect=True, random32=0, **over):
        c = {**cfg, **over}
        return _both(c_verdict, queue, length, trim_length, data, trim_ok, ect, c["flags"], c["threshold"], c["buffer"],
                     c["kmin"], c["kmax"], c["pmax"], random32)

    assert run(0) == (Verdict.PASS, 4200)
    assert run(10_000) == (Verdict.PASS, 4200)  # at kmin: not above it
    assert run(10_001, random32=0) == (Verdict.MARK, 4200)  # just above kmin, the lowest draw
    assert run(25_000, random32=2**32 - 1) == (Verdict.PASS, 4200)  # halfway: p = pmax / 2, the highest draw misses
    assert run(40_001, random32=2**32 - 1) == (Verdict.MARK, 4200)  # above kmax: always
    assert run(45_801) == (Verdict.TRIM, 100)  # 45,801 + 4,200 > the trim threshold
    assert run(45_801, trim_ok=False) == (Verdict.MARK, 4200)  # DSCP_NO_TRIM: marked, not trimmed
    assert run(196_000, trim_ok=False) == (Verdict.DROP, 4200)  # ... and dropped above the buffer
    assert run(199_950) == (Verdict.DROP, 100)  # trimmed and still over the buffer
    assert run(45_801, flags=PORT_ENABLED | PORT_ECN) == (Verdict.MARK, 4200)  # trim off
    assert run(30_000, flags=PORT_ENABLED | PORT_TRIM) == (Verdict.PASS, 4200)  # ECN off
    assert run(30_000, ect=False) == (Verdict.PASS, 4200)  # not ECN-capable
    assert run(60_000, data=False) == (Verdict.PASS, 4200)  # control: never marked or trimmed
    assert run(60_000, trim_length=4200) == (Verdict.MARK, 4200)  # no shorter once trimmed: not trimmable
    assert run(30_000, kmax=10_000) == (Verdict.MARK, 4200)  # kmax <= kmin: a step at kmin


def test_random_packet_sequences_get_the_same_verdicts_from_c_and_python(c_verdict):
    """A port's queue as the virtual fabric keeps it (a verdict's length enters it, a random drain
    between arrivals), for ports of the incast topology and random ones: every verdict agrees."""
    pick = random.Random(7)
    topo = builtin("incast")
    rules = [PortRule.of(p) for p in topo.egress_ports()[:6]]
    for _ in range(20):
        kmin = pick.randrange(0, 100_000)
        rules.append(PortRule(pick.choice([PORT_ENABLED, PORT_ENABLED | PORT_ECN, PORT_ENABLED | PORT_TRIM,
                                           PORT_ENABLED | PORT_ECN | PORT_TRIM | PORT_LASTHOP]),
                              pick.randrange(1, 400_000), kmin, kmin + pick.randrange(-1000, 100_000),
                              pick.randrange(0, 2**32), pick.randrange(1, 300_000), 28))
    seen = set()
    for rule in rules:
        queue = 0
        for _ in range(400):
            length = pick.choice([100, 300, 4200, 9100, pick.randrange(60, 9200)])
            trim_length = pick.choice([90, 130, length, length + 1])
            args = (queue, length, trim_length, pick.random() < 0.8, pick.random() < 0.8, pick.random() < 0.9,
                    rule.flags, rule.trim_threshold, rule.buffer, rule.kmin, rule.kmax, rule.pmax, pick.getrandbits(32))
            verdict, entered = _both(c_verdict, *args)
            assert rule.verdict(*args[:6], args[-1]) == (verdict, entered)
            seen.add(verdict)
            if verdict is not Verdict.DROP:
                queue += entered
            queue = max(0, queue - pick.randrange(0, 12_000))
    assert seen == set(Verdict)  # every branch was taken


def test_a_port_rule_is_what_the_program_is_told():
    """PortRule.of gives the numbers fabric/datapath/ports.py packs into struct port_cfg."""
    topo = builtin("incast")
    for port in topo.egress_ports()[:8]:
        rule = PortRule.of(port)
        fields = ports._CFG.unpack(ports._cfg_bytes(port, topo.link_rate_bps, topo.mtu))
        assert (fields[1], fields[3], fields[4], fields[5], fields[6], fields[7], fields[8]) == (
            rule.flags, rule.buffer, rule.kmin, rule.kmax, rule.pmax, rule.trim_threshold, rule.trim_bytes)
    assert pmax_fixed(1.0) == 2**32 - 1 and pmax_fixed(0.5) == 2**31


# ---- what a port reads of a frame and does to it ----------------------------------------------

TOPO = builtin()


def _frame(ev_format, packet, trimmable=True):
    from mrc_emu.topology.evs import EvFormat

    paths = qp_paths(TOPO, "h0", "h2", EvFormat(ev_format), trimmable=trimmable)
    return bytearray(paths.forward[1].template.encode(packet))


DATA = DataPacket(0x11, 7, 0x1000, 0xABC, b"x" * 1000)


@pytest.mark.parametrize("ev_format", ["SRV6", "SRV6_USID", "UDP"])
def test_classify_reads_what_the_program_reads(ev_format):
    frame = _frame(ev_format, DATA)
    inner, udp, data, trim_ok, ect = switchport.classify(frame)
    assert data and trim_ok and ect
    assert frame[udp:udp + 2] == (0xC001).to_bytes(2, "big") and frame[udp + 8] == fmt.Opcode.RDMA_WRITE_ONLY
    assert (inner == 0) == (ev_format == "UDP") and frame[inner] >> 4 == 6
    assert switchport.classify(_frame(ev_format, DATA, trimmable=False))[3] is False  # DSCP_NO_TRIM
    assert switchport.classify(_frame(ev_format, AckPacket(0x11, 7, 0, 1)))[2] is False  # control
    assert switchport.classify(b"\x60" + bytes(10)) == switchport.NOT_DATA  # not UDP
    assert switchport.classify(frame[:udp + 4]) == switchport.NOT_DATA  # cut short: left alone


@pytest.mark.parametrize("ev_format", ["SRV6", "SRV6_USID", "UDP"])
@pytest.mark.parametrize("lasthop", [False, True])
def test_a_trimmed_frame_is_what_the_destination_kernel_accepts(ev_format, lasthop):
    frame = _frame(ev_format, DATA)
    inner, udp, *_ = switchport.classify(frame)
    switchport.trim(frame, inner, udp, 28, lasthop)
    assert len(frame) == switchport.trimmed_length(udp, 28)
    opened = open_frame(frame)  # lengths and the UDP checksum as the kernel checks them
    assert not isinstance(opened, fmt.DropReason), opened
    dscp = fmt.DSCP_TRIMMED_LASTHOP if lasthop else fmt.DSCP_TRIMMED
    assert opened.tclass == dscp << 2 | fmt.ECN_ECT0 and switchport.tclass(frame, 0) == opened.tclass
    trimmed = decode_trimmed(opened.payload)
    assert isinstance(trimmed, TrimmedPacket) and (trimmed.psn, trimmed.va, trimmed.dma_len) == (7, 0x1000, 1000)
    assert switchport.classify(frame) == switchport.NOT_DATA  # trimmed: never marked or trimmed again


@pytest.mark.parametrize("ev_format", ["SRV6", "UDP"])
def test_a_mark_sets_ce_in_both_headers_and_nothing_else(ev_format):
    frame = _frame(ev_format, DATA)
    before = bytes(frame)
    inner = switchport.classify(frame)[0]
    switchport.mark_ce(frame, inner)
    assert switchport.tclass(frame, 0) & 3 == switchport.tclass(frame, inner) & 3 == fmt.ECN_CE
    assert open_frame(frame).ecn_ce and not isinstance(open_frame(frame), fmt.DropReason)
    changed = [i for i in range(len(frame)) if frame[i] != before[i]]
    assert changed == sorted({1, inner + 1})  # the ECN bits sit in each header's second byte
