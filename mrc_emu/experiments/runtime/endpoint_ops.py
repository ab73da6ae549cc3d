"""Controller operations on hosts' MRC endpoints during a run: EV_PROBE batches, port disable/enable.

Why it exists: OCP's endpoint batch (EV_PROBE, PORT_STATUS_UPDATE) and port admin state act on
a live host, whose endpoint (transport.endpoint.HostEndpoint, QPN 0x2) lives in a worker
process. Another thread of the parent asks through the run's `Control` (`control.endpoint`, an
`EndpointOps`): `set_port_status(host, mask)` applies a host's port-status mask at once (its QPs
stop using a disabled port's EVs, its peers are told), `ev_probe(host, [(req_id, dst, ev)],
rsp_timeout_ns)` gives an `EpBatch` whose `done` is set when every response came or the
timeout passed (OCP's ETIMEDOUT: `timed_out`, with the responses that came). The parent's
watch (`transfer._Watch`) hands the operations to the workers (`step`); the workers' side is
`WorkerOps` (handlers and a tick). Only hosts that take part in the run have an endpoint.
"""

from __future__ import annotations

import queue
import socket
import threading
from dataclasses import dataclass, field
from typing import Any

from ...topology import Topology
from ...transport.endpoint import EpRequest
from ...transport.multipath.paths import Path, qp_paths

# ---- messages: parent -> worker, worker -> parent --------------------------------------------

@dataclass(frozen=True)
class EpPaths:
    """At `host`, the endpoint's paths towards `peer` (an address), by EV index."""

    host: str
    peer: str
    paths: dict[int, Path]


@dataclass(frozen=True)
class SetPortStatus:
    host: str
    mask: int  # bit p: 1-based port p enabled


@dataclass(frozen=True)
class PortStatusSet:
    host: str
    mask: int
    time_ns: int  # transport clock, when it applied


@dataclass(frozen=True)
class EpProbe:
    host: str
    batch: int
    requests: tuple[tuple[int, str, int, Path | None], ...]  # (req_id, destination address, EV index, a value's path)
    rsp_timeout_ns: int


@dataclass(frozen=True)
class EpProbeDone:
    host: str
    batch: int
    responses: tuple[dict, ...]  # EpResponse.to_dict(), in arrival order
    timed_out: bool


# ---- the parent's side --------------------------------------------------------------------------

@dataclass
class EpBatch:
    """One EV_PROBE batch asked for from another thread; `done` is set when it is answered."""

    host: str
    requests: list[tuple]  # (req_id, destination host, EV index[, the path of an EV value probed: evvalues.py])
    rsp_timeout_ns: int
    responses: list[dict] = field(default_factory=list)
    timed_out: bool = False
    done: threading.Event = field(default_factory=threading.Event)


class EndpointOps:
    """Operations asked for by other threads, carried to the workers by the run's watch."""

    def __init__(self) -> None:
        self._asked: queue.SimpleQueue = queue.SimpleQueue()
        self._batches: dict[int, EpBatch] = {}
        self._next = 1
        self.applied: list[PortStatusSet] = []  # what the workers reported, in order
        # (host, peer) whose paths the host's endpoint was taught: paths are the topology's, so
        # once is enough (computing and sending them per probe cost minutes on a 128-host run)
        self._taught: set[tuple[str, str]] = set()

    def set_port_status(self, host: str, mask: int) -> None:
        self._asked.put(SetPortStatus(host, mask))

    def ev_probe(self, host: str, requests: list[tuple], rsp_timeout_ns: int = 2_000_000) -> EpBatch:
        """EV_PROBE from `host`: (req_id, destination host, EV index) each, or (req_id, destination host,
        transport.endpoint.VALUE_PROBE_EV, the path of the EV value to probe)."""
        batch = EpBatch(host, list(requests), rsp_timeout_ns)
        self._asked.put(batch)
        return batch

    def _teach(self, of: dict[str, Any], address_of: dict[str, str], topo: Topology, host: str, peer: str) -> None:
        if (host, peer) not in self._taught:
            self._taught.add((host, peer))
            of[host].send(EpPaths(host, address_of[peer], qp_paths(topo, host, peer).forward))

    def step(self, of: dict[str, Any], address_of: dict[str, str], topo: Topology) -> None:
        """Send what was asked (to the worker of each host), take what the workers answered."""
        while True:
            try:
                op = self._asked.get_nowait()
            except queue.Empty:
                break
            if op.host not in of:
                if isinstance(op, EpBatch):
                    op.timed_out = True
                    op.done.set()
                continue
            if isinstance(op, SetPortStatus):
                of[op.host].send(op)
                continue
            ids, self._next = self._next, self._next + 1
            self._batches[ids] = op
            wire = []
            for req_id, dst, ev, *value in op.requests:
                if dst == op.host or dst not in address_of:
                    continue  # no such peer in the run: never answered (the batch times out)
                if dst in of:  # the destination answers along its paths back
                    self._teach(of, address_of, topo, dst, op.host)
                self._teach(of, address_of, topo, op.host, dst)
                wire.append((req_id, address_of[dst], ev, value[0] if value else None))
            of[op.host].send(EpProbe(op.host, ids, tuple(wire), op.rsp_timeout_ns))
        for worker in set(of.values()):
            while (done := worker.poll(EpProbeDone)) is not None:
                batch = self._batches.pop(done.batch, None)
                if batch is not None:
                    batch.responses, batch.timed_out = list(done.responses), done.timed_out
                    batch.done.set()
            while (applied := worker.poll(PortStatusSet)) is not None:
                self.applied.append(applied)


# ---- the workers' side --------------------------------------------------------------------------

class WorkerOps:
    """A worker's handlers of the messages above (`handlers`) and the tick that answers batches."""

    def __init__(self, parent: Any, loop: Any, ports: dict[str, Any]) -> None:
        self.parent, self.loop, self.ports = parent, loop, ports
        self._pending: dict[str, tuple[int, set[int], list[dict], int]] = {}  # host -> (batch, req ids, got, deadline)
        self.handlers = {EpPaths: self.paths, SetPortStatus: self.port_status, EpProbe: self.probe}

    def _endpoint(self, host: str):
        return self.ports[host].mux.endpoint

    def paths(self, msg: EpPaths) -> None:
        if msg.peer:
            self._endpoint(msg.host).learn(socket.inet_pton(socket.AF_INET6, msg.peer), msg.paths)

    def port_status(self, msg: SetPortStatus) -> None:
        endpoint, now = self._endpoint(msg.host), self.loop.clock.now()
        endpoint.set_port_status(msg.mask, now)
        self.loop.wake(endpoint)
        self.parent.send(PortStatusSet(msg.host, endpoint.status.local, now))

    def probe(self, msg: EpProbe) -> None:
        endpoint, now = self._endpoint(msg.host), self.loop.clock.now()
        requests = [EpRequest(req_id, socket.inet_pton(socket.AF_INET6, dst), ev, path)
                    for req_id, dst, ev, path in msg.requests if dst]
        try:
            endpoint.ev_probe(requests)
        except ValueError:
            self.parent.send(EpProbeDone(msg.host, msg.batch, (), True))
            return
        self._pending[msg.host] = (msg.batch, {r.req_id for r in requests}, [], now + msg.rsp_timeout_ns)
        self.loop.wake(endpoint)

    def tick(self, now: int) -> None:
        for host, (batch, waiting, got, deadline) in list(self._pending.items()):
            endpoint = self._endpoint(host)
            for rsp in endpoint.take_responses():
                if rsp.req_id in waiting:
                    waiting.discard(rsp.req_id)
                    got.append(rsp.to_dict())
            if not waiting or now >= deadline:
                endpoint.forget(sorted(waiting))
                del self._pending[host]
                self.parent.send(EpProbeDone(host, batch, tuple(got), bool(waiting)))
