"""The CC profiles by name: `CC_PROFILES`, `register`, `make_cc`.

Why it exists: a QP names its profile (CLI `--cc`, TransferSpec.cc, an OCP CC profile's
algorithm) and `make_cc` builds it for an MTU, a link rate and a base RTT. `nscc` (nscc.py: UEC
1.0 NSCC) is MRC's default, `dcqcn` (dcqcn.py) the RoCEv2 baseline's, `fixed` (fixed.py) keeps
the window constant. The registry imports the profiles and lists them; a profile must never
import the registry (it implements base.CongestionControl, nothing more), so no import runs in a
circle.
"""

from __future__ import annotations

from collections.abc import Callable

from .base import CongestionControl
from .dcqcn import Dcqcn
from .fixed import FixedWindow
from .nscc import Nscc

CC_PROFILES: dict[str, Callable[..., CongestionControl]] = {}  # name -> factory(mtu=, link_rate_bps=, base_rtt_ns=, **options)


def register(cls: type[CongestionControl]) -> type[CongestionControl]:
    """Class decorator: make a profile available by its `name` (CLI `--cc`, TransferSpec.cc)."""
    if cls.name in CC_PROFILES:
        raise ValueError(f"CC profile {cls.name!r} registered twice")
    CC_PROFILES[cls.name] = cls
    return cls


def profile_names() -> list[str]:
    return list(CC_PROFILES)


def make_cc(name: str, mtu: int, link_rate_bps: float | None = None, base_rtt_ns: int | None = None,
            **options) -> CongestionControl:
    """The profile registered as `name` for packets of `mtu` payload bytes, on a QP whose slower
    end's link runs at `link_rate_bps` over a fabric whose unloaded RTT is `base_rtt_ns` (both
    emulated; None: unknown, e.g. an unshaped fabric); options: the profile's own."""
    factory = CC_PROFILES.get(name)
    if factory is None:
        raise ValueError(f"unknown CC profile {name!r} (known: {', '.join(CC_PROFILES)})")
    return factory(mtu=mtu, link_rate_bps=link_rate_bps, base_rtt_ns=base_rtt_ns, **options)


register(FixedWindow)  # in the order they were always offered in
register(Dcqcn)
register(Nscc)
