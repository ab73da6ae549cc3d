"""The transports a scenario compares: MRC and the baseline, each knowing how its WRITEs are made.

Why it exists: a scenario runs its workloads once per transport, and what differs between
them (wire format, EVs, recovery mode, how long a run lingers) must be said in one place:
here, not in `if transport == "baseline"` branches in the parser, the runner and the report.
"""

from __future__ import annotations

from enum import Enum

from ...topology import Topology
from ...topology.evs import EvFormat
from ...transport.config import QpConfig
from ..runtime.transfer import TransferSpec, cc_options_for


class Transport(str, Enum):
    """A transport of a scenario run; its value is its name in scenario files and results."""

    MRC = "mrc"  # sprayed over every EV (SRv6 segment lists), selective repeat, path avoidance
    BASELINE = "baseline"  # RoCEv2 as deployed: one ECMP-hashed path (plain UDP/IPv6), go-back-N

    def spec(self, src: str, dst: str, size: int, mtu: int, evs: list[int] | None = None,
             start_at: float | None = None, label: str = "", topology: Topology | None = None) -> TransferSpec:
        """One WRITE of this transport (`evs`: MRC's EVs to spray over; the baseline has its one path).

        MRC runs UEC's NSCC; the baseline runs DCQCN, as RoCEv2 is deployed, with its responder
        answering CE marks with CNPs. Both learn the fabric's link rate and base RTT from
        `topology` (the emulated ones: under time dilation the topology's rate, not the shaped one)."""
        fabric = {} if topology is None else {"link_rate_bps": topology.link_rate_bps,
                                              "base_rtt_ns": topology.ports.base_rtt_ns}
        if self is Transport.BASELINE:
            return TransferSpec(src, dst, size, [0], EvFormat.UDP, QpConfig.baseline(mtu=mtu, cnp=True, **fabric),
                                "dcqcn", label=label, start_at=start_at)
        options = None if topology is None else cc_options_for("nscc", topology)
        return TransferSpec(src, dst, size, evs, EvFormat.SRV6, QpConfig(mtu=mtu, cc_options=options, **fabric), "nscc",
                            label=label, start_at=start_at)

    @property
    def linger_s(self) -> float:
        """After its WRITEs complete, how long a run waits for probes to revive EVs marked bad."""
        return 3.0 if self is Transport.MRC else 0.0

    @property
    def needs_routing(self) -> bool:
        """Whether it needs plain IPv6 routing between hosts (FRR BGP), not only the EVs' SIDs."""
        return self is Transport.BASELINE

    def __str__(self) -> str:
        return self.value
