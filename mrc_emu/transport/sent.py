"""The sent-packet table of a requester: every packet sent and not yet known delivered.

Why it exists: recovery (recovery.py) and the C send loop (_spray.c) work on one explicit
table: by PSN, by send order (what is in flight) and by EV (what loss rule 1 walks). The
packet record is `_spray.Pkt` where the C extension is built, else `PyPkt`, the same fields.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

try:  # the C send loop and its packet record (optional; see _spray.c)
    from . import _spray
except ImportError:  # pragma: no cover - the extension was not built
    _spray = None


class PyPkt:
    """One packet of a WRITE, as the requester tracks it (_spray.Pkt is the same in C)."""

    __slots__ = ("psn", "wr", "offset", "length", "ev", "sent_ns", "left_ns", "tx", "last")

    def __init__(self, psn: int, wr, offset: int, length: int, last: bool) -> None:
        self.psn = psn
        self.wr = wr
        self.offset = offset
        self.length = length
        self.last = last
        self.ev = -1
        self.sent_ns = 0  # the latest transmission, stamped once the kernel had it (timers age from here)
        self.left_ns = 0  # when that send began: it left no earlier (RTT samples are taken from here)
        self.tx = 0


Pkt = _spray.Pkt if _spray is not None else PyPkt


class SentPackets:
    """Every packet sent and not yet known delivered, by PSN, by send order and by EV.

    `pkts` holds them all (PSN -> packet record); `flight` the ones in flight, in order of their
    latest send; `by_ev` per EV (PSN, send time) in send order, which loss rule 1 walks (stale
    entries, of packets delivered or resent elsewhere since, are skipped on the way); `retx` the
    PSNs declared lost, to resend. `bytes_in_flight` and `ev_flight` add up what is in flight.
    The C send loop (_spray.c) records its packets in `pkts`, `flight` and `by_ev` as `record` does,
    and `deliver` and `front` run in C (_spray.deliver, _spray.front) where the records are C ones.
    """

    def __init__(self, evs: Iterable[int]) -> None:
        evs = list(evs)
        self.pkts: dict[int, PyPkt] = {}
        self.flight: dict[int, None] = {}
        self.by_ev: dict[int, deque[tuple[int, int]]] = {ev: deque() for ev in evs}
        self.ev_flight: dict[int, int] = dict.fromkeys(evs, 0)
        self.bytes_in_flight = 0
        self.retx: deque[int] = deque()
        self.Pkt = Pkt  # the record type, fixed when the table is made (tests swap the module's)
        # delivery in C for a table of C records (None: the Python loop below)
        self._deliver = _spray.deliver if _spray is not None and self.Pkt is _spray.Pkt else None
        self._front = _spray.front if self._deliver is not None else None

    def new(self, psn: int, wr, offset: int, length: int, last: bool) -> PyPkt:
        pkt = self.pkts[psn] = self.Pkt(psn, wr, offset, length, last)
        return pkt

    def record(self, pkt: PyPkt, ev: int, stamp: int, left: int | None = None) -> None:
        """`pkt` left on `ev`: its send began at `left` (default: `stamp`) and was done at `stamp`."""
        pkt.ev = ev
        pkt.sent_ns = stamp
        pkt.left_ns = stamp if left is None else left
        pkt.tx += 1
        self.flight[pkt.psn] = None
        self.by_ev[ev].append((pkt.psn, stamp))
        self.bytes_in_flight += pkt.length
        self.ev_flight[ev] += pkt.length

    def out_of_flight(self, pkt: PyPkt) -> None:
        del self.flight[pkt.psn]
        self.bytes_in_flight -= pkt.length
        self.ev_flight[pkt.ev] -= pkt.length

    def deliver(self, psns: Iterable[int], seen: dict[int, list[int]]) -> int:
        """Mark PSNs delivered (unknown ones are skipped); returns the bytes. Per EV `seen` gets
        [packets, latest send time, that packet's transmissions, bytes, when its send began]."""
        if self._deliver is not None:  # the same loop in C (_spray.c)
            acked, in_flight = self._deliver(self, psns, seen)
            self.bytes_in_flight -= in_flight
            return acked
        pkts, flight, ev_flight = self.pkts, self.flight, self.ev_flight
        acked = in_flight = 0
        for psn in psns:
            pkt = pkts.pop(psn, None)
            if pkt is None:
                continue
            length = pkt.length
            acked += length
            pkt.wr.acked += length
            if psn in flight:
                del flight[psn]
                in_flight += length
                ev_flight[pkt.ev] -= length
            entry = seen.get(pkt.ev)
            if entry is None:
                seen[pkt.ev] = [1, pkt.sent_ns, pkt.tx, length, pkt.left_ns]
            else:
                entry[0] += 1
                entry[3] += length
                if pkt.sent_ns > entry[1]:
                    entry[1] = pkt.sent_ns
                    entry[2] = pkt.tx
                    entry[4] = pkt.left_ns
        self.bytes_in_flight -= in_flight
        return acked

    def front(self, ev: int) -> PyPkt | None:
        """The oldest packet still in flight on `ev` (stale entries are dropped on the way)."""
        if self._front is not None:  # the same loop in C (_spray.c)
            return self._front(self, ev)
        queue = self.by_ev[ev]
        while queue:
            psn, sent = queue[0]
            pkt = self.pkts.get(psn)
            if pkt is not None and pkt.ev == ev and pkt.sent_ns == sent and psn in self.flight:
                return pkt
            queue.popleft()
        return None

    def oldest(self) -> PyPkt | None:
        """The packet in flight longest since its latest send (the ACK timeout's)."""
        return self.pkts[next(iter(self.flight))] if self.flight else None
