"""A finished run replayed from its results.json: the page's state at any moment of it.

Why it exists: the report and the PNGs come after a run; `mrc-emu view --results DIR` lets a
reader scrub through the same run in the page: the links as the run's faults left them at that
moment, each transfer's bytes acknowledged and goodput, each EV's state and share, and the EV
events so far, all from results.json alone (docs/results.md has its schema). Times are ms
since the run's first transfer started, as results.json has them (a transfer's own times plus
its `offset_ms`); a state at time t holds what happened at or before t.
"""

from __future__ import annotations

import bisect
import json
from pathlib import Path
from typing import Any

from ..topology import TopologyError, resolve
from .model import EV_LOG_MAX, SCHEMA_STATE, ev_shares, link_key, spines, topology_view

GOODPUT_WINDOW_MS = 2.0  # a replayed transfer's goodput: bytes acknowledged over the last 2 ms (docs/results.md)
RECENT_MS = 10.0  # an EV's recent share: of the packets sent over the last 10 ms (ev_timeline has a sample every ~5 ms)


class ReplayError(ValueError):
    """results.json missing, unreadable or of another schema."""


def load(path: str | Path) -> tuple[Path, dict[str, Any]]:
    """results.json, given its folder or the file itself."""
    path = Path(path)
    file = path if path.suffix == ".json" else path / "results.json"
    try:
        data = json.loads(file.read_text())
    except FileNotFoundError:
        raise ReplayError(f"no results.json at {file} (give the folder `mrc-emu run --out` wrote)") from None
    except (OSError, ValueError) as exc:
        raise ReplayError(f"{file} is not readable as JSON: {exc}") from None
    if not str(data.get("schema", "")).startswith("mrc-emu/results/"):
        raise ReplayError(f"{file} is not an mrc-emu results.json (schema {data.get('schema')!r})")
    return file, data


class ReplaySource:
    """One results.json; `state(run, t_ms)` is the page's state at t in that transport's run."""

    mode = "replay"

    def __init__(self, path: str | Path) -> None:
        self.file, self.results = load(path)
        name = self.results["scenario"]["topology"]
        try:
            self.topo = resolve(name)
        except (TopologyError, OSError) as exc:
            raise ReplayError(f"{self.file}: its topology {name!r} cannot be loaded here ({exc})") from None
        self.runs = self.results.get("runs", {})
        if not self.runs:
            raise ReplayError(f"{self.file} holds no run")

    def run_names(self) -> list[str]:
        return list(self.runs)

    def duration_ms(self, run: str) -> float:
        ends = [t.get("offset_ms", 0.0) + (t["timeline"][-1][0] if t.get("timeline") else 0.0)
                for t in self._run(run)["transfers"]]
        return round(max(ends, default=0.0), 3)

    def _run(self, run: str) -> dict[str, Any]:
        if run not in self.runs:
            raise ReplayError(f"no run {run!r} in {self.file} (runs: {', '.join(self.runs)})")
        return self.runs[run]

    def topology(self) -> dict[str, Any]:
        replay = {name: {"duration_ms": self.duration_ms(name), "series": self._series(name)} for name in self.runs}
        scenario = self.results["scenario"]
        return {**topology_view(self.topo), "fabric": self.results.get("fabric"), "mode": self.mode,
                "results": str(self.file), "scenario": {"name": scenario.get("name"), "description":
                                                       scenario.get("description"), "faults": scenario.get("faults")},
                "replay": replay}

    def _series(self, run: str) -> list[dict[str, Any]]:
        """Each transfer's goodput over the run, [[t_ms, Gbit/s], ...]: the chart under the cursor."""
        out = []
        for t in self._run(run)["transfers"]:
            offset, points = t.get("offset_ms", 0.0), t.get("timeline", [])
            series = [[round(offset + b[0], 3), round((b[1] - a[1]) * 8 / ((b[0] - a[0]) * 1e6), 3)]
                      for a, b in zip(points, points[1:]) if b[0] > a[0]]
            out.append({"id": f"{run}/{len(out)}", "src": t["src"], "dst": t["dst"], "points": series})
        return out

    # ---- the state at t ----------------------------------------------------------------------

    def state(self, run: str, t_ms: float) -> dict[str, Any]:
        data = self._run(run)
        links, drained = self._faults_at(data, t_ms)
        transfers, ev_log = [], []
        for index, t in enumerate(data["transfers"]):
            view, events = self._transfer_at(run, index, t, t_ms)
            transfers.append(view)
            ev_log += events
        ev_log.sort(key=lambda e: e["run_ms"])
        return {"schema": SCHEMA_STATE, "mode": self.mode, "fabric": self.results.get("fabric"), "run": run,
                "t_ms": round(t_ms, 3), "duration_ms": self.duration_ms(run), "links": links,
                "spines": {name: {"drained": name in drained, "by": drained.get(name)} for name in spines(self.topo)},
                "ports": self._ports(data), "ports_note": "counted over the whole run (results.json keeps no queue "
                                                          "over time)" if data.get("ports") else None,
                "transfers": transfers, "ev_log": ev_log[-EV_LOG_MAX:], "faults": self._fault_list(data, t_ms)}

    def _faults_at(self, data: dict[str, Any], t_ms: float) -> tuple[dict[str, Any], dict[str, str]]:
        links = {link_key(lk): {"state": "up", "faults": [], "bps": None} for lk in self.topo.links}
        drained: dict[str, str] = {}
        for fault in self._in_force(data, t_ms):
            kind, hit = fault["kind"], []
            if fault.get("link"):
                hit = self.topo.links_between(*fault["link"])
            elif kind == "switch-reboot" and fault.get("node"):
                hit = [lk for lk in self.topo.links if fault["node"] in (lk.a, lk.b)]
            elif kind == "plane-down" and fault.get("host") is not None:
                hit = self.topo.links_between(fault["host"], self.topo.leaf_of(fault["host"], fault["plane"]))
            elif kind == "drain" and fault.get("node"):
                drained[fault["node"]] = f"scenario ({fault['description']})"
            elif kind == "undrain" and fault.get("node"):
                drained.pop(fault["node"], None)  # the faults are in schedule order: a later undrain lifts a drain
            for link in hit:
                entry = links[link_key(link)]
                entry["faults"].append({"kind": kind, "target": fault["description"], "by": "scenario"})
                entry["state"] = "down" if kind in ("link-down", "switch-reboot", "plane-down") else "faulted"
        return links, drained

    @staticmethod
    def _in_force(data: dict[str, Any], t_ms: float) -> list[dict[str, Any]]:
        """The run's faults in force at t: applied (first action began) and not yet lifted (a later action)."""
        found = []
        for fault in data.get("faults", []):
            events = fault.get("events") or []
            if fault.get("skipped") or not events or events[0]["began_ms"] > t_ms:
                continue
            if fault.get("kind") == "flap" and events[0].get("returned_ms", t_ms) < t_ms:
                continue  # a flap is one action, in force while it ran
            if len(events) > 1 and events[-1]["began_ms"] <= t_ms:
                continue  # lifted
            found.append(fault)
        return found

    def _fault_list(self, data: dict[str, Any], t_ms: float) -> list[dict[str, Any]]:
        _, drained = self._faults_at(data, t_ms)
        return [{"kind": f["kind"], "target": f["description"], "by": "scenario", "since_ms": f["events"][0]["began_ms"]}
                for f in self._in_force(data, t_ms)
                if f["kind"] not in ("undrain", "port-enable") and (f["kind"] != "drain" or f.get("node") in drained)]

    @staticmethod
    def _ports(data: dict[str, Any]) -> dict[str, Any] | None:
        busy = data.get("ports")
        if not busy:
            return None
        return {f"{node}:{ifname}": {"node": node, "ifname": ifname, **counts}
                for node, ifaces in busy.items() for ifname, counts in ifaces.items()}

    def _transfer_at(self, run: str, index: int, t: dict[str, Any], t_ms: float) -> tuple[dict, list[dict]]:
        offset = t.get("offset_ms", 0.0)
        local = t_ms - offset
        timeline = t.get("timeline") or [[0.0, 0]]
        acked = _at(timeline, local)
        before = _at(timeline, local - GOODPUT_WINDOW_MS)
        span = min(GOODPUT_WINDOW_MS, max(0.0, local))
        done = bool(t.get("completion_ms") is not None and local >= t["completion_ms"])
        states = {e["ev"]: "GOOD" for e in t.get("per_ev", [])}
        events = []
        for e in t.get("ev_events", []):
            if e["time_ms"] <= local:
                states[e["ev"]] = e["new"]
                events.append({**e, "run_ms": round(offset + e["time_ms"], 3), "transfer": f"{run}/{index}",
                               "src": t["src"], "dst": t["dst"]})
        sent = _sent_at(t.get("ev_timeline") or [], local)
        earlier = _sent_at(t.get("ev_timeline") or [], local - RECENT_MS)
        evs = [{"ev": e["ev"], "plane": e.get("plane"), "spine": e.get("spine"), "state": states.get(e["ev"], "GOOD"),
                "sent": sent[i] if i < len(sent) else 0} for i, e in enumerate(t.get("per_ev", []))]
        ev_shares(evs, {e["ev"]: earlier[i] if i < len(earlier) else 0 for i, e in enumerate(evs)})
        view = {"id": f"{run}/{index}", "key": index, "src": t["src"], "dst": t["dst"], "size": t["size"],
                "label": t.get("label", ""), "started": local >= 0, "bytes_acked": acked, "done": done,
                "error": t.get("error") if done else None, "run": "finished" if done else "running",
                "progress": round(acked / t["size"], 4) if t["size"] else 1.0,
                "goodput_gbps": round((acked - before) * 8 / (span * 1e6), 3) if span > 0 and not done else None,
                "evs": evs}
        return view, events


def _at(timeline: list, ms: float) -> int:
    """Bytes acknowledged at `ms` (the last sample at or before it; 0 before the first)."""
    i = bisect.bisect_right([p[0] for p in timeline], ms)
    return int(timeline[i - 1][1]) if i else 0


def _sent_at(ev_timeline: list, ms: float) -> list[int]:
    """Packets sent per EV at `ms`, from the last ev_timeline sample at or before it."""
    i = bisect.bisect_right([p[0] for p in ev_timeline], ms)
    return list(ev_timeline[i - 1][1]) if i else []
