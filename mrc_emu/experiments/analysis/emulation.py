"""Was a run faithful, or was the emulator itself the bottleneck? The `emulation` block of a run.

Why it exists: on a 2-core machine the emulator can be slower than the network it emulates,
and then what it measures is its own speed. A run must say so rather than publish scheduling
noise as a network figure. Every worker measures itself (io/loop.py): how late it answered what
was due (loop lag: from a datagram's arrival in the kernel, or a timer's due time, to the pump
that dealt with it), how long datagrams waited in its sockets, the CPU it got and how long it
waited for one; the kernel counts what it dropped for the emulator (a full receive socket,
Udp6RcvbufErrors; a full backlog, softnet_stat). From these a run gets a verdict:

- `faithful`: nothing was dropped by the kernel (nor, cut short, by a worker), no worker was
  saturated, the loop lag stayed below LAG_LIMIT_US (in the transport's time), no datagram
  reached a worker more than that after the horizon had passed its arrival (late datagrams:
  counted always, a reason only beyond the limit, as the horizon's slack covers them and no
  timer is that fine), no worker waited long for a CPU, and every datagram's arrival time was
  the kernel's stamp (a host read by the Python receive path, where mrc_emu.io._sockio is not
  built, is timed when its worker read it: the worker's lag is in every RTT sample, so that run
  is never faithful);
- `emulator-bound`, with every reason that applies. The figures of such a run are the
  emulator's (its packet rate, its scheduling), not the fabric's; the CLI and the report flag
  them. Time dilation (`--time-dilation K`) is the cure where the machine is too slow.

Timer decisions that the workers' horizon put off are counted too: they are how the
transport avoided taking the emulator's lag for a loss.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...io.clock import LagMeter

LAG_LIMIT_US = 1000  # loop lag p99 (transport time) above which timings are the emulator's
CPU_BUSY_LIMIT = 0.9  # a worker on a CPU this fraction of the run was saturated
RUNQUEUE_LIMIT = 0.1  # a worker that waited for a CPU this fraction of the run shared it with others


def softnet() -> dict[str, int]:
    """The kernel's per-CPU backlog counters, summed: packets dropped, and times it ran out of budget."""
    dropped = squeezed = 0
    try:
        with open("/proc/net/softnet_stat") as f:
            for line in f:
                cols = line.split()
                dropped += int(cols[1], 16)
                squeezed += int(cols[2], 16)
    except (OSError, ValueError, IndexError):
        pass
    return {"dropped": dropped, "time_squeeze": squeezed}


def _quantiles(meter: LagMeter, dilation: float) -> dict[str, float]:
    return {"p50": round(meter.percentile_us(50) / dilation, 1), "p99": round(meter.percentile_us(99) / dilation, 1),
            "max": round(meter.max_ns / 1e3 / dilation, 1)}


@dataclass
class Report:
    workers: int
    time_dilation: float
    loop_lag_us: dict[str, float]
    socket_wait_us: dict[str, float]
    cpu_busy: list[float]
    runqueue_wait: list[float]
    packets_per_s: float
    kernel_drops: dict[str, int]
    timers_deferred: int
    verdict: str
    reasons: list[str] = field(default_factory=list)
    python_receive: list[str] = field(default_factory=list)  # hosts read without kernel arrival stamps
    unstamped_datagrams: int = 0  # datagrams timed when read rather than on arrival

    @property
    def faithful(self) -> bool:
        return self.verdict == "faithful"

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def summary(self) -> str:
        """The verdict and the figures behind it, in one line."""
        lag, k = self.loop_lag_us, self.time_dilation
        return (f"{self.verdict} ({self.workers} worker{'s' if self.workers != 1 else ''}"
                + (f", time dilation {k:g}: times and rates are emulated, {k:g}x slower in wall time" if k != 1 else "")
                + f"; loop lag p50 {lag['p50']:.0f} / p99 {lag['p99']:.0f} / max {lag['max']:.0f} us; "
                  f"CPU busy {max(self.cpu_busy, default=0):.0%}; {self.packets_per_s:,.0f} packets/s)")

    def line(self) -> str:
        """What the CLI prints after a transfer: the summary, then each reason."""
        head = "emulation: " + self.summary()
        return head if self.faithful else head + "\n  " + "\n  ".join(self.reasons)


def assess(finals: list, results: list, kernel_before: dict[str, int], kernel_after: dict[str, int],
           dilation: float) -> Report:
    """The emulation report of a run from its workers' Final reports and the kernel's counters."""
    timer, sock = LagMeter(), LagMeter()
    busy, waited = [], []
    packets = 0
    wall = 0
    late = late_max = slack_max = unstamped = truncated = 0
    python_receive: list[str] = []
    for final in finals:
        loop = final.loop
        late += loop["late_datagrams"]
        late_max = max(late_max, loop["late_max_ns"])
        slack_max = max(slack_max, loop["slack_max_ns"])
        unstamped += loop["unstamped_datagrams"]
        truncated += loop["truncated_datagrams"]
        python_receive += loop["python_receive"]
        timer.merge(LagMeter.from_dict(loop["timer_lag"]))
        sock.merge(LagMeter.from_dict(loop["socket_lag"]))
        span = max(1, loop["wall_ns"])
        busy.append(round(loop["cpu_ns"] / span, 3))
        waited.append(round(loop["runqueue_wait_ns"] / span, 3))
        packets += loop["datagrams"] + loop["frames_sent"]
        wall = max(wall, span)
    drops = {"Udp6RcvbufErrors": 0, "Udp6InErrors": 0}
    for final in finals:
        for counters in final.kernel_udp.values():
            for key in drops:
                drops[key] += counters.get(key, 0)
    drops["softnet_dropped"] = kernel_after["dropped"] - kernel_before["dropped"]
    drops["softnet_time_squeeze"] = kernel_after["time_squeeze"] - kernel_before["time_squeeze"]
    drops["late_datagrams"] = late
    drops["truncated_datagrams"] = truncated
    deferred = sum(r.requester["stats"].get("timers_deferred", 0) for r in results)
    lag, wait = _quantiles(timer, dilation), _quantiles(sock, dilation)
    reasons = []
    if drops["Udp6RcvbufErrors"] or drops["Udp6InErrors"]:
        reasons.append(f"the kernel dropped {drops['Udp6RcvbufErrors'] + drops['Udp6InErrors']:,} datagrams at "
                       "receive sockets the workers did not read in time: those losses are the emulator's")
    if late and late_max / 1e3 / dilation > LAG_LIMIT_US:
        reasons.append(f"the kernel handed {late:,} datagrams to the workers up to {late_max / 1e6 / dilation:.1f} ms after "
                       "the horizon had passed their arrival (held in a per-CPU backlog; the horizon was then held "
                       f"back by up to {slack_max / 1e6 / dilation:.1f} ms): timer decisions around them may have "
                       "been the emulator's")
    if python_receive:
        reasons.append(f"{len(python_receive)} host{'s' if len(python_receive) != 1 else ''} "
                       f"({', '.join(sorted(python_receive))}) received through the Python path, without the kernel's "
                       "arrival stamps (mrc_emu.io._sockio not built, or SO_TIMESTAMPNS refused): their arrival times, "
                       "RTT samples and timers include the worker's own lag")
    elif unstamped:
        reasons.append(f"{unstamped:,} datagrams came without the kernel's arrival stamp: they were timed when the "
                       "worker read them, its own lag included")
    if truncated:
        reasons.append(f"the workers dropped {truncated:,} datagrams that arrived cut short (longer than the receive "
                       "slots, or their arrival stamp and traffic class did not fit): those losses are the emulator's")
    if drops["softnet_dropped"]:
        reasons.append(f"the kernel's backlog dropped {drops['softnet_dropped']:,} packets (softnet_stat): "
                       "forwarding could not keep up on this machine")
    for i, b in enumerate(busy):
        if b >= CPU_BUSY_LIMIT:
            reasons.append(f"worker {i} was on a CPU {b:.0%} of the run: rates and times are the emulator's speed, "
                           "not the fabric's (shape links or use --time-dilation)")
    if max(lag["p99"], wait["p99"]) > LAG_LIMIT_US:
        reasons.append(f"loop lag p99 {lag['p99']:.0f} us, socket wait p99 {wait['p99']:.0f} us (limit "
                       f"{LAG_LIMIT_US} us): timings finer than that are scheduling noise")
    for i, w in enumerate(waited):
        if w >= RUNQUEUE_LIMIT:
            reasons.append(f"worker {i} waited for a CPU {w:.0%} of the run: other processes share this machine")
    return Report(len(finals), dilation, lag, wait, busy, waited, round(packets / (wall / 1e9)), drops, deferred,
                  "faithful" if not reasons else "emulator-bound", reasons, sorted(python_receive), unstamped)
