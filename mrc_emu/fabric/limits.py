"""Kernel limits a fabric outgrows: raised while fabrics run, given back when the last one goes.

Why it exists: the kernel's IPv6 neighbour table is one table for every namespace, and its
size limit (net.ipv6.neigh.default.gc_thresh3, 1024 by default) counts the entries of all
of them. `large` has 4,096 link ends, each with a neighbour or two; past the limit the
kernel cannot resolve a next hop and a send fails with EINVAL ("neighbor table overflow" in
dmesg): a failure of the emulator, which the transport would take for a dead path. So `up`
raises the limits to what the fabric needs (never lowers them), after writing the values it
found to a file of its own; when the last fabric the journals record goes down, the values
found are written back and the file removed. Nothing else is touched. `available_memory`
says what memory a run may still take (a WRITE's buffers, a capture's ring).
"""

from __future__ import annotations

import json
from pathlib import Path

from ..topology import Topology
from . import registry

NEIGH = "/proc/sys/net/ipv6/neigh/default/gc_thresh{}"
ENTRIES_PER_END = 4  # a global and a link-local neighbour per link end, twice over for headroom
SAVED = "kernel-limits.json"


def _saved() -> Path:
    return registry.STATE_DIR / SAVED


def _read(path: str) -> int:
    with open(path) as f:
        return int(f.read().strip())


def _write(path: str, value: int) -> None:
    with open(path, "w") as f:
        f.write(str(value))


def entries_now() -> int:
    """Neighbour entries the kernel holds now, in every namespace (including dying ones: a
    namespace that went down is torn down asynchronously and its entries count for a while)."""
    try:
        with open("/proc/net/stat/ndisc_cache") as f:
            f.readline()
            return int(f.readline().split()[0], 16)
    except (OSError, ValueError, IndexError):
        return 0


def needed(topo: Topology) -> dict[str, int]:
    """The neighbour-table thresholds a fabric of this topology needs, besides what else runs."""
    entries = ENTRIES_PER_END * 2 * len(topo.links) + 2 * len(topo.nodes)
    return {NEIGH.format(2): entries, NEIGH.format(3): 2 * entries}


def raise_for(topo: Topology) -> None:
    """Raise the kernel's limits for a fabric of `topo` whose journal exists (and the others running)."""
    saved = _saved()
    found = json.loads(saved.read_text()) if saved.exists() else {}
    for path, extra in needed(topo).items():
        if not Path(path).exists():
            continue  # a kernel without it has no such limit
        current = _read(path)
        if path not in found:
            found[path] = current
            registry.STATE_DIR.mkdir(parents=True, exist_ok=True)
            saved.write_text(json.dumps(found))  # before the change: a crash leaves what to restore
        want = found[path] + extra * max(1, len(registry.names()))  # every fabric recorded, this one included
        want = max(want, entries_now() + extra)  # and what fabrics torn down a moment ago still hold
        if current < want:
            _write(path, want)


def restore_if_last() -> None:
    """Write back the values found, once no fabric is recorded any more (the next `up` raises
    them again, above whatever the kernel still holds of the namespaces just removed)."""
    saved = _saved()
    if registry.names() or not saved.exists():
        return
    for path, value in json.loads(saved.read_text()).items():
        if Path(path).exists():
            _write(path, value)
    saved.unlink()


def available_memory() -> int | None:
    """The kernel's estimate of the memory a new process can have without swapping (MemAvailable)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
