"""Every number the C code shares with Python is the same on both sides.

The C files cannot import the Python constants, so each repeats the ones it needs as #defines
(opcodes, header lengths, DSCPs, flags, bucket counts), struct layouts and names. These tests
read the C source, evaluate its #defines and compare each with the Python constant it stands
for; every #define with a value must be either compared here or listed as the C file's own,
with the reason, so that a new one gets a decision.
"""

from __future__ import annotations

import errno
import re
import struct
from pathlib import Path

import pytest

from mrc_emu.fabric.datapath import ports, srv6
from mrc_emu.io import port as io_port
from mrc_emu.io import sockets
from mrc_emu.topology import addressing, model, port_verdict
from mrc_emu.topology import port as topo_port
from mrc_emu.transport import config, responder, sent
from mrc_emu.wire import format as fmt
from mrc_emu.wire import headers

PKG = Path(__file__).resolve().parents[1] / "mrc_emu"
PLACE, SPRAY, SOCKIO = "transport/_place.c", "transport/_spray.c", "io/_sockio.c"
BPF, FLUID, VERDICT = "fabric/bpf/port.bpf.c", "fabric/bpf/fluid.h", "fabric/bpf/verdict.h"
SRV6 = "fabric/bpf/srv6.bpf.c"

# (C file, #define, the Python value it must equal)
SHARED = [
    (PLACE, "MAX_WINDOW", config.MAX_MPR * config.MPR_PSNS),
    (PLACE, "OP_WRITE_ONLY", fmt.Opcode.RDMA_WRITE_ONLY),
    (PLACE, "OP_WRITE_FIRST", fmt.Opcode.RDMA_WRITE_FIRST),
    (PLACE, "OP_WRITE_MIDDLE", fmt.Opcode.RDMA_WRITE_MIDDLE),
    (PLACE, "OP_WRITE_LAST", fmt.Opcode.RDMA_WRITE_LAST),
    (PLACE, "BTH_LEN", fmt.BTH_LEN),
    (PLACE, "HEAD_LEN", fmt.BTH_LEN + fmt.RETH_LEN),
    (PLACE, "DSCP_TRIMMED", fmt.DSCP_TRIMMED),
    (PLACE, "DSCP_TRIMMED_LASTHOP", fmt.DSCP_TRIMMED_LASTHOP),
    (PLACE, "ECN_CE", fmt.ECN_CE),
    (PLACE, "REORDER_BUCKETS", responder.REORDER_BUCKETS),
    (BPF, "IP6_LEN", fmt.IPV6_LEN),
    (BPF, "UDP_LEN", fmt.UDP_LEN),
    (BPF, "NH_UDP", headers.NH_UDP),
    (BPF, "NH_IPV6", headers.NH_IPV6),
    (BPF, "NH_ROUTING", headers.NH_ROUTING),
    (BPF, "ROCE_PORT", fmt.ROCE_UDP_PORT),
    (BPF, "OP_WRITE_ONLY", fmt.Opcode.RDMA_WRITE_ONLY),
    (BPF, "OP_WRITE_ONLY_IMM", fmt.Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE),
    (BPF, "DSCP_TRIMMABLE", fmt.DSCP_TRIMMABLE),
    (BPF, "CLASS_AHEAD", ports.CLASS_AHEAD),
    (BPF, "CLASS_DATA", ports.CLASS_DATA),
    (BPF, "DSCP_TRIMMED", fmt.DSCP_TRIMMED),
    (BPF, "DSCP_TRIMMED", ports.DSCP_TRIMMED),  # the fabric repeats the wire's DSCPs (it never imports wire)
    (BPF, "DSCP_TRIMMED_LASTHOP", fmt.DSCP_TRIMMED_LASTHOP),
    (BPF, "DSCP_TRIMMED_LASTHOP", ports.DSCP_TRIMMED_LASTHOP),
    (BPF, "ECN_CE", fmt.ECN_CE),
    (BPF, "HIST_BUCKETS", topo_port.HIST_BUCKETS),
    (BPF, "MAX_TRIM_BYTES", topo_port.MAX_TRIM_BYTES),
    (VERDICT, "PORT_ENABLED", port_verdict.PORT_ENABLED),
    (VERDICT, "PORT_ECN", port_verdict.PORT_ECN),
    (VERDICT, "PORT_TRIM", port_verdict.PORT_TRIM),
    (VERDICT, "PORT_LASTHOP", port_verdict.PORT_LASTHOP),
    (SRV6, "IP6_LEN", fmt.IPV6_LEN),
    (SRV6, "NH_ROUTING", headers.NH_ROUTING),
    (SRV6, "SRH_FIXED_LEN", fmt.SRH_FIXED_LEN),
    (SRV6, "USID_BLOCK", addressing.USID_BLOCK),
    (SRV6, "DECAP_FUNCTION", addressing.USID_DECAP_FUNCTION),
    (SRV6, "ENDX_BASE", addressing.ENDX_FUNCTION_BASE),
    (SRV6, "MAX_PORTS", srv6.MAX_PORTS),
    (SRV6, "NODE_HOST", srv6.NODE_HOST),
]

# (C file, #define, what its value must hold against the Python side, the Python value)
BOUNDS = [
    (SOCKIO, "MAX_BATCH", "at least io/port.py's RECV_BATCH (recv_batch cuts a larger count)", io_port.RECV_BATCH),
    (SOCKIO, "SLOT_BYTES", "at least the largest fabric MTU (a datagram never exceeds it)", model.MAX_MTU),
    (SPRAY, "SLOT_BYTES", "at least the largest fabric MTU (a frame never exceeds it)", model.MAX_MTU),
]

# #defines with a value that are the C file's own, and why
C_ONLY = {
    (SOCKIO, "SEND_MANY_MAX"): "frames per sendmmsg of the batch sender, which loops over more",
    (SPRAY, "BATCH"): "frames the send loop encodes before it sends them",
    (SPRAY, "MAX_CACHED"): "EVs one call of the send loop keeps parsed",
    (SPRAY, "MAX_SEEN"): "EVs the C delivery aggregates before it merges them",
    (PLACE, "WORDS"): "the SACK window's bitmap words, from MAX_WINDOW",
    (BPF, "ETH_LEN"): "the Ethernet header the program sees; Python never builds one",
    (BPF, "TRIMMED_HERE"): "the skb mark of a packet the program trimmed and sent round again",
    (BPF, "PSEUDO_LEN"): "the UDP pseudo header the program sums",
    (SRV6, "ETH_LEN"): "the Ethernet header the program sees; Python never builds one",
    (SRV6, "SRH_TYPE"): "the SRH's routing type (RFC 8754), which the wire layer writes as a literal",
    (SRV6, "DA_OFF"): "where the outer destination lies in the frame",
    (SRV6, "SRH_OFF"): "where the SRH lies in the frame",
    (FLUID, "NS_PER_S"): "the unit of the fluid arithmetic",
    (FLUID, "FLUID_RESET_NS"): "how long a port idles before it starts empty",
    ("wire/crc32.h", "HAVE_CLMUL"): "a build switch",
    ("transport/send_many.h", "SEND_MANY_CAPSULE"): "a name both sides of which are C",
}

_DEFINE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+(\w+)(\([^)]*\))?[ \t]*(.*)$", re.MULTILINE)
_COMMENT = re.compile(r"/\*.*?\*/|//.*$", re.MULTILINE)


def c_defines(path: str) -> dict[str, tuple[str | None, str]]:
    """#define name -> (its parameters, or None; its value text, comments removed)."""
    text = (PKG / path).read_text()
    return {m[1]: (m[2], _COMMENT.sub("", m[3]).strip()) for m in _DEFINE.finditer(text)}


def c_value(path: str, name: str) -> int:
    """The integer an object-like #define of `path` stands for (other #defines of it substituted)."""
    defines = c_defines(path)
    params, text = defines[name]
    assert params is None, f"{path}: {name} is a function-like macro"
    for _ in range(10):
        replaced = re.sub(r"\b[A-Za-z_]\w*\b", lambda m: defines[m[0]][1] if m[0] in defines else m[0], text)
        if replaced == text:
            break
        text = replaced
    text = re.sub(r"(?<=[0-9a-fA-F])(?:ULL|LL|UL|U|L)\b", "", text)
    assert re.fullmatch(r"[0-9a-fA-FxX()+\-*/ <|&]+", text), f"{path}: {name} = {text!r} is not integer arithmetic"
    return int(eval(text.replace("/", "//")))  # digits and operators only (checked above)


def _c_files() -> list[str]:
    return sorted(p.relative_to(PKG).as_posix() for p in [*PKG.rglob("*.c"), *PKG.rglob("*.h")])


@pytest.mark.parametrize("path, name, python", SHARED, ids=[f"{p}:{n}={v!r}" for p, n, v in SHARED])
def test_a_shared_define_equals_its_python_constant(path, name, python):
    assert c_value(path, name) == int(python)


@pytest.mark.parametrize("path, name, why, python", BOUNDS, ids=[f"{p}:{n}" for p, n, _, _ in BOUNDS])
def test_a_c_size_bounds_what_python_hands_it(path, name, why, python):
    assert c_value(path, name) >= python, f"{path} {name}: {why}"


def test_every_define_with_a_value_is_compared_or_said_to_be_the_c_files_own():
    checked = {(p, n) for p, n, _ in SHARED} | {(p, n) for p, n, _, _ in BOUNDS} | set(C_ONLY)
    found = {(path, name) for path in _c_files() for name, (params, text) in c_defines(path).items()
             if params is None and text and not name.startswith("_")}
    assert found - checked == set(), "add each to SHARED (with its Python constant) or C_ONLY (with why)"
    assert checked - found == set(), "gone from the C source: take it out of this test"


def test_the_c_sender_reads_a_failed_send_as_the_python_one_does():
    """PORT_DOWN: the frame cannot leave (False); QUEUE_FULL: lost at the host (True)."""
    defines = c_defines(SOCKIO)
    for macro, python in (("PORT_DOWN", sockets.PORT_DOWN_ERRNOS), ("QUEUE_FULL", sockets.QUEUE_FULL_ERRNOS)):
        names = set(re.findall(r"\bE[A-Z]+\b", defines[macro][1]))
        assert names == {errno.errorcode[e] for e in python}, macro


_FIELD_CODES = {"__u64": "Q", "__u32": "I", "struct bpf_spin_lock": "I"}  # bpf_spin_lock: one __u32


def _c_struct(path: str, name: str) -> list[tuple[str, int]]:
    """A C struct of `path` as (field, its struct code) per scalar, in order, arrays expanded."""
    body = re.search(rf"struct {name} \{{(.*?)\n\}};", (PKG / path).read_text(), re.S)[1]
    out = []
    for decl in _COMMENT.sub("", body).split(";"):
        m = re.fullmatch(r"\s*(struct \w+|\w+)\s+(.+?)\s*", decl)
        if m is None:
            continue
        for item in m[2].split(","):
            field, count = re.fullmatch(r"\s*(\w+)(?:\[(\w+)\])?\s*", item).groups()
            n = 1 if count is None else (int(count) if count.isdigit() else c_value(path, count))
            out += [(field, _FIELD_CODES[m[1]])] * n
    return out


def _layout(codes: list[str], aligned: bool) -> list[int]:
    """Each field's offset: C's natural alignment, or struct's '<' (none), then the total size."""
    offsets, at = [], 0
    for code in codes:
        size = struct.calcsize("<" + code)
        if aligned:
            at = -(-at // size) * size
        offsets.append(at)
        at += size
    widest = max(struct.calcsize("<" + c) for c in codes)
    return offsets + [-(-at // widest) * widest if aligned else at]


@pytest.mark.parametrize("c_name, python", [("port_cfg", ports._CFG), ("port_state", ports._STATE)])
def test_the_port_programs_map_values_have_pythons_layout(c_name, python):
    codes = [code for _, code in _c_struct(BPF, c_name)]
    python_codes = [c for count, c in re.findall(r"(\d*)([A-Za-z])", python.format) for _ in range(int(count or 1))]
    assert codes == python_codes
    assert _layout(codes, aligned=True) == _layout(python_codes, aligned=False)  # no padding either side


def test_the_names_python_loads_are_the_programs():
    for path, program, maps in ((BPF, ports.PROGRAM, (ports.CFG_MAP, ports.STATE_MAP)), (SRV6, srv6.PROGRAM, (srv6.MAP,))):
        text = (PKG / path).read_text()
        assert re.search(rf'SEC\("tc"\)\s*int {program}\(', text)
        for name in maps:
            assert re.search(rf"\}} {name} SEC\(\"\.maps\"\);", text), name


def test_the_srv6_programs_map_value_has_pythons_layout():
    """struct srv6_node: node_id, flags (two __u32), then MAX_PORTS / 8 bytes of End.X ports."""
    body = re.search(r"struct srv6_node \{(.*?)\n\};", (PKG / SRV6).read_text(), re.S)[1]
    fields = re.findall(r"^\s*(__u32|__u8) (\w+)(?:\[([^\]]+)\])?;", _COMMENT.sub("", body), re.M)
    assert [(t, n) for t, n, _ in fields] == [("__u32", "node_id"), ("__u32", "flags"), ("__u8", "endx")]
    assert fields[2][2] == "MAX_PORTS / 8" and srv6._NODE.format == f"<II{srv6.MAX_PORTS // 8}s"


def test_the_c_records_have_the_fields_of_their_python_twins():
    """_spray.Pkt is sent.PyPkt, and _place.QpState holds responder.py's shared QP fields."""
    spray = pytest.importorskip("mrc_emu.transport._spray", reason="mrc_emu.transport._spray is not built")
    place = pytest.importorskip("mrc_emu.transport._place", reason="mrc_emu.transport._place is not built")
    public = lambda cls: {n for n in dir(cls) if not n.startswith("_")} - set(dir(object))  # noqa: E731
    assert public(spray.Pkt) == set(sent.PyPkt.__slots__)
    assert public(place.QpState) == set(responder._SHARED)
