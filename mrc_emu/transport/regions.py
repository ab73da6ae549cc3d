"""What a responder hands its user: registered memory regions and WRITE_WITH_IMM completions.

Why it exists: these two records are the responder's interface to whoever registers buffers and
waits for immediates (the worker, tests); they hold no protocol logic, so they live apart from
the responder's packet checks (responder.py), which they would otherwise crowd. Beside them, the
two address rules the responder applies: where a packet's bytes land in a region (`reach`), and
where an RC peer's next packet of a multi-packet WRITE lands (`next_of_message`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

Message = tuple["MemoryRegion", int, int]  # an RC peer's WRITE under way: region, offset of the next byte, bytes left


@dataclass
class MemoryRegion:
    """A registered buffer: remote writes land here if R_Key and bounds match and the writing QP
    belongs to the region's protection domain."""

    rkey: int
    va: int
    buffer: bytearray
    pd: int = 0
    view: memoryview = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.view = memoryview(self.buffer)

    @property
    def length(self) -> int:
        return len(self.buffer)

    def to_dict(self) -> dict:
        return {"rkey": self.rkey, "va": self.va, "length": self.length}


@dataclass
class ImmCompletion:
    """A responder's WRITE_WITH_IMM whose data, and all data before it, is placed."""

    psn: int
    imm: int
    time_ns: int


def reach(mr: MemoryRegion | None, pd: int, va: int, length: int) -> int | str:
    """The offset in `mr` that `length` bytes at `va` go to, or why not: an unknown R_Key, or
    another protection domain's, which is as invalid ("bad_rkey"), or outside it ("out_of_bounds")."""
    if mr is None or mr.pd != pd:
        return "bad_rkey"
    start = va - mr.va
    return "out_of_bounds" if start < 0 or start + length > mr.length else start


def next_of_message(message: Message | None, length: int, last: bool) -> tuple[Message, Message | None] | str:
    """An RC peer's MIDDLE (`last` False) or LAST of `length` bytes: (where it goes, the message
    after it), or why not: no FIRST opened a message ("rc_no_first"), or the bytes do not fit
    what its RETH announced, a LAST exactly ("rc_bad_length")."""
    if message is None:
        return "rc_no_first"
    mr, start, left = message
    if length > left or (last and length != left):
        return "rc_bad_length"
    return message, None if last else (mr, start + length, left - length)
