"""The requester's C send loop (_spray.c) against its Python loop: the same frames, tables and state.

The requester's own loop in requester.py (with the pure-Python packet records of sent.py, so
SentPackets.deliver and .front run in Python too) is the reference; the C loop may only be
faster. Two requesters, identical but for that, each with its own responder, are driven through
the same events: pumps (with or without a send clock, at times that let a pacing rate gate
them), data frames delivered, reordered, dropped, CE-marked or trimmed on the way, ACKs, SACKs,
TRIM NACKs and CNPs delivered or lost on the way back, EVs made ASSUMED_BAD, DENIED or allowed
again mid-stream, and EVs whose frames cannot leave the host. After every event both must have
sent the same frames on the same EVs and agree on the sent-packet table, recovery and its ledger,
the CC's state and every call made to it (per packet for on_sent, with the packet's send time),
pacing, the EV statistics and schedule, and the completions. Each requester is bound to an api EV
profile of its host's controller and follows the values its slots hold: a REPLACE_EV mid-stream
(a SRV6 EV moved to another spine's carrier, a STEV EV given other flow label bits) re-paths the
EV's next frames in both loops alike.
"""

from __future__ import annotations

import ipaddress
import random
import socket
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mrc_emu.api.events import EvState
from mrc_emu.api.formats import EvFormatMode
from mrc_emu.experiments.runtime.hostctl import HostControl
from mrc_emu.topology import addressing as ad
from mrc_emu.topology import builtin, evs_between
from mrc_emu.topology.evs import EvFormat, default_stev
from mrc_emu.transport import requester as requester_module
from mrc_emu.transport import sent as sent_module
from mrc_emu.transport.cc.registry import make_cc
from mrc_emu.transport.config import QpConfig
from mrc_emu.transport.multipath.evvalues import value_paths
from mrc_emu.transport.multipath.paths import qp_paths, stev_paths
from mrc_emu.transport.multipath.rtt import RttEstimator
from mrc_emu.transport.requester import Requester
from mrc_emu.transport.responder import Responder
from mrc_emu.wire import format as fmt
from mrc_emu.wire.decoder import open_frame

pytestmark = pytest.mark.skipif(requester_module._spray is None, reason="the C send loop (mrc_emu.transport._spray) "
                                "is not built: python setup.py build_ext --inplace")

TOPO = builtin()
# the C loop keeps the templates of this many EVs parsed per call (MAX_CACHED in _spray.c), and its
# delivery aggregates this many EVs before merging (MAX_SEEN): EV counts on both sides of it
C_EV_LIMIT = 64
_PATHS = {8: qp_paths(TOPO, "h0", "h2")} | {
    n: stev_paths(TOPO, "h0", "h2", [default_stev(i) for i in range(n)]) for n in (C_EV_LIMIT, C_EV_LIMIT + 1, 100)}
_DATA_OPCODES = (fmt.Opcode.RDMA_WRITE_ONLY, fmt.Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE)
_DATA = bytes(range(251)) * (1 + (1 << 20) // 251)  # what WRITEs carry: no two packets alike
# a REPLACE_EV's new values: for the SRV6 QP, each spine's short carrier to h2 (fabric EV k's spine) on its plane's
# port; for the STEV ones, other flow label bits over the same source port
_CARRIERS = [(ipaddress.IPv6Address(ad.usid_carrier([TOPO.node(ev.spine).node_id, TOPO.node("h2").node_id],
                                                    ad.USID_DECAP_FUNCTION)).packed, ev.plane + 1)
             for ev in evs_between(TOPO, "h0", "h2")]
_CC_CALLS = ("on_sent", "on_acked", "on_lost", "on_trimmed", "on_timeout", "on_cnp")
_RTT = RttEstimator.__slots__


class _Clock:
    """A send clock that moves on by `tick` ns at every read: each read is a later send time, so
    a loop that reads it more or less often than the other stamps its packets differently."""

    def __init__(self) -> None:
        self.t = 0
        self.tick = 0

    def __call__(self) -> int:
        self.t += self.tick
        return self.t


class _World:
    """A requester (C loop or Python loop), its responder, and what is on the wire between them."""

    def __init__(self, c_loop: bool, n_evs: int, setup: dict) -> None:
        paths = _PATHS[n_evs]
        src, dst = (socket.inet_pton(socket.AF_INET6, a) for a in (paths.src_address, paths.dst_address))
        # short timers (an ACK timeout of 262 us, EV timers from 50 us) so that losses show within a few events
        config = QpConfig(mtu=setup["mtu"], burst=setup["burst"], mpr=setup["mpr"], ack_every=setup["ack_every"],
                          ack_timeout_exp=8, reorder_floor_ns=50_000, ack_delay_ns=20_000, probe_interval_ns=30_000,
                          cnp=True, cnp_interval_ns=5_000)
        self.responder = Responder(dst, config, random_bits=random.Random(1).getrandbits)
        self.buffer = bytearray(setup["region"])
        self.mr = self.responder.register(self.buffer)
        self.responder.accept(0x22, 0x11, setup["start_psn"], paths.back, config=config)
        self.responder.post_recv(0x22, 64)
        cc = make_cc(setup["cc"], config.mtu, setup["link_rate"], setup["base_rtt"], **setup["cc_options"])
        self.cc_calls: list[tuple] = []  # since the last snapshot
        self.cc_history: list[tuple] = []  # all of them
        for name in _CC_CALLS:  # every call the requester makes to its CC, in order (instance attributes win)
            setattr(cc, name, self._recording(name, getattr(cc, name)))
        # the reference keeps pure-Python packet records, so delivery and front() run in Python as well
        records = sent_module.Pkt if c_loop else sent_module.PyPkt
        ev_format = EvFormat.SRV6 if n_evs == 8 else EvFormat.STEV
        self.control = HostControl("h0", TOPO.planes)  # the host's controller: the QP's EV profile, REPLACE_EV
        self.profile_id = self.control.ev_profile("h2", paths.forward, 1, EvFormatMode.SRV6 if n_evs == 8
                                                  else EvFormatMode.STEV)
        with mock.patch.object(sent_module, "Pkt", records):
            self.requester = Requester(src, 0x11, 0x22, paths.forward, config, cc, start_psn=setup["start_psn"],
                                       c_loop=c_loop, random_bits=random.Random(2).getrandbits,
                                       ev_profile=self.control.ctl.ev_profile(self.profile_id),
                                       ev_events=self.control.ctl.events,
                                       value_paths=value_paths(TOPO, "h0", "h2", ev_format))
        assert (self.requester._spray is not None) == c_loop
        self.sprayed = 0  # packets the C loop sent itself
        self.widest = 0  # the most EVs one call of the C loop sent on
        if c_loop:
            self.requester._spray = self._counting(self.requester._spray)
        self.paced = 0  # pumps that left data waiting for the pacing bucket
        self.widest_ack = 0  # the most EVs one event's ACKs delivered packets of
        self.last_frames: list[tuple[int, bytes]] = []  # the frames of the latest event
        self.evs = sorted(paths.forward)
        self.now = 0
        self.clock = _Clock()
        self.refuse: set[int] = set()  # EVs whose frames cannot leave the host (its port is down)
        self.wire: list[bytes] = []  # data frames and probes on their way to the responder
        self.back: list[bytes] = []  # ACKs, NAKs, TRIM NACKs, CNPs and probe answers on their way back
        self.frames: list[tuple[int, bytes]] = []  # every frame the requester sent since the last snapshot
        self.frames_log: list[tuple[int, bytes]] = []  # every frame the requester sent

    def _recording(self, name: str, call):
        def recorded(*args, **kwargs):
            self.cc_calls.append((name, args, kwargs))
            return call(*args, **kwargs)
        return recorded

    def _counting(self, spray):
        def counted(*args):
            out = spray(*args)
            self.sprayed += out[0]
            self.widest = max(self.widest, len(out[5]))
            return out
        return counted

    def _send(self, frame, path) -> bool:
        data = bytes(frame)  # a C loop's frame is a view of a slot it reuses
        self.frames.append((path.ev, data))
        self.frames_log.append((path.ev, data))
        if path.ev in self.refuse:
            return False
        self.wire.append(data)
        return True

    def _send_back(self, frame, path) -> bool:
        self.back.append(bytes(frame))
        return True

    def run(self, event: tuple) -> None:
        kind, *args = event
        r = self.requester
        if kind == "pump":
            dt, tick = args
            self.now = max(self.now + dt, self.clock.t)  # time never runs back behind a stamp
            self.clock.t, self.clock.tick = self.now, tick
            r.pump(self.now, self._send, clock=self.clock if tick else None)
            self.paced += r._pace_tokens < 0 and r._can_send()
        elif kind == "arrive":
            index, fate = args
            if self.wire:
                self._arrive(self.wire.pop(index % len(self.wire)), fate)
            self.responder.pump(self.now, self._send_back)
        elif kind == "answer":
            index, lost = args
            if self.back:
                frame = self.back.pop(index % len(self.back))
                if not lost:
                    self._deliver(frame)
        elif kind == "overtake":  # all but the oldest frame arrive, newest first, and every answer is lost
            while len(self.wire) > 1:
                self._arrive(self.wire.pop(), "ok")
            self.responder.pump(self.now, self._send_back)
            self.back.clear()
        elif kind == "flush":  # everything on the wire arrives, in order, and then every answer
            while self.wire:
                self._arrive(self.wire.pop(0), "ok")
            self.responder.pump(self.now, self._send_back)
            while self.back:
                self._deliver(self.back.pop(0))
        elif kind == "ev":
            index, what = args
            ev = self.evs[index % len(self.evs)]
            if what == "bad":
                r.profile.set_state(ev, EvState.ASSUMED_BAD, self.now, "test: assumed bad")
            elif what == "deny":
                r.profile.deny(ev, self.now, "test")
            else:
                r.profile.allow(ev, self.now, EvState.GOOD if what == "allow_good" else EvState.ASSUMED_BAD)
        elif kind == "replace":  # REPLACE_EV of an EV's value by the host's controller
            index, choice = args
            ev = self.evs[index % len(self.evs)]
            if len(self.evs) == 8:
                value, port = _CARRIERS[choice % len(_CARRIERS)]
            else:
                old = r.paths[ev].template
                value, port = ((choice * 0x3A5 + 1 & 0xFFFF) << 16 | old.ends.sport).to_bytes(4, "big"), choice % 2 + 1
            try:
                self.control.replace_ev(self.profile_id, ev, value, port)
            except ValueError:  # another EV holds its value already: REPLACE_EV could not name this one
                pass
        elif kind == "refuse":
            self.refuse ^= {self.evs[args[0] % len(self.evs)]}
        elif kind == "post":
            size, imm = args
            offset = (r.packets_sent * 977) % max(1, len(self.buffer) - size)
            r.post_write(_DATA[offset % 251:offset % 251 + size], self.mr.va + offset, self.mr.rkey, imm, now=self.now)
        else:
            raise AssertionError(f"unknown event {event!r}")

    def _arrive(self, frame: bytes, fate: str) -> None:
        """A frame of the requester's reaches the responder, as the fabric leaves it."""
        if fate == "drop":
            return
        opened = open_frame(frame)
        payload, tclass = bytes(opened.payload), opened.tclass
        if payload[:1] and payload[0] in _DATA_OPCODES:
            if fate == "ce" and tclass & fmt.ECN_MASK:
                tclass |= fmt.ECN_CE
            elif fate in ("trim", "trim_last_hop") and len(payload) > fmt.TRIMMED_LEN:
                dscp = fmt.DSCP_TRIMMED_LASTHOP if fate == "trim_last_hop" else fmt.DSCP_TRIMMED
                payload, tclass = payload[:fmt.TRIMMED_LEN], dscp << 2 | (tclass & fmt.ECN_MASK)
        for _ in range(2 if fate == "duplicate" else 1):
            self.responder.on_datagram(payload, opened.src, opened.sport, self.now, tclass)

    def _deliver(self, frame: bytes) -> None:
        opened = open_frame(frame)
        self.requester.on_datagram(bytes(opened.payload), opened.src, opened.sport, self.now, opened.tclass)

    def snapshot(self) -> dict:
        """Everything of the requester either loop could leave differently (the frames and CC calls
        since the last snapshot)."""
        r = self.requester
        rec, table, profile, ledger = r.recovery, r.recovery.sent, r.profile, r.recovery.ledger
        frames, self.frames = self.frames, []
        calls, self.cc_calls = self.cc_calls, []
        self.cc_history += calls
        self.last_frames = frames
        self.widest_ack = max(self.widest_ack, len({a[1] for name, a, _ in calls if name == "on_acked" and a[2]}))
        cc = {k: v for k, v in vars(r.cc).items() if k not in _CC_CALLS}
        return {
            "frames": frames, "cc_calls": calls, "cc": cc, "cwnd": r.cc.cwnd, "rate": r.cc.pacing_rate_bps,
            "pkts": {psn: (p.psn, p.wr.wr_id, p.offset, p.length, p.last, p.ev, p.sent_ns, p.left_ns, p.tx)
                     for psn, p in table.pkts.items()},
            "flight": list(table.flight), "by_ev": {ev: list(q) for ev, q in table.by_ev.items()},
            "ev_flight": dict(table.ev_flight), "bytes_in_flight": table.bytes_in_flight, "retx": list(table.retx),
            "recovery": (rec.una, rec.next_psn, rec.sacked, rec.rack_sent_ns, rec.bytes_acked, rec.timeouts,
                         rec.duplicates_acked, rec.trims, rec.trims_resent, rec.deferred, dict(rec.lost_by)),
            "ledger": (ledger.to_dict(), list(ledger.trim_repairs), dict(ledger._trimmed)),
            "pacing": (r._pace_tokens, r._pace_at, r._pace_rate), "wakeup": r.next_wakeup(), "clock": self.clock.t,
            "evs": {ev: ({k: v for k, v in vars(s).items() if k != "rtt"}, [getattr(s.rtt, k) for k in _RTT])
                    for ev, s in profile.evs.items()},
            "schedule": (list(profile.schedule), profile._cursor, profile._cycles, profile._dirty),
            "ev_events": [e.to_dict() for e in profile.events], "summary": r.summary(), "error": r.error,
            "writes": [(wr.wr_id, wr.next_offset, wr.acked) for wr in r.active], "queued": [wr.wr_id for wr in r.queue],
            "completions": [(c.wr_id, c.length, c.time_ns, c.imm) for c in r.completions], "repaths": list(r.values.repaths),
            "responder": dict(self.responder.stats),
        }


def _compare(setup: dict, n_evs: int, events: list[tuple]) -> tuple[_World, _World]:
    """Both loops through `events`; they must agree after every one. Returns (C world, Python world)."""
    worlds = _World(True, n_evs, setup), _World(False, n_evs, setup)
    for world in worlds:
        world.run(("post", setup["first_write"], setup["imm"]))
    assert worlds[0].snapshot() == worlds[1].snapshot()
    for i, event in enumerate(events):
        for world in worlds:
            world.run(event)
        c, py = (w.snapshot() for w in worlds)
        if c != py:
            differ = sorted(k for k in c if c[k] != py[k])
            assert c == py, f"after event {i} {event!r} the loops differ in {differ}"
    assert worlds[0].buffer == worlds[1].buffer  # what the responders placed
    return worlds


_FATES = ["ok"] * 6 + ["drop", "ce", "ce", "trim", "trim_last_hop", "duplicate"]
_pump = st.tuples(st.just("pump"), st.sampled_from([0, 1_000, 5_000, 20_000, 100_000, 400_000]),
                  st.sampled_from([0, 0, 300, 2_000]))  # dt, and the send clock's tick (0: no clock)
_answer = st.tuples(st.just("answer"), st.integers(0, 100), st.sampled_from([False, False, False, True]))
_size = st.one_of(st.integers(1, 200_000), st.sampled_from([1, 1024, 64 * 1024, 100_000, 199_999]))
event = st.one_of(
    _pump, _pump, _pump, _answer, _answer,
    st.tuples(st.just("arrive"), st.integers(0, 1000), st.sampled_from(_FATES)),
    st.tuples(st.just("arrive"), st.just(0), st.sampled_from(_FATES)),  # in order
    st.tuples(st.just("flush")),
    st.tuples(st.just("overtake")),
    st.tuples(st.just("ev"), st.integers(0, 200), st.sampled_from(["bad", "bad", "deny", "allow_good", "allow_bad"])),
    st.tuples(st.just("refuse"), st.integers(0, 200)),
    st.tuples(st.just("replace"), st.integers(0, 200), st.integers(0, 200)),
    st.tuples(st.just("post"), _size, st.sampled_from([None, None, 9])),
)
setup = st.fixed_dictionaries({
    "mtu": st.sampled_from([256, 1024]), "burst": st.sampled_from([32, 80]), "ack_every": st.sampled_from([4, 32]),
    "mpr": st.sampled_from([1, 8]), "start_psn": st.sampled_from([0, 0xFFFFF0]), "region": st.just(1 << 20),
    "cc": st.sampled_from(["nscc", "dcqcn", "fixed"]), "link_rate": st.sampled_from([None, 1e9, 10e9]),
    "base_rtt": st.sampled_from([None, 20_000]),  # None: DCQCN's window is no BDP, so its pacing rate limits
    "first_write": _size, "imm": st.sampled_from([None, 7]),
    "window": st.sampled_from([None, None, 5_000, 20_000]),  # bytes: a window that a burst fills, or the profile's
}).map(lambda s: s | {"cc_options": _cc_options(s["cc"], s["window"])})


def _cc_options(cc: str, window: int | None) -> dict:
    """A profile's options: DCQCN's byte counter and timers short enough to run in a few events."""
    options = {"byte_counter": 20_000, "increase_timer_ns": 50_000, "alpha_timer_ns": 10_000} if cc == "dcqcn" else {}
    if window is not None:
        options["max_cwnd" if cc == "nscc" else "window"] = window
    return options


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(setup=setup, n_evs=st.sampled_from(sorted(_PATHS)), first=_pump, events=st.lists(event, min_size=20, max_size=80))
def test_the_c_send_loop_does_what_the_python_loop_does_event_by_event(setup, n_evs, first, events):
    """Any events in any order (from a first pump on), over 8 EVs or on either side of the C loop's
    64: after each one the two loops have sent the same frames and hold the same state (`_World.snapshot`)."""
    _compare(setup, n_evs, [first] + events)


# ---- scenarios: each case the generated events must cover, made to happen, and seen to happen ----------

def _setup(**kw) -> dict:
    return {"mtu": 1024, "burst": 32, "mpr": 8, "ack_every": 32, "start_psn": 0xFFFFF0, "region": 1 << 20,
            "cc": "fixed", "link_rate": None, "base_rtt": None, "first_write": 200_000, "imm": None, "cc_options": {}} | kw


def _psns(frames: list[tuple[int, bytes]]) -> list[int]:
    """The PSNs of the data frames among `frames`, in order."""
    out = []
    for _, frame in frames:
        payload = bytes(open_frame(frame).payload)
        if payload[0] in _DATA_OPCODES:
            out.append(int.from_bytes(payload[9:12], "big"))
    return out


def test_faults_mid_stream_a_refused_frame_and_a_send_clock():
    """EVs made ASSUMED_BAD and DENIED between pumps, frames lost, duplicated and late, ACKs lost, a
    port down under a ticking send clock (the refused packet counts against its EV at its own stamp,
    and no later stamp moves), ACK timeouts and resends: the loops agree throughout."""
    events = [("pump", 0, 300), ("refuse", 2), ("pump", 1_000, 300), ("ev", 3, "bad"), ("arrive", 5, "drop"),
              ("arrive", 0, "duplicate"), ("arrive", 7, "ok"), ("answer", 0, True), ("flush",), ("pump", 5_000, 300),
              ("ev", 4, "deny"), ("refuse", 2), ("pump", 20_000, 2_000), ("arrive", 3, "drop"), ("arrive", 2, "ok"),
              ("flush",), ("pump", 400_000, 300), ("ev", 4, "allow_good"), ("pump", 1_000, 0), ("flush",),
              ("post", 30_000, 9)] + [("pump", 100_000, 300), ("flush",)] * 12
    c, _ = _compare(_setup(), 8, events)
    r = c.requester
    assert r.send_failures > 0 and r.recovery.timeouts > 0 and r.retransmits > 0 and c.sprayed > 0
    assert {"ASSUMED_BAD", "DENIED"} <= {e.new.name for e in r.ev_events}
    assert r.error is None and len(r.completions) == 2


def test_dcqcn_paced_by_a_ticking_clock_tells_the_cc_of_each_packet_at_its_stamp():
    """CE marks make the responder send CNPs, DCQCN cuts its rate, and pumps a few microseconds apart
    find the pacing bucket empty: the C loop sends only what the bucket allows, and each packet's
    on_sent comes with its own stamp (the byte counter and timers run on it)."""
    setup = _setup(cc="dcqcn", link_rate=2e9, first_write=600_000,
                   cc_options={"byte_counter": 8_000, "increase_timer_ns": 50_000, "alpha_timer_ns": 10_000})
    events = []
    for i in range(40):
        events += [("pump", 5_000, 300), ("arrive", 0, "ce" if i in (2, 12) else "ok"), ("arrive", 0, "ok"),
                   ("answer", 0, False), ("answer", 0, False)]
    c, _ = _compare(setup, 8, events + [("pump", 3_000, 300), ("flush",)] * 30)
    cc = c.requester.cc
    assert cc.cnps > 0 and cc.bc_count > 0 and c.paced > 5 and c.sprayed > 0


def test_a_send_clock_stamps_each_on_sent_apart():
    """One pump of full packets under a ticking clock: one on_sent per packet, each with its own send
    time (the stamp its packet is recorded with), from the C loop as from the Python one."""
    c, _ = _compare(_setup(cc="nscc"), 8, [("pump", 1_000, 700)])
    table = c.requester.recovery.sent
    stamps = [table.pkts[psn].sent_ns for psn in table.flight]
    assert c.sprayed == len(stamps) == 32 and len(set(stamps)) == 32
    assert [args for name, args, _ in c.cc_history if name == "on_sent"] == [
        (table.pkts[psn].sent_ns, table.pkts[psn].ev, 1024) for psn in table.flight]
    assert c.requester.cc.last_adjust_time == stamps[0]  # NSCC began at the first packet's stamp, not at `now`


@pytest.mark.parametrize("n_evs", [C_EV_LIMIT, C_EV_LIMIT + 1, 100])
def test_more_evs_than_the_c_loop_caches(n_evs):
    """Bursts of 80 packets over 64, 65 and 100 EVs (the C loop parses 64 EVs' templates per call,
    more go through its scratch entry one packet per batch), and an ACK that delivers packets of
    more than 64 EVs at once (its delivery merges 64 EVs at a time): the loops agree."""
    setup = _setup(mtu=256, burst=80, first_write=100_000)
    events = [("pump", 1_000, 0), ("pump", 1_000, 300), ("pump", 1_000, 0)]
    events += [("overtake",), ("arrive", 0, "ok"), ("answer", 0, False)]  # the first PSN last: one ACK for all
    events += [("pump", 1_000, 0), ("flush",)] * 10
    c, _ = _compare(setup, n_evs, events)
    assert c.widest > C_EV_LIMIT if n_evs > C_EV_LIMIT else c.widest == C_EV_LIMIT
    assert c.widest_ack > C_EV_LIMIT if n_evs > C_EV_LIMIT else c.widest_ack == C_EV_LIMIT
    assert c.requester.done and c.requester.error is None


def test_trimmed_packets_are_resent_first_then_the_c_loop_goes_on():
    """TRIM NACKs between pumps: the next pump resends the trimmed packets first (the Python loop),
    then the C loop sends new ones, in both loops alike."""
    events = [("pump", 0, 0)] + [("arrive", 4, "trim")] * 2 + [("arrive", 9, "trim_last_hop")] + [
        ("answer", 0, False)] * 3 + [("pump", 1_000, 300)]
    c, _ = _compare(_setup(), 8, events)
    trimmed = sorted(psn & 0xFFFFFF for psn in c.requester.recovery.ledger._trimmed)
    psns = _psns(c.last_frames)
    assert len(trimmed) == c.requester.recovery.trims_resent == 3
    assert len(psns) == 32 and sorted(psns[:3]) == trimmed and c.sprayed == 32 + 29


def test_the_packets_that_fill_the_window_ask_for_an_ack():
    """A window of 12 packets filled by the first pump: those sent with less than four packets' room
    left after them (the last three, whose ACK would otherwise wait for the responder's delay) carry
    AckReq, from the C loop as from the Python one."""
    setup = _setup(cc_options={"window": 12 * 1024})
    c, _ = _compare(setup, 8, [("pump", 0, 0)])
    ack_req = [bool(open_frame(frame).payload[8] & 0x80) for _, frame in c.last_frames]
    assert c.sprayed == 12 and ack_req == [False] * 9 + [True] * 3


@pytest.mark.parametrize("n_evs", [8, C_EV_LIMIT + 1])
def test_a_replaced_ev_value_reaches_the_c_loop_at_its_next_pump(n_evs):
    """REPLACE_EV under traffic: EV 1 of the SRV6 QP moved from spine p0s1 to p0s2's carrier (EV 1 of the
    STEV QP, on port 2, given other flow label bits and port 1), between pumps. Both loops send EV 1's next frames
    on the new value (outer destination and SRH segment, or flow label; its first hop and plane), the
    C loop among them, and agree on every frame and all state; the WRITE completes."""
    before = [("pump", 0, 0), ("arrive", 0, "ok"), ("answer", 0, False), ("pump", 1_000, 300)]
    after = [("pump", 1_000, 300), ("flush",)] * 12
    c, _ = _compare(_setup(burst=80, mtu=256, first_write=60_000), n_evs, before + [("replace", 1, 2)] + after)
    r = c.requester
    path = r.paths[1]
    frames = [frame for ev, frame in c.frames_log if ev == 1 and open_frame(frame).payload[0] in _DATA_OPCODES]
    if n_evs == 8:
        carrier = _CARRIERS[2][0]
        assert path.first_hop == str(ipaddress.IPv6Address(carrier)) and path.plane == 0
        decap = ipaddress.IPv6Address(ad.decap_sid(TOPO.node("h2").node_id)).packed
        assert frames[0][24:40] != carrier and frames[-1][24:40] == carrier and frames[-1][48:64] == decap
    else:
        label = (2 * 0x3A5 + 1) & 0xFFFF
        gateway = value_paths(TOPO, "h0", "h2", EvFormat.STEV).gateways[1]
        assert path.template.flow_label == label and path.plane == 0 and path.first_hop == gateway
        flow_label = [int.from_bytes(frame[:4], "big") & 0xFFFFF for frame in frames]
        assert flow_label[0] != label and flow_label[-1] == label
    assert [(ev, port) for _, ev, _, port in r.values.repaths] == [(1, 1)]
    assert c.sprayed > 0 and r.done and r.error is None
