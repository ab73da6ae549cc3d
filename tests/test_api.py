"""The OCP controller API mirror (mrc_emu.api): the worked example of GENERATED expansion bit for
bit, every restriction's one-line error, the profiles' state transitions and their errors."""

from __future__ import annotations

import errno
import re

import pytest

from mrc_emu.api import (
    EvField,
    EvFormatMode,
    EvFormatProfile,
    EvProfile,
    EvProfileMode,
    MrcApiError,
    ProfileState,
    RestrictionError,
    expand,
    explicit_evs,
    generated_evs,
    srv6_address,
)
from mrc_emu.api.expansion import deposit

OFFLINE, ONLINE, INIT = ProfileState.OFFLINE, ProfileState.ONLINE, ProfileState.INIT
WORKED_FIELDS = [EvField(width=8, init_val=0xA0, mask=0x0F, max_val=0xF), EvField(width=4, init_val=0, mask=0x0A, max_val=3),
                 EvField(width=16, init_val=0xBEEF)]


def stev(widths=(8, 8, 16), online=True) -> EvFormatProfile:
    fmt = EvFormatProfile(1)
    fmt.modify(state=OFFLINE, mode=EvFormatMode.STEV, fields=list(widths))
    if online:
        fmt.modify(state=ONLINE)
    return fmt


def gen_profile(fields=WORKED_FIELDS, fmt=None, ev_count=4) -> EvProfile:
    profile = EvProfile(7)
    profile.modify(state=OFFLINE, mode=EvProfileMode.GEN, fmt=fmt or stev(), ev_count=ev_count, fields=fields)
    return profile


# --- the worked example of OCP-API.md section 3 (verified against ev_expansion.c's output) ---

WORKED = {  # compact byte 0 -> the exact EXPANDED line of the OCP example program
    0x00: "a000beef" + "00" * 28,
    0x04: "a002beef" + "00" * 28,
    0x78: "a708beef" + "00" * 28,
    0xFC: "af0abeef" + "00" * 28,
}


@pytest.mark.parametrize("compact", sorted(WORKED))
def test_the_worked_example_expands_bit_for_bit(compact):
    expanded, values = expand(bytes([compact]) + bytes(31), WORKED_FIELDS, [8, 8, 16])
    assert expanded.hex() == WORKED[compact] and len(expanded) == 32
    assert values[2] == 0xBEEF


def test_the_hand_check_of_0x78():
    _, values = expand(bytes([0x78]), WORKED_FIELDS, [8, 8, 16])
    assert values == (0xA7, 0x08, 0xBEEF)  # 0111 -> 0xA0|0x7; 10 -> mask bits 3,1 = 0b1000


def test_the_generated_evs_of_the_worked_profile_include_its_compact_values():
    profile = gen_profile(ev_count=64)
    evs = generated_evs(profile)
    by_compact = {ev.compact[0]: ev.expanded.hex() for ev in evs}
    assert len(evs) == 64 and len(by_compact) == 64 and {k: by_compact[k] for k in WORKED} == WORKED
    assert all(ev.compact[1:] == bytes(31) for ev in evs)
    assert [ev.compact[0] for ev in evs] == sorted(ev.compact[0] for ev in evs)  # ascending compact values


def test_deposit_is_pdep():
    assert deposit(0b10, 0x0A) == 0b1000 and deposit(0b11, 0x0A) == 0x0A and deposit(0b1, 0) == 0
    assert deposit(0b101, 0b1011_0000) == 0b1001_0000


def test_a_wider_field_than_its_slot_keeps_the_low_bits_silently():
    expanded, _ = expand(b"", [EvField(width=12, init_val=0xABC), EvField(width=4, init_val=0x1)], [8, 8])
    assert expanded[:2] == bytes([0xBC, 0x01])  # as the OCP code does: only the sums of widths are checked


def test_a_narrower_field_is_right_aligned_and_missing_fields_stay_zero():
    expanded, _ = expand(bytes([0b1000_0000]), [EvField(width=4, init_val=0x3, mask=0x8, max_val=1)], [16, 8])
    assert expanded[:3] == bytes([0x00, 0x0B, 0x00])


def test_bits_past_the_generated_ones_must_be_zero():
    with pytest.raises(MrcApiError, match="bits set past the 6 generated bits"):
        expand(bytes([0x01]), WORKED_FIELDS, [8, 8, 16])


def test_srv6_evs_mean_a_destination_and_an_srh_segment():
    fmt = EvFormatProfile(2)
    fmt.modify(state=OFFLINE, mode="SRV6", fields=[32, 16, 16, 16])
    fmt.modify(state=ONLINE)
    fields = [EvField(width=32, init_val=0xFC000000), EvField(width=16, init_val=0xE000, mask=0x0003, max_val=3),
              EvField(width=16, init_val=0xE100, mask=0x0100, max_val=1), EvField(width=16, init_val=0xF00D)]
    evs = generated_evs(gen_profile(fields, fmt, ev_count=8))
    assert [srv6_address(ev.expanded)["ipv6_da"] for ev in evs[:3]] == ["fc00:0:e000:e000:f00d::", "fc00:0:e000:e100:f00d::",
                                                                       "fc00:0:e001:e000:f00d::"]
    assert evs[7].compact[0] == 0b111_00000 and evs[7].to_dict(EvFormatMode.SRV6)["srh_segment"] == "::"


def test_explicit_evs_are_the_evs_as_given():
    profile = EvProfile(3)
    profile.modify(state=OFFLINE, mode="EXP", fmt=stev((16, 16)), ev_count=2, fields=[EvField(16), EvField(16)])
    evs = explicit_evs(profile, [bytes.fromhex("00010001"), bytes.fromhex("00020002")])
    assert [ev.expanded.hex()[:8] for ev in evs] == ["00010001", "00020002"] and evs[0].compact == evs[0].expanded
    with pytest.raises(RestrictionError, match=r"evs\[0\]: .* has bits past the format's 32 bits"):
        explicit_evs(profile, [bytes(4) + b"\x01", bytes.fromhex("01")])


def test_ev_count_cannot_exceed_what_the_fields_generate():
    with pytest.raises(RestrictionError, match="ev_count: 65 exceeds the 64 EVs the fields generate"):
        generated_evs(gen_profile(ev_count=65))


def test_min_val_narrows_the_generated_values():
    fields = [EvField(width=8, mask=0xFF, min_val=250, max_val=252), EvField(width=8)]
    assert [ev.expanded[0] for ev in generated_evs(gen_profile(fields, stev((8, 8)), ev_count=3))] == [250, 251, 252]


# --- restrictions: one exception type, one line naming the field ---

RESTRICTED = [
    ([EvField(8, init_val=0x1FF)], "fields[0].init_val: 0x1FF is wider than width 8"),
    ([EvField(8), EvField(4, mask=0x1A, max_val=1)], "fields[1].mask: 0x1A has bits outside width 4"),
    ([EvField(8, mask=0x0A, max_val=4)], "fields[0].max_val: 4 does not fit the mask's 2 bit(s) (at most 3)"),
    ([EvField(8, init_val=5, max_val=1)], "fields[0].max_val: 1 does not fit the mask's 0 bit(s) (at most 0)"),
    ([EvField(8)] * 4, "fields: 4 fields exceed the format's 3"),
    ([EvField(16), EvField(16), EvField(8)], "fields: total width 40 exceeds the format's 32 bits"),
    ([EvField(0)], "fields[0].width: 0"),
    ([EvField(8, mask=-1)], "fields[0].mask: -1 is not a u32"),
    ([EvField(8, init_val=1 << 32)], "fields[0].init_val: 4294967296 is not a u32"),
    ([], "fields: expected a non-empty list"),
]


@pytest.mark.parametrize(("fields", "message"), RESTRICTED, ids=[m.split(":")[0] + str(i) for i, (_, m) in enumerate(RESTRICTED)])
def test_every_restriction_is_one_line_naming_the_field(fields, message):
    profile = EvProfile(1)
    with pytest.raises(RestrictionError) as caught:
        profile.modify(state=OFFLINE, mode="GEN", fmt=stev(), ev_count=4, fields=fields)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)
    assert profile.state == INIT and profile.fields == ()  # nothing applied


def test_too_many_or_too_wide_fields_are_e2big():
    with pytest.raises(RestrictionError) as caught:
        gen_profile([EvField(8)] * 4)
    assert caught.value.errno == errno.E2BIG and caught.value.errno_name == "E2BIG"


def test_min_active_and_event_mask_restrictions():
    profile = gen_profile()
    with pytest.raises(RestrictionError, match="ev_min_active: 5 exceeds ev_count 4"):
        profile.modify(ev_min_active=5)
    with pytest.raises(RestrictionError, match=r"ev_event_mask: 0x04 has bits other than GOOD \(0x01\) and ASSUMED_BAD"):
        profile.modify(ev_event_mask=0x4)
    with pytest.raises(RestrictionError, match="mode: 'ECMP' is not one of AUTO, EXP, GEN"):
        profile.modify(mode="ECMP")


def test_format_restrictions():
    for mode, widths, message in [("STEV", [16, 16, 8], "fields: total width 40 exceeds the 32 bits STEV carries"),
                                  ("UDP", [8, 9], "fields: total width 17 exceeds the 16 bits UDP carries"),
                                  ("SRV6", [0], "fields[0]: width 0 is not 1..255"),
                                  ("SRV6", [255, 2], "fields: total width 257 exceeds the 256 bits SRV6 carries"),
                                  ("IPV4", [8], "mode: 'IPV4' is not one of STEV, SRV6, UDP")]:
        with pytest.raises(RestrictionError, match=re.escape(message)):
            EvFormatProfile().modify(state=OFFLINE, mode=mode, fields=widths)


# --- state transitions ---

def test_format_lifecycle_init_offline_online_offline_init():
    fmt = EvFormatProfile()
    with pytest.raises(MrcApiError, match="mode: INIT -> OFFLINE needs MODE"):
        fmt.modify(state=OFFLINE, fields=[8])
    with pytest.raises(MrcApiError, match="state: an INIT format profile may only move to OFFLINE"):
        fmt.modify(state=ONLINE, mode="STEV", fields=[8])
    fmt.modify(state=OFFLINE, mode="UDP")
    with pytest.raises(MrcApiError, match="fields: OFFLINE -> ONLINE needs MODIFY_FIELDS"):
        fmt.modify(state=ONLINE)
    fmt.modify(fields=[16])
    with pytest.raises(MrcApiError, match="cur_state: the profile is OFFLINE, not ONLINE"):
        fmt.modify(cur_state=ONLINE, state=ONLINE)
    fmt.modify(cur_state=OFFLINE, state=ONLINE)
    assert fmt.state == ONLINE and fmt.query_fields() == (16,)
    with pytest.raises(MrcApiError, match="state: an ONLINE format profile may only move to OFFLINE"):
        fmt.modify(fields=[8])
    with pytest.raises(MrcApiError) as caught:
        fmt.query_fields(field_count=0)
    assert caught.value.errno == errno.E2BIG
    fmt.modify(state=OFFLINE)
    fmt.modify(state=INIT)
    assert (fmt.state, fmt.mode, fmt.fields) == (INIT, None, ())


def test_a_format_mode_change_must_still_carry_the_widths():
    fmt = stev((16, 16), online=False)
    with pytest.raises(RestrictionError, match="exceeds the 16 bits UDP carries"):
        fmt.modify(mode="UDP")
    assert fmt.mode == EvFormatMode.STEV


def test_a_format_with_an_online_ev_profile_is_ebusy():
    fmt = stev()
    profile = gen_profile(fmt=fmt)
    profile.modify(state=ONLINE, ev_min_active=1, ev_event_mask=3)
    with pytest.raises(MrcApiError) as caught:
        fmt.modify(state=OFFLINE)
    assert caught.value.errno == errno.EBUSY and "EV profile(s) [7]" in str(caught.value)
    profile.modify(state=OFFLINE)
    fmt.modify(state=OFFLINE)


def test_ev_profile_lifecycle():
    fmt = stev()
    profile = EvProfile(5)
    with pytest.raises(MrcApiError, match="fields: INIT -> OFFLINE needs MODE, FMT_ID, COUNT and MODIFY_FIELDS"):
        profile.modify(state=OFFLINE, mode="GEN", fmt=fmt, ev_count=4)
    with pytest.raises(MrcApiError, match="state: an INIT EV profile may only move to OFFLINE"):
        profile.modify(ev_count=4)
    profile.modify(state=OFFLINE, mode="GEN", fmt=fmt, ev_count=4, fields=WORKED_FIELDS)
    with pytest.raises(MrcApiError, match="ev_min_active: OFFLINE -> ONLINE needs MIN_ACTIVE"):
        profile.modify(state=ONLINE, ev_event_mask=3)
    with pytest.raises(MrcApiError, match="ev_event_mask: OFFLINE -> ONLINE needs EVENT_MASK"):
        profile.modify(state=ONLINE, ev_min_active=2)
    profile.modify(ev_min_active=2, ev_event_mask=3)
    profile.modify(state=ONLINE)
    with pytest.raises(MrcApiError, match="state: an ONLINE EV profile may only move to OFFLINE"):
        profile.modify(ev_event_mask=1)
    with pytest.raises(MrcApiError, match="cur_state: the profile is ONLINE, not OFFLINE"):
        profile.modify(cur_state=OFFLINE, state=OFFLINE)
    profile.modify(state=OFFLINE)
    with pytest.raises(MrcApiError, match="ev_count: OFFLINE -> INIT takes no other attribute"):
        profile.modify(state=INIT, ev_count=8)
    profile.modify(state=INIT)
    assert profile.state == INIT and profile.fmt is None and profile not in fmt.dependents


def test_an_ev_profile_goes_online_only_over_an_online_format():
    fmt = stev(online=False)
    profile = gen_profile(fmt=fmt)
    with pytest.raises(MrcApiError, match="fmt: the format profile is OFFLINE, not ONLINE"):
        profile.modify(state=ONLINE, ev_min_active=1, ev_event_mask=1)
    assert profile.state == OFFLINE and profile.ev_min_active is None  # nothing applied


def test_an_explicit_profile_goes_online_only_with_every_ev_replaced():
    profile = EvProfile(9)
    profile.modify(state=OFFLINE, mode="EXP", fmt=stev(), ev_count=16, fields=WORKED_FIELDS)
    assert profile.explicit == [bytes(32)] * 16
    with pytest.raises(MrcApiError, match=r"evs: OFFLINE -> ONLINE needs every EV replaced \(16 of 16 UNPOPULATED\)"):
        profile.modify(state=ONLINE, ev_min_active=4, ev_event_mask=3)


def test_an_auto_profile_needs_only_its_mode():
    profile = EvProfile(4)
    profile.modify(state=OFFLINE, mode="AUTO")
    profile.modify(state=ONLINE, ev_min_active=0, ev_event_mask=0)
    assert profile.state == ONLINE and profile.fields == ()


def test_fields_are_rechecked_against_a_new_format():
    profile = gen_profile()
    with pytest.raises(RestrictionError, match="fields: 3 fields exceed the format's 2"):
        profile.modify(fmt=stev((16, 16)))


# --- vectors printed by the unmodified OCP example program (examples/ev_expansion/ev_expansion.c @662a150,
# srandom(0)): its own STEV and SRv6 profiles, compact EV -> expanded bytes ---

STEV_FIXED = [EvField(16, init_val=0x100, min_val=1, max_val=0xF, mask=0xF), EvField(16, init_val=0x200, min_val=1, max_val=0xF, mask=0xF)]
STEV_WEIRD = [EvField(16, init_val=0x1000, min_val=1, max_val=0xFF, mask=0xF0F),
              EvField(16, init_val=0x2000, min_val=1, max_val=0xFF, mask=0xF0F)]
SRV6_FIXED = [EvField(32, init_val=0x13131313)] + [EvField(16, init_val=k << 8, min_val=1, max_val=0xF, mask=0xF) for k in (1, 2, 3, 4)]
OCP_PROGRAM = [
    ("STEV Generated w/ Fixed", STEV_FIXED, [16, 16], "a4", "010a0204"),
    ("STEV Generated w/ Fixed", STEV_FIXED, [16, 16], "7f", "0107020f"),
    ("STEV Generated w/ Fixed & Weird Mask", STEV_WEIRD, [16, 16], "3312", "13032102"),
    ("STEV Generated w/ Fixed & Weird Mask", STEV_WEIRD, [16, 16], "e33e", "1e03230e"),
    ("SRv6 Generated w/ Fixed", SRV6_FIXED, [32, 16, 16, 16, 16], "9b79", "131313130109020b03070409"),
    ("SRv6 Generated w/ Fixed", SRV6_FIXED, [32, 16, 16, 16, 16], "26c7", "1313131301020206030c0407"),
]


@pytest.mark.parametrize(("section", "fields", "widths", "compact", "expected"), OCP_PROGRAM,
                         ids=[f"{s}-{c}" for s, _, _, c, _ in OCP_PROGRAM])
def test_expansion_equals_the_ocp_example_program(section, fields, widths, compact, expected):
    expanded, _ = expand(bytes.fromhex(compact).ljust(32, b"\0"), fields, widths)
    assert expanded.hex() == expected + "00" * (32 - len(expected) // 2)
