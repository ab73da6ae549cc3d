"""A QP's attributes (QpConfig), PSN arithmetic and the constants both sides of a QP share.

Why it exists: the requester, the responder, recovery and the drivers' callers all read the
same attributes (MTU, ACK timeout and retries after the OCP formula, the MPR window, the
recovery mode); they are checked once, here, when a QP is configured. PSNs are unbounded
integers inside the transport and 24 bits on the wire; `psn_abs` maps one to the other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from ..wire import format as fmt

PSN_MOD = 1 << 24
HALF = 1 << 23
ACK_TIMEOUT_UNIT_NS = 1024  # the ACK timeout is 1.024 us x 2^t
INFINITE_RETRIES = 25
MPR_PSNS = 128  # the MPR (the SACK window) is in units of this many PSNs
MAX_MPR = 64  # _place.c keeps the window as bits of MAX_WINDOW = MAX_MPR x MPR_PSNS

RandomBits = Callable[[int], int]  # n -> n random bits (secrets.randbits; random.Random(seed).getrandbits in tests)


class RecoveryMode(str, Enum):
    """How a QP recovers lost packets (both ends of the QP must agree)."""

    SACK = "sack"  # MRC: selective, per packet, each packet resent on its own
    GO_BACK_N = "go-back-n"  # RoCEv2 RC as deployed: in order only, resend everything from the gap on


@dataclass
class QpConfig:
    mtu: int = 4096  # payload bytes per packet
    ack_timeout_exp: int = 14  # t: ACK timeout = 1.024 us * 2^t (14: 16.8 ms), t <= 24
    retry_linear: int = 7  # retries at the plain ACK timeout (OCP: <= 7)
    retry_exp: int = 4  # then retries with the timeout doubling each time (<= 25; 25 = infinite)
    mpr: int = 8  # max PSN range (the SACK window), in units of 128 PSNs
    ack_every: int = 32  # the responder acknowledges at least every this many data packets ...
    ack_delay_ns: int = 250_000  # ... or this long after the first packet it has not acknowledged
    # the requester sets AckReq on every this many PSNs and on the last one its PSN window lets
    # out (0: only on a WRITE's last packet, a resend, or a nearly full congestion window): an RC
    # responder, rdma_rxe's for one, acknowledges only a packet that asks (docs/interop.md)
    ack_req_every: int = 0
    probe_interval_ns: int = 1_000_000
    reorder_floor_ns: int = 10_000  # the least reorder window of an EV (loss.window)
    # witness probes in a row that must go unanswered before an EV's path is taken for failed
    # (transport/witness.py): the first suspends the EV (its packets resent, none sent on it), the
    # second decides; 2 because a host's CPUs can reorder one path's packets (docs/transport.md)
    witnesses: int = 2
    burst: int = 32  # packets per pump, so receiving is never starved
    pkey: int = fmt.DEFAULT_PKEY
    path_avoidance: bool = True  # False for the single-path baseline: no EV states, no probes
    recovery: RecoveryMode = RecoveryMode.SACK  # a RecoveryMode or its value ("sack", "go-back-n")
    trimmable: bool = True  # data packets as DSCP_TRIMMABLE; False: DSCP_NO_TRIM (RoCEv2 RC: a switch drops, never trims)
    cnp: bool = False  # DCQCN's notification point: the responder answers CE marks with CNPs ...
    cnp_interval_ns: int = 50_000  # ... at most one per this long per QP
    # the responder side of the QP, as its api QP's caps leave it (mrc.h: a peer that lacks the feature
    # turns it off per QP with TRIM_NACK_DEST_UNSUPPORTED / SVC_TIME_DEST_UNSUPPORTED)
    trim_nack: bool = True  # a trimmed packet is answered with a TRIM NACK (False: ignored, left to loss detection)
    svc_time: bool = True  # ACKs carry the responder's service time (False: 0, the requester's RTT keeps it)
    # for the CC profile (cc.registry.make_cc), in the transport's (emulated) time: under time dilation K the
    # topology's rate, not the rate / K the links are shaped to; None: unknown (an unshaped fabric)
    link_rate_bps: float | None = None  # one port's link rate, the slower end's (a packet's serialization)
    # the slower end's NIC rate over the planes the QP sprays (NSCC's BDP, DCQCN's line rate): MRC's
    # NIC port is split into one link per plane; None: one link, link_rate_bps (the baseline's one path)
    nic_rate_bps: float | None = None
    base_rtt_ns: int | None = None  # the fabric's unloaded RTT over its longest path (NSCC's config_base_rtt)
    cc_options: dict | None = None  # the CC profile's own configuration (make_cc's options, e.g. NSCC's max_cwnd)

    def __post_init__(self) -> None:
        if not 64 <= self.mtu <= 8192 or self.mtu % 4:
            raise ValueError(f"MTU {self.mtu}: must be a multiple of 4 between 64 and 8192")
        if not 0 <= self.ack_timeout_exp <= 24:
            raise ValueError(f"ACK timeout exponent {self.ack_timeout_exp}: must be 0..24")
        if not 0 <= self.retry_linear <= 7 or not 0 <= self.retry_exp <= INFINITE_RETRIES:
            raise ValueError("retries: linear 0..7, exponential 0..25 (25 = infinite)")
        if not 1 <= self.mpr <= MAX_MPR:
            raise ValueError(f"MPR {self.mpr}: must be 1..{MAX_MPR} (x{MPR_PSNS} PSNs)")
        if self.ack_req_every < 0:
            raise ValueError(f"AckReq every {self.ack_req_every} PSNs: must be >= 0 (0: not periodic)")
        if self.cnp_interval_ns < 0:
            raise ValueError(f"CNP interval {self.cnp_interval_ns} ns: must be >= 0")
        for what, rate in (("link", self.link_rate_bps), ("NIC", self.nic_rate_bps)):
            if rate is not None and rate <= 0:
                raise ValueError(f"{what} rate {rate}: must be positive (or None: unknown)")
        if self.cc_options is not None and not isinstance(self.cc_options, dict):
            raise ValueError(f"CC options {self.cc_options!r}: a mapping of the profile's fields (or None)")
        if self.base_rtt_ns is not None and self.base_rtt_ns <= 0:
            raise ValueError(f"base RTT {self.base_rtt_ns} ns: must be positive (or None: unknown)")
        try:
            self.recovery = RecoveryMode(self.recovery)
        except ValueError:
            raise ValueError(f"recovery {self.recovery!r}: 'sack' or 'go-back-n'") from None

    @classmethod
    def baseline(cls, **kw) -> QpConfig:
        """RoCEv2 RC as deployed today: one path, go-back-N, no path avoidance, and the ACK
        timeout and retry count of a typical RoCE NIC set-up (t=15: 33.5 ms; 7 retries, then
        6 doubling ones: a budget of about 4.4 s, so that routing can repair the path); AckReq
        every 32 PSNs, as an RC responder that coalesces no ACKs of its own needs it."""
        return cls(**{"path_avoidance": False, "recovery": RecoveryMode.GO_BACK_N, "ack_timeout_exp": 15,
                      "retry_exp": 6, "trimmable": False, "ack_req_every": 32, **kw})

    @property
    def cc_rate_bps(self) -> float | None:
        """The rate the CC profile is made with: the NIC's over its planes, else one link's."""
        return self.nic_rate_bps or self.link_rate_bps

    @property
    def ack_timeout_ns(self) -> int:
        return ACK_TIMEOUT_UNIT_NS << self.ack_timeout_exp

    @property
    def window(self) -> int:
        return self.mpr * MPR_PSNS

    def ack_timeout_for(self, tries: int) -> int:
        """The ACK timeout of a packet's `tries`-th transmission: `retry_linear` retries at the
        plain timeout, then each one doubles it."""
        retries = tries - 1
        if retries <= self.retry_linear:
            return self.ack_timeout_ns
        return self.ack_timeout_ns << min(20, retries - self.retry_linear)

    def retry_budget_spent(self, tries: int) -> bool:
        """Whether a packet that went unacknowledged `tries` times may not be sent again."""
        if self.retry_exp >= INFINITE_RETRIES:
            return False
        return tries - 1 >= self.retry_linear + self.retry_exp


def psn_abs(wire: int, near: int) -> int:
    """The unbounded PSN closest to `near` whose low 24 bits are `wire`."""
    diff = (wire - near) & (PSN_MOD - 1)
    if diff >= HALF:
        diff -= PSN_MOD
    return near + diff
