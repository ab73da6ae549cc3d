"""EV format profiles (mrc_ctl.h, `mrc_ctl_ev_fmt_profile_*`): the mode and the field widths of an EV.

Why it exists: every non-AUTO EV profile names a format profile; the format's field widths are
the slots an EV profile's fields are expanded into, and their sum is the width of the EV a packet
carries. The lifecycle is the header's: INIT -> OFFLINE -> ONLINE -> OFFLINE -> INIT, with
MODE needed to reach OFFLINE and the fields (MODIFY_FIELDS) to reach ONLINE; OFFLINE may change
the state, the mode and the fields, ONLINE only go back to OFFLINE. It must never touch the system.
"""

from __future__ import annotations

import errno
from collections.abc import Sequence
from enum import IntEnum, IntFlag
from typing import Protocol

from .errors import MrcApiError, RestrictionError

EV_MAX_BYTES = 32  # MRC_CTL_EV_MAX_BYTES: an EV value is always 32 bytes, unused ones zero


class ProfileState(IntEnum):
    """enum mrc_ctl_profile_state: shared by EV format, EV and CC profiles."""

    INIT = 0
    OFFLINE = 1
    ONLINE = 2


class EvFormatMode(IntFlag):
    """enum mrc_ctl_ev_fmt_mode: where a packet carries the EV."""

    STEV = 1 << 0  # structured EV: IPv6 flow label + UDP source port, in bytes 0-3 of the value
    SRV6 = 1 << 1  # SRv6 uSID destination (bytes 0-15) and single-segment SRH address (bytes 16-31)
    UDP = 1 << 2   # UDP source port only

    @property
    def max_bits(self) -> int:
        """How many EV bits this mode can carry: the sum of a format's widths may not exceed it."""
        return MODE_MAX_BITS[self]


class FormatUser(Protocol):
    """What a format profile needs of an EV profile naming it (profiles.EvProfile): which one it is,
    and whether it is ONLINE (the format may not change under it then)."""

    profile_id: int
    state: ProfileState


# STEV: the header puts the value in the first 32 bits; UDP: a 16-bit source port; SRV6: all 32 bytes.
MODE_MAX_BITS = {EvFormatMode.STEV: 32, EvFormatMode.SRV6: 8 * EV_MAX_BYTES, EvFormatMode.UDP: 16}
FORMAT_FIELD_MAX_WIDTH = 255  # struct mrc_ctl_ev_fmt_field { uint8_t width; }


def parse_mode(value: object, enum: type[IntFlag], where: str) -> IntFlag:
    """A mode given by name ('STEV', case-insensitive) or by its flag value; one flag exactly."""
    if isinstance(value, enum):
        return value
    if isinstance(value, str) and value.upper() in enum.__members__:
        return enum[value.upper()]
    if isinstance(value, int) and not isinstance(value, bool) and value in {m.value for m in enum}:
        return enum(value)
    names = ", ".join(enum.__members__)
    raise RestrictionError(f"{where}: {value!r} is not one of {names}")


def check_format_fields(widths: Sequence[int], mode: EvFormatMode | None) -> tuple[int, ...]:
    """The widths as a tuple, or a RestrictionError naming the first bad one (E2BIG if too wide)."""
    if isinstance(widths, (str, bytes)) or not isinstance(widths, Sequence) or not widths:
        raise RestrictionError(f"fields: expected a non-empty list of widths, got {widths!r}")
    for index, width in enumerate(widths):
        if isinstance(width, bool) or not isinstance(width, int) or not 1 <= width <= FORMAT_FIELD_MAX_WIDTH:
            raise RestrictionError(f"fields[{index}]: width {width!r} is not 1..{FORMAT_FIELD_MAX_WIDTH}")
    if mode is not None and sum(widths) > mode.max_bits:
        raise RestrictionError(f"fields: total width {sum(widths)} exceeds the {mode.max_bits} bits {mode.name} carries",
                               errno.E2BIG)
    return tuple(widths)


class EvFormatProfile:
    """One EV format profile: `modify()` is mrc_ctl_modify_ev_fmt_profile, `query_fields()` its query."""

    def __init__(self, profile_id: int = 0):
        self.profile_id = profile_id
        self.state = ProfileState.INIT
        self.mode: EvFormatMode | None = None
        self.fields: tuple[int, ...] = ()  # the widths, once MODIFY_FIELDS set them
        self.dependents: list[FormatUser] = []  # EV profiles naming this format (EBUSY while one is ONLINE)

    @property
    def total_width(self) -> int:
        return sum(self.fields)

    def modify(self, *, state: ProfileState | None = None, cur_state: ProfileState | None = None,
               mode: EvFormatMode | str | None = None, fields: Sequence[int] | None = None) -> None:
        """Apply the attributes given (None = not in attr_mask; `fields` = the MODIFY_FIELDS op), or raise
        before changing anything."""
        if cur_state is not None and ProfileState(cur_state) != self.state:
            raise MrcApiError(f"cur_state: the profile is {self.state.name}, not {ProfileState(cur_state).name}")
        online = [p.profile_id for p in self.dependents if p.state == ProfileState.ONLINE]
        if online:
            raise MrcApiError(f"state: EV profile(s) {online} using this format are ONLINE", errno.EBUSY)
        target = self.state if state is None else ProfileState(state)
        new_mode = self.mode if mode is None else parse_mode(mode, EvFormatMode, "mode")
        if self.state == ProfileState.INIT:
            if target != ProfileState.OFFLINE:
                raise MrcApiError("state: an INIT format profile may only move to OFFLINE (with MODE)")
            if mode is None:
                raise MrcApiError("mode: INIT -> OFFLINE needs MODE")
        elif self.state == ProfileState.ONLINE:
            if target != ProfileState.OFFLINE or mode is not None or fields is not None:
                raise MrcApiError("state: an ONLINE format profile may only move to OFFLINE")
        elif target == ProfileState.INIT and (mode is not None or fields is not None):
            raise MrcApiError("state: OFFLINE -> INIT takes no MODE or fields")
        new_fields = self.fields if fields is None else check_format_fields(fields, new_mode)
        if fields is None and new_fields:
            check_format_fields(new_fields, new_mode)  # a new mode must still carry the widths set before
        if target == ProfileState.ONLINE and not new_fields:
            raise MrcApiError("fields: OFFLINE -> ONLINE needs MODIFY_FIELDS")
        self.state, self.mode, self.fields = target, new_mode, new_fields
        if target == ProfileState.INIT:
            self.mode, self.fields = None, ()

    def query_fields(self, field_count: int | None = None) -> tuple[int, ...]:
        """QUERY_FIELDS: the widths; E2BIG (naming the count needed) if `field_count` is too small."""
        if field_count is not None and field_count < len(self.fields):
            raise MrcApiError(f"fmt_field_count: {field_count} is less than the {len(self.fields)} fields", errno.E2BIG)
        return self.fields

    def __repr__(self) -> str:
        mode = self.mode.name if self.mode else None
        return f"EvFormatProfile(id={self.profile_id}, {self.state.name}, mode={mode}, fields={list(self.fields)})"
