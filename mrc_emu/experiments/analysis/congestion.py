"""Figures of a congestion experiment: utilisation, fairness, completion times, queues, trims.

Why it exists: issue 12's incasts are judged by a handful of numbers that must mean the same in
the scenario report, `scripts/bench_congestion.py` and the tests: the bottleneck's utilisation,
Jain's fairness of the flows' goodput, the flows' completion times, the bottleneck queue's
percentiles and how fast trimmed packets were repaired. Pure arithmetic on what a run returns
(transfer results, the port counters of fabric/datapath/ports.py); no fabric, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ...stats import percentile
from ...transport.requester import trim_repair


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
    """What a run's transfers delivered together, first start to last end (transport time), Gbit/s."""
    start = min((r.start_ns for r in results), default=0)
    end = max((r.end_ns for r in results), default=0)
    return sum(r.size for r in results) * 8 / max(1, end - start)


def flows(results: Sequence[Any]) -> dict[str, Any]:
    """Per-flow figures of one run's transfers (experiments.runtime.transfer.TransferResult): goodput,
    completion, fairness, and what the requesters counted (timeouts, retransmits, trims)."""
    done = [r for r in results if r.completion_ms is not None]
    goodput = [r.goodput_gbps or 0.0 for r in results]
    fct = [r.completion_ms for r in done]
    start = min((r.start_ns for r in results), default=0)
    end = max((r.end_ns for r in results), default=0)
    stats = [r.requester.get("stats", {}) for r in results]
    return {
        "flows": len(results), "verified": sum(1 for r in results if r.ok),
        "span_ms": round((end - start) / 1e6, 3),
        "aggregate_goodput_gbps": round(aggregate_goodput_gbps(results), 4),
        "jain": _round(jain(goodput), 4),
        "fct_ms": {"p50": _round(percentile(fct, 50), 3), "p99": _round(percentile(fct, 99), 3),
                   "max": _round(max(fct, default=None), 3)},
        "timeouts": sum(s.get("timeouts", 0) for s in stats),
        "retransmits": sum(s.get("retransmits", 0) for s in stats),
        "trim_nacks": sum(s.get("trim_nacks", 0) for s in stats),
        # every flow's trims together: how fast each was repaired, against its RTT (requester.trim_repair)
        "trim_repair": trim_repair([tuple(x) for s in stats for x in s.get("trim_repairs", ())]),
        "cnps": sum(s.get("cnps", 0) for s in stats),
        "ev_events": sum(len(r.ev_events) for r in results),
    }


def port_figures(counters: Mapping[str, Any], span_ns: int, rate_bps: float) -> dict[str, Any]:
    """One egress port's counters over a run (an entry of fabric.datapath.ports.delta) as figures: its
    utilisation, marks, trims, drops, and the queue its arrivals found (p50/p99 from the port
    program's histogram: upper bucket edges; max: the highest bucket reached)."""
    return {
        "utilisation": _round(utilisation(counters.get("bytes", 0), span_ns, rate_bps), 4),
        "packets": counters.get("packets", 0), "ce_marked": counters.get("ce_marked", 0),
        "trimmed": counters.get("trimmed", 0), "dropped": counters.get("dropped", 0),
        "queue_bytes": {"p50": counters.get("queue_p50"), "p99": counters.get("queue_p99"),
                        "max": counters.get("max_queue")},
    }


def _round(x: float | None, digits: int) -> float | None:
    return None if x is None else round(x, digits)
