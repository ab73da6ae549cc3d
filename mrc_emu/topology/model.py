"""The topology model: a multi-plane leaf/spine Clos as pure data.

Why it exists: every other layer (the fabric builder, EV enumeration, the transport's EV
profile, reports) needs the same picture of nodes and links, computed the same way.
It must never touch the kernel or need root: it is loaded and checked before anything is
created, so an invalid file creates nothing.

One plane, drawn for 2 spines, 2 leaves, 2 hosts per leaf; every plane is a copy of it
and every host has one NIC port in each plane::

        +------+   +------+
        | p0s0 |   | p0s1 |        spines of plane 0
        +------+   +------+
          |    \\   /    |
          |     \\ /     |
          |      X      |
          |     / \\     |
        +------+   +------+
        | p0l0 |   | p0l1 |        leaves of plane 0
        +------+   +------+
         |    |     |    |
        h0    h1   h2    h3        hosts (h0 port 0 -> p0l0, port 1 -> p1l0, ...)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml

from . import port as port_model
from .units import parse_rate

MAX_NODE_ID = 0xDFFF  # node IDs live in 16-bit uSIDs; 0xE000.. is kept for local functions
MIN_MTU = 1280  # IPv6 minimum link MTU
MAX_MTU = 9000
_NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,15}$")


class TopologyError(ValueError):
    """A topology file or description is invalid; the message names the file and field."""


class Role(str, Enum):
    HOST = "host"
    LEAF = "leaf"
    SPINE = "spine"


@dataclass(frozen=True)
class Node:
    name: str
    role: Role
    node_id: int  # 16-bit identifier used in every address of the node (docs/addressing.md)
    plane: int | None  # None for hosts: they have a port in every plane
    index: int  # host number, or leaf/spine number within its plane


@dataclass(frozen=True)
class Link:
    """A point-to-point link; `a` is the lower tier end (host below leaf below spine)."""

    link_id: int
    a: str
    b: str
    plane: int
    a_intf: str
    b_intf: str


@dataclass(frozen=True)
class Topology:
    name: str
    planes: int
    spines_per_plane: int
    leaves_per_plane: int
    hosts_per_leaf: int
    mtu: int = 9000
    link_rate_bps: float | None = None
    source: str = "<built-in>"
    ports: port_model.PortModel = field(default=port_model.PortModel(), hash=False)  # equal topologies: equal ports too

    # ---- nodes -------------------------------------------------------------------------
    @property
    def nic_rate_bps(self) -> float | None:
        """A host's NIC rate: its port split into one link per plane, each at link_rate."""
        return None if self.link_rate_bps is None else self.link_rate_bps * self.planes

    @property
    def host_count(self) -> int:
        return self.leaves_per_plane * self.hosts_per_leaf

    @cached_property
    def nodes(self) -> dict[str, Node]:
        nodes: dict[str, Node] = {}
        next_id = 1
        for h in range(self.host_count):
            nodes[host_name(h)] = Node(host_name(h), Role.HOST, next_id, None, h)
            next_id += 1
        for p in range(self.planes):
            for leaf in range(self.leaves_per_plane):
                name = leaf_name(p, leaf)
                nodes[name] = Node(name, Role.LEAF, next_id, p, leaf)
                next_id += 1
        for p in range(self.planes):
            for s in range(self.spines_per_plane):
                name = spine_name(p, s)
                nodes[name] = Node(name, Role.SPINE, next_id, p, s)
                next_id += 1
        return nodes

    @property
    def hosts(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.role is Role.HOST]

    def node(self, name: str) -> Node:
        try:
            return self.nodes[name]
        except KeyError:
            raise TopologyError(
                f"no node {name!r} in topology {self.name!r} (nodes: h0..h{self.host_count - 1}, "
                f"p<plane>l<leaf>, p<plane>s<spine>)"
            ) from None

    def leaf_of(self, host: str, plane: int) -> str:
        """The leaf that `host`'s port in `plane` is cabled to."""
        return leaf_name(plane, self.node(host).index // self.hosts_per_leaf)

    # ---- links -------------------------------------------------------------------------
    @cached_property
    def links(self) -> list[Link]:
        """Every link, in a fixed order: host ports first, then leaf-spine links."""
        ports: dict[str, int] = {}

        def intf(node: str) -> str:
            k = ports.get(node, 0)
            ports[node] = k + 1
            return f"{node}-eth{k}"

        pairs: list[tuple[str, str, int]] = []
        for h in range(self.host_count):
            for p in range(self.planes):
                pairs.append((host_name(h), self.leaf_of(host_name(h), p), p))
        for p in range(self.planes):
            for leaf in range(self.leaves_per_plane):
                for s in range(self.spines_per_plane):
                    pairs.append((leaf_name(p, leaf), spine_name(p, s), p))
        return [Link(i + 1, a, b, p, intf(a), intf(b)) for i, (a, b, p) in enumerate(pairs)]

    @cached_property
    def _links_by_node(self) -> dict[str, list[Link]]:
        by_node: dict[str, list[Link]] = {name: [] for name in self.nodes}
        for link in self.links:
            by_node[link.a].append(link)
            by_node[link.b].append(link)
        return by_node

    def links_of(self, node: str) -> list[Link]:
        return self._links_by_node[self.node(node).name]

    def links_between(self, a: str, b: str, plane: int | None = None) -> list[Link]:
        found = [
            link
            for link in self.links_of(a)
            if {link.a, link.b} == {a, b} and (plane is None or link.plane == plane)
        ]
        self.node(b)
        return found

    @staticmethod
    def peer(link: Link, node: str) -> tuple[str, str, str]:
        """(peer node, own interface, peer interface) of `link` seen from `node`."""
        if link.a == node:
            return link.b, link.a_intf, link.b_intf
        return link.a, link.b_intf, link.a_intf

    def _shape(self) -> dict[str, int]:
        return {"planes": self.planes, "spines_per_plane": self.spines_per_plane,
                "leaves_per_plane": self.leaves_per_plane, "hosts_per_leaf": self.hosts_per_leaf}

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "source": self.source,
            **self._shape(),
            "hosts": self.host_count,
            "nodes": len(self.nodes),
            "links": len(self.links),
            "mtu": self.mtu,
            "link_rate_bps": self.link_rate_bps,
            "base_rtt_ns": self.ports.base_rtt_ns,
            "port_model": "off (no link_rate: no queue to model)" if self.link_rate_bps is None
                          else f"on ({len(self.egress_ports())} egress ports)",
        }

    def egress_ports(self, rate_bps: float | None = None) -> list[port_model.PortConfig]:
        """Every egress port the port program serves (switch ports; host ports with `port: {hosts: on}`),
        resolved to bytes at the topology's link rate (or `rate_bps`); none without a link rate."""
        if rate_bps is None:
            return self._egress_ports
        return self._resolve_ports(rate_bps)

    @cached_property
    def _egress_ports(self) -> list[port_model.PortConfig]:
        return [] if self.link_rate_bps is None else self._resolve_ports(self.link_rate_bps)

    def _resolve_ports(self, rate: float) -> list[port_model.PortConfig]:
        out = []
        for name, node in self.nodes.items():
            if node.role is Role.HOST and not self.ports.hosts:
                continue
            for link in self.links_of(name):
                peer, intf, _ = self.peer(link, name)
                lasthop = self.nodes[peer].role is Role.HOST
                out.append(port_model.resolve(self.ports, name, intf, peer, lasthop, rate, self.mtu))
        return out

    def to_dict(self) -> dict[str, Any]:
        """The fields a topology file holds, so the topology can be stored and reloaded."""
        return {
            "name": self.name,
            **self._shape(),
            "mtu": self.mtu,
            "link_rate": None if self.link_rate_bps is None else f"{self.link_rate_bps / 1e3:.12g}kbit",
            **({"base_rtt": f"{self.ports.base_rtt_ns}ns"} if self.ports.base_rtt_given else {}),
            **({} if self.ports.raw is None else {"port": self.ports.raw}),
        }


def host_name(h: int) -> str:
    return f"h{h}"


def leaf_name(plane: int, leaf: int) -> str:
    return f"p{plane}l{leaf}"


def spine_name(plane: int, spine: int) -> str:
    return f"p{plane}s{spine}"


# ---- loading and validation ----------------------------------------------------------------

_INT_FIELDS = {
    # field: (minimum, maximum) -- maxima keep interface names within 15 characters
    "planes": (1, 16),
    "spines_per_plane": (1, 64),
    "leaves_per_plane": (1, 256),
    "hosts_per_leaf": (1, 64),
}
_OPTIONAL = {"name", "mtu", "link_rate", "description", "base_rtt", "port"}


def from_dict(data: Any, source: str = "<dict>", lines: dict[str, int] | None = None) -> Topology:
    """Check a topology description field by field; raise TopologyError naming the problem."""
    lines = lines or {}

    def fail(fld: str | None, problem: str) -> TopologyError:
        where = source
        if fld is not None:
            line = lines.get(fld) or lines.get(re.split(r"[.\[]", fld)[0])  # a nested field: its block's line
            where += f", line {line}" if line else ""
            where += f", field '{fld}'"
        return TopologyError(f"{where}: {problem}")

    if not isinstance(data, dict):
        raise fail(None, "expected a mapping of fields (planes, spines_per_plane, ...)")
    unknown = sorted(set(map(str, data)) - set(_INT_FIELDS) - _OPTIONAL)
    if unknown:
        raise fail(unknown[0], f"unknown field (known: {', '.join(sorted(set(_INT_FIELDS) | _OPTIONAL))})")
    values: dict[str, int] = {}
    for fld, (lo, hi) in _INT_FIELDS.items():
        if fld not in data:
            raise fail(fld, "missing (a whole number is required)")
        v = data[fld]
        if isinstance(v, bool) or not isinstance(v, int):
            raise fail(fld, f"{v!r} is not a whole number")
        if not lo <= v <= hi:
            raise fail(fld, f"{v} is out of range {lo}..{hi}")
        values[fld] = v
    mtu = data.get("mtu", 9000)
    if isinstance(mtu, bool) or not isinstance(mtu, int) or not MIN_MTU <= mtu <= MAX_MTU:
        raise fail("mtu", f"{mtu!r} is not a whole number in {MIN_MTU}..{MAX_MTU}")
    rate = data.get("link_rate")
    rate_bps = None
    if rate is not None:
        try:
            rate_bps = parse_rate(rate)
        except ValueError as exc:
            raise fail("link_rate", str(exc)) from None
    name = data.get("name", Path(source).stem if source.endswith((".yaml", ".yml")) else "custom")
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise fail("name", f"{name!r} must be 1-16 lower-case letters, digits or dashes, starting with a letter")
    topo = Topology(name=name, mtu=mtu, link_rate_bps=rate_bps, source=source, **values)
    if len(topo.nodes) > MAX_NODE_ID:
        raise fail(None, f"{len(topo.nodes)} nodes exceed the addressing plan's {MAX_NODE_ID}")
    try:
        ports = port_model.parse(data.get("port"), data.get("base_rtt"), set(topo.nodes))
        for i, override in enumerate(ports.overrides):
            if not topo.links_between(*override.link):
                raise port_model.PortError(f"port.links[{i}].link", f"no link between {override.link[0]} and {override.link[1]}")
    except port_model.PortError as exc:
        raise fail(exc.field, str(exc)) from None
    topo = Topology(name=name, mtu=mtu, link_rate_bps=rate_bps, source=source, ports=ports, **values)
    for config in topo.egress_ports():
        if config.ecn and config.kmax <= config.kmin:
            raise fail("port", f"{config.node} {config.ifname}: kmax ({config.kmax} B) must be above kmin ({config.kmin} B)")
        if config.buffer > (limit := port_model.tbf_limit(config.rate_bps, mtu, ports.bucket)):
            raise fail("port", f"{config.node} {config.ifname}: buffer ({config.buffer} B) above what TBF holds at this "
                               f"link_rate ({limit} B): TBF would drop what the port program let in")
    return topo


def key_lines(text: str) -> dict[str, int]:
    """Line numbers (1-based) of the top-level keys, and of the items of top-level lists
    (`faults[1]`), so errors can point at them."""
    try:
        root = yaml.compose(text)
    except yaml.YAMLError:
        return {}
    out: dict[str, int] = {}
    if isinstance(root, yaml.MappingNode):
        for key, value in root.value:
            out[str(key.value)] = key.start_mark.line + 1
            if isinstance(value, yaml.SequenceNode):
                for i, item in enumerate(value.value):
                    out[f"{key.value}[{i}]"] = item.start_mark.line + 1
    return out


def read_yaml(path: Path, what: str, error: type[Exception]) -> tuple[Any, str]:
    """(data, text) of a YAML file; `error` names the file (and line) when it cannot be read."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise error(f"{path}: cannot read {what} file: {exc.strerror}") from None
    try:
        return yaml.safe_load(text), text
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f", line {mark.line + 1}" if mark else ""
        raise error(f"{path}{where}: not valid YAML: {getattr(exc, 'problem', exc)}") from None


def load(path: str | Path) -> Topology:
    path = Path(path)
    data, text = read_yaml(path, "topology", TopologyError)
    return from_dict(data, str(path), key_lines(text))


BUILTIN_DIR = Path(__file__).resolve().parent.parent / "topologies"


def builtin(name: str = "default") -> Topology:
    """A topology shipped with the package, by file stem (default, four-plane, large)."""
    path = BUILTIN_DIR / f"{name}.yaml"
    if not path.exists():
        known = ", ".join(sorted(p.stem for p in BUILTIN_DIR.glob("*.yaml")))
        raise TopologyError(f"no built-in topology {name!r} (built-in: {known})")
    return load(path)


def resolve(spec: str | None) -> Topology:
    """A path to a YAML file, a built-in topology's name, or None for the default."""
    if spec is None:
        return builtin("default")
    if Path(spec).exists() or spec.endswith((".yaml", ".yml")) or "/" in spec:
        return load(spec)
    return builtin(spec)
