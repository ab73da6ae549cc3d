"""One egress port of the virtual fabric: its queue, its transmitter, and the link it sends into.

Why it exists: a frame spends its time in the fabric waiting in egress queues and being
serialised onto links; that, and what the port does to a frame when it arrives (the port
program's verdict: mark CE, trim, drop), is where congestion and its signals come from. A
port here is a work-conserving transmitter at the link's rate with the port program's two
classes, served in strict priority as its HTB is (control packets and trimmed headers ahead of
data, topology port model on), or one FIFO (a host's NIC without the port program). Its queue
is exact: the bytes enqueued and not yet serialised, the one on the wire counted by what is
left of it, so the verdict (topology/port_verdict.py) is given the backlog the port really
has. Serialisation times are exact to the nanosecond without accumulating rounding: within a
busy period at one rate, the frame that ends at byte B of the period ends at t0 + ceil(B x 8e9
/ rate). The link's propagation delay (plus a delay fault's) follows; what the far end does
with the frame is the fabric's (`arrive`). Counters as the port program keeps them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from ..topology.port import HIST_BUCKETS, histogram_width
from ..topology.port_verdict import PortRule, Verdict
from ..wire.switchport import ETH_LEN, classify, mark_ce, trim, trimmed_length
from .engine import Engine

NS_BITS = 8_000_000_000  # bits x ns per byte x s: a byte takes 8e9 / rate ns at `rate` bit/s


class EgressPort:
    """The port `ifname` of `node` that sends to `peer` over one direction of a link."""

    def __init__(self, engine: Engine, node: str, ifname: str, peer: str, plane: int, rate_bps: int,
                 delay_ns: int, rule: PortRule | None, rng: Any, arrive: Callable[[Any], None],
                 bucket: Callable[[int], int] | None = None) -> None:
        self.engine, self.node, self.ifname, self.peer, self.plane = engine, node, ifname, peer, plane
        self.nominal_bps = rate_bps  # the link's rate; a degrade fault runs it at a fraction
        self.rate_bps = rate_bps
        self.delay_ns = delay_ns  # propagation delay, plus a delay fault's
        self.rule = rule  # the port program's numbers (None: a FIFO that only serialises, a host's NIC)
        self.rng = rng
        self._arrive = arrive  # the fabric's: called at the far end with (port, frame, generation)
        self.up = True
        self.blackholed = False  # what this direction carries is dropped where the far end receives it
        self.loss = 0.0  # ... each frame with this probability
        self.generation = 0  # bumped when the link goes down: what was on the wire then is lost
        self.ahead: deque[tuple[bytearray, int]] = deque()  # (frame, wire bytes): control, trimmed headers
        self.data: deque[tuple[bytearray, int]] = deque()
        self.queued_bytes = 0  # in the two queues, not started
        self._bucket_of = bucket  # TBF's bucket in bytes at a rate (topology/port.py tbf_shape), or None: no bucket
        self.bucket = bucket(rate_bps) if bucket else 0
        self.busy_until = 0  # when the last frame started is out (left the port)
        self._period_start = 0  # the busy period's start, its rate, and the bytes started in it
        self._period_rate = rate_bps
        self._period_bytes = 0
        self._drained_at = 0  # when the rate has served every byte started (busy_until, without a bucket)
        self._armed = False  # a transmit event is scheduled at busy_until
        self.packets = self.bytes = self.max_queue = self.ce_marked = self.trimmed = self.dropped = 0
        self.flushed = 0  # frames lost in the queue when the link went down
        self.hist_width = rule and histogram_width(rule.buffer, rule.trim_threshold, rule.kmax)
        self.hist = [0] * HIST_BUCKETS if rule else None

    def backlog(self, now: int) -> int:
        """Bytes waiting at `now`: queued ones, and what the rate has not yet served of those that
        left (without a bucket: what is left of the one on the wire)."""
        return self.queued_bytes + self._debt(now)

    def _debt(self, now: int) -> int:
        if now >= self._drained_at:
            return 0
        served = (now - self._period_start) * self._period_rate // NS_BITS
        return self._period_bytes - min(self._period_bytes, served)

    def set_rate(self, rate_bps: int) -> None:
        """The port's rate from now on (a degrade fault), its bucket with it, as build.shape_port reshapes TBF."""
        self.rate_bps = rate_bps
        self.bucket = self._bucket_of(rate_bps) if self._bucket_of else 0

    def offer(self, frame: bytearray) -> None:
        """A frame to send, at the engine's now: the verdict, then the queue (or the wire)."""
        now = self.engine.now
        if not self.up:
            self.flushed += 1
            return
        length = len(frame) + ETH_LEN
        queue = self.backlog(now)
        if self.bucket:  # what TBF holds, as the port program's fluid model has it (port.bpf.c)
            queue = queue - self.bucket if queue > self.bucket else 0
        rule = self.rule
        ahead = True
        if rule is not None:
            inner, udp, data, trim_ok, ect = classify(frame)
            width = self.hist_width
            bucket = 1 + (queue - 1) // width if queue else 0
            self.hist[bucket if bucket < HIST_BUCKETS else HIST_BUCKETS - 1] += 1
            verdict, length = rule.verdict(queue, length, trimmed_length(udp, rule.trim_bytes) + ETH_LEN, data,
                                           trim_ok, ect, self.rng.getrandbits(32))
            if verdict is Verdict.DROP:
                self.dropped += 1
                return
            if verdict is Verdict.TRIM:
                trim(frame, inner, udp, rule.trim_bytes, rule.lasthop)
                self.trimmed += 1
            else:
                if verdict is Verdict.MARK:
                    mark_ce(frame, inner)
                    self.ce_marked += 1
                ahead = not data
        else:
            ahead = False  # one FIFO
        self.packets += 1
        self.bytes += length
        if queue + length > self.max_queue:
            self.max_queue = queue + length
        (self.ahead if ahead else self.data).append((frame, length))
        self.queued_bytes += length
        if not self._armed:
            if now >= self.busy_until:
                self._transmit(now)
            else:  # the last frame is still on the wire: this one follows it
                self._armed = True
                self.engine.at(self.busy_until, self._next)

    def _transmit(self, now: int) -> None:
        """Put the next frame on the wire (control first), its arrival at the far end scheduled.

        It leaves when the rate has served every byte before it and itself, less the bucket: with no
        bucket, when it is serialised; with TBF's bucket b, as soon as TBF's tokens (b less what the
        rate has not yet served) cover it, so an idle port lets a burst of up to b bytes through at
        once and then the rate, as the namespace fabric's shaped ports do."""
        frame, length = self.ahead.popleft() if self.ahead else self.data.popleft()
        self.queued_bytes -= length
        if now > self._drained_at or self._period_rate != self.rate_bps:  # a new busy period (or rate)
            debt = self._debt(now)  # what a bucket's port has not yet paid for, carried over a rate change
            self._period_start, self._period_rate, self._period_bytes = now, self.rate_bps, debt
        self._period_bytes += length
        self._drained_at = self._period_start + -(-self._period_bytes * NS_BITS // self._period_rate)
        owed = self._period_bytes - self.bucket
        done = self._drained_at if not self.bucket else \
            max(now, self._period_start + -(-owed * NS_BITS // self._period_rate)) if owed > 0 else now
        self.busy_until = done
        self.engine.at(done + self.delay_ns, self._arrive, (self, frame, self.generation))
        if self.ahead or self.data:
            self._armed = True
            self.engine.at(done, self._next)
        else:
            self._armed = False

    def _next(self, _: Any) -> None:
        if self.up and (self.ahead or self.data):
            self._transmit(self.engine.now)
        else:
            self._armed = False  # the link went down meanwhile

    def set_up(self, up: bool) -> None:
        """The link's carrier: down loses what waits here and what is on the wire."""
        if self.up and not up:
            self.generation += 1
            self.flushed += len(self.ahead) + len(self.data)
            self.ahead.clear()
            self.data.clear()
            self.queued_bytes = 0
        self.up = up

    def counters(self) -> dict[str, Any]:
        """What the port program's counters say of a port (fabric/datapath/ports.py counters)."""
        out = {"peer": self.peer, "rate_bps": self.rate_bps, "packets": self.packets, "bytes": self.bytes,
               "max_queue": self.max_queue, "ce_marked": self.ce_marked, "trimmed": self.trimmed,
               "dropped": self.dropped, "flushed": self.flushed}
        if self.hist is not None:
            out |= {"queue_hist": list(self.hist), "hist_width": self.hist_width}
        return out
