"""What a responder hands its user: registered memory regions and WRITE_WITH_IMM completions.

Why it exists: these two records are the responder's interface to whoever registers buffers and
waits for immediates (the worker, tests); they hold no protocol logic, so they live apart from
the responder's packet checks (responder.py), which they would otherwise crowd.
"""

from __future__ import annotations

from dataclasses import dataclass, field


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
