"""The EV profile file: a format and a profile in YAML, read into EvFormatProfile and EvProfile.

Why it exists: `mrc-emu ev expand` (and later `send --ev-profile`) take a profile from a file;
this turns the file into the API's objects through the same modify() calls a controller makes
(INIT -> OFFLINE with everything, then ONLINE), so a file breaks exactly the restrictions a
call would. Every error is one line naming the file and the attribute (`profile.fields[1].mask`).

    format: {mode: STEV, fields: [8, 8, 16]}
    profile:
      mode: GEN                      # or EXP, with evs: [hex bytes, ...]; or AUTO
      ev_count: 16
      ev_min_active: 4
      ev_event_mask: [GOOD, ASSUMED_BAD]   # optional (default: both)
      fields:
        - {width: 8, init_val: 0xA0, mask: 0x0F, min_val: 0, max_val: 15}
        - {width: 16, init_val: 0xBEEF}    # fixed field

It must never touch the system beyond reading the file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..topology.model import read_yaml
from .errors import MrcApiError
from .expansion import ExpandedEv, explicit_evs, generated_evs
from .formats import EvFormatProfile, ProfileState
from .profiles import UNPOPULATED, EvEventMask, EvField, EvProfile, EvProfileMode


class ProfileFileError(MrcApiError):
    """A profile file that cannot be read or breaks a restriction: '<file>: <attribute>: <why>'."""


@dataclass
class ProfileFile:
    """What a profile file holds: both profiles (ONLINE) and, for EXP, the EVs it lists."""

    path: str
    fmt: EvFormatProfile
    profile: EvProfile
    evs: list[bytes]

    def expanded(self) -> list[ExpandedEv]:
        """The EVs the profile yields (none for AUTO), or a ProfileFileError naming the file."""
        try:
            if self.profile.mode == EvProfileMode.GEN:
                return generated_evs(self.profile)
            if self.profile.mode == EvProfileMode.EXP:
                return explicit_evs(self.profile, self.evs)
        except MrcApiError as exc:
            raise ProfileFileError(f"{self.path}: profile.{exc}", exc.errno) from None
        return []


def _mapping(data: Any, where: str, path: str, known: set[str]) -> dict:
    if not isinstance(data, dict):
        raise ProfileFileError(f"{path}: {where}: expected a mapping, got {data!r}")
    unknown = sorted(set(data) - known)
    if unknown:
        raise ProfileFileError(f"{path}: {where}.{unknown[0]}: unknown key (known: {', '.join(sorted(known))})")
    return data


def _event_mask(value: Any) -> Any:
    if isinstance(value, list):
        try:
            return int(sum((EvEventMask[str(name).upper()] for name in value), EvEventMask(0)))
        except KeyError as exc:
            raise MrcApiError(f"ev_event_mask: {exc.args[0]!r} is not GOOD or ASSUMED_BAD") from None
    return value


def _ev_bytes(value: Any, index: int) -> bytes:
    text = value if isinstance(value, str) else None
    if text is None or not text.lower().removeprefix("0x"):
        raise MrcApiError(f"evs[{index}]: {value!r} is not a hex string of EV bytes (e.g. '0xa000beef')")
    digits = text.lower().removeprefix("0x").replace("_", "")
    try:
        return bytes.fromhex(digits if len(digits) % 2 == 0 else digits + "0")
    except ValueError:
        raise MrcApiError(f"evs[{index}]: {value!r} is not a hex string of EV bytes") from None


def from_dict(data: Any, path: str = "<profile>") -> ProfileFile:
    """Both profiles from the file's data, taken ONLINE; a ProfileFileError names the file and attribute."""
    top = _mapping(data, "top level", path, {"format", "profile"})
    for key in ("format", "profile"):
        if key not in top:
            raise ProfileFileError(f"{path}: {key}: missing")
    fmt_data = _mapping(top["format"], "format", path, {"mode", "fields"})
    prof_data = _mapping(top["profile"], "profile", path,
                         {"mode", "ev_count", "ev_min_active", "ev_event_mask", "fields", "evs"})
    fmt, profile = EvFormatProfile(1), EvProfile(1)
    section = "format"
    try:
        fmt.modify(state=ProfileState.OFFLINE, mode=fmt_data.get("mode"), fields=fmt_data.get("fields"))
        fmt.modify(state=ProfileState.ONLINE)
        section = "profile"
        raw_fields = prof_data.get("fields")
        if raw_fields is not None and not isinstance(raw_fields, list):
            raise MrcApiError(f"fields: expected a list of fields, got {raw_fields!r}")
        fields = None if raw_fields is None else [EvField.from_dict(item, f"fields[{i}]") for i, item in enumerate(raw_fields)]
        evs = [_ev_bytes(value, i) for i, value in enumerate(prof_data.get("evs") or [])]
        profile.modify(state=ProfileState.OFFLINE, mode=prof_data.get("mode"), fmt=fmt, ev_count=prof_data.get("ev_count"),
                       fields=fields)
        if profile.mode == EvProfileMode.EXP:
            if len(evs) != profile.ev_count:
                raise MrcApiError(f"evs: {len(evs)} EVs listed, ev_count is {profile.ev_count}")
            if UNPOPULATED in [ev.ljust(len(UNPOPULATED), b"\0") for ev in evs]:
                raise MrcApiError("evs: an all-zero EV is UNPOPULATED")
            profile.explicit = [ev.ljust(len(UNPOPULATED), b"\0") for ev in evs]  # what REPLACE_EV will do
        elif evs:
            raise MrcApiError(f"evs: only an EXP profile lists EVs (this one is {profile.mode.name})")
        profile.modify(state=ProfileState.ONLINE, ev_min_active=prof_data.get("ev_min_active"),
                       ev_event_mask=_event_mask(prof_data.get("ev_event_mask", ["GOOD", "ASSUMED_BAD"])))
    except MrcApiError as exc:
        raise ProfileFileError(f"{path}: {section}.{exc}", exc.errno) from None
    except TypeError as exc:  # e.g. a field given as a list
        raise ProfileFileError(f"{path}: {section}: {exc}") from None
    return ProfileFile(path, fmt, profile, evs)


def load(path: str | Path) -> ProfileFile:
    data, _ = read_yaml(Path(path), "EV profile", ProfileFileError)
    return from_dict(data, str(path))
