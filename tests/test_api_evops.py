"""EV operations and EV events on an EV profile (mrc_emu.api.evops, .events): every op, the batch
stopping at its first failing entry, the state rules (DENIED never carries data, ev_min_active)
and the bounded event queue with its drop count and mask."""

import errno

import pytest

from mrc_emu.api import EvEventMask, EvField, EvFormatMode, EvFormatProfile, EvProfile, EvProfileMode, ProfileState
from mrc_emu.api.events import EvEvent, EvEventQueue, EvState
from mrc_emu.api.evops import EvOp, EvOpEntry, EvOpError, EvOpFlag, data_evs, device_set_state, ev_op, ev_states
from mrc_emu.api.profiles import UNPOPULATED

OFFLINE, ONLINE = ProfileState.OFFLINE, ProfileState.ONLINE
BOTH = EvEventMask.GOOD | EvEventMask.ASSUMED_BAD


def ev(n: int) -> bytes:
    return n.to_bytes(4, "big") + bytes(28)


def fmt() -> EvFormatProfile:
    f = EvFormatProfile(1)
    f.modify(state=OFFLINE, mode=EvFormatMode.STEV, fields=[32])
    f.modify(state=ONLINE)
    return f


def exp_profile(count=4, min_active=1, mask=BOTH) -> EvProfile:
    p = EvProfile(5)
    p.modify(state=OFFLINE, mode=EvProfileMode.EXP, fmt=fmt(), ev_count=count, fields=[EvField(width=32, mask=0xFFFFFFFF,
                                                                                               max_val=0xFFFFFFFF)],
             ev_min_active=min_active, ev_event_mask=mask)
    return p


def fill(p: EvProfile, values=(1, 2, 3, 4), port=1) -> None:
    entries = [EvOpEntry(ev_new=ev(v), port_new=port, state=EvState.GOOD) for v in values]
    assert ev_op(p, EvOp.REPLACE_EV, entries) == len(values)


def array(p: EvProfile) -> list[tuple[bytes, int, EvState]]:
    entries = [EvOpEntry() for _ in range(p.ev_count)]
    ev_op(p, EvOp.QUERY_EV_ARRAY, entries)
    return [(e.ev, e.port, e.state) for e in entries]


def test_replace_fills_unpopulated_slots_then_the_profile_goes_online():
    p = exp_profile()
    assert array(p) == [(UNPOPULATED, 0, EvState.UNKNOWN)] * 4
    fill(p)
    assert [(e[0][:4], e[1], e[2]) for e in array(p)] == [(ev(v)[:4], 1, EvState.GOOD) for v in (1, 2, 3, 4)]
    p.modify(state=ONLINE)
    assert p.state == ONLINE


def test_replace_one_copy_or_all_copies():
    p = exp_profile()
    fill(p, (9, 9, 9, 4))
    ev_op(p, EvOp.REPLACE_EV, [EvOpEntry(ev=ev(9), port=1, ev_new=ev(7), port_new=2, state=EvState.DENIED)])
    assert [(a[0], a[1], a[2]) for a in array(p)][:2] == [(ev(7), 2, EvState.DENIED), (ev(9), 1, EvState.GOOD)]
    ev_op(p, EvOp.REPLACE_EV, [EvOpEntry(ev=ev(9), port=1, ev_new=ev(8), port_new=1, state=EvState.GOOD,
                                         flags=EvOpFlag.ALL_COPIES)])
    assert [a[0] for a in array(p)] == [ev(7), ev(8), ev(8), ev(4)]


def test_a_batch_stops_at_the_first_failing_entry_keeping_the_earlier_ones():
    p = exp_profile()
    fill(p)
    entries = [EvOpEntry(ev=ev(1), port=1, state=EvState.DENIED), EvOpEntry(ev=ev(2), port=1, state=EvState.DENIED),
               EvOpEntry(ev=ev(99), port=1, state=EvState.DENIED), EvOpEntry(ev=ev(3), port=1, state=EvState.DENIED)]
    with pytest.raises(EvOpError, match=r"^entries\[2\]\.ev: 0x00000063 on port 1 not found \(2 of 4 entries applied\)$") as info:
        ev_op(p, EvOp.MODIFY_EV_STATE, entries)
    assert (info.value.errno, info.value.completed, info.value.index) == (errno.ENOENT, 2, 2)
    assert [a[2] for a in array(p)] == [EvState.DENIED, EvState.DENIED, EvState.GOOD, EvState.GOOD]


def test_a_denied_ev_never_carries_data_and_the_device_cannot_lift_it():
    p = exp_profile()
    fill(p)
    p.modify(state=ONLINE)
    ev_op(p, EvOp.MODIFY_EV_STATE, [EvOpEntry(ev=ev(2), port=1, state=EvState.DENIED)])
    assert (ev(2), 1) not in data_evs(p) and len(data_evs(p)) == 3
    assert not EvState.DENIED.carries_data and not EvState.ASSUMED_BAD.carries_data and EvState.GOOD.carries_data
    assert device_set_state(p, ev(2), 1, EvState.GOOD) is False
    assert ev_states(p)[1] == EvState.DENIED
    ev_op(p, EvOp.MODIFY_EV_STATE, [EvOpEntry(ev=ev(2), port=1, state=EvState.GOOD)])
    assert (ev(2), 1) in data_evs(p)


def test_ev_min_active_caps_assumed_bad_for_controller_and_device():
    p = exp_profile(min_active=2)
    fill(p)
    assert device_set_state(p, ev(1), 1, EvState.ASSUMED_BAD) is True
    assert device_set_state(p, ev(2), 1, EvState.ASSUMED_BAD) is True
    assert device_set_state(p, ev(3), 1, EvState.ASSUMED_BAD) is False  # would leave 1 GOOD < 2
    with pytest.raises(EvOpError, match=r"^entries\[0\]\.state: ASSUMED_BAD would leave 1 GOOD EVs, fewer than ev_min_active 2"):
        ev_op(p, EvOp.MODIFY_EV_STATE, [EvOpEntry(ev=ev(4), port=1, state=EvState.ASSUMED_BAD)])
    ev_op(p, EvOp.MODIFY_EV_STATE, [EvOpEntry(ev=ev(4), port=1, state=EvState.DENIED)])  # DENIED is the controller's call
    assert [s for s in ev_states(p)] == [EvState.ASSUMED_BAD, EvState.ASSUMED_BAD, EvState.GOOD, EvState.DENIED]
    with pytest.raises(Exception, match="the device sets only GOOD or ASSUMED_BAD"):
        device_set_state(p, ev(3), 1, EvState.DENIED)


def test_query_ev_state_and_a_short_query_array_is_e2big_with_the_needed_count():
    p = exp_profile()
    fill(p)
    entry = EvOpEntry(ev=ev(3), port=1)
    assert ev_op(p, EvOp.QUERY_EV_STATE, [entry]) == 1 and entry.state == EvState.GOOD
    with pytest.raises(EvOpError, match=r"^entries: 2 entries, the profile has 4 EVs$") as info:
        ev_op(p, EvOp.QUERY_EV_ARRAY, [EvOpEntry(), EvOpEntry()])
    assert (info.value.errno, info.value.needed) == (errno.E2BIG, 4)


def test_gen_profile_evs_have_states_and_cannot_be_replaced():
    f = EvFormatProfile(2)
    f.modify(state=OFFLINE, mode=EvFormatMode.STEV, fields=[8])
    f.modify(state=ONLINE)
    p = EvProfile(6)
    p.modify(state=OFFLINE, mode=EvProfileMode.GEN, fmt=f, ev_count=4, fields=[EvField(width=8, mask=0x03, max_val=3)],
             ev_min_active=0, ev_event_mask=BOTH)
    compact = [a[0] for a in array(p)]
    assert [c[0] for c in compact] == [0x00, 0x40, 0x80, 0xC0]
    assert [a[2] for a in array(p)] == [EvState.GOOD] * 4  # compact 0x00 is an EV here, not UNPOPULATED
    ev_op(p, EvOp.MODIFY_EV_STATE, [EvOpEntry(ev=compact[1], port=0, state=EvState.DENIED),
                                   EvOpEntry(ev=compact[0], port=0, state=EvState.DENIED)])
    assert [a[2] for a in array(p)][:2] == [EvState.DENIED, EvState.DENIED]
    p.modify(fields=[EvField(width=8, init_val=0x10, mask=0x03, max_val=3)])  # new fields: new EVs, states afresh
    assert [a[2] for a in array(p)] == [EvState.GOOD] * 4
    with pytest.raises(EvOpError, match="^mode: REPLACE_EV needs an EXP profile") as info:
        ev_op(p, EvOp.REPLACE_EV, [EvOpEntry(ev=compact[0], ev_new=ev(1), port_new=1, state=EvState.GOOD)])
    assert info.value.errno == errno.EINVAL


@pytest.mark.parametrize("entry, message, code", [
    (EvOpEntry(ev=ev(1), port=1, state=EvState.UNKNOWN), r"entries\[0\]\.state: .* is not GOOD, ASSUMED_BAD or DENIED",
     errno.EINVAL),
    (EvOpEntry(ev=ev(1), port=1, state=None), r"entries\[0\]\.state: None is not", errno.EINVAL),
    (EvOpEntry(ev=ev(1), port=1, state=EvState.GOOD, flags=0x2), r"entries\[0\]\.flags: 2 has bits other than ALL_COPIES",
     errno.EINVAL),
    (EvOpEntry(ev=bytes(33), port=1, state=EvState.GOOD), r"entries\[0\]\.ev: expected at most 32 bytes", errno.EINVAL),
    (EvOpEntry(ev=ev(1), port=256, state=EvState.GOOD), r"entries\[0\]\.port: 256 is not a port", errno.EINVAL),
    (EvOpEntry(ev=ev(1), port=2, state=EvState.GOOD), r"entries\[0\]\.ev: 0x00000001 on port 2 not found", errno.ENOENT),
    (EvOpEntry(state=EvState.GOOD), r"entries\[0\]\.ev: 0x00 on port 0 not found", errno.ENOENT),
])
def test_modify_ev_state_entry_errors(entry, message, code):
    p = exp_profile()
    fill(p)
    before = list(ev_states(p))
    with pytest.raises(EvOpError, match="^" + message) as info:
        ev_op(p, EvOp.MODIFY_EV_STATE, [entry])
    assert (info.value.errno, info.value.completed) == (code, 0)
    assert ev_states(p) == before


def test_modify_state_of_an_unpopulated_slot_is_enoent():
    p = exp_profile()
    with pytest.raises(EvOpError, match=r"^entries\[0\]\.ev: UNPOPULATED slots have no state") as info:
        ev_op(p, EvOp.MODIFY_EV_STATE, [EvOpEntry(state=EvState.GOOD)])
    assert info.value.errno == errno.ENOENT


def test_replace_entry_errors():
    p = exp_profile()
    with pytest.raises(EvOpError, match=r"^entries\[0\]\.port_new: 0 is UNPOPULATED's port"):
        ev_op(p, EvOp.REPLACE_EV, [EvOpEntry(ev_new=ev(1), port_new=0, state=EvState.GOOD)])
    with pytest.raises(EvOpError, match=r"^entries\[0\]\.ev_new: UNPOPULATED \(value 0, port 0\) is not an EV"):
        ev_op(p, EvOp.REPLACE_EV, [EvOpEntry(ev_new=bytes(4), port_new=0, state=EvState.GOOD)])
    with pytest.raises(EvOpError, match=r"^entries\[0\]\.ev_new: expected at most 32 bytes"):
        ev_op(p, EvOp.REPLACE_EV, [EvOpEntry(ev_new="x", port_new=1, state=EvState.GOOD)])
    with pytest.raises(EvOpError, match=r"^entries\[0\]\.state: None"):
        ev_op(p, EvOp.REPLACE_EV, [EvOpEntry(ev_new=ev(1), port_new=1)])
    assert array(p) == [(UNPOPULATED, 0, EvState.UNKNOWN)] * 4


def test_call_errors():
    p = exp_profile()
    fill(p)
    with pytest.raises(EvOpError, match="^op: 9 is not one of REPLACE_EV"):
        ev_op(p, 9, [])
    with pytest.raises(EvOpError, match="^entries: 3 entries exceed ev_op_max_entries 2") as info:
        ev_op(p, EvOp.QUERY_EV_STATE, [EvOpEntry(ev=ev(1), port=1)] * 3, max_entries=2)
    assert info.value.errno == errno.E2BIG
    p.modify(state=ONLINE)
    with pytest.raises(EvOpError, match="^op: REPLACE_EV on an ONLINE profile needs EV_PROFILE_MODIFY_ONLINE") as info:
        ev_op(p, EvOp.REPLACE_EV, [EvOpEntry(ev=ev(1), port=1, ev_new=ev(5), port_new=1, state=EvState.GOOD)])
    assert info.value.errno == errno.EPERM
    ev_op(p, EvOp.REPLACE_EV, [EvOpEntry(ev=ev(1), port=1, ev_new=ev(5), port_new=1, state=EvState.GOOD)],
          modify_online=True)
    assert array(p)[0][0] == ev(5)
    init = EvProfile(8)
    with pytest.raises(EvOpError, match="^state: EV operations need an OFFLINE or ONLINE profile, profile 8 is INIT"):
        ev_op(init, EvOp.QUERY_EV_ARRAY, [])
    auto = EvProfile(9)
    auto.modify(state=OFFLINE, mode=EvProfileMode.AUTO)
    assert ev_op(auto, EvOp.QUERY_EV_ARRAY, []) == 0
    with pytest.raises(EvOpError, match="^mode: an AUTO profile has no EVs to MODIFY_EV_STATE"):
        ev_op(auto, EvOp.MODIFY_EV_STATE, [EvOpEntry(ev=ev(1), port=1, state=EvState.GOOD)])


def test_back_to_init_forgets_the_evs_and_their_states():
    p = exp_profile()
    fill(p)
    p.modify(state=ProfileState.INIT)
    assert (p.explicit, p.ev_ports, p.ev_states) == ([], [], [])


# --- events ---

def test_state_changes_become_events_unless_masked():
    p = exp_profile(mask=EvEventMask.ASSUMED_BAD)
    fill(p)
    queue = EvEventQueue(8)
    ev_op(p, EvOp.MODIFY_EV_STATE, [EvOpEntry(ev=ev(1), port=1, state=EvState.ASSUMED_BAD),
                                   EvOpEntry(ev=ev(1), port=1, state=EvState.ASSUMED_BAD),  # no change: no event
                                   EvOpEntry(ev=ev(1), port=1, state=EvState.GOOD),  # GOOD masked
                                   EvOpEntry(ev=ev(2), port=1, state=EvState.DENIED)], events=queue)  # never in a mask
    assert device_set_state(p, ev(3), 1, EvState.ASSUMED_BAD, events=queue)
    assert queue.poll(10) == [EvEvent(5, ev(1), 1, EvState.ASSUMED_BAD, 0), EvEvent(5, ev(3), 1, EvState.ASSUMED_BAD, 0)]
    assert queue.poll(10) == []


def test_a_full_queue_counts_drops_reported_with_the_next_event_read():
    queue = EvEventQueue(2)
    for n in range(5):
        queue.post(5, BOTH, ev(n), 1, EvState.ASSUMED_BAD)
    assert len(queue) == 2
    first = queue.poll(1)
    assert first == [EvEvent(5, ev(0), 1, EvState.ASSUMED_BAD, 3)]
    assert queue.poll(5) == [EvEvent(5, ev(1), 1, EvState.ASSUMED_BAD, 0)]
    queue.post(5, BOTH, ev(9), 1, EvState.GOOD)
    assert queue.poll(5)[0].drop_count == 0


def test_without_precise_drop_count_the_drop_count_is_a_flag():
    queue = EvEventQueue(1, precise_drop_count=False)
    for n in range(4):
        queue.post(5, BOTH, ev(n), 1, EvState.GOOD)
    assert queue.poll(1)[0].drop_count == 1


def test_a_masked_event_is_not_counted_as_a_drop():
    queue = EvEventQueue(1)
    queue.post(5, BOTH, ev(0), 1, EvState.GOOD)
    assert queue.post(5, EvEventMask.GOOD, ev(1), 1, EvState.ASSUMED_BAD) is False
    assert queue.poll(1)[0].drop_count == 0


@pytest.mark.parametrize("bad", [0, -1, True, "2"])
def test_queue_argument_errors(bad):
    with pytest.raises(Exception, match="^capacity: .* is not a positive event count$"):
        EvEventQueue(bad)
    with pytest.raises(Exception, match="^max_events: .* is not a positive event count$"):
        EvEventQueue(1).poll(bad)
