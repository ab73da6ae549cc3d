"""The fabric self-check: bring a fabric up, probe every EV of every host pair, take it down.

Why it exists: it is the one-command proof that a machine can run mrc-emu (namespaces,
veths, the kernel's SRv6), and the README's main command until the transfer demo lands.
It always takes down what it brought up, also on failure or Ctrl-C.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ...fabric import build
from ...fabric.running import Fabric
from ...stats import percentile
from ...topology import Topology
from .probes import probe_evs


@dataclass
class CheckResult:
    name: str
    up_seconds: float
    down_seconds: float = 0.0
    pairs: int = 0
    evs: int = 0
    unreachable: list[dict] = field(default_factory=list)
    rtt_ns_median: int | None = None

    @property
    def ok(self) -> bool:
        return self.evs > 0 and not self.unreachable

    def to_dict(self) -> dict:
        return {"name": self.name, "ok": self.ok, "up_seconds": round(self.up_seconds, 3),
                "down_seconds": round(self.down_seconds, 3), "host_pairs": self.pairs, "evs_probed": self.evs,
                "unreachable": self.unreachable, "rtt_ns_median": self.rtt_ns_median}


def check(topo: Topology, name: str, progress: Callable[[str], None] | None = None,
          max_pairs: int | None = None) -> CheckResult:
    progress = progress or (lambda _: None)
    up = build.up(topo, name, progress)
    result = CheckResult(name, up.seconds)
    rtts: list[int] = []
    try:
        with Fabric.open(name) as fabric:
            pairs = list(itertools.permutations([h.name for h in topo.hosts], 2))[:max_pairs]
            for k, (src, dst) in enumerate(pairs, 1):
                for r in probe_evs(fabric, src, dst):
                    result.evs += 1
                    if r.reachable:
                        rtts.append(r.rtt_ns)
                    else:
                        result.unreachable.append({"src": src, "dst": dst, "ev": r.ev})
                result.pairs += 1
                if k % 10 == 0 or k == len(pairs):
                    progress(f"probed {k}/{len(pairs)} host pairs, {result.evs} EVs")
    finally:
        start = time.monotonic()
        build.down(name)
        result.down_seconds = time.monotonic() - start
    if rtts:
        result.rtt_ns_median = percentile(rtts, 50)
    return result
