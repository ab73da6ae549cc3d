"""EV probes on a running fabric: the glue between topology, fabric sockets and the prober."""

from __future__ import annotations

from ..fabric import ops
from ..fabric.build import load_topology
from ..topology import addressing as ad
from ..topology import evs_between, probe_segments
from ..transport.probe import ProbeRequest, ProbeResult, probe
from ..wire.fast import Encap, FrameTemplate
from ..wire.format import Endpoints


def probe_evs(name: str, src: str, dst: str, ev_indexes: list[int] | None = None,
              timeout: float = 1.0) -> list[ProbeResult]:
    topo = load_topology(name)
    evs = evs_between(topo, src, dst)
    if ev_indexes is not None:
        unknown = [k for k in ev_indexes if not 0 <= k < len(evs)]
        if unknown:
            raise ValueError(f"no EV {unknown[0]} between {src} and {dst} (EVs 0..{len(evs) - 1})")
        evs = [evs[k] for k in ev_indexes]
    me = ad.host_address(topo, src)
    requests = []  # a probe returns to its sender: inner source and destination are both `src`
    for ev in evs:
        segments = probe_segments(topo, ev)
        template = FrameTemplate(Endpoints(me, me, ev.udp_sport), Encap.srv6(me, segments))
        requests.append(ProbeRequest(ev.index, segments[0], template))
    send, recv = ops.host_sockets(name, src)
    try:
        return probe(send, recv, requests, timeout=timeout)
    finally:
        send.close()
        recv.close()
