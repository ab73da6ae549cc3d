"""An MRC QP as mrc.h models it: RST -> INIT -> RTR -> RTS (and ERR), the attributes each transition
takes, and the work-request rules (WRITE and WRITE_WITH_IMM only, receives posted in advance).

Why it exists: a user of the OCP API sets a QP up with `mrc_modify_qp` and an attribute mask, the
way mrc.h (h:442-600) lays it out; the emulator's transport takes a plain config. This module
checks every call the header would refuse (an attribute at the wrong transition, out of range,
one of the IBV attributes the header rejects) as a one-line MrcApiError naming the attribute, and
hands the transport what the QP was given (`transport_config()`, a dict: this package may not
import the transport).

    -> INIT  EV_PROFILE_ID, CC_PROFILE_ID (required; profiles ONLINE in the QP's controller), HINT
    -> RTR   MAX_WIMM_DEST, MPR_DEST (required), CAP (dynamic MPR, responder caps)
    -> RTS   MAX_WIMM, MPR, RETRY_CNT, TIMEOUT (required)
    any  -> RST (forgets everything, unbinds the profiles), any -> ERR (flushes the work requests)

WRITE_WITH_IMM consumes a receive posted in advance at the responder; MRC has no RNR, so a
WRITE_WITH_IMM arriving with none posted moves the responder's QP to ERR (`consume_recv`). It must
never touch the system.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass, field
from enum import IntEnum, IntFlag
from typing import Any, NamedTuple, Protocol

from .errors import MrcApiError

PSNS_PER_MPR_UNIT = 128  # MPR and MPR_DEST are in units of 128 PSNs (h:500)
MAX_TIMEOUT = 24  # T = 1.024 us * 2^timeout, at most 24 (17.18 s) (h:515)
MAX_LINEAR_RETRIES, MAX_EXP_RETRIES = 7, 25  # RETRY_CNT: exp_cnt 25 = infinite (h:528-531)
VENDOR_CFG_SIZE = 128  # MRC_MAX_VENDOR_CFG_SIZE
U16, U64 = (1 << 16) - 1, (1 << 64) - 1


class QpState(IntEnum):
    """enum ibv_qp_state, the states an MRC QP uses."""

    RST = 0
    INIT = 1
    RTR = 2
    RTS = 3
    ERR = 6


class QpAttr(IntFlag):
    """enum mrc_qp_attr_mask."""

    MAX_WIMM = 1 << 0
    MAX_WIMM_DEST = 1 << 1
    MPR = 1 << 2
    MPR_DEST = 1 << 3
    TIMEOUT = 1 << 4
    EV_PROFILE_ID = 1 << 5
    CC_PROFILE_ID = 1 << 6
    HINT = 1 << 7
    RETRY_CNT = 1 << 8
    CAP = 1 << 9
    VENDOR_CFG = 1 << 31


class QpCap(IntFlag):
    """enum mrc_qp_cap (the header's text calls them MRC_QP_DYNAMIC_MPR, ...: the enum is MRC_QP_CAP_*)."""

    TRIM_NACK_DEST_UNSUPPORTED = 1 << 0  # the peer cannot take TRIM NACKs: this responder sends none
    DYNAMIC_MPR = 1 << 1  # dynamic MPR on this QP (effective only if both peers enable it)
    SVC_TIME_DEST_UNSUPPORTED = 1 << 2  # the peer does not read service time: this responder reports none


class DeviceCap(IntFlag):
    """enum mrc_device_cap."""

    TRIM_NACK = 1 << 0
    DYNAMIC_MPR = 1 << 1
    SVC_TIME = 1 << 2


@dataclass(frozen=True)
class DeviceAttr:
    """struct mrc_device_attr (mrc_query_device) of the emulated device."""

    mrc_protocol_version: int = 1 << 0  # MRC_PROTOCOL_VERSION_1
    max_wimm: int = 128  # wimm_attr: in-flight WRITE_IMM as requestor ...
    max_wimm_dest: int = 128  # ... and as responder
    max_mpr: int = 64  # mpr_attr, in units of 128 PSNs (the transport's SACK window holds up to 64)
    mpr_resolution: int = 1
    max_qp_hint: int = 64
    cap: DeviceCap = DeviceCap.TRIM_NACK | DeviceCap.DYNAMIC_MPR | DeviceCap.SVC_TIME


class RetryCnt(NamedTuple):
    """mrc_qp_attr.retry: linear (fixed-interval) retries, then exponential-backoff ones (25 = infinite)."""

    linear_cnt: int
    exp_cnt: int


@dataclass(frozen=True)
class QpHint:
    """struct mrc_qp_hint_attr (the traffic pattern a set of QPs expects); vendor_cfg not mirrored."""

    num_qps_per_peer: int = 0
    num_send_peers: int = 0
    num_remote_recv_peers: int = 0


class WrOpcode(IntEnum):
    """enum ibv_wr_opcode: MRC posts only RDMA_WRITE and RDMA_WRITE_WITH_IMM."""

    RDMA_WRITE = 0
    RDMA_WRITE_WITH_IMM = 1
    SEND = 2
    SEND_WITH_IMM = 3
    RDMA_READ = 4
    ATOMIC_CMP_AND_SWP = 5
    ATOMIC_FETCH_AND_ADD = 6


MRC_OPCODES = (WrOpcode.RDMA_WRITE, WrOpcode.RDMA_WRITE_WITH_IMM)

# The IBV attributes mrc_modify_qp refuses (h:572-582), with what to use instead; the others it takes.
IBV_REJECTED = {"PORT": "EVs carry their own ports", "TIMEOUT": "use timeout= (MRC_QP_TIMEOUT)",
                "RETRY_CNT": "use retry= (MRC_QP_RETRY_CNT)", "RNR_RETRY": "MRC has no RNR",
                "MIN_RNR_TIMER": "MRC has no RNR", "MAX_QP_RD_ATOMIC": "MRC has no READ or atomics",
                "MAX_DEST_RD_ATOMIC": "MRC has no READ or atomics", "ALT_PATH": "MRC sprays over EVs",
                "PATH_MIG_STATE": "MRC sprays over EVs"}
IBV_ACCEPTED = {"STATE", "CUR_STATE", "EN_SQD_ASYNC_NOTIFY", "ACCESS_FLAGS", "PKEY_INDEX", "QKEY", "AV",
                "PATH_MTU", "RQ_PSN", "SQ_PSN", "CAP", "DEST_QPN"}

# next state -> (attributes it requires, attributes it may take besides); VENDOR_CFG goes with any
TRANSITIONS = {QpState.INIT: (("ev_profile_id", "cc_profile_id"), ("hint",)),
               QpState.RTR: (("max_wimm_dest", "mpr_dest"), ("cap",)),
               QpState.RTS: (("max_wimm", "mpr", "retry", "timeout"), ())}
NEXT = {QpState.RST: QpState.INIT, QpState.INIT: QpState.RTR, QpState.RTR: QpState.RTS}
ATTR_NAMES = {"max_wimm": "MAX_WIMM", "max_wimm_dest": "MAX_WIMM_DEST", "mpr": "MPR", "mpr_dest": "MPR_DEST",
              "timeout": "TIMEOUT", "ev_profile_id": "EV_PROFILE_ID", "cc_profile_id": "CC_PROFILE_ID",
              "hint": "HINT", "retry": "RETRY_CNT", "cap": "CAP", "vendor_cfg": "VENDOR_CFG"}
# transport_config() keys that are transport.config.QpConfig fields of the same meaning
QPCONFIG_KEYS = ("ack_timeout_exp", "retry_linear", "retry_exp", "mpr")


class NoReceivePosted(MrcApiError):
    """A WRITE_WITH_IMM arrived with no receive posted: MRC has no RNR, the QP went to ERR."""


class ProfileBinder(Protocol):
    """What a QP needs from its controller: bind the profiles of ->INIT (checked ONLINE), release them."""

    def bind_profiles(self, ev_profile_id: int, cc_profile_id: int) -> None: ...

    def unbind_profiles(self, ev_profile_id: int, cc_profile_id: int) -> None: ...


def _uint(value: Any, top: int, name: str, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= top:
        raise MrcApiError(f"{name}: {value!r} is not {low}..{top}")
    return value


@dataclass
class Qp:
    """One MRC QP (mrc_create_qp: it starts in RST). `binder` is its controller (None: profile ids unchecked)."""

    device: DeviceAttr = field(default_factory=DeviceAttr)
    binder: ProfileBinder | None = None
    qpn: int = 0
    max_send_wr: int = 128  # ibv_qp_cap of mrc_qp_init_attr
    max_recv_wr: int = 128
    state: QpState = QpState.RST
    attrs: dict[str, Any] = field(default_factory=dict)  # the MRC attributes set, by keyword name
    recv_posted: int = 0  # receives posted and not yet consumed
    writes_posted: int = 0  # send WRs posted (both opcodes), for reports
    imm_in_flight: int = 0  # WRITE_WITH_IMM posted and not completed (<= max_wimm)
    flushed: int = 0  # work requests flushed by the last move to ERR or RST
    error: str = ""  # why the QP went to ERR, if it did

    def modify(self, *, state: QpState | int | None = None, cur_state: QpState | int | None = None,
               ibv_attrs: set[str] | frozenset[str] | tuple[str, ...] = (), max_wimm: int | None = None,
               max_wimm_dest: int | None = None, mpr: int | None = None, mpr_dest: int | None = None,
               timeout: int | None = None, ev_profile_id: int | None = None, cc_profile_id: int | None = None,
               hint: QpHint | None = None, retry: RetryCnt | tuple[int, int] | None = None, cap: int | None = None,
               vendor_cfg: bytes | None = None) -> None:
        """mrc_modify_qp: move to `state` with the attributes given (None = not in the mask), or raise changing
        nothing. `ibv_attrs` names the IBV_QP_* mask bits the call would also set (IBV_QP_STATE is `state`)."""
        given = {name: value for name, value in (
            ("max_wimm", max_wimm), ("max_wimm_dest", max_wimm_dest), ("mpr", mpr), ("mpr_dest", mpr_dest),
            ("timeout", timeout), ("ev_profile_id", ev_profile_id), ("cc_profile_id", cc_profile_id),
            ("hint", hint), ("retry", retry), ("cap", cap), ("vendor_cfg", vendor_cfg)) if value is not None}
        self._check_ibv(ibv_attrs)
        if cur_state is not None and _state(cur_state, "cur_state") != self.state:
            raise MrcApiError(f"cur_state: the QP is {self.state.name}, not {QpState(cur_state).name}")
        if state is None:
            raise MrcApiError("state: MRC attributes are set on a transition (IBV_QP_STATE)")
        target = _state(state, "state")
        if target in (QpState.RST, QpState.ERR):
            extra = sorted(set(given) - {"vendor_cfg"})
            if extra:
                raise MrcApiError(f"{extra[0]}: {ATTR_NAMES[extra[0]]} is not an attribute of -> {target.name}")
            self._drop(target, "moved to ERR by modify" if target == QpState.ERR else "")
            return
        if NEXT.get(self.state) != target:
            raise MrcApiError(f"state: {self.state.name} -> {target.name} is not a QP transition "
                              f"(RST -> INIT -> RTR -> RTS, any -> RST or ERR)")
        required, optional = TRANSITIONS[target]
        for name in given:
            if name not in required + optional + ("vendor_cfg",):
                raise MrcApiError(f"{name}: {ATTR_NAMES[name]} is not an attribute of {self.state.name} -> {target.name} "
                                  f"(it takes {', '.join(ATTR_NAMES[n] for n in required + optional)})")
        missing = [name for name in required if name not in given]
        if missing:
            raise MrcApiError(f"{missing[0]}: {self.state.name} -> {target.name} needs {ATTR_NAMES[missing[0]]}")
        checked = {name: self._check(name, value) for name, value in given.items()}
        if target == QpState.INIT and self.binder is not None:
            self.binder.bind_profiles(checked["ev_profile_id"], checked["cc_profile_id"])
        self.attrs.update(checked)
        self.state = target

    def _check_ibv(self, ibv_attrs: Any) -> None:
        if isinstance(ibv_attrs, str):
            ibv_attrs = (ibv_attrs,)
        for raw in ibv_attrs:
            name = str(raw).upper().removeprefix("IBV_QP_")
            if name in IBV_REJECTED:
                raise MrcApiError(f"ibv_attrs: IBV_QP_{name} is not supported by mrc_modify_qp ({IBV_REJECTED[name]})")
            if name not in IBV_ACCEPTED:
                raise MrcApiError(f"ibv_attrs: {raw!r} is not an IBV_QP_* attribute")

    def _check(self, name: str, value: Any) -> Any:
        dev = self.device
        if name in ("ev_profile_id", "cc_profile_id"):
            return _uint(value, U64, name)
        if name in ("max_wimm", "max_wimm_dest"):
            top = dev.max_wimm if name == "max_wimm" else dev.max_wimm_dest
            _uint(value, U16, name)
            if value > top:
                raise MrcApiError(f"{name}: {value} exceeds the device's {name} {top}")
            return value
        if name in ("mpr", "mpr_dest"):
            _uint(value, 255, name, 1)
            if value > dev.max_mpr:
                raise MrcApiError(f"{name}: {value} (x128 PSNs) exceeds the device's max_mpr {dev.max_mpr}")
            if value % max(dev.mpr_resolution, 1):
                raise MrcApiError(f"{name}: {value} is not a multiple of the device's mpr_resolution {dev.mpr_resolution}")
            return value
        if name == "timeout":
            return _uint(value, MAX_TIMEOUT, name)
        if name == "retry":
            if not isinstance(value, tuple) or len(value) != 2:
                raise MrcApiError(f"retry: {value!r} is not (linear_cnt, exp_cnt)")
            return RetryCnt(_uint(value[0], MAX_LINEAR_RETRIES, "retry.linear_cnt"),
                            _uint(value[1], MAX_EXP_RETRIES, "retry.exp_cnt"))
        if name == "cap":
            _uint(value, U16, name)
            if value & ~int(QpCap(7)):
                raise MrcApiError(f"cap: 0x{value:02X} has bits other than TRIM_NACK_DEST_UNSUPPORTED, DYNAMIC_MPR, "
                                  "SVC_TIME_DEST_UNSUPPORTED")
            if value & QpCap.DYNAMIC_MPR and not dev.cap & DeviceCap.DYNAMIC_MPR:
                raise MrcApiError("cap: DYNAMIC_MPR needs the device's MRC_DEVICE_CAP_DYNAMIC_MPR")
            return QpCap(value)
        if name == "hint":
            if not isinstance(value, QpHint):
                raise MrcApiError(f"hint: {value!r} is not a QpHint")
            return value
        if not isinstance(value, (bytes, bytearray)) or len(value) > VENDOR_CFG_SIZE:
            got = f"{len(value)} bytes" if isinstance(value, (bytes, bytearray)) else repr(value)
            raise MrcApiError(f"vendor_cfg: expected at most {VENDOR_CFG_SIZE} bytes, got {got}")
        return bytes(value)

    def _drop(self, target: QpState, why: str) -> None:
        self.flushed = self.recv_posted + self.imm_in_flight
        self.recv_posted = self.imm_in_flight = 0
        if target == QpState.RST:
            self.unbind()
            self.attrs, self.writes_posted, self.error = {}, 0, ""
        else:
            self.error = why
        self.state = target

    def unbind(self) -> None:
        """Release the profiles bound at -> INIT (on -> RST or destroy); a QP in ERR still holds them."""
        if self.binder is not None and "ev_profile_id" in self.attrs:
            self.binder.unbind_profiles(self.attrs["ev_profile_id"], self.attrs["cc_profile_id"])
        self.attrs.pop("ev_profile_id", None)
        self.attrs.pop("cc_profile_id", None)

    def query(self) -> tuple[QpState, dict[str, Any]]:
        """mrc_query_qp (any state): the state and the MRC attributes set so far."""
        return self.state, dict(self.attrs)

    # work requests: bookkeeping only (the transport moves the bytes)

    def post_recv(self, count: int = 1) -> None:
        """mrc_post_recv: `count` receives for WRITE_WITH_IMM, from RTR on; ENOMEM past max_recv_wr."""
        _uint(count, U16, "count", 1)
        if self.state not in (QpState.RTR, QpState.RTS):
            raise MrcApiError(f"state: receive WRs are posted from RTR on, the QP is {self.state.name}")
        if self.recv_posted + count > self.max_recv_wr:
            raise MrcApiError(f"count: {self.recv_posted} + {count} receives exceed max_recv_wr {self.max_recv_wr}",
                              errno.ENOMEM)
        self.recv_posted += count

    def post_send(self, opcode: WrOpcode | int) -> None:
        """mrc_post_send of one WR: RDMA_WRITE or RDMA_WRITE_WITH_IMM only, from RTS; a WRITE_WITH_IMM beyond
        max_wimm in flight is ENOMEM (the send queue is out of WRITE_IMM resources, as ibv_post_send says)."""
        if isinstance(opcode, bool) or opcode not in set(WrOpcode):
            raise MrcApiError(f"opcode: {opcode!r} is not an ibv_wr_opcode")
        opcode = WrOpcode(opcode)
        if opcode not in MRC_OPCODES:
            raise MrcApiError(f"opcode: IBV_WR_{opcode.name} is not supported (MRC posts only RDMA_WRITE and "
                              "RDMA_WRITE_WITH_IMM)")
        if self.state != QpState.RTS:
            raise MrcApiError(f"state: send WRs are posted in RTS, the QP is {self.state.name}")
        if opcode == WrOpcode.RDMA_WRITE_WITH_IMM:
            if self.imm_in_flight >= self.attrs["max_wimm"]:
                raise MrcApiError(f"opcode: {self.imm_in_flight} WRITE_WITH_IMM already in flight, max_wimm is "
                                  f"{self.attrs['max_wimm']}", errno.ENOMEM)
            self.imm_in_flight += 1
        self.writes_posted += 1

    def complete_imm(self, count: int = 1) -> None:
        """Completions of `count` WRITE_WITH_IMM: their max_wimm slots are free again."""
        _uint(count, U16, "count", 1)
        if count > self.imm_in_flight:
            raise MrcApiError(f"count: {count} completions, but {self.imm_in_flight} WRITE_WITH_IMM in flight")
        self.imm_in_flight -= count

    def consume_recv(self) -> None:
        """The responder side of a WRITE_WITH_IMM arriving: it takes one posted receive. With none posted the QP
        goes to ERR (MRC has no RNR NAK to ask for a retry) and NoReceivePosted is raised."""
        if self.state not in (QpState.RTR, QpState.RTS):
            raise MrcApiError(f"state: a QP receives from RTR on, the QP is {self.state.name}")
        if self.recv_posted == 0:
            message = "WRITE_WITH_IMM with no receive posted: no RNR in MRC; the QP goes to ERR"
            self._drop(QpState.ERR, message)
            raise NoReceivePosted(f"recv: {message}", errno.ENOBUFS)
        self.recv_posted -= 1

    # what the transport needs

    @property
    def timeout_ns(self) -> int:
        """The local ACK timeout, 1.024 us * 2^timeout, in ns (8: 262 144 ns; 24: 17.18 s)."""
        if "timeout" not in self.attrs:
            raise MrcApiError("timeout: not set (RTR -> RTS sets TIMEOUT)")
        return 1024 << self.attrs["timeout"]

    def transport_config(self) -> dict[str, Any]:
        """What the transport takes from an RTS QP, as a plain dict. The QPCONFIG_KEYS are
        transport.config.QpConfig fields of the same name and meaning; the rest go beside them."""
        if self.state != QpState.RTS:
            raise MrcApiError(f"state: the transport config is an RTS QP's, the QP is {self.state.name}")
        attrs, cap, device = self.attrs, QpCap(self.attrs.get("cap", 0)), self.device.cap
        return {"ack_timeout_exp": attrs["timeout"], "retry_linear": attrs["retry"].linear_cnt,
                "retry_exp": attrs["retry"].exp_cnt, "mpr": attrs["mpr"],
                "timeout_ns": self.timeout_ns, "retry_infinite": attrs["retry"].exp_cnt == MAX_EXP_RETRIES,
                "mpr_psns": attrs["mpr"] * PSNS_PER_MPR_UNIT, "mpr_dest": attrs["mpr_dest"],
                "mpr_dest_psns": attrs["mpr_dest"] * PSNS_PER_MPR_UNIT,
                "max_wimm": attrs["max_wimm"], "max_wimm_dest": attrs["max_wimm_dest"],
                "trim_nack": bool(device & DeviceCap.TRIM_NACK) and not cap & QpCap.TRIM_NACK_DEST_UNSUPPORTED,
                "svc_time": bool(device & DeviceCap.SVC_TIME) and not cap & QpCap.SVC_TIME_DEST_UNSUPPORTED,
                "dynamic_mpr": bool(cap & QpCap.DYNAMIC_MPR),
                "ev_profile_id": attrs["ev_profile_id"], "cc_profile_id": attrs["cc_profile_id"]}


def _state(value: Any, name: str) -> QpState:
    if isinstance(value, bool) or value not in set(QpState):
        raise MrcApiError(f"{name}: {value!r} is not a QP state (RST, INIT, RTR, RTS, ERR)")
    return QpState(value)
