"""The endpoint batch (mrc_ctl.h c:998-1084, `mrc_ctl_ep_batch_send_wait`): EV probes and port status
updates sent by the controller, answered by the remote MRC endpoint.

Why it exists: the C call sends a batch of same-type requests and blocks until every response is
in or the timeout passes. Being pure, the mirror is an object the experiments layer drives:
`EpBatch(...)` checks the whole batch first (nothing is sent if anything is wrong), the driver
sends the requests and feeds each arriving response to `on_response(resp, now_ns)`, and
`result(now_ns)` is what the call returns: the responses in arrival order and 0, or ETIMEDOUT with
the responses that did arrive (mrc_ctl_ev_probes.md reads them after a short count). A response
for an unknown, already answered or late req_id is ignored and counted, never an error: the
fabric may deliver anything. `ReqIdPool` hands out req_ids and holds back those whose late
responses may still come (the header: unique among outstanding requests, not reused while fabric
buffering could still deliver a response). It must never touch the system.
"""

from __future__ import annotations

import errno
import ipaddress
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from .errors import MrcApiError
from .formats import EV_MAX_BYTES, MODE_MAX_BITS, EvFormatMode
from .ports import PortAdmin, PortAdminState

U8, U16, U32 = (1 << 8) - 1, (1 << 16) - 1, (1 << 32) - 1
MAX_DSCP = 63  # req_tc is a DSCP: 6 bits


class EpOpType(IntEnum):
    """enum mrc_ctl_ep_op_type: one type per batch."""

    EV_PROBE = 0
    PORT_STATUS_UPDATE = 1


def gid(value: Any, where: str) -> ipaddress.IPv6Address:
    """A RoCEv2 GID: an IPv6 address (string or 16 bytes); an IPv4 string means its IPv4-mapped GID
    (::ffff:a.b.c.d), as RoCEv2 writes IPv4 addresses."""
    try:
        if isinstance(value, (bytes, bytearray)):
            if len(value) != 16:
                raise ValueError
            return ipaddress.IPv6Address(bytes(value))
        if isinstance(value, ipaddress.IPv6Address):
            return value
        if isinstance(value, str) and "." in value and ":" not in value:
            return ipaddress.IPv6Address("::ffff:" + str(ipaddress.IPv4Address(value)))
        return ipaddress.IPv6Address(value)
    except (ValueError, TypeError):
        raise MrcApiError(f"{where}: {value!r} is not a RoCEv2 GID (an IPv6 address or 16 bytes)") from None


@dataclass(frozen=True)
class EpRequest:
    """struct mrc_ctl_ep_req: `req_ev`/`req_port` are its req_ev {val, port}; `port_status` its
    op.port_status_update.port_status (PORT_STATUS_UPDATE only; probes carry nothing else)."""

    req_id: int
    sgid: Any
    dgid: Any
    ev_fmt_mode: EvFormatMode
    req_ev: bytes
    req_port: int
    port_status: int | None = None


@dataclass(frozen=True)
class EpResponse:
    """struct mrc_ctl_ep_rsp: the request it answers, the 1-based port it arrived on, the RTT in ns, and
    whether the RTT was corrected for the responder's service time."""

    req_id: int
    port: int
    rtt_ns: int
    adj_svc_time: bool = False


class ReqIdPool:
    """req_ids for endpoint requests: unique among outstanding ones, and held back (quarantined) after a batch
    until `quarantine_ns` has passed, since a late response for them may still be in the fabric."""

    def __init__(self, quarantine_ns: int = 1_000_000_000):
        self.quarantine_ns = _uint(quarantine_ns, (1 << 63) - 1, "quarantine_ns")
        self.outstanding: set[int] = set()
        self.held: dict[int, int] = {}  # req_id -> when it may be used again (ns)
        self._next = 1

    def free(self, req_id: int, now_ns: int) -> bool:
        return req_id not in self.outstanding and self.held.get(req_id, 0) <= now_ns

    def allocate(self, count: int, now_ns: int) -> list[int]:
        """`count` free req_ids (round robin over the u16 space), now outstanding; EAGAIN if too few are free."""
        _uint(count, U16 + 1, "count", 1)
        found: list[int] = []
        for step in range(U16 + 1):
            candidate = (self._next + step) & U16
            if self.free(candidate, now_ns):
                found.append(candidate)
                if len(found) == count:
                    break
        if len(found) < count:
            raise MrcApiError(f"count: only {len(found)} req_ids are free, {count} asked", errno.EAGAIN)
        self._next = (found[-1] + 1) & U16
        self.reserve(found, now_ns)
        return found

    def reserve(self, req_ids: Iterable[int], now_ns: int) -> None:
        """Mark caller-chosen req_ids outstanding; EAGAIN, reserving none, if one is outstanding or held back."""
        req_ids = list(req_ids)
        for req_id in req_ids:
            if not self.free(req_id, now_ns):
                until = self.held.get(req_id)
                why = "outstanding" if req_id in self.outstanding else f"held back until {until} ns (late responses)"
                raise MrcApiError(f"req_id: {req_id} is {why}", errno.EAGAIN)
        for req_id in req_ids:
            self.outstanding.add(req_id)
            self.held.pop(req_id, None)

    def release(self, req_id: int, now_ns: int, answered: bool) -> None:
        """A batch is over: an answered req_id is free at once, an unanswered one after the quarantine."""
        self.outstanding.discard(req_id)
        if not answered:
            self.held[req_id] = now_ns + self.quarantine_ns


class EpBatch:
    """One mrc_ctl_ep_batch_send_wait call, checked at construction; the driver sends `requests` and reports
    responses. `ports` (the local PortAdmin) checks req_port and port_status; `pool` reserves the req_ids."""

    def __init__(self, op_type: EpOpType | int, requests: Sequence[EpRequest], rsp_timeout_ns: int, req_tc: int,
                 now_ns: int, *, ports: PortAdmin | None = None, pool: ReqIdPool | None = None,
                 ev_probe_supported: bool = True, local_gids: Iterable[Any] = ()):
        if isinstance(op_type, bool) or op_type not in set(EpOpType):
            raise MrcApiError(f"op_type: {op_type!r} is not EV_PROBE (0) or PORT_STATUS_UPDATE (1)")
        self.op_type = EpOpType(op_type)
        if self.op_type == EpOpType.EV_PROBE and not ev_probe_supported:
            raise MrcApiError("op_type: EV_PROBE needs MRC_CTL_OPT_CAP_EP_OP_EV_PROBE", errno.ENOTSUP)
        self.req_tc = _uint(req_tc, MAX_DSCP, "req_tc")
        self.rsp_timeout_ns = _uint(rsp_timeout_ns, U32, "rsp_timeout")
        self.sent_ns = _uint(now_ns, (1 << 63) - 1, "now_ns")
        if isinstance(requests, (str, bytes)) or not isinstance(requests, Sequence) or not requests:
            raise MrcApiError(f"req: expected a non-empty list of EpRequest, got {requests!r}")
        local = {gid(value, "local_gids") for value in local_gids}
        self.requests = [self._check(req, f"req[{index}]", ports, local) for index, req in enumerate(requests)]
        ids = Counter(req.req_id for req in self.requests)
        twice = sorted(req_id for req_id, count in ids.items() if count > 1)
        if twice:
            raise MrcApiError(f"req_id: {twice[0]} appears {ids[twice[0]]} times in one batch")
        if pool is not None:
            pool.reserve(ids, now_ns)
        self.pool = pool
        self.port_numbers = set(ports.admin) if ports is not None else None  # where a response may arrive
        self.responses: list[EpResponse] = []
        self.ignored: Counter[str] = Counter()  # responses dropped: unknown, duplicate, late, malformed
        self.closed = False

    def _check(self, req: Any, where: str, ports: PortAdmin | None, local: set) -> EpRequest:
        if not isinstance(req, EpRequest):
            raise MrcApiError(f"{where}: {req!r} is not an EpRequest")
        _uint(req.req_id, U16, f"{where}.req_id")
        sgid, dgid = gid(req.sgid, f"{where}.sgid"), gid(req.dgid, f"{where}.dgid")
        if local and sgid not in local:
            raise MrcApiError(f"{where}.sgid: {sgid} is not a GID of this device")
        if isinstance(req.ev_fmt_mode, bool) or req.ev_fmt_mode not in {m.value for m in EvFormatMode}:
            raise MrcApiError(f"{where}.ev_fmt_mode: {req.ev_fmt_mode!r} is not STEV, SRV6 or UDP")
        mode = EvFormatMode(req.ev_fmt_mode)
        if not isinstance(req.req_ev, (bytes, bytearray)) or len(req.req_ev) > EV_MAX_BYTES:
            raise MrcApiError(f"{where}.req_ev: expected at most {EV_MAX_BYTES} bytes, got {req.req_ev!r}")
        value = bytes(req.req_ev).ljust(EV_MAX_BYTES, b"\0")
        if any(value[MODE_MAX_BITS[mode] // 8:]):
            raise MrcApiError(f"{where}.req_ev: {mode.name} carries {MODE_MAX_BITS[mode] // 8} bytes, "
                              f"the EV has more ({value.rstrip(bytes(1)).hex()})")
        _uint(req.req_port, U8, f"{where}.req_port", 1)
        if ports is not None:
            if req.req_port not in ports.admin:
                raise MrcApiError(f"{where}.req_port: {req.req_port} is not a port of this device (ports {ports.ports})")
            if ports.admin[req.req_port] == PortAdminState.DISABLED:
                raise MrcApiError(f"{where}.req_port: port {req.req_port} is DISABLED")
        status = req.port_status
        if self.op_type == EpOpType.EV_PROBE:
            if status not in (None, 0):
                raise MrcApiError(f"{where}.port_status: only PORT_STATUS_UPDATE carries a port status")
        else:
            _uint(status, U32, f"{where}.port_status")
            if status & 1:
                raise MrcApiError(f"{where}.port_status: bit 0 is set, but ports are 1-based (bit N = port N)")
            if ports is not None and status & ~ports.phy_port_mask:
                raise MrcApiError(f"{where}.port_status: 0x{status:X} names ports outside phy_port_mask "
                                  f"0x{ports.phy_port_mask:X}")
        return EpRequest(req.req_id, sgid, dgid, mode, value, req.req_port, status)

    @property
    def deadline_ns(self) -> int:
        return self.sent_ns + self.rsp_timeout_ns

    @property
    def answered(self) -> set[int]:
        return {resp.req_id for resp in self.responses}

    @property
    def missing(self) -> list[int]:
        """The req_ids still without a response, in request order."""
        answered = self.answered
        return [req.req_id for req in self.requests if req.req_id not in answered]

    @property
    def done(self) -> bool:
        """Every request answered (the call would return now)."""
        return not self.missing

    def on_response(self, resp: Any, now_ns: int) -> bool:
        """A response arrived: kept (True) if it answers an open request of this batch in time; else ignored,
        counted in `ignored` by reason."""
        reason = self._reject(resp, now_ns)
        if reason:
            self.ignored[reason] += 1
            return False
        self.responses.append(resp)
        return True

    def _reject(self, resp: Any, now_ns: int) -> str:
        if not isinstance(resp, EpResponse) or not _is_uint(resp.req_id, U16) or not _is_uint(resp.port, U8) \
                or resp.port == 0 or not _is_uint(resp.rtt_ns, U32) \
                or (self.port_numbers is not None and resp.port not in self.port_numbers):
            return "malformed"
        if self.closed or now_ns > self.deadline_ns:
            return "late"
        if resp.req_id not in {req.req_id for req in self.requests}:
            return "unknown"
        return "duplicate" if resp.req_id in self.answered else ""

    def result(self, now_ns: int) -> tuple[list[EpResponse], int]:
        """What the call returns once done or past the deadline: (responses in arrival order, 0 or ETIMEDOUT).
        It closes the batch (responses are not buffered between calls) and releases its req_ids to the pool."""
        if not self.done and now_ns < self.deadline_ns and not self.closed:
            raise MrcApiError(f"now_ns: {now_ns} is before the deadline {self.deadline_ns} and "
                              f"{len(self.missing)} response(s) are missing: the call is still waiting")
        if not self.closed and self.pool is not None:
            answered = self.answered
            for req in self.requests:
                self.pool.release(req.req_id, now_ns, req.req_id in answered)
        self.closed = True
        return list(self.responses), 0 if self.done else errno.ETIMEDOUT


def _is_uint(value: Any, top: int) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and 0 <= value <= top


def _uint(value: Any, top: int, name: str, low: int = 0) -> int:
    if not _is_uint(value, top) or value < low:
        raise MrcApiError(f"{name}: {value!r} is not {low}..{top}")
    return value
