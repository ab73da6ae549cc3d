"""The OCP examples (opencomputeproject/OCP-Multipath-Reliable-Connection @662a150, examples/*.md)
step by step on mrc_emu.api's Controller and Qp: each step as a call with its outcome asserted,
and the error cases each step implies (the wrong state, a missing attribute, a wrong id).

Where an example uses an older layout than the headers (OCP-API.md says so), the header is
followed and a comment says where. EV values the examples build with `memcpy(val, &u32, 4)` are
little-endian bytes here: the examples run on x86, and an EV is a byte string."""

import contextlib
import errno
import ipaddress
import re
import struct

import pytest

from mrc_emu.api import (
    Controller,
    CtlDeviceAttr,
    EpOpType,
    EpRequest,
    EpResponse,
    EvField,
    EvFormatMode,
    EvOp,
    EvOpEntry,
    EvProfileMode,
    EvState,
    MrcApiError,
    OptAttr,
    ProfileState,
    QpCap,
    QpState,
    RestrictionError,
    RetryCnt,
    WrOpcode,
    device_set_state,
    expand,
)
from mrc_emu.api.profiles import UNPOPULATED as UNPOPULATED_EV

INIT, OFFLINE, ONLINE = ProfileState.INIT, ProfileState.OFFLINE, ProfileState.ONLINE
GOOD, ASSUMED_BAD, DENIED = EvState.GOOD, EvState.ASSUMED_BAD, EvState.DENIED


@contextlib.contextmanager
def raises(errno_value, message, kind=MrcApiError):
    with pytest.raises(kind, match="^" + re.escape(message) + "$") as excinfo:
        yield excinfo
    assert excinfo.value.errno == errno_value, excinfo.value.errno_name


def le32(value):
    """memcpy(ev.val, &value, sizeof(uint32_t)) on x86."""
    return struct.pack("<I", value)


def online_format(ctl, fmt_id, mode, widths):
    """The examples' two format steps: INIT -> OFFLINE with MODE and MODIFY_FIELDS, then -> ONLINE."""
    ctl.modify_ev_fmt_profile(fmt_id, state=OFFLINE, mode=mode, fields=widths)
    ctl.modify_ev_fmt_profile(fmt_id, state=ONLINE)
    return ctl.ev_fmt_profile(fmt_id)


# ---- mrc_ctl_exp_ev.md: an explicit EV profile

def exp_controller(**opt):
    """A device small enough to run the example's loops: 64 EVs per profile, arrays aligned to 8."""
    return Controller(attrs=CtlDeviceAttr(ev_max_count_profile=64, ev_count_align=8, **opt))


def test_exp_ev_configure_populate_online_deny_replace_query_destroy():
    ctl = exp_controller()
    attrs = ctl.query_device()  # Query the Device: explicit mode must be supported
    assert attrs.ev_mode_mask & EvProfileMode.EXP
    # Configure an EV Format Profile: 13, STEV, two 16-bit fields
    with raises(errno.EINVAL, "state: an INIT format profile may only move to OFFLINE (with MODE)"):
        ctl.modify_ev_fmt_profile(13, state=ONLINE)  # skipping OFFLINE
    with raises(errno.EINVAL, "mode: INIT -> OFFLINE needs MODE"):
        ctl.modify_ev_fmt_profile(13, state=OFFLINE, fields=[16, 16])
    online_format(ctl, 13, EvFormatMode.STEV, [16, 16])
    with raises(errno.EINVAL, "state: an ONLINE format profile may only move to OFFLINE"):
        ctl.modify_ev_fmt_profile(13, fields=[8, 8])
    # Configure an Explicit EV Profile: 1, ev_count = ev_max_count_profile rounded down to ev_count_align
    ev_count = attrs.ev_max_count_profile - attrs.ev_max_count_profile % attrs.ev_count_align
    assert ev_count == 64
    step1 = {"state": OFFLINE, "mode": EvProfileMode.EXP, "fmt_id": 13, "ev_count": ev_count,
             "ev_min_active": ev_count // 4, "ev_event_mask": GOOD | ASSUMED_BAD}
    # The example gives no fields; the header's INIT -> OFFLINE needs MODIFY_FIELDS (c:705-723) even for EXP.
    with raises(errno.EINVAL, "fields: INIT -> OFFLINE needs MODE, FMT_ID, COUNT and MODIFY_FIELDS"):
        ctl.modify_ev_profile(1, **step1)
    with raises(errno.EINVAL, "ev_fmt_profile_id: 12 is not an EV format profile of controller h0"):
        ctl.modify_ev_profile(1, **{**step1, "fmt_id": 12})  # a wrong format id
    fields = [EvField(16, mask=0xFFFF, max_val=0xFFFF), EvField(16, mask=0xFFFF, max_val=0xFFFF)]
    ctl.modify_ev_profile(1, fields=fields, **step1)
    with raises(errno.EINVAL, "evs: OFFLINE -> ONLINE needs every EV replaced (64 of 64 UNPOPULATED)"):
        ctl.modify_ev_profile(1, state=ONLINE)  # before populating
    # Populate the Explicit EVs: one REPLACE_EV per call, cur_ev UNPOPULATED, new value (i << 16) | i on port 1.
    # The example writes .ev_op.replace_ev.{cur_ev,new_ev,all_copies}: the header's entry is {ev, ev_new, state, flags}.
    # EV 0 is value 0 on port 1: an EV (the header's UNPOPULATED is value 0 *and* port 0)
    with raises(errno.EINVAL, "entries[0].ev_new: UNPOPULATED (value 0, port 0) is not an EV to replace with "
                              "(0 of 1 entries applied)"):
        ctl.ev_op(1, EvOp.REPLACE_EV, [EvOpEntry(UNPOPULATED_EV, 0, le32(0), 0, GOOD)])
    with raises(errno.EINVAL, "entries[0].port_new: 0 is UNPOPULATED's port; an EV is on a port 1..255 (0 of 1 entries applied)"):
        ctl.ev_op(1, EvOp.REPLACE_EV, [EvOpEntry(UNPOPULATED_EV, 0, le32(5), 0, GOOD)])
    for i in range(ev_count):
        assert ctl.ev_op(1, EvOp.REPLACE_EV, [EvOpEntry(UNPOPULATED_EV, 0, le32(i << 16 | i), 1, GOOD)]) == 1
    with raises(errno.ENOENT, "entries[0].ev: 0x00 on port 0 not found (0 of 1 entries applied)"):
        ctl.ev_op(1, EvOp.REPLACE_EV, [EvOpEntry(UNPOPULATED_EV, 0, le32(99), 1, GOOD)])  # none left
    # Transition to ONLINE
    ctl.modify_ev_profile(1, state=ONLINE)
    with raises(errno.EINVAL, "state: an ONLINE EV profile may only move to OFFLINE (or change EVENT_MASK and "
                              "MODIFY_FIELDS, with EV_PROFILE_MODIFY_ONLINE)"):
        ctl.modify_ev_profile(1, ev_count=32)
    # Modify EV State to DENIED for EVs 13..42
    for i in range(13, 43):
        ctl.ev_op(1, EvOp.MODIFY_EV_STATE, [EvOpEntry(le32(i << 16 | i), 1, state=DENIED)])
    with raises(errno.ENOENT, "entries[0].ev: 0x0d000d on port 2 not found (0 of 1 entries applied)"):
        ctl.ev_op(1, EvOp.MODIFY_EV_STATE, [EvOpEntry(le32(13 << 16 | 13), 2, state=DENIED)])  # the wrong port
    with raises(errno.EINVAL, "ev_profile_id: 2 is not an EV profile of controller h0"):
        ctl.ev_op(2, EvOp.MODIFY_EV_STATE, [EvOpEntry(le32(13 << 16 | 13), 1, state=DENIED)])  # a wrong id
    assert ctl.poll_events(4) == []  # DENIED is never an event (ev_event_mask holds GOOD and ASSUMED_BAD only)
    # Replace the Values of EVs 13..42 by +128 (ONLINE: needs EV_PROFILE_MODIFY_ONLINE, which this device has)
    for i in range(13, 43):
        j = i + 128
        ctl.ev_op(1, EvOp.REPLACE_EV, [EvOpEntry(le32(i << 16 | i), 1, le32(j << 16 | j), 1, DENIED)])
    no_online = exp_controller(opt_attr=OptAttr.EV_EVENT)
    online_format(no_online, 13, EvFormatMode.STEV, [16, 16])
    no_online.modify_ev_profile(1, fields=fields, **step1)
    for i in range(1, ev_count + 1):
        no_online.ev_op(1, EvOp.REPLACE_EV, [EvOpEntry(UNPOPULATED_EV, 0, le32(i << 16 | i), 1, GOOD)])
    no_online.modify_ev_profile(1, state=ONLINE)
    with raises(errno.EPERM, "op: REPLACE_EV on an ONLINE profile needs EV_PROFILE_MODIFY_ONLINE"):
        no_online.ev_op(1, EvOp.REPLACE_EV, [EvOpEntry(le32(13 << 16 | 13), 1, le32(141 << 16 | 141), 1, GOOD)])
    # Query the EV Profile: its attributes, then QUERY_EV_ARRAY
    profile = ctl.ev_profile(1)
    assert (profile.state, profile.mode, profile.fmt.profile_id, profile.ev_count, profile.ev_min_active) == \
        (ONLINE, EvProfileMode.EXP, 13, 64, 16)
    with pytest.raises(MrcApiError, match="^entries: 10 entries, the profile has 64 EVs$") as short:
        ctl.ev_op(1, EvOp.QUERY_EV_ARRAY, [EvOpEntry() for _ in range(10)])
    assert short.value.errno == errno.E2BIG and short.value.needed == 64
    array = [EvOpEntry() for _ in range(profile.ev_count)]
    assert ctl.ev_op(1, EvOp.QUERY_EV_ARRAY, array) == 64
    values = [struct.unpack("<I", entry.ev[:4])[0] for entry in array]
    expect = [(i + 128 if 13 <= i <= 42 else i) for i in range(64)]
    assert values == [v << 16 | v for v in expect] and {entry.port for entry in array} == {1}
    assert [entry.state for entry in array] == [DENIED if 13 <= i <= 42 else GOOD for i in range(64)]


def test_exp_ev_srv6_and_srv6_srh_formats():
    ctl = exp_controller()
    # SRv6: a 32-bit locator and four 16-bit uSIDs (96 bits)
    assert online_format(ctl, 14, EvFormatMode.SRV6, [32, 16, 16, 16, 16]).total_width == 96
    # SRv6+SRH: 32 + 6x16 for the SRv6 address, 32 + 4x16 for the SRH segment (224 bits)
    srh = online_format(ctl, 15, EvFormatMode.SRV6, [32] + [16] * 6 + [32] + [16] * 4)
    assert srh.total_width == 224 and srh.query_fields(12) == (32, 16, 16, 16, 16, 16, 16, 32, 16, 16, 16, 16)
    with raises(errno.E2BIG, "fmt_field_count: 10 is less than the 12 fields"):
        srh.query_fields(10)
    with raises(errno.E2BIG, "fields: total width 34 exceeds the 32 bits STEV carries", RestrictionError):
        ctl.modify_ev_fmt_profile(16, state=OFFLINE, mode="STEV", fields=[32, 2])


# ---- mrc_ctl_gen_ev.md: generated EV profiles

@pytest.mark.parametrize("max_per_profile", [4096, pytest.param(65536, marks=pytest.mark.slow)])
def test_gen_ev_stev_configure_online_query_deny(max_per_profile):
    """With the device's 65536 EVs per profile the example's T0 values 180..255 are generated and denied (slow:
    every EV operation walks all 65536); with 4096 the same steps run, and the cap leaves only T0 0..15."""
    ctl = Controller(attrs=CtlDeviceAttr(ev_max_count_profile=max_per_profile))
    attrs = ctl.query_device()
    online_format(ctl, 13, EvFormatMode.STEV, [8, 4, 4])  # T0 8 bits (180 links), T1 and T2 4 bits
    fields = [EvField(8, 0, 0, 255, 0xFF), EvField(4, 0, 0, 15, 0x0F), EvField(4, 0, 0, 15, 0x0F)]
    ev_count = min((255 + 1) * (15 + 1) * (15 + 1), attrs.ev_max_count_profile)
    ev_count -= ev_count % attrs.ev_count_align
    assert ev_count == max_per_profile
    # Step 1: INIT -> OFFLINE with MODE, FMT_ID, COUNT, MIN_ACTIVE, EVENT_MASK and the fields. The example sets
    # them with .ev_op.op = MRC_CTL_EV_OP_MODIFY_FIELDS; the header has EV_FIELDS_OP with MODIFY_FIELDS.
    step1 = {"state": OFFLINE, "mode": "GEN", "fmt_id": 13, "ev_count": ev_count, "ev_min_active": ev_count // 4,
             "ev_event_mask": GOOD | ASSUMED_BAD}
    with raises(errno.EINVAL, "fields[0].max_val: 256 does not fit the mask's 8 bit(s) (at most 255)", RestrictionError):
        ctl.modify_ev_profile(1, fields=[EvField(8, 0, 0, 256, 0xFF), *fields[1:]], **step1)
    with raises(errno.E2BIG, f"ev_count: {ev_count + 1} exceeds the device's ev_max_count_profile {ev_count}"):
        ctl.modify_ev_profile(1, fields=fields, **{**step1, "ev_count": ev_count + 1})  # past the device's limit
    ctl.modify_ev_profile(1, fields=fields, **step1)
    # Step 2: straight to ONLINE (nothing to populate)
    ctl.modify_ev_profile(1, state=ONLINE)
    profile = ctl.ev_profile(1)
    # Query: attributes, the generation fields (QUERY_FIELDS with room for 10), the generated EV array
    assert (profile.state, profile.mode, profile.fmt.profile_id, profile.ev_count) == (ONLINE, EvProfileMode.GEN, 13, ev_count)
    assert list(profile.fields) == fields
    array = [EvOpEntry() for _ in range(ev_count)]
    assert ctl.ev_op(1, EvOp.QUERY_EV_ARRAY, array) == ev_count
    t0 = [struct.unpack("<I", entry.ev[:4])[0] & 0xFF for entry in array]  # val & 0xff: byte 0, field T0
    to_deny = [entry for entry, value in zip(array, t0) if 180 <= value <= 255]
    assert {entry.port for entry in array} == {0}  # GEN EVs have no port
    if ev_count < 65536:
        assert to_deny == [] and max(t0) == ev_count // 256 - 1  # T0 is generated slowest
        return
    assert len(to_deny) == 76 * 16 * 16
    # Deny the unused T0 values: one MODIFY_EV_STATE per EV in the example; here the last of them (each call
    # walks all 65536 generated EVs, so all 19456 would take hours)
    ctl.ev_op(1, EvOp.MODIFY_EV_STATE, [EvOpEntry(to_deny[-1].ev, to_deny[-1].port, state=DENIED)])
    states = profile.ev_states
    assert states.count(DENIED) == 1 and states[-1] == DENIED


def test_gen_ev_srv6_generated_usids():
    ctl = Controller(attrs=CtlDeviceAttr(ev_max_count_profile=256))
    online_format(ctl, 14, EvFormatMode.SRV6, [32, 16, 16, 16, 16])
    usid = [EvField(16, 0x100 * k, 0, 255, 0xFF) for k in (1, 2, 3, 4)]
    # The example assigns every field to ev_fields_srv6[0] and passes field_count 2: as written, field 1 is all
    # zero, which the header's restrictions refuse. Its intent (a fixed locator and four uSIDs) follows.
    as_written = [EvField(16, 0x400, 0, 255, 0xFF), EvField(0)]
    step = {"state": OFFLINE, "mode": "GEN", "fmt_id": 14, "ev_count": 256, "ev_min_active": 64,
            "ev_event_mask": GOOD | ASSUMED_BAD}
    with raises(errno.EINVAL, "fields[1].width: 0 (a field is at least one bit wide)", RestrictionError):
        ctl.modify_ev_profile(2, fields=as_written, **step)
    ev_count = min(256 ** 4, ctl.attrs.ev_max_count_profile)  # the device caps the 2^32 combinations
    ctl.modify_ev_profile(2, fields=[EvField(32, 0xDEADCAFE), *usid], **{**step, "ev_count": ev_count})
    ctl.modify_ev_profile(2, state=ONLINE)
    array = [EvOpEntry() for _ in range(ev_count)]
    ctl.ev_op(2, EvOp.QUERY_EV_ARRAY, array)
    expanded, _ = expand(array[5].ev, ctl.ev_profile(2).fields, (32, 16, 16, 16, 16))
    assert expanded[:12].hex() == "deadcafe0100020003000405"  # the last uSID generated fastest
    assert ipaddress.IPv6Address(expanded[:16]) == ipaddress.IPv6Address("dead:cafe:100:200:300:405::")


def test_gen_ev_destroying_resources_in_order():
    ctl = Controller()
    online_format(ctl, 13, EvFormatMode.STEV, [8, 4, 4])
    ctl.modify_ev_profile(1, state=OFFLINE, mode="GEN", fmt_id=13, ev_count=16, fields=[EvField(8, 0, 0, 15, 0x0F)])
    ctl.modify_ev_profile(1, state=ONLINE, ev_min_active=4, ev_event_mask=GOOD)
    # The formats go OFFLINE only after their EV profiles (the example's order): otherwise EBUSY
    with raises(errno.EBUSY, "state: EV profile(s) [1] using this format are ONLINE"):
        ctl.modify_ev_fmt_profile(13, state=OFFLINE)
    with raises(errno.EINVAL, "state: an ONLINE EV profile may only move to OFFLINE"
                              " (or change EVENT_MASK and MODIFY_FIELDS, with EV_PROFILE_MODIFY_ONLINE)"):
        ctl.modify_ev_profile(1, state=INIT)  # ONLINE -> INIT skips OFFLINE
    ctl.modify_ev_profile(1, state=OFFLINE)
    ctl.modify_ev_profile(1, state=INIT)
    ctl.modify_ev_fmt_profile(13, state=OFFLINE)
    ctl.modify_ev_fmt_profile(13, state=INIT)
    assert (ctl.ev_profile(1).state, ctl.ev_fmt_profile(13).state, ctl.ev_fmt_profile(13).fields) == (INIT, INIT, ())


# ---- mrc_ctl_ev_events.md: EV state change events

def events_controller(**kwargs):
    ctl = Controller(**kwargs)
    online_format(ctl, 13, EvFormatMode.STEV, [16, 16])
    ctl.modify_ev_profile(13, state=OFFLINE, mode="GEN", fmt_id=13, ev_count=8, fields=[EvField(16, 0, 0, 7, 0x07)])
    ctl.modify_ev_profile(13, state=ONLINE, ev_min_active=0, ev_event_mask=GOOD)
    return ctl


def test_ev_events_register_poll_and_drop_count():
    ctl = events_controller()
    assert ctl.query_device().opt_attr & OptAttr.EV_EVENT
    queue = ctl.create_ev_event_cq(128)
    # Register for EV Events: EVENT_MASK on an existing profile (13). ONLINE it needs EV_PROFILE_MODIFY_ONLINE,
    # which this device has; one without it must take the profile OFFLINE for it, and back ONLINE.
    ctl.modify_ev_profile(13, ev_event_mask=GOOD)
    no_online = events_controller(attrs=CtlDeviceAttr(opt_attr=OptAttr.EV_EVENT))
    with raises(errno.EINVAL, "state: an ONLINE EV profile may only move to OFFLINE (or change EVENT_MASK and "
                              "MODIFY_FIELDS, with EV_PROFILE_MODIFY_ONLINE)"):
        no_online.modify_ev_profile(13, ev_event_mask=GOOD | ASSUMED_BAD)
    with raises(errno.EINVAL, "ev_profile_id: 14 is not an EV profile of controller h0"):
        ctl.ev_profile(14)  # a wrong id
    ctl.modify_ev_profile(13, state=OFFLINE)
    with raises(errno.EINVAL, "ev_event_mask: 0x04 has bits other than GOOD (0x01) and ASSUMED_BAD (0x02)",
                RestrictionError):
        ctl.modify_ev_profile(13, ev_event_mask=DENIED)
    ctl.modify_ev_profile(13, ev_event_mask=GOOD | ASSUMED_BAD)
    ctl.modify_ev_profile(13, state=ONLINE)
    profile = ctl.ev_profile(13)
    evs = [entry.ev for entry in _array(ctl, 13, 8)]
    # state changes: the device marks two EVs ASSUMED_BAD, the controller denies one (no event) and revives one
    assert device_set_state(profile, evs[1], 0, ASSUMED_BAD, ctl.events)
    assert device_set_state(profile, evs[2], 0, ASSUMED_BAD, ctl.events)
    ctl.ev_op(13, EvOp.MODIFY_EV_STATE, [EvOpEntry(evs[3], state=DENIED), EvOpEntry(evs[1], state=GOOD)])
    # Poll the EV Event CQ, 4 at a time, until it returns 0
    seen = []
    while batch := ctl.poll_events(4):
        seen += [(event.profile_id, event.ev, event.port, event.state, event.drop_count) for event in batch]
    assert seen == [(13, evs[1], 0, ASSUMED_BAD, 0), (13, evs[2], 0, ASSUMED_BAD, 0), (13, evs[1], 0, GOOD, 0)]
    assert queue is ctl.events
    with raises(errno.EINVAL, "max_events: 0 is not a positive event count"):
        ctl.poll_events(0)


@pytest.mark.parametrize("opt, drop_count", [(OptAttr.EV_EVENT | OptAttr.EV_EVENT_PRECISE_DROP_CNT, 3),
                                             (OptAttr.EV_EVENT, 1)])
def test_ev_events_understanding_the_drop_count(opt, drop_count):
    ctl = events_controller(attrs=CtlDeviceAttr(opt_attr=opt), event_capacity=2)
    profile = ctl.ev_profile(13)
    evs = [entry.ev for entry in _array(ctl, 13, 8)]
    for ev in evs[:5]:  # five ASSUMED_BAD, then GOOD again: 5 events for a queue of 2
        device_set_state(profile, ev, 0, ASSUMED_BAD, ctl.events)
    ctl.modify_ev_profile(13, state=OFFLINE)
    ctl.modify_ev_profile(13, ev_event_mask=GOOD | ASSUMED_BAD, state=ONLINE)
    for ev in evs[:5]:
        device_set_state(profile, ev, 0, GOOD, ctl.events)
    events = ctl.poll_events(4)
    assert len(events) == 2 and events[0].drop_count == drop_count and events[1].drop_count == 0
    assert ctl.poll_events(4) == []


def _array(ctl, profile_id, count):
    array = [EvOpEntry() for _ in range(count)]
    ctl.ev_op(profile_id, EvOp.QUERY_EV_ARRAY, array)
    return array


# ---- mrc_ctl_ev_probes.md: EV probes

def probe_requests(first_id=1):
    # inet_pton(AF_INET6, "10.0.0.1", ...) as the example writes it would fail: an IPv4 RoCEv2 GID is the
    # IPv4-mapped IPv6 address, which is what an IPv4 string means here.
    return [EpRequest(first_id, "10.0.0.1", "10.0.0.2", EvFormatMode.STEV, le32(0x12345678), 1),
            EpRequest(first_id + 1, "10.0.0.1", "10.0.0.3", EvFormatMode.STEV, le32(0x87654321), 1)]


def test_ev_probes_send_and_receive():
    ctl = Controller()
    assert ctl.query_device().opt_attr & OptAttr.EP_OP_EV_PROBE
    batch = ctl.ep_batch(EpOpType.EV_PROBE, probe_requests(), rsp_timeout_ns=2_000_000, req_tc=0, now_ns=0)
    assert batch.requests[0].sgid == ipaddress.IPv6Address("::ffff:10.0.0.1")
    assert batch.requests[1].req_ev[:4] == bytes.fromhex("21436587")
    batch.on_response(EpResponse(2, 2, 41_000, True), 41_000)
    batch.on_response(EpResponse(1, 1, 52_000, True), 52_000)
    responses, err = batch.result(52_000)
    assert err == 0 and [(r.req_id, r.port, r.rtt_ns, r.adj_svc_time) for r in responses] == \
        [(2, 2, 41_000, True), (1, 1, 52_000, True)]  # arrival order; match them by req_id


def test_ev_probes_timeout_with_fewer_responses_and_the_errors():
    ctl = Controller()
    batch = ctl.ep_batch(EpOpType.EV_PROBE, probe_requests(), 2_000_000, 0, now_ns=0)
    batch.on_response(EpResponse(1, 1, 30_000), 30_000)
    responses, err = batch.result(2_000_000)
    assert err == errno.ETIMEDOUT and len(responses) == 1  # "Only received 1 of 2 responses (timeout)"
    with raises(errno.EAGAIN, "req_id: 2 is held back until 1002000000 ns (late responses)"):
        ctl.ep_batch(EpOpType.EV_PROBE, probe_requests(2), 2_000_000, 0, now_ns=3_000_000)
    ctl.ep_batch(EpOpType.EV_PROBE, probe_requests(3), 2_000_000, 0, now_ns=3_000_000)  # fresh ids are fine
    bad = [EpRequest(9, "10.0.0.1", "10.0.0.2", EvFormatMode.STEV, le32(1) + b"\x01", 1)]
    with raises(errno.EINVAL, "req[0].req_ev: STEV carries 4 bytes, the EV has more (0100000001)"):
        ctl.ep_batch(EpOpType.EV_PROBE, bad, 2_000_000)
    with raises(errno.ENOTSUP, "op_type: EV_PROBE needs MRC_CTL_OPT_CAP_EP_OP_EV_PROBE"):
        Controller(attrs=CtlDeviceAttr(opt_attr=OptAttr.EV_EVENT)).ep_batch(EpOpType.EV_PROBE, probe_requests(), 1)


# ---- mrc_qp.md: QP management

def qp_controller():
    """Profiles a controller set up: EV profile 1 (GEN over STEV format 13) and CC profile 2, both ONLINE."""
    ctl = events_controller()
    ctl.modify_ev_profile(1, state=OFFLINE, mode="GEN", fmt_id=13, ev_count=4, fields=[EvField(16, 0, 0, 3, 0x03)])
    ctl.modify_ev_profile(1, state=ONLINE, ev_min_active=1, ev_event_mask=GOOD | ASSUMED_BAD)
    ctl.modify_cc_profile(2, state=OFFLINE, algorithm="uet-1.0-nscc")
    ctl.modify_cc_profile(2, state=ONLINE, config={"base_rtt": 12_000})
    return ctl


def test_mrc_qp_create_init_rtr_rts_query_destroy():
    ctl = qp_controller()
    device = ctl.device  # Query the Device: MRC supported, the WRITE_IMM limits
    assert device.mrc_protocol_version & 1 and device.max_wimm >= 128 and device.max_wimm_dest >= 128
    qp = ctl.create_qp(max_send_wr=128, max_recv_wr=128)  # Create an MRC QP: it is in RST
    assert qp.state == QpState.RST
    with raises(errno.EINVAL, "state: RST -> RTR is not a QP transition (RST -> INIT -> RTR -> RTS, any -> RST or ERR)"):
        qp.modify(state=QpState.RTR, max_wimm_dest=128, mpr_dest=8)
    # Modify to INIT: the EV/CC profile ids learned out of band, no hint
    with raises(errno.EINVAL, "ev_profile_id: 7 is not an EV profile of controller h0"):
        qp.modify(state=QpState.INIT, ev_profile_id=7, cc_profile_id=2)  # a wrong id
    with raises(errno.EINVAL, "cc_profile_id: RST -> INIT needs CC_PROFILE_ID"):
        qp.modify(state=QpState.INIT, ev_profile_id=1)  # a missing attribute
    qp.modify(state=QpState.INIT, ibv_attrs={"STATE"}, ev_profile_id=1, cc_profile_id=2, hint=None)
    assert ctl.cc_profile(2).active_qps == 1 and ctl.ev_active_qps[1] == 1
    with raises(errno.EINVAL, "state: receive WRs are posted from RTR on, the QP is INIT"):
        qp.post_recv()
    # Modify to RTR. The example also sets MPR and MAX_WIMM here (and joins the mask bits with a comma); the
    # header takes those at RTS, so RTR gets MPR_DEST, MAX_WIMM_DEST and CAP.
    with raises(errno.EINVAL, "max_wimm: MAX_WIMM is not an attribute of INIT -> RTR (it takes MAX_WIMM_DEST, MPR_DEST, "
                              "CAP)"):
        qp.modify(state=QpState.RTR, mpr=8, mpr_dest=8, max_wimm=128, max_wimm_dest=128, cap=QpCap.DYNAMIC_MPR)
    qp.modify(state=QpState.RTR, mpr_dest=8, max_wimm_dest=128, cap=QpCap.DYNAMIC_MPR)
    qp.post_recv(128)  # receives for WRITE_WITH_IMM, posted in advance
    with raises(errno.EINVAL, "state: send WRs are posted in RTS, the QP is RTR"):
        qp.post_send(WrOpcode.RDMA_WRITE)
    # Modify to RTS
    with raises(errno.EINVAL, "ibv_attrs: IBV_QP_TIMEOUT is not supported by mrc_modify_qp (use timeout= (MRC_QP_TIMEOUT))"):
        qp.modify(state=QpState.RTS, ibv_attrs={"STATE", "TIMEOUT"}, mpr=8, max_wimm=128, timeout=8,
                  retry=RetryCnt(7, 25))
    qp.modify(state=QpState.RTS, mpr=8, max_wimm=128, timeout=8, retry=RetryCnt(linear_cnt=7, exp_cnt=25))
    qp.post_send(WrOpcode.RDMA_WRITE)
    qp.post_send(WrOpcode.RDMA_WRITE_WITH_IMM)
    # Querying an MRC QP (any state)
    state, attrs = qp.query()
    assert state == QpState.RTS and attrs == {"ev_profile_id": 1, "cc_profile_id": 2, "mpr_dest": 8,
                                              "max_wimm_dest": 128, "cap": QpCap.DYNAMIC_MPR, "mpr": 8,
                                              "max_wimm": 128, "timeout": 8, "retry": (7, 25)}
    assert qp.timeout_ns == 262_144 and qp.transport_config()["retry_infinite"]
    # Destroying Resources: the profiles are free again
    with raises(errno.EBUSY, "state: 1 active QP(s) use CC profile 2"):
        ctl.modify_cc_profile(2, state=OFFLINE)
    ctl.destroy_qp(qp)
    assert ctl.cc_profile(2).active_qps == 0 and ctl.ev_active_qps[1] == 0
    ctl.modify_cc_profile(2, state=OFFLINE)
