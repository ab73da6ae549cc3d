"""The emulation verdict alone, from hand-made worker reports (no root, no fabric)."""

from types import SimpleNamespace

from mrc_emu.experiments.analysis import emulation
from mrc_emu.io.clock import LagMeter

QUIET = {"dropped": 0, "time_squeeze": 0}


def _final(late: int = 0, late_max_ns: int = 0, slack_max_ns: int = 0, busy: float = 0.5,
           python_receive: tuple[str, ...] = (), unstamped: int = 0, truncated: int = 0) -> SimpleNamespace:
    lag = LagMeter()
    lag.record(100_000)  # 0.1 ms: well inside the limit
    loop = {"wall_ns": 1_000_000_000, "cpu_ns": int(busy * 1e9), "runqueue_wait_ns": 0, "datagrams": 1000,
            "frames_sent": 1000, "timer_lag": lag.to_dict(), "socket_lag": lag.to_dict(),
            "late_datagrams": late, "late_max_ns": late_max_ns, "slack_max_ns": slack_max_ns,
            "python_receive": list(python_receive), "unstamped_datagrams": unstamped, "truncated_datagrams": truncated}
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


def test_a_run_read_by_the_python_receive_path_is_never_faithful_and_names_its_hosts():
    finals = [_final(python_receive=("h3", "h1"), unstamped=1000), _final()]
    report = emulation.assess(finals, _results(), QUIET, QUIET, 1.0)
    assert report.verdict == "emulator-bound"
    assert report.python_receive == ["h1", "h3"] and report.unstamped_datagrams == 1000
    (reason,) = report.reasons
    assert "2 hosts (h1, h3)" in reason and "Python path" in reason and "lag" in reason
    assert emulation.Report(**report.to_dict()) == report  # the results file's block reads back (report.py)


def test_datagrams_without_a_kernel_stamp_on_the_c_path_make_the_run_emulator_bound():
    report = emulation.assess([_final(unstamped=7), _final()], _results(), QUIET, QUIET, 1.0)
    assert report.verdict == "emulator-bound" and report.python_receive == []
    (reason,) = report.reasons
    assert reason.startswith("7 datagrams came without the kernel's arrival stamp")


def test_datagrams_dropped_as_truncated_on_receipt_make_the_run_emulator_bound():
    report = emulation.assess([_final(truncated=2), _final(truncated=1)], _results(), QUIET, QUIET, 1.0)
    assert report.verdict == "emulator-bound" and report.kernel_drops["truncated_datagrams"] == 3
    (reason,) = report.reasons
    assert "dropped 3 datagrams that arrived cut short" in reason
