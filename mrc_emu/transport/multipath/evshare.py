"""Where a QP's EV states live: slot i of an api EV profile is the QP's EV i, shared by its QPs.

Why it exists: the OCP model keeps EV state in the EV profile, not in the QP, so QPs that share
a profile share what one of them learned (an EV that lost packets is ASSUMED_BAD for all at
once; a probe by any one revives it for all), and the controller's MODIFY_EV_STATE (DENIED,
allowed again) reaches every one of them. `SharedStates` is a QP's window onto that profile:
it reads the slots' states, writes the device's verdicts through `evops.device_set_state`
(which never lifts a DENIED EV and keeps the profile's ev_min_active, counted over every QP of
the profile) and the controller's through `evops.ev_op`, and posts the device's changes to the
host's EV event queue (the profile's ev_event_mask decides what is queued). A QP bound to no
profile gets a private one (`private_profile`), so that it behaves as if it had its own.

What the QP learns per EV (RTT, loss, counters, its event list) stays the QP's (ev.py); only the
state is shared. A change made elsewhere is found by comparing the profile's `state_version`,
one integer, where the QP reads its spray schedule: nothing is polled while nothing changes.
"""

from __future__ import annotations

from collections.abc import Iterable

from ...api.errors import MrcApiError
from ...api.events import EvEventQueue, EvState
from ...api.evops import EvOp, EvOpEntry, EvOpFlag, device_set_state, ev_op, ev_slots, ev_states
from ...api.formats import EvFormatMode, EvFormatProfile, ProfileState
from ...api.profiles import EvEventMask, EvField, EvProfile, EvProfileMode
from ...topology.evs import udp_sport

# what an EV event of a QP says of a change it did not make itself, by who made it (api state_setters)
REASONS = {"controller": "set by the controller", "device": "learned by another QP"}


def private_profile(indexes: Iterable[int], ev_min_active: int = 1) -> EvProfile:
    """An ONLINE EXP profile of one QP's own: slot i is EV i (value: its UDP source port, port 1), GOOD for
    the QP's EVs and DENIED for the others below the largest (they are not its to use), ev_min_active
    between 1 and the QP's EV count (as a QP without a controller always had it)."""
    mine = set(indexes)
    if not mine:
        raise ValueError("an EV profile needs at least one EV")
    fmt = EvFormatProfile()
    fmt.modify(state=ProfileState.OFFLINE, mode=EvFormatMode.UDP, fields=[16])
    fmt.modify(state=ProfileState.ONLINE)
    profile = EvProfile()
    count = max(mine) + 1
    profile.modify(state=ProfileState.OFFLINE, mode=EvProfileMode.EXP, fmt=fmt, ev_count=count, fields=[EvField(16)])
    ev_op(profile, EvOp.REPLACE_EV, [EvOpEntry(ev_new=udp_sport(i).to_bytes(2, "big"), port_new=1,
                                               state=EvState.GOOD if i in mine else EvState.DENIED)
                                     for i in range(count)])
    profile.modify(state=ProfileState.ONLINE, ev_min_active=max(1, min(ev_min_active, len(mine))),
                   ev_event_mask=EvEventMask.GOOD | EvEventMask.ASSUMED_BAD)
    return profile


class SharedStates:
    """One QP's access to the states of its api EV profile (its EV index = the profile's slot)."""

    def __init__(self, profile: EvProfile, indexes: Iterable[int], events: EvEventQueue | None = None) -> None:
        indexes = sorted(indexes)
        if profile.state != ProfileState.ONLINE:
            raise ValueError(f"EV profile {profile.profile_id} is {profile.state.name}: a QP takes an ONLINE profile")
        slots = len(ev_slots(profile))
        if not indexes or indexes[-1] >= slots:
            raise ValueError(f"EV profile {profile.profile_id} has {slots} EVs; the QP's paths name EVs {indexes}")
        self.profile = profile
        self.events = events
        self._slots: list[tuple[bytes, int]] = []
        self._slots_version = -1

    @property
    def ev_min_active(self) -> int:
        return self.profile.ev_min_active or 0

    def states(self) -> list[EvState]:
        """Every slot's state now (the QP reads its EVs' from it when `state_version` moved)."""
        return [EvState(s) for s in ev_states(self.profile)]

    def reason(self, ev: int) -> str:
        """Why a slot changed, as the QP that did not change it tells it."""
        return REASONS.get(self.profile.state_setters.get(ev, ""), "changed in the EV profile")

    def _slot(self, ev: int) -> tuple[bytes, int]:
        if self._slots_version != self.profile.state_version:  # REPLACE_EV and modify() bump it too
            self._slots, self._slots_version = ev_slots(self.profile), self.profile.state_version
        return self._slots[ev]

    def device_set(self, ev: int, state: EvState) -> bool:
        """The device's verdict (GOOD or ASSUMED_BAD) on EV `ev` and every copy of its value; False if the
        profile refuses it (DENIED, or it would leave fewer GOOD EVs than ev_min_active)."""
        return device_set_state(self.profile, *self._slot(ev), state, self.events)

    def controller_set(self, ev: int, state: EvState) -> bool:
        """MODIFY_EV_STATE of EV `ev` (all copies of its value), as the controller does it; False if refused."""
        value, port = self._slot(ev)
        try:
            ev_op(self.profile, EvOp.MODIFY_EV_STATE,
                  [EvOpEntry(ev=value, port=port, state=state, flags=EvOpFlag.ALL_COPIES)], events=self.events)
        except MrcApiError:
            return False
        return True
