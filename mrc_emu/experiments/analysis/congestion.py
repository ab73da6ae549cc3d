"""Figures of a congestion experiment: utilisation, fairness, completion times, queues, trims.

Why it exists: issue 12's incasts are judged by a handful of numbers that must mean the same in
the scenario report, `scripts/bench_congestion.py` and the tests: the bottleneck's utilisation,
Jain's fairness of the flows' goodput, the flows' completion times, the bottleneck queue's
percentiles and how fast trimmed packets were repaired. Pure arithmetic on what a run returns
(transfer results, the port counters of fabric/datapath/ports.py); no fabric, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ...stats import percentile
from ...transport.ledger import trim_repair


def jain(values: Iterable[float]) -> float | None:
    """Jain's fairness index (sum x)^2 / (n sum x^2): 1 when all are equal, 1/n when one has all."""
    xs = [float(x) for x in values]
    if not xs:
        return None
    square_sum = sum(x * x for x in xs)
    return 1.0 if square_sum == 0 else sum(xs) ** 2 / (len(xs) * square_sum)


def utilisation(wire_bytes: int, span_ns: int, capacity_bps: float) -> float | None:
    """The fraction of `capacity_bps` that `wire_bytes` (on the wire, headers included) fill over
    `span_ns`."""
    if span_ns <= 0 or capacity_bps <= 0:
        return None
    return wire_bytes * 8e9 / span_ns / capacity_bps


def aggregate_goodput_gbps(results: Sequence[Any]) -> float:
    """What a run's transfers delivered together, first start to last end (transport time), Gbit/s:
    only the bytes of verified transfers count (a failed or unverified one adds nothing, though its
    time is in the span: the run spent it)."""
    start = min((r.start_ns for r in results), default=0)
    end = max((r.end_ns for r in results), default=0)
    return sum(r.size for r in results if r.verified) * 8 / max(1, end - start)


def fct_percentiles(results: Sequence[Any]) -> dict[str, float | None]:
    """Flow completion times p50/p99/max (ms), a flow that never completed counted as never: it
    is above every finished one, and a percentile that falls on it is None (never), not the
    percentile of the flows that happened to finish."""
    fct = [math.inf if r.completion_ms is None or not r.verified else r.completion_ms for r in results]

    def finite(x: float | None) -> float | None:
        return None if x is None or math.isinf(x) else round(x, 3)

    return {"p50": finite(percentile(fct, 50)), "p99": finite(percentile(fct, 99)),
            "max": finite(max(fct, default=None))}


def flows(results: Sequence[Any]) -> dict[str, Any]:
    """Per-flow figures of one run's transfers (experiments.runtime.transfer.TransferResult): goodput,
    completion, fairness, and what the requesters counted (timeouts, retransmits, trims)."""
    goodput = [(r.goodput_gbps or 0.0) if r.verified else 0.0 for r in results]
    start = min((r.start_ns for r in results), default=0)
    end = max((r.end_ns for r in results), default=0)
    stats = [r.requester.get("stats", {}) for r in results]
    return {
        "flows": len(results), "verified": sum(1 for r in results if r.verified),
        "unfinished": sum(1 for r in results if r.completion_ms is None or not r.verified),
        "span_ms": round((end - start) / 1e6, 3),
        "aggregate_goodput_gbps": round(aggregate_goodput_gbps(results), 4),
        "jain": _round(jain(goodput), 4),
        "fct_ms": fct_percentiles(results),
        "timeouts": sum(s.get("timeouts", 0) for s in stats),
        "retransmits": sum(s.get("retransmits", 0) for s in stats),
        "trim_nacks": sum(s.get("trim_nacks", 0) for s in stats),
        # every flow's trims together: how fast each was repaired, against its RTT (requester.trim_repair)
        "trim_repair": trim_repair([tuple(x) for s in stats for x in s.get("trim_repairs", ())]),
        "cnps": sum(s.get("cnps", 0) for s in stats),
        "ev_events": sum(len(r.ev_events) for r in results),
    }


def port_utilisation(sent_bytes: int, span_ns: int, rate_bps: float) -> float | None:
    """A switch port's utilisation, the one definition every figure uses: the bytes its TBF sent
    (what left the port on the wire: trimmed packets at their trimmed length, dropped ones not at
    all; fabric.datapath.ports.tbf_counters_of) over the run's span, against the port's rate."""
    return _round(utilisation(sent_bytes, span_ns, rate_bps), 4)


def bottleneck_utilisation(ports: Mapping[str, Mapping[str, Any]]) -> float | None:
    """The bottleneck's utilisation: the mean of its ports' (each from port_utilisation)."""
    util = [p["utilisation"] for p in ports.values() if p.get("utilisation") is not None]
    return round(sum(util) / len(util), 4) if util else None


def port_figures(counters: Mapping[str, Any], span_ns: int, rate_bps: float, sent_bytes: int) -> dict[str, Any]:
    """One egress port's counters over a run (an entry of fabric.datapath.ports.delta) as figures: its
    utilisation (from `sent_bytes`, what its TBF sent: port_utilisation), marks, trims, drops, and
    the queue its arrivals found (p50/p99 from the port program's histogram: upper bucket edges;
    max: the highest bucket reached)."""
    return {
        "utilisation": port_utilisation(sent_bytes, span_ns, rate_bps),
        "packets": counters.get("packets", 0), "ce_marked": counters.get("ce_marked", 0),
        "trimmed": counters.get("trimmed", 0), "dropped": counters.get("dropped", 0),
        "queue_bytes": {"p50": counters.get("queue_p50"), "p99": counters.get("queue_p99"),
                        "max": counters.get("max_queue")},
    }


def _round(x: float | None, digits: int) -> float | None:
    return None if x is None else round(x, digits)
