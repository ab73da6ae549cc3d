"""A tc ingress program at the hosts that carries an outer CE mark into the inner IPv6 header.

Why it exists: the hosts' kernel decapsulates SRv6 (Segments Left 0, next header IPv6: exthdrs.c)
without RFC 6040's ECN step, so a CE set in the outer header only is lost, and the endpoints read
the inner one. The port program (bpf/port.bpf.c) marks both headers itself; the kernel's RED
(`port: {model: red}`, red.py) marks the outer only. So under model red every host port gets this
program on its ingress (clsact, direct action, before the IPv6 stack): if the outer header says
CE and the inner one is ECN-capable, the inner becomes CE too (RFC 6040's decapsulation; an inner
Not-ECT is left as it is, where RFC 6040 would drop). IPv6 headers have no checksum and UDP's does
not cover the traffic class, so nothing else changes. Written as its instructions (no compiler
needed), like xdp.py:

    if eth.type != IPv6 or outer.ecn != CE: pass
    inner = outer + 40 (next header 41) or + 40 + 8 + 8 * srh.hdrlen (next header 43, SRH's 41)
    if inner.version == 6 and inner.ecn != 0: inner.ecn = CE
    pass
"""

from __future__ import annotations

import os

from ..kernel import bpfobj
from ..kernel.bpfobj import BpfError, load_instructions
from .xdp import _insn

BPF_PROG_TYPE_SCHED_CLS = 3
TC_ACT_OK = 0
SKB_DATA, SKB_DATA_END = 76, 80  # offsetof(struct __sk_buff, data), (..., data_end)
ETH_P_IPV6_LE = 0xDD86  # 0x86DD as a little-endian u16 load sees it
NEXTHDR_IPV6, NEXTHDR_ROUTING = 41, 43
CE_BITS = 0x30  # the ECN field in the second byte of an IPv6 header


class EcnDecapError(BpfError):
    """The kernel refused the program."""


def _assemble(items: list) -> list[bytes]:
    """Instructions with named jump targets: a str is a label, a tuple (code, dst, src, imm, label)
    a conditional jump to it, anything else an instruction."""
    at, labels = 0, {}
    for item in items:
        if isinstance(item, str):
            labels[item] = at
        else:
            at += 1
    out: list[bytes] = []
    for item in items:
        if isinstance(item, str):
            continue
        if isinstance(item, tuple):
            code, dst, src, imm, label = item
            out.append(_insn(code, dst, src, off=labels[label] - (len(out) + 1), imm=imm))
        else:
            out.append(item)
    return out


JNE_IMM, JEQ_IMM, JGT_REG = 0x55, 0x15, 0x2D


def program() -> list[bytes]:
    """The instructions (r1: the __sk_buff; r2 data, r3 data_end; r0 = TC_ACT_OK always)."""
    return _assemble([
        _insn(0x61, 2, 1, off=SKB_DATA), _insn(0x61, 3, 1, off=SKB_DATA_END),  # r2 = data, r3 = data_end
        _insn(0xBF, 4, 2), _insn(0x07, 4, imm=54), (JGT_REG, 4, 3, 0, "pass"),  # Ethernet + outer IPv6 there
        _insn(0x69, 5, 2, off=12), (JNE_IMM, 5, 0, ETH_P_IPV6_LE, "pass"),
        _insn(0x71, 5, 2, off=15), _insn(0x57, 5, imm=CE_BITS), (JNE_IMM, 5, 0, CE_BITS, "pass"),  # outer CE
        _insn(0x71, 5, 2, off=20), _insn(0xB7, 8, imm=54),  # next header; the inner at 54 if it is IPv6
        (JEQ_IMM, 5, 0, NEXTHDR_IPV6, "inner"),
        (JNE_IMM, 5, 0, NEXTHDR_ROUTING, "pass"),
        _insn(0xBF, 4, 2), _insn(0x07, 4, imm=62), (JGT_REG, 4, 3, 0, "pass"),  # the SRH's fixed 8 bytes
        _insn(0x71, 5, 2, off=54), (JNE_IMM, 5, 0, NEXTHDR_IPV6, "pass"),  # SRH's next header: IPv6
        _insn(0x71, 8, 2, off=55), _insn(0x67, 8, imm=3), _insn(0x07, 8, imm=62),  # r8 = 62 + 8 x hdrlen
        "inner",
        _insn(0x0F, 2, 8), _insn(0xBF, 4, 2), _insn(0x07, 4, imm=2), (JGT_REG, 4, 3, 0, "pass"),  # r2: inner
        _insn(0x71, 5, 2, off=0), _insn(0x77, 5, imm=4), (JNE_IMM, 5, 0, 6, "pass"),  # inner version 6
        _insn(0x71, 5, 2, off=1), _insn(0xBF, 4, 5), _insn(0x57, 4, imm=CE_BITS),
        (JEQ_IMM, 4, 0, 0, "pass"),  # inner Not-ECT: left as it is
        _insn(0x47, 5, imm=CE_BITS), _insn(0x73, 2, 5, off=1),  # inner ECN = CE
        "pass",
        _insn(0xB7, 0, imm=TC_ACT_OK), _insn(0x95),
    ])


def load() -> int:
    """The program's fd (close it once a filter holds it)."""
    return load_instructions(BPF_PROG_TYPE_SCHED_CLS, program(), EcnDecapError, "the ECN decapsulation program")


def test_run(prog_fd: int, frame: bytes) -> tuple[int, bytes]:
    """(return value, frame out) of the program on one frame (BPF_PROG_TEST_RUN): how the unit of
    it is checked without a fabric."""
    return bpfobj.test_run(prog_fd, frame, EcnDecapError)


def close(fd: int) -> None:
    os.close(fd)
