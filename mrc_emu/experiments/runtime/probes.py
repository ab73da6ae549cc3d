"""EV probes on a running fabric: the glue between topology, fabric sockets and the prober.

These are the fabric's own reachability probes (`mrc-emu probe`, the fabric check): each goes
out along an EV to the destination's End SID, where the kernel turns it around, and back along
the reverse EV to its sender, so they need no MRC endpoint at the destination. The transport's
EV probes are answered by the destination's endpoint instead (transport/probing.py, endpoint.py).
"""

from __future__ import annotations

from ...fabric import ops
from ...fabric.running import Fabric
from ...io.prober import ProbeRequest, ProbeResult, probe
from ...topology import addressing as ad
from ...topology import evs_between, probe_segments
from ...wire.encoder import Encap, FrameTemplate
from ...wire.format import Endpoints


def probe_evs(fabric: Fabric, src: str, dst: str, ev_indexes: list[int] | None = None,
              timeout: float = 1.0) -> list[ProbeResult]:
    """One EV probe per EV (out along it, back along its reverse) from host src towards dst."""
    topo = fabric.topology
    evs = evs_between(topo, src, dst)
    if ev_indexes is not None:
        unknown = [k for k in ev_indexes if not 0 <= k < len(evs)]
        if unknown:
            raise ValueError(f"no EV {unknown[0]} between {src} and {dst} (EVs 0..{len(evs) - 1})")
        evs = [evs[k] for k in ev_indexes]
    me = ad.host_address(topo, src)
    requests = []
    for ev in evs:
        segments = probe_segments(topo, ev)
        requests.append(ProbeRequest(ev.index, segments[0], FrameTemplate(Endpoints(me, me, ev.udp_sport),
                                                                          Encap.srv6(me, segments))))
    send, recv = ops.host_sockets(fabric, src)
    try:
        return probe(send, recv, requests, timeout=timeout)
    finally:
        send.close()
        recv.close()
