"""Figures from a transfer's timeline: goodput over time and recovery after a fault.

Why it exists: "recovery time" must mean one thing everywhere (benchmarks, scenarios,
the demo). Definition: the pre-fault level is the goodput over the `pre_ns` (50 ms) before
the fault. The transfer has recovered at the first moment t >= fault at which the goodput
over [t, t + window] (2 ms) and over [t, t + hold] (10 ms) both reach `level` (90 %) of the
pre-fault level: goodput is back, and stays back on average (a 2 ms window alone is too
noisy on a shared 2-core machine, where Python endpoints stall now and then for a
millisecond). Recovery time = t - fault; 0 if goodput never dipped; None if it did not
come back before the transfer ended.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass


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
             hold_ns: int = 10_000_000) -> Recovery:
    """Recovery after a fault at `fault_ns` (both relative to the transfer's start)."""
    end = completed_ns if completed_ns is not None else timeline[-1][0]
    pre_start = max(0, fault_ns - pre_ns)
    span = fault_ns - pre_start
    pre = (bytes_at(timeline, fault_ns) - bytes_at(timeline, pre_start)) * 8 / span if span > 0 else 0.0
    want = level * pre
    worst = float("inf")
    t = fault_ns
    while t + window_ns <= end:
        short = (bytes_at(timeline, t + window_ns) - bytes_at(timeline, t)) * 8 / window_ns
        worst = min(worst, short)
        horizon = min(hold_ns, end - t)
        held = (bytes_at(timeline, t + horizon) - bytes_at(timeline, t)) * 8 / horizon
        if short >= want and held >= want:
            return Recovery(pre, (t - fault_ns) / 1e6, worst, window_ns / 1e6, level)
        t += 100_000
    return Recovery(pre, None, 0.0 if worst == float("inf") else worst, window_ns / 1e6, level)
