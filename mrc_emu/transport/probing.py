"""EV probes of a requester: which ASSUMED_BAD EV to probe when, and which probe came back.

Why it exists: MRC revives an ASSUMED_BAD EV only when a probe of exactly that path returns.
Every `probe_interval` the requester sends an ACKNOWLEDGE-with-MRCX-PROBE along each such EV
to the destination's End SID and back along the reverse EV to itself (no responder process
involved); a probe that comes back on the EV it was sent on, with an id this QP gave it,
makes the EV GOOD again and records its RTT. Probe ids start at a random value from the
injected source, so that a stale or forged probe is unlikely to match.
"""

from __future__ import annotations

import itertools

from ..wire.format import ProbePacket
from .config import RandomBits
from .ev import EvProfile, EvState
from .paths import Path, Send

PENDING_LIMIT = 1024  # probes awaited at most; older ones are forgotten beyond this
STALE_INTERVALS = 100  # a probe this many intervals old will not come back


class EvProber:
    """Probe scheduling and bookkeeping of one requester's EVs."""

    def __init__(self, qpn: int, paths: dict[int, Path], profile: EvProfile, interval_ns: int,
                 random_bits: RandomBits) -> None:
        self.qpn = qpn
        self.paths = paths
        self.profile = profile
        self.interval_ns = interval_ns
        self._ids = itertools.count(random_bits(16) << 16)
        self.pending: dict[int, tuple[int, int]] = {}  # probe id -> (EV, send time)
        self.probes_sent = 0
        self.probes_returned = 0

    def send_due(self, now: int, send: Send) -> None:
        """Probe every ASSUMED_BAD EV whose probe is due (and that has a probe path)."""
        for ev, stats in self.profile.evs.items():
            if stats.state is EvState.ASSUMED_BAD and stats.probe_due_ns <= now and ev in self.paths:
                stats.probe_due_ns = now + self.interval_ns
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
        self.profile.on_probe(probe.ev, now, now - sent[1])
        return True

    def next_wakeup(self) -> int | None:
        due = [s.probe_due_ns for ev, s in self.profile.evs.items() if s.state is EvState.ASSUMED_BAD and ev in self.paths]
        return min(due) if due else None
