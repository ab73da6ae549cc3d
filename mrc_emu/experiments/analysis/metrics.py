"""Figures from a transfer's records: the exact fault figures, and the windowed recovery beside them.

Why it exists: each figure must mean one thing everywhere (benchmarks, scenarios, the demo).
The headline figures are exact, read from the requester's own records (transport/ledger.py)
against the fault's time and the EVs through it: detection, stall and repair
(`fault_figures`); with completion against a fault-free run of the same scenario (inflation,
experiments/scenarios/runner.py) they say what a fault cost. The windowed recovery is kept as a secondary
figure, with the band the same window swings in on the fault-free run (`noise_band`): on this
machine a fault-free stretch swings by +-30 %, so a windowed dip inside the band is noise.

Windowed recovery: the pre-fault level is the goodput over the `pre_ns` (50 ms) before the
fault. The transfer has recovered at the first moment t >= fault at which the goodput over
[t, t + window] (2 ms) and over [t, t + hold] (10 ms) both reach `level` (90 %) of the pre-fault
level, and, for a transfer the fault cost packets, at or after the repair of the last of them
(`settled_ns`, the exact repair figure). Recovery time = t - fault; 0 if goodput never dipped;
None if it did not come back before the transfer ended. Why the repair bounds it: what was past
the failed link when it failed is still acknowledged after the fault, at the full rate, for as
long as the fabric and the receiver take to drain it: under 2 ms here, but 20 ms in a VM under
TCG (docs/vagrant.md), where a flow that then stalled for 800 ms had "recovered" in 6.6 ms.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any

from ...stats import nearest_rank, percentile


def _time(sample: tuple[int, int]) -> int:
    return sample[0]


def bytes_at(timeline: list[tuple[int, int]], t: int) -> float:
    """Bytes acknowledged by time t (linear between samples)."""
    i = bisect.bisect_right(timeline, t, key=_time)  # O(log n): recovery() asks thousands of times
    if i == 0:
        return 0.0
    if i == len(timeline):
        return float(timeline[-1][1])
    (t0, b0), (t1, b1) = timeline[i - 1], timeline[i]
    return b0 + (b1 - b0) * (t - t0) / (t1 - t0) if t1 > t0 else float(b1)


@dataclass
class Recovery:
    pre_fault_gbps: float
    recovery_ms: float | None  # None: never back at `level` before the transfer ended
    worst_gbps: float  # lowest goodput over any window after the fault, until recovery + 50 ms
    window_ms: float
    level: float

    def to_dict(self) -> dict:
        return {"pre_fault_gbps": round(self.pre_fault_gbps, 3),
                "recovery_ms": None if self.recovery_ms is None else round(self.recovery_ms, 3),
                "worst_gbps": round(self.worst_gbps, 3), "window_ms": self.window_ms, "level": self.level}


def recovery(timeline: list[tuple[int, int]], fault_ns: int, completed_ns: int | None = None,
             window_ns: int = 2_000_000, level: float = 0.9, pre_ns: int = 50_000_000,
             hold_ns: int = 10_000_000, settled_ns: int | None = None) -> Recovery:
    """Recovery after a fault at `fault_ns` (both relative to the transfer's start); `settled_ns`:
    not before this moment (the repair of what the fault lost), unless goodput never dipped."""
    end = completed_ns if completed_ns is not None else timeline[-1][0]
    pre_start = max(0, fault_ns - pre_ns)
    span = fault_ns - pre_start
    pre = (bytes_at(timeline, fault_ns) - bytes_at(timeline, pre_start)) * 8 / span if span > 0 else 0.0
    want = level * pre
    earliest = fault_ns if settled_ns is None else max(fault_ns, settled_ns)
    worst = float("inf")
    dipped = False
    t = fault_ns
    while t + window_ns <= end:
        short = (bytes_at(timeline, t + window_ns) - bytes_at(timeline, t)) * 8 / window_ns
        worst = min(worst, short)
        horizon = min(hold_ns, end - t)
        held = (bytes_at(timeline, t + horizon) - bytes_at(timeline, t)) * 8 / horizon
        if short >= want and held >= want:
            if t >= earliest:
                return Recovery(pre, (t - fault_ns) / 1e6 if dipped else 0.0, worst, window_ns / 1e6, level)
        else:
            dipped = True
        t += 100_000
    return Recovery(pre, None, 0.0 if worst == float("inf") else worst, window_ns / 1e6, level)


# ---- the fault figures: exact, from the transport's own records (transport/ledger.py) ------------

LOST_BEFORE_NS = 50_000_000  # a loss counts towards a fault's repair if its packet left at most this long before it


def fault_figures(ledger: dict, ev_events: list[dict], fault_ns: int, completed_ns: int | None, end_ns: int,
                  failed_evs: set[int] | None) -> dict:
    """Detection, stall and repair of one transfer after a fault at `fault_ns` (every time relative
    to the transfer's start, ns; `ev_events` as the requester reports them, in ms).

    - detection: the first EV event on an EV through the fault (`failed_evs`), or, for a QP
      without EV states (`failed_evs` None: the baseline, whose one path is the one that failed),
      the first resend sent after the fault that got through. None: never.
    - stall: the longest interval after the fault with no new byte acknowledged, cumulatively or
      selectively, until completion (for a transfer that never completed, up to `end_ns`).
    - repair: from the fault until every packet lost on the failed path (sent at most
      LOST_BEFORE_NS before the fault and no later than its detection) was acknowledged; 0 if it
      lost nothing, None if one was never acknowledged.
    """
    def on_failed(ev: int) -> bool:
        return failed_evs is None or ev in failed_evs

    detect_ns: int | None = None
    if failed_evs is not None:
        times = [int(e["time_ms"] * 1e6) for e in ev_events if e["ev"] in failed_evs and e["time_ms"] * 1e6 >= fault_ns]
        detect_ns = min(times, default=None)
    else:
        resends = [good for ev, _, _, good, _ in ledger.get("repairs", ()) if good >= fault_ns]
        detect_ns = min(resends, default=None)
    end = completed_ns if completed_ns is not None else end_ns
    stall = 0
    for a, b in ledger.get("gaps", ()):
        stall = max(stall, min(b, end) - max(a, fault_ns))
    last = ledger.get("last_progress")
    if completed_ns is None and last is not None:  # never completed: stalled since its last progress
        stall = max(stall, end - max(last, fault_ns))
    latest = detect_ns if detect_ns is not None else end

    def counts(ev: int, sent: int) -> bool:
        return on_failed(ev) and fault_ns - LOST_BEFORE_NS <= sent <= latest

    repaired = [acked for ev, sent, _, _, acked in ledger.get("repairs", ()) if counts(ev, sent) and acked > fault_ns]
    never = any(counts(ev, sent) for ev, sent, _ in ledger.get("unrepaired", ()))
    repair = None if never else (max(repaired) - fault_ns if repaired else 0)
    return {"detection_ms": None if detect_ns is None else round((detect_ns - fault_ns) / 1e6, 3),
            "stall_ms": round(max(0, stall) / 1e6, 3),
            "repair_ms": None if repair is None else round(repair / 1e6, 3),
            "lost_on_failed_path": len(repaired) + (1 if never else 0)}


def repaired_ns(figures: dict | None, fault_ns: int) -> int | None:
    """When the last packet the fault cost was repaired, on the transfer's clock (ns), from
    `fault_figures`; None where there are no figures or a loss was never repaired: what
    `recovery(settled_ns=...)` takes."""
    repair = figures.get("repair_ms") if figures else None
    return None if repair is None else fault_ns + int(repair * 1e6)


def noise_band(timeline: list[tuple[int, int]], at_ns: int, window_ns: int = 2_000_000, pre_ns: int = 50_000_000,
               span_ns: int = 100_000_000) -> dict | None:
    """How much the windowed goodput swings without a fault: over a fault-free run's timeline, the
    goodput of each `window_ns` window in [at, at + span] against the `pre_ns` before `at` (p5 and
    p95 of the ratio). A windowed dip inside this band is noise, not the fault. None: too short."""
    pre_start = max(0, at_ns - pre_ns)
    end = min(timeline[-1][0], at_ns + span_ns) if timeline else 0
    if at_ns - pre_start <= 0 or end - at_ns < window_ns:
        return None
    pre = (bytes_at(timeline, at_ns) - bytes_at(timeline, pre_start)) / (at_ns - pre_start)
    if pre <= 0:
        return None
    ratios = [(bytes_at(timeline, t + window_ns) - bytes_at(timeline, t)) / window_ns / pre
              for t in range(at_ns, end - window_ns + 1, window_ns // 2)]
    return {"p5": round(percentile(ratios, 5), 3), "p95": round(percentile(ratios, 95), 3), "windows": len(ratios)}


def across_runs(values: list[float | None]) -> dict:
    """One figure over repeated runs, every run counted: a None (never: not recovered, not
    detected) is the largest value, so the median is None when half the runs or more never got
    there; `never` counts them, and min/max give the spread of the runs that did."""
    known = sorted(v for v in values if v is not None)
    ordered = known + [None] * (len(values) - len(known))
    median = ordered[nearest_rank(len(ordered), 50) - 1] if ordered else None  # the lower middle
    return {"runs": list(values), "median": median, "never": len(values) - len(known),
            "min": known[0] if known else None, "max": known[-1] if known else None}


def denied_at(ev_events: list[dict[str, Any]], time_ms: float) -> set[int]:
    """The EVs that were DENIED at `time_ms` (since the WRITE began), from its EV events."""
    state: dict[int, str] = {}
    for e in ev_events:
        if e["time_ms"] <= time_ms:
            state[e["ev"]] = e["new"]
    return {ev for ev, s in state.items() if s == "DENIED"}


def worst(values: list, *, never_wins: bool = True) -> float | None:
    """The largest of a figure over several transfers; None (never) if any is None."""
    if not values or (never_wins and any(v is None for v in values)):
        return None
    return max(v for v in values if v is not None)


def share_of(ev_timeline: list, evs: set[int], begin_ms: float, end_ms: float | None = None) -> float | None:
    """The share of the packets sent (first sends and resends) on `evs` from `begin_ms` to `end_ms`
    (None: the end) of a WRITE's ev_timeline ([ms since it began, packets sent per EV, delivered per
    EV], cumulative; the latest entry at or before each end counts). None: nothing sent then."""
    def sent_at(t: float | None) -> list[int] | None:
        row = None
        for entry in ev_timeline:
            if t is not None and entry[0] > t:
                break
            row = entry[1]
        return row
    first, last = sent_at(begin_ms), sent_at(end_ms)
    if last is None:
        return None
    first = first or [0] * len(last)
    sent = [b - a for a, b in zip(first, last)]
    total = sum(sent)
    return round(sum(n for i, n in enumerate(sent) if i in evs) / total, 4) if total else None
