"""EV probes of a requester: which ASSUMED_BAD EV to probe when, and which probe came back.

Why it exists: MRC revives an ASSUMED_BAD EV only when a probe of exactly that path returns.
The requester sends an ACKNOWLEDGE-with-MRCX-PROBE along such an EV to the destination's End
SID and back along the reverse EV to itself (no responder process involved); a probe that
comes back on the EV it was sent on, with an id this QP gave it, makes the EV GOOD again and
records its RTT. Probe ids start at a random value from the injected source, so that a stale
or forged probe is unlikely to match.

Probing is paced, because probes are load too: an EV that stays bad is probed at
`interval`, then twice that, up to MAX_BACKOFF times it (a dead link costs little and a
healed one is found within one backoff); a QP sends at most `per_interval` probes per
interval; and the QPs of one host may share a `ProbeBudget` (a token bucket), so that a host
with many QPs over one failed link does not flood the fabric with probes.
"""

from __future__ import annotations

import itertools

from ..wire.format import ProbePacket
from .config import RandomBits
from .ev import EvProfile, EvState
from .paths import Path, Send

PENDING_LIMIT = 1024  # probes awaited at most; older ones are forgotten beyond this
STALE_INTERVALS = 100  # a probe this many intervals old will not come back
MAX_BACKOFF = 64  # an EV that stays bad is probed at most every 64 intervals
PER_INTERVAL = 8  # probes one QP sends at most per interval


class ProbeBudget:
    """Probes per second allowed to a group of QPs (one host), as a token bucket."""

    def __init__(self, rate_per_s: float, burst: int) -> None:
        if rate_per_s <= 0 or burst < 1:
            raise ValueError("a probe budget needs a positive rate and a burst of at least one")
        self.rate_per_ns = rate_per_s / 1e9
        self.burst = burst
        self.tokens = float(burst)
        self.at = None
        self.refused = 0

    def take(self, now: int) -> bool:
        if self.at is not None:
            self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate_per_ns)
        self.at = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        self.refused += 1
        return False


class EvProber:
    """Probe scheduling and bookkeeping of one requester's EVs."""

    def __init__(self, qpn: int, paths: dict[int, Path], profile: EvProfile, interval_ns: int,
                 random_bits: RandomBits, budget: ProbeBudget | None = None, per_interval: int = PER_INTERVAL) -> None:
        self.qpn = qpn
        self.paths = paths
        self.profile = profile
        self.interval_ns = interval_ns
        self.budget = budget
        self.per_interval = per_interval
        self._ids = itertools.count(random_bits(16) << 16)
        self.pending: dict[int, tuple[int, int]] = {}  # probe id -> (EV, send time)
        self._backoff: dict[int, int] = {}  # EV -> its interval multiplier while it stays bad
        self._waiting: dict[int, int] = {}  # EV -> since when its probe has been held back by a budget
        self._window_start = 0
        self._window_sent = 0
        self.probes_sent = 0
        self.probes_returned = 0
        self.probes_paced = 0  # probes due but held back by the QP's or the host's budget

    def _allowed(self, now: int) -> bool:
        if now - self._window_start >= self.interval_ns:
            self._window_start, self._window_sent = now, 0
        if self._window_sent >= self.per_interval or (self.budget is not None and not self.budget.take(now)):
            self.probes_paced += 1
            return False
        self._window_sent += 1
        return True

    def send_due(self, now: int, send: Send) -> None:
        """Probe every ASSUMED_BAD EV whose probe is due (and that has a probe path), within budget."""
        waiting = self._waiting
        due = [(waiting.get(ev, stats.probe_due_ns), ev) for ev, stats in self.profile.evs.items()
               if stats.state is EvState.ASSUMED_BAD and stats.probe_due_ns <= now and ev in self.paths]
        for since, ev in sorted(due):  # the longest-waiting first, so a budget serves every EV in turn
            stats = self.profile.evs[ev]
            if not self._allowed(now):
                waiting[ev] = since
                stats.probe_due_ns = max(stats.probe_due_ns, self._window_start + self.interval_ns)
                continue
            waiting.pop(ev, None)
            backoff = self._backoff.get(ev, 1)
            stats.probe_due_ns = now + backoff * self.interval_ns
            self._backoff[ev] = min(MAX_BACKOFF, 2 * backoff)
            path = self.paths[ev]
            probe_id = next(self._ids) & 0xFFFFFFFF
            frame = path.template.encode(ProbePacket(self.qpn, probe_id, ev, now))
            if send(frame, path):
                self.pending[probe_id] = (ev, now)
                stats.probes_sent += 1
                self.probes_sent += 1
        if len(self.pending) > PENDING_LIMIT:
            stale = now - STALE_INTERVALS * self.interval_ns
            self.pending = {k: v for k, v in self.pending.items() if v[1] > stale}

    def on_probe(self, probe: ProbePacket, now: int) -> bool:
        """A probe came back; False if it is none of ours (unknown id, or another EV's)."""
        sent = self.pending.pop(probe.probe_id, None)
        if sent is None or sent[0] != probe.ev:
            return False
        self.probes_returned += 1
        self._backoff.pop(probe.ev, None)  # the path answers: if it fails again, probe it promptly
        self.profile.on_probe(probe.ev, now, now - sent[1])
        return True

    def next_wakeup(self) -> int | None:
        due = [s.probe_due_ns for ev, s in self.profile.evs.items() if s.state is EvState.ASSUMED_BAD and ev in self.paths]
        return min(due) if due else None
