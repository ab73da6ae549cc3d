"""Percentiles by nearest rank: the one definition every p50, p99 and median of the project uses.

Why it exists: percentiles are taken in the transport (trim repair), the drivers (the lag
meters' histograms), the fabric (the port programs' queue histograms), the analysis, the report
and the benchmark scripts, and figures side by side must mean the same. The definition is the
nearest rank: the p-th percentile of n values is the ceil(p n / 100)-th smallest (the first at
least), a value that occurred, never one interpolated between two; so the median of an even
count is the lower of the two middle values. Over a histogram it is the bucket holding that
value.

What it must never do: import anything of mrc_emu (every layer imports it, the sans-IO transport
and the pure topology model included) or anything that touches the system.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from itertools import accumulate


def nearest_rank(count: int, p: float) -> int:
    """The rank (1 = smallest) of the p-th percentile (p in [0, 100]) among `count` values."""
    if not 0 <= p <= 100:
        raise ValueError(f"a percentile is between 0 and 100, not {p}")
    return max(1, math.ceil(p * count / 100))  # p * count first: exact for a whole p (7 / 100 * 100 is not 7)


def percentile(values: Iterable[float], p: float) -> float | None:
    """The p-th percentile of `values` (None if there are none)."""
    ordered = sorted(values)
    return ordered[nearest_rank(len(ordered), p) - 1] if ordered else None


def histogram_percentile(counts: Sequence[int], p: float) -> int | None:
    """The index of the bucket holding the p-th percentile of values counted per bucket, in
    ascending order of value (None if nothing was counted)."""
    total = sum(counts)
    if total == 0:
        return None
    rank = nearest_rank(total, p)
    return next(bucket for bucket, seen in enumerate(accumulate(counts)) if seen >= rank)
