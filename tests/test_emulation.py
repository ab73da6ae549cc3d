"""The emulation verdict alone, from hand-made worker reports (no root, no fabric)."""

from types import SimpleNamespace

from mrc_emu.experiments.analysis import emulation
from mrc_emu.io.clock import LagMeter

QUIET = {"dropped": 0, "time_squeeze": 0}


def _final(late: int = 0, late_max_ns: int = 0, slack_max_ns: int = 0, busy: float = 0.5) -> SimpleNamespace:
    lag = LagMeter()
    lag.record(100_000)  # 0.1 ms: well inside the limit
    loop = {"wall_ns": 1_000_000_000, "cpu_ns": int(busy * 1e9), "runqueue_wait_ns": 0, "datagrams": 1000,
            "frames_sent": 1000, "timer_lag": lag.to_dict(), "socket_lag": lag.to_dict(),
            "late_datagrams": late, "late_max_ns": late_max_ns, "slack_max_ns": slack_max_ns}
    return SimpleNamespace(loop=loop, kernel_udp={"h0": {"Udp6RcvbufErrors": 0, "Udp6InErrors": 0}})


def _results() -> list:
    return [SimpleNamespace(requester={"stats": {"timers_deferred": 0}})]


def test_a_quiet_run_is_faithful():
    report = emulation.assess([_final(), _final()], _results(), QUIET, QUIET, 1.0)
    assert report.verdict == "faithful" and report.reasons == []
    assert report.kernel_drops["late_datagrams"] == 0


def test_late_datagrams_make_the_run_emulator_bound_and_say_by_how_much():
    finals = [_final(late=3, late_max_ns=7_000_000, slack_max_ns=14_000_000), _final(late=2, late_max_ns=1_000_000)]
    report = emulation.assess(finals, _results(), QUIET, QUIET, 1.0)
    assert report.verdict == "emulator-bound"
    assert report.kernel_drops["late_datagrams"] == 5
    (reason,) = [r for r in report.reasons if "per-CPU backlog" in r]
    assert "5 datagrams" in reason and "7.0 ms" in reason and "14.0 ms" in reason


def test_datagrams_late_by_less_than_the_lag_limit_are_counted_but_keep_the_run_faithful():
    finals = [_final(late=511, late_max_ns=40_000, slack_max_ns=80_000), _final()]
    report = emulation.assess(finals, _results(), QUIET, QUIET, 1.0)
    assert report.kernel_drops["late_datagrams"] == 511
    assert report.verdict == "faithful" and report.reasons == []
