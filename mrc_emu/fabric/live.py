"""The live board of a running fabric: what the processes working on it say about themselves now.

Why it exists: a transfer runs in its own process (`mrc-emu send`, a scenario) and its QPs'
state (bytes acknowledged, each EV's state and share, the EV events so far) lives only there
until it ends. A watcher in another process (`mrc-emu view`, a script) wants it while it runs.
So each such process publishes one JSON snapshot, /run/mrc-emu/<fabric>-live/<pid>.json,
replaced whole (written beside it, then renamed: a reader never sees half a file), and a
watcher reads every snapshot of the board. The directory is in the fabric's journal before it
exists, so `down` and `clean` remove it with the fabric; a finished run's snapshot stays (the
last thing it said), marked finished.

It never interprets what is published (the runtime decides what a snapshot holds) and never
acts on the fabric.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from . import registry
from .running import Fabric

SUFFIX = ".json"


def directory(name: str) -> Path:
    return registry.STATE_DIR / f"{name}-live"


class LiveBoard:
    """One process's snapshot on a fabric's board; `publish` replaces it."""

    def __init__(self, fabric: Fabric, pid: int | None = None) -> None:
        self.fabric = fabric
        self.directory = directory(fabric.name)
        self.path = self.directory / f"{os.getpid() if pid is None else pid}{SUFFIX}"

    def publish(self, snapshot: dict[str, Any]) -> None:
        """Replace this process's snapshot (with `pid` and `updated_unix` added)."""
        if not self.directory.exists():
            self.fabric.journal.directory(self.directory)  # journaled before it exists
            self.directory.mkdir(parents=True, exist_ok=True)
        body = {**snapshot, "pid": os.getpid(), "updated_unix": round(time.time(), 3)}
        scratch = self.path.with_suffix(".tmp")
        scratch.write_text(json.dumps(body, separators=(",", ":")))
        os.replace(scratch, self.path)


def read_board(name: str) -> list[dict[str, Any]]:
    """Every snapshot on fabric `name`'s board, the most recently updated first (a file being
    replaced as it is read, or unreadable, is left out: the next read has it)."""
    found = []
    try:
        paths = list(directory(name).glob(f"*{SUFFIX}"))
    except OSError:
        return []
    for path in paths:
        try:
            found.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return sorted(found, key=lambda snap: snap.get("updated_unix", 0), reverse=True)
