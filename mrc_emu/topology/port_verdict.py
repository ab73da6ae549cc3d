"""A switch egress port's verdict on an arriving packet: pass, mark CE, trim, or drop.

Why it exists: the rule is the port program's (fabric/bpf/verdict.h, run by port.bpf.c in
every port of the namespace fabric), and the virtual fabric's ports must apply exactly the same
one, to the same thresholds. It is a pure function of the queue's bytes, the packet's length and
what the packet is, so it lives here once, as plain integers like the C; tests/test_port_verdict.py
compiles verdict.h for the host and holds the two equal on the same packet sequences. What the
packet is (data? trimmable? ECN-capable?) is read from its bytes by wire/switchport.py; the
queue is whatever the caller keeps (the program's fluid model of TBF, the virtual fabric's
exact backlog). It never draws randomness: the caller passes a uniform 32-bit draw.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from .port import PortConfig

PMAX_ONE = 1 << 32  # pmax is a probability in 1/2^32 (struct port_cfg's pmax)
PORT_ENABLED, PORT_ECN, PORT_TRIM, PORT_LASTHOP = 1, 2, 4, 8  # struct port_cfg's flags (verdict.h)


class Verdict(IntEnum):
    """enum verdict of verdict.h, in its order."""

    PASS = 0
    MARK = 1
    TRIM = 2
    DROP = 3


def pmax_fixed(pmax: float) -> int:
    """A marking probability as the port program holds it: in 1/2^32, at most 2^32 - 1."""
    return min(PMAX_ONE - 1, round(pmax * PMAX_ONE))


def port_verdict(queue: int, length: int, trim_length: int, data: bool, trim_ok: bool, ect: bool, flags: int,
                 threshold: int, buffer: int, kmin: int, kmax: int, pmax: int, random32: int) -> tuple[Verdict, int]:
    """verdict.h's port_verdict, argument for argument: the verdict, and the length the packet
    enters the queue with (`trim_length` once trimmed). Trimmable (data, DSCP_TRIMMABLE, a
    trimming port, longer than its trimmed self) and taking the queue over `threshold`: trimmed;
    then, taking it over `buffer`: dropped; ECN-capable data on a marking port finding more than
    kmin: marked with a probability rising linearly to pmax (1/2^32) at kmax, always above it."""
    trimmable = data and trim_ok and flags & PORT_TRIM and trim_length < length
    markable = data and ect and flags & PORT_ECN
    verdict = Verdict.PASS
    if trimmable and queue + length > threshold:
        verdict, length = Verdict.TRIM, trim_length
    if queue + length > buffer:
        return Verdict.DROP, length
    if verdict is Verdict.TRIM:
        return verdict, length
    if markable and queue > kmin and (queue > kmax or kmax <= kmin or random32 < pmax * (queue - kmin) // (kmax - kmin)):
        return Verdict.MARK, length
    return Verdict.PASS, length


@dataclass(frozen=True)
class PortRule:
    """One egress port's numbers as the port program is given them (fabric/datapath/ports.py
    _cfg_bytes): its flags, the thresholds in bytes, pmax in 1/2^32."""

    flags: int
    buffer: int
    kmin: int
    kmax: int
    pmax: int
    trim_threshold: int
    trim_bytes: int

    @classmethod
    def of(cls, port: PortConfig) -> PortRule:
        if port.model != "bpf":
            raise ValueError(f"{port.node} {port.ifname}: port model {port.model!r}: only the port program's "
                             f"rule ('bpf') is shared")
        return cls(port_flags(port), port.buffer, port.kmin, port.kmax, pmax_fixed(port.pmax), port.trim_threshold,
                   port.trim_bytes)

    @property
    def lasthop(self) -> bool:
        return bool(self.flags & PORT_LASTHOP)

    def verdict(self, queue: int, length: int, trim_length: int, data: bool, trim_ok: bool, ect: bool,
                random32: int) -> tuple[Verdict, int]:
        return port_verdict(queue, length, trim_length, data, trim_ok, ect, self.flags, self.trim_threshold,
                            self.buffer, self.kmin, self.kmax, self.pmax, random32)


def port_flags(port: PortConfig) -> int:
    """The flags of a port the program runs the rule on (model bpf)."""
    return (PORT_ENABLED | (PORT_ECN if port.ecn else 0) | (PORT_TRIM if port.trim else 0)
            | (PORT_LASTHOP if port.lasthop else 0))
