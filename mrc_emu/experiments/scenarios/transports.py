"""The transports a scenario compares: MRC and the baseline, each knowing how its WRITEs are made.

Why it exists: a scenario runs its workloads once per transport, and what differs between
them (wire format, EVs, recovery mode, how long a run lingers) must be said in one place:
here, not in `if transport == "baseline"` branches in the parser, the runner and the report.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from enum import Enum

from ...topology import Topology
from ...topology.evs import EvFormat, evs_between
from ...transport.config import QpConfig
from ..runtime.spec import cc_options
from ..runtime.transfer import TransferSpec


class Transport(str, Enum):
    """A transport of a scenario run; its value is its name in scenario files and results."""

    MRC = "mrc"  # sprayed over every EV (SRv6 segment lists), selective repeat, path avoidance
    BASELINE = "baseline"  # RoCEv2 as deployed: one ECMP-hashed path (plain UDP/IPv6), go-back-N

    def spec(self, src: str, dst: str, size: int, mtu: int, evs: list[int] | None = None,
             start_at: float | None = None, label: str = "", topology: Topology | None = None) -> TransferSpec:
        """One WRITE of this transport (`evs`: MRC's EVs to spray over; the baseline has its one path).

        MRC runs UEC's NSCC; the baseline runs DCQCN, as RoCEv2 is deployed, with its responder
        answering CE marks with CNPs. Both learn the fabric's link rate from `topology` (the
        emulated one: under time dilation the topology's rate, not the shaped one); the baseline
        its base RTT too, NSCC only a `base_rtt` the topology gives (else the run measures the
        fabric's idle loop for it: runtime/base_rtt.py). MRC's CC is made with its NIC's rate (one
        link per plane: it sprays over all of them), the baseline's with its one link's."""
        if topology is None:
            rate = nic = base_rtt = None
        else:
            rate, nic, base_rtt = topology.link_rate_bps, topology.nic_rate_bps, topology.ports.base_rtt_ns
        if self is Transport.BASELINE:
            return TransferSpec(src, dst, size, [0], EvFormat.UDP,
                                QpConfig.baseline(mtu=mtu, cnp=True, link_rate_bps=rate, base_rtt_ns=base_rtt),
                                "dcqcn", label=label, start_at=start_at)
        if topology is not None and not topology.ports.base_rtt_given:
            base_rtt = None
        config = QpConfig(mtu=mtu, link_rate_bps=rate, nic_rate_bps=nic, base_rtt_ns=base_rtt,
                          cc_options=cc_options("nscc", nic, base_rtt, rate))
        return TransferSpec(src, dst, size, evs, EvFormat.SRV6, config, "nscc", label=label, start_at=start_at)

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


def baseline_path(topo: Topology, src: str, dst: str, transports: Iterable[Transport],
                  observe: Callable[[], tuple[str, str]], seen_in: str) -> tuple[tuple[str, str], str]:
    """The link `link: baseline-path` names, and the note that says how it was found: the one the
    baseline's flow src -> dst crosses (`observe()`, `seen_in` saying where it was seen), or,
    without a baseline run, EV 0's leaf-spine link."""
    if Transport.BASELINE in transports:
        link = observe()
        return link, (f"the baseline's flow {src}->{dst} crosses {link[0]}-{link[1]} ({seen_in}); "
                      f"the fault hits that link")
    ev = evs_between(topo, src, dst)[0]
    link = (ev.hops[1], ev.hops[2])
    return link, f"no baseline run: 'baseline-path' falls back to EV 0's link {link[0]}-{link[1]}"


def competing_specs(fault, topo: Topology, link: tuple[str, str], mtu: int) -> list[TransferSpec]:
    """The MRC WRITEs a congestion fault starts over `link` (scenarios.faults: its `competing` pairs)."""
    return [Transport.MRC.spec(a, b, fault.size, mtu, evs, start_at=fault.at, topology=topo,
                               label=f"competing flow {a}->{b} over {'-'.join(link)}")
            for a, b, evs in fault.competing(topo, link)]
