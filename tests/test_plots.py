"""The report's figures from small synthetic results: what each draws, not only that a file appears."""

from pathlib import Path

import pytest
from matplotlib.patches import Rectangle

from mrc_emu.experiments.analysis import plots, report

MIB = 2**20


def _transfer(src: str, size: int, done: float | None, *, evs: int = 1, dead_ev: int | None = None, offset: float = 0.0,
              fault_figures: dict | None = None, recovery: dict | None = None) -> dict:
    """A transfer acknowledging size bytes evenly over done ms (or half of them by 20 ms if it never completes)."""
    last = 20.0 if done is None else done
    acked = size if done is not None else size // 2
    timeline = [[float(t), int(acked * t / last)] for t in range(int(last) + 1)]
    ev_timeline = []
    for t in range(0, int(last) + 1, 2):
        sent = [t * 10 if k != dead_ev or t < 5 else 50 for k in range(evs)]
        ev_timeline.append([float(t), sent, [max(0, s - 1) for s in sent]])
    return {"src": src, "dst": "h2", "size": size, "ok": done is not None, "verified": done is not None, "label": f"{src}->h2",
            "completion_ms": done, "offset_ms": offset, "mtu": 4096, "timeline": timeline, "ev_timeline": ev_timeline,
            "per_ev": [{"ev": k, "state": "GOOD", "share": 1 / evs, "packets_sent": 1, "plane": k // 4, "spine": f"p0s{k}"}
                       for k in range(evs)],
            "ev_events": [] if dead_ev is None else [{"time_ms": 5.5, "ev": dead_ev, "old": "GOOD", "new": "ASSUMED_BAD",
                                                      "reason": "x", "rtt_ns": None}],
            "fault_figures": fault_figures, "recovery": recovery}


def _fault(start: float, end: float | None) -> list[dict]:
    events = [{"action": "xdp:1", "began_ms": start, "returned_ms": start}]
    events += [] if end is None else [{"action": "xdp-off", "began_ms": end, "returned_ms": end}]
    return [{"kind": "blackhole", "description": "blackhole p1l0-p1s2 at 30%", "events": events}]


def _run(transport: str, transfers: list[dict], faults: list[dict], **figures) -> dict:
    done = [x["completion_ms"] for x in transfers]
    return {"transport": transport, "ok": True, "verified": True, "completion_ms": None if None in done else max(done),
            "goodput_gbps": 1.0, "recovery_ms": figures.pop("recovery_ms", None), "unrecovered": figures.pop("unrecovered", False),
            "faults": faults, "transfers": transfers, "pcap": None, **figures}


def _results(**runs) -> dict:
    return {"schema": "mrc-emu/results/1", "notes": [], "seconds": 1.0, "runs": runs,
            "scenario": {"name": "t", "topology": "default", "transports": list(runs), "workloads": [], "faults": []}}


def fault_results(baseline_end: float | None = 1.0) -> dict:
    """MRC over 8 EVs, EV 6 dies at the fault, done at 40 ms; the baseline stalls and never recovers."""
    rec = {"pre_fault_gbps": 1.0, "recovery_ms": 0.5, "worst_gbps": 0.3, "window_ms": 2.0, "level": 0.9,
           "noise_band": {"p5": 0.2, "p95": 1.8, "windows": 50}}
    mrc = _run("mrc", [_transfer("h0", 4 * MIB, 40.0, evs=8, dead_ev=6, recovery=rec,
                                 fault_figures={"detection_ms": 1.5, "stall_ms": 0.4, "repair_ms": 3.0, "failed_evs": [6]})],
               _fault(3.0, baseline_end), recovery_ms=0.5,
               fault_figures={"detection_ms": 1.5, "stall_ms": 0.4, "repair_ms": 3.0}, inflation=0.04,
               reference={"completion_ms": 38.5})
    base = _run("baseline", [_transfer("h0", 2 * MIB, None, recovery=dict(rec, recovery_ms=None, worst_gbps=0.0))],
                _fault(2.0, baseline_end), recovery_ms=None, unrecovered=True,
                fault_figures={"detection_ms": 1280.0, "stall_ms": None, "repair_ms": None}, inflation=None,
                reference={"completion_ms": 30.0})
    return _results(mrc=mrc, baseline=base)


def _texts(fig) -> list[str]:
    return [t.get_text() for ax in fig.axes for t in ax.texts] + [t.get_text() for t in fig.legends[0].get_texts()]


def test_goodput_axis_ends_at_the_last_completion_and_an_open_fault_runs_to_it(tmp_path):
    results = fault_results(baseline_end=None)  # never lifted
    figs = plots.figures(results)
    assert set(figs) == {"goodput", "spray_share", "recovery"}
    goodput = figs["goodput"]
    last = 40.0  # MRC completed at 40 ms; the baseline's last sample is at 20 ms, it never completed
    for ax in goodput.axes[:3]:  # MRC's goodput, MRC's EV heat map, the baseline's goodput (shared x)
        assert ax.get_xlim() == pytest.approx((0.0, last))
    total_mrc, heat, total_base = goodput.axes[:3]
    spans = [p for p in total_base.patches if isinstance(p, Rectangle) and p.get_alpha() == pytest.approx(0.10)]
    assert spans and spans[0].get_x() == pytest.approx(2.0) and spans[0].get_x() + spans[0].get_width() == pytest.approx(last)
    assert any("never lifted" in t.get_text() for t in total_base.get_legend().get_texts())
    assert "never completed" in total_base.get_title(loc="left")
    assert total_mrc.get_ylim() != total_base.get_ylim()  # each on its own scale
    labels = [t.get_text() for t in heat.get_yticklabels()]
    assert len(labels) == 8 and labels[6] == "EV 6 (p0s6) through the fault"
    files = plots.plots(results, tmp_path)
    assert all(Path(p).stat().st_size > 10_000 for p in files.values())


def test_a_fault_lifted_after_the_end_is_clipped_to_the_edge():
    goodput = plots.figures(fault_results(baseline_end=500.0))["goodput"]
    spans = [p for p in goodput.axes[0].patches if isinstance(p, Rectangle) and p.get_alpha() == pytest.approx(0.10)]
    assert spans[0].get_x() + spans[0].get_width() == pytest.approx(40.0)
    assert any("past the end" in t.get_text() for t in goodput.axes[0].get_legend().get_texts())


def test_fault_windows_lifted_reverted_or_self_undoing():
    """The run says which faults undo themselves (scenarios.runner.FaultRun: a flap has no revert)."""
    from mrc_emu.experiments.scenarios.faults import FAULT_KINDS
    from mrc_emu.experiments.scenarios.runner import FaultRun

    def made(kind, **params):
        return FaultRun(FAULT_KINDS[kind](at=0.3, link=("p0l0", "p0s1"), **params), ("p0l0", "p0s1")).to_dict()

    assert made("flap", period_ms=100, count=3)["undoes_itself"] and not made("link-down")["undoes_itself"]
    flap = {"kind": "flap", "description": "flap", "undoes_itself": True,
            "events": [{"action": "flap", "began_ms": 10.0, "returned_ms": 310.0}]}
    down = {"kind": "link-down", "description": "down", "undoes_itself": False,
            "events": [{"action": "down", "began_ms": 10.0, "returned_ms": 10.2}]}
    congestion = {"kind": "congestion", "description": "c", "events": [{"action": "competing flows start", "at_progress": 0.3}]}
    windows = plots.fault_windows({"faults": [flap, down, congestion, *_fault(3.0, 9.0)]})
    assert [(w.start_ms, w.end_ms) for w in windows] == [(10.0, 310.0), (10.0, None), (3.0, 9.0)]


def test_recovery_draws_never_as_never_and_labels_every_bar():
    fig = plots.figures(fault_results())["recovery"]
    texts = _texts(fig)
    bars = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert sum(t.startswith("never") for t in bars) == 4  # stall, repair, completion, windowed recovery
    for value in ("1.5 ms", "0.40 ms", "3.0 ms", "1,280 ms", "38.5 ms\nfault-free", "40.0 ms\n+4.0 %", "0.50 ms"):
        assert value in texts, value
    exact = next(ax for ax in fig.axes if ax.get_title(loc="left").startswith("after the fault"))
    assert exact.get_yscale() == "log"  # 0.4 ms against 1,280 ms
    heights = [p.get_height() for p in exact.patches]
    assert all(h > 0 for h in heights)  # no "never" drawn as a 0 ms bar
    assert any("never (hatched" in t for t in texts)
    assert "never" not in " ".join(_texts(plots.figures(fault_results_all_recovered())["recovery"]))


def fault_results_all_recovered() -> dict:
    results = fault_results()
    base = results["runs"]["baseline"]
    base.update(fault_figures={"detection_ms": 1280.0, "stall_ms": 1300.0, "repair_ms": 1310.0}, completion_ms=90.0,
                recovery_ms=1200.0, unrecovered=False, inflation=2.0)
    base["transfers"][0]["recovery"]["recovery_ms"] = 1200.0
    return results


def test_spray_legend_is_outside_the_data():
    fig = plots.figures(fault_results())["spray_share"]
    fig.draw_without_rendering()
    ax = fig.axes[0]
    assert ax.get_legend().get_window_extent().x0 >= ax.get_window_extent().x1
    assert ax.get_xlim() == pytest.approx((0.0, 40.0))


def test_results_without_the_exact_figures_and_without_a_fault(tmp_path):
    """An 8-to-1 incast made before fault_figures/reference/inflation existed: goodput, spray and flows, no recovery."""
    flows = [_transfer(f"h{k}", MIB, 20.0 + k, evs=4, offset=0.1 * k) for k in range(8)]
    for x in flows:
        del x["fault_figures"]
    results = _results(mrc=_run("mrc", flows, []))
    files = report.plots(results, tmp_path)
    assert set(files) == {"goodput", "spray_share", "flows"}
    figs = plots.figures(results)
    assert "all 8 flows together" in figs["goodput"].axes[0].get_title(loc="left")
    goodput, cdf = figs["flows"].axes[1], figs["flows"].axes[0]
    assert goodput.get_xlim()[1] == pytest.approx(0.7 + 27.0)
    assert "p50 23.0 ms, p99 27.0 ms, max 27.0 ms" in cdf.get_legend().get_texts()[0].get_text()


def test_exact_figures_missing_from_an_old_faulted_run_are_said_so():
    results = fault_results()
    for run in results["runs"].values():
        for key in ("fault_figures", "inflation", "reference"):
            run.pop(key)
    texts = _texts(plots.figures(results)["recovery"])
    assert texts.count("not recorded") == 6

