"""The RTT estimator of one EV: smoothed RTT, its variation, the smallest sample.

Why it exists: every EV (path) has its own queues, so each keeps its own estimate, and
that one estimate feeds everything that needs an RTT: the EV's spray weight, its loss
timer (srtt + 4 rttvar, as TCP's RTO), the EV report, and the congestion control (which
is handed the EV's srtt with every acknowledgement instead of keeping one of its own).

The smallest sample is kept with when it was taken (`lows`), so that two EVs' smallest RTTs
can be compared over the same span of time (`min_by`): an EV that stopped delivering (a dead
path) keeps the smallest RTT it saw before, perhaps all of it behind a start-up queue, while
its siblings go on to see their paths idle; the difference of the two is then no path's length.
"""

from __future__ import annotations

RTT_GAIN = 1 / 8  # srtt and rttvar gains (RFC 6298's alpha; its beta is 1/4, ours 1/8 keeps rttvar steadier)
LOWS = 48  # how many steps of its smallest RTT an estimator remembers (the oldest go first)
STEP = 7 / 8  # a new step where the smallest RTT fell below this much of the last step's first value


class RttEstimator:
    """RFC 6298-style smoothing of one path's RTT samples (ns). 0 means no sample yet."""

    __slots__ = ("srtt_ns", "rttvar_ns", "min_rtt_ns", "latest_ns", "samples", "heard_ns", "lows")

    def __init__(self) -> None:
        self.srtt_ns = 0.0
        self.rttvar_ns = 0.0
        self.min_rtt_ns = 0
        self.latest_ns = 0
        self.samples = 0
        self.heard_ns = 0  # when the latest sample (or rebase) was taken
        self.lows: list[tuple[int, int, int]] = []  # steps of min_rtt_ns: (from when, its value then, the least since)

    def update(self, rtt_ns: int, now: int = 0) -> None:
        if self.srtt_ns == 0:
            self.srtt_ns, self.rttvar_ns = float(rtt_ns), rtt_ns / 2
        else:
            self.rttvar_ns += RTT_GAIN * (abs(self.srtt_ns - rtt_ns) - self.rttvar_ns)
            self.srtt_ns += RTT_GAIN * (rtt_ns - self.srtt_ns)
        if self.min_rtt_ns == 0 or rtt_ns < self.min_rtt_ns:
            self.min_rtt_ns = rtt_ns
            self._low(now)
        self.latest_ns = rtt_ns
        self.samples += 1
        self.heard_ns = now

    def _low(self, now: int, epoch: bool = False) -> None:
        """Remember that the smallest RTT is `min_rtt_ns` from `now` on: a new step where it fell by
        more than an eighth of the last step's first value (or `epoch`: a rebase), else that step's
        value lowered, so a step answers for its whole span with the least it held (never more)."""
        lows, low = self.lows, self.min_rtt_ns
        if lows and not epoch and low >= lows[-1][1] * STEP:
            lows[-1] = (lows[-1][0], lows[-1][1], low)
        elif lows and lows[-1][0] >= now:
            lows[-1] = (now, low, low)
        else:
            lows.append((now, low, low))
            if len(lows) > LOWS:
                del lows[0]

    def min_by(self, when: int) -> int:
        """The smallest RTT as it was at `when`, or a little less (0: none known then, or forgotten)."""
        for since, _, low in reversed(self.lows):
            if since <= when:
                return low
        return 0

    def rebase(self, rtt_ns: int, at_least: bool = False, now: int = 0) -> None:
        """The path changed (a probe that revived it, a witness answered after its EV was taken for
        dead): its smallest RTT starts again from this sample (`at_least`: only if it is larger).
        The smallest sample of all time would hold an EV whose path grew longer (a delay of 5 ms on
        a link) to its old RTT for ever, and every witness of it would be taken for lost."""
        if not at_least or rtt_ns > self.min_rtt_ns:
            self.min_rtt_ns = rtt_ns
            self._low(now, epoch=True)
        self.heard_ns = max(self.heard_ns, now)
        if self.srtt_ns < rtt_ns:  # and its smoothed RTT from it, as from a first sample: the loss
            self.srtt_ns, self.rttvar_ns = float(rtt_ns), rtt_ns / 2  # timer must not outrun it

    def timer(self, floor_ns: int) -> int:
        """How long a packet may go unacknowledged on this path once later ones got through:
        srtt + 4 rttvar, at least `floor_ns` (only meaningful once there is a sample)."""
        return max(floor_ns, int(self.srtt_ns + 4 * self.rttvar_ns))
