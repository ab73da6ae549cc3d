"""EV profiles (mrc_ctl.h, `mrc_ctl_ev_profile_*`): AUTO, EXP or GEN EVs over an EV format profile.

Why it exists: an EV profile says which EVs a QP may spray over, and how a compact EV is
expanded into the bytes of a packet: one field (width, init_val, min_val, max_val, mask) per
format field. Its restrictions are exactly the header's (c:631-636): no more fields than the
format, no wider in total, init_val within the width, mask within the width, max_val within the
mask's bits; ev_min_active <= ev_count; ev_event_mask only GOOD and ASSUMED_BAD. Its lifecycle is
INIT -> OFFLINE (MODE, FMT_ID, COUNT, MODIFY_FIELDS) -> ONLINE (MIN_ACTIVE, EVENT_MASK, for EXP
every EV replaced) -> OFFLINE -> INIT. The EV operations (REPLACE_EV, ...) are evops'. The EV
states live here (`ev_states`, with `state_version` bumped on every write), so that the QPs bound
to the profile share them. It must never touch the system.
"""

from __future__ import annotations

import errno
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import fields as dataclass_fields
from enum import IntFlag
from typing import Any

from .errors import MrcApiError, RestrictionError
from .formats import EV_MAX_BYTES, EvFormatProfile, ProfileState, parse_mode

U32 = (1 << 32) - 1
UNPOPULATED = bytes(EV_MAX_BYTES)  # MRC_CTL_EV_UNPOPULATED: an explicit array's slot never replaced


class EvProfileMode(IntFlag):
    """enum mrc_ctl_ev_mode."""

    AUTO = 1 << 0  # the controller supplies no EVs (vendor default, e.g. ECMP)
    EXP = 1 << 1   # explicit EVs, given one by one
    GEN = 1 << 2   # generated EVs: the device enumerates the fields' generated bits


class EvEventMask(IntFlag):
    """The EV states (enum mrc_ctl_ev_state) an EV profile's event mask may select."""

    GOOD = 1 << 0
    ASSUMED_BAD = 1 << 1


@dataclass(frozen=True)
class EvField:
    """struct mrc_ctl_ev_field (each u32). A fixed field: mask = min_val = max_val = 0, init_val = the value."""

    width: int
    init_val: int = 0
    min_val: int = 0
    max_val: int = 0
    mask: int = 0

    @property
    def generated_bits(self) -> int:
        """How many compact-EV bits this field consumes: popcount(mask)."""
        return bin(self.mask).count("1")

    @property
    def is_fixed(self) -> bool:
        return self.mask == 0

    def check(self, where: str) -> None:
        """The header's per-field restrictions, as one-line errors naming `where`.attribute."""
        for item in dataclass_fields(self):
            value = getattr(self, item.name)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= U32:
                raise RestrictionError(f"{where}.{item.name}: {value!r} is not a u32")
        if self.width == 0:
            raise RestrictionError(f"{where}.width: 0 (a field is at least one bit wide)")
        if self.width < 32 and self.init_val >> self.width:
            raise RestrictionError(f"{where}.init_val: {hex_value(self.init_val)} is wider than width {self.width}")
        if self.width < 32 and self.mask >> self.width:
            raise RestrictionError(f"{where}.mask: {hex_value(self.mask)} has bits outside width {self.width}")
        if self.max_val >> self.generated_bits:
            raise RestrictionError(f"{where}.max_val: {self.max_val} does not fit the mask's {self.generated_bits} bit(s) "
                                   f"(at most {(1 << self.generated_bits) - 1})")

    @classmethod
    def from_dict(cls, data: Any, where: str) -> EvField:
        if not isinstance(data, dict):
            raise RestrictionError(f"{where}: expected a mapping of width, init_val, min_val, max_val, mask, got {data!r}")
        unknown = sorted(set(data) - {item.name for item in dataclass_fields(cls)})
        if unknown:
            raise RestrictionError(f"{where}.{unknown[0]}: unknown attribute (known: width, init_val, min_val, max_val, mask)")
        if "width" not in data:
            raise RestrictionError(f"{where}.width: missing")
        return cls(**data)


def hex_value(value: int) -> str:
    """0x0A, 0x1FF: at least two hex digits, upper case, as the header's examples write masks."""
    return f"0x{value:02X}"


def check_fields(fields: Sequence[EvField], fmt: EvFormatProfile) -> tuple[EvField, ...]:
    """Every restriction of c:631-636 against the format's widths; the fields as a tuple."""
    if isinstance(fields, (str, bytes)) or not isinstance(fields, Sequence) or not fields:
        raise RestrictionError(f"fields: expected a non-empty list of fields, got {fields!r}")
    for index, field in enumerate(fields):
        if not isinstance(field, EvField):
            raise RestrictionError(f"fields[{index}]: expected an EvField, got {field!r}")
        field.check(f"fields[{index}]")
    if len(fields) > len(fmt.fields):
        raise RestrictionError(f"fields: {len(fields)} fields exceed the format's {len(fmt.fields)}", errno.E2BIG)
    total = sum(field.width for field in fields)
    if total > fmt.total_width:
        raise RestrictionError(f"fields: total width {total} exceeds the format's {fmt.total_width} bits", errno.E2BIG)
    return tuple(fields)


ONLINE_ATTRIBUTES = {"ev_event_mask", "fields"}  # what an ONLINE profile may change with EV_PROFILE_MODIFY_ONLINE


class EvProfile:
    """One EV profile: `modify()` is mrc_ctl_modify_ev_profile without its EV operations.

    `fmt` is the EvFormatProfile object itself where the header takes its id (FMT_ID)."""

    def __init__(self, profile_id: int = 0):
        self.profile_id = profile_id
        self.state = ProfileState.INIT
        self.mode: EvProfileMode | None = None
        self.fmt: EvFormatProfile | None = None
        self.ev_count: int | None = None
        self.ev_min_active: int | None = None
        self.ev_event_mask: EvEventMask | None = None
        self.fields: tuple[EvField, ...] = ()
        self.explicit: list[bytes] = []  # EXP: the EV array, UNPOPULATED after INIT -> OFFLINE
        self.ev_ports: list[int] = []  # EXP: each slot's 1-based port (0 = UNPOPULATED), beside `explicit`
        self.ev_states: list[int] = []  # each EV's state (evops.EvState), filled by the EV operations
        # bumped on every write to ev_states (evops, a reset here): the QPs bound to the profile compare it
        # where they read their spray schedule, so a change reaches them at no cost while nothing changes
        self.state_version = 0
        self.state_setters: dict[int, str] = {}  # slot -> who set its state last: "controller" or "device"
        # bumped whenever an EV's value or port may have changed (REPLACE_EV, new fields, mode or count): the
        # requesters bound to the profile rebuild the frames of the slots whose value moved (multipath/evvalues.py)
        self.values_version = 0

    def modify(self, *, state: ProfileState | None = None, cur_state: ProfileState | None = None,
               mode: EvProfileMode | str | None = None, fmt: EvFormatProfile | None = None, ev_count: int | None = None,
               ev_min_active: int | None = None, ev_event_mask: int | None = None,
               fields: Sequence[EvField] | None = None, modify_online: bool = False) -> None:
        """Apply the attributes given (None = not in attr_mask; `fields` = EV_FIELDS_OP MODIFY_FIELDS), or raise
        before changing anything. `modify_online` (EV_PROFILE_MODIFY_ONLINE): an ONLINE profile may change
        its EVENT_MASK and fields (MODIFY_FIELDS; a GEN profile's new EVs start GOOD)."""
        if cur_state is not None and ProfileState(cur_state) != self.state:
            raise MrcApiError(f"cur_state: the profile is {self.state.name}, not {ProfileState(cur_state).name}")
        given = {name for name, value in (("mode", mode), ("fmt", fmt), ("ev_count", ev_count),
                                          ("ev_min_active", ev_min_active), ("ev_event_mask", ev_event_mask),
                                          ("fields", fields)) if value is not None}
        target = self.state if state is None else ProfileState(state)
        new = {"mode": self.mode if mode is None else parse_mode(mode, EvProfileMode, "mode"),
               "fmt": self.fmt if fmt is None else fmt,
               "ev_count": self.ev_count if ev_count is None else check_count(ev_count, "ev_count"),
               "ev_min_active": self.ev_min_active if ev_min_active is None else check_count(ev_min_active, "ev_min_active"),
               "ev_event_mask": self.ev_event_mask if ev_event_mask is None else check_event_mask(ev_event_mask)}
        self._check_transition(target, given, new, modify_online)
        if new["mode"] != EvProfileMode.AUTO and new["fmt"] is not None and not new["fmt"].fields:
            raise MrcApiError("fmt: the format profile has no fields yet (MODIFY_FIELDS it first)")
        new_fields = self.fields if fields is None else ()
        if new["mode"] == EvProfileMode.AUTO:
            new_fields = ()
        elif fields is not None or (fmt is not None and self.fields):
            if new["fmt"] is None:
                raise MrcApiError("fmt: MODIFY_FIELDS needs FMT_ID (the fields are checked against the format)")
            new_fields = check_fields(self.fields if fields is None else fields, new["fmt"])
        if new["ev_min_active"] is not None and new["ev_count"] is not None and new["ev_min_active"] > new["ev_count"]:
            raise RestrictionError(f"ev_min_active: {new['ev_min_active']} exceeds ev_count {new['ev_count']}")
        if target == ProfileState.ONLINE:
            self._check_online(new)
        if self.fmt is not None and self.fmt is not new["fmt"] and self in self.fmt.dependents:
            self.fmt.dependents.remove(self)
        if new["fmt"] is not None and self not in new["fmt"].dependents:
            new["fmt"].dependents.append(self)
        first_offline = self.state == ProfileState.INIT and target == ProfileState.OFFLINE
        self.state, self.fields = target, new_fields
        for name, value in new.items():
            setattr(self, name, value)
        if first_offline or (new["mode"] == EvProfileMode.EXP and len(self.explicit) != (self.ev_count or 0)):
            self.explicit = [UNPOPULATED] * (self.ev_count or 0) if new["mode"] == EvProfileMode.EXP else []
            self.ev_ports, self.ev_states = [0] * len(self.explicit), []
            self.states_reset()
        elif new["mode"] != EvProfileMode.EXP and given & {"mode", "fmt", "ev_count", "fields"}:
            self.ev_states = []  # generated EVs from new fields are new EVs: their states start afresh
            self.states_reset()
        if given & {"mode", "fmt", "ev_count", "fields"}:
            self.values_version += 1
        if target == ProfileState.INIT:
            self._reset()

    def _check_transition(self, target: ProfileState, given: set[str], new: dict, modify_online: bool) -> None:
        if self.state == ProfileState.INIT:
            if target != ProfileState.OFFLINE:
                raise MrcApiError("state: an INIT EV profile may only move to OFFLINE")
            needed = ["mode"] if new["mode"] == EvProfileMode.AUTO else ["mode", "fmt", "ev_count", "fields"]
            missing = [name for name in needed if name not in given]
            if missing:
                raise MrcApiError(f"{missing[0]}: INIT -> OFFLINE needs MODE, FMT_ID, COUNT and MODIFY_FIELDS")
        elif self.state == ProfileState.ONLINE:
            online = modify_online and target == ProfileState.ONLINE and given <= ONLINE_ATTRIBUTES
            if not online and (target != ProfileState.OFFLINE or given):
                raise MrcApiError("state: an ONLINE EV profile may only move to OFFLINE "
                                  "(or change EVENT_MASK and MODIFY_FIELDS, with EV_PROFILE_MODIFY_ONLINE)")
        elif target == ProfileState.INIT and given:
            raise MrcApiError(f"{sorted(given)[0]}: OFFLINE -> INIT takes no other attribute")

    def _check_online(self, new: dict) -> None:
        if new["ev_min_active"] is None:
            raise MrcApiError("ev_min_active: OFFLINE -> ONLINE needs MIN_ACTIVE")
        if new["ev_event_mask"] is None:
            raise MrcApiError("ev_event_mask: OFFLINE -> ONLINE needs EVENT_MASK")
        if new["mode"] == EvProfileMode.EXP:
            empty = sum(ev == UNPOPULATED and port == 0 for ev, port in zip(self.explicit, self.ev_ports))
            if empty or len(self.explicit) != new["ev_count"]:
                raise MrcApiError(f"evs: OFFLINE -> ONLINE needs every EV replaced ({empty} of {new['ev_count']} "
                                  "UNPOPULATED)")
        if new["fmt"] is not None and new["fmt"].state != ProfileState.ONLINE:
            raise MrcApiError(f"fmt: the format profile is {new['fmt'].state.name}, not ONLINE")

    def _reset(self) -> None:
        if self.fmt is not None and self in self.fmt.dependents:
            self.fmt.dependents.remove(self)
        self.mode = self.fmt = self.ev_count = self.ev_min_active = self.ev_event_mask = None
        self.fields, self.explicit, self.ev_ports, self.ev_states = (), [], [], []
        self.states_reset()

    def states_reset(self) -> None:
        """ev_states was replaced as a whole: a new version, and nobody has set the new states yet."""
        self.state_version += 1
        self.state_setters.clear()

    @property
    def generated_bits(self) -> int:
        """The width of a compact EV: the fields' generated bits, in field order."""
        return sum(field.generated_bits for field in self.fields)

    def __repr__(self) -> str:
        mode = self.mode.name if self.mode else None
        return (f"EvProfile(id={self.profile_id}, {self.state.name}, mode={mode}, ev_count={self.ev_count}, "
                f"fields={len(self.fields)})")


def check_count(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= U32:
        raise RestrictionError(f"{where}: {value!r} is not a u32")
    return value


def check_event_mask(value: Any) -> EvEventMask:
    allowed = int(EvEventMask.GOOD | EvEventMask.ASSUMED_BAD)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise RestrictionError(f"ev_event_mask: {value!r} is not a mask")
    if value & ~allowed:
        raise RestrictionError(f"ev_event_mask: {hex_value(value)} has bits other than GOOD (0x01) and ASSUMED_BAD (0x02)")
    return EvEventMask(value)
