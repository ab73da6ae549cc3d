"""The controller of one host (mrc_emu.api.controller): device attributes, profiles by id with the
device's limits, EBUSY while QPs or EV profiles use a profile, EV operations with the device's
ev_op_max_entries and its event queue, ports, QPs and endpoint batches."""

import contextlib
import errno
import re

import pytest

from mrc_emu.api import EvField, EvOp, EvOpEntry, EvState, MrcApiError, PortAdminState, ProfileState
from mrc_emu.api.controller import Controller, CtlDeviceAttr, OptAttr, port_mask
from mrc_emu.api.endpoint import EpOpType, EpRequest, EpResponse
from mrc_emu.api.qp import QpState

OFFLINE, ONLINE, INIT = ProfileState.OFFLINE, ProfileState.ONLINE, ProfileState.INIT
STEV_FIELDS = [EvField(16, mask=0xFFFF, max_val=0xFFFF), EvField(16, mask=0xFFFF, max_val=0xFFFF)]


@contextlib.contextmanager
def raises(errno_value, message):
    with pytest.raises(MrcApiError, match="^" + re.escape(message) + "$") as excinfo:
        yield excinfo
    assert excinfo.value.errno == errno_value, excinfo.value.errno_name


def stev_format(ctl, fmt_id=13):
    ctl.modify_ev_fmt_profile(fmt_id, state=OFFLINE, mode="STEV", fields=[16, 16])
    ctl.modify_ev_fmt_profile(fmt_id, state=ONLINE)


def gen_profile(ctl, profile_id=1, fmt_id=13, count=4, online=True):
    fields = [EvField(16, init_val=0xAB00, mask=0xFF, max_val=0xFF), EvField(16, init_val=7)]
    ctl.modify_ev_profile(profile_id, state=OFFLINE, mode="GEN", fmt_id=fmt_id, ev_count=count, fields=fields)
    if online:
        ctl.modify_ev_profile(profile_id, state=ONLINE, ev_min_active=1, ev_event_mask=3)
    return ctl.ev_profile(profile_id)


def nscc(ctl, profile_id=2):
    ctl.modify_cc_profile(profile_id, state=OFFLINE, algorithm="uet-1.0-nscc")
    ctl.modify_cc_profile(profile_id, state=ONLINE, config={"base_rtt": 10_000})


def test_query_device_ports_are_bits_1_to_planes():
    ctl = Controller("h3", planes=4)
    attrs = ctl.query_device()
    assert attrs.phy_port_mask == 0b11110 == port_mask(4) and ctl.ports.ports == [1, 2, 3, 4]
    assert attrs.algorithms == ("uet-1.0-nscc",) and attrs.opt_attr & OptAttr.EP_OP_EV_PROBE
    assert attrs.ev_free_count == attrs.ev_max_count
    with raises(errno.EINVAL, "planes: 0 is not 1..31"):
        port_mask(0)


def test_profiles_by_id_created_on_first_modify_or_by_create():
    ctl = Controller()
    stev_format(ctl)
    gen_profile(ctl, 1)
    assert ctl.ev_profile(1).fmt is ctl.ev_fmt_profile(13)
    assert ctl.query_device().ev_free_count == ctl.attrs.ev_max_count - 4
    assert ctl.create_ev_profile().profile_id == 2 and ctl.create_cc_profile(7).profile_id == 7
    with raises(errno.EINVAL, "ev_profile_id: 2 exists already"):
        ctl.create_ev_profile(2)
    with raises(errno.EINVAL, "ev_fmt_profile_id: 99 is not an EV format profile of controller h0"):
        ctl.modify_ev_profile(3, state=OFFLINE, mode="GEN", fmt_id=99, ev_count=1, fields=[EvField(8)])
    with raises(errno.EINVAL, "fmt: a controller takes the format by id (fmt_id=, FMT_ID)"):
        ctl.modify_ev_profile(3, fmt=ctl.ev_fmt_profile(13))
    with raises(errno.EINVAL, "cc_profile_id: 'x' is not a CC profile of controller h0"):
        ctl.cc_profile("x")
    with raises(errno.EINVAL, "algorithm: INIT -> OFFLINE needs ALGORITHM"):
        ctl.modify_cc_profile(8, state=OFFLINE)
    assert 3 not in ctl.ev_profiles and 8 not in ctl.cc_profiles  # a failed first modify creates nothing
    with raises(errno.EINVAL, "ev_profile_id: -1 is not a u64"):
        ctl.create_ev_profile(-1)


def test_the_device_limits():
    ctl = Controller(attrs=CtlDeviceAttr(ev_max_fmt_profiles=1, ev_max_profiles=2, cc_max_profiles=1, ev_max_count=6,
                                         ev_max_count_profile=4, ev_count_align=4,
                                         ev_fmt_mode_mask=1, ev_mode_mask=6))
    stev_format(ctl)
    with raises(errno.ENOSPC, "ev_fmt_profile_id: the device holds at most 1 EV format profiles"):
        ctl.create_ev_fmt_profile()
    ctl.modify_ev_fmt_profile(13, state=OFFLINE)
    with raises(errno.EINVAL, "mode: 'UDP' is not in the device's ev_fmt_mode_mask 0x1"):
        ctl.modify_ev_fmt_profile(13, mode="UDP")
    ctl.modify_ev_fmt_profile(13, state=ONLINE)
    with raises(errno.EINVAL, "mode: 'AUTO' is not in the device's ev_mode_mask 0x6"):
        ctl.modify_ev_profile(1, state=OFFLINE, mode="AUTO")
    with raises(errno.E2BIG, "ev_count: 5 exceeds the device's ev_max_count_profile 4"):
        gen_profile(ctl, 1, count=5)
    with raises(errno.EINVAL, "ev_count: an explicit array of 3 EVs is not a multiple of ev_count_align 4"):
        ctl.modify_ev_profile(1, state=OFFLINE, mode="EXP", fmt_id=13, ev_count=3, fields=STEV_FIELDS[:1])
    narrow = Controller(attrs=CtlDeviceAttr(ev_max_width=24))
    stev_format(narrow)
    with raises(errno.E2BIG, "fields: total width 32 extends past the device's ev_max_width 24"):
        narrow.modify_ev_profile(1, state=OFFLINE, mode="EXP", fmt_id=13, ev_count=4, fields=STEV_FIELDS)
    gen_profile(ctl, 1, count=4)
    with raises(errno.ENOSPC, "ev_count: 4 EVs, the device has 2 free (ev_max_count 6)"):
        gen_profile(ctl, 2, count=4)
    assert ctl.create_ev_profile().profile_id == 2  # the failed modify did not create profile 2
    with raises(errno.ENOSPC, "ev_profile_id: the device holds at most 2 EV profiles"):
        ctl.create_ev_profile()
    ctl.create_cc_profile()
    with raises(errno.ENOSPC, "cc_profile_id: the device holds at most 1 CC profiles"):
        ctl.modify_cc_profile(5, state=OFFLINE, algorithm="uet-1.0-nscc")


def test_destroy_in_use_is_ebusy():
    ctl = Controller()
    stev_format(ctl)
    gen_profile(ctl, 1)
    nscc(ctl, 2)
    qp = ctl.create_qp()
    qp.modify(state=QpState.INIT, ev_profile_id=1, cc_profile_id=2)
    with raises(errno.EBUSY, "ev_fmt_profile_id: 13 is the format of EV profile(s) [1]"):
        ctl.destroy_ev_fmt_profile(13)
    with raises(errno.EBUSY, "ev_profile_id: 1 QP(s) use EV profile 1"):
        ctl.destroy_ev_profile(1)
    with raises(errno.EBUSY, "cc_profile_id: 1 QP(s) use CC profile 2"):
        ctl.destroy_cc_profile(2)
    with raises(errno.EBUSY, "state: 1 active QP(s) use EV profile 1"):
        ctl.modify_ev_profile(1, state=OFFLINE)
    with raises(errno.EBUSY, "state: 1 active QP(s) use CC profile 2"):
        ctl.modify_cc_profile(2, state=OFFLINE)
    ctl.destroy_qp(qp)
    with raises(errno.EINVAL, "qp: QP 1 is not a QP of controller h0"):
        ctl.destroy_qp(qp)
    with raises(errno.EBUSY, "ev_profile_id: EV profile 1 is ONLINE (take it OFFLINE first)"):
        ctl.destroy_ev_profile(1)
    with raises(errno.EBUSY, "cc_profile_id: CC profile 2 is ONLINE (take it OFFLINE first)"):
        ctl.destroy_cc_profile(2)
    ctl.modify_ev_profile(1, state=OFFLINE)
    ctl.destroy_ev_profile(1)  # OFFLINE and unused: back to INIT, its format free of it
    ctl.destroy_ev_fmt_profile(13)
    ctl.modify_cc_profile(2, state=OFFLINE)
    ctl.destroy_cc_profile(2)
    assert (ctl.ev_profiles, ctl.fmt_profiles, ctl.cc_profiles) == ({}, {}, {})


def test_ev_ops_while_qps_run_post_events_to_the_controllers_queue():
    ctl = Controller(attrs=CtlDeviceAttr(ev_op_max_entries=4), event_capacity=2)
    stev_format(ctl)
    profile = gen_profile(ctl, 1)
    nscc(ctl, 2)
    ctl.create_qp().modify(state=QpState.INIT, ev_profile_id=1, cc_profile_id=2)
    entries = [EvOpEntry() for _ in range(4)]
    assert ctl.ev_op(1, EvOp.QUERY_EV_ARRAY, entries) == 4
    evs = [entry.ev for entry in entries]
    with raises(errno.E2BIG, "entries: 5 entries exceed ev_op_max_entries 4"):
        ctl.ev_op(1, EvOp.MODIFY_EV_STATE, [EvOpEntry(ev, state=EvState.DENIED) for ev in evs + evs[:1]])
    ctl.ev_op(1, EvOp.MODIFY_EV_STATE, [EvOpEntry(evs[0], state=EvState.ASSUMED_BAD),
                                        EvOpEntry(evs[1], state=EvState.ASSUMED_BAD)])
    ctl.ev_op(1, EvOp.MODIFY_EV_STATE, [EvOpEntry(evs[0], state=EvState.GOOD)])  # the queue (2) is full: dropped
    events = ctl.poll_events(4)
    assert [(e.state, e.drop_count) for e in events] == [(EvState.ASSUMED_BAD, 1), (EvState.ASSUMED_BAD, 0)]
    assert profile.ev_states[:2] == [EvState.GOOD, EvState.ASSUMED_BAD]


def test_event_queue_needs_the_capability():
    with raises(errno.ENOTSUP, "cqe: EV event CQs need MRC_CTL_OPT_CAP_EV_EVENT"):
        Controller(attrs=CtlDeviceAttr(opt_attr=OptAttr(0)))


def test_ports_and_endpoint_batches_go_through_the_controller():
    ctl = Controller(planes=2, gids=("fd00::1",))
    ctl.modify_port(2, PortAdminState.DISABLED)
    assert ctl.query_port(2) == PortAdminState.DISABLED
    request = EpRequest(5, "fd00::1", "fd00::2", 1, b"\x01", 1)
    batch = ctl.ep_batch(EpOpType.EV_PROBE, [request], 1000, now_ns=0)
    with raises(errno.EAGAIN, "req_id: 5 is outstanding"):
        ctl.ep_batch(EpOpType.EV_PROBE, [request], 1000, now_ns=0)
    assert not batch.on_response(EpResponse(5, 3, 100), 5)  # no port 3 on this host
    batch.on_response(EpResponse(5, 1, 100), 10)
    assert batch.result(10) == ([EpResponse(5, 1, 100)], 0) and batch.ignored == {"malformed": 1}
    with raises(errno.EINVAL, "req[0].req_port: port 2 is DISABLED"):
        ctl.ep_batch(EpOpType.EV_PROBE, [EpRequest(6, "fd00::1", "fd00::2", 1, b"\x01", 2)], 1000)
    no_probes = Controller(attrs=CtlDeviceAttr(opt_attr=OptAttr.EV_EVENT))
    with raises(errno.ENOTSUP, "op_type: EV_PROBE needs MRC_CTL_OPT_CAP_EP_OP_EV_PROBE"):
        no_probes.ep_batch(EpOpType.EV_PROBE, [request], 1000)
