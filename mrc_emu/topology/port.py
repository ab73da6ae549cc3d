"""The switch port model of a topology: buffer, ECN and trim thresholds of every egress port.

Why it exists: the fabric's port program (fabric/bpf/port.bpf.c) needs numbers per egress port,
and the experiments and reports need the same numbers (is the queue's p99 under Kmax?). They
come from the topology file's `port:` block and `base_rtt`, resolved here once, as pure data:
defaults follow UEC 1.0's recommendations relative to the plane BDP (link_rate x base_rtt):
probabilistic ECN between 0.2 and 0.8 BDP, its probability rising from 0 at Kmin to 1 at Kmax (as
uet-htsim's compositequeue marks), trimming at 1 BDP (on the last hop, the port that faces a
host, too, as every queue of uet-htsim; UEC allows that one 1.5 BDP), a buffer of 4 BDP. Sizes
are bytes (`parse_size`) or BDP multiples ("0.8bdp"). This module never touches the kernel.

    base_rtt: 1ms
    port:
      buffer: 4bdp
      ecn: {kmin: 0.2bdp, kmax: 0.8bdp, pmax: 1}       # or: ecn: off
      trim: {threshold: 1bdp, lasthop_threshold: 1bdp, bytes: 28}   # or: trim: off
      hosts: off                                       # host egress ports too?
      bucket: 9014                                     # TBF's bucket on every port (default: max(4 MTU, 1 ms of the rate))
      model: bpf                                       # or red: the kernel's RED qdisc (needs sch_red) marks
      red: {burst: 3, avpkt: 4250}                     # model red only: averaged RED (default: instantaneous)
      links:                                           # overrides, per link
        - {link: [p0l0, h1], ecn: off}                 # both egress ports of the link
        - {link: [p0l0, p0s0], from: p0l0, buffer: 64k}  # only p0l0's egress port
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, replace
from typing import Any

from .units import parse_duration_ns, parse_size

DEFAULT_BASE_RTT_NS = 1_000_000  # the emulator's endpoints answer in hundreds of us; see docs/fabric.md
MIN_TRIM_BYTES = 28  # BTH 12 + RETH 16: PSN, address, R_Key and DMA length survive the trim
MAX_TRIM_BYTES = 256  # the program's scratch buffer (port.bpf.c MAX_TRIM_BYTES)
ETH_FRAME_HEADER = 14  # what TBF counts of a frame beyond its IP MTU (skb->len on a veth)
BDP_FLOOR_MTUS = 2  # a plane BDP below two packets would trim and mark every packet of a burst
HIST_BUCKETS = 128  # port.bpf.c HIST_BUCKETS
_BDP_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*bdp\s*$", re.IGNORECASE)
_PORT_KEYS = {"buffer", "ecn", "trim", "hosts", "links", "model", "red", "bucket"}
QUEUE_MODELS = ("bpf", "red")  # who marks: the port program's virtual queue, or the kernel's RED qdisc (fabric/datapath/red.py)
RED_AVPKT = 4250  # bytes: a data packet of 4 KiB payload with its headers (Ethernet, IPv6, SRH, IPv6, UDP, BTH, RETH)
_OVERRIDE_KEYS = {"link", "from", "buffer", "ecn", "trim"}


def format_duration(ns: int) -> str:
    return f"{ns / 1000:g}us"


@dataclass(frozen=True)
class Amount:
    """A queue size: bytes, or a multiple of the plane BDP."""

    value: float
    bdp: bool = False

    def bytes(self, bdp_bytes: int) -> int:
        return max(1, round(self.value * bdp_bytes)) if self.bdp else int(self.value)

    def __str__(self) -> str:
        return f"{self.value:g}bdp" if self.bdp else str(int(self.value))


@dataclass(frozen=True)
class Ecn:
    kmin: Amount = Amount(0.2, True)
    kmax: Amount = Amount(0.8, True)
    pmax: float = 1.0  # the marking probability at kmax: 1, as uet-htsim's compositequeue (decide_ECN)


@dataclass(frozen=True)
class Trim:
    threshold: Amount = Amount(1.0, True)
    lasthop_threshold: Amount = Amount(1.0, True)  # not given: the threshold's (uet-htsim: one size everywhere)
    bytes: int = MIN_TRIM_BYTES


@dataclass(frozen=True)
class PortSpec:
    """What a `port:` block (or one of its link overrides) says; None: off."""

    buffer: Amount = Amount(4.0, True)
    ecn: Ecn | None = Ecn()
    trim: Trim | None = Trim()


@dataclass(frozen=True)
class Override:
    link: tuple[str, str]
    from_node: str | None
    fields: dict[str, Any]  # the keys given, parsed: buffer, ecn, trim

    def applies(self, node: str, peer: str) -> bool:
        return {node, peer} == set(self.link) and self.from_node in (None, node)


@dataclass(frozen=True)
class PortModel:
    """The parsed `port:` block and `base_rtt` of a topology."""

    base_rtt_ns: int = DEFAULT_BASE_RTT_NS
    base_rtt_given: bool = False  # the file says `base_rtt` (else NSCC's is measured: experiments/runtime/base_rtt.py)
    defaults: PortSpec = PortSpec()
    hosts: bool = False
    overrides: tuple[Override, ...] = ()
    raw: Any = None  # the block as written, so a stored topology reproduces it
    model: str = "bpf"  # QUEUE_MODELS
    red_burst: int | None = None  # model red: RED's burst in packets (its EWMA weight); None: weight 1, the instant queue
    red_avpkt: int = RED_AVPKT
    bucket: int | None = None  # TBF's bucket in bytes on every shaped port; None: tbf_shape's default

    def spec_for(self, node: str, peer: str) -> PortSpec:
        spec = self.defaults
        for override in self.overrides:
            if override.applies(node, peer):
                spec = replace(spec, **override.fields)
        return spec


@dataclass(frozen=True)
class PortConfig:
    """One egress port, resolved to bytes: what the port program is told."""

    node: str
    ifname: str
    peer: str
    lasthop: bool  # faces a host
    rate_bps: float
    bdp_bytes: int
    buffer: int
    ecn: bool
    kmin: int
    kmax: int
    pmax: float
    trim: bool
    trim_threshold: int
    trim_bytes: int
    model: str = "bpf"  # red: the kernel's RED marks and drops; the port program only classifies and counts

    @property
    def hist_width(self) -> int:
        """Bytes per bucket of the queue histogram (histogram_width)."""
        return histogram_width(self.buffer, self.trim_threshold if self.trim else 0, self.kmax if self.ecn else 0)

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("peer", "lasthop", "bdp_bytes", "buffer", "ecn", "kmin", "kmax", "pmax",
                                              "trim", "trim_threshold", "trim_bytes", "model")}


@functools.lru_cache(maxsize=1024)
def histogram_width(buffer: int, trim_threshold: int = 0, kmax: int = 0) -> int:
    """Bytes per bucket of a port's queue histogram: bucket 0 counts arrivals at an empty queue,
    bucket i the queues in ((i-1) w, i w], the last one that or more. The buffer spread over
    buckets 1..HIST_BUCKETS-1, the width moved (within 0.9-1.5 of that) to divide ECN's `kmax`
    and the trim threshold, or failing that the threshold alone: then "the queue's median is at
    most Kmax" and "its p99 at most the threshold" are read off the histogram exactly (Kmax
    40,000 B and threshold 50,000 B over 200,000 B: 2,000 B, not 1,575)."""
    width = max(1, -(-buffer // (HIST_BUCKETS - 1)))
    for edges in ((trim_threshold, kmax), (trim_threshold,)):
        if not all(e > 0 for e in edges):
            continue
        low, high = max(1, int(0.9 * width)), int(1.5 * width)
        fits = [d for d in _divisors(math.gcd(*edges)) if low <= d <= high]
        if fits:
            return min(fits, key=lambda d: (abs(d - width), -d))
    return width


@functools.lru_cache(maxsize=256)
def _divisors(n: int) -> tuple[int, ...]:
    """Every divisor of n, in O(sqrt n) (a fabric's ports share a few sizes: cached)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return tuple(sorted(set(small + [n // d for d in small])))


def plane_bdp(rate_bps: float, base_rtt_ns: int, mtu: int) -> int:
    """Plane BDP in bytes: link rate x base RTT, at least BDP_FLOOR_MTUS packets."""
    return max(int(rate_bps / 8 * base_rtt_ns / 1e9), BDP_FLOOR_MTUS * mtu)


def tbf_shape(rate_bps: float, mtu: int, bucket: int | None = None) -> tuple[int, int]:
    """(bytes per second, bucket bytes) of the TBF that shapes a port (fabric/build.py shape_node):
    the one definition, since the port program subtracts the bucket from its virtual queue and the
    virtual fabric's ports (vfabric/ports.py) let the same bucket through at once. `bucket`: the
    topology's `port: {bucket}`, at least a whole frame (TBF drops a packet larger than its bucket);
    None: 4 MTU or 1 ms of the rate, whichever is more."""
    rate = int(rate_bps / 8)
    if bucket is not None:
        return rate, max(bucket, mtu + ETH_FRAME_HEADER)
    return rate, max(mtu * 4, rate // 1000)


TBF_LATENCY_US = 50_000  # the longest a packet waits in a port's TBF (its limit: rate x this + bucket)


def tbf_limit(rate_bps: float, mtu: int, bucket: int | None = None) -> int:
    """Bytes a port's TBF holds before it drops: the ceiling of any buffer the program models."""
    rate, burst = tbf_shape(rate_bps, mtu, bucket)
    return rate * TBF_LATENCY_US // 1_000_000 + burst


def resolve(model: PortModel, node: str, ifname: str, peer: str, lasthop: bool, rate_bps: float, mtu: int) -> PortConfig:
    """The numbers of one egress port from the model, the link rate and the MTU."""
    spec = model.spec_for(node, peer)
    bdp = plane_bdp(rate_bps, model.base_rtt_ns, mtu)
    ecn, trim = spec.ecn, spec.trim
    threshold = (trim.lasthop_threshold if lasthop else trim.threshold).bytes(bdp) if trim else 0
    return PortConfig(
        node=node, ifname=ifname, peer=peer, lasthop=lasthop, rate_bps=rate_bps, bdp_bytes=bdp,
        buffer=spec.buffer.bytes(bdp), ecn=ecn is not None,
        kmin=ecn.kmin.bytes(bdp) if ecn else 0, kmax=ecn.kmax.bytes(bdp) if ecn else 0,
        pmax=ecn.pmax if ecn else 0.0, trim=trim is not None, trim_threshold=threshold,
        trim_bytes=trim.bytes if trim else MIN_TRIM_BYTES, model=model.model,
    )


def with_model(raw: Any, model: str) -> dict[str, Any]:
    """A `port:` block as written (`raw`, None: none) with its queue model set to `model`; `red`
    also turns trimming off (RED cannot trim), so the same block runs under both models."""
    block = dict(raw or {})
    block["model"] = model
    if model == "red":
        block["trim"] = "off"
        block["links"] = [{k: v for k, v in item.items() if k != "trim"} for item in block.get("links", [])]
    return block


# ---- parsing --------------------------------------------------------------------------------

class PortError(ValueError):
    """A `port:` block field is invalid; the message names the field (model.py adds file and line)."""

    def __init__(self, fld: str, problem: str) -> None:
        super().__init__(problem)
        self.field = fld


def _amount(value: Any, fld: str) -> Amount:
    if isinstance(value, str) and (m := _BDP_RE.match(value)):
        if float(m.group(1)) <= 0:
            raise PortError(fld, f"{value!r} must be above zero")
        return Amount(float(m.group(1)), True)
    try:
        return Amount(parse_size(value))
    except ValueError as exc:
        raise PortError(fld, f"{exc}, or a multiple of the plane BDP like '0.8bdp'") from None


def _off(value: Any) -> bool:
    return value is False or (isinstance(value, str) and value.lower() == "off")  # YAML 1.1 reads `off` as False


def _mapping(value: Any, fld: str, known: set[str]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise PortError(fld, f"{value!r} is not a mapping (or 'off')")
    unknown = sorted(set(map(str, value)) - known)
    if unknown:
        raise PortError(f"{fld}.{unknown[0]}", f"unknown field (known: {', '.join(sorted(known))})")
    return value


def _ecn(value: Any, fld: str) -> Ecn | None:
    if _off(value):
        return None
    data = _mapping(value, fld, {"kmin", "kmax", "pmax"})
    base = Ecn()
    kmin = _amount(data["kmin"], f"{fld}.kmin") if "kmin" in data else base.kmin
    kmax = _amount(data["kmax"], f"{fld}.kmax") if "kmax" in data else base.kmax
    pmax = data.get("pmax", base.pmax)
    if isinstance(pmax, bool) or not isinstance(pmax, (int, float)) or not 0 < pmax <= 1:
        raise PortError(f"{fld}.pmax", f"{pmax!r} is not a probability in (0, 1]")
    if kmin.bdp == kmax.bdp and kmin.value >= kmax.value:
        raise PortError(f"{fld}.kmax", f"kmax ({kmax}) must be above kmin ({kmin})")
    return Ecn(kmin, kmax, float(pmax))


def _trim(value: Any, fld: str) -> Trim | None:
    if _off(value):
        return None
    data = _mapping(value, fld, {"threshold", "lasthop_threshold", "bytes"})
    base = Trim()
    threshold = _amount(data["threshold"], f"{fld}.threshold") if "threshold" in data else base.threshold
    if "lasthop_threshold" in data:
        lasthop = _amount(data["lasthop_threshold"], f"{fld}.lasthop_threshold")
    else:
        lasthop = threshold
    nbytes = data.get("bytes", base.bytes)
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or not MIN_TRIM_BYTES <= nbytes <= MAX_TRIM_BYTES \
            or nbytes % 4:
        raise PortError(f"{fld}.bytes", f"{nbytes!r} is not a multiple of 4 in {MIN_TRIM_BYTES}..{MAX_TRIM_BYTES} "
                                        f"(UDP payload bytes a trimmed packet keeps: BTH + RETH at least)")
    return Trim(threshold, lasthop, nbytes)


def _fields(data: dict[str, Any], fld: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if "buffer" in data:
        out["buffer"] = _amount(data["buffer"], f"{fld}.buffer")
    if "ecn" in data:
        out["ecn"] = _ecn(data["ecn"], f"{fld}.ecn")
    if "trim" in data:
        out["trim"] = _trim(data["trim"], f"{fld}.trim")
    return out


def parse(port: Any, base_rtt: Any, node_names: set[str]) -> PortModel:
    """The `port:` block and `base_rtt` of a topology file; PortError names the bad field."""
    base_rtt_ns = DEFAULT_BASE_RTT_NS
    if base_rtt is not None:
        try:
            base_rtt_ns = parse_duration_ns(base_rtt)
        except ValueError as exc:
            raise PortError("base_rtt", str(exc)) from None
    given = base_rtt is not None
    if port is None:
        return PortModel(base_rtt_ns, given)
    data = _mapping(port, "port", _PORT_KEYS)
    defaults = replace(PortSpec(), **_fields(data, "port"))
    hosts = data.get("hosts", False)
    if isinstance(hosts, str) and hosts.lower() in ("on", "off"):
        hosts = hosts.lower() == "on"
    if not isinstance(hosts, bool):
        raise PortError("port.hosts", f"{hosts!r} is not on or off")
    overrides = []
    links = data.get("links", [])
    if not isinstance(links, list):
        raise PortError("port.links", "expected a list of overrides like {link: [p0l0, h1], ecn: off}")
    for i, item in enumerate(links):
        fld = f"port.links[{i}]"
        item = _mapping(item, fld, _OVERRIDE_KEYS)
        ends = item.get("link")
        if not (isinstance(ends, list) and len(ends) == 2 and all(isinstance(e, str) for e in ends)):
            raise PortError(f"{fld}.link", f"{ends!r} is not a pair of node names like [p0l0, h1]")
        for end in ends:
            if end not in node_names:
                raise PortError(f"{fld}.link", f"no node {end!r} in this topology")
        from_node = item.get("from")
        if from_node is not None and from_node not in ends:
            raise PortError(f"{fld}.from", f"{from_node!r} is not an end of link {ends}")
        overrides.append(Override((ends[0], ends[1]), from_node, _fields(item, fld)))
    bucket = data.get("bucket")
    if bucket is not None:
        try:
            bucket = parse_size(bucket)
        except (TypeError, ValueError) as exc:
            raise PortError("port.bucket", f"{bucket!r}: {exc}") from None
        if bucket < 1:
            raise PortError("port.bucket", f"{bucket} bytes: must be at least 1")
    model, burst, avpkt = _queue_model(data)
    if model == "red":
        trimming = [f"port.links[{i}]" for i, o in enumerate(overrides) if o.fields.get("trim")]
        if defaults.trim is not None or trimming:
            raise PortError(trimming[0] if trimming else "port.trim",
                            "RED cannot trim (model red): give trim: off, so both port models can run the same ports")
    return PortModel(base_rtt_ns, given, defaults, hosts, tuple(overrides), port, model, burst, avpkt, bucket)


def _queue_model(data: dict[str, Any]) -> tuple[str, int | None, int]:
    """`model:` and `red:` of a port block: (model, RED burst in packets or None, RED avpkt bytes)."""
    model = data.get("model", "bpf")
    if model not in QUEUE_MODELS:
        raise PortError("port.model", f"{model!r} is not one of {', '.join(QUEUE_MODELS)}")
    if "red" not in data:
        return model, None, RED_AVPKT
    if model != "red":
        raise PortError("port.red", "only model: red takes red: {burst, avpkt}")
    red = _mapping(data["red"], "port.red", {"burst", "avpkt"})
    avpkt = _amount(red.get("avpkt", RED_AVPKT), "port.red.avpkt")
    if avpkt.bdp or not 64 <= avpkt.value <= 65536:
        raise PortError("port.red.avpkt", f"{red.get('avpkt')!r} is not a packet size in bytes, 64..65536")
    burst = red.get("burst")
    if burst is not None and (isinstance(burst, bool) or not isinstance(burst, int) or not 1 <= burst <= 10_000):
        raise PortError("port.red.burst", f"{burst!r} is not a number of packets in 1..10000")
    return model, burst, int(avpkt.value)
