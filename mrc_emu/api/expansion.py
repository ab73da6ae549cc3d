"""GENERATED-profile EV expansion: a compact EV through the profile's fields into 32 bytes.

Why it exists: a GEN profile's EVs are compact bit strings (the fields' generated bits, one
field after another); the packet carries their expansion. This is the algorithm of the OCP
example (examples/ev_expansion/ev_expansion.c, matching mrc_ctl.h c:605-629), written anew
(docs/api.md, ../shared/ref/OCP-API.md section 3):

    compact EV: a big-endian bit stream from byte 0, bit 7
    field i:    v = init_val; the next popcount(mask) stream bits x go into v at the mask's bits
                (bit j of x to the j-th lowest mask bit, PDEP); v is then written as format
                field i's width bits, MSB first (wider format: top bits zero; narrower: the low
                bits survive, silently, as in the example code)
    the rest:   format fields without a profile field and bytes past the format stay zero;
                compact bits past the generated ones must be zero

It must never touch the system.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from .errors import MrcApiError, RestrictionError
from .formats import EV_MAX_BYTES, EvFormatMode
from .profiles import EvField, EvProfile, EvProfileMode


@dataclass(frozen=True)
class ExpandedEv:
    """One EV: its compact value (32 bytes, generated bits from byte 0), its expansion, its field values."""

    index: int
    compact: bytes
    expanded: bytes
    field_values: tuple[int, ...]  # each profile field's value before it is fitted into its format slot

    def to_dict(self, mode: EvFormatMode) -> dict:
        data = {"index": self.index, "compact": self.compact.hex(), "expanded": self.expanded.hex(),
                "fields": [hex(value) for value in self.field_values]}
        if mode == EvFormatMode.SRV6:
            data.update(srv6_address(self.expanded))
        return data


def deposit(bits: int, mask: int) -> int:
    """PDEP: bit j of `bits` (from the LSB) lands on the j-th lowest set bit of `mask`."""
    out, position, j = 0, 0, 0
    while mask >> position:
        if (mask >> position) & 1:
            out |= ((bits >> j) & 1) << position
            j += 1
        position += 1
    return out


def expand(compact: bytes, fields: Sequence[EvField], format_widths: Sequence[int]) -> tuple[bytes, tuple[int, ...]]:
    """(the 32 expanded bytes, each field's value) of one compact EV (any length up to 32 bytes)."""
    if len(compact) > EV_MAX_BYTES:
        raise MrcApiError(f"ev: {len(compact)} bytes, an EV has at most {EV_MAX_BYTES}")
    stream = int.from_bytes(compact, "big") if compact else 0
    stream_bits = 8 * len(compact)
    consumed, values, out, out_bits = 0, [], 0, 0
    for index, (field, slot) in enumerate(zip(fields, format_widths)):
        taken = field.generated_bits
        if consumed + taken > stream_bits:
            raise MrcApiError(f"ev: {stream_bits} bits, fields[{index}] needs {consumed + taken}")
        x = (stream >> (stream_bits - consumed - taken)) & ((1 << taken) - 1) if taken else 0
        consumed += taken
        full = (1 << field.width) - 1
        value = x if taken and (field.mask & full) == full else (field.init_val & ~field.mask) | deposit(x, field.mask)
        values.append(value)
        out = (out << slot) | (value & ((1 << slot) - 1))
        out_bits += slot
    out_bits += sum(format_widths[len(fields):])
    out <<= sum(format_widths[len(fields):])
    if stream & ((1 << (stream_bits - consumed)) - 1):
        raise MrcApiError(f"ev: {compact.hex()} has bits set past the {consumed} generated bits")
    expanded = (out << (8 * EV_MAX_BYTES - out_bits)).to_bytes(EV_MAX_BYTES, "big")
    return expanded, tuple(values)


def _field_ranges(profile: EvProfile) -> list[range]:
    ranges = []
    for index, field in enumerate(profile.fields):
        if field.generated_bits:
            if field.min_val > field.max_val:
                raise RestrictionError(f"fields[{index}].min_val: {field.min_val} exceeds max_val {field.max_val}: "
                                       "the field generates nothing")
            ranges.append(range(field.min_val, field.max_val + 1))
    return ranges


def compact_values(profile: EvProfile) -> Iterator[bytes]:
    """The compact EVs of a GEN profile in this mirror's order: each generated field's values from min_val
    to max_val, the last field fastest (the compact values ascend). The header leaves the order open."""
    ranges = _field_ranges(profile)
    widths = [field.generated_bits for field in profile.fields if field.generated_bits]
    total = sum(widths)
    counters = [r.start for r in ranges]
    while True:
        stream = 0
        for value, width in zip(counters, widths):
            stream = (stream << width) | value
        yield (stream << (8 * EV_MAX_BYTES - total)).to_bytes(EV_MAX_BYTES, "big") if total else bytes(EV_MAX_BYTES)
        for position in reversed(range(len(counters))):
            if counters[position] + 1 < ranges[position].stop:
                counters[position] += 1
                break
            counters[position] = ranges[position].start
        else:
            return


def _checked(profile: EvProfile, mode: EvProfileMode) -> None:
    if profile.mode != mode or profile.fmt is None or not profile.fields or profile.ev_count is None:
        raise MrcApiError(f"mode: the profile is {profile!r}, not an OFFLINE or ONLINE {mode.name} profile with its fields")


def generated_evs(profile: EvProfile) -> list[ExpandedEv]:
    """The first ev_count EVs of a GEN profile, expanded; a RestrictionError if the fields yield fewer."""
    _checked(profile, EvProfileMode.GEN)
    possible = 1
    for value_range in _field_ranges(profile):
        possible *= len(value_range)
    if profile.ev_count > possible:
        raise RestrictionError(f"ev_count: {profile.ev_count} exceeds the {possible} EVs the fields generate")
    out = []
    for index, compact in zip(range(profile.ev_count), compact_values(profile)):
        expanded, values = expand(compact, profile.fields, profile.fmt.fields)
        out.append(ExpandedEv(index, compact, expanded, values))
    return out


def explicit_evs(profile: EvProfile, values: Sequence[bytes]) -> list[ExpandedEv]:
    """An EXP profile's EVs as given (each its own expansion: explicit EVs are already packet bytes)."""
    _checked(profile, EvProfileMode.EXP)
    if len(values) != profile.ev_count:
        raise RestrictionError(f"evs: {len(values)} EVs given, ev_count is {profile.ev_count}")
    out = []
    for index, value in enumerate(values):
        if len(value) > EV_MAX_BYTES:
            raise RestrictionError(f"evs[{index}]: {len(value)} bytes, an EV has at most {EV_MAX_BYTES}")
        padded = bytes(value).ljust(EV_MAX_BYTES, b"\0")
        if int.from_bytes(padded, "big") & ((1 << (8 * EV_MAX_BYTES - profile.fmt.total_width)) - 1):
            raise RestrictionError(f"evs[{index}]: 0x{value.hex()} has bits past the format's {profile.fmt.total_width} bits")
        out.append(ExpandedEv(index, padded, padded, ()))
    return out


def srv6_address(expanded: bytes) -> dict:
    """What SRV6 EV bytes mean: bytes 0-15 the SRv6 destination (uSID carrier), 16-31 the SRH's single segment."""
    return {"ipv6_da": str(ipaddress.IPv6Address(expanded[:16])), "srh_segment": str(ipaddress.IPv6Address(expanded[16:32]))}
