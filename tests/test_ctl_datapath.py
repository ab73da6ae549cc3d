"""The host controller's profiles are what the QP runs with (issue 27): the CC profile's config makes the
QP's congestion control, the EV profile's format is the QP's own (never guessed from the values), and
REPLACE_EV refuses what the responder could not follow. No root: the in-memory network."""

from __future__ import annotations

import ipaddress
import random
from pathlib import Path

import pytest

import mrc_emu
from mrc_emu.api.formats import EvFormatMode
from mrc_emu.experiments.runtime.hostctl import HostControl
from mrc_emu.experiments.runtime.qps import accept_write, prepare_write
from mrc_emu.io.memory import MemoryHost, MemoryNetwork
from mrc_emu.topology import builtin
from mrc_emu.topology.evs import EvFormat, udp_sport
from mrc_emu.transport.config import QpConfig
from mrc_emu.transport.endpoint import HostEndpoint
from mrc_emu.transport.multipath.evpaths import profile_paths
from mrc_emu.transport.multipath.evvalues import value_paths
from mrc_emu.transport.multipath.paths import qp_paths, stev_paths
from mrc_emu.transport.mux import HostMux

TOPO = builtin()
MTU = 1024


def _write(cc: str, cc_config: dict | None, size: int = 256 * 1024, profile=None):
    """h0 writes `size` bytes to h2 over the in-memory network, its QP on a CC profile of `cc` with
    `cc_config` (and on the EV profile file `profile`, made on h0's controller and bound by id);
    (the WriteJob, the most packets it had in flight at once)."""
    paths = profile_paths(TOPO, profile, "h0", "h2") if profile is not None else qp_paths(TOPO, "h0", "h2")
    muxes, controls = {}, {}
    for host, address in (("h0", paths.src_address), ("h2", paths.dst_address)):
        muxes[host] = HostMux(ipaddress.IPv6Address(address).packed)
        muxes[host].serve(HostEndpoint(muxes[host].address, muxes[host], None, TOPO.planes))
        controls[host] = HostControl(host, TOPO.planes)
    config = QpConfig(mtu=MTU, link_rate_bps=10e9, base_rtt_ns=20_000)
    bits = random.Random(1).getrandbits
    _, region = accept_write(muxes["h2"], controls["h2"], 0, size, 0x22, 0x11, 0, paths.back, paths.src_address,
                             config, 0, bits, EvFormatMode.SRV6)
    data = random.Random(2).randbytes(size)
    bound = None if profile is None else controls["h0"].load_profile(
        profile, paths.dst_address, {ev: path.plane + 1 for ev, path in paths.forward.items()})
    job = prepare_write(muxes["h0"], controls["h0"], 0, "h0", 0x11, 0x22, paths.forward, config, cc, 1, 0,
                        region.to_dict(), data, "", None, bits, value_paths(TOPO, "h0", "h2", EvFormat.SRV6), cc_config,
                        bound)
    job.post(0)
    net = MemoryNetwork(0)
    for ev in paths.forward:
        net.fault(ev).delay_ns = 10_000
    most = [0]

    def done() -> bool:
        most[0] = max(most[0], len(job.requester.sent.flight))
        return job.requester.done

    assert net.run([MemoryHost(muxes["h0"]), MemoryHost(muxes["h2"])], done)
    assert job.requester.error is None and bytes(region.buffer) == data
    return job, most[0]


def test_a_cc_profile_with_an_nscc_max_wnd_of_4_packets_keeps_4_packets_in_flight():
    """The CC profile's NSCC config (mrc_ctl_cc_nscc_cfg's max_cwnd, by name) is what the QP's NSCC runs
    with: MaxWnd 4 packets holds the QP to 4 packets in flight, where the derived MaxWnd lets it send more."""
    job, most = _write("nscc", {"max_cwnd": 4 * MTU})
    assert job.requester.cc.p.max_cwnd == 4 * MTU and most == 4
    _, free = _write("nscc", None)
    assert free > 4


def test_a_dcqcn_cc_profile_config_reaches_the_qps_dcqcn():
    job, _ = _write("dcqcn", {"window": 3 * MTU, "byte_counter": 50_000}, size=64 * 1024)
    assert job.requester.cc.p.window == 3 * MTU and job.requester.cc.p.byte_counter == 50_000


def test_a_stev_value_without_flow_label_bits_is_stev_and_a_mix_is_one_profile():
    """The QP's format is given, not guessed: a STEV value whose high 16 bits are zero (it looks like a UDP
    source port) stays STEV, beside STEV values that have some."""
    values = [udp_sport(0), 0x1234 << 16 | udp_sport(1), udp_sport(2), 0xBEEF << 16 | udp_sport(3)]
    paths = stev_paths(TOPO, "h0", "h2", values)
    control = HostControl("h0", TOPO.planes)
    pid = control.ev_profile("h2", paths.forward, 1, EvFormatMode.STEV)
    profile = control.ctl.ev_profile(pid)
    assert profile.fmt.mode == EvFormatMode.STEV
    assert [int.from_bytes(v[:4], "big") for v in profile.explicit] == values


def test_replace_ev_refuses_what_the_responder_could_not_follow():
    """A STEV value keeps its low 16 bits (the responder knows the EV by its UDP source port), a UDP EV its
    port number; an SRV6 EV takes any carrier, and the controller's REPLACE_EV reaches the profile."""
    control = HostControl("h0", TOPO.planes)
    stev = stev_paths(TOPO, "h0", "h2", [0x1111 << 16 | udp_sport(k) for k in range(4)])
    pid = control.ev_profile("h2", stev.forward, 1, EvFormatMode.STEV)
    with pytest.raises(ValueError, match="low 16 bits"):
        control.replace_ev(pid, 1, (0x2222 << 16 | udp_sport(2)).to_bytes(4, "big"))
    old = control.replace_ev(pid, 1, (0x2222 << 16 | udp_sport(1)).to_bytes(4, "big"), 1)
    assert int.from_bytes(old[0][:4], "big") == 0x1111 << 16 | udp_sport(1)
    udp = qp_paths(TOPO, "h0", "h2", EvFormat.UDP)
    uid = control.ev_profile("h2", udp.forward, 1, EvFormatMode.UDP)
    with pytest.raises(ValueError, match="source port"):
        control.replace_ev(uid, 0, udp_sport(5).to_bytes(2, "big"))
    with pytest.raises(ValueError, match="ports 1..2"):
        control.replace_ev(uid, 0, udp_sport(0).to_bytes(2, "big"), 3)
    srv6 = qp_paths(TOPO, "h0", "h2", EvFormat.SRV6_USID)
    sid = control.ev_profile("h2", srv6.forward, 1, EvFormatMode.SRV6)
    carrier = ipaddress.IPv6Address(srv6.evs[2].usid_carrier).packed
    with pytest.raises(ValueError, match="outer destination"):
        control.replace_ev(sid, 1, bytes(16) + carrier)
    control.replace_ev(sid, 1, carrier)
    assert control.ctl.ev_profile(sid).explicit[1][:16] == carrier


def test_the_api_port_admin_state_follows_the_runtime_port_status():
    """`port disable h0 --plane 0` reaches the worker as a port-status mask without port 1: the host
    controller's query_port reads DISABLED for it (and data_evs leaves its EVs out), ENABLED again after."""
    from mrc_emu.api.evops import data_evs
    from mrc_emu.api.ports import PortAdminState

    control = HostControl("h0", TOPO.planes)
    pid = control.ev_profile("h2", qp_paths(TOPO, "h0", "h2").forward, 1, EvFormatMode.SRV6)
    assert control.follow_ports(0b100) == {1: "DISABLED", 2: "ENABLED"}
    assert control.ctl.query_port(1) == PortAdminState.DISABLED
    assert {port for _, port in data_evs(control.ctl.ev_profile(pid), control.ctl.ports)} == {2}
    assert control.follow_ports(0b110) == {1: "ENABLED", 2: "ENABLED"}


def test_a_gen_profile_file_is_made_on_the_host_controller_and_bound_by_id():
    """`send --ev-profile` of the shipped GEN profile: h0's controller holds it as GEN (its fields, not
    an expanded EXP copy), the QP binds it by id and sprays over its 8 generated EVs, every one used."""
    from mrc_emu.api import files
    from mrc_emu.api.profiles import EvProfileMode

    loaded = files.load(Path(mrc_emu.__file__).parent / "topologies" / "ev-profiles" / "default-h0-h2-gen.yaml")
    job, _ = _write("nscc", None, profile=loaded)
    api = job.requester.profile.api
    assert api.mode == EvProfileMode.GEN and api.ev_count == 8 and job.api_qp.attrs["ev_profile_id"] == api.profile_id
    assert api.fields == loaded.profile.fields
    assert all(stats.packets_sent > 0 for stats in job.requester.profile.evs.values())


def test_online_event_mask_and_fields_of_a_bound_gen_profile_reach_the_running_qp():
    """EV_PROFILE_MODIFY_ONLINE as the device advertises it: with a QP bound, EVENT_MASK and MODIFY_FIELDS
    change an ONLINE profile (anything else stays EBUSY), and the QP sends each EV's next packet on the
    value the new fields generate (here the spine field's uSIDs moved by 0x20)."""
    import errno

    from mrc_emu.api import files
    from mrc_emu.api.errors import MrcApiError
    from mrc_emu.api.expansion import generated_evs
    from mrc_emu.api.profiles import EvEventMask, EvField
    from mrc_emu.api.qp import QpState
    from mrc_emu.transport.requester import Requester

    loaded = files.load(Path(mrc_emu.__file__).parent / "topologies" / "ev-profiles" / "default-h0-h2-gen.yaml")
    paths = profile_paths(TOPO, loaded, "h0", "h2")
    control = HostControl("h0", TOPO.planes)
    pid = control.load_profile(loaded, paths.dst_address, {ev: p.plane + 1 for ev, p in paths.forward.items()})
    qp = control.ctl.create_qp()
    qp.modify(state=QpState.INIT, ev_profile_id=pid, cc_profile_id=control.cc_profile("fixed"))
    requester = Requester(ipaddress.IPv6Address(paths.src_address).packed, 0x11, 0x22, paths.forward, QpConfig(mtu=MTU),
                          random_bits=random.Random(1).getrandbits, ev_profile=control.ctl.ev_profile(pid),
                          value_paths=value_paths(TOPO, "h0", "h2", EvFormatMode.SRV6))
    with pytest.raises(MrcApiError) as busy:
        control.ctl.modify_ev_profile(pid, ev_min_active=2)
    assert busy.value.errno == errno.EBUSY
    control.ctl.modify_ev_profile(pid, ev_event_mask=EvEventMask.ASSUMED_BAD)
    fields = list(loaded.profile.fields)
    fields[1] = EvField(16, init_val=0x20, mask=0x1F, min_val=9, max_val=16)
    control.ctl.modify_ev_profile(pid, fields=fields)
    profile = control.ctl.ev_profile(pid)
    assert profile.ev_event_mask == EvEventMask.ASSUMED_BAD and profile.fields == tuple(fields)
    requester.post_write(bytes(8 * MTU), 0x1000, 1)
    sent = []
    requester.pump(0, lambda frame, path: sent.append((path.ev, bytes(frame[24:40]))) or True)
    new = {ev.index: ev.expanded[:16] for ev in generated_evs(profile)}
    assert sorted(ev for ev, _ in sent) == list(range(8)) and all(da == new[ev] for ev, da in sent)
    assert all(int.from_bytes(new[ev][4:6], "big") & 0x20 for ev in new)  # the spine uSIDs moved ...
    assert all(new[ev] != ipaddress.IPv6Address(paths.forward[ev].first_hop).packed for ev in new)  # ... off the old


@pytest.mark.parametrize("caps", [0, 0b101])
def test_the_destination_qp_caps_turn_off_trim_nacks_and_service_times(caps):
    """TRIM_NACK_DEST_UNSUPPORTED | SVC_TIME_DEST_UNSUPPORTED on the destination's QP (mrc.h: the peer lacks
    them): its responder answers a trimmed packet with no TRIM NACK (a loss to the requester) and its ACKs
    report no service time; without the caps, a TRIM NACK and the time the packet was held."""
    from mrc_emu.api.qp import QpCap
    from mrc_emu.transport.requester import Requester
    from mrc_emu.transport.responder import Responder
    from mrc_emu.wire import format as fmt
    from mrc_emu.wire.decoder import decode_udp, open_frame

    paths = qp_paths(TOPO, "h0", "h2")
    control = HostControl("h2", TOPO.planes)
    _, config = control.responder_qp(paths.src_address, paths.back, QpConfig(mtu=MTU), 0, EvFormatMode.SRV6, caps)
    assert (config.trim_nack, config.svc_time) == ((True, True) if caps == 0 else (False, False))
    assert caps == 0 or QpCap(caps) == QpCap.TRIM_NACK_DEST_UNSUPPORTED | QpCap.SVC_TIME_DEST_UNSUPPORTED
    src, dst = (ipaddress.IPv6Address(a).packed for a in (paths.src_address, paths.dst_address))
    responder = Responder(dst, config, random_bits=random.Random(1).getrandbits)
    mr = responder.register(bytearray(4 * MTU))
    responder.accept(0x22, 0x11, 0, paths.back, peer=src)
    requester = Requester(src, 0x11, 0x22, paths.forward, QpConfig(mtu=MTU), random_bits=random.Random(2).getrandbits)
    requester.post_write(bytes(2 * MTU), mr.va, mr.rkey)
    frames = []
    requester.pump(0, lambda frame, path: frames.append(bytes(frame)) or True)
    trimmed, whole = (open_frame(frame) for frame in frames)
    responder.on_datagram(bytes(trimmed.payload)[:fmt.TRIMMED_LEN], src, trimmed.sport, 1_000, fmt.DSCP_TRIMMED << 2)
    responder.on_datagram(bytes(whole.payload), src, whole.sport, 2_000, whole.tclass)
    answers = []
    responder.pump(50_000, lambda frame, path: answers.append(open_frame(frame)) or True)
    packets = [decode_udp(bytes(a.payload), dst, src, a.sport) for a in answers]
    nacks = [p for p in packets if isinstance(p, fmt.TrimNackPacket)]
    acks = [p for p in packets if isinstance(p, fmt.AckPacket)]
    assert acks and len(nacks) == (1 if caps == 0 else 0)
    assert responder.drops["trimmed_no_trim_nack"] == (0 if caps == 0 else 1)
    assert acks[-1].service_ns == (0 if caps else fmt.decode_service(fmt.encode_service(48_000)))


def test_an_ev_put_back_to_its_first_value_takes_its_first_path_again():
    """`ev replace --reset`: a `--format SRV6` QP's EV 1 moved to p0s2's carrier, then put back: its frames
    carry the full SRH segment list through p0s1 again (the first path as given, which no 32-byte value
    could name)."""
    from mrc_emu.transport.requester import Requester

    paths = qp_paths(TOPO, "h0", "h2")
    control = HostControl("h0", TOPO.planes)
    pid = control.ev_profile("h2", paths.forward, 1, EvFormatMode.SRV6)
    requester = Requester(ipaddress.IPv6Address(paths.src_address).packed, 0x11, 0x22, paths.forward,
                          QpConfig(mtu=MTU), random_bits=random.Random(1).getrandbits,
                          ev_profile=control.ctl.ev_profile(pid), value_paths=value_paths(TOPO, "h0", "h2", EvFormat.SRV6))
    first = requester.paths[1]
    control.replace_ev(pid, 1, ipaddress.IPv6Address(paths.evs[2].usid_carrier).packed)
    requester.pump(0, lambda frame, path: True)
    assert requester.paths[1].first_hop == paths.evs[2].usid_carrier and requester.paths[1] is not first
    control.replace_ev(pid, 1, None)
    requester.pump(1_000, lambda frame, path: True)
    assert requester.paths[1] is first and first.template.encap.extra > 24  # the full segment list
    assert [ev for _, ev, _, _ in requester.values.repaths] == [1, 1]
