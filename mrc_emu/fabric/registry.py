"""The registry: a journal of everything a fabric run created, so exactly that is removed.

Why it exists: `down` and `clean` must remove what we made and nothing else, also after a
crash or SIGKILL mid-build. Every namespace and process is written to the journal *before*
it is created (append-only JSON lines, one write each, so a kill loses nothing that exists).
Cleanup reads only the journal: never a name pattern, never a process looked up by name.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .kernel import bpfobj, netns
from .kernel.waiting import WaitTimeout, until

STATE_DIR = Path(os.environ.get("MRC_EMU_STATE_DIR", "/run/mrc-emu"))
_NAME_RE = re.compile(r"^[a-z][a-z0-9]{0,7}$")


class RegistryError(RuntimeError):
    """A fabric name is taken or unknown, or the journal is unreadable."""


def check_name(name: str) -> None:
    if not _NAME_RE.match(name):
        raise RegistryError(f"fabric name {name!r} must be 1-8 lower-case letters or digits, starting with a letter")


def journal_path(name: str) -> Path:
    return STATE_DIR / f"{name}.journal"


@dataclass
class FabricRecord:
    """What the journal of one fabric says, replayed."""

    name: str
    topology: dict[str, Any] = field(default_factory=dict)
    source: str = ""
    namespaces: list[str] = field(default_factory=list)
    processes: dict[int, dict[str, Any]] = field(default_factory=dict)  # live ones only
    down_links: set[int] = field(default_factory=set)
    directories: list[str] = field(default_factory=list)
    bpf_pins: list[str] = field(default_factory=list)  # directories of pinned BPF objects (fabric/datapath/ports.py)
    ready: bool = False
    owner_pid: int | None = None
    routing: str = "none"  # "static" once static_routes.py installed BGP's converged routes


class Journal:
    """Append-only record of one fabric's resources."""

    def __init__(self, name: str, fd: int) -> None:
        self.name = name
        self._fd = fd

    @classmethod
    def create(cls, name: str, header: dict[str, Any]) -> Journal:
        """Claim a fabric name atomically; raise if a fabric of that name exists."""
        check_name(name)
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(journal_path(name), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        except FileExistsError:
            raise RegistryError(
                f"a fabric named {name!r} already exists (journal {journal_path(name)}); "
                f"run 'mrc-emu down --name {name}' or choose another --name"
            ) from None
        journal = cls(name, fd)
        journal.append({"kind": "fabric", "name": name, "owner_pid": os.getpid(), **header})
        return journal

    @classmethod
    def open(cls, name: str) -> Journal:
        check_name(name)
        try:
            fd = os.open(journal_path(name), os.O_WRONLY | os.O_APPEND)
        except FileNotFoundError:
            raise RegistryError(_not_running(name, journal_path(name))) from None
        return cls(name, fd)

    def append(self, entry: dict[str, Any]) -> None:
        os.write(self._fd, (json.dumps(entry, separators=(",", ":")) + "\n").encode())

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # typed helpers, so every writer records the same shapes
    def namespace(self, path: Path) -> None:
        self.append({"kind": "netns", "path": str(path)})

    def process(self, pid: int, what: str) -> None:
        self.append({"kind": "process", "pid": pid, "start": netns.process_start_time(pid), "what": what})

    def directory(self, path: Path) -> None:
        """A directory the project creates (and removes whole on down/clean)."""
        self.append({"kind": "dir", "path": str(path)})

    def process_ended(self, pid: int) -> None:
        self.append({"kind": "process-ended", "pid": pid})

    def routing(self, mode: str) -> None:
        """How the fabric routes plain IPv6 between hosts, besides what every fabric has."""
        self.append({"kind": "routing", "mode": mode})

    def link_state(self, link_id: int, up: bool) -> None:
        self.append({"kind": "link", "link_id": link_id, "up": up, "time": time.time()})


def _not_running(name: str, path: Path) -> str:
    return f"no fabric named {name!r} is running (no {path}); `mrc-emu up -n {name}` starts one"


def read(name: str) -> FabricRecord:
    check_name(name)
    path = journal_path(name)
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        raise RegistryError(_not_running(name, path)) from None
    record = FabricRecord(name)
    for number, line in enumerate(lines, 1):
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):
                continue  # a write cut short by a crash: what it named was never created
            raise RegistryError(f"{path}, line {number}: not a journal entry") from None
        kind = entry.get("kind")
        if kind == "fabric":
            record.topology = entry.get("topology", {})
            record.source = entry.get("source", "")
            record.owner_pid = entry.get("owner_pid")
        elif kind == "netns":
            record.namespaces.append(entry["path"])
        elif kind == "process":
            record.processes[entry["pid"]] = entry
        elif kind == "process-ended":
            record.processes.pop(entry["pid"], None)
        elif kind == "dir":
            record.directories.append(entry["path"])
        elif kind == "bpf-pin":
            record.bpf_pins.append(entry["path"])
        elif kind == "link":
            (record.down_links.discard if entry["up"] else record.down_links.add)(entry["link_id"])
        elif kind == "ready":
            record.ready = True
        elif kind == "routing":
            record.routing = entry["mode"]
    return record


def names() -> list[str]:
    if not STATE_DIR.exists():
        return []
    return sorted(p.stem for p in STATE_DIR.glob("*.journal"))


def kill_recorded(entry: dict[str, Any]) -> bool:
    """Kill a recorded process if, and only if, it is still the process we started."""
    pid = entry["pid"]
    if entry.get("start") is None or netns.process_start_time(pid) != entry["start"]:
        return False
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True


def _zombie(pid: int) -> bool:
    """A killed child of ours that nobody reaped yet: dead, only its entry is left."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def remove(name: str) -> FabricRecord:
    """Remove every process and namespace the journal records, then the journal itself."""
    record = read(name)
    killed = [entry for entry in record.processes.values() if kill_recorded(entry)]

    def gone() -> bool:
        killed[:] = [e for e in killed if netns.process_start_time(e["pid"]) == e["start"] and not _zombie(e["pid"])]
        return not killed

    try:  # SIGKILL is asynchronous: return once they are gone
        until(gone, 5.0, lambda: f"killed processes of {name!r} to exit ({[e['what'] for e in killed]})")
    except WaitTimeout:
        pass  # unkillable (stuck in the kernel): their namespaces are still removed below
    errors = []
    for path in reversed(record.namespaces):
        try:
            netns.unbind(Path(path))
        except OSError as exc:
            errors.append(str(exc))
    for path in reversed(record.directories):
        # only paths this journal recorded, and only under our state directory
        if Path(path).resolve().is_relative_to(STATE_DIR.resolve()):
            shutil.rmtree(path, ignore_errors=True)
    for path in record.bpf_pins:
        # only pins this journal recorded, and only under the project's bpffs directory
        if Path(path).resolve().is_relative_to(bpfobj.PIN_ROOT):
            shutil.rmtree(path, ignore_errors=True)
    if errors:
        raise RegistryError(f"could not remove {len(errors)} namespaces of {name!r}: {errors[0]}")
    journal_path(name).unlink(missing_ok=True)
    return record
