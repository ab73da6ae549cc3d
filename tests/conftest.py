"""Shared fixtures and helpers. System tests need root and the kernel's SRv6; they skip with the reason."""

import os
import uuid

import pytest

from mrc_emu.fabric.kernel.waiting import until


def system_skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces): run the suite with sudo, as CI does"
    if not os.path.exists("/proc/sys/net/ipv6/conf/all/seg6_enabled"):
        return "kernel has no SRv6 support"
    from mrc_emu.fabric.datapath import srv6  # no seg6local: the fabric's SIDs are the BPF endpoint program's
    from mrc_emu.fabric.kernel import seg6local

    if seg6local.mode() == "bpf" and (reason := srv6.missing_object()):
        return f"this kernel has no seg6local ({seg6local.kernel_problem()}) and {reason}"
    return None


def pytest_collection_modifyitems(config, items):
    reason = system_skip_reason()
    if reason is None:
        return
    for item in items:
        if "system" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=reason))


DILATIONS = (4, 16, 64)
# the largest time dilation a test may need, unless it states its own: at K = 64 a 1 MiB transfer
# at 20 Mbit/s already takes half a minute of wall time
MAX_DILATION = 64


def kept_up(result) -> bool:
    """Whether the emulator outran the fabric in a run (run_transfers' Run, or one send's
    TransferResult): no worker was on a CPU for CPU_BUSY_LIMIT of it (emulation.py), so what limited
    the flows was the fabric's ports, not the emulator's packet rate."""
    from mrc_emu.experiments.analysis.emulation import CPU_BUSY_LIMIT

    report = result.emulation
    busy = report.cpu_busy if hasattr(report, "cpu_busy") else report["cpu_busy"]
    return max(busy, default=0) < CPU_BUSY_LIMIT


def summary(result) -> str:
    report = result.emulation
    return report.line() if hasattr(report, "line") else f"{report['verdict']}: {report['reasons']}"


def goodput_bps(result) -> float:
    """What a run (its flows together, first start to last end) or one send delivered, in
    emulated bits per second."""
    from mrc_emu.experiments.analysis.congestion import aggregate_goodput_gbps

    if hasattr(result, "goodput_gbps"):
        return (result.goodput_gbps or 0) * 1e9
    return aggregate_goodput_gbps(result) * 1e9


def fabric_limited(capacity_bps: float, share: float = 0.7):
    """A test for at_a_dilation_that_keeps_up: the emulator kept up and the flows carried at least
    `share` of `capacity_bps` (the bottleneck's), so the bottleneck was busy and its queue the
    fabric's. kept_up alone is not enough: in a VM under TCG no worker was saturated, yet a
    20 Mbit/s link carried 2-3 Mbit/s (the emulated CPU's forwarding and timers were the limit)."""
    return lambda result: kept_up(result) and goodput_bps(result) >= share * capacity_bps


def described(result) -> str:
    """A run's goodput and its emulation verdict, for a message."""
    return f"{goodput_bps(result) / 1e6:.1f} Mbit/s, {summary(result)}"


@pytest.fixture
def at_a_dilation_that_keeps_up(record_property):
    """`find(run)`: `run(K)` under the first time dilation K at which the emulator kept up (`good`:
    kept_up, or fabric_limited where the test needs the link to be the limit), as a user does when
    a run says its workers were saturated; (result, K). Every K tried is printed and recorded as
    the test's properties `time_dilation` and `time_dilations_tried`; no K above `cap` is tried,
    and the test fails naming each K tried and what it gave if none kept up.

    A figure that needs the fabric to be the bottleneck (a queue at a port, its marks, a degraded
    link's goodput) needs a larger K on a slower machine: a VM under TCG pushed about a twentieth
    of this machine's packet rate. A run that needs more than the cap says the emulator got
    slower, or the machine is too slow for the test: it fails, rather than pass behind a longer
    run. `used(result, K)`: the K a run actually took, where `run(None)` lets it choose (later
    ones no larger are skipped)."""

    def find(run, dilations=DILATIONS, good=kept_up, cap=MAX_DILATION, describe=described, used=None):
        over = [k for k in dilations if k is not None and k > cap]
        if over:
            raise ValueError(f"time dilations {over} are above the cap of {cap}")
        tried, notes = [], []
        for k in dilations:
            if k is not None and tried and k <= tried[-1]:
                continue
            result = run(k)
            k = used(result, k) if used else k
            tried.append(k)
            kept = good(result)
            notes.append(f"K = {k}: {describe(result)}")
            if kept:
                break
        print(f"\ntime dilation {k} (tried {tried}, cap {cap})")
        record_property("time_dilation", k)
        record_property("time_dilations_tried", tried)
        if not kept:
            pytest.fail(f"the emulator did not keep up at any time dilation up to the cap of {cap}: " + "; ".join(notes))
        return result, k

    return find


def wait_for(condition, timeout: float = 20.0, what: str = "condition"):
    """Wait until `condition()` is true; fail the test naming `what` if it is not within `timeout` s."""
    return until(condition, timeout, what, interval=0.02)


@pytest.fixture
def fabric_name():
    """A fabric name no other test uses; the fabric is taken down if the test left it up."""
    from mrc_emu.fabric import registry

    name = "t" + uuid.uuid4().hex[:6]
    yield name
    if registry.journal_path(name).exists():
        registry.remove(name)


@pytest.fixture
def default_fabric(fabric_name):
    """The built-in default topology, up, as an open `Fabric`; down afterwards."""
    from mrc_emu.fabric import build
    from mrc_emu.fabric.running import Fabric
    from mrc_emu.topology import builtin

    build.up(builtin(), fabric_name)
    with Fabric.open(fabric_name) as fabric:
        yield fabric
    build.down(fabric_name)


class CountingPlacer:
    """Wraps a responder's C placement and counts the packets it placed itself."""

    def __init__(self, place) -> None:
        self.place, self.placed = place, 0

    def __call__(self, *args) -> bool:
        done = self.place(*args)
        self.placed += done
        return done
