"""The RTT estimator of one EV: smoothed RTT, its variation, the smallest sample.

Why it exists: every EV (path) has its own queues, so each keeps its own estimate, and
that one estimate feeds everything that needs an RTT: the EV's spray weight, its loss
timer (srtt + 4 rttvar, as TCP's RTO), the EV report, and the congestion control (which
is handed the EV's srtt with every acknowledgement instead of keeping one of its own).
"""

from __future__ import annotations

RTT_GAIN = 1 / 8  # srtt and rttvar gains (RFC 6298's alpha; its beta is 1/4, ours 1/8 keeps rttvar steadier)


class RttEstimator:
    """RFC 6298-style smoothing of one path's RTT samples (ns). 0 means no sample yet."""

    __slots__ = ("srtt_ns", "rttvar_ns", "min_rtt_ns", "latest_ns", "samples")

    def __init__(self) -> None:
        self.srtt_ns = 0.0
        self.rttvar_ns = 0.0
        self.min_rtt_ns = 0
        self.latest_ns = 0
        self.samples = 0

    def update(self, rtt_ns: int) -> None:
        if self.srtt_ns == 0:
            self.srtt_ns, self.rttvar_ns = float(rtt_ns), rtt_ns / 2
        else:
            self.rttvar_ns += RTT_GAIN * (abs(self.srtt_ns - rtt_ns) - self.rttvar_ns)
            self.srtt_ns += RTT_GAIN * (rtt_ns - self.srtt_ns)
        if self.min_rtt_ns == 0 or rtt_ns < self.min_rtt_ns:
            self.min_rtt_ns = rtt_ns
        self.latest_ns = rtt_ns
        self.samples += 1

    def rebase(self, rtt_ns: int, at_least: bool = False) -> None:
        """The path changed (a probe that revived it, a witness answered after its EV was taken for
        dead): its smallest RTT starts again from this sample (`at_least`: only if it is larger).
        The smallest sample of all time would hold an EV whose path grew longer (a delay of 5 ms on
        a link) to its old RTT for ever, and every witness of it would be taken for lost."""
        if not at_least or rtt_ns > self.min_rtt_ns:
            self.min_rtt_ns = rtt_ns
        if self.srtt_ns < rtt_ns:  # and its smoothed RTT from it, as from a first sample: the loss
            self.srtt_ns, self.rttvar_ns = float(rtt_ns), rtt_ns / 2  # timer must not outrun it

    def timer(self, floor_ns: int) -> int:
        """How long a packet may go unacknowledged on this path once later ones got through:
        srtt + 4 rttvar, at least `floor_ns` (only meaningful once there is a sample)."""
        return max(floor_ns, int(self.srtt_ns + 4 * self.rttvar_ns))
