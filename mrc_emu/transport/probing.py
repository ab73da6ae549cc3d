"""EV probes of a requester: which ASSUMED_BAD EV to probe when, and which probe came back.

Why it exists: MRC revives an ASSUMED_BAD EV only when a probe of exactly that path is
answered. The requester sends an ACKNOWLEDGE-with-MRCX-PROBE along such an EV (the data
packets' own path and frame template, so it proves that path) to the destination's QP; the
destination's MRC endpoint (its responder) answers with a PROBE_RESPONSE along the reverse EV,
the way its ACKs for that EV go, naming the port the probe arrived at and how long it held the
probe (service time). A response for the EV its probe was sent on, with an id this QP gave it
(and, when the port is known, at the port of that EV's plane), makes the EV GOOD again and
records its RTT (service time included, as OCP's rtt) and the service time. Probe ids start at
a random value from the injected source, so that a stale or forged response is unlikely to match.

Probing is paced, because probes are load too: an EV that stays bad is probed at
`interval`, then twice that, up to MAX_BACKOFF times it (a dead link costs little and a
healed one is found within one backoff); a QP sends at most `per_interval` probes per
interval; and the QPs of one host may share a `ProbeBudget` (a token bucket), so that a host
with many QPs over one failed link does not flood the fabric with probes.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from ..wire.format import ProbePacket, ProbeResponsePacket
from .config import RandomBits
from .multipath.ev import EvProfile, EvState
from .multipath.paths import Path, Send

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


@dataclass(frozen=True)
class ProbeAnswer:
    """What the last answered probe of an EV said."""

    time_ns: int  # when the response arrived
    rtt_ns: int  # probe sent to response received (the responder's service time included)
    service_ns: int  # the responder's service time (the probe's arrival to the response's send)
    port: int  # the 1-based port of the destination the probe arrived at (0: unknown)

    def to_dict(self) -> dict:
        return {"time_ns": self.time_ns, "rtt_ns": self.rtt_ns, "service_ns": self.service_ns, "port": self.port}


class EvProber:
    """Probe scheduling and bookkeeping of one requester's EVs. `paths`: the QP's forward paths
    (a probe goes exactly where data goes); `dest_qp`: the responder's QPN, which answers."""

    def __init__(self, qpn: int, dest_qp: int, paths: dict[int, Path], profile: EvProfile, interval_ns: int,
                 random_bits: RandomBits, budget: ProbeBudget | None = None, per_interval: int = PER_INTERVAL) -> None:
        self.qpn = qpn
        self.dest_qp = dest_qp
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
        self.answers: dict[int, ProbeAnswer] = {}  # EV -> its last answered probe
        self.witness = None  # the requester's witness probes (witness.py), told of every answer

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
               if stats.state is EvState.ASSUMED_BAD and stats.probe_due_ns <= now and ev in self.paths
               and ev not in self.profile.excluded]
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
            if self.send_probe(ev, now, send) is not None:
                stats.probes_sent += 1
                self.probes_sent += 1
        if len(self.pending) > PENDING_LIMIT:
            stale = now - STALE_INTERVALS * self.interval_ns
            self.pending = {k: v for k, v in self.pending.items() if v[1] > stale}

    def send_probe(self, ev: int, now: int, send: Send) -> int | None:
        """One probe along `ev`, sent at `now`, awaited; its id (None: it could not leave the host)."""
        path = self.paths[ev]
        probe_id = next(self._ids) & 0xFFFFFFFF
        if not send(path.template.encode(ProbePacket(self.dest_qp, probe_id, ev, now)), path):
            return None
        self.pending[probe_id] = (ev, now)
        return probe_id

    def on_response(self, rsp: ProbeResponsePacket, now: int) -> str | None:
        """A probe was answered; None if it counts, else why not: `unknown_probe` (an id we
        did not give or forgot, or another EV's) or `probe_wrong_port` (it arrived at another
        port than its EV's plane's: not this path)."""
        sent = self.pending.get(rsp.probe_id)
        if sent is None or sent[0] != rsp.ev:
            return "unknown_probe"
        plane = self.paths[rsp.ev].plane
        if rsp.port and plane is not None and rsp.port != plane + 1:
            return "probe_wrong_port"
        del self.pending[rsp.probe_id]
        if self.witness is None or not self.witness.on_answer(rsp.ev, rsp.probe_id, now):
            self.probes_returned += 1  # a witness (witness.py) is counted there
        self._backoff.pop(rsp.ev, None)  # the path answers: if it fails again, probe it promptly
        rtt = now - sent[1]
        self.answers[rsp.ev] = ProbeAnswer(now, rtt, rsp.service_ns, rsp.port)
        self.profile.on_probe(rsp.ev, now, rtt)
        return None

    def next_wakeup(self) -> int | None:
        due = [s.probe_due_ns for ev, s in self.profile.evs.items()
               if s.state is EvState.ASSUMED_BAD and ev in self.paths and ev not in self.profile.excluded]
        return min(due) if due else None
