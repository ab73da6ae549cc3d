"""CC profiles (mrc_ctl.h c:818-920): a congestion-control algorithm by name and its config.

Why it exists: QPs name a CC profile (CC_PROFILE_ID) as they name an EV profile; the controller
sets it up with the same INIT -> OFFLINE -> ONLINE -> OFFLINE -> INIT lifecycle: ALGORITHM to
reach OFFLINE (a string the device lists, e.g. "uet-1.0-nscc"; the header's NULL, here
`CC_DISABLED`, turns CC off), CONFIG to reach ONLINE, and CONFIG changed while ONLINE only with
CC_PROFILE_MODIFY_ONLINE. The config is validated by field name and type against the header's
`mrc_ctl_cc_nscc_cfg`; mapping it onto the transport's NSCC (transport.cc.nscc.NsccParams, whose
fields are the same names) is the experiments layer's job, because this package imports only
the topology model. It must never touch the system or import the transport.
"""

from __future__ import annotations

import errno
from collections.abc import Mapping, Sequence
from typing import Any

from .errors import MrcApiError, RestrictionError
from .formats import ProfileState

NSCC = "uet-1.0-nscc"
CC_DISABLED = ""  # the header's NULL algorithm: CC off
DCQCN = "mrc-emu-dcqcn"  # the emulator's own name for its DCQCN baseline (not an OCP algorithm string)
DEVICE_ALGORITHMS = (NSCC,)  # device_attr.cc.algorithms of an MRC device as the header lists them

U8, U32 = (1 << 8) - 1, (1 << 32) - 1
# struct mrc_ctl_cc_nscc_cfg: field -> its C type (times in ns, sizes in bytes)
NSCC_CONFIG_FIELDS: dict[str, str] = {
    "disable_qa": "u8", "adjust_bytes_threshold": "u32", "adjust_period_threshold": "u32", "base_rtt": "u32",
    "eta": "float", "fi": "float", "fi_scale": "float", "gamma": "float", "max_md_jump": "float",
    "max_cwnd": "u32", "qa_gate": "u8", "qa_threshold": "u32", "target_delay": "u32",
}
# the emulator's DCQCN reaction point (no OCP struct): its parameters by name (times ns, rates bit/s, sizes bytes)
DCQCN_CONFIG_FIELDS: dict[str, str] = {
    "line_rate_bps": "float", "g": "float", "alpha_timer_ns": "u32", "increase_timer_ns": "u32", "byte_counter": "u32",
    "fast_recovery_steps": "u32", "rate_ai_bps": "float", "rate_hai_bps": "float", "min_rate_bps": "float",
    "window": "u32",
}
CONFIG_FIELDS = {NSCC: NSCC_CONFIG_FIELDS, CC_DISABLED: {}, DCQCN: DCQCN_CONFIG_FIELDS}


def check_config(algorithm: str, config: Any) -> dict[str, int | float]:
    """The config as a dict, or a RestrictionError naming the first bad field. A field left out is one the
    experiments layer derives (as NsccParams.derive does); the header's struct has them all."""
    if not isinstance(config, Mapping):
        raise RestrictionError(f"config: expected a mapping of {algorithm or 'no'} fields, got {config!r}")
    known = CONFIG_FIELDS[algorithm]
    for name, value in config.items():
        if name not in known:
            raise RestrictionError(f"config.{name}: not a field of {algorithm or 'disabled CC'}"
                                   + (f" (known: {', '.join(known)})" if known else ""))
        kind = known[name]
        if kind == "float":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
                raise RestrictionError(f"config.{name}: {value!r} is not a number")
        elif isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= (U8 if kind == "u8" else U32):
            raise RestrictionError(f"config.{name}: {value!r} is not a {kind}")
    return dict(config)


class CcProfile:
    """One CC profile: `modify()` is mrc_ctl_modify_cc_profile; `active_qps` QPs using it make it EBUSY."""

    def __init__(self, profile_id: int = 0, algorithms: Sequence[str] = DEVICE_ALGORITHMS, modify_online: bool = False):
        self.profile_id = profile_id
        self.algorithms = tuple(algorithms)
        self.modify_online = modify_online  # opt_attr CC_PROFILE_MODIFY_ONLINE
        self.state = ProfileState.INIT
        self.algorithm: str | None = None
        self.config: dict[str, int | float] | None = None
        self.active_qps = 0

    def modify(self, *, state: ProfileState | None = None, cur_state: ProfileState | None = None,
               algorithm: str | None = None, config: Mapping[str, Any] | None = None) -> None:
        """Apply the attributes given (None = not in attr_mask), or raise before changing anything."""
        if cur_state is not None and ProfileState(cur_state) != self.state:
            raise MrcApiError(f"cur_state: the profile is {self.state.name}, not {ProfileState(cur_state).name}")
        if self.active_qps:
            raise MrcApiError(f"state: {self.active_qps} active QP(s) use CC profile {self.profile_id}", errno.EBUSY)
        target = self.state if state is None else ProfileState(state)
        if algorithm is not None and algorithm != CC_DISABLED and algorithm not in self.algorithms:
            raise RestrictionError(f"algorithm: {algorithm!r} is not one the device lists ({', '.join(self.algorithms)})")
        if self.state == ProfileState.INIT:
            if target != ProfileState.OFFLINE:
                raise MrcApiError("state: an INIT CC profile may only move to OFFLINE (with ALGORITHM)")
            if algorithm is None:
                raise MrcApiError("algorithm: INIT -> OFFLINE needs ALGORITHM")
        elif self.state == ProfileState.ONLINE:
            if algorithm is not None or target not in (ProfileState.ONLINE, ProfileState.OFFLINE):
                raise MrcApiError("state: an ONLINE CC profile may only move to OFFLINE (or change CONFIG)")
            if config is not None and not self.modify_online:
                raise MrcApiError("config: changing CONFIG while ONLINE needs CC_PROFILE_MODIFY_ONLINE", errno.EPERM)
        elif target == ProfileState.INIT and (algorithm is not None or config is not None):
            raise MrcApiError("state: OFFLINE -> INIT takes no ALGORITHM or CONFIG")
        new_algorithm = self.algorithm if algorithm is None else algorithm
        new_config = self.config
        if config is not None:
            new_config = check_config(new_algorithm, config)
        elif algorithm is not None and algorithm != self.algorithm:
            new_config = None  # a new algorithm's config is not the old one's
        if target == ProfileState.ONLINE and new_config is None:
            raise MrcApiError("config: OFFLINE -> ONLINE needs CONFIG")
        self.state, self.algorithm, self.config = target, new_algorithm, new_config
        if target == ProfileState.INIT:
            self.algorithm = self.config = None

    def __repr__(self) -> str:
        return f"CcProfile(id={self.profile_id}, {self.state.name}, algorithm={self.algorithm!r})"
