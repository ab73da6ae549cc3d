"""The scenario report's figures: goodput over time, MRC's spray, the fault figures, the flows.

Why it exists: a figure is read at a glance or not at all, so each one here is built to say what it
draws (titles with units, legends outside the data, every bar labelled with its value, "never" drawn
as never) and to hold only what the run measured: results.json is the only input, and nothing is
drawn that it does not hold (goodput is binned from the transfer's timeline, the rest is its figures
as they are). report.py writes results.json and report.md and calls `plots`; the drawing lives apart
so that neither module grows past what a reader holds at once, and so that tests can inspect a
figure's artists (`figures`) before it is saved. It never reads a clock, a socket or a fabric.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from ...stats import percentile
from . import metrics

COLORS = {"mrc": "tab:green", "baseline": "tab:blue"}
FAULT_COLOR = "tab:red"
DPI = 110
NICE_BINS_MS = (1, 2, 5, 10, 20, 50, 100, 200, 500)
BINS_ACROSS = 120  # a goodput curve has about this many bins across the width: finer is noise
DECADES = 20  # a bar chart whose values span this factor or more gets a log scale
STATE_MARKS = {"ASSUMED_BAD": ("x", "EV marked ASSUMED_BAD"), "DENIED": ("v", "EV DENIED"), "GOOD": ("o", "EV back to GOOD")}


@dataclass
class FaultWindow:
    start_ms: float
    end_ms: float | None  # None: never lifted while the run lasted
    text: str


def fault_windows(run: dict) -> list[FaultWindow]:
    """Each fault of a run, in ms since its first transfer started: the first event applies it, a second lifts it;
    one that undoes itself (a flap: no revert) lasts as long as its one action ran."""
    out = []
    for f in run.get("faults", []):
        if events := [e for e in f["events"] if "began_ms" in e]:
            undoes_itself = f.get("undoes_itself", False)  # the run says so (scenarios.runner.FaultRun)
            end = events[1]["began_ms"] if len(events) > 1 else events[0]["returned_ms"] if undoes_itself else None
            out.append(FaultWindow(events[0]["began_ms"], end, f["description"]))
    return out


def transfer_end_ms(transfer: dict) -> float:
    """When a transfer completed (or its last sample, if it never did), in ms since the run's first transfer started."""
    last = transfer["timeline"][-1][0] if transfer["timeline"] else 0.0
    return transfer.get("offset_ms", 0.0) + (last if transfer["completion_ms"] is None else transfer["completion_ms"])


def main_transfers(run: dict) -> list[dict]:
    """The workload's transfers, without the competing traffic a congestion fault adds."""
    return [t for t in run["transfers"] if not t.get("label", "").startswith("competing")]


def bin_ms(span_ms: float) -> float:
    """A round bin width giving about BINS_ACROSS bins over span_ms."""
    return next((b for b in NICE_BINS_MS if b >= span_ms / BINS_ACROSS), NICE_BINS_MS[-1])


def goodput_steps(transfers: list[dict], width_ms: float) -> tuple[list[float], list[float]]:
    """The transfers' goodput together (Gbit/s) in bins of width_ms, from the first start to the last sample,
    in ms since the run's first transfer started: (edges, values) for stairs."""
    lines = [[(t + x.get("offset_ms", 0.0), b) for t, b in x["timeline"]] for x in transfers if len(x["timeline"]) > 1]
    if not lines:
        return [], []
    start, end = min(line[0][0] for line in lines), max(line[-1][0] for line in lines)
    edges = [start + i * width_ms for i in range(int((end - start) // width_ms) + 1)]
    edges += [end] if edges[-1] < end else []
    acked = [sum(metrics.bytes_at(line, t) for line in lines) for t in edges]
    return edges, [(b1 - b0) * 8 / ((t1 - t0) * 1e6) for t0, t1, b0, b1 in zip(edges, edges[1:], acked, acked[1:])]


def _ms(value: float) -> str:
    return f"{value:,.0f} ms" if value >= 100 else f"{value:.1f} ms" if value >= 1 else f"{value:.2f} ms"


def _draw_faults(ax, windows: list[FaultWindow], x_end: float, span: bool = True) -> None:
    """Each fault as a tinted span (or, over a stacked plot, as lines at its start and its end), labelled for the legend."""
    for w in windows:
        end = x_end if w.end_ms is None else min(w.end_ms, x_end)
        if w.start_ms >= x_end:
            ax.plot([], [], color=FAULT_COLOR, linestyle="--", label=f"fault: {w.text}\n(at {_ms(w.start_ms)}, after this ended)")
            continue
        if w.end_ms is None:
            when = f"from {_ms(w.start_ms)}, never lifted"
        else:
            when = f"{_ms(w.start_ms)} to {_ms(w.end_ms)}" + (", past the end" if w.end_ms > x_end else "")
        label = f"fault: {w.text}\n({when})"
        if span:
            ax.axvspan(w.start_ms, end, color=FAULT_COLOR, alpha=0.10, linewidth=0, label=label)
        ax.axvline(w.start_ms, color=FAULT_COLOR, linestyle="--", linewidth=1.5 if span else 2, label=None if span else label)
        if not span and w.end_ms is not None and w.end_ms < x_end:
            ax.axvline(w.end_ms, color=FAULT_COLOR, linestyle="--", linewidth=2)


def _legend_outside(ax, x: float = 1.01, **kw) -> None:
    ax.legend(loc="upper left", bbox_to_anchor=(x, 1.0), fontsize=8, frameon=False, borderaxespad=0, **kw)


def _describe(transfer: dict) -> str:
    size = transfer["size"]
    human = f"{size / 2**20:g} MiB" if size >= 2**20 else f"{size / 2**10:g} KiB"
    return f"{transfer['src']} -> {transfer['dst']} ({human})"


def ev_transfer(run: dict) -> dict | None:
    """The transfer whose EVs the heat map shows: the first through the fault that recorded its EVs, else the first."""
    sprayed = [x for x in main_transfers(run) if len(x.get("ev_timeline") or []) > 1 and len(x["ev_timeline"][0][2]) > 1]
    return next((x for x in sprayed if x.get("fault_figures")), sprayed[0] if sprayed else None)


def goodput_figure(runs: dict[str, Any]) -> Figure:
    """Per transport, the goodput of its transfers (together, if several) on one time axis from the start to
    the last completion, its own y scale, the faults drawn; under it, a heat map of each EV's goodput."""
    x_end = max(transfer_end_ms(x) for run in runs.values() for x in main_transfers(run))
    width = bin_ms(x_end)
    rows = [(kind, t) for t, run in runs.items() for kind in ("total", "evs") if kind == "total" or ev_transfer(run)]
    heights = [1.0 if kind == "total" else 0.35 + 0.11 * len(ev_transfer(runs[t])["per_ev"]) for kind, t in rows]
    fig = Figure(figsize=(12, 1.0 + 2.6 * sum(heights)), layout="constrained")
    axes = fig.subplots(len(rows), 1, sharex=True, squeeze=False, height_ratios=heights)[:, 0]
    for ax, (kind, transport) in zip(axes, rows):
        run, flows = runs[transport], main_transfers(runs[transport])
        if kind == "evs":
            _ev_heat_map(ax, transport, run, ev_transfer(run), x_end, width)
            continue
        edges, values = goodput_steps(flows, width)
        if values:
            ax.stairs(values, edges, color=COLORS.get(transport, "black"), linewidth=1.4, label=f"goodput ({width:g} ms bins)")
        ax.set_ylim(0, max(values, default=1.0) * 1.15 or 1.0)  # its own scale: the baseline's is not MRC's
        ax.set_ylabel("Gbit/s")
        done = [transfer_end_ms(x) for x in flows]
        finished = all(x["completion_ms"] is not None for x in flows)
        if finished:
            ax.axvline(max(done), color="black", linestyle=":", linewidth=1.2, label=f"completed at {_ms(max(done))}")
        _draw_faults(ax, fault_windows(run), x_end)
        what = _describe(flows[0]) if len(flows) == 1 else f"all {len(flows)} flows together (each in flows.png)"
        status = f"completed at {_ms(max(done))}" if finished else "never completed"
        ax.set_title(f"{transport}: goodput of {what}, {status}", fontsize=10, loc="left")
        ax.grid(alpha=0.3)
        _legend_outside(ax)
    axes[-1].set_xlim(0, x_end)
    axes[-1].set_xlabel("ms since the first transfer started")
    return fig


def _ev_heat_map(ax, transport: str, run: dict, x: dict, x_end: float, width: float) -> None:
    mtu, offset = x.get("mtu", 4096), x.get("offset_ms", 0.0)
    evt = [x["ev_timeline"][0]]
    for row in x["ev_timeline"][1:]:  # cells no narrower than the goodput's bins: finer is noise
        if row[0] - evt[-1][0] >= width or row is x["ev_timeline"][-1]:
            evt.append(row)
    n = len(evt[0][2])
    grid = [[(g1[k] - g0[k]) * mtu * 8 / ((t1 - t0) * 1e6) if t1 > t0 else 0.0
             for (t0, _, g0), (t1, _, g1) in zip(evt, evt[1:])] for k in range(n)]
    mesh = ax.pcolormesh([offset + row[0] for row in evt], range(n + 1), grid, cmap="viridis", vmin=0, shading="flat")
    bar = ax.inset_axes((1.01, 0.0, 0.012, 1.0))  # beside the map, under the legends' column of the panels above
    ax.figure.colorbar(mesh, cax=bar, label="Gbit/s per EV")
    failed = set((x.get("fault_figures") or {}).get("failed_evs") or [])
    names = [e["ev"] for e in x["per_ev"]][:n]
    ax.set_yticks([k + 0.5 for k in range(n)], [f"EV {e['ev']} ({e.get('spine', '?')})" + (" through the fault" if e["ev"] in failed
                                                else "") for e in x["per_ev"][:n]], fontsize=7)
    for label, ev in zip(ax.get_yticklabels(), names):
        label.set_color(FAULT_COLOR if ev in failed else "black")
    ax.invert_yaxis()
    for w in fault_windows(run):
        for t in [w.start_ms] + ([w.end_ms] if w.end_ms is not None and w.end_ms < x_end else []):
            ax.axvline(t, color=FAULT_COLOR, linestyle="--", linewidth=1.2)
    seen = set()
    for event in x.get("ev_events", []):
        if event["ev"] in names and event["new"] in STATE_MARKS and offset + event["time_ms"] <= x_end:
            marker, text = STATE_MARKS[event["new"]]
            ax.plot(offset + event["time_ms"], names.index(event["ev"]) + 0.5, marker=marker, color="white", markersize=9,
                    markeredgecolor="white" if marker == "x" else "black", markeredgewidth=2, linestyle="none",
                    label=None if event["new"] in seen else f"{text} (first at {_ms(offset + event['time_ms'])})")
            seen.add(event["new"])
    step = (evt[-1][0] - evt[0][0]) / max(1, len(evt) - 1)
    whose = "" if len(main_transfers(run)) == 1 else f" of {_describe(x)}"
    ax.set_title(f"{transport}: goodput on each EV{whose} (packets delivered x {mtu} B, per ~{step:.0f} ms); "
                 "dark = nothing delivered", fontsize=10, loc="left")
    if seen:
        _legend_outside(ax, x=1.09)
        for handle in ax.get_legend().legend_handles:  # white on the map, black on the legend's white
            handle.set_markeredgecolor("black")


def spray_figure(run: dict) -> Figure | None:
    """MRC's share of packets sent on each EV, stacked, from the transfer's start to its completion."""
    x = ev_transfer(run) or main_transfers(run)[0]  # the transfer the heat map shows
    evt = x.get("ev_timeline") or []
    if len(evt) < 2:
        return None
    offset, n = x.get("offset_ms", 0.0), len(evt[0][1])
    edges, shares = [], [[] for _ in range(n)]
    for (_t0, s0, _), (t1, s1, _) in zip(evt, evt[1:]):
        sent = [b - a for a, b in zip(s0, s1)]
        if total := sum(sent):
            edges.append(offset + t1)
            for k in range(n):
                shares[k].append(sent[k] / total)
    if not edges:
        return None  # nothing sent while it was sampled
    fig = Figure(figsize=(12, 3.8), layout="constrained")
    ax = fig.subplots()
    labels = [f"EV {e['ev']} (plane {e.get('plane', '?')}, {e.get('spine', '?')})" for e in x["per_ev"]][:n]
    ax.stackplot(edges, shares, labels=labels, step="pre", colors=[f"C{k % 10}" for k in range(n)])
    x_end = transfer_end_ms(x)
    _draw_faults(ax, fault_windows(run), x_end, span=False)
    ax.set_xlim(offset, x_end)
    ax.set_ylim(0, 1)
    ax.set_xlabel("ms since the first transfer started")
    ax.set_ylabel("share of packets sent")
    step = (evt[-1][0] - evt[0][0]) / max(1, len(evt) - 1)
    ax.set_title(f"mrc: share of {_describe(x)}'s packets sent on each EV (stacked, per ~{step:.0f} ms sample)",
                 fontsize=10, loc="left")
    handles, texts = ax.get_legend_handles_labels()
    ax.legend(handles[::-1], texts[::-1], loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False,
              borderaxespad=0)  # top of the legend = top of the stack
    return fig



@dataclass
class Bar:
    x: float
    value: float | str | None  # None: never; a string: why there is no value (drawn as that text)
    color: str
    hatch: str | None = None
    note: str = ""  # a second line under the value


def _bars(ax, bars: list[Bar], width: float) -> None:
    """Bars labelled with their values (ms); "never" reaches the top of the axis, hatched, and says so."""
    finite = [b.value for b in bars if isinstance(b.value, (int, float))]
    positive = [v for v in finite if v > 0]
    log = len(positive) > 1 and max(positive) / min(positive) >= DECADES
    if log:
        ax.set_yscale("symlog", linthresh=1.0) if min(finite) <= 0 else ax.set_yscale("log")
        bottom, top = (0.0 if min(finite) <= 0 else min(positive) / 3), max(positive) * 5
    else:
        bottom, top = 0.0, (max(positive) * 1.35 if positive else 1.0)
    for b in bars:
        if b.value is None:
            ax.bar(b.x, top - bottom, bottom=bottom, width=width, facecolor="white", edgecolor=b.color,
                   hatch="///", linewidth=1.2)
            ax.text(b.x, math.sqrt(top * max(bottom, top / 100)) if log else top * 0.5, "never" + (f"\n{b.note}" if b.note else ""),
                    ha="center", va="center", fontsize=9, fontweight="bold", backgroundcolor="white")
        elif isinstance(b.value, str):
            ax.text(b.x, bottom if not log or bottom > 0 else 0, b.value, ha="center", va="bottom", fontsize=8,
                    rotation=90, color="dimgray")
        else:
            ax.bar(b.x, b.value - bottom, bottom=bottom, width=width, color=b.color, hatch=b.hatch,
                   edgecolor="white" if b.hatch else b.color, alpha=0.55 if b.hatch else 1.0)
            ax.text(b.x, b.value, _ms(b.value) + (f"\n{b.note}" if b.note else ""), ha="center", va="bottom", fontsize=7.5)
    ax.set_ylim(bottom, top)
    ax.set_xlim(min(b.x for b in bars) - 0.6, max(b.x for b in bars) + 0.6)
    ax.grid(alpha=0.3, axis="y")
    ax.set_ylabel("ms" + (", log scale" if log else ""))


EXACT = (("detection_ms", "detection"), ("stall_ms", "stall"), ("repair_ms", "repair"))


def _exact_value(run: dict, key: str) -> float | str | None:
    if "fault_figures" not in run:
        return "not recorded"  # results.json made before the exact figures existed
    if run["fault_figures"] is None:
        return "fault missed it"
    return run["fault_figures"].get(key)


def _pct(value: float) -> str:
    return f"{value * 100:+.1f} %" if abs(value) < 0.1 else f"{value * 100:+,.0f} %"


def recovery_figure(runs: dict[str, Any]) -> Figure:  # only with a fault: without one it has nothing to show
    """Per transport: detection, stall and repair after the fault (exact, from the transport's records) and
    completion against the fault-free run (the inflation); below, the windowed recovery against its noise."""
    names = list(runs)
    windowed = any(t.get("recovery") for run in runs.values() for t in main_transfers(run))
    fig = Figure(figsize=(12, 8 if windowed else 4.4), layout="constrained")
    axes = fig.subplot_mosaic([["exact", "completion"]] + ([["windowed", "levels"]] if windowed else []), width_ratios=[3, 2])
    ax, width = axes["exact"], 0.8 / len(names)
    bars = [Bar(g + (i - (len(names) - 1) / 2) * width, _exact_value(runs[t], key), COLORS.get(t, "gray"))
            for g, (key, _) in enumerate(EXACT) for i, t in enumerate(names)]
    _bars(ax, bars, width)
    ax.set_xticks(range(len(EXACT)), [label for _, label in EXACT])
    ax.set_title("after the fault (exact, from each transport's records): detection = first reaction,\n"
                 "stall = longest time with nothing new acknowledged, repair = all lost bytes delivered",
                 fontsize=9, loc="left")
    ax, never = axes["completion"], any(b.value is None for b in bars)
    bars = []
    for i, t in enumerate(names):
        run, color = runs[t], COLORS.get(t, "gray")
        ref = (run.get("reference") or {}).get("completion_ms")
        inflation = run.get("inflation")
        note = _pct(inflation) if inflation is not None else ""
        if ref is not None:
            bars.append(Bar(i - 0.2, ref, color, hatch="..", note="fault-free"))
        bars.append(Bar(i + (0.2 if ref is not None else 0), run["completion_ms"], color,
                        note=note if run["completion_ms"] is not None else "completed"))
    _bars(ax, bars, 0.38)
    ax.set_xticks(range(len(names)), names)
    ax.set_title("completion: the fault-free run (dotted) and with the fault;\n"
                 "the label under the value is the inflation", fontsize=9, loc="left")
    if windowed:
        never |= _windowed(axes["windowed"], axes["levels"], runs)
    never |= any(b.value is None for b in bars)
    handles = [Patch(color=COLORS.get(t, "gray"), label=t) for t in names]
    handles += [Patch(facecolor="white", edgecolor="black", hatch="///", label="never (hatched, to the axis's top)")] if never else []
    fig.legend(handles=handles, loc="outside upper center", ncol=len(handles), fontsize=9, frameon=False)
    return fig


def _windowed(ax, levels, runs: dict[str, Any]) -> bool:
    """Secondary: the windowed recovery time, and the windows' goodput beside the noise band of the fault-free run.
    True if a transport never recovered."""
    names = list(runs)
    bars = []
    for i, t in enumerate(names):
        run = runs[t]
        value = run["recovery_ms"] if run["recovery_ms"] is not None or run.get("unrecovered") else "no level before it"
        bars.append(Bar(i, value, COLORS.get(t, "gray")))
    _bars(ax, bars, 0.5)
    ax.set_xticks(range(len(names)), names)
    first = next(t["recovery"] for run in runs.values() for t in main_transfers(run) if t.get("recovery"))
    window, level = first.get("window_ms", 2), first.get("level", 0.9)
    ax.set_title(f"secondary, windowed: until the {window:g} ms goodput is back at\n"
                 f"{level:.0%} of the 50 ms before the fault (noisy, see right)", fontsize=9, loc="left")
    bands, tops = [], []
    for i, t in enumerate(names):
        rec = next((x["recovery"] for x in main_transfers(runs[t]) if x.get("recovery")), None)
        if rec is None:
            continue
        once = (lambda label: label) if not tops else (lambda label: None)  # the legend names each mark once

        if band := rec.get("noise_band"):  # ratios to the level before the fault: drawn against this run's level
            low, high = band["p5"] * rec["pre_fault_gbps"], band["p95"] * rec["pre_fault_gbps"]
            levels.bar(i, high - low, bottom=low, width=0.5, color="lightgray",
                       label=None if bands else f"fault-free run: {window:g} ms windows, p5 to p95")
            bands.append((i, band, high))
        levels.hlines(rec["pre_fault_gbps"], i - 0.3, i + 0.3, color="black", linewidth=2, label=once("50 ms before the fault"))
        levels.hlines(rec["pre_fault_gbps"] * level, i - 0.3, i + 0.3, color="black", linestyle="--",
                      label=once(f"{level:.0%} of it: recovered"))
        levels.plot(i, rec["worst_gbps"], marker="v", color=COLORS.get(t, "gray"), markeredgecolor="black",
                    markersize=10, linestyle="none", label=once(f"worst {window:g} ms window after the fault"))
        levels.annotate(f"{rec['worst_gbps']:.2f}", (i, rec["worst_gbps"]), xytext=(10, 0), textcoords="offset points",
                        va="center", fontsize=8)
        tops.append(max(rec["pre_fault_gbps"], rec["worst_gbps"]))
    top = 2.5 * max(tops, default=1.0) or 1.0  # the levels readable, a far wider band clipped (its numbers say how wide)
    for i, band, high in bands:
        off = " (off the axis)" if high > top else ""
        levels.text(i, min(high, top * 0.97), f"p5 {band['p5']:.2f}x\np95 {band['p95']:.2f}x{off}", ha="center", va="top", fontsize=7)
    levels.set_xticks(range(len(names)), names)
    levels.set_xlim(-0.6, len(names) - 0.4)
    levels.set_ylim(0, top)
    levels.set_ylabel("Gbit/s")
    levels.grid(alpha=0.3, axis="y")
    levels.set_title("the dip against the noise: a worst window inside\nthe gray band is no worse than a fault-free run",
                     fontsize=9, loc="left")
    _legend_outside(levels)
    return any(b.value is None for b in bars)


def flows_figure(runs: dict[str, Any]) -> Figure | None:
    """A multi-flow run (incast, all-to-all, ring): per transport, every flow's goodput and their sum since the
    first start, with the faults drawn; beside them, the CDF of the flows' completion times of every transport."""
    multi = {t: main_transfers(run) for t, run in runs.items()}
    multi = {t: xs for t, xs in multi.items() if len(xs) > 1}
    if not multi:
        return None
    x_end = max(transfer_end_ms(x) for xs in multi.values() for x in xs)
    width = bin_ms(x_end)
    fig = Figure(figsize=(13, 1.2 + 3.0 * max(len(multi), 1.3)), layout="constrained")
    grid = fig.add_gridspec(len(multi), 2, width_ratios=[3, 1.3])
    cdf = fig.add_subplot(grid[:, 1])
    first = None
    for row, (transport, flows) in enumerate(multi.items()):
        ax = fig.add_subplot(grid[row, 0], sharex=first)
        first = first or ax
        for k, flow in enumerate(flows):
            edges, values = goodput_steps([flow], width)
            if values:
                ax.stairs(values, edges, linewidth=0.7, alpha=0.6, color=f"C{k % 10}",
                          label=f"each of the {len(flows)} flows" if k == 0 else None)
        edges, values = goodput_steps(flows, width)
        if values:
            ax.stairs(values, edges, color="black", linewidth=1.6, label=f"sum of the {len(flows)} flows")
        _draw_faults(ax, fault_windows(runs[transport]), x_end)
        ax.set_xlim(0, x_end)
        ax.set_ylim(bottom=0)
        ax.set_ylabel("Gbit/s")
        ax.set_title(f"{transport}: goodput of each flow and their sum ({width:g} ms bins)", fontsize=10, loc="left")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", bbox_to_anchor=(0.0, -0.14 if row == len(multi) - 1 else -0.06), fontsize=8,
                  frameon=False, ncol=3, borderaxespad=0)
        if row == len(multi) - 1:
            ax.set_xlabel("ms since the first flow started")
        fct = sorted(x["completion_ms"] for x in flows if x["completion_ms"] is not None)
        unfinished = len(flows) - len(fct)
        if fct:
            p50, p99 = percentile(fct, 50), percentile(fct, 99)
            text = f"{transport}: p50 {_ms(p50)}, p99 {_ms(p99)}, max {_ms(fct[-1])}"
            if unfinished:
                text += f"\n({unfinished} of {len(flows)} never finished)"
            cdf.step([fct[0]] + fct, [0.0] + [(i + 1) / len(flows) for i in range(len(fct))], where="post",
                     color=COLORS.get(transport, "black"), linewidth=1.6, label=text)
        else:
            cdf.plot([], [], color=COLORS.get(transport, "black"), label=f"{transport}: no flow finished")
    cdf.set_title("completion time of each flow (FCT): CDF", fontsize=10, loc="left")
    cdf.set_xlabel("ms since the flow started")
    cdf.set_ylabel("fraction of flows completed")
    cdf.set_ylim(0, 1.02)
    cdf.grid(alpha=0.3)
    cdf.legend(loc="upper left", bbox_to_anchor=(0.0, -0.12), fontsize=8, frameon=False, borderaxespad=0)
    return fig


def figures(results: dict[str, Any]) -> dict[str, Figure]:
    """Every figure of a scenario's results, not yet saved: {name: Figure} (goodput, spray_share, recovery, flows)."""
    runs = {t: run for t, run in results["runs"].items() if main_transfers(run)}
    if not runs:
        return {}
    out = {"goodput": goodput_figure(runs)}
    if "mrc" in runs and (spray := spray_figure(runs["mrc"])) is not None:
        out["spray_share"] = spray
    if any(run.get("faults") for run in runs.values()):
        out["recovery"] = recovery_figure(runs)
    if (flows := flows_figure(runs)) is not None:
        out["flows"] = flows
    return out


def plots(results: dict[str, Any], out_dir: Path) -> dict[str, str]:
    """Each figure as out_dir/<name>.png; returns {name: path}."""
    files = {}
    for name, fig in figures(results).items():
        path = out_dir / f"{name}.png"
        fig.savefig(path, dpi=DPI)
        files[name] = str(path)
    return files
