"""What a requester records for the fault figures: when progress stopped, and how each loss was repaired.

Why it exists: "how long did the transfer stall after the fault, how soon did the sender know,
when was everything the failed path held delivered" must come from the transport's own records,
exactly, not from a goodput curve windowed over noise (issue 14). The requester keeps two small
records, in its own clock, and the experiments layer reads them against the fault's time and
the EVs through it (experiments/analysis/metrics.py `fault_figures`):

- progress gaps: every interval longer than `GAP_NS` in which no new byte was acknowledged,
  cumulatively or selectively (the stall is the longest one after the fault);
- loss repairs: for each packet declared lost, the EV and send time of the transmission that was
  lost, when the loss was declared, and, once it is acknowledged, the send time of the
  transmission that got through and the acknowledgement's time (detection for the baseline is the
  first resend after the fault that got through; repair is the last acknowledgement of a packet
  lost on a failed EV).

A packet counts once, at its first loss: a resend lost again is still the same repair. Trimmed
packets are kept apart (`trim_repairs`: a trim is a full queue, not a loss; `trim_repair`).
"""

from __future__ import annotations

from ..stats import percentile

GAP_NS = 100_000  # shorter pauses between acknowledgements are the ACK clock, not a stall
# (on the namespace fabric; a driver whose clock is exact may record finer: Ledger.gap_ns)


def trim_repair(repairs: list[tuple[int, float, int]]) -> dict | None:
    """How fast trimmed packets were repaired: from the trimmed copy's send until the resent one
    was acknowledged (p50/p99/max, us), split at the TRIM NACK (`nack_p50_us`: send -> NACK
    heard; `after_nack_p50_us`: NACK -> acknowledged), and, of those whose RTT was known when the
    TRIM NACK came (the trimmed EV's srtt, else the QP's longest), the share repaired within two
    of it; `before_rtt`: trims that came before any RTT sample. None: no trim."""
    if not repairs:
        return None
    times = [t for t, _, _ in repairs]
    nacks = [n for _, _, n in repairs]
    after = [t - n for t, _, n in repairs]
    known = [(t, rtt) for t, rtt, _ in repairs if rtt]
    within = sum(1 for t, rtt in known if t <= 2 * rtt)
    return {"count": len(times), "p50_us": round(percentile(times, 50) / 1e3, 1),
            "p99_us": round(percentile(times, 99) / 1e3, 1), "max_us": round(max(times) / 1e3, 1),
            "nack_p50_us": round(percentile(nacks, 50) / 1e3, 1),
            "after_nack_p50_us": round(percentile(after, 50) / 1e3, 1), "before_rtt": len(repairs) - len(known),
            "within_2_rtt": round(within / len(known), 4) if known else None}


class Ledger:
    __slots__ = ("gaps", "repairs", "trim_repairs", "_last_progress", "_lost", "_trimmed", "gap_ns")

    def __init__(self) -> None:
        self.gap_ns = GAP_NS  # a pause in progress longer than this is a gap (virtual time: one base RTT)
        self.gaps: list[tuple[int, int]] = []  # (last progress, next progress), ns
        # (EV lost on, lost transmission's send, loss declared, good transmission's send, acknowledged), ns
        self.repairs: list[tuple[int, int, int, int, int]] = []
        self._last_progress: int | None = None
        self._lost: dict[int, tuple[object, int, int, int]] = {}  # PSN -> (packet, EV, sent, declared)
        # (trimmed copy sent -> acknowledged, ns; srtt then; trimmed copy sent -> its TRIM NACK heard, ns)
        self.trim_repairs: list[tuple[int, float, int]] = []
        self._trimmed: dict[int, tuple[int, float, int]] = {}  # PSN -> (trimmed copy's send, its RTT then, NACK)

    def started(self, now: int) -> None:
        """The first send: a stall may begin before the first acknowledgement."""
        if self._last_progress is None:
            self._last_progress = now

    def progressed(self, now: int) -> None:
        """New bytes were acknowledged at `now`."""
        last = self._last_progress
        if last is not None and now - last > self.gap_ns:
            self.gaps.append((last, now))
        self._last_progress = now

    def lost(self, pkt, now: int) -> None:
        """`pkt` (its latest transmission) was declared lost at `now`."""
        if pkt.psn not in self._lost:
            self._lost[pkt.psn] = (pkt, pkt.ev, pkt.sent_ns, now)

    def trimmed(self, psn: int, sent_ns: int, rtt: float, now: int) -> None:
        """`psn`'s copy sent at `sent_ns` was trimmed (its TRIM NACK heard `now`, its EV's RTT `rtt`)."""
        self._trimmed.setdefault(psn, (sent_ns, rtt, now))

    def delivered(self, pkts: dict, now: int) -> None:
        """After an acknowledgement: the lost or trimmed packets no longer waiting (`pkts`) were
        repaired now."""
        if self._lost:
            for psn in [p for p in self._lost if p not in pkts]:
                pkt, ev, sent, declared = self._lost.pop(psn)
                self.repairs.append((ev, sent, declared, pkt.sent_ns, now))
        if self._trimmed:
            for psn in [p for p in self._trimmed if p not in pkts]:
                sent, srtt, nacked = self._trimmed.pop(psn)
                self.trim_repairs.append((now - sent, srtt, nacked - sent))

    def to_dict(self) -> dict:
        return {"gaps": [list(g) for g in self.gaps], "repairs": [list(r) for r in self.repairs],
                "last_progress": self._last_progress,
                "unrepaired": [[ev, sent, declared] for _, ev, sent, declared in self._lost.values()]}
