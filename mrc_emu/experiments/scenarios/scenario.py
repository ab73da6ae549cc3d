"""Scenario files: topology, workloads, transports and a fault schedule, checked field by field.

Why it exists: what users come for is "run this situation with MRC and with today's RoCE and
show me". A scenario YAML says it once; `mrc-emu run` executes it (runner.py). This module
only parses and validates: every problem is one ScenarioError naming file, line and field.

    name: blackhole          # optional; default: the file's stem
    description: ...         # optional, shown in the report
    topology: default        # a built-in topology name or a YAML path (relative to this file)
    transports: [mrc, baseline]
    routing: bgp             # bgp (FRR with BFD: repairs after a fault), static (the routes BGP
                             # converges to, installed directly: no repair) or none (no baseline)
    bfd: true
    mtu: 4096                # payload bytes per packet
    timeout_s: 90            # a run that has not finished by then is stopped
    workers: 2               # endpoint worker processes serving the hosts (default: one per CPU)
    time_dilation: 1         # K: the transport's clock runs K times slower than wall time and links
                             # are shaped to rate / K; reported times are emulated times
    clock: emulated          # or virtual: the same run over a model of the fabric in virtual time
                             # (no root, deterministic per seed; virtual_run.py, docs/virtual.md)
    workloads:               # all start together
      - {kind: write, src: h0, dst: h2, size: 128MiB}
      - {kind: incast, hosts: [h0, h1, h3], dst: h2, size: 16MiB}
      - {kind: all-to-all, hosts: all, size: 8MiB}
      - {kind: ring-allreduce, hosts: all, size: 32MiB}   # size = the buffer being reduced
    faults:                  # `at`: fraction of all workload bytes acknowledged (0..1)
      - {kind: blackhole, link: baseline-path, at: 0.3, duration_ms: 3000}
      - {kind: link-down, link: [p0l0, p0s1], at: 0.3}
      - {kind: flap, link: [p0l0, p0s1], at: 0.2, period_ms: 100, count: 3}
      - {kind: loss, link: [p1l0, p1s2], percent: 5, at: 0.1}
      - {kind: loss, link: [p1l0, p1s2], percent: 5, mechanism: netem, at: 0.1}   # netem's loss (default: xdp)
      - {kind: blackhole, link: [p0l0, p0s1], direction: p0l0->p0s1, at: 0.3}   # one way only
      - {kind: degrade, link: [p0l0, p0s1], rate: 0.25, at: 0.3}   # a quarter of link_rate left
      - {kind: delay, link: [p0l0, p0s1], ms: 5, at: 0.3}   # netem: skipped, said why, without it
      - {kind: switch-reboot, node: p0s1, at: 0.3, duration_ms: 500}
      - {kind: plane-down, host: h0, plane: 1, at: 0.3}
      - {kind: congestion, link: [p0l1, p0s0], at: 0.2, flows: 2, size: 32MiB}
      - {kind: drain, node: p0s1, at: 0.2}         # MRC's controller: every EV through p0s1 DENIED
      - {kind: undrain, node: p0s1, at: 0.8}       # ... allowed again (probed before use); also link: [a, b]
      - {kind: port-disable, host: h0, plane: 1, at: 0.3}   # h0's MRC port into plane 1 off (link stays up)
      - {kind: port-enable, host: h0, plane: 1, at: 0.6}
    capture: false           # pcaps of the source host's ports
    reference: true          # with faults: each transport also runs the workloads fault-free first
                             # (completion inflation, per-flow slowdown, the windowed figure's noise band)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...topology import Role, Topology, TopologyError, resolve
from ...topology.model import key_lines, read_yaml
from ...topology.units import parse_size
from .faults import FAULT_KINDS, LOSS_MECHANISMS, Fault, Target, parse_direction
from .transports import Transport

WORKLOADS = ("write", "incast", "all-to-all", "ring-allreduce")
CLOCKS = ("emulated", "virtual")


class ScenarioError(ValueError):
    """A scenario file is unreadable or wrong; the message names file, line and field."""


@dataclass
class Workload:
    kind: str
    size: int
    src: str | None = None
    dst: str | None = None
    hosts: list[str] = field(default_factory=list)

    def pairs(self) -> list[tuple[str, str, int]]:
        """(src, dst, bytes) of every WRITE this workload makes, all started together."""
        if self.kind == "write":
            return [(self.src, self.dst, self.size)]
        if self.kind == "incast":
            return [(h, self.dst, self.size) for h in self.hosts if h != self.dst]
        if self.kind == "all-to-all":
            return [(a, b, self.size) for a in self.hosts for b in self.hosts if a != b]
        # ring all-reduce: each host sends to the next 2(n-1) chunks of size/n (reduce-scatter,
        # then all-gather); here they run as one WRITE per neighbour pair of the total bytes
        n = len(self.hosts)
        per_pair = 2 * (n - 1) * -(-self.size // n)
        return [(self.hosts[i], self.hosts[(i + 1) % n], per_pair) for i in range(n)]


@dataclass
class Scenario:
    name: str
    topology: Topology
    workloads: list[Workload]
    faults: list[Fault]
    transports: list[Transport] = field(default_factory=lambda: list(Transport))
    routing: str = "bgp"
    bfd: bool = True
    mtu: int = 4096
    timeout_s: float = 90.0
    workers: int | None = None  # endpoint workers (None: one per CPU)
    time_dilation: float = 1.0
    clock: str = "emulated"  # or "virtual" (virtual_run.py)
    capture: bool = False
    reference: bool = True  # with faults, a fault-free run of each transport first (runner.py)
    description: str = ""
    source: str = ""

    def transfers(self) -> list[tuple[str, str, int]]:
        return [p for w in self.workloads for p in w.pairs()]

    def to_dict(self) -> dict:
        return {"name": self.name, "description": self.description, "topology": self.topology.name,
                "transports": [t.value for t in self.transports], "routing": self.routing, "bfd": self.bfd, "mtu": self.mtu,
                "workers": self.workers, "time_dilation": self.time_dilation, "clock": self.clock,
                "reference": self.reference,
                "workloads": [{"kind": w.kind, "size": w.size, "pairs": len(w.pairs())} for w in self.workloads],
                "faults": [f.describe() for f in self.faults]}


class _Checker:
    def __init__(self, source: str, lines: dict[str, int]) -> None:
        self.source, self.lines = source, lines

    def fail(self, fld: str | None, problem: str) -> ScenarioError:
        where = self.source
        if fld is not None:
            top = fld.split("[")[0].split(".")[0]
            line = self.lines.get(fld) or self.lines.get(top)
            where += (f", line {line}" if line else "") + f", field '{fld}'"
        return ScenarioError(f"{where}: {problem}")


_TOP = {"name", "description", "topology", "transports", "routing", "bfd", "mtu", "timeout_s", "workloads",
        "faults", "capture", "workers", "time_dilation", "reference", "clock"}


def from_dict(data: Any, source: str = "<dict>", lines: dict[str, int] | None = None,
              base: Path | None = None) -> Scenario:
    c = _Checker(source, lines or {})
    if not isinstance(data, dict):
        raise c.fail(None, "expected a mapping (topology, workloads, faults, ...)")
    unknown = sorted(set(map(str, data)) - _TOP)
    if unknown:
        raise c.fail(unknown[0], f"unknown field (known: {', '.join(sorted(_TOP))})")
    topo_spec = data.get("topology", "default")
    if not isinstance(topo_spec, str):
        raise c.fail("topology", "give a built-in topology name or a YAML file path")
    if base is not None and topo_spec.endswith((".yaml", ".yml")) and not Path(topo_spec).is_absolute():
        topo_spec = str(base / topo_spec)
    try:
        topo = resolve(topo_spec)
    except TopologyError as exc:
        raise c.fail("topology", str(exc)) from None
    hosts = [h.name for h in topo.hosts]
    switches = {n.name for n in topo.nodes.values() if n.role is not Role.HOST}

    def host(fld: str, value: Any) -> str:
        if value not in hosts:
            raise c.fail(fld, f"{value!r} is not a host of topology {topo.name} (hosts: {', '.join(hosts)})")
        return value

    def host_list(fld: str, value: Any) -> list[str]:
        if value == "all" or value is None:
            return list(hosts)
        if not isinstance(value, list) or len(value) < 2:
            raise c.fail(fld, "give 'all' or a list of at least two hosts")
        return [host(fld, v) for v in value]

    def size(fld: str, value: Any) -> int:
        try:
            return parse_size(value)
        except ValueError as exc:
            raise c.fail(fld, str(exc)) from None

    def number(fld: str, value: Any, lo: float, hi: float) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
            raise c.fail(fld, f"{value!r} is not a number in {lo:g}..{hi:g}")
        return float(value)

    names = data.get("transports", [t.value for t in Transport])
    if isinstance(names, str):
        names = [names]
    known = [t.value for t in Transport]
    if not isinstance(names, list) or not names or any(t not in known for t in names):
        raise c.fail("transports", f"a list of: {', '.join(known)}")
    transports = [Transport(t) for t in names]
    routing = data.get("routing", "bgp")
    if routing not in ("bgp", "static", "none"):
        raise c.fail("routing", "'bgp' (FRR), 'static' (BGP's converged routes, no repair) or 'none'")
    needing = [t.value for t in transports if t.needs_routing]
    if needing and routing == "none":
        raise c.fail("routing", f"the {needing[0]} needs plain IPv6 routing: use routing: bgp (or static, without repair)")
    raw_workloads = data.get("workloads")
    if not isinstance(raw_workloads, list) or not raw_workloads:
        raise c.fail("workloads", "give at least one workload")
    workloads = []
    for i, w in enumerate(raw_workloads):
        fld = f"workloads[{i}]"
        if not isinstance(w, dict) or w.get("kind") not in WORKLOADS:
            raise c.fail(fld, f"needs kind: one of {', '.join(WORKLOADS)}")
        kind = w["kind"]
        allowed = {"kind", "size", "src", "dst", "hosts"}
        extra = sorted(set(w) - allowed)
        if extra:
            raise c.fail(fld, f"unknown key {extra[0]!r} (known: {', '.join(sorted(allowed))})")
        item = Workload(kind, size(f"{fld}.size", w.get("size", "16MiB")))
        if kind == "write":
            item.src, item.dst = host(f"{fld}.src", w.get("src")), host(f"{fld}.dst", w.get("dst"))
            if item.src == item.dst:
                raise c.fail(fld, "src and dst are the same host")
        else:
            item.hosts = host_list(f"{fld}.hosts", w.get("hosts", "all"))
            if kind == "incast":
                item.dst = host(f"{fld}.dst", w.get("dst"))
        workloads.append(item)
    faults = []
    for i, f in enumerate(data.get("faults") or []):
        fld = f"faults[{i}]"
        kind = FAULT_KINDS.get(f.get("kind")) if isinstance(f, dict) else None
        if kind is None:
            raise c.fail(fld, f"needs kind: one of {', '.join(FAULT_KINDS)}")
        allowed = {"kind", "at", "link", "node", "host", "plane", "percent", "duration_ms", "period_ms", "count",
                   "flows", "size", "direction", "rate", "ms", "mechanism"}
        extra = sorted(set(f) - allowed)
        if extra:
            raise c.fail(fld, f"unknown key {extra[0]!r} (known: {', '.join(sorted(allowed))})")
        item = kind(number(f"{fld}.at", f.get("at", 0.3), 0.0, 0.99))
        if kind.target is Target.SWITCH_OR_LINK:
            if ("node" in f) == ("link" in f):
                raise c.fail(fld, f"a {kind.kind} names a node (a leaf or spine) or a link [node, node], one of them")
            if "node" in f:
                if f["node"] not in switches:
                    raise c.fail(f"{fld}.node", f"{f['node']!r} is not a switch of topology {topo.name}")
                item.node = f["node"]
            else:
                link = f["link"]
                if not (isinstance(link, list) and len(link) == 2 and all(x in topo.nodes for x in link)
                        and topo.links_between(*link)):
                    raise c.fail(f"{fld}.link", f"give [node, node] of one link of topology {topo.name}")
                item.link = (link[0], link[1])
        elif kind.target is Target.LINK:
            link = f.get("link")
            if link == "baseline-path":
                if Transport.BASELINE not in transports:
                    raise c.fail(f"{fld}.link", "'baseline-path' needs the baseline among the transports")
                item.link = "baseline-path"
            elif isinstance(link, list) and len(link) == 2 and all(x in topo.nodes for x in link):
                if not topo.links_between(*link):
                    raise c.fail(f"{fld}.link", f"no link between {link[0]} and {link[1]}")
                item.link = (link[0], link[1])
            else:
                raise c.fail(f"{fld}.link", "give [node, node] of one link, or baseline-path")
        elif kind.target is Target.SWITCH:
            if f.get("node") not in switches:
                raise c.fail(f"{fld}.node", f"{f.get('node')!r} is not a switch of topology {topo.name}")
            item.node = f["node"]
        elif kind.target is Target.HOST_PLANE:
            item.host = host(f"{fld}.host", f.get("host"))
            item.plane = int(number(f"{fld}.plane", f.get("plane"), 0, topo.planes - 1))
        if "percent" in f:
            item.percent = number(f"{fld}.percent", f["percent"], 0.01, 100)
        if kind.needs_percent and "percent" not in f:
            raise c.fail(f"{fld}.percent", f"{kind.kind} needs a percent")
        if "duration_ms" in f:
            item.duration_ms = number(f"{fld}.duration_ms", f["duration_ms"], 1, 600_000)
        item.period_ms = number(f"{fld}.period_ms", f.get("period_ms", 100), 2, 60_000)
        item.count = int(number(f"{fld}.count", f.get("count", 3), 1, 1000))
        item.flows = int(number(f"{fld}.flows", f.get("flows", 1), 1, 16))
        if "size" in f:
            item.size = size(f"{fld}.size", f["size"])
        _link_impairment(c, fld, f, item, topo)
        faults.append(item)
    name = data.get("name", Path(source).stem if source.endswith((".yaml", ".yml")) else "scenario")
    if not isinstance(name, str) or not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", name):
        raise c.fail("name", f"{name!r}: letters, digits, '.', '_' or '-', up to 64")
    mtu = int(number("mtu", data.get("mtu", 4096), 64, 8192))
    if mtu % 4 or mtu + 300 > topo.mtu:
        raise c.fail("mtu", f"{mtu}: a multiple of 4 that fits the links' MTU {topo.mtu} with headers")
    workers = data.get("workers")
    if workers is not None:
        workers = int(number("workers", workers, 1, 256))
    clock = data.get("clock", "emulated")
    if clock not in CLOCKS:
        raise c.fail("clock", f"{clock!r}: {' or '.join(CLOCKS)} (the namespace fabric, or its model in virtual time)")
    return Scenario(name=name, topology=topo, workloads=workloads, faults=faults, transports=transports,
                    routing=routing, bfd=bool(data.get("bfd", True)), mtu=mtu, workers=workers,
                    time_dilation=number("time_dilation", data.get("time_dilation", 1), 1, 10_000),
                    timeout_s=number("timeout_s", data.get("timeout_s", 90), 1, 3600),
                    capture=bool(data.get("capture", False)), reference=bool(data.get("reference", True)),
                    clock=clock, description=str(data.get("description", "")),
                    source=source)


def _link_impairment(c: _Checker, fld: str, f: dict, item: Fault, topo: Topology) -> None:
    """direction (loss, blackhole, degrade, delay), rate (degrade), ms (delay) and mechanism (loss) of one fault."""
    kind = item.kind
    if "direction" in f:
        if not type(item).directed:
            directed = [k for k, cls in FAULT_KINDS.items() if cls.directed]
            raise c.fail(f"{fld}.direction", f"only {', '.join(directed)} take a direction, not {kind}")
        if not isinstance(item.link, tuple):
            raise c.fail(f"{fld}.direction", "a direction needs link: [A, B] (the nodes it runs between)")
        try:
            item.direction = parse_direction(f["direction"], item.link)
        except ValueError as exc:
            raise c.fail(f"{fld}.direction", str(exc)) from None
    for key, owner in (("rate", "degrade"), ("ms", "delay")):
        if key in f and kind != owner:
            raise c.fail(f"{fld}.{key}", f"only a {owner} takes {key}, not {kind}")
        if kind == owner and key not in f:
            example = "rate: 0.25 (the fraction of the link's rate left)" if key == "rate" else "ms: 5 (added each way)"
            raise c.fail(f"{fld}.{key}", f"a {kind} needs {example}")
    if kind == "degrade":
        rate = f["rate"]
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate < 1:
            raise c.fail(f"{fld}.rate", f"{rate!r} is not a fraction of the link's rate in (0, 1) (0.25: a quarter left)")
        if not topo.link_rate_bps:
            raise c.fail(f"{fld}.kind", f"a degrade needs a link rate: topology {topo.name} has no link_rate, so its "
                                        f"links run as fast as the CPU forwards and there is no rate to take a "
                                        f"fraction of (use a topology with link_rate, e.g. 'incast')")
        item.rate = float(rate)
    if "mechanism" in f:
        if kind != "loss":
            raise c.fail(f"{fld}.mechanism", f"only a loss takes a mechanism, not {kind}")
        if f["mechanism"] not in LOSS_MECHANISMS:
            raise c.fail(f"{fld}.mechanism", f"{f['mechanism']!r}: a loss is applied by {' or '.join(LOSS_MECHANISMS)}")
        item.mechanism = f["mechanism"]
    if (kind == "delay" or item.mechanism == "netem") and topo.ports.model == "red":
        raise c.fail(f"{fld}.kind", f"netem would take the place of RED at the ports of topology {topo.name} "
                                    f"(port model red): use the XDP loss, or port model bpf")
    if kind == "delay":
        ms = f["ms"]
        if isinstance(ms, bool) or not isinstance(ms, (int, float)) or not 0 < ms <= 10_000:
            raise c.fail(f"{fld}.ms", f"{ms!r} is not a number of milliseconds in (0, 10000]")
        item.ms = float(ms)


SCENARIO_DIR = Path(__file__).resolve().parents[2] / "topologies" / "scenarios"


def load(spec: str | Path) -> Scenario:
    """A scenario YAML path, or the name of a shipped scenario (topologies/scenarios/)."""
    path = Path(spec)
    if not path.exists() and not str(spec).endswith((".yaml", ".yml")) and "/" not in str(spec):
        path = SCENARIO_DIR / f"{spec}.yaml"
        if not path.exists():
            known = ", ".join(sorted(p.stem for p in SCENARIO_DIR.glob("*.yaml")))
            raise ScenarioError(f"no scenario file {spec!r} and no shipped scenario of that name (shipped: {known})")
    data, text = read_yaml(path, "scenario", ScenarioError)
    return from_dict(data, str(path), key_lines(text), path.parent)
