"""Time as the emulator keeps it: the transport's clock, the workers' shared horizon, lag meters.

Why it exists: a worker must know when it is late, and the transport must judge its timers
only as far as the whole emulation has seen. `Clock` is the transport's time (monotonic,
optionally dilated); `Horizon` is shared memory where each worker publishes the time up to
which it has read and answered everything; `LagMeter` is a cheap histogram of how late
things were served; `schedstat` is the kernel's account of a thread's CPU and waiting time.
"""

from __future__ import annotations

import mmap
import struct
import time

from ..stats import histogram_percentile

_INT64 = struct.Struct("q")
FOREVER = 1 << 62


class Clock:
    """The transport's clock: monotonic nanoseconds, `dilation` times slower than wall time.

    Under time dilation K every interval the transport sees is the wall interval / K, so its
    timers last K times longer in wall time and the machine has K times the CPU per emulated
    microsecond (DieCast, NSDI 2008). Kernel arrival stamps (CLOCK_REALTIME) map onto it."""

    def __init__(self, dilation: float = 1.0, origin_ns: int | None = None) -> None:
        if dilation < 1.0:
            raise ValueError(f"time dilation {dilation}: must be at least 1")
        self.dilation = dilation
        self.origin = time.monotonic_ns() if origin_ns is None else origin_ns  # shared by a run's workers
        self._real_offset = 0
        self.resync()

    def resync(self) -> None:
        """Measure CLOCK_REALTIME - CLOCK_MONOTONIC again (NTP may slew the former)."""
        a = time.monotonic_ns()
        r = time.time_ns()
        b = time.monotonic_ns()
        self._real_offset = r - (a + b) // 2

    def now(self) -> int:
        if self.dilation == 1.0:
            return time.monotonic_ns()
        return self.origin + int((time.monotonic_ns() - self.origin) / self.dilation)

    def from_monotonic(self, mono_ns: int) -> int:
        if self.dilation == 1.0:
            return mono_ns
        return self.origin + int((mono_ns - self.origin) / self.dilation)

    def from_realtime(self, real_ns: int) -> int:
        return self.from_monotonic(real_ns - self._real_offset)


class Horizon:
    """Shared memory, two slots per worker, made before the workers are forked: the clock time up
    to which that worker has read every datagram that arrived at its sockets and answered it
    (its horizon), and how late it answered lately (its answer lag, EventLoop._answered).

    `min()` is what timers are judged at: the slowest worker's horizon, less the largest answer
    lag. An answer sent L late (a responder whose worker was off the CPU) reaches its recipient
    with a kernel stamp L later than it would have had; until it is read, the recipient's own
    horizon (by kernel stamps) says nothing about it, so every decision is held back by L."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._map = mmap.mmap(-1, 16 * max(1, workers))

    def publish(self, index: int, t: int, lag: int = 0) -> None:
        # the lag first: a reader that sees the new horizon sees the lag that goes with it
        _INT64.pack_into(self._map, 16 * index + 8, lag)
        _INT64.pack_into(self._map, 16 * index, t)

    def slowest(self) -> int:
        """The slowest worker's horizon alone."""
        return min(_INT64.unpack_from(self._map, 16 * i)[0] for i in range(self.workers))

    def min(self) -> int:
        lag = max(_INT64.unpack_from(self._map, 16 * i + 8)[0] for i in range(self.workers))
        return self.slowest() - lag

    def close(self) -> None:
        self._map.close()


class LagMeter:
    """A histogram of lags in microseconds, four buckets per octave (cheap enough for every event)."""

    BUCKETS = 128

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.counts = [0] * self.BUCKETS
        self.max_ns = 0
        self.n = 0

    @staticmethod
    def _bucket(us: int) -> int:
        if us < 4:
            return us
        b = us.bit_length()  # 2^(b-1) <= us < 2^b; the two bits after the leading one pick the quarter
        return min(LagMeter.BUCKETS - 1, 4 * (b - 2) + ((us >> (b - 3)) & 3))

    @staticmethod
    def _upper_us(bucket: int) -> int:
        """The largest lag (us) in a bucket."""
        if bucket < 4:
            return bucket
        b, quarter = bucket // 4 + 2, bucket % 4
        return ((4 + quarter + 1) << (b - 3)) - 1

    def record(self, lag_ns: int) -> None:
        if lag_ns < 0:
            lag_ns = 0
        self.counts[self._bucket(lag_ns // 1000)] += 1
        self.n += 1
        if lag_ns > self.max_ns:
            self.max_ns = lag_ns

    def merge(self, other: LagMeter) -> None:
        self.counts = [a + b for a, b in zip(self.counts, other.counts)]
        self.n += other.n
        self.max_ns = max(self.max_ns, other.max_ns)

    def percentile_us(self, p: float) -> float:
        """An upper bound of the p-th percentile: its bucket's upper edge (within 25 %), at most the max."""
        bucket = histogram_percentile(self.counts, p)
        return 0.0 if bucket is None else float(min(self._upper_us(bucket), self.max_ns // 1000))

    def to_dict(self) -> dict:
        return {"counts": self.counts, "max_ns": self.max_ns, "n": self.n}

    @classmethod
    def from_dict(cls, d: dict) -> LagMeter:
        m = cls()
        m.counts, m.max_ns, m.n = list(d["counts"]), d["max_ns"], d["n"]
        return m


def schedstat() -> tuple[int, int]:
    """(ns on a CPU, ns waiting on a run queue) of this process's main thread, from the kernel."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            run, wait, _ = f.read().split()
        return int(run), int(wait)
    except (OSError, ValueError):
        return int(time.process_time_ns()), 0
