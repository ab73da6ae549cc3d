"""An XDP program that drops packets on a link's ingress: blackholes and random loss, in microseconds.

Why it exists: a fault's moment must be sharp and must not disturb what it measures. An
nft rule needs an nft process (about 15 ms of CPU on a 2-core VM, felt by the transfer);
attaching or swapping an XDP program waits for RCU and stalls forwarding for milliseconds.
So the program is attached before the run and reads its drop fraction from a BPF array
map; a fault is one bpf(BPF_MAP_UPDATE_ELEM) call. The kernel here has no netem, no tc gact
and no matchall, but it runs (generic) XDP on veths. The program is written here as its
instructions (no compiler needed):

    key = 0; t = map[key]; if t == 0: pass; if t == 0xffffffff: drop;
    if prandom_u32() >= t: pass; drop
"""

from __future__ import annotations

import ctypes
import os
import struct

from ..kernel.bpfobj import BpfError, bpf_syscall, load_instructions

BPF_PROG_TYPE_XDP = 6
XDP_DROP, XDP_PASS = 1, 2


class XdpError(BpfError):
    """The kernel refused to load or attach an XDP program."""


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhI", code, (src << 4) | dst, off, imm & 0xFFFFFFFF)


BPF_MAP_CREATE, BPF_MAP_UPDATE_ELEM = 0, 2
BPF_MAP_TYPE_ARRAY = 2
BPF_PSEUDO_MAP_FD = 1


def _bpf(cmd: int, attr: ctypes.Array) -> int:
    return bpf_syscall(cmd, attr, XdpError)


def dropper_program(map_fd: int) -> list[bytes]:
    """Drop a fraction of packets read from slot 0 of an array map: threshold/2^32 (0xFFFFFFFF: all)."""
    return [
        _insn(0x62, 10, off=-4, imm=0),  # *(u32 *)(r10 - 4) = 0: the key
        _insn(0x18, 1, BPF_PSEUDO_MAP_FD, imm=map_fd), _insn(0),  # r1 = the map (ld_imm64)
        _insn(0xBF, 2, 10),  # r2 = r10
        _insn(0x07, 2, imm=-4),  # r2 += -4
        _insn(0x85, imm=1),  # call bpf_map_lookup_elem
        _insn(0x15, 0, off=7, imm=0),  # if r0 == 0 goto pass
        _insn(0x61, 7, 0),  # r7 = *(u32 *)(r0 + 0): the threshold
        _insn(0x15, 7, off=5, imm=0),  # if r7 == 0 goto pass
        _insn(0x16, 7, off=2, imm=-1),  # if w7 == 0xffffffff goto drop
        _insn(0x85, imm=7),  # call bpf_get_prandom_u32
        _insn(0x3E, 0, 7, off=2),  # if w0 >= w7 goto pass (JMP32 JGE, unsigned)
        _insn(0xB7, 0, imm=XDP_DROP), _insn(0x95),  # drop: r0 = XDP_DROP; exit
        _insn(0xB7, 0, imm=XDP_PASS), _insn(0x95),  # pass: r0 = XDP_PASS; exit
    ]


class Dropper:
    """An XDP program whose drop fraction is a value in a BPF map: changing it is one syscall,
    with no program swap (which waits for an RCU grace period and stalls forwarding)."""

    def __init__(self) -> None:
        attr = ctypes.create_string_buffer(72)
        struct.pack_into("<IIII", attr, 0, BPF_MAP_TYPE_ARRAY, 4, 4, 1)
        self.map_fd = _bpf(BPF_MAP_CREATE, attr)
        try:
            self.prog_fd = _load(dropper_program(self.map_fd))
        except OSError:
            os.close(self.map_fd)
            raise
        self._key = ctypes.c_uint32(0)
        self._value = ctypes.c_uint32(0)

    def set(self, fraction: float) -> None:
        """Drop this fraction of packets from now on (0: none, 1: all)."""
        self._value.value = 0xFFFFFFFF if fraction >= 1 else max(0, int(fraction * 2**32))
        attr = ctypes.create_string_buffer(32)
        struct.pack_into("<IIQQQ", attr, 0, self.map_fd, 0, ctypes.addressof(self._key),
                         ctypes.addressof(self._value), 0)
        _bpf(BPF_MAP_UPDATE_ELEM, attr)

    def close(self) -> None:
        os.close(self.prog_fd)
        os.close(self.map_fd)


def _load(instructions: list[bytes]) -> int:
    return load_instructions(BPF_PROG_TYPE_XDP, instructions, XdpError, "an XDP program", 4096)


XDP_FLAGS_SKB_MODE = 2  # generic XDP: native XDP on a veth refuses MTUs above a page's worth (ERANGE)


def attach(ipr, index: int, fd: int) -> None:
    """Attach (fd >= 0) or detach (fd = -1) the XDP program of interface `index` (pyroute2 IPRoute)."""
    try:
        ipr.link("set", index=index, xdp={"attrs": [("IFLA_XDP_FD", fd), ("IFLA_XDP_FLAGS", XDP_FLAGS_SKB_MODE)]})
    except Exception as exc:  # pyroute2's NetlinkError carries the errno
        raise XdpError(getattr(exc, "code", 0), f"attaching XDP to interface {index} failed: {exc}") from None
