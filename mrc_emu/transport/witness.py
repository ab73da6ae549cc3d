"""Witness probes: is a quiet EV dead, or only queued? An EV probe decides, in about one RTT.

Why it exists: when one EV goes quiet while the others deliver, its packets are either lost (a
blackholed or dead link) or waiting in a queue the others do not share (a plane's port filling
in an incast, a host's NIC with a backlog). Loss rules on RTT estimates cannot tell the two
apart fast enough: a queue grows faster than any estimate follows (a fault-free incast run
marked EVs ASSUMED_BAD on a queue), and a timer wide enough for every queue takes milliseconds
to find a dead path. A probe can: it rides the switches' control class, ahead of the data
queued at every port, and the responder answers it at its next pump, before the ACKs of
anything that arrived after it. So the requester sends a **witness** probe along a quiet EV
and watches the ACKs of packets it sent later on the same plane (the same NIC queues out and
back, the same hop count): once one of those is acknowledged and the witness's answer is still
missing, the EV is dead; when the answer comes first, the EV is alive and its packets are
queued (its own later packets and its RTT judge them, loss.py), and its losses sent before the
witness count nothing towards a path failure.

The rules, each threshold from the EVs' own RTT estimators:
- **suspect**: a GOOD EV whose oldest packet in flight was sent before a packet now known
  delivered (on any EV), and that has delivered nothing for its smallest RTT and its reorder
  allowance since that packet left or since it last delivered, whichever is later; or one
  whose losses (loss.py) make a run of `bad_after_losses`. One witness at a time per EV; after an
  answer the next one for a quiet EV waits two of its smallest RTTs (not one for losses).
- **dead**, on an ACK: a packet it delivered, on another EV of the same plane, left more than
  the allowance after the witness: the EV's reorder window (a quarter of its smallest RTT, at
  least the QP's floor), how much longer its smallest RTT is than that EV's smallest was when
  the EV last took a sample (over the same span: a quiet EV's stays what it saw before, perhaps
  only a start-up queue, while its siblings' go on to see the plane idle), and a data packet's
  serialisation at each switch port of the round trip.
- **dead**, by time (judged at the emulation's horizon): a witness of an EV none of whose
  siblings delivered anything sent after it (a plane of one EV, a plane down) once something
  sent after it was delivered, or, sent when nothing else was left, all was acknowledged; then
  twice the EV's srtt, its window, the ports' serialisation and the responder's ACK delay
  after it left. One whose siblings delivered packets sent after it but carry nothing more (the
  QP's data ended) once a sibling's packet sent an allowance after it would have been
  acknowledged: twice that sibling's srtt and the ACK delay later. No ACK is left to judge it.
- **two in a row** (`QpConfig.witnesses`): the first dead witness suspends the EV and sends the
  next at once; the second makes it ASSUMED_BAD; an answer resumes it.
- **alive**: the witness's answer arrived, or the EV delivered a packet sent after it.
A dead witness makes every packet in flight on the EV lost at once, resent on the GOOD EVs;
the last one makes the EV ASSUMED_BAD (as the device does: never below ev_min_active); probes
bring it back.

Like loss.py it reads no clock: time comes in as `now`, probes go out through the prober.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ..api.events import EvState
from .multipath.paths import Send

if TYPE_CHECKING:
    from .probing import EvProber
    from .recovery import Recovery
    from .sent import PyPkt

DEAD = "its witness probe went unanswered while later packets on its plane were acknowledged"
DEAD_TIMER = "its witness probe went unanswered within two RTTs while later packets were acknowledged"
DEAD_IDLE = "its witness probe went unanswered while nothing else on its plane was in flight"
RULES = {DEAD_TIMER: "timer", DEAD_IDLE: "idle"}  # the summary's name of each rule but the ACKs' ("plane")
FOUND_DEAD = "its path failed (witness probe unanswered)"  # the reason its packets in flight are lost
TIMER_RTTS = 2  # the timer: twice the EV's srtt (and its window and the ACK delay) for an answer
AFTER_RTTS = 2  # an answered EV's next witness: after two of its smallest RTTs (or windows)
HOLDUP_PORTS = 6  # switch egress ports of a two-tier path, out and back (leaf, spine, leaf each way)
FRAME_OVERHEAD = 140  # a data frame's bytes beyond its payload: Ethernet, outer IPv6 and SRH, IPv6, UDP, BTH, RETH, ICRC


class Witness:
    """The witness probes of one requester's EVs: when to send one, and what its fate says."""

    def __init__(self, recovery: Recovery, prober: EvProber) -> None:
        self.rec = recovery
        self.prober = prober
        self.replan()
        self.out: dict[int, tuple[int, int]] = {}  # EV -> (probe id, send time) of its witness in flight
        self.after: dict[int, int] = {}  # EV -> no witness before this time (an answer's EV waits its srtt)
        self.suspects: set[int] = set()  # EVs whose losses ask for a witness at the next pump
        self.strikes: dict[int, int] = {}  # EV -> its witnesses in a row found unanswered
        self.sent = 0
        self.answered = 0
        self.dead = 0
        self.late = 0  # witnesses answered after all, once their EV was taken for dead (a false failure)
        self._convicted: dict[int, int] = {}  # probe id -> send time, of the witnesses taken for lost
        self.verdicts: list[tuple[int, int, int, str, int]] = []  # (EV, witness sent, found dead, rule, lead): the first 64
        self.lead_ns = 0  # the largest lead of a later sibling's ACK over an answer that still came
        self._lead: dict[int, int] = {}  # EV -> that lead for its witness in flight
        self._marks: dict[int, tuple[int, int]] = {}  # EV -> (PSN, when): its witness's mark (_mark)
        self._proofs: dict[int, tuple[int, int]] = {}  # EV -> (when, lead): first proof by an ACK of another plane
        prober.witness = self
        recovery.witness = self

    def replan(self) -> None:
        """Each EV's siblings, from the EV profile's planes (again after a REPLACE_EV moved a path):
        none where the plane is unknown (an ECMP-hashed path may go anywhere)."""
        planes = self.rec.profile.planes
        self.siblings = {ev: [k for k, p in planes.items() if k != ev and p == plane]
                         for ev, plane in planes.items() if plane is not None}

    # ---- thresholds -----------------------------------------------------------------------

    def window(self, ev: int) -> int:
        """How far a witness of `ev` may trail its siblings' packets: its reorder window."""
        return max(self.rec.config.reorder_floor_ns, self.rec.profile.evs[ev].rtt.min_rtt_ns // 4)

    def allowance(self, ev: int, other: int) -> int:
        """How much later than the witness of `ev` a packet on `other` (same plane) must have left
        for its ACK to prove the witness lost: the window, the smallest RTTs' difference, and a
        full data packet's serialisation at each switch port of the way out and back (a port
        sends what it has begun before the control class's next packet: no preemption).

        The two smallest RTTs are compared over the same span of time: `other`'s as it was when
        `ev` last took a sample. A quiet EV's smallest RTT stays what it saw before it went quiet
        (all of it, perhaps, behind its host's start-up queue), while its sibling's later samples
        see the plane idle: the difference would then be that queue, not the paths' lengths."""
        mine, theirs = self.rec.profile.evs[ev].rtt, self.rec.profile.evs[other].rtt
        then = theirs.min_by(mine.heard_ns) or theirs.min_rtt_ns  # (forgotten: the smallest of all)
        longer = max(0, mine.min_rtt_ns - then) if mine.min_rtt_ns and then else 0
        return self.window(ev) + longer + self.holdup_ns

    def grace(self, ev: int) -> int:
        """How long after an ACK back on another plane proved the witness of `ev` lost its answer may
        still come: its EV's smoothed RTT and four of its variations (the queues of its plane's way
        back as its own ACKs found them, as a retransmission timer allows), at least its reorder
        window. An ACK back on the witness's plane proves it at once, and at the emulator's rate
        comes within a few ACKs (every 32 packets; the echo's EV is the last arrival's)."""
        rtt = self.rec.profile.evs[ev].rtt
        return max(self.window(ev), int(self._or_known(rtt.srtt_ns) + 4 * rtt.rttvar_ns))

    @property
    def holdup_ns(self) -> int:
        """What the ports of a witness's round trip may hold it behind data they are sending."""
        rate = self.rec.config.link_rate_bps
        if not rate:
            return 0  # an unshaped fabric: no port serialises at a rate
        return int(HOLDUP_PORTS * (self.rec.config.mtu + FRAME_OVERHEAD) * 8e9 / rate)

    def _quiet_since(self, ev: int, pkt: PyPkt) -> int | None:
        """When `ev`, with `pkt` its oldest packet in flight, counts as quiet (None: no RTT is known yet)."""
        stats = self.rec.profile.evs[ev]
        base = self._or_known(stats.rtt.min_rtt_ns)
        if not base:
            return None
        # its packet's ACK is due a smallest RTT after it left, or, if the EV delivered since, as
        # long after that delivery's ACK as the packet left after the latest packet it covered
        heard = stats.last_heard_ns + max(0, pkt.sent_ns - stats.last_delivered_sent_ns)
        return max(pkt.sent_ns + int(base), heard) + self.window(ev)

    def _or_known(self, rtt_ns: float) -> float:
        """`rtt_ns`, or before any sample of the EV's own (a loaded emulator may give none for a
        while) the QP's largest srtt, else the fabric's base RTT measured before the run (0: none)."""
        return rtt_ns or self.rec.largest_srtt() or self.rec.config.base_rtt_ns or 0

    def _eligible(self, ev: int, now: int | None) -> bool:
        """Whether `ev` may get a witness now (`now` None: whenever an answer was last heard)."""
        profile = self.rec.profile
        return (ev not in self.out and profile.evs[ev].state is EvState.GOOD and ev in self.prober.paths
                and ev not in profile.excluded and (now is None or now >= self.after.get(ev, 0)))

    # ---- sending ----------------------------------------------------------------------------

    def due(self, now: int) -> list[int]:
        """The EVs to send a witness along now."""
        rec = self.rec
        known = rec.decide_at(now)
        due = []
        for ev in rec.sent.by_ev:
            if ev in self.suspects:  # losses, or a first dead witness: at once
                if self._eligible(ev, None):
                    due.append(ev)
                continue
            if not self._eligible(ev, now):
                continue
            pkt = rec.sent.front(ev)
            if pkt is None or pkt.sent_ns >= rec.rack_sent_ns:
                continue
            quiet = self._quiet_since(ev, pkt)
            if quiet is not None and known >= quiet:
                due.append(ev)
        return due

    def pump(self, now: int, send: Send, clock: Callable[[], int] | None = None) -> None:
        """Send the witnesses that are due; judge those the timer rule convicts."""
        self.timer(now)
        self._mark(now)
        for ev in self.due(now):
            self.suspects.discard(ev)
            stamp = clock() if clock is not None else now
            probe_id = self.prober.send_probe(ev, stamp, send)
            if probe_id is not None:
                self.out[ev] = (probe_id, stamp)
                self._lead[ev] = 0
                self.sent += 1

    def suspect(self, ev: int) -> None:
        """Losses on `ev` make a run: witness it at the next pump (unless one is out already)."""
        self.suspects.add(ev)

    # ---- verdicts ---------------------------------------------------------------------------

    def on_answer(self, ev: int, probe_id: int, now: int) -> bool:
        """A probe of `ev` was answered: if it was the witness (True), the EV is alive up to its send time."""
        out = self.out.get(ev)
        if out is None or out[0] != probe_id:
            if probe_id in self._convicted:  # answered after all: a reordering or a slower path, not a failure
                # its path is slower than the EV's smallest RTT said (a longer route, a delay): that
                # starts again from this answer, so the EV's next witness allows for it
                self.rec.profile.evs[ev].rtt.rebase(now - self._convicted.pop(probe_id), at_least=True, now=now)
                self.late += 1
                if self.rec.profile.evs[ev].state is EvState.GOOD:
                    self._clear(ev)  # its next witness, if out, is moot
                    return True
            return False
        self._alive(ev, out[1], now)
        self.answered += 1
        self.lead_ns = max(self.lead_ns, self._lead.pop(ev, 0))
        return True

    def _clear(self, ev: int) -> None:
        """No strikes against `ev` any more, and it carries data again."""
        self.strikes.pop(ev, None)
        self.rec.profile.resume(ev)

    def _alive(self, ev: int, sent_ns: int, now: int) -> None:
        self._clear(ev)
        del self.out[ev]
        self._marks.pop(ev, None)
        self._proofs.pop(ev, None)
        self.rec.profile.on_alive(ev, sent_ns)
        stats = self.rec.profile.evs[ev]
        # the next witness of an EV still quiet after this answer waits two of its smallest RTTs: its
        # srtt would do, but an emulator's own queues inflate it (to 10 ms in one demo run, in which
        # the next witness of the EV then came 9.8 ms after the blackhole)
        self.after[ev] = now + AFTER_RTTS * max(stats.rtt.min_rtt_ns, self.window(ev))
        self.suspects.discard(ev)

    def _mark(self, now: int) -> None:
        """Note, for each witness out, the first PSN the QP sends once it is an allowance old
        (against every sibling): every packet from that PSN on left late enough to prove it."""
        for ev, (_, sent_ns) in self.out.items():
            if ev not in self._marks and now >= sent_ns + max(
                    (self.allowance(ev, k) for k in self.siblings.get(ev, ())), default=0):
                self._marks[ev] = (self.rec.next_psn, now)

    def on_delivered(self, seen: dict[int, list[int]], now: int, back_ev: int | None = None,
                     echo_psn: int | None = None) -> None:
        """An ACK delivered packets (`seen`: EV -> [count, latest send, its tx, bytes, its send
        began], as SentPackets.deliver fills it): a witness whose EV delivered something sent
        after it is moot; one still unanswered is dead once an ACK back on its plane covers a
        sibling's packet that left more than the allowance after it.

        `back_ev`, `echo_psn`: the packet the ACK echoes (its PSN unbounded), by whose EV's back
        path it came (None: not known; judged as if on every plane). An ACK covers the packets of
        every EV but comes back on one plane: one back on another plane says the sibling's packet
        arrived, not that the answer, which left before it by the witness's plane, had time to
        come back: the responder's NIC port on that plane may hold its own data ahead of it (a
        ring's QPs send as they receive, and in a fault-free 32-host ring in virtual time each QP
        between leaves took 44 EVs for dead). One back on its plane proves it by a sibling's
        packet it delivers, or by its echo, a sibling's packet sent since the witness's mark
        (`_mark`): when that ACK trails those of another plane, the packets it covers were all
        delivered by them already."""
        if not self.out:
            return
        evs = self.rec.profile.evs
        planes = self.rec.profile.planes
        back_plane = planes.get(back_ev) if back_ev is not None else None
        self._mark(now)
        for ev, (_, sent_ns) in list(self.out.items()):
            if evs[ev].last_delivered_sent_ns > sent_ns:
                self._alive(ev, sent_ns, now)  # it delivered something sent after its witness
                continue
            siblings = self.siblings.get(ev, ())
            # the sibling whose packet in this ACK left latest, and whether it left late enough
            other = max((k for k in siblings if k in seen), key=lambda k: seen[k][4], default=None)
            lead = seen[other][4] - sent_ns if other is not None else 0
            proven = other is not None and lead > self.allowance(ev, other)
            if back_plane is not None and back_plane != planes.get(ev):
                # the answer's way back is not witnessed by this ACK: a proof that waits (_due)
                if proven and ev not in self._proofs:
                    self._proofs[ev] = (now, lead)
                continue
            mark = self._marks.get(ev)
            if mark is not None and echo_psn is not None and echo_psn >= mark[0] and back_ev in siblings:
                self.fail(ev, now, DEAD, mark[1] - sent_ns)  # its echo left at least this long after it
            elif proven:
                self.fail(ev, now, DEAD, lead)
            elif lead > self._lead.get(ev, 0):
                self._lead[ev] = lead

    def deadline(self, ev: int) -> int | None:
        """When the timer rule convicts the witness of `ev` (None: it does not judge it now)."""
        due = self._due(ev)
        return due[0] if due is not None else None

    def _due(self, ev: int) -> tuple[int, str] | None:
        """When and why the timer rule convicts the witness of `ev` (None: none out, no RTT known,
        or its siblings' ACKs judge it: one of them delivered something sent after it and they
        still carry packets, as a timer cannot know how fast a queue grew; or nothing sent after it
        was delivered yet while the QP has packets out). A plane whose EVs all went quiet is judged
        by time. So is a witness whose siblings delivered packets sent after it, none of them an
        allowance after it, and carry nothing more (the QP's data ended, or went elsewhere): no
        ACK will come to judge it, so the timer stands in for the ACK of a sibling's packet sent an
        allowance after it, due twice that sibling's srtt and the responder's ACK delay later. And
        so is one sent when the QP had nothing else left to send, once all it sent was acknowledged."""
        out = self.out.get(ev)
        if out is None:
            return None
        proof = self._proofs.get(ev)
        if proof is not None:  # an ACK back on another plane proved it: its answer may trail that one
            return proof[0] + self.grace(ev), DEAD
        rec, sent = self.rec, self.rec.sent
        evs = rec.profile.evs
        siblings = self.siblings.get(ev, ())
        later = [k for k in siblings if evs[k].last_delivered_sent_ns > out[1]]
        if later:
            if any(sent.ev_flight.get(k) for k in siblings):
                return None
            wait = max(self.allowance(ev, k) + int(TIMER_RTTS * self._or_known(evs[k].rtt.srtt_ns)) for k in later)
            return out[1] + wait + rec.config.ack_delay_ns, DEAD_IDLE
        idle = rec.rack_sent_ns <= out[1]
        if idle and (sent.bytes_in_flight or sent.retx):
            return None  # nothing sent after it was delivered yet (an ACK that does wakes the QP)
        srtt = self._or_known(evs[ev].rtt.srtt_ns)
        if not srtt:
            return None
        due = out[1] + int(TIMER_RTTS * srtt) + self.window(ev) + self.holdup_ns + rec.config.ack_delay_ns
        return due, DEAD_IDLE if idle else DEAD_TIMER

    def timer(self, now: int) -> None:
        """Witnesses unanswered past their deadline, while something sent after them was delivered."""
        if not self.out:
            return
        rec = self.rec
        known = rec.decide_at(now)
        for ev in list(self.out):
            due = self._due(ev)
            if due is None:
                continue
            if known >= due[0]:
                self.fail(ev, now, due[1], self._proofs.get(ev, (0, 0))[1])
            else:
                rec.put_off(due[0], now)

    def next_wakeup(self, now: int) -> int | None:
        """When a witness may next be due or convicted, if nothing arrives meanwhile."""
        rec = self.rec
        wakes = [due for ev in self.out if (due := self.deadline(ev)) is not None]
        for ev in list(self.suspects):
            if ev in self.out or rec.profile.evs[ev].state is not EvState.GOOD:
                self.suspects.discard(ev)  # its witness is out, or its state says enough already
            else:
                wakes.append(now)
        for ev in rec.sent.by_ev:
            if ev in self.out or rec.profile.evs[ev].state is not EvState.GOOD:
                continue
            pkt = rec.sent.front(ev)
            if pkt is not None and pkt.sent_ns < rec.rack_sent_ns and (quiet := self._quiet_since(ev, pkt)):
                wakes.append(max(quiet, self.after.get(ev, 0)))
        return min(wakes) if wakes else None

    def fail(self, ev: int, now: int, why: str, lead: int = 0) -> None:
        """The witness of `ev` is lost: its packets in flight are lost, and the EV is suspended
        while the next witness, sent at once, decides (`config.witnesses` in a row unanswered make
        it ASSUMED_BAD)."""
        probe_id, sent_ns = self.out.pop(ev)
        self._marks.pop(ev, None)
        self._proofs.pop(ev, None)
        self._convicted[probe_id] = sent_ns
        if len(self.verdicts) < 64:
            self.verdicts.append((ev, sent_ns, now, why, lead))
        self._lead.pop(ev, None)
        self.dead += 1
        rec = self.rec
        self.strikes[ev] = self.strikes.get(ev, 0) + 1
        if self.strikes[ev] >= rec.config.witnesses or not rec.profile.suspend(ev):
            self._clear(ev)
            count = rec.config.witnesses
            rec.profile.path_failed(ev, now, why if count < 2 else f"{why} ({count} witness probes in a row)")
        else:
            self.suspects.add(ev)  # the next witness, at the next pump
        sent = rec.sent
        while (pkt := sent.front(ev)) is not None:
            sent.by_ev[ev].popleft()
            rec.lose(pkt, now, FOUND_DEAD, path_failed=True)

    def summary(self) -> dict:
        return {"sent": self.sent, "answered": self.answered, "dead": self.dead, "late": self.late, "out": len(self.out),
                "lead_us": round(self.lead_ns / 1e3, 1),
                "verdicts": [{"ev": ev, "sent_ns": sent, "dead_ns": dead, "rule": RULES.get(why, "plane"),
                              "lead_ns": lead} for ev, sent, dead, why, lead in self.verdicts]}
