"""Port admin state (mrc_emu.api.ports): 1-based ports from phy_port_mask, DISABLED <-> ENABLED,
a disabled port reads DOWN, and the EVs on it stop carrying data at once."""

import pytest

from mrc_emu.api import EvEventMask, EvField, EvFormatMode, EvFormatProfile, EvProfile, EvProfileMode, MrcApiError, ProfileState
from mrc_emu.api.events import EvState
from mrc_emu.api.evops import EvOp, EvOpEntry, data_evs, ev_op
from mrc_emu.api.ports import PortAdmin, PortAdminState, PortAttr, PortState

DISABLED, ENABLED = PortAdminState.DISABLED, PortAdminState.ENABLED


def ev(n: int) -> bytes:
    return n.to_bytes(4, "big") + bytes(28)


def exp_profile() -> EvProfile:
    fmt = EvFormatProfile(1)
    fmt.modify(state=ProfileState.OFFLINE, mode=EvFormatMode.STEV, fields=[32])
    profile = EvProfile(5)
    profile.modify(state=ProfileState.OFFLINE, mode=EvProfileMode.EXP, fmt=fmt, ev_count=4,
                   fields=[EvField(width=32, mask=0xFFFFFFFF, max_val=0xFFFFFFFF)], ev_min_active=1,
                   ev_event_mask=EvEventMask.GOOD)
    return profile


def test_ports_come_from_the_mask_and_start_enabled():
    ports = PortAdmin(0b1010)
    assert ports.ports == [1, 3]
    assert [ports.query_port(p) for p in ports.ports] == [ENABLED, ENABLED]
    assert ports.port_state(1) == PortState.ACTIVE


def test_disable_then_enable_and_a_disabled_port_reads_down():
    ports = PortAdmin(0b110)
    ports.modify_port(2, DISABLED, PortAttr.ADMIN_STATE)
    assert (ports.query_port(2), ports.port_state(2), ports.port_state(1)) == (DISABLED, PortState.DOWN, PortState.ACTIVE)
    ports.modify_port(2, DISABLED)  # already disabled: a no-op
    ports.modify_port(2, ENABLED)
    assert ports.port_state(2) == PortState.ACTIVE
    ports.link_up[2] = False
    assert (ports.query_port(2), ports.port_state(2)) == (ENABLED, PortState.DOWN)


def test_the_evs_of_a_disabled_port_stop_carrying_data():
    profile = exp_profile()
    entries = [EvOpEntry(ev_new=ev(n), port_new=port, state=EvState.GOOD) for n, port in ((1, 1), (2, 2), (3, 1), (4, 2))]
    ev_op(profile, EvOp.REPLACE_EV, entries)
    ports = PortAdmin(0b110)
    ports.modify_port(2, DISABLED)
    assert data_evs(profile, ports) == [(ev(1), 1), (ev(3), 1)]
    ports.modify_port(2, ENABLED)
    assert len(data_evs(profile, ports)) == 4
    assert ports.carries_data(0) and not ports.carries_data(7)


@pytest.mark.parametrize("call, message", [
    (lambda p: p.modify_port(0, DISABLED), r"^port_num: 0 is not a port of this device \(ports \[1, 2\]\)$"),
    (lambda p: p.modify_port(3, DISABLED), r"^port_num: 3 is not a port"),
    (lambda p: p.modify_port(True, DISABLED), r"^port_num: True is not a port"),
    (lambda p: p.modify_port(1, 2), r"^port_admin_state: 2 is not DISABLED \(0\) or ENABLED \(1\)$"),
    (lambda p: p.modify_port(1, False), r"^port_admin_state: False is not DISABLED"),
    (lambda p: p.modify_port(1, DISABLED, 0), r"^attr_mask: 0 is not ADMIN_STATE \(0x01\), the only port attribute$"),
    (lambda p: p.modify_port(1, DISABLED, 3), r"^attr_mask: 3 is not ADMIN_STATE"),
    (lambda p: p.query_port(1, 2), r"^attr_mask: 2 is not ADMIN_STATE"),
    (lambda p: p.query_port(9), r"^port_num: 9 is not a port"),
    (lambda p: p.port_state(9), r"^port_num: 9 is not a port"),
])
def test_errors_are_einval_and_change_nothing(call, message):
    ports = PortAdmin(0b110)
    with pytest.raises(MrcApiError, match=message) as info:
        call(ports)
    assert info.value.errno_name == "EINVAL"
    assert ports.admin == {1: ENABLED, 2: ENABLED}


@pytest.mark.parametrize("mask, message", [(0b11, "bit 0 is set, but ports are 1-based"), (-1, "is not a mask"),
                                           ("2", "is not a mask")])
def test_bad_port_masks(mask, message):
    with pytest.raises(MrcApiError, match="^phy_port_mask: .*" + message):
        PortAdmin(mask)
