"""All the QPs of one host behind one pair of sockets: datagrams go to the QP they name.

Why it exists: a host takes part in many transfers at once (incast, all-to-all, rings) and
has one RoCEv2 port (UDP 4791); its requesters and responders share it, demultiplexed by the
destination QPN in the BTH. The QPs of a host also share one EV-probe budget, so that a host
with many QPs over one failed link probes it at a bounded rate. The host's own MRC endpoint
(controller EV probes, PORT_STATUS_UPDATE: transport/endpoint.py) sits at the reserved QPN 0x2
(`serve`) and hears of every QP added, so that a port disabled before it still applies. Sans-IO
like every endpoint: a driver asks it where a datagram goes, then hands the datagram to that QP.
"""

from __future__ import annotations

from typing import Any

from ..wire.format import ENDPOINT_QPN
from .probing import ProbeBudget

HOST_PROBES_PER_S = 20_000  # EV probes a host sends at most per second, all its QPs together
HOST_PROBE_BURST = 256


class HostMux:
    """The endpoints of one host, found by QPN."""

    def __init__(self, address: bytes) -> None:
        self.address = address
        self.by_qpn: dict[int, Any] = {}
        self.unknown_qp = 0
        self.probe_budget = ProbeBudget(HOST_PROBES_PER_S, HOST_PROBE_BURST)
        self.endpoint: Any = None  # the host's MRC endpoint (QPN 0x2), once `serve`d

    def add(self, qpn: int, endpoint: Any) -> None:
        if qpn == ENDPOINT_QPN:
            raise ValueError(f"QPN {ENDPOINT_QPN:#x} is reserved for the host's MRC endpoint")
        self.by_qpn[qpn] = endpoint
        if self.endpoint is not None:
            self.endpoint.adopt()

    def serve(self, endpoint: Any) -> None:
        """The host's MRC endpoint (transport.endpoint.HostEndpoint) answers QPN 0x2."""
        self.endpoint = self.by_qpn[ENDPOINT_QPN] = endpoint

    def route(self, payload: bytes | memoryview):
        """The endpoint a datagram is for (by the destination QPN in its BTH), or None."""
        endpoint = self.by_qpn.get(int.from_bytes(payload[5:8], "big")) if len(payload) >= 12 else None
        if endpoint is None:
            self.unknown_qp += 1
        return endpoint
