"""A controller per host (mrc_ctl.h's MRC context seen by a controller): its device attributes, its
EV format, EV and CC profiles by id, its ports, its EV event queue, its QPs and endpoint batches.

Why it exists: the header addresses profiles by u64 id (FMT_ID in an EV profile, EV_PROFILE_ID and
CC_PROFILE_ID in a QP) and bounds them by the device's attributes; the other modules hold one
profile each. This one looks ids up, enforces the device's limits (profile counts, EVs per profile
and in all, ev_count_align, modes, ev_op_max_entries, the optional capabilities), counts the QPs
bound to each profile (a profile a live QP uses is EBUSY), and delegates everything else to the
modules that own it (formats, profiles, evops, cc, ports, events, qp, endpoint). The examples pick
profile ids themselves (`ev_fmt_profile_id = 13`), so modifying an id never seen creates that
profile in INIT; `create_*` picks a free id instead. It must never touch the system.
"""

from __future__ import annotations

import errno
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import IntFlag
from typing import Any

from .cc import DEVICE_ALGORITHMS, CcProfile
from .endpoint import EpBatch, EpOpType, EpRequest, ReqIdPool
from .errors import MrcApiError
from .events import EvEvent, EvEventQueue
from .evops import EvOp, EvOpEntry, ev_op
from .formats import EvFormatMode, EvFormatProfile, ProfileState, parse_mode
from .ports import PortAdmin, PortAdminState, PortAttr
from .profiles import ONLINE_ATTRIBUTES, EvProfile, EvProfileMode
from .qp import DeviceAttr, Qp

U64 = (1 << 64) - 1
KINDS = {"ev_fmt": "EV format", "ev": "EV", "cc": "CC"}
ARTICLE = {"ev_fmt": "an", "ev": "an", "cc": "a"}


class OptAttr(IntFlag):
    """enum mrc_ctl_attr_opt."""

    EV_PROFILE_MODIFY_ONLINE = 1 << 0
    CC_PROFILE_MODIFY_ONLINE = 1 << 1
    EV_EVENT = 1 << 2
    EV_EXPLICIT_RANGE = 1 << 3
    EV_EVENT_PRECISE_DROP_CNT = 1 << 4
    EP_OP_EV_PROBE = 1 << 5


# what the emulated device offers: everything but EV_EXPLICIT_RANGE (its explicit arrays are free-form)
DEFAULT_OPT = (OptAttr.EV_PROFILE_MODIFY_ONLINE | OptAttr.CC_PROFILE_MODIFY_ONLINE | OptAttr.EV_EVENT
               | OptAttr.EV_EVENT_PRECISE_DROP_CNT | OptAttr.EP_OP_EV_PROBE)


@dataclass(frozen=True)
class CtlDeviceAttr:
    """struct mrc_ctl_device_attr (mrc_ctl_query_device); `ev_free_count` is filled by query_device()."""

    phy_port_mask: int = 0b110  # bit N = port N (1-based): a host on 2 planes has ports 1, 2
    mrc_ctl_protocol_version: int = 1 << 0
    ev_max_fmt_profiles: int = 16
    ev_max_profiles: int = 64
    ev_max_count: int = 1 << 20
    ev_free_count: int = 1 << 20
    ev_max_count_profile: int = 1 << 16
    ev_count_align: int = 1
    ev_max_width: int = 256  # bits of an EV value a profile's fields may use
    ev_fmt_mode_mask: int = int(EvFormatMode.STEV | EvFormatMode.SRV6 | EvFormatMode.UDP)
    ev_mode_mask: int = int(EvProfileMode.AUTO | EvProfileMode.EXP | EvProfileMode.GEN)
    ev_op_max_entries: int = 0  # 0 = no cap
    cc_max_profiles: int = 16
    algorithms: tuple[str, ...] = DEVICE_ALGORITHMS
    opt_attr: OptAttr = DEFAULT_OPT


def port_mask(planes: int) -> int:
    """phy_port_mask of a host on `planes` planes: bits 1..planes (port p+1 = its NIC on plane p)."""
    if isinstance(planes, bool) or not isinstance(planes, int) or not 1 <= planes <= 31:
        raise MrcApiError(f"planes: {planes!r} is not 1..31")
    return ((1 << planes) - 1) << 1


@dataclass
class Controller:
    """The controller of one host's MRC device. `attrs` defaults to the emulated device with `planes` ports."""

    host: str = "h0"
    planes: int = 2
    attrs: CtlDeviceAttr | None = None
    device: DeviceAttr = field(default_factory=DeviceAttr)  # mrc.h's device attributes, for its QPs
    event_capacity: int = 128
    gids: tuple[Any, ...] = ()  # the device's RoCEv2 GIDs (empty: an ep request's sgid is not checked)

    def __post_init__(self) -> None:
        if self.attrs is None:
            self.attrs = CtlDeviceAttr(phy_port_mask=port_mask(self.planes))
        self.ports = PortAdmin(self.attrs.phy_port_mask)
        self.events = self.create_ev_event_cq(self.event_capacity)
        self.fmt_profiles: dict[int, EvFormatProfile] = {}
        self.ev_profiles: dict[int, EvProfile] = {}
        self.cc_profiles: dict[int, CcProfile] = {}
        self.ev_active_qps: dict[int, int] = {}  # EV profile id -> QPs bound to it (CcProfile counts its own)
        self.qps: list[Qp] = []
        self._qpns = 0
        self.req_ids = ReqIdPool()

    # device

    def query_device(self) -> CtlDeviceAttr:
        """mrc_ctl_query_device: the attributes, ev_free_count = the EVs no profile holds."""
        return replace(self.attrs, ev_free_count=self.attrs.ev_max_count - self._evs_held())

    def _evs_held(self, but: int | None = None) -> int:
        return sum(p.ev_count or 0 for pid, p in self.ev_profiles.items() if pid != but and p.state != ProfileState.INIT)

    def has(self, opt: OptAttr) -> bool:
        return bool(self.attrs.opt_attr & opt)

    def create_ev_event_cq(self, cqe: int) -> EvEventQueue:
        """mrc_ctl_create_ev_event_cq: the queue EV events go to from now on (ENOTSUP without EV_EVENT)."""
        if not self.has(OptAttr.EV_EVENT):
            raise MrcApiError("cqe: EV event CQs need MRC_CTL_OPT_CAP_EV_EVENT", errno.ENOTSUP)
        self.events = EvEventQueue(cqe, precise_drop_count=self.has(OptAttr.EV_EVENT_PRECISE_DROP_CNT))
        return self.events

    def poll_events(self, num_entries: int) -> list[EvEvent]:
        """mrc_ctl_poll_ev_event."""
        return self.events.poll(num_entries)

    # profiles by id

    def _new_id(self, table: dict, profile_id: int | None, limit: int, kind: str) -> int:
        if profile_id is None:
            profile_id = next(pid for pid in range(1, len(table) + 2) if pid not in table)
        elif isinstance(profile_id, bool) or not isinstance(profile_id, int) or not 0 <= profile_id <= U64:
            raise MrcApiError(f"{kind}_profile_id: {profile_id!r} is not a u64")
        elif profile_id in table:
            raise MrcApiError(f"{kind}_profile_id: {profile_id} exists already")
        if len(table) >= limit:
            raise MrcApiError(f"{kind}_profile_id: the device holds at most {limit} {KINDS[kind]} profiles", errno.ENOSPC)
        return profile_id

    def _new(self, kind: str, profile_id: int | None) -> Any:
        """A new profile of `kind` (ev_fmt, ev, cc) in INIT, not yet in its table."""
        if kind == "ev_fmt":
            return EvFormatProfile(self._new_id(self.fmt_profiles, profile_id, self.attrs.ev_max_fmt_profiles, kind))
        if kind == "ev":
            return EvProfile(self._new_id(self.ev_profiles, profile_id, self.attrs.ev_max_profiles, kind))
        pid = self._new_id(self.cc_profiles, profile_id, self.attrs.cc_max_profiles, kind)
        return CcProfile(pid, self.attrs.algorithms, self.has(OptAttr.CC_PROFILE_MODIFY_ONLINE))

    def create_ev_fmt_profile(self, profile_id: int | None = None) -> EvFormatProfile:
        """A format profile in INIT, by the id given or the lowest free one (ENOSPC past ev_max_fmt_profiles)."""
        fmt = self._new("ev_fmt", profile_id)
        self.fmt_profiles[fmt.profile_id] = fmt
        return fmt

    def create_ev_profile(self, profile_id: int | None = None) -> EvProfile:
        profile = self._new("ev", profile_id)
        self.ev_profiles[profile.profile_id] = profile
        return profile

    def create_cc_profile(self, profile_id: int | None = None) -> CcProfile:
        cc = self._new("cc", profile_id)
        self.cc_profiles[cc.profile_id] = cc
        return cc

    def _get(self, table: dict, profile_id: Any, kind: str) -> Any:
        if isinstance(profile_id, bool) or profile_id not in table:
            raise MrcApiError(f"{kind}_profile_id: {profile_id!r} is not {ARTICLE[kind]} {KINDS[kind]} profile of "
                              f"controller {self.host}")
        return table[profile_id]

    def ev_fmt_profile(self, profile_id: int) -> EvFormatProfile:
        return self._get(self.fmt_profiles, profile_id, "ev_fmt")

    def ev_profile(self, profile_id: int) -> EvProfile:
        return self._get(self.ev_profiles, profile_id, "ev")

    def cc_profile(self, profile_id: int) -> CcProfile:
        return self._get(self.cc_profiles, profile_id, "cc")

    def destroy_ev_fmt_profile(self, profile_id: int) -> None:
        fmt = self.ev_fmt_profile(profile_id)
        if fmt.dependents:
            users = sorted(p.profile_id for p in fmt.dependents)
            raise MrcApiError(f"ev_fmt_profile_id: {profile_id} is the format of EV profile(s) {users}", errno.EBUSY)
        del self.fmt_profiles[profile_id]

    def destroy_ev_profile(self, profile_id: int) -> None:
        profile = self.ev_profile(profile_id)
        if self.ev_active_qps.get(profile_id):
            raise MrcApiError(f"ev_profile_id: {self.ev_active_qps[profile_id]} QP(s) use EV profile {profile_id}",
                              errno.EBUSY)
        if profile.state == ProfileState.ONLINE:
            raise MrcApiError(f"ev_profile_id: EV profile {profile_id} is ONLINE (take it OFFLINE first)", errno.EBUSY)
        if profile.state == ProfileState.OFFLINE:
            profile.modify(state=ProfileState.INIT)  # frees its format of it
        del self.ev_profiles[profile_id]

    def destroy_cc_profile(self, profile_id: int) -> None:
        cc = self.cc_profile(profile_id)
        if cc.active_qps:
            raise MrcApiError(f"cc_profile_id: {cc.active_qps} QP(s) use CC profile {profile_id}", errno.EBUSY)
        if cc.state == ProfileState.ONLINE:
            raise MrcApiError(f"cc_profile_id: CC profile {profile_id} is ONLINE (take it OFFLINE first)", errno.EBUSY)
        del self.cc_profiles[profile_id]

    def modify_ev_fmt_profile(self, profile_id: int, **attrs: Any) -> EvFormatProfile:
        """mrc_ctl_modify_ev_fmt_profile(id, state=, cur_state=, mode=, fields=); an id never seen is created."""
        fmt = self.fmt_profiles[profile_id] if profile_id in self.fmt_profiles else self._new("ev_fmt", profile_id)
        mode = attrs.get("mode")
        if mode is not None and not self.attrs.ev_fmt_mode_mask & int(_mode(mode, EvFormatMode)):
            raise MrcApiError(f"mode: {mode!r} is not in the device's ev_fmt_mode_mask 0x{self.attrs.ev_fmt_mode_mask:X}")
        fmt.modify(**attrs)
        self.fmt_profiles[profile_id] = fmt  # a new id exists once a modify succeeded: a failed call changes nothing
        return fmt

    def modify_ev_profile(self, profile_id: int, *, fmt_id: int | None = None, **attrs: Any) -> EvProfile:
        """mrc_ctl_modify_ev_profile(id, state=, cur_state=, mode=, fmt_id=, ev_count=, ev_min_active=,
        ev_event_mask=, fields=) with the device's limits; EV_OP is `ev_op()`. An id never seen is created."""
        profile = self.ev_profiles[profile_id] if profile_id in self.ev_profiles else self._new("ev", profile_id)
        modify_online = self.has(OptAttr.EV_PROFILE_MODIFY_ONLINE)
        online = (modify_online and profile.state == ProfileState.ONLINE and attrs.get("state") in (None, ProfileState.ONLINE)
                  and {k for k, v in attrs.items() if v is not None} - {"state", "cur_state"} <= ONLINE_ATTRIBUTES)
        if self.ev_active_qps.get(profile_id) and not online:
            raise MrcApiError(f"state: {self.ev_active_qps[profile_id]} active QP(s) use EV profile {profile_id}",
                              errno.EBUSY)
        if "fmt" in attrs:
            raise MrcApiError("fmt: a controller takes the format by id (fmt_id=, FMT_ID)")
        if fmt_id is not None:
            attrs["fmt"] = self.ev_fmt_profile(fmt_id)
        mode = attrs.get("mode")
        new_mode = profile.mode if mode is None else _mode(mode, EvProfileMode)
        if mode is not None and not self.attrs.ev_mode_mask & int(new_mode):
            raise MrcApiError(f"mode: {mode!r} is not in the device's ev_mode_mask 0x{self.attrs.ev_mode_mask:X}")
        count = attrs.get("ev_count")
        if count is not None and isinstance(count, int):
            self._check_count(profile_id, count, new_mode)
        fields = attrs.get("fields")
        if fields is not None and sum(getattr(f, "width", 0) for f in fields) > self.attrs.ev_max_width:
            raise MrcApiError(f"fields: total width {sum(f.width for f in fields)} extends past the device's "
                              f"ev_max_width {self.attrs.ev_max_width}", errno.E2BIG)
        profile.modify(**attrs, modify_online=modify_online)
        self.ev_profiles[profile_id] = profile
        return profile

    def _check_count(self, profile_id: int, count: int, mode: EvProfileMode | None) -> None:
        attrs = self.attrs
        if count > attrs.ev_max_count_profile:
            raise MrcApiError(f"ev_count: {count} exceeds the device's ev_max_count_profile {attrs.ev_max_count_profile}",
                              errno.E2BIG)
        if mode == EvProfileMode.EXP and count % max(attrs.ev_count_align, 1):
            raise MrcApiError(f"ev_count: an explicit array of {count} EVs is not a multiple of ev_count_align "
                              f"{attrs.ev_count_align}")
        free = attrs.ev_max_count - self._evs_held(but=profile_id)
        if count > free:
            raise MrcApiError(f"ev_count: {count} EVs, the device has {free} free (ev_max_count {attrs.ev_max_count})",
                              errno.ENOSPC)

    def modify_cc_profile(self, profile_id: int, **attrs: Any) -> CcProfile:
        """mrc_ctl_modify_cc_profile(id, state=, cur_state=, algorithm=, config=); an id never seen is created."""
        cc = self.cc_profiles[profile_id] if profile_id in self.cc_profiles else self._new("cc", profile_id)
        cc.modify(**attrs)
        self.cc_profiles[profile_id] = cc
        return cc

    def ev_op(self, profile_id: int, op: EvOp | int, entries: Sequence[EvOpEntry]) -> int:
        """mrc_ctl_modify_ev_profile (or query) with EV_OP, with this device's ev_op_max_entries, online
        capability and event queue. Allowed while QPs use the profile: it is how EVs are denied under traffic."""
        return ev_op(self.ev_profile(profile_id), op, entries, max_entries=self.attrs.ev_op_max_entries,
                     modify_online=self.has(OptAttr.EV_PROFILE_MODIFY_ONLINE), events=self.events)

    # ports

    def modify_port(self, port_num: int, port_admin_state: PortAdminState | int,
                    attr_mask: PortAttr | int = PortAttr.ADMIN_STATE) -> None:
        self.ports.modify_port(port_num, port_admin_state, attr_mask)

    def query_port(self, port_num: int, attr_mask: PortAttr | int = PortAttr.ADMIN_STATE) -> PortAdminState:
        return self.ports.query_port(port_num, attr_mask)

    # QPs

    def create_qp(self, max_send_wr: int = 128, max_recv_wr: int = 128) -> Qp:
        """mrc_create_qp: a QP in RST whose ->INIT binds this controller's profiles."""
        self._qpns += 1
        qp = Qp(self.device, self, qpn=self._qpns, max_send_wr=max_send_wr, max_recv_wr=max_recv_wr)
        self.qps.append(qp)
        return qp

    def destroy_qp(self, qp: Qp) -> None:
        """mrc_destroy_qp: its profiles are free of it."""
        if qp not in self.qps:
            raise MrcApiError(f"qp: QP {qp.qpn} is not a QP of controller {self.host}")
        qp.unbind()
        self.qps.remove(qp)

    def bind_profiles(self, ev_profile_id: int, cc_profile_id: int) -> None:
        """A QP's -> INIT: both profiles must exist and be ONLINE; each then counts the QP as active."""
        profile, cc = self.ev_profile(ev_profile_id), self.cc_profile(cc_profile_id)
        for name, pid, state in (("ev_profile_id", ev_profile_id, profile.state), ("cc_profile_id", cc_profile_id, cc.state)):
            if state != ProfileState.ONLINE:
                raise MrcApiError(f"{name}: profile {pid} is {state.name}, not ONLINE")
        self.ev_active_qps[ev_profile_id] = self.ev_active_qps.get(ev_profile_id, 0) + 1
        cc.active_qps += 1

    def unbind_profiles(self, ev_profile_id: int, cc_profile_id: int) -> None:
        if self.ev_active_qps.get(ev_profile_id):
            self.ev_active_qps[ev_profile_id] -= 1
        cc = self.cc_profiles.get(cc_profile_id)
        if cc is not None and cc.active_qps:
            cc.active_qps -= 1

    # endpoint requests

    def ep_batch(self, op_type: EpOpType | int, requests: Sequence[EpRequest], rsp_timeout_ns: int, req_tc: int = 0,
                 now_ns: int = 0) -> EpBatch:
        """mrc_ctl_ep_batch_send_wait, checked: the batch the driver sends (req_ids reserved in `req_ids`)."""
        return EpBatch(op_type, requests, rsp_timeout_ns, req_tc, now_ns, ports=self.ports, pool=self.req_ids,
                       ev_probe_supported=self.has(OptAttr.EP_OP_EV_PROBE), local_gids=self.gids)


def _mode(value: Any, enum: type[IntFlag]) -> Any:
    return parse_mode(value, enum, "mode")
