"""The state of a running fabric as the page shows it, sampled on demand.

Why it exists: the page (and any script on /api/state or /api/events) wants, several times a
second, what a user would otherwise piece together from `status`, `fault list`, `ev list`,
`stats` and the progress of every `send`: each link's state (up, down, or faulted and how), each
spine drained or not, each switch port's queue, CE marks, trims and drops (rates since the last
sample), and every transfer on the fabric's live board (fabric/live.py) with its goodput, EVs and
EV events. One sample costs one link dump per namespace, the port program's maps and a few small
files; `Sampler` shares one sample between every client asking within the same interval.

It reads only: the page's actions go through actions.py.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from ..experiments.runtime.controller import DENY, ControlRecord
from ..fabric import registry
from ..fabric.datapath import ports
from ..fabric.faults.fault_record import Entry, FaultRecord
from ..fabric.kernel import netlink, netns
from ..fabric.live import read_board
from ..fabric.running import Fabric
from .model import EV_LOG_MAX, SCHEMA_STATE, RateMeter, SentHistory, ev_shares, link_key, spines, topology_view

BOARD_RUNS = 4  # runs of the live board shown, the most recently updated first
LINK_DUTY = 0.2  # the link dumps take at most this share of the wall time: on `large` (320 namespaces, ~100 ms
# a dump of all) links are read every ~0.5 s, on `default` or `incast` (a few ms) at every sample


def fault_view(entry: Entry) -> dict[str, Any]:
    return {"id": entry.id, "kind": entry.kind, "target": entry.target, "params": entry.params_text(),
            "by": entry.by, "pid": entry.pid, "since_unix": round(entry.since, 3)}


def _alive(pid: int) -> bool:
    return netns.process_start_time(pid) is not None


class LiveSource:
    """A running fabric, named or found by the process that owns it (`run --view`: the scenario's
    own fabric, whatever it is called, while it exists)."""

    mode = "live"

    def __init__(self, name: str | None = None, owner_pid: int | None = None) -> None:
        if (name is None) == (owner_pid is None):
            raise ValueError("a live view follows a fabric by name or by its owner's pid, one of them")
        self.name, self.owner_pid = name, owner_pid
        self.fabric: Fabric | None = None
        self.meter = RateMeter()
        self.sent = SentHistory()
        self.previous_ports: dict[tuple[str, str], tuple[float, dict[str, int]]] = {}
        self.link_stats: dict[str, dict[str, tuple[bool, int, int]]] = {}
        self.link_read_at, self.link_read_cost = 0.0, 0.0  # monotonic time of the last link dumps, their duration
        self.link_read_unix = 0.0  # and its unix time: a link's throughput is between two reads
        self.lock = threading.Lock()
        if name is not None:
            self.fabric = Fabric.open(name)  # a fabric that is not running: the error says how to start one

    # ---- which fabric ----------------------------------------------------------------------

    def current(self) -> Fabric | None:
        """The fabric followed now (None while a scenario has none up)."""
        if self.owner_pid is None:
            return self.fabric
        if self.fabric is not None and registry.journal_path(self.fabric.name).exists():
            return self.fabric
        self.close()
        for name in registry.names():
            try:
                if registry.read(name).owner_pid == self.owner_pid:
                    self.fabric = Fabric.open(name)
                    return self.fabric
            except registry.RegistryError:
                continue  # removed while we looked
        return None

    def close(self) -> None:
        if self.fabric is not None:
            self.fabric.close()
            self.fabric = None
            self.meter = RateMeter()
            self.sent = SentHistory()
            self.previous_ports, self.link_stats = {}, {}

    def topology(self) -> dict[str, Any]:
        fabric = self.current()
        if fabric is None:
            return {"schema": "mrc-emu/view-topology/1", "fabric": None, "mode": self.mode, "nodes": [], "links": [],
                    "ports": [], "planes": 0}
        return {**topology_view(fabric.topology), "fabric": fabric.name, "mode": self.mode}

    # ---- one sample ------------------------------------------------------------------------

    def sample(self) -> dict[str, Any]:
        with self.lock:
            fabric = self.current()
            now = time.time()
            if fabric is None:
                return {"schema": SCHEMA_STATE, "mode": self.mode, "fabric": None, "time_unix": round(now, 3),
                        "note": "no fabric up (the scenario has none now)", "links": {}, "spines": {}, "ports": None,
                        "transfers": [], "ev_log": [], "faults": []}
            try:
                return self._sample(fabric, now)
            except registry.RegistryError as exc:  # taken down while sampled
                return {"schema": SCHEMA_STATE, "mode": self.mode, "fabric": None, "time_unix": round(now, 3),
                        "note": str(exc), "links": {}, "spines": {}, "ports": None, "transfers": [], "ev_log": [],
                        "faults": []}

    def _sample(self, fabric: Fabric, now: float) -> dict[str, Any]:
        faults = FaultRecord(fabric).active()
        transfers, ev_log = self._transfers(fabric)
        port_view, port_note = self._ports(fabric, now)
        return {"schema": SCHEMA_STATE, "mode": self.mode, "fabric": fabric.name, "time_unix": round(now, 3),
                "links": self._links(fabric, faults), "spines": self._spines(fabric),
                "ports": port_view, "ports_note": port_note, "transfers": transfers, "ev_log": ev_log[-EV_LOG_MAX:],
                "faults": [fault_view(e) for e in faults]}

    def _read_links(self, fabric: Fabric) -> dict[str, dict[str, tuple[bool, int, int]]]:
        """Every namespace's link dump, or the last ones while reading them again would take more
        than LINK_DUTY of the time since."""
        started = time.monotonic()
        if self.link_stats and started - self.link_read_at < self.link_read_cost / LINK_DUTY:
            return self.link_stats
        stats: dict[str, dict[str, tuple[bool, int, int]]] = {}
        for node in fabric.topology.nodes:
            try:
                with netns.entered(fabric.netns(node)):
                    stats[node] = netlink.link_states()
            except OSError:  # not there (yet, or any more: a fabric being built or taken down): its links are down
                continue
        self.link_stats, self.link_read_at, self.link_read_unix = stats, started, time.time()
        self.link_read_cost = time.monotonic() - started
        return stats

    def _links(self, fabric: Fabric, faults: list[Entry]) -> dict[str, Any]:
        stats = self._read_links(fabric)
        on_link: dict[int, list[dict[str, Any]]] = {}
        for entry in faults:
            for link_id in entry.links:
                on_link.setdefault(link_id, []).append(fault_view(entry))
        out = {}
        for link in fabric.topology.links:
            a, b = stats.get(link.a, {}).get(link.a_intf), stats.get(link.b, {}).get(link.b_intf)
            up = bool(a and b and a[0] and b[0])
            held = on_link.get(link.link_id, [])
            sent = (a[2] if a else 0) + (b[2] if b else 0)
            rate = self.meter.rate_bps(("link", link.link_id), self.link_read_unix, sent)
            out[link_key(link)] = {"state": "up" if up and not held else "down" if not up else "faulted",
                                   "faults": held, "bps": None if rate is None else round(rate)}
        return out

    @staticmethod
    def _spines(fabric: Fabric) -> dict[str, Any]:
        latest: dict[str, tuple[str, str]] = {}
        for op, selector, by in ControlRecord(fabric).state().rules:
            if selector.node is not None:
                latest[selector.node] = (op, by)
        return {name: {"drained": latest.get(name, ("", ""))[0] == DENY,
                       "by": latest[name][1] if latest.get(name, ("", ""))[0] == DENY else None}
                for name in spines(fabric.topology)}

    def _ports(self, fabric: Fabric, now: float) -> tuple[dict[str, Any] | None, str | None]:
        if not fabric.topology.link_rate_bps or not ports.attached(fabric):
            return None, (f"topology {fabric.topology.name} has no link_rate: no port program, no queue to model "
                          f"(links show their throughput; `up -t incast` has queues, CE marks and trims)")
        out = {}
        for node, ifaces in ports.counters(fabric).items():
            for ifname, c in ifaces.items():
                counts = {k: c[k] for k in ("packets", "ce_marked", "trimmed", "dropped")}
                before = self.previous_ports.get((node, ifname))
                self.previous_ports[(node, ifname)] = (now, counts)
                span = now - before[0] if before else 0.0
                rates = {f"{k}_per_s": round((counts[k] - before[1][k]) / span, 1) if span > 0 else 0.0 for k in counts}
                out[f"{node}:{ifname}"] = {"node": node, "ifname": ifname, "peer": c["config"]["peer"],
                                           "queue": ports.queue_now(fabric, node, ifname), "max_queue": c["max_queue"],
                                           "buffer": c["config"]["buffer"], "kmax": c["config"]["kmax"], **counts,
                                           **rates}
        return out, None

    def _transfers(self, fabric: Fabric) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        transfers, ev_log = [], []
        for snap in reversed(read_board(fabric.name)[:BOARD_RUNS]):  # oldest first: the log reads in order
            pid = snap.get("pid", 0)
            state = "finished" if snap.get("finished") else "running" if _alive(pid) else "gone"
            dilation = snap.get("time_dilation", 1.0)  # the transport's clock K times slower: emulated rates K x
            for t in snap.get("transfers", []):
                rate = self.meter.rate_bps(("transfer", pid, t["key"]), snap["updated_unix"], t["bytes_acked"])
                view = {**t, "id": f"{pid}/{t['key']}", "pid": pid, "command": snap.get("command", ""), "run": state,
                        "progress": round(t["bytes_acked"] / t["size"], 4) if t["size"] else 1.0,
                        "time_dilation": dilation,
                        "goodput_gbps": None if rate is None or state != "running" else round(rate * dilation / 1e9, 3),
                        "updated_unix": snap["updated_unix"]}
                view.pop("ev_events", None)
                if "evs" in view:
                    view["evs"] = [dict(e) for e in view["evs"]]
                    sent = {e["ev"]: e["sent"] for e in view["evs"]}
                    ev_shares(view["evs"], self.sent.before(("transfer", pid, t["key"]), snap["updated_unix"], sent))
                transfers.append(view)
                ev_log += [{**e, "transfer": view["id"], "src": t["src"], "dst": t["dst"]} for e in t.get("ev_events", [])]
        return transfers, ev_log


class Sampler:
    """One sample shared by every client within `max_age_s` (the page, scripts, several tabs)."""

    def __init__(self, source: Any) -> None:
        self.source = source
        self.lock = threading.Lock()
        self.latest: dict[str, Any] | None = None
        self.taken = 0.0
        self.samples = 0  # taken since start: the endpoint's update rate is measured from it

    def get(self, max_age_s: float) -> dict[str, Any]:
        with self.lock:
            if self.latest is None or time.monotonic() - self.taken >= max_age_s:
                self.latest = self.source.sample()
                self.taken = time.monotonic()
                self.samples += 1
                self.latest["seq"] = self.samples
                self.latest["server_pid"] = os.getpid()
            return self.latest
