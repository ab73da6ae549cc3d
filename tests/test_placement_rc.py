"""An RC peer's multi-packet WRITE (FIRST / MIDDLE / LAST, as rdma_rxe sends it) placed by the
responder's C path (_place.c) against its Python path: the same bytes, ACKs, NAKs, drops and QP
state, datagram by datagram (issue 31: a 64 MiB WRITE from rxe took 0.5 ms a packet in Python
under the VM's emulated CPU, and rxe's requester timed out waiting).

The Python path of responder.py is the reference (tests/test_placement.py says the same of MRC's
own WRITE_ONLY packets); the C path takes only the packets it can place exactly as Python would
and leaves every other one to it, untouched.
"""

from __future__ import annotations

import random
import socket

import pytest
from conftest import CountingPlacer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mrc_emu.topology import builtin
from mrc_emu.transport import responder as responder_module
from mrc_emu.transport.config import QpConfig
from mrc_emu.transport.multipath.paths import qp_paths
from mrc_emu.transport.responder import Responder
from mrc_emu.wire import format as fmt
from mrc_emu.wire.decoder import open_frame
from mrc_emu.wire.format import DataPacket, Opcode

pytestmark = pytest.mark.skipif(responder_module._place is None, reason="the C placement (mrc_emu.transport._place) "
                                "is not built: python setup.py build_ext --inplace")

TOPO = builtin()
PATHS = qp_paths(TOPO, "h0", "h2")
SRC = socket.inet_pton(socket.AF_INET6, PATHS.src_address)
DST = socket.inet_pton(socket.AF_INET6, PATHS.dst_address)
OTHER = socket.inet_pton(socket.AF_INET6, qp_paths(TOPO, "h1", "h2").src_address)
MTU = 256
QPN, PEER_QPN, START = 0x33, 0x44, 0xFFFFF8  # the PSNs wrap within the first messages
FIRST, MIDDLE, LAST, LAST_IMM = (Opcode.RDMA_WRITE_FIRST, Opcode.RDMA_WRITE_MIDDLE, Opcode.RDMA_WRITE_LAST,
                                 Opcode.RDMA_WRITE_LAST_WITH_IMMEDIATE)


def _stream(sizes: list[int], va: int, rkey: int) -> list[DataPacket]:
    """The WRITEs of `sizes` bytes, one after the other in the region from `va`, as an RC requester
    sends them: FIRST (RETH: the whole length), MIDDLEs, LAST (a one-packet message: WRITE ONLY)."""
    out: list[DataPacket] = []
    for size in sizes:
        data = bytes((va + i) & 0xFF for i in range(size))
        chunks = [data[i:i + MTU] for i in range(0, size, MTU)]
        for i, chunk in enumerate(chunks):
            psn = (START + len(out)) & fmt.PSN_MASK
            if len(chunks) == 1:
                out.append(DataPacket(QPN, psn, va, rkey, chunk, True))
                continue
            op = FIRST if i == 0 else LAST if i == len(chunks) - 1 else MIDDLE
            out.append(DataPacket(QPN, psn, va if op == FIRST else 0, rkey if op == FIRST else 0, chunk, op == LAST,
                                  rc_opcode=int(op), dma_len=size if op == FIRST else -1))
        va += size
    return out


# what is done to the packet delivered: nothing (most), or one thing a lossy link, a retrying
# requester or a broken one could do
_KINDS = ["ok"] * 8 + ["as_first", "as_middle", "as_last", "last_imm", "short", "long", "bad_rkey", "out_of_bounds",
                       "small_dma_len", "bad_icrc", "truncated", "bad_pkey", "wrong_peer", "ack_req"]
_TCLASSES = [fmt.TCLASS_DATA_NO_TRIM] * 5 + [fmt.TCLASS_DATA_NO_TRIM | fmt.ECN_CE, 0]
datagram = st.tuples(st.one_of(st.just(0), st.integers(-4, 4)), st.sampled_from(_KINDS), st.sampled_from(_TCLASSES),
                     st.booleans())


def _mutated(packet: DataPacket, kind: str, mr, region_len: int) -> tuple[bytes, bytes]:
    """(UDP payload, source address) of `packet` after `kind` (`mr`: the region the WRITEs go to)."""
    p = DataPacket(packet.dest_qp, packet.psn, packet.va, packet.rkey, packet.payload, packet.ack_req, packet.imm,
                   packet.pkey, False, packet.rc_opcode, packet.dma_len)
    src = SRC
    if kind == "as_first":  # a new message from here (a retry's FIRST, or a broken requester's): 3 packets long
        p.rc_opcode, p.va, p.rkey, p.dma_len = int(FIRST), mr.va + region_len - 3 * MTU, mr.rkey, 3 * MTU
    elif kind in ("as_middle", "as_last", "last_imm") and p.rc_opcode is not None and p.rc_opcode != FIRST:
        p.rc_opcode = int({"as_middle": MIDDLE, "as_last": LAST, "last_imm": LAST_IMM}[kind])
        p.imm = 0x1A2B if kind == "last_imm" else None
    elif kind == "short":
        p.payload = bytes(p.payload)[:-5]  # pad bytes, and a length the message does not expect
    elif kind == "long" and p.rc_opcode is not None:
        p.payload = bytes(p.payload) + b"\x77" * 4
    elif kind == "bad_rkey" and p.rkey:
        p.rkey ^= 1
    elif kind == "out_of_bounds" and p.rkey:
        p.va = mr.va + region_len - 8
    elif kind == "small_dma_len" and p.rc_opcode == FIRST:
        p.dma_len = len(p.payload) - 1
    elif kind == "bad_pkey":
        p.pkey = 0x7FFF
    elif kind == "wrong_peer":
        src = OTHER
    elif kind == "ack_req":
        p.ack_req = True
    opened = open_frame(PATHS.forward[0].template.encode(p))
    payload = bytes(opened.payload)
    if kind == "bad_icrc":
        payload = payload[:-1] + bytes([payload[-1] ^ 0x10])
    elif kind == "truncated":
        payload = payload[:10]
    return payload, src


def _responder(c_path: bool, go_back_n: bool, region_len: int):
    config = QpConfig.baseline(mtu=MTU, cnp=True, cnp_interval_ns=5_000) if go_back_n else QpConfig(mtu=MTU)
    responder = Responder(DST, config, random_bits=random.Random(1).getrandbits, c_path=c_path)
    buffer = bytearray(region_len)
    mr = responder.register(buffer, va=0x3000_0000, pd=1)
    responder.register(bytearray(4096), va=0x5000_0000, pd=2)  # another protection domain's region
    responder.accept(QPN, PEER_QPN, START, {0: PATHS.back[0]}, peer=SRC, pd=1, config=config)
    responder.post_recv(QPN, 3)
    return responder, mr, buffer


def _state(responder: Responder) -> dict:
    qp = responder.qps[QPN]
    fields = ("epsn", "received", "since_ack", "unacked_since", "ack_due", "echo_psn", "echo_ev", "echo_at", "ecn",
              "nak", "nak_sent_at", "nak_psn", "pending_imm", "ce_counts", "cnp_due", "cnp_last", "top_psn",
              "reorder", "reorder_max", "not_ends")
    state = {f: (list(v) if isinstance(v := getattr(qp, f), list) else dict(v) if isinstance(v, dict) else v)
             for f in fields}  # copies: a Python QP's go on changing after this snapshot
    message = qp.message
    state["message"] = None if message is None else (message[0].rkey, message[1], message[2])
    return state


def _run(c_path: bool, go_back_n: bool, sizes: list[int], datagrams) -> tuple:
    region_len = sum(sizes) + 4 * MTU
    responder, mr, buffer = _responder(c_path, go_back_n, region_len)
    counting = None
    if responder._place is not None:
        counting = responder._place = CountingPlacer(responder._place)
    stream = _stream(sizes, mr.va, mr.rkey)
    frames, trace = [], []
    for i, (delta, kind, tclass, pump) in enumerate(datagrams):
        qp = responder.qps[QPN]
        index = min(max(qp.epsn - START + delta, 0), len(stream) - 1)
        payload, src = _mutated(stream[index], kind, mr, region_len)
        responder.on_datagram(payload, src, PATHS.forward[0].template.ends.sport, 1000 * i, tclass)
        if pump:
            responder.pump(1000 * i + 500, lambda frame, path: frames.append(bytes(frame)) or True)
        trace.append((dict(responder.stats), dict(responder.drops), _state(responder)))
    responder.pump(10**12, lambda frame, path: frames.append(bytes(frame)) or True)
    completions = [(c.psn, c.imm, c.time_ns) for c in responder.completions]
    return (trace, frames, bytes(buffer), completions, dict(responder.recvs)), counting


sizes_strategy = st.lists(st.integers(1, 6 * MTU), min_size=1, max_size=8)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sizes=sizes_strategy, datagrams=st.lists(datagram, min_size=20, max_size=200), go_back_n=st.booleans())
def test_c_placement_of_rc_messages_does_what_the_python_path_does(sizes, datagrams, go_back_n):
    """An RC peer's WRITEs in order, with gaps, duplicates, retries from a FIRST, a MIDDLE or LAST
    the message does not expect (no FIRST, too long, a LAST of the wrong length), LAST WITH
    IMMEDIATE, a FIRST whose message leaves the region or whose RETH is shorter than its own
    payload, bad R_Key, P_Key, ICRC, peer, CE marks, on a go-back-N QP and on an MRC one: after
    every datagram the same counters, drops and QP state (the message under way included), and
    the same frames sent, bytes placed and completions."""
    (with_c, counting), (without_c, _) = (_run(c, go_back_n, sizes, datagrams) for c in (True, False))
    assert with_c == without_c
    assert counting.placed <= with_c[0][-1][0]["packets_placed"]


@pytest.mark.parametrize("go_back_n", [True, False])
def test_a_clean_stream_of_rc_writes_is_placed_in_c(go_back_n):
    """In order and whole, every FIRST, MIDDLE and LAST is placed by the C path (and WRITE ONLY);
    the region holds every message, and the ACKs' MSN counts messages, as with the Python path."""
    sizes = [5 * MTU, MTU, 3 * MTU - 7, 2 * MTU, 64 * MTU + 1]
    datagrams = [(0, "ok", fmt.TCLASS_DATA_NO_TRIM, i % 7 == 0) for i in range(sum(-(-s // MTU) for s in sizes))]
    (with_c, counting), (without_c, _) = (_run(c, go_back_n, sizes, datagrams) for c in (True, False))
    assert with_c == without_c
    stats, drops, state = with_c[0][-1]
    assert counting.placed == stats["packets_placed"] == len(datagrams) and not drops
    assert state["epsn"] - START == len(datagrams) and state["message"] is None
    assert state["not_ends"] == len(datagrams) - len(sizes)
    expected = b"".join(bytes((0x3000_0000 + sum(sizes[:k]) + i) & 0xFF for i in range(s)) for k, s in enumerate(sizes))
    assert with_c[2][:sum(sizes)] == expected


def test_the_message_reads_and_writes_as_the_python_tuple():
    """`message` is None or (region, offset of the next byte, bytes left), as responder.py keeps it."""
    responder, mr, _ = _responder(True, True, 8 * MTU)
    qp = responder.qps[QPN]
    assert type(qp).__name__ == "_CQp" and qp.message is None and qp.not_ends == 0
    qp.message = (mr, 5, 7)
    assert qp.message == (mr, 5, 7) and qp.message[0] is mr
    qp.message = None
    assert qp.message is None
    with pytest.raises(TypeError):
        qp.message = (mr, 5)
    with pytest.raises(TypeError):
        del qp.message
