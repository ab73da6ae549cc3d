"""NSCC's base RTT for a run, measured: the idle loop of the EVs the run's QPs will spray over.

Why it exists: NSCC derives its target delay and MaxWnd from config_base_rtt (OCP's `base_rtt`;
UEC: the fabric's unloaded RTT), and uet-htsim computes it from the fabric it simulates: twice
the path's latency, plus a full data packet and an ACK serialized at every hop (main_uec.cpp
calculate_rtt). Here the latency is the emulator's (the kernel's forwarding in namespaces, the
endpoint workers' own answering), which no constant describes: the topology's default of 1 ms,
which sizes the ports' thresholds, is 2.5 times the idle loop on the `incast` fabric (0.29-0.40
ms, 0.12 ms of it the network's) and 6-10 times at time dilation 4 (0.10-0.16 ms of emulated
time). So, unless the topology gives a `base_rtt`, each source host's MRC endpoint probes the
EVs of its QPs before the WRITEs start (OCP EV_PROBE, answered by the destination host's
endpoint and timed by the workers on the transport's clock, so under time dilation in emulated
time), one host at a time and a few rounds each, so that no probe waits behind another's. The
loop counts the answering endpoint's service time: it is the loop a window must fill, so MaxWnd
covers it; NSCC's base RTT (its target delay and steps) is the network's part of it on a shaped
fabric, as NSCC's samples leave the service time out too. An EV's
idle loop is the least its probes took, the run's the median over its EVs (one slow EV, or one
slow round on a busy machine, does not move it). A probe is a small frame, and an idle port's
TBF passes it within its bucket, unserialized: so the serialization uet-htsim counts, a full
data packet over the EV's links and its ACK back at the topology's link rate, is added (at 400
Mbit/s over 4 links, 0.36 ms for a 4 KiB packet). The transfers' QPs are made with the sum.

What it must never do: touch a QP (the probes go between the hosts' endpoints, QPN 0x2, before
any QP exists) or decide for a topology that says its base RTT.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ...fabric.kernel.waiting import WaitTimeout, until
from ...stats import percentile
from ...topology import Topology
from ...topology.evs import EvFormat, evs_between
from ...transport.multipath.paths import QpPaths
from ...transport.requester import DATA_OVERHEAD
from ...wire import format as fmt
from .endpoint_ops import EndpointOps
from .spec import cc_options

Spec = Any  # a transfer.TransferSpec (which imports this module): its cc, config, src, dst and ev_format

PROBE_ROUNDS = 3  # probes per EV: its idle loop is the least of them
PROBE_TIMEOUT_NS = 50_000_000  # transport time a probe may take to come back (then it is not counted)
MAX_REQUESTS = 1024  # EVs probed per host and round at most (u16 request ids over the rounds)
WAIT_S = 30.0  # wall time one host's round may take, answers or not, before the run gives up on it
ETHERNET_LEN = 14  # the veth's Ethernet header: TBF counts it
ACK_OVERHEAD = fmt.IPV6_LEN + fmt.UDP_LEN + fmt.BTH_LEN + fmt.AETH_LEN + fmt.SACK_FIXED_LEN + fmt.ICRC_LEN  # its bitmap aside


@dataclass(frozen=True)
class BaseRtt:
    """The base RTT a run's NSCC QPs were made with, and where it came from (`source`):
    `measured` (this module: the idle loop plus the serialization a probe does not see), or
    `topology default` (no probe came back). Times are the transport's (emulated under dilation)."""

    ns: int
    source: str
    loop_ns: int | None = None  # the median over the EVs of each one's idle loop (its least probe RTT)
    serialization_ns: int = 0  # a full data packet over the longest EV's links and its ACK back, at the link rate
    evs: int = 0  # EVs whose idle loop was measured
    probes: int = 0  # answered probes behind it
    loop_min_ns: int | None = None  # the shortest and longest EV's idle loop
    loop_max_ns: int | None = None
    network_ns: int | None = None  # the median loop less the answering endpoint's service time
    window_ns: int | None = None  # the loop a window must fill, MaxWnd's: the whole loop and the serialization

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "summary": self.describe()}

    def describe(self) -> str:
        """One line for a report: the value, and how it was found."""
        value = f"{self.ns / 1000:.0f} us"
        if self.source != "measured":
            return f"{value}, the {self.source}"
        loop = (f"the median idle loop of {self.evs} EVs, {self.loop_ns / 1000:.0f} us "
                f"({self.loop_min_ns / 1000:.0f}-{self.loop_max_ns / 1000:.0f} us; {self.probes} EV probes, the "
                f"least of up to {PROBE_ROUNDS} each; {self.network_ns / 1000:.0f} us without the answering "
                f"endpoint's service time)")
        serial = f"{self.serialization_ns / 1000:.0f} us to serialize a data packet and its ACK"
        if self.window_ns is None or self.window_ns == self.ns:
            return f"{value}, measured: {loop}, + {serial}"
        return (f"{value}, measured: the network's part of {loop}, + {serial}; MaxWnd covers the whole loop, "
                f"{self.window_ns / 1000:.0f} us")


def measure(topo: Topology, ops: EndpointOps, workers: dict[str, Any], address_of: dict[str, str],
            evs_of: dict[str, Iterable[tuple[str, int]]]) -> BaseRtt | None:
    """The median idle loop of the EVs in `evs_of` (source host -> (destination host, EV index)),
    each probed PROBE_ROUNDS times from the source's endpoint; `workers`: the worker serving each
    host (the run's pool); None if no probe came back."""
    loops: dict[tuple[str, str, int], tuple[int, int]] = {}  # (src, dst, ev) -> least (rtt, rtt less service)
    answered = 0
    for src, targets in sorted(evs_of.items()):
        targets = sorted(set(targets))[:MAX_REQUESTS]
        for round_ in range(PROBE_ROUNDS):
            first_id = round_ * len(targets)
            batch = ops.ev_probe(src, [(first_id + i, dst, ev) for i, (dst, ev) in enumerate(targets)],
                                 PROBE_TIMEOUT_NS)

            def answered_yet(batch=batch) -> bool:
                ops.step(workers, address_of, topo)
                return batch.done.is_set()

            try:
                until(answered_yet, WAIT_S, f"{src}'s EV probes", interval=0.001, wake=list(set(workers.values())))
            except WaitTimeout:
                break
            for rsp in batch.responses:
                dst, ev = targets[rsp["req_id"] - first_id]
                sample = (rsp["rtt_raw"], rsp["rtt"])  # the whole loop, and less the answering service time
                key = (src, dst, ev)
                loops[key] = min(loops.get(key, sample), sample)
                answered += 1
    if not loops:
        return None
    full = sorted(rtt for rtt, _ in loops.values())
    loop = percentile(full, 50)
    return BaseRtt(loop, "measured", loop, 0, len(loops), answered, full[0], full[-1],
                   percentile((adj for _, adj in loops.values()), 50))


def serialization_ns(topo: Topology, spec: Spec, plan: QpPaths, ev: int) -> int:
    """What an idle port does not do to a probe: serialize one of the spec's full data packets
    over the EV's links and its ACK back over as many, at the topology's link rate (0 without
    one: an unshaped veth's copy is in the measured loop already)."""
    links, data, ack = _frames(topo, spec, plan, ev)
    return round(links * (data + ack) * 8e9 / topo.link_rate_bps) if links else 0


def unseen_ns(topo: Topology, spec: Spec, plan: QpPaths, ev: int) -> int:
    """The serialisation an RTT sample over the EV lacks on this fabric: every port is a token
    bucket (fabric/build.py shape_node) that passes a frame through an idle hop at once, while a
    busy one delays it by its queue and its own serialisation, as a switch port does; so a sample
    over a path with one busy port, an incast's last hop, lacks every hop's serialisation but
    that one data frame's (0 on an unshaped fabric)."""
    links, data, ack = _frames(topo, spec, plan, ev)
    if not links:
        return 0
    return round(links * (data + ack) * 8e9 / topo.link_rate_bps) - round(data * 8e9 / topo.link_rate_bps)


def _frames(topo: Topology, spec: Spec, plan: QpPaths, ev: int) -> tuple[int, int, int]:
    """(links, data frame bytes, ACK frame bytes) of the spec's EV, as its ports count them (links
    0: an unshaped fabric)."""
    if not topo.link_rate_bps:
        return 0, 0, 0
    links = len(evs_between(topo, spec.src, spec.dst)[ev].links)
    forward, back = plan.forward.get(ev), plan.back.get(ev)
    data = ETHERNET_LEN + spec.config.mtu + DATA_OVERHEAD + (len(forward.template.encap.outer) if forward else 0)
    ack = ETHERNET_LEN + ACK_OVERHEAD + (len(back.template.encap.outer) if back else 0)
    return links, data, ack


def measures(spec: Spec) -> bool:
    """Whether a spec's QP takes the run's measured base RTT: NSCC told none."""
    return spec.cc == "nscc" and spec.config.base_rtt_ns is None


def for_specs(topo: Topology, specs: Sequence[Spec], plans: Sequence[QpPaths], ops: EndpointOps,
              workers: dict[str, Any], address_of: dict[str, str]) -> tuple[list[Spec], BaseRtt | None]:
    """The specs with the run's base RTT given to every NSCC QP told none (and MaxWnd, 1.5 BDP of
    it at the QP's link rate, unless its options say one): the idle loop of their EVs (an SRV6
    QP's own EVs, other formats' the SRv6 EVs between the same hosts) and the serialization of
    the largest data packet over the longest of them, or the topology's default if no probe came
    back. The base RTT is None if no spec needed one."""
    evs_of: dict[str, set[tuple[str, int]]] = {}
    serials: dict[int, list[int]] = {}  # a measuring spec's packet serialization over each EV it probes
    unseen: dict[int, list[int]] = {}  # ... and what of it a sample over each lacks
    for i, (spec, plan) in enumerate(zip(specs, plans)):
        if measures(spec):
            evs = list(_probed(topo, spec, plan))
            evs_of.setdefault(spec.src, set()).update((spec.dst, ev) for ev in evs)
            serials[i] = [serialization_ns(topo, spec, plan, ev) for ev in evs]
            unseen[i] = [unseen_ns(topo, spec, plan, ev) for ev in evs]
    if not evs_of:
        return list(specs), None
    found = measure(topo, ops, workers, address_of, evs_of)
    if found is None:
        found = BaseRtt(topo.ports.base_rtt_ns, "topology default")
    else:
        serial = max(ns for per_ev in serials.values() for ns in per_ev)
        # on a shaped fabric the CC's base RTT is the network's (NSCC's target delay and steps scale
        # with it: with the endpoints' answering in it, 88 us of the emulator's own time at K = 4,
        # a 16-to-1 incast queued to 43.8 KB at the median against Kmax 40 KB, in virtual time as
        # in the namespaces; 34.4 KB without), and MaxWnd covers the whole loop the endpoints close
        # (a window of the network's loop alone leaves one flow short of its link); an unshaped
        # fabric's network is the CPUs as much as its endpoints are: the whole loop for both
        network = found.network_ns if serial and found.network_ns is not None else found.loop_ns
        found = replace(found, ns=network + serial, window_ns=found.loop_ns + serial, serialization_ns=serial)
    out = []
    for i, spec in enumerate(specs):
        if measures(spec):
            window = found.window_ns or found.ns
            # no sample takes NSCC's base RTT under a packet's serialisation (an idle TBF's bucket
            # skips it), and each sample gets back what the idle hops of a path with one busy port skip
            floor, skipped = min(serials[i], default=0), min(unseen[i], default=0)
            options = {**(cc_options("nscc", spec.config.cc_rate_bps, window, spec.config.link_rate_bps, floor,
                                     skipped) or {}),
                       **(spec.config.cc_options or {})}
            spec = replace(spec, config=replace(spec.config, base_rtt_ns=found.ns, cc_options=options or None))
        out.append(spec)
    return out, found


def _probed(topo: Topology, spec: Spec, plan: QpPaths) -> Iterable[int]:
    """The EVs probed for a spec: an SRV6 QP's own, else every SRv6 EV between its hosts."""
    return plan.forward if spec.ev_format is EvFormat.SRV6 else range(len(evs_between(topo, spec.src, spec.dst)))


def source_of(topo: Topology, spec: Spec, measured: BaseRtt | None) -> dict[str, Any]:
    """Which base RTT a QP's CC was made with, and whence: measured (or its fallback) for NSCC
    told none, else the topology's `base_rtt`, its default, or the caller's own value."""
    ns = spec.config.base_rtt_ns
    if spec.cc == "nscc" and measured is not None and ns == measured.ns:
        source = measured.source
    elif ns is None:
        source = "unknown"
    elif ns == topo.ports.base_rtt_ns:
        source = "topology" if topo.ports.base_rtt_given else "topology default"
    else:
        source = "config"
    return {"ns": ns, "source": source}


