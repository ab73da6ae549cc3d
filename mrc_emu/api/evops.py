"""EV operations on an EV profile (mrc_ctl.h c:508-588, 725-792): REPLACE_EV, MODIFY_EV_STATE,
QUERY_EV_STATE, QUERY_EV_ARRAY, in batches.

Why it exists: EV state lives in the EV profile, so every QP using the profile sees what the
controller (DENIED, allowed again) and the device (ASSUMED_BAD, GOOD again) decided. A call
carries one op for entries[0..n); it stops at the first failing entry, whose error names the
entry (`entries[2].ev: ... not found`) and says how many entries before it were applied
(`EvOpError.completed`): the header keeps those applied and has no per-entry status, so a
caller re-reads with QUERY_EV_ARRAY. The failing entry itself changes nothing.

    op               ev   ev_new  state  flags        allowed in
    REPLACE_EV       R    R       R      ALL_COPIES   OFFLINE (ONLINE with EV_PROFILE_MODIFY_ONLINE)
    MODIFY_EV_STATE  R    -       R      ALL_COPIES   OFFLINE, ONLINE
    QUERY_EV_STATE   R    -       out    -            OFFLINE, ONLINE
    QUERY_EV_ARRAY   out  -       out    -            OFFLINE, ONLINE

`device_set_state` is the device's own path (the transport marking an EV ASSUMED_BAD or GOOD):
it never leaves GOOD EVs fewer than ev_min_active and never touches a DENIED EV. Every state
written bumps the profile's `state_version` and records who wrote it (`state_setters`: controller
or device), which is how the QPs bound to the profile (transport/multipath/evshare.py) learn of a change
without looking at every EV. It must never touch the system.
"""

from __future__ import annotations

import errno
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum, IntFlag

from .errors import MrcApiError
from .events import SETTABLE_STATES, EvEventQueue, EvState
from .expansion import generated_evs
from .formats import EV_MAX_BYTES, ProfileState
from .ports import PortAdmin
from .profiles import UNPOPULATED, EvProfile, EvProfileMode

MAX_PORT = 255  # struct mrc_ctl_ev_entry { ...; uint8_t port; } (1-based; 0 only in UNPOPULATED)


class EvOp(IntEnum):
    """enum mrc_ctl_ev_op."""

    REPLACE_EV = 0
    MODIFY_EV_STATE = 1
    QUERY_EV_STATE = 2
    QUERY_EV_ARRAY = 3


class EvOpFlag(IntFlag):
    ALL_COPIES = 1 << 0  # act on every occurrence of `ev`; without it, the first one (the implementation's choice)


@dataclass
class EvOpEntry:
    """struct mrc_ctl_ev_op_entry: `ev`/`port` the EV, `ev_new`/`port_new` its replacement; out fields filled in."""

    ev: bytes = UNPOPULATED
    port: int = 0
    ev_new: bytes = UNPOPULATED
    port_new: int = 0
    state: EvState | int | None = None
    flags: int = 0


class EvOpError(MrcApiError):
    """A batch stopped at entries[index]; `completed` entries before it were applied."""

    def __init__(self, message: str, errno_value: int, completed: int, needed: int | None = None):
        super().__init__(message, errno_value)
        self.completed = completed
        self.index = completed
        self.needed = needed  # QUERY_EV_ARRAY's E2BIG: the entry count it needs


def ev_slots(profile: EvProfile) -> list[tuple[bytes, int]]:
    """The profile's EVs as (32-byte value, port): EXP its array, GEN its generated compact values (port 0)."""
    if profile.mode == EvProfileMode.EXP:
        return list(zip(profile.explicit, profile.ev_ports or [0] * len(profile.explicit)))
    if profile.mode == EvProfileMode.GEN:
        return [(ev.compact, 0) for ev in generated_evs(profile)]
    return []


def ev_states(profile: EvProfile) -> list[int]:
    """The profile's per-EV states (GOOD once populated, UNKNOWN while UNPOPULATED), created on first use."""
    slots = ev_slots(profile)
    if len(profile.ev_states) != len(slots):
        empty = (UNPOPULATED, 0) if profile.mode == EvProfileMode.EXP else None  # GEN's compact 0x00 is an EV
        profile.ev_states = [EvState.UNKNOWN if slot == empty else EvState.GOOD for slot in slots]
        profile.states_reset()
    return profile.ev_states


def data_evs(profile: EvProfile, ports: PortAdmin | None = None) -> list[tuple[bytes, int]]:
    """The EVs that may carry data now: the GOOD ones (a DENIED or ASSUMED_BAD EV never does), on a port that
    is up (none on a disabled port, whatever their state)."""
    return [slot for slot, state in zip(ev_slots(profile), ev_states(profile))
            if EvState(state).carries_data and (ports is None or ports.carries_data(slot[1]))]


def ev_op(profile: EvProfile, op: EvOp, entries: Sequence[EvOpEntry], *, max_entries: int = 0,
          modify_online: bool = False, events: EvEventQueue | None = None) -> int:
    """Apply `op` to each entry in order (mrc_ctl_modify_ev_profile with EV_OP); the number of entries done,
    or EvOpError at the first failing one. QUERY_EV_ARRAY fills `entries` and returns the EV count."""
    op = _check_call(profile, op, entries, max_entries, modify_online)
    if op == EvOp.QUERY_EV_ARRAY:
        return _query_array(profile, entries)
    for index, entry in enumerate(entries):
        try:
            _apply(profile, op, entry, f"entries[{index}]", events)
        except MrcApiError as error:
            raise EvOpError(f"{error} ({index} of {len(entries)} entries applied)", error.errno, index) from None
    return len(entries)


def _check_call(profile: EvProfile, op: object, entries: Sequence[EvOpEntry], max_entries: int,
                modify_online: bool) -> EvOp:
    if op not in set(EvOp):
        raise EvOpError(f"op: {op!r} is not one of {', '.join(EvOp.__members__)}", errno.EINVAL, 0)
    op = EvOp(op)
    if profile.state == ProfileState.INIT:
        raise EvOpError(f"state: EV operations need an OFFLINE or ONLINE profile, profile {profile.profile_id} is INIT",
                        errno.EINVAL, 0)
    if profile.mode == EvProfileMode.AUTO and op != EvOp.QUERY_EV_ARRAY:
        raise EvOpError(f"mode: an AUTO profile has no EVs to {op.name}", errno.EINVAL, 0)
    if op == EvOp.REPLACE_EV:
        if profile.mode != EvProfileMode.EXP:
            raise EvOpError("mode: REPLACE_EV needs an EXP profile (a GEN profile's EVs come from its fields)",
                            errno.EINVAL, 0)
        if profile.state == ProfileState.ONLINE and not modify_online:
            raise EvOpError("op: REPLACE_EV on an ONLINE profile needs EV_PROFILE_MODIFY_ONLINE", errno.EPERM, 0)
    if max_entries and len(entries) > max_entries:
        raise EvOpError(f"entries: {len(entries)} entries exceed ev_op_max_entries {max_entries}", errno.E2BIG, 0)
    return op


def _query_array(profile: EvProfile, entries: Sequence[EvOpEntry]) -> int:
    slots, states = ev_slots(profile), ev_states(profile)
    if len(entries) < len(slots):
        raise EvOpError(f"entries: {len(entries)} entries, the profile has {len(slots)} EVs", errno.E2BIG, 0,
                        needed=len(slots))
    for entry, (value, port), state in zip(entries, slots, states):
        entry.ev, entry.port, entry.state = value, port, EvState(state)
    return len(slots)


def _check_ev(value: object, port: object, where: str, name: str = "ev") -> bytes:
    if not isinstance(value, (bytes, bytearray)) or len(value) > EV_MAX_BYTES:
        raise MrcApiError(f"{where}.{name}: expected at most {EV_MAX_BYTES} bytes, got {value!r}")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= MAX_PORT:
        raise MrcApiError(f"{where}.port: {port!r} is not a port (1..{MAX_PORT})")
    return bytes(value).ljust(EV_MAX_BYTES, b"\0")


def _check_state(state: object, where: str) -> EvState:
    if state not in SETTABLE_STATES:
        raise MrcApiError(f"{where}.state: {state!r} is not GOOD, ASSUMED_BAD or DENIED")
    return EvState(state)


def _matches(profile: EvProfile, value: bytes, port: int, flags: int, where: str) -> list[int]:
    hits = [index for index, slot in enumerate(ev_slots(profile)) if slot == (value, port)]
    if not hits:
        raise MrcApiError(f"{where}.ev: 0x{value.rstrip(bytes(1)).hex() or '00'} on port {port} not found", errno.ENOENT)
    return hits if flags & EvOpFlag.ALL_COPIES else hits[:1]


def _apply(profile: EvProfile, op: EvOp, entry: EvOpEntry, where: str, events: EvEventQueue | None) -> None:
    if isinstance(entry.flags, bool) or not isinstance(entry.flags, int) or entry.flags & ~int(EvOpFlag.ALL_COPIES):
        raise MrcApiError(f"{where}.flags: {entry.flags!r} has bits other than ALL_COPIES (0x01)")
    value = _check_ev(entry.ev, entry.port, where)
    if op == EvOp.QUERY_EV_STATE:
        entry.state = EvState(ev_states(profile)[_matches(profile, value, entry.port, 0, where)[0]])
        return
    state = _check_state(entry.state, where)
    if op == EvOp.REPLACE_EV:
        new_value = _check_ev(entry.ev_new, entry.port_new, where, "ev_new")
        if new_value == UNPOPULATED and entry.port_new == 0:
            raise MrcApiError(f"{where}.ev_new: UNPOPULATED (value 0, port 0) is not an EV to replace with")
        if entry.port_new == 0:
            raise MrcApiError(f"{where}.port_new: 0 is UNPOPULATED's port; an EV is on a port 1..{MAX_PORT}")
        hits = _matches(profile, value, entry.port, entry.flags, where)
        states = ev_states(profile)
        if len(profile.ev_ports) != len(profile.explicit):
            profile.ev_ports = [0] * len(profile.explicit)
        for index in hits:
            profile.explicit[index], profile.ev_ports[index], states[index] = new_value, entry.port_new, state
            profile.state_setters[index] = "controller"
        profile.state_version += 1
        profile.values_version += 1
        return
    hits = _matches(profile, value, entry.port, entry.flags, where)
    if profile.mode == EvProfileMode.EXP and (value, entry.port) == (UNPOPULATED, 0):
        raise MrcApiError(f"{where}.ev: UNPOPULATED slots have no state to modify", errno.ENOENT)
    _set_states(profile, hits, state, where, events, "controller")


def _set_states(profile: EvProfile, hits: list[int], state: EvState, where: str, events: EvEventQueue | None,
                setter: str) -> None:
    """Set the slots `hits` to `state`; ASSUMED_BAD only if it takes no GOOD EV below ev_min_active (a DENIED one
    allowed back as ASSUMED_BAD takes none away). Each change bumps the profile's state_version."""
    states = ev_states(profile)
    if state == EvState.ASSUMED_BAD and any(states[index] == EvState.GOOD for index in hits):
        good_after = sum(1 for index, old in enumerate(states) if old == EvState.GOOD and index not in hits)
        if good_after < (profile.ev_min_active or 0):
            raise MrcApiError(f"{where}.state: ASSUMED_BAD would leave {good_after} GOOD EVs, "
                              f"fewer than ev_min_active {profile.ev_min_active}")
    slots = ev_slots(profile)
    for index in hits:
        if states[index] != state:
            states[index] = state
            profile.state_setters[index] = setter
            profile.state_version += 1
            if events is not None:
                events.post(profile.profile_id, profile.ev_event_mask or 0, *slots[index], state)


def device_set_state(profile: EvProfile, ev: bytes, port: int, state: EvState,
                     events: EvEventQueue | None = None) -> bool:
    """The device's own verdict on one EV (all its copies): GOOD or ASSUMED_BAD. False, changing nothing, if the
    EV is DENIED (only the controller lifts that) or ASSUMED_BAD would break ev_min_active."""
    if state not in (EvState.GOOD, EvState.ASSUMED_BAD):
        raise MrcApiError(f"state: the device sets only GOOD or ASSUMED_BAD, not {state!r}")
    value = _check_ev(ev, port, "device")
    hits = _matches(profile, value, port, EvOpFlag.ALL_COPIES, "device")
    states = ev_states(profile)
    if any(states[index] == EvState.DENIED for index in hits):
        return False
    try:
        _set_states(profile, hits, state, "device", events, "device")
    except MrcApiError:
        return False
    return True
