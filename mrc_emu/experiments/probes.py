"""EV probes on a running fabric: the glue between topology, fabric sockets and the prober."""

from __future__ import annotations

from ..fabric import ops
from ..fabric.running import Fabric
from ..io.prober import ProbeRequest, ProbeResult, probe
from ..transport.paths import qp_paths


def probe_evs(fabric: Fabric, src: str, dst: str, ev_indexes: list[int] | None = None,
              timeout: float = 1.0) -> list[ProbeResult]:
    """One EV probe per EV (out along it, back along its reverse) from host src towards dst."""
    paths = qp_paths(fabric.topology, src, dst, ev_indexes=ev_indexes)
    requests = [ProbeRequest(ev, p.first_hop, p.template) for ev, p in paths.probes.items()]
    send, recv = ops.host_sockets(fabric, src)
    try:
        return probe(send, recv, requests, timeout=timeout)
    finally:
        send.close()
        recv.close()
