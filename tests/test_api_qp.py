"""MRC QPs (mrc_emu.api.qp): RST -> INIT -> RTR -> RTS with the attributes each transition takes
(mrc.h h:442-600), the IBV attributes the header rejects, the device's bounds, the work-request
rules (WRITE and WRITE_WITH_IMM only, max_wimm in flight, receives posted in advance: no RNR) and
the config the transport takes."""

import contextlib
import dataclasses
import errno
import re

import pytest

from mrc_emu.api import MrcApiError, ProfileState
from mrc_emu.api.controller import Controller
from mrc_emu.api.qp import (
    QPCONFIG_KEYS,
    DeviceAttr,
    DeviceCap,
    NoReceivePosted,
    Qp,
    QpCap,
    QpHint,
    QpState,
    RetryCnt,
    WrOpcode,
)
from mrc_emu.transport.config import QpConfig

RST, INIT, RTR, RTS, ERR = QpState.RST, QpState.INIT, QpState.RTR, QpState.RTS, QpState.ERR
RTR_ATTRS = {"max_wimm_dest": 16, "mpr_dest": 8}
RTS_ATTRS = {"max_wimm": 4, "mpr": 8, "retry": RetryCnt(7, 25), "timeout": 8}


@contextlib.contextmanager
def raises(errno_value, message, kind=MrcApiError):
    """pytest.raises for an MrcApiError with exactly this one-line message, then its errno checked."""
    with pytest.raises(kind, match="^" + re.escape(message) + "$") as excinfo:
        yield excinfo
    assert excinfo.value.errno == errno_value, excinfo.value.errno_name


def check(excinfo, errno_value):
    assert excinfo.value.errno == errno_value, excinfo.value.errno_name


def online_controller(**kwargs):
    """A controller with EV profile 1 (AUTO) and CC profile 2 (NSCC) ONLINE."""
    ctl = Controller(**kwargs)
    ctl.modify_ev_profile(1, state=ProfileState.OFFLINE, mode="AUTO")
    ctl.modify_ev_profile(1, state=ProfileState.ONLINE, ev_min_active=0, ev_event_mask=3)
    ctl.modify_cc_profile(2, state=ProfileState.OFFLINE, algorithm="uet-1.0-nscc")
    ctl.modify_cc_profile(2, state=ProfileState.ONLINE, config={})
    return ctl


def rts_qp(ctl=None, **rts):
    ctl = ctl or online_controller()
    qp = ctl.create_qp()
    qp.modify(state=INIT, ev_profile_id=1, cc_profile_id=2)
    qp.modify(state=RTR, **RTR_ATTRS)
    qp.modify(state=RTS, **{**RTS_ATTRS, **rts})
    return qp


def test_rst_init_rtr_rts_with_each_transitions_attributes():
    ctl = online_controller()
    qp = ctl.create_qp()
    assert qp.state == RST
    qp.modify(state=INIT, cur_state=RST, ev_profile_id=1, cc_profile_id=2, hint=QpHint(num_qps_per_peer=2),
              ibv_attrs={"IBV_QP_STATE", "PKEY_INDEX", "ACCESS_FLAGS"})
    qp.modify(state=RTR, cap=QpCap.DYNAMIC_MPR, ibv_attrs={"AV", "PATH_MTU", "DEST_QPN", "RQ_PSN"}, **RTR_ATTRS)
    qp.modify(state=RTS, ibv_attrs={"SQ_PSN"}, **RTS_ATTRS)
    state, attrs = qp.query()
    assert state == RTS and attrs["mpr"] == 8 and attrs["retry"] == (7, 25) and attrs["cap"] == QpCap.DYNAMIC_MPR
    assert qp.timeout_ns == 262_144  # 1.024 us * 2^8


@pytest.mark.parametrize("timeout, ns", [(0, 1024), (8, 262_144), (14, 16_777_216), (24, 17_179_869_184)])
def test_timeout_is_1_024_us_times_two_to_the_timeout(timeout, ns):
    assert rts_qp(timeout=timeout).timeout_ns == ns


def test_transport_config_is_a_plain_dict_the_experiments_layer_makes_a_qpconfig_of():
    qp = rts_qp(ctl=online_controller(device=DeviceAttr(cap=DeviceCap.TRIM_NACK)), timeout=14, retry=(3, 25))
    config = qp.transport_config()
    assert config == {"ack_timeout_exp": 14, "retry_linear": 3, "retry_exp": 25, "mpr": 8, "timeout_ns": 16_777_216,
                      "retry_infinite": True, "mpr_psns": 1024, "mpr_dest": 8, "mpr_dest_psns": 1024, "max_wimm": 4,
                      "max_wimm_dest": 16, "trim_nack": True, "svc_time": False, "dynamic_mpr": False,
                      "ev_profile_id": 1, "cc_profile_id": 2}
    assert set(QPCONFIG_KEYS) <= {f.name for f in dataclasses.fields(QpConfig)}
    assert QpConfig(**{key: config[key] for key in QPCONFIG_KEYS}).mpr == 8


def test_the_responder_caps_turn_trim_nack_and_service_time_off():
    ctl = online_controller()
    qp = ctl.create_qp()
    qp.modify(state=INIT, ev_profile_id=1, cc_profile_id=2)
    qp.modify(state=RTR, cap=QpCap.TRIM_NACK_DEST_UNSUPPORTED | QpCap.SVC_TIME_DEST_UNSUPPORTED, **RTR_ATTRS)
    qp.modify(state=RTS, **RTS_ATTRS)
    config = qp.transport_config()
    assert (config["trim_nack"], config["svc_time"]) == (False, False)
    with raises(errno.EINVAL, "state: the transport config is an RTS QP's, the QP is RST") as excinfo:
        Qp().transport_config()
    check(excinfo, errno.EINVAL)


@pytest.mark.parametrize("target, attrs, message", [
    (INIT, {"ev_profile_id": 1}, "cc_profile_id: RST -> INIT needs CC_PROFILE_ID"),
    (INIT, {"ev_profile_id": 1, "cc_profile_id": 2, "mpr": 8},
     "mpr: MPR is not an attribute of RST -> INIT (it takes EV_PROFILE_ID, CC_PROFILE_ID, HINT)"),
    (RTR, {}, "state: RST -> RTR is not a QP transition (RST -> INIT -> RTR -> RTS, any -> RST or ERR)"),
])
def test_wrong_transition_or_missing_attribute_from_rst(target, attrs, message):
    with raises(errno.EINVAL, message) as excinfo:
        online_controller().create_qp().modify(state=target, **attrs)
    check(excinfo, errno.EINVAL)


def test_attributes_at_the_wrong_transition_name_the_attribute():
    qp = online_controller().create_qp()
    qp.modify(state=INIT, ev_profile_id=1, cc_profile_id=2)
    with raises(errno.EINVAL, "mpr: MPR is not an attribute of INIT -> RTR (it takes MAX_WIMM_DEST, MPR_DEST, CAP)"):
        qp.modify(state=RTR, mpr=8, **RTR_ATTRS)
    with raises(errno.EINVAL, "mpr_dest: INIT -> RTR needs MPR_DEST"):
        qp.modify(state=RTR, max_wimm_dest=8)
    qp.modify(state=RTR, **RTR_ATTRS)
    with raises(errno.EINVAL, "cap: CAP is not an attribute of RTR -> RTS (it takes MAX_WIMM, MPR, RETRY_CNT, TIMEOUT)"):
        qp.modify(state=RTS, cap=0, **RTS_ATTRS)
    with raises(errno.EINVAL, "timeout: RTR -> RTS needs TIMEOUT"):
        qp.modify(state=RTS, max_wimm=4, mpr=8, retry=(7, 25))
    with raises(errno.EINVAL, "cur_state: the QP is RTR, not INIT"):
        qp.modify(state=RTS, cur_state=INIT, **RTS_ATTRS)
    with raises(errno.EINVAL, "state: MRC attributes are set on a transition (IBV_QP_STATE)"):
        qp.modify(mpr=8)
    with raises(errno.EINVAL, "state: 7 is not a QP state (RST, INIT, RTR, RTS, ERR)"):
        qp.modify(state=7)
    assert qp.state == RTR and "mpr" not in qp.attrs  # every failed call changed nothing
    with raises(errno.EINVAL, "mpr: MPR is not an attribute of -> ERR"):
        qp.modify(state=ERR, mpr=8)


@pytest.mark.parametrize("rts, message", [
    ({"timeout": 25}, "timeout: 25 is not 0..24"),
    ({"retry": (8, 0)}, "retry.linear_cnt: 8 is not 0..7"),
    ({"retry": (7, 26)}, "retry.exp_cnt: 26 is not 0..25"),
    ({"retry": 7}, "retry: 7 is not (linear_cnt, exp_cnt)"),
    ({"mpr": 65}, "mpr: 65 (x128 PSNs) exceeds the device's max_mpr 64"),
    ({"mpr": 0}, "mpr: 0 is not 1..255"),
    ({"max_wimm": 129}, "max_wimm: 129 exceeds the device's max_wimm 128"),
    ({"max_wimm": -1}, "max_wimm: -1 is not 0..65535"),
])
def test_rts_attributes_out_of_range(rts, message):
    ctl = online_controller()
    qp = ctl.create_qp()
    qp.modify(state=INIT, ev_profile_id=1, cc_profile_id=2)
    qp.modify(state=RTR, **RTR_ATTRS)
    with raises(errno.EINVAL, message) as excinfo:
        qp.modify(state=RTS, **{**RTS_ATTRS, **rts})
    check(excinfo, errno.EINVAL)


def test_rtr_attributes_out_of_range_and_the_device_bounds():
    device = DeviceAttr(max_wimm_dest=8, max_mpr=16, mpr_resolution=4, cap=DeviceCap.TRIM_NACK)
    qp = Qp(device)
    qp.modify(state=INIT, ev_profile_id=1, cc_profile_id=2)  # no binder: the ids are not looked up
    for attrs, message in [({"max_wimm_dest": 9, "mpr_dest": 8}, "max_wimm_dest: 9 exceeds the device's max_wimm_dest 8"),
                           ({"max_wimm_dest": 8, "mpr_dest": 6}, "mpr_dest: 6 is not a multiple of the device's "
                                                                 "mpr_resolution 4"),
                           ({"max_wimm_dest": 8, "mpr_dest": 8, "cap": QpCap.DYNAMIC_MPR},
                            "cap: DYNAMIC_MPR needs the device's MRC_DEVICE_CAP_DYNAMIC_MPR"),
                           ({"max_wimm_dest": 8, "mpr_dest": 8, "cap": 8},
                            "cap: 0x08 has bits other than TRIM_NACK_DEST_UNSUPPORTED, DYNAMIC_MPR, "
                            "SVC_TIME_DEST_UNSUPPORTED"),
                           ({"max_wimm_dest": 8, "mpr_dest": 8, "vendor_cfg": bytes(129)},
                            "vendor_cfg: expected at most 128 bytes, got 129 bytes")]:
        with raises(errno.EINVAL, message):
            qp.modify(state=RTR, **attrs)
    qp.modify(state=RTR, max_wimm_dest=8, mpr_dest=16, vendor_cfg=b"\x01")
    with raises(errno.EINVAL, "hint: 3 is not a QpHint"):
        Qp().modify(state=INIT, ev_profile_id=1, cc_profile_id=2, hint=3)
    with raises(errno.EINVAL, "ev_profile_id: -1 is not 0..18446744073709551615"):
        Qp().modify(state=INIT, ev_profile_id=-1, cc_profile_id=2)


@pytest.mark.parametrize("name, why", [
    ("PORT", "EVs carry their own ports"), ("TIMEOUT", "use timeout= (MRC_QP_TIMEOUT)"),
    ("RETRY_CNT", "use retry= (MRC_QP_RETRY_CNT)"), ("RNR_RETRY", "MRC has no RNR"), ("MIN_RNR_TIMER", "MRC has no RNR"),
    ("MAX_QP_RD_ATOMIC", "MRC has no READ or atomics"), ("MAX_DEST_RD_ATOMIC", "MRC has no READ or atomics"),
    ("ALT_PATH", "MRC sprays over EVs"), ("PATH_MIG_STATE", "MRC sprays over EVs"),
])
def test_the_ibv_attributes_the_header_rejects(name, why):
    qp = online_controller().create_qp()
    with raises(errno.EINVAL, f"ibv_attrs: IBV_QP_{name} is not supported by mrc_modify_qp ({why})") as excinfo:
        qp.modify(state=INIT, ev_profile_id=1, cc_profile_id=2, ibv_attrs={"STATE", f"IBV_QP_{name}"})
    check(excinfo, errno.EINVAL)
    assert qp.state == RST
    with raises(errno.EINVAL, "ibv_attrs: 'IBV_QP_BOGUS' is not an IBV_QP_* attribute"):
        qp.modify(state=INIT, ev_profile_id=1, cc_profile_id=2, ibv_attrs="IBV_QP_BOGUS")


def test_profiles_must_exist_and_be_online_and_count_the_qp():
    ctl = online_controller()
    qp = ctl.create_qp()
    with raises(errno.EINVAL, "ev_profile_id: 9 is not an EV profile of controller h0"):
        qp.modify(state=INIT, ev_profile_id=9, cc_profile_id=2)
    ctl.modify_cc_profile(3, state=ProfileState.OFFLINE, algorithm="uet-1.0-nscc")
    with raises(errno.EINVAL, "cc_profile_id: profile 3 is OFFLINE, not ONLINE"):
        qp.modify(state=INIT, ev_profile_id=1, cc_profile_id=3)
    assert (ctl.ev_active_qps.get(1, 0), ctl.cc_profile(2).active_qps) == (0, 0)
    qp.modify(state=INIT, ev_profile_id=1, cc_profile_id=2)
    assert (ctl.ev_active_qps[1], ctl.cc_profile(2).active_qps) == (1, 1)
    qp.modify(state=ERR)  # a QP in ERR still holds its profiles
    assert ctl.cc_profile(2).active_qps == 1
    qp.modify(state=RST)  # RST forgets them
    assert (ctl.ev_active_qps[1], ctl.cc_profile(2).active_qps, qp.attrs) == (0, 0, {})


def test_send_and_receive_work_requests():
    qp = rts_qp()
    qp.post_recv(3)
    for _ in range(4):
        qp.post_send(WrOpcode.RDMA_WRITE_WITH_IMM)
    qp.post_send(WrOpcode.RDMA_WRITE)  # plain WRITEs do not count against max_wimm
    with raises(errno.ENOMEM, "opcode: 4 WRITE_WITH_IMM already in flight, max_wimm is 4") as excinfo:
        qp.post_send(WrOpcode.RDMA_WRITE_WITH_IMM)
    check(excinfo, errno.ENOMEM)
    qp.complete_imm(2)
    qp.post_send(WrOpcode.RDMA_WRITE_WITH_IMM)
    assert (qp.imm_in_flight, qp.writes_posted, qp.recv_posted) == (3, 6, 3)
    with raises(errno.EINVAL, "count: 4 completions, but 3 WRITE_WITH_IMM in flight"):
        qp.complete_imm(4)
    with raises(errno.ENOMEM, "count: 3 + 126 receives exceed max_recv_wr 128") as excinfo:
        qp.post_recv(126)
    check(excinfo, errno.ENOMEM)


@pytest.mark.parametrize("opcode", [WrOpcode.SEND, WrOpcode.SEND_WITH_IMM, WrOpcode.RDMA_READ,
                                    WrOpcode.ATOMIC_CMP_AND_SWP, WrOpcode.ATOMIC_FETCH_AND_ADD])
def test_only_write_and_write_with_imm(opcode):
    with raises(errno.EINVAL, f"opcode: IBV_WR_{opcode.name} is not supported (MRC posts only RDMA_WRITE and "
                              "RDMA_WRITE_WITH_IMM)") as excinfo:
        rts_qp().post_send(opcode)
    check(excinfo, errno.EINVAL)
    with raises(errno.EINVAL, "opcode: 9 is not an ibv_wr_opcode"):
        rts_qp().post_send(9)


def test_receives_from_rtr_sends_from_rts():
    ctl = online_controller()
    qp = ctl.create_qp()
    qp.modify(state=INIT, ev_profile_id=1, cc_profile_id=2)
    with raises(errno.EINVAL, "state: receive WRs are posted from RTR on, the QP is INIT"):
        qp.post_recv()
    qp.modify(state=RTR, **RTR_ATTRS)
    qp.post_recv()
    with raises(errno.EINVAL, "state: send WRs are posted in RTS, the QP is RTR"):
        qp.post_send(WrOpcode.RDMA_WRITE)
    qp.consume_recv()  # a responder in RTR receives
    with raises(errno.EINVAL, "state: a QP receives from RTR on, the QP is RST"):
        Qp().consume_recv()


def test_write_with_imm_without_a_receive_posted_moves_the_qp_to_err():
    qp = rts_qp()
    qp.post_recv(1)
    qp.post_send(WrOpcode.RDMA_WRITE_WITH_IMM)
    qp.consume_recv()
    with pytest.raises(NoReceivePosted, match="^recv: WRITE_WITH_IMM with no receive posted: no RNR in MRC; "
                                              "the QP goes to ERR$") as excinfo:
        qp.consume_recv()
    check(excinfo, errno.ENOBUFS)
    assert qp.state == ERR and qp.flushed == 1 and qp.imm_in_flight == 0 and "no RNR" in qp.error
    with raises(errno.EINVAL, "state: send WRs are posted in RTS, the QP is ERR"):
        qp.post_send(WrOpcode.RDMA_WRITE)
    with raises(errno.EINVAL, "state: ERR -> RTS is not a QP transition (RST -> INIT -> RTR -> RTS, any -> RST or ERR)"):
        qp.modify(state=RTS, **RTS_ATTRS)
    qp.modify(state=RST)
    assert qp.state == RST and qp.error == ""
