"""The fault record of a running fabric: every fault in force, what, where, since when and by whom.

Why it exists: faults are made by several hands (`mrc-emu fault ...` and `link down` from a shell,
a scenario's fault agents) and outlive the process that made them (an nft rule, a reshaped TBF, a
link left down). `mrc-emu fault list` must show all of them and `fault clear` must undo exactly
them, also after the process that made one was killed. So each fault is written here *before*
it is applied (an entry says how to undo it) and cleared after it was undone.

The record is append-only JSON lines in /run/mrc-emu/<fabric>-faults/record, one write per line
(O_APPEND: writers in several processes never interleave a line, and a kill loses nothing but a
line cut short, which replay skips). The directory is in the fabric's journal before it exists,
so `down` and `clean` remove it with the fabric. It never acts on the fabric: fault_ops.py does.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .. import registry
from ..kernel import netns
from ..running import Fabric

RECORD = "record"

# How a fault acts on the fabric (and so how it is undone): the fault's mechanism.
LINK = "link"  # links taken down (undo: up, with their configuration)
NFT = "nft"  # an nft drop rule on the ingress of `ends` (fabric/faults/nft.py)
XDP = "xdp"  # a fault agent's dropping program on the ingress of `ends` (fabric/datapath/xdp.py)
TBF = "tbf"  # the egress TBF of `ends` reshaped (undo: back to undo["rate_bps"])
NETEM = "netem"  # a netem qdisc on the egress of `ends` (fabric/datapath/impair.py)
MECHANISMS = (LINK, NFT, XDP, TBF, NETEM)


def directory(name: str) -> Path:
    return registry.STATE_DIR / f"{name}-faults"


@dataclass(frozen=True)
class Entry:
    """One fault in force. `ends`: the (node, interface) pairs it acts on; `links`: their link ids."""

    id: str
    kind: str  # link-down, degrade, delay, loss, blackhole, flap, switch-reboot, plane-down
    target: str  # "p0l0-p0s1", "p0l0->p0s1" (one direction), "p0s1", "h0 plane 1"
    mechanism: str
    ends: tuple[tuple[str, str], ...]
    links: tuple[int, ...]
    params: dict[str, Any] = field(default_factory=dict)  # {"rate": 0.25}, {"ms": 5}, {"percent": 5}
    by: str = "cli"  # "cli", "scenario <name> (<transport>)"
    pid: int = 0  # the process that applied it
    pid_start: int | None = None  # its start time, to tell it from a reused pid
    since: float = 0.0  # unix time
    undo: dict[str, Any] = field(default_factory=dict)  # what the mechanism needs to undo it

    @classmethod
    def new(cls, kind: str, target: str, mechanism: str, ends, links, params: dict | None = None, by: str = "cli",
            pid: int | None = None, undo: dict | None = None) -> Entry:
        if mechanism not in MECHANISMS:
            raise ValueError(f"unknown fault mechanism {mechanism!r}")
        pid = os.getpid() if pid is None else pid
        return cls(uuid.uuid4().hex[:8], kind, target, mechanism, tuple((n, i) for n, i in ends), tuple(links),
                   dict(params or {}), by, pid, netns.process_start_time(pid), time.time(), dict(undo or {}))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Entry:
        data = dict(data)
        data["ends"] = tuple(tuple(end) for end in data["ends"])
        data["links"] = tuple(data["links"])
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["ends"] = [list(end) for end in self.ends]
        out["links"] = list(self.links)
        return out

    def owner_alive(self) -> bool:
        """Whether the process that applied it still runs (a CLI command has usually ended)."""
        return self.pid_start is not None and netns.process_start_time(self.pid) == self.pid_start

    def params_text(self) -> str:
        """'rate 0.25 (100 Mbit/s)', 'ms 5', 'percent 5'; '' without parameters."""
        shown = []
        for key, value in self.params.items():
            if key.endswith("_bps"):
                shown[-1:] = [f"{shown[-1]} ({value / 1e6:g} Mbit/s)"] if shown else [f"{value / 1e6:g} Mbit/s"]
            else:
                shown.append(f"{key} {value:g}" if isinstance(value, (int, float)) else f"{key} {value}")
        return ", ".join(shown)

    def describe(self) -> str:
        params = self.params_text()
        return f"{self.kind} {self.target}" + (f" ({params})" if params else "")


def append_line(fabric: Fabric, directory: Path, path: Path, line: dict[str, Any]) -> None:
    """Append one JSON line to a record file of the fabric's (one O_APPEND write: writers in several
    processes never interleave, a kill loses at most that line); its directory is journaled before
    it exists, so `down` and `clean` remove it with the fabric."""
    if not directory.exists():
        fabric.journal.directory(directory)
        directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (json.dumps(line, separators=(",", ":")) + "\n").encode())
    finally:
        os.close(fd)


class FaultRecord:
    """The record of one running fabric (opened from its `Fabric`, whose journal it joins)."""

    def __init__(self, fabric: Fabric) -> None:
        self.fabric = fabric
        self.directory = directory(fabric.name)
        self.path = self.directory / RECORD

    def _append(self, line: dict[str, Any]) -> None:
        append_line(self.fabric, self.directory, self.path, line)

    def add(self, entry: Entry) -> Entry:
        """Record a fault about to be applied (before it is: a crash leaves it listed, never hidden)."""
        self._append({"op": "add", "entry": entry.to_dict()})
        return entry

    def clear(self, entry_id: str) -> None:
        """The fault was undone."""
        self._append({"op": "clear", "id": entry_id, "time": time.time()})

    def active(self) -> list[Entry]:
        """Every fault in force, oldest first."""
        try:
            lines = self.path.read_text().splitlines()
        except FileNotFoundError:
            return []
        entries: dict[str, Entry] = {}
        for number, line in enumerate(lines, 1):
            try:
                item = json.loads(line)
            except json.JSONDecodeError:
                if number == len(lines):
                    continue  # a write cut short by a kill
                raise registry.RegistryError(f"{self.path}, line {number}: not a fault record entry") from None
            if item.get("op") == "add":
                entry = Entry.from_dict(item["entry"])
                entries[entry.id] = entry
            elif item.get("op") == "clear":
                entries.pop(item["id"], None)
        return list(entries.values())

    def on_links(self, link_ids: set[int] | list[int]) -> list[Entry]:
        """The faults in force that act on any of these links."""
        wanted = set(link_ids)
        return [e for e in self.active() if wanted & set(e.links)]
