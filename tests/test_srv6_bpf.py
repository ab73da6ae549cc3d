"""The BPF SRv6 endpoint program (fabric/bpf/srv6.bpf.c) against the virtual fabric's model of
seg6local End (NEXT-C-SID) and End.X (vfabric/forwarding.py, which tests/test_vfabric_forwarding.py
holds to the kernel routes config.py plans): on the same frame at the same node, the program
drops exactly what the model drops and leaves exactly the bytes the model leaves. Run with
BPF_PROG_TEST_RUN (the frame enters as if on loopback, interface index 1, so the map's entry 1
says which node it is); needs root, no fabric."""

from __future__ import annotations

import os
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mrc_emu.fabric import cabling
from mrc_emu.fabric.datapath import srv6
from mrc_emu.fabric.kernel import bpfobj
from mrc_emu.topology import addressing as ad
from mrc_emu.topology import builtin
from mrc_emu.vfabric.forwarding import Hop, Rib, end, next_segment

pytestmark = pytest.mark.system
TC_ACT_OK, TC_ACT_SHOT = 0, 2
ETH = bytes(6) + bytes(6) + b"\x86\xdd"
TOPO = builtin("default")
NODES = sorted(TOPO.nodes)


class Program:
    def __init__(self) -> None:
        if srv6.missing_object():
            pytest.fail(srv6.missing_object())
        self.prog, maps = bpfobj.load(srv6.OBJECT, srv6.PROGRAM, {srv6.MAP: 2})
        self.map = bpfobj.MapHandle(maps[srv6.MAP], srv6._NODE.size)
        records = srv6.node_records(TOPO)  # any interface of a node carries its record
        self.records = {name: records[cabling.index_of(TOPO.links_of(name)[0], name)] for name in NODES}

    def run(self, node: str, frame: bytes) -> tuple[int, bytes]:
        self.map.put(1, self.records[node])
        return bpfobj.test_run(self.prog, frame)

    def close(self) -> None:
        self.map.close()
        os.close(self.prog)


@pytest.fixture(scope="module")
def program():
    p = Program()
    yield p
    p.close()


def model(node: str, packet: bytes) -> tuple[int, bytes]:
    """What the kernel's seg6local would do at `node`, as the virtual fabric has it: (verdict, packet)."""
    hop, _ = Rib(TOPO, node).lookup(packet[24:40])
    frame = bytearray(packet)
    if hop is Hop.END_X:
        return (TC_ACT_OK, bytes(frame)) if next_segment(frame) else (TC_ACT_SHOT, None)
    if hop is Hop.END:
        return (TC_ACT_OK, bytes(frame)) if end(frame) else (TC_ACT_SHOT, None)
    return TC_ACT_OK, packet  # local, or routed elsewhere: untouched


def ipv6(dst: bytes, next_header: int, payload: bytes) -> bytes:
    return struct.pack("!IHBB", 0x60000000, len(payload), next_header, 64) + bytes(16) + dst + payload


def srh(segments: list[bytes], left: int) -> bytes:
    return struct.pack("!BBBBBBH", 41, 2 * len(segments), 4, left, len(segments) - 1, 0, 0) + b"".join(segments)


INNER = ipv6(bytes(16), 17, b"\x12\xb7\x12\xb7\x00\x10\x00\x00" + bytes(8))
node_ids = st.sampled_from([TOPO.node(n).node_id for n in NODES] + [0x7FF])
functions = st.one_of(st.just(0), st.just(ad.USID_DECAP_FUNCTION), st.integers(ad.ENDX_FUNCTION_BASE, ad.ENDX_FUNCTION_BASE + 8),
                      st.integers(0, 0xFFFF))
tails = st.one_of(st.just(bytes(8)), st.binary(min_size=8, max_size=8),
                  st.lists(node_ids, min_size=1, max_size=4).map(lambda ids: b"".join(i.to_bytes(2, "big") for i in ids).ljust(8, b"\0")))


@st.composite
def addresses(draw):
    block = draw(st.sampled_from([ad.USID_BLOCK.to_bytes(4, "big"), bytes.fromhex("fc000002"), bytes.fromhex("20010db8")]))
    return block + draw(node_ids).to_bytes(2, "big") + draw(functions).to_bytes(2, "big") + draw(tails)


@st.composite
def packets(draw):
    dst = draw(addresses())
    if draw(st.booleans()):
        segments = draw(st.lists(addresses(), min_size=1, max_size=5))
        left = draw(st.integers(0, len(segments)))
        return ipv6(dst, 43, srh(segments, left) + INNER)
    return ipv6(dst, 41, INNER)


@settings(max_examples=400, deadline=None)
@given(node=st.sampled_from(NODES), packet=packets())
def test_the_program_does_what_seg6local_does(program, node, packet):
    verdict, out = program.run(node, ETH + packet)
    want, expected = model(node, packet)
    assert verdict == want
    if want == TC_ACT_OK:
        assert out[14:] == expected


def test_every_kind_of_sid_is_met(program):
    """The cases the property must reach, each once by name: a spine's uN shifting a carrier, a
    leaf's End.X on an SRH, a host's decapsulation address (untouched), a switch's End on a spent
    carrier and SRH at Segments Left 0 (dropped), another node's SID (forwarded untouched)."""
    spine, leaf, host = "p0s0", "p0l0", "h0"

    def sid(name, fn=0, tail=bytes(8)):
        return ad.USID_BLOCK.to_bytes(4, "big") + TOPO.node(name).node_id.to_bytes(2, "big") + fn.to_bytes(2, "big") + tail

    carrier = sid(spine, TOPO.node(host).node_id, ad.USID_DECAP_FUNCTION.to_bytes(2, "big") + bytes(6))
    verdict, out = program.run(spine, ETH + ipv6(carrier, 41, INNER))
    assert verdict == TC_ACT_OK and out[14 + 24:14 + 40] == sid(host, ad.USID_DECAP_FUNCTION)
    port = ad.port_of(TOPO.peer(TOPO.links_of(leaf)[0], leaf)[1])
    segs = [sid(host, ad.USID_DECAP_FUNCTION), sid(leaf, ad.ENDX_FUNCTION_BASE + port)]
    verdict, out = program.run(leaf, ETH + ipv6(segs[1], 43, srh(segs, 1) + INNER))
    assert verdict == TC_ACT_OK and out[14 + 24:14 + 40] == segs[0] and out[14 + 43] == 0
    local = ETH + ipv6(sid(host, ad.USID_DECAP_FUNCTION), 43, srh(segs, 0) + INNER)
    assert program.run(host, local) == (TC_ACT_OK, local)
    assert program.run(spine, ETH + ipv6(sid(spine), 43, srh(segs, 0) + INNER))[0] == TC_ACT_SHOT
    other = ETH + ipv6(sid(leaf), 41, INNER)
    assert program.run(spine, other) == (TC_ACT_OK, other)


def test_a_short_or_foreign_frame_passes_untouched(program):
    """(The kernel's test run refuses an IPv6 frame shorter than its header; the verifier holds the
    program's bounds checks.)"""
    carrier = ad.USID_BLOCK.to_bytes(4, "big") + TOPO.node("p0s0").node_id.to_bytes(2, "big") + b"\x00\x01" + bytes(8)
    ipv4 = bytes(12) + b"\x08\x00" + b"\x45" + bytes(19) + carrier  # IPv4 whose bytes would read as a SID
    for frame in (ipv4, bytes(12) + b"\x08\x06" + bytes(28)):
        assert program.run("p0s0", frame) == (TC_ACT_OK, frame)
