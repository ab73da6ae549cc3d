"""The endpoint batch (mrc_emu.api.endpoint, mrc_ctl.h c:998-1084): a batch checked before anything
is sent, responses taken in arrival order, unknown/duplicate/late ones ignored and counted,
ETIMEDOUT with the responses that did arrive, and req_ids held back while late responses may come."""

import contextlib
import errno
import ipaddress
import re

import pytest

from mrc_emu.api import EvFormatMode, MrcApiError, PortAdmin, PortAdminState
from mrc_emu.api.endpoint import EpBatch, EpOpType, EpRequest, EpResponse, ReqIdPool, gid

STEV = EvFormatMode.STEV
PROBE, PSU = EpOpType.EV_PROBE, EpOpType.PORT_STATUS_UPDATE


@contextlib.contextmanager
def raises(errno_value, message):
    with pytest.raises(MrcApiError, match="^" + re.escape(message) + "$") as excinfo:
        yield excinfo
    assert excinfo.value.errno == errno_value, excinfo.value.errno_name


def probe(req_id, ev=b"\x12\x34\x56\x78", port=1, dgid="fd00::2", **kw):
    return EpRequest(req_id, "fd00::1", dgid, STEV, ev, port, **kw)


def test_responses_in_arrival_order_and_done():
    batch = EpBatch(PROBE, [probe(1), probe(2, dgid="fd00::3")], 2_000_000, 0, now_ns=1000)
    assert batch.deadline_ns == 2_001_000 and batch.missing == [1, 2] and not batch.done
    assert batch.on_response(EpResponse(2, 2, 5000, True), 3000)
    assert batch.on_response(EpResponse(1, 1, 6000), 4000)
    assert batch.done
    responses, err = batch.result(4000)
    assert [r.req_id for r in responses] == [2, 1] and err == 0
    assert batch.requests[0].req_ev == b"\x12\x34\x56\x78" + bytes(28)  # padded to the 32-byte EV


def test_timeout_returns_the_responses_that_did_arrive():
    batch = EpBatch(PROBE, [probe(1), probe(2)], 2_000_000, 0, now_ns=0)
    batch.on_response(EpResponse(1, 1, 6000), 10)
    with raises(errno.EINVAL, "now_ns: 1999999 is before the deadline 2000000 and 1 response(s) are missing: "
                              "the call is still waiting"):
        batch.result(1_999_999)
    responses, err = batch.result(2_000_000)
    assert [r.req_id for r in responses] == [1] and err == errno.ETIMEDOUT
    assert not batch.on_response(EpResponse(2, 1, 9000), 2_000_001)  # not buffered between calls
    assert batch.ignored == {"late": 1}


def test_unknown_duplicate_late_malformed_responses_are_ignored_and_counted():
    batch = EpBatch(PROBE, [probe(1), probe(2)], 100, 0, now_ns=0)
    assert batch.on_response(EpResponse(1, 1, 50), 10)
    for resp, now in [(EpResponse(1, 1, 50), 11), (EpResponse(7, 1, 50), 12), (EpResponse(2, 0, 50), 13),
                      ("garbage", 14), (EpResponse(2, 1, -1), 15), (EpResponse(2, 1, 50), 101)]:
        assert not batch.on_response(resp, now)
    assert batch.ignored == {"duplicate": 1, "unknown": 1, "malformed": 3, "late": 1}
    assert batch.missing == [2]


@pytest.mark.parametrize("kwargs, message", [
    ({"op_type": 2}, "op_type: 2 is not EV_PROBE (0) or PORT_STATUS_UPDATE (1)"),
    ({"requests": []}, "req: expected a non-empty list of EpRequest, got []"),
    ({"requests": [probe(1), probe(1)]}, "req_id: 1 appears 2 times in one batch"),
    ({"requests": [probe(70000)]}, "req[0].req_id: 70000 is not 0..65535"),
    ({"requests": [EpRequest(1, "nonsense", "fd00::2", STEV, b"", 1)]},
     "req[0].sgid: 'nonsense' is not a RoCEv2 GID (an IPv6 address or 16 bytes)"),
    ({"requests": [EpRequest(1, "fd00::1", b"\x00" * 4, STEV, b"", 1)]},
     "req[0].dgid: b'\\x00\\x00\\x00\\x00' is not a RoCEv2 GID (an IPv6 address or 16 bytes)"),
    ({"requests": [EpRequest(1, "fd00::1", "fd00::2", 8, b"", 1)]}, "req[0].ev_fmt_mode: 8 is not STEV, SRV6 or UDP"),
    ({"requests": [probe(1, ev=bytes(33))]}, "req[0].req_ev: expected at most 32 bytes, got " + repr(bytes(33))),
    ({"requests": [probe(1, ev=b"\x01\x02\x03\x04\x05")]}, "req[0].req_ev: STEV carries 4 bytes, the EV has more (0102030405)"),
    ({"requests": [probe(1, port=0)]}, "req[0].req_port: 0 is not 1..255"),
    ({"requests": [probe(1, port=3)]}, "req[0].req_port: 3 is not a port of this device (ports [1, 2])"),
    ({"requests": [probe(1, port_status=0b10)]}, "req[0].port_status: only PORT_STATUS_UPDATE carries a port status"),
    ({"rsp_timeout_ns": 1 << 32}, "rsp_timeout: 4294967296 is not 0..4294967295"),
    ({"req_tc": 64}, "req_tc: 64 is not 0..63"),
])
def test_a_bad_batch_is_einval_and_sends_nothing(kwargs, message):
    pool = ReqIdPool()
    args = {"op_type": PROBE, "requests": [probe(1)], "rsp_timeout_ns": 1000, "req_tc": 0, **kwargs}
    with raises(errno.EINVAL, message):
        EpBatch(args["op_type"], args["requests"], args["rsp_timeout_ns"], args["req_tc"], 0,
                ports=PortAdmin(0b110), pool=pool)
    assert pool.outstanding == set()  # nothing reserved: nothing sent


def test_port_status_update_checks_the_mask_and_a_disabled_port():
    ports = PortAdmin(0b110)
    batch = EpBatch(PSU, [probe(1, port_status=0b100)], 1000, 0, 0, ports=ports)
    assert batch.requests[0].port_status == 0b100
    with raises(errno.EINVAL, "req[0].port_status: None is not 0..4294967295"):
        EpBatch(PSU, [probe(1)], 1000, 0, 0, ports=ports)
    with raises(errno.EINVAL, "req[0].port_status: bit 0 is set, but ports are 1-based (bit N = port N)"):
        EpBatch(PSU, [probe(1, port_status=0b11)], 1000, 0, 0, ports=ports)
    with raises(errno.EINVAL, "req[0].port_status: 0x8 names ports outside phy_port_mask 0x6"):
        EpBatch(PSU, [probe(1, port_status=0b1000)], 1000, 0, 0, ports=ports)
    ports.modify_port(1, PortAdminState.DISABLED)
    with raises(errno.EINVAL, "req[0].req_port: port 1 is DISABLED"):
        EpBatch(PROBE, [probe(1)], 1000, 0, 0, ports=ports)
    with raises(errno.EINVAL, "req[0].sgid: fd00::1 is not a GID of this device"):
        EpBatch(PROBE, [probe(1, port=2)], 1000, 0, 0, ports=ports, local_gids=["fd00::9"])


def test_ev_probes_need_the_device_capability():
    with raises(errno.ENOTSUP, "op_type: EV_PROBE needs MRC_CTL_OPT_CAP_EP_OP_EV_PROBE"):
        EpBatch(PROBE, [probe(1)], 1000, 0, 0, ev_probe_supported=False)


def test_gids_are_ipv6_and_ipv4_strings_mean_the_mapped_gid():
    assert gid("10.0.0.1", "sgid") == ipaddress.IPv6Address("::ffff:10.0.0.1")
    assert gid(bytes(15) + b"\x01", "sgid") == ipaddress.IPv6Address("::1")


def test_req_ids_are_held_back_while_late_responses_may_come():
    pool = ReqIdPool(quarantine_ns=1_000_000)
    batch = EpBatch(PROBE, [probe(1), probe(2)], 1000, 0, 0, pool=pool)
    with raises(errno.EAGAIN, "req_id: 1 is outstanding"):
        EpBatch(PROBE, [probe(1)], 1000, 0, 0, pool=pool)
    batch.on_response(EpResponse(1, 1, 10), 5)
    batch.result(1000)
    assert pool.free(1, 1000) and not pool.free(2, 1000)  # 2 unanswered: its response may still be in flight
    with raises(errno.EAGAIN, "req_id: 2 is held back until 1001000 ns (late responses)"):
        EpBatch(PROBE, [probe(2)], 1000, 0, 2000, pool=pool)
    EpBatch(PROBE, [probe(2)], 1000, 0, 1_001_000, pool=pool)  # the quarantine is over


def test_the_pool_allocates_round_robin_and_runs_out():
    pool = ReqIdPool()
    assert pool.allocate(3, 0) == [1, 2, 3]
    pool.release(2, 0, answered=True)
    assert pool.allocate(2, 0) == [4, 5]  # round robin: a just-freed id is not reused at once
    pool.allocate(65536 - 4, 0)  # every other id (1, 3, 4, 5 are outstanding)
    with raises(errno.EAGAIN, "count: only 0 req_ids are free, 1 asked"):
        pool.allocate(1, 0)
