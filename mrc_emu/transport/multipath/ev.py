"""The EV profile of a QP: per-EV state, statistics, EV events and the spray schedule.

Why it exists: MRC's sender spreads packets over many paths and must stop using a path
the moment it looks broken, but never on a whim. This module holds what the sender knows
about each EV (state, RTT, loss, bytes in flight), turns it into spray weights, and
records every state change as a timestamped EV event. It sends nothing itself.

Names follow the OCP companion API: EV state GOOD / ASSUMED_BAD / DENIED (api.events.EvState),
`ev_min_active`, EV events, EV probes. The states themselves live in an api EV profile shared by
the QPs bound to it (evshare.py); each QP keeps its own copy of its EVs' states, refreshed when
the profile's state version moves, and its own statistics and event list (with reasons, DENIED
included: the api's event queue carries only what the profile's event mask selects).

Congestion feedback moves weights, never states: CE marks (counted per packet by the responder)
and fabric trims (MRC moves a trimmed EV to SKIP; here a trim EWMA cuts the EV's weight at once
and decays with its deliveries, which skips the EV for a while without a state, a timer or a
probe) lower an EV's share; a last-hop trim says nothing about the EV (the queue is the
receiver's) and counts only as its ECN echo, as UEC's load balancer takes it. A trim is never a
loss: only losses and timeouts make an EV ASSUMED_BAD.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...api import profiles as api_profiles
from ...api.events import EvEventQueue, EvState
from . import weights
from .evshare import SharedStates, private_profile
from .weights import ECN_GAIN, LOSS_GAIN, TRIM_GAIN, EvStats


@dataclass(frozen=True)
class EvEvent:
    """One EV state change, for the controller and for reports."""

    time_ns: int  # on the transport's clock (monotonic on sockets, virtual in memory)
    ev: int
    old: EvState
    new: EvState
    reason: str
    rtt_ns: int | None = None  # the probe RTT that revived the EV

    def to_dict(self, origin_ns: int = 0) -> dict:
        return {"time_ms": round((self.time_ns - origin_ns) / 1e6, 3), "ev": self.ev, "old": self.old.name,
                "new": self.new.name, "reason": self.reason, "rtt_ns": self.rtt_ns}


REWEIGH_CYCLES = 4


class EvProfile:
    """The EVs of one QP: its window onto the api EV profile that holds their states (a private one
    if it is given none) and what the QP has learned about each EV.

    `shared`: an ONLINE api EvProfile whose slot i is EV i; its ev_min_active is then the profile's
    (`ev_min_active` here is for the private profile). `events`: the host's api EV event queue,
    where the device's changes (this QP's) are posted as the profile's event mask says."""

    def __init__(self, indexes: list[int], ev_min_active: int = 1, bad_after_losses: int = 3,
                 delay_threshold_rtts: float = 0.5, *, shared: api_profiles.EvProfile | None = None,
                 events: EvEventQueue | None = None) -> None:
        if not indexes:
            raise ValueError("an EV profile needs at least one EV")
        self.indexes = list(indexes)
        self.bad_after_losses = bad_after_losses  # consecutive losses (nothing delivered in between) -> ASSUMED_BAD
        # an EV's srtt more than this many of the best EV's RTTs above it costs the EV weight
        self.delay_threshold_rtts = delay_threshold_rtts
        self.api = shared if shared is not None else private_profile(self.indexes, ev_min_active)
        self.states = SharedStates(self.api, self.indexes, events)
        self.evs = {k: EvStats(k) for k in self.indexes}
        self.events: list[EvEvent] = []
        self.schedule: list[int] = []
        self._cursor = 0
        self._cycles = 0
        self._reweigh_at = 0  # ... and when the weights are due again anyway (weights.REWEIGH_RTTS)
        self._bad = 0  # EVs ASSUMED_BAD now
        self._barred = 0  # EVs that may carry nothing now: DENIED (or UNKNOWN: no longer in the profile)
        self._dirty = True
        # EVs no packet may use, whatever their state: a port they cross is disabled, here or at the
        # peer (PORT_STATUS_UPDATE; transport/multipath/portstatus.py). Per QP: a peer's ports are the peer's.
        self.excluded: frozenset[int] = frozenset()
        # EVs carrying nothing new while a second witness probe decides their fate (witness.py)
        self.suspended: set[int] = set()
        self.planes: dict[int, int | None] = {}  # EV -> its plane, where the QP knows it (spray weights)
        self._now = 0  # the latest time the QP told its profile (what a change found without one is stamped)
        # the api profile's state_version last read, with the states it starts with (no events)
        states, self._version = self.states.states(), self.api.state_version
        for ev, stats in self.evs.items():
            stats.state = states[ev]
            self._bad += stats.state is EvState.ASSUMED_BAD
            self._barred += _barred(stats.state)

    @property
    def ev_min_active(self) -> int:
        return self.states.ev_min_active

    # ---- state -------------------------------------------------------------------------

    def sync(self, now: int, reason: str | None = None, rtt_ns: int | None = None) -> None:
        """Take the profile's states into the QP's EVs if its state version moved: each change becomes an
        EV event (`reason`, else who made it: the controller, another QP) and reshapes the schedule."""
        self._now = max(self._now, now)
        if self.api.state_version == self._version:
            return
        states = self.states.states()
        self._version = self.api.state_version
        for ev, stats in self.evs.items():
            new = states[ev] if ev < len(states) else EvState.UNKNOWN
            if new is not stats.state:
                self._record(ev, stats, new, self._now, reason or self.states.reason(ev), rtt_ns)

    def _record(self, ev: int, stats: EvStats, new: EvState, now: int, reason: str, rtt_ns: int | None) -> None:
        old = stats.state
        self.events.append(EvEvent(now, ev, old, new, reason, rtt_ns))
        self._bad += (new is EvState.ASSUMED_BAD) - (old is EvState.ASSUMED_BAD)
        self._barred += _barred(new) - _barred(old)
        stats.state = new
        self.suspended.discard(ev)  # a state decides now
        stats.consecutive_losses = 0
        stats.lost_after.clear()
        stats.probe_due_ns = now
        if old is EvState.ASSUMED_BAD and new is EvState.GOOD:
            stats.loss = min(stats.loss, 0.1)  # back, but it earns its full share again
        self._dirty = True

    @property
    def assumed_bad(self) -> int:
        """How many EVs are ASSUMED_BAD now."""
        self.sync(self._now)
        return self._bad

    def any_assumed_bad(self) -> bool:
        self.sync(self._now)
        return self._bad > 0

    @property
    def stalled(self) -> bool:
        """Every EV is DENIED: no EV may carry data until the controller allows one."""
        self.sync(self._now)
        if self.excluded:
            return all(k in self.excluded or _barred(s.state) for k, s in self.evs.items())
        return self._barred == len(self.evs)

    def exclude(self, evs: frozenset[int]) -> None:
        """The EVs that may carry nothing from now on (data, retransmissions, probes): a port
        they cross is disabled. An EV's state is left as it is."""
        evs = frozenset(evs) & frozenset(self.evs)
        if evs != self.excluded:
            self.excluded = evs
            self._dirty = True

    def suspend(self, ev: int) -> bool:
        """Take GOOD `ev` out of the spray schedule until `resume` (its state unchanged); never the
        last GOOD EV that may carry data. True if suspended."""
        usable = [k for k in self.good() if k not in self.excluded and k not in self.suspended]
        if ev not in usable or len(usable) < 2:
            return False
        self.suspended.add(ev)
        self._dirty = True
        return True

    def resume(self, ev: int) -> None:
        if ev in self.suspended:
            self.suspended.discard(ev)
            self._dirty = True

    def good(self) -> list[int]:
        self.sync(self._now)
        return [k for k, s in self.evs.items() if s.state is EvState.GOOD]

    def set_state(self, ev: int, new: EvState, now: int, reason: str, rtt_ns: int | None = None,
                  controller: bool = False) -> bool:
        """Set EV `ev`'s state in the profile (and every copy of its value), as the device does (GOOD or
        ASSUMED_BAD: never lifting a DENIED EV, never below ev_min_active) or, `controller` (and for
        DENIED always), as the controller does; True if it changed."""
        self.sync(now)
        stats = self.evs[ev]
        if stats.state is new or stats.state is EvState.UNKNOWN:
            return False
        if controller or new is EvState.DENIED:
            done = self.states.controller_set(ev, new)
        else:
            done = stats.state is not EvState.DENIED and self.states.device_set(ev, new)
        if done:
            self.sync(now, reason, rtt_ns)
        return done

    def deny(self, ev: int, now: int, reason: str = "") -> None:
        self.set_state(ev, EvState.DENIED, now, "denied by controller" + (f": {reason}" if reason else ""), controller=True)

    def allow(self, ev: int, now: int, state: EvState = EvState.ASSUMED_BAD) -> None:
        """The controller allows a DENIED EV again: ASSUMED_BAD (the QPs probe it before use) or GOOD."""
        self.sync(now)
        if self.evs[ev].state is EvState.DENIED:
            reason = "allowed by controller; probe before use" if state is EvState.ASSUMED_BAD else "allowed by controller"
            self.set_state(ev, state, now, reason, controller=True)

    # ---- observations ------------------------------------------------------------------

    def on_rtt(self, ev: int, rtt_ns: int, now: int = 0) -> None:
        """An RTT sample of `ev`, taken at `now` (its ECN echo comes per packet, `on_ecn`)."""
        self.evs[ev].rtt.update(rtt_ns, now)

    def on_delivered(self, ev: int, sent_ns: int, count: int = 1) -> None:
        """`count` packets delivered on `ev`, the latest of them sent at `sent_ns`."""
        s = self.evs[ev]
        s.packets_delivered += count
        s.loss *= (1 - LOSS_GAIN) ** count
        if s.trim:
            s.trim *= (1 - LOSS_GAIN) ** count
        if sent_ns > s.last_delivered_sent_ns:
            s.last_delivered_sent_ns = sent_ns
            s.forget_losses_before(sent_ns)

    def on_alive(self, ev: int, sent_ns: int) -> None:
        """A witness probe of `ev` sent at `sent_ns` was answered (witness.py): its path worked then."""
        s = self.evs[ev]
        s.alive_sent_ns = max(s.alive_sent_ns, sent_ns)
        s.forget_losses_before(sent_ns)

    def on_ecn(self, ev: int, marked: int, count: int) -> None:
        """`count` packets acknowledged on `ev`, `marked` of them CE-marked: the per-packet EWMA."""
        s = self.evs[ev]
        s.ce_marks += marked
        count = max(count, marked)
        if count:
            keep = (1 - ECN_GAIN) ** count
            s.ecn = s.ecn * keep + (1 - keep) * marked / count

    def on_trimmed(self, ev: int, last_hop: bool, ce: bool) -> None:
        """A TRIM NACK for a packet on `ev`: a fabric trim lowers the EV's weight at once (MRC's
        SKIP); a last-hop trim is only its ECN echo (the receiver's queue, not the EV's)."""
        s = self.evs[ev]
        s.trims += 1
        if last_hop:
            self.on_ecn(ev, int(ce), 1)
            return
        s.trim += TRIM_GAIN * (1.0 - s.trim)
        self._dirty = True

    def on_lost(self, ev: int, now: int, why: str, sent_ns: int | None = None, decide: bool = True) -> int:
        """A packet sent on `ev` at `sent_ns` (default: `now`) is lost. The EV fails (ASSUMED_BAD)
        after `bad_after_losses` lost packets sent after the latest one it delivered, or the
        latest witness probe it answered: a path that delivered a packet (or answered a probe)
        sent later than a lost one is working (it reordered, queued or dropped one), so that loss
        does not count towards its failure. `decide` False: the run alone fails nothing (a
        witness probe decides, transport/witness.py). Returns how many lost packets in a row
        this one makes (0: it does not count, a later one arrived)."""
        self.sync(now)
        s = self.evs[ev]
        s.packets_lost += 1
        sent_ns = now if sent_ns is None else sent_ns
        run = 0
        if sent_ns > s.last_delivered_sent_ns and sent_ns > s.alive_sent_ns:
            s.lost_after.append(sent_ns)
            run = s.consecutive_losses = len(s.lost_after)
        s.loss += LOSS_GAIN * (1.0 - s.loss)
        if decide and s.state is EvState.GOOD and s.consecutive_losses >= self.bad_after_losses:
            self.set_state(ev, EvState.ASSUMED_BAD, now, f"{s.consecutive_losses} consecutive losses ({why})")
        else:
            self._dirty = True
        return run

    def path_failed(self, ev: int, now: int, why: str) -> None:
        """`ev`'s path failed (its witness probe was lost): ASSUMED_BAD, as the device decides."""
        self.sync(now)
        if self.evs[ev].state is EvState.GOOD:
            self.set_state(ev, EvState.ASSUMED_BAD, now, why)

    def on_probe(self, ev: int, now: int, rtt_ns: int) -> None:
        """A probe of `ev` returned: GOOD again for every QP of the profile (unless another QP's revived
        it first, or the controller DENIED it meanwhile)."""
        self.sync(now)
        if self.evs[ev].state is EvState.ASSUMED_BAD:
            self.evs[ev].rtt.rebase(rtt_ns, now=now)  # its path as it is now (repaired, or slower)
            self.set_state(ev, EvState.GOOD, now, "probe returned", rtt_ns)

    # ---- spraying ----------------------------------------------------------------------

    def weight(self, ev: int, best_srtt: float, least_ecn: float = 0.0, best_any: float = 0.0) -> float:
        """Spray weight of `ev` (weights.weight) against its plane's best EV and every plane's."""
        return weights.weight(self.evs[ev], best_srtt, least_ecn, best_any, self.delay_threshold_rtts)

    def reweigh(self) -> None:
        """Rebuild the spray schedule: an interleaved list of GOOD EVs in proportion to weight.

        With no EV GOOD, the ASSUMED_BAD ones stand in (sending on a doubtful path beats not
        sending; their own losses and probes tell). DENIED EVs never carry data: with every EV
        DENIED the schedule is empty and the QP is `stalled`.

        Each EV gets slots in proportion to its weight (at least one), spread evenly over the
        schedule: its j-th slot sits at (j + 1/2) / slots_k of the way, with a small per-EV
        offset so that EVs with equal weights alternate. Consecutive packets thus go to
        different EVs and each EV's share follows its weight; sorting the positions costs far
        less than a weighted round robin picking slot by slot (this runs every few hundred packets).
        """
        out = self.excluded | self.suspended
        good = ([k for k in self.good() if k not in out]
                or [k for k, s in self.evs.items() if s.state is EvState.ASSUMED_BAD and k not in out])
        self._dirty = False
        if not good:
            self.schedule, self._cursor = [], 0
            return
        weighed = weights.spray_weights(self.evs, good, self.planes, self.delay_threshold_rtts, self._now)
        known = [self.evs[k].rtt.min_rtt_ns for k in good if self.evs[k].rtt.min_rtt_ns]
        self._reweigh_at = self._now + weights.REWEIGH_RTTS * min(known) if known else float("inf")
        total = sum(weighed)
        length = weights.SCHEDULE_SLOTS_PER_EV * len(good)
        positions = []
        for i, (k, w) in enumerate(zip(good, weighed)):
            slots = max(1, round(w / total * length))
            offset = i / (len(good) * slots)
            positions += [((j + 0.5) / slots + offset, k) for j in range(slots)]
        positions.sort()
        self.schedule = [k for _, k in positions]
        # the cursor goes on where it was: from the start after every change (each loss reweighs),
        # the first EVs of the schedule took every resend while the last ones were never tried
        self._cursor %= len(self.schedule)

    def schedule_at(self) -> tuple[list[int], int]:
        """The spray schedule, rebuilt if anything changed, and the cursor into it: the next EV
        is schedule[cursor]. A send loop that takes EVs from it says how far it got with
        `advance`. A state changed in the shared profile (another QP, the controller) shows here first:
        one integer compared per call."""
        if self.api.state_version != self._version:
            self.sync(self._now)
        if self._dirty or self._now >= self._reweigh_at:
            self.reweigh()
        return self.schedule, self._cursor

    def advance(self, cursor: int) -> None:
        """The EVs up to schedule[cursor - 1] were taken; at the end the schedule starts over,
        and every REWEIGH_CYCLES cycles it is rebuilt (the weights follow the EWMAs even without
        state changes)."""
        if cursor < len(self.schedule):
            self._cursor = cursor
            return
        self._cursor = 0
        self._cycles += 1
        if self._cycles % REWEIGH_CYCLES == 0:
            self._dirty = True

    def pick(self, avoid: int | None = None) -> int:
        """The next EV to spray on; `avoid` (a retransmission's previous EV) is skipped if possible.
        Never call it on a `stalled` profile (there is no EV to give)."""
        schedule, cursor = self.schedule_at()
        ev = schedule[cursor]
        self.advance(cursor + 1)
        if ev == avoid and len(schedule) > 1:
            for _ in range(len(schedule)):
                ev = schedule[self._cursor]
                self._cursor = (self._cursor + 1) % len(schedule)
                if ev != avoid:
                    break
        return ev

    def share(self) -> dict[int, float]:
        total = sum(s.packets_sent for s in self.evs.values()) or 1
        return {k: s.packets_sent / total for k, s in self.evs.items()}


def _barred(state: EvState) -> bool:
    """An EV that may carry nothing, not even standing in for GOOD ones: DENIED, or UNKNOWN (its slot is gone)."""
    return state is EvState.DENIED or state is EvState.UNKNOWN
