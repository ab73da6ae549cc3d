"""CC profiles (mrc_emu.api.cc): the lifecycle, the algorithm names the device lists, NSCC config
field names and types, CONFIG online only with CC_PROFILE_MODIFY_ONLINE, EBUSY with active QPs."""

import dataclasses
import errno

import pytest

from mrc_emu.api import MrcApiError, ProfileState
from mrc_emu.api.cc import CC_DISABLED, NSCC, NSCC_CONFIG_FIELDS, CcProfile
from mrc_emu.transport.cc.nscc import NsccParams

OFFLINE, ONLINE, INIT = ProfileState.OFFLINE, ProfileState.ONLINE, ProfileState.INIT


def test_the_nscc_field_names_are_the_transports():
    """One list in api/ (the layers forbid importing transport); it must stay NsccParams' field list."""
    assert list(NSCC_CONFIG_FIELDS) == [f.name for f in dataclasses.fields(NsccParams)]
    NsccParams(**{name: 1 for name in NSCC_CONFIG_FIELDS})  # the experiments layer's mapping is by name


def test_the_dcqcn_field_names_are_the_transports():
    """The emulator's DCQCN has no OCP struct: its CC profile config is DcqcnParams' fields by name."""
    from mrc_emu.api.cc import DCQCN_CONFIG_FIELDS
    from mrc_emu.transport.cc.dcqcn import DcqcnParams

    assert list(DCQCN_CONFIG_FIELDS) == [f.name for f in dataclasses.fields(DcqcnParams)]


def test_lifecycle_init_offline_online_offline_init():
    cc = CcProfile(3)
    cc.modify(state=OFFLINE, algorithm=NSCC)
    cc.modify(state=ONLINE, config={"base_rtt": 20000, "gamma": 0.8, "qa_gate": 3})
    assert (cc.state, cc.algorithm, cc.config["base_rtt"]) == (ONLINE, NSCC, 20000)
    cc.modify(state=OFFLINE, cur_state=ONLINE)
    cc.modify(state=ONLINE)  # the config set before still holds
    cc.modify(state=OFFLINE)
    cc.modify(state=INIT)
    assert (cc.state, cc.algorithm, cc.config) == (INIT, None, None)


def test_cc_can_be_disabled_with_an_empty_config():
    cc = CcProfile()
    cc.modify(state=OFFLINE, algorithm=CC_DISABLED)
    cc.modify(state=ONLINE, config={})
    with pytest.raises(MrcApiError, match="^config.gamma: not a field of disabled CC$"):
        CcProfile().modify(state=OFFLINE, algorithm=CC_DISABLED, config={"gamma": 1.0})


def test_a_new_algorithm_forgets_the_old_config():
    cc = CcProfile(algorithms=(NSCC, "other"))
    cc.modify(state=OFFLINE, algorithm=NSCC, config={"gamma": 0.5})
    cc.modify(algorithm=CC_DISABLED)
    with pytest.raises(MrcApiError, match="^config: OFFLINE -> ONLINE needs CONFIG$"):
        cc.modify(state=ONLINE)


@pytest.mark.parametrize("kwargs, message", [
    ({"state": ONLINE, "algorithm": NSCC}, r"^state: an INIT CC profile may only move to OFFLINE"),
    ({"state": OFFLINE}, r"^algorithm: INIT -> OFFLINE needs ALGORITHM$"),
    ({"state": OFFLINE, "algorithm": "dcqcn"}, r"^algorithm: 'dcqcn' is not one the device lists \(uet-1.0-nscc\)$"),
    ({"state": OFFLINE, "algorithm": NSCC, "config": {"alpha": 1}}, r"^config.alpha: not a field of uet-1.0-nscc \(known: "),
    ({"state": OFFLINE, "algorithm": NSCC, "config": {"base_rtt": -1}}, r"^config.base_rtt: -1 is not a u32$"),
    ({"state": OFFLINE, "algorithm": NSCC, "config": {"max_cwnd": 1 << 32}}, r"^config.max_cwnd: 4294967296 is not a u32$"),
    ({"state": OFFLINE, "algorithm": NSCC, "config": {"qa_gate": 256}}, r"^config.qa_gate: 256 is not a u8$"),
    ({"state": OFFLINE, "algorithm": NSCC, "config": {"disable_qa": True}}, r"^config.disable_qa: True is not a u8$"),
    ({"state": OFFLINE, "algorithm": NSCC, "config": {"eta": "x"}}, r"^config.eta: 'x' is not a number$"),
    ({"state": OFFLINE, "algorithm": NSCC, "config": {"fi": float("nan")}}, r"^config.fi: nan is not a number$"),
    ({"state": OFFLINE, "algorithm": NSCC, "config": [1]}, r"^config: expected a mapping of uet-1.0-nscc fields"),
    ({"state": OFFLINE, "cur_state": OFFLINE, "algorithm": NSCC}, r"^cur_state: the profile is INIT, not OFFLINE$"),
])
def test_init_errors_change_nothing(kwargs, message):
    cc = CcProfile()
    with pytest.raises(MrcApiError, match=message) as info:
        cc.modify(**kwargs)
    assert info.value.errno == errno.EINVAL
    assert (cc.state, cc.algorithm, cc.config) == (INIT, None, None)


def test_online_rules():
    cc = CcProfile()
    cc.modify(state=OFFLINE, algorithm=NSCC, config={"gamma": 0.8})
    cc.modify(state=ONLINE)
    with pytest.raises(MrcApiError, match="^config: changing CONFIG while ONLINE needs CC_PROFILE_MODIFY_ONLINE$") as info:
        cc.modify(config={"gamma": 0.5})
    assert info.value.errno == errno.EPERM and cc.config == {"gamma": 0.8}
    with pytest.raises(MrcApiError, match="^state: an ONLINE CC profile may only move to OFFLINE"):
        cc.modify(algorithm=CC_DISABLED)
    with pytest.raises(MrcApiError, match="^state: an ONLINE CC profile may only move to OFFLINE"):
        cc.modify(state=INIT)
    online = CcProfile(modify_online=True)
    online.modify(state=OFFLINE, algorithm=NSCC, config={"gamma": 0.8})
    online.modify(state=ONLINE)
    online.modify(config={"gamma": 0.5})
    assert (online.state, online.config) == (ONLINE, {"gamma": 0.5})


def test_offline_to_init_takes_nothing_else_and_active_qps_make_it_ebusy():
    cc = CcProfile(4)
    cc.modify(state=OFFLINE, algorithm=NSCC)
    with pytest.raises(MrcApiError, match="^state: OFFLINE -> INIT takes no ALGORITHM or CONFIG$"):
        cc.modify(state=INIT, config={})
    cc.modify(state=ONLINE, config={})
    cc.active_qps = 2
    with pytest.raises(MrcApiError, match="^state: 2 active QP\\(s\\) use CC profile 4$") as info:
        cc.modify(state=OFFLINE)
    assert info.value.errno == errno.EBUSY and cc.state == ONLINE
