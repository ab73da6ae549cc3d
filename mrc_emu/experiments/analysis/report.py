"""What a scenario run leaves behind: results.json (with its schema), plots, report.md.

Why it exists: numbers that cannot be looked at again are not results. results.json holds
every figure and timeline; the schema below documents it (docs/results.md shows it) and a
test validates real output against it. The plots (plots.py) show the fault and the recovery.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .emulation import Report
from .plots import plots

_NUM = {"type": ["number", "null"]}
_TRANSFER = {
    "type": "object",
    "required": ["src", "dst", "size", "ok", "verified", "sha256_source", "sha256_placed", "completion_ms",
                 "goodput_gbps", "per_ev", "ev_events", "timeline", "ev_timeline", "recovery"],
    "properties": {
        "src": {"type": "string"}, "dst": {"type": "string"}, "size": {"type": "integer", "minimum": 1},
        "ok": {"type": "boolean"}, "verified": {"type": "boolean"}, "error": {"type": ["string", "null"]},
        "sha256_source": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
        "sha256_placed": {"type": ["string", "null"]},
        "completion_ms": _NUM, "goodput_gbps": _NUM, "goodput_pps": _NUM, "offset_ms": _NUM,
        "ev_format": {"enum": ["SRV6", "SRV6_USID", "UDP", "STEV"]},
        "per_ev": {"type": "array", "items": {"type": "object", "required": ["ev", "state", "share", "packets_sent"],
                                             "properties": {"state": {"enum": ["GOOD", "ASSUMED_BAD", "DENIED"]}}}},
        "ev_events": {"type": "array", "items": {
            "type": "object", "required": ["time_ms", "ev", "old", "new", "reason"],
            "properties": {"old": {"enum": ["GOOD", "ASSUMED_BAD", "DENIED"]},
                           "new": {"enum": ["GOOD", "ASSUMED_BAD", "DENIED"]}}}},
        "timeline": {"type": "array", "items": {"type": "array", "prefixItems": [{"type": "number"}, {"type": "integer"}]}},
        "ev_timeline": {"type": "array"},
        "recovery": {"type": ["object", "null"], "required": ["pre_fault_gbps", "recovery_ms", "worst_gbps"]},
        "fault_figures": {"type": ["object", "null"], "required": ["detection_ms", "stall_ms", "repair_ms"]},
        "slowdown": _NUM,
        "base_rtt": {"type": ["object", "null"], "required": ["ns", "source"]},  # what the QP's CC was told
    },
}
_COUNT = {"type": ["integer", "null"], "minimum": 0}
_CAPTURE = {  # the pcap's own run (runner.capture_run) and tcpdump's counts (fabric/ops.py CaptureResult)
    "type": "object",
    "required": ["path", "run", "host", "interfaces", "packets", "received", "dropped_kernel", "dropped_interface",
                 "left_in_ring", "lost", "complete", "snaplen", "problem", "completion_ms", "verified", "time_dilation",
                 "ring_kib", "attempts"],
    "properties": {
        # "separate": the namespace fabric captures a second run; "same": virtual time captures the measured one
        "path": {"type": "string"}, "run": {"enum": ["separate", "same"]}, "host": {"type": "string"},
        "interfaces": {"type": "array", "items": {"type": "string"}},
        "packets": _COUNT, "received": _COUNT, "dropped_kernel": _COUNT, "dropped_interface": _COUNT,
        "left_in_ring": _COUNT, "lost": _COUNT, "complete": {"type": "boolean"}, "snaplen": _COUNT,
        "problem": {"type": ["string", "null"]}, "completion_ms": _NUM, "verified": {"type": "boolean"},
        "time_dilation": {"type": "number", "minimum": 1}, "ring_kib": {"type": ["integer", "null"], "minimum": 1},
        "attempts": {"type": "array", "minItems": 1, "items": {"type": "object",
                                                               "required": ["time_dilation", "ring_kib", "lost"]}},
    },
}


def _run_schema(transports: list[str], fault_kinds: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["transport", "ok", "verified", "completion_ms", "goodput_gbps", "recovery_ms", "faults", "transfers"],
        "properties": {
            "transport": {"enum": transports}, "ok": {"type": "boolean"}, "verified": {"type": "boolean"},
            "completion_ms": _NUM, "goodput_gbps": _NUM, "recovery_ms": _NUM, "inflation": _NUM,
            "fault_figures": {"type": ["object", "null"], "required": ["detection_ms", "stall_ms", "repair_ms"],
                              "properties": {"detection_ms": _NUM, "stall_ms": _NUM, "repair_ms": _NUM}},
            "reference": {"type": ["object", "null"], "required": ["completion_ms"]},
            "slowdown": {"type": ["object", "null"], "required": ["p50", "p99", "max"]},
            "faults": {"type": "array", "items": {"type": "object", "required": ["kind", "description", "events"],
                                                 "properties": {"kind": {"enum": fault_kinds}}}},
            "transfers": {"type": "array", "minItems": 1, "items": _TRANSFER},
            "spurious_retransmits": _COUNT, "false_ev_events": _COUNT, "packets_sent": _COUNT,
            "pcap": {"type": ["string", "null"]},
            "capture": _CAPTURE,
            "base_rtt": {"type": ["object", "null"], "required": ["ns", "source", "summary"]},  # measured for NSCC
            "emulation": {"type": "object", "required": ["verdict", "reasons", "workers", "time_dilation", "loop_lag_us",
                                                         "cpu_busy", "packets_per_s", "kernel_drops"],
                          "properties": {"verdict": {"enum": ["faithful", "emulator-bound"]}}},
            "clock": {"enum": ["virtual"]},  # absent on the namespace fabric
        },
        # only virtual time captures the measured run itself: the namespace fabric's pcap is a separate run's
        "if": {"not": {"required": ["clock"]}},
        "then": {"properties": {"capture": {"properties": {"run": {"const": "separate"}}}}},
    }


def results_schema(transports: list[str], fault_kinds: list[str]) -> dict[str, Any]:
    """The JSON schema of results.json, for the transports and fault kinds a scenario may name
    (the scenarios package knows them: scenarios.runner.RESULTS_SCHEMA)."""
    run = _run_schema(transports, fault_kinds)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "mrc-emu scenario results",
        "type": "object",
        "required": ["schema", "scenario", "runs", "notes", "seconds"],
        "properties": {
            "schema": {"const": "mrc-emu/results/1"},
            "scenario": {"type": "object", "required": ["name", "topology", "transports", "workloads", "faults"]},
            "runs": {"type": "object", "properties": dict.fromkeys(transports, run), "additionalProperties": False},
            "notes": {"type": "array", "items": {"type": "string"}},
            "seconds": {"type": "number"},
            "plots": {"type": "object"},
        },
    }


def write(results: dict[str, Any], out_dir: Path) -> dict[str, str]:
    """results.json, the plots and report.md in out_dir; returns {what: path}."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = plots(results, out_dir)
    results["plots"] = {k: Path(v).name for k, v in files.items()}
    (out_dir / "results.json").write_text(json.dumps(results, indent=1))
    (out_dir / "report.md").write_text(markdown(results))
    return {"results": str(out_dir / "results.json"), "report": str(out_dir / "report.md"), **files}


def _ms(value: float | None, never: str = "never") -> str:
    if value is None:
        return never
    if 0 < value < 1:  # three figures: virtual time's are tens of microseconds
        return f"{value:.3g} ms"
    return f"{value:.1f} ms" if value < 10 else f"{value:,.0f} ms"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:+.0f} %"


def _noise(run: dict) -> str:
    """The fault-free run's longest pause in acknowledgements, where it is known."""
    noise = run["fault_figures"].get("stall_noise_ms")
    return "" if noise is None else f" (fault-free: {_ms(noise)} at most)"


def headline(results: dict[str, Any]) -> str | None:
    """The scenario's one sentence, like against like: how long each transport stalled after the
    fault, and its completion against its own fault-free run (None: no MRC/baseline pair with a
    fault through both)."""
    runs = results["runs"]
    mrc, base = runs.get("mrc"), runs.get("baseline")
    if not (mrc and base and mrc.get("fault_figures") and base.get("fault_figures")):
        return None
    sentence = (f"MRC stalled {_ms(mrc['fault_figures']['stall_ms'])}{_noise(mrc)}, "
                f"the baseline {_ms(base['fault_figures']['stall_ms'])}{_noise(base)}")
    if mrc.get("inflation") is not None and base.get("inflation") is not None:
        sentence += (f"; completion {_pct(mrc['inflation'])} against {_pct(base['inflation'])} "
                     f"(each against its fault-free run)")
    return sentence + "."


def summary_rows(results: dict[str, Any]) -> list[list[str]]:
    """One row per transport: completion and, after a fault, the exact figures (detection, stall,
    repair: metrics.fault_figures) and the completion against the fault-free run, then the
    windowed recovery (secondary: it follows the noise)."""
    rows = [["transport", "goodput", "completion", "detection", "stall", "repair", "inflation", "windowed recovery",
             "verified (SHA-256)", "retransmits (spurious)", "reorder p50/p99/max"]]
    for transport, run in results["runs"].items():
        retx = sum(t["requester"]["stats"]["retransmits"] for t in run["transfers"])
        # resends of packets that had arrived: the responder placed them twice (runner: spurious_retransmits)
        spurious = run.get("spurious_retransmits")
        fig = run.get("fault_figures") or {}
        none = "never" if fig else "-"
        rows.append([
            transport,
            "-" if run["goodput_gbps"] is None else f"{run['goodput_gbps']:.2f} Gbit/s",
            _ms(run["completion_ms"], "-"),
            _ms(fig.get("detection_ms"), none), _ms(fig.get("stall_ms"), none), _ms(fig.get("repair_ms"), none),
            _pct(run.get("inflation")),
            "never" if run.get("unrecovered") else
            ("-" if run["recovery_ms"] is None else f"{run['recovery_ms']:.1f} ms"),
            "yes" if run["verified"] else "NO",
            f"{retx:,}" + ("" if spurious is None else f" ({spurious:,})"),
            _reorder(run["transfers"][0]),
        ])
    return rows


def _band_text(results: dict[str, Any]) -> str:
    """The windowed figure's noise band on the fault-free runs, where there is one."""
    bands = []
    for transport, run in results["runs"].items():
        rec = (run["transfers"][0].get("recovery") or {}) if run["transfers"] else {}
        if band := rec.get("noise_band"):
            bands.append(f"{transport} {band['p5']:.2f}-{band['p95']:.2f}")
    if not bands:
        return ""
    return ("; without the fault the same 2 ms window swings between " + ", ".join(bands) +
            " of its level (p5-p95), so a dip inside that band is noise")


def _reorder(transfer: dict) -> str:
    """The first transfer's reorder distance at the responder (PSNs late: responder.reorder)."""
    r = transfer.get("responder", {}).get("reorder")
    return "-" if not r or r.get("p50") is None else f"{r['p50']}/{r['p99']}/{r['max']} PSNs"


def flow_rows(results: dict[str, Any]) -> list[list[str]]:
    """Per-transport flow figures of a multi-flow run (incast, all-to-all, ring): none for one WRITE."""
    rows = [["transport", "flows", "FCT p50", "FCT p99", "FCT max", "Jain", "ACK timeouts", "trim NACKs", "CNPs"]]
    for transport, run in results["runs"].items():
        f = run.get("flows")
        if not f or f["flows"] < 2:
            continue
        ms = f["fct_ms"]
        # a None is a flow that never completed (congestion.fct_percentiles): "never", as in the recovery table
        rows.append([transport, str(f["flows"]), *("never" if ms[k] is None else f"{ms[k]:.1f} ms" for k in ("p50", "p99", "max")),
                     "-" if f["jain"] is None else f"{f['jain']:.3f}", f"{f['timeouts']:,}", f"{f['trim_nacks']:,}",
                     f"{f['cnps']:,}"])
    return rows if len(rows) > 1 else []


def port_rows(results: dict[str, Any], shown: int = 8) -> list[list[str]]:
    """Per transport, the switch ports that signalled congestion (CE, trims, drops), or the busiest."""
    rows = [["transport", "port", "packets", "CE marked", "trimmed", "dropped", "queue p50", "queue p99", "queue max"]]
    for transport, run in results["runs"].items():
        entries = [(f"{node}:{ifname}", c) for node, ifaces in (run.get("ports") or {}).items() for ifname, c in ifaces.items()]
        signalled = [e for e in entries if e[1]["ce_marked"] or e[1]["trimmed"] or e[1]["dropped"]]
        picked = sorted(signalled or entries, key=lambda e: -(e[1]["ce_marked"] + e[1]["trimmed"] + e[1]["dropped"]
                                                              + e[1]["packets"] * (not signalled)))[:shown]
        for port, c in picked:
            rows.append([transport, port, f"{c['packets']:,}", f"{c['ce_marked']:,}", f"{c['trimmed']:,}", f"{c['dropped']:,}",
                         *("-" if c.get(k) is None else f"{c[k] / 1024:.1f} KiB" for k in ("queue_p50", "queue_p99", "max_queue"))])
    return rows if len(rows) > 1 else []


def controller_rows(transfer: dict) -> list[list[str]]:
    """The controller's changes to a WRITE's EVs; at each allow, the packets each EV carried since its
    deny (from the per-EV counters taken at both: 0 is what a drain promises)."""
    rows, denied_at = [], {}
    for op in transfer.get("ev_ops", []):
        sent = {int(k): v for k, v in op["sent"].items()}
        carried = [f"EV {ev}: {sent[ev] - denied_at.pop(ev)}" for ev in op["allow"] if ev in denied_at]
        denied_at.update({ev: sent[ev] for ev in op["deny"]})
        rows.append([f"{op['time_ms']}", ", ".join(map(str, op["deny"])) or "-", ", ".join(map(str, op["allow"])) or "-",
                     op["reason"], ", ".join(carried) or "-"])
    return rows


def share_lines(results: dict[str, Any], shown: int = 4) -> list[str]:
    """Per transport and fault, the share of each WRITE's packets the EVs through the fault carried
    while it held (a gray failure's degraded EV: RTT-aware spraying moves the packets off it)."""
    lines = []
    for transport, run in results["runs"].items():
        for t in run["transfers"][:shown]:
            for s in t.get("fault_shares") or ():
                before = "" if s["before"] is None else f" ({s['before']:.3f} before it)"
                evs = ", ".join(map(str, s["evs"]))
                lines.append(f"{transport} {t['src']}->{t['dst']}: while `{s['fault']}` held, EV {evs} through it carried "
                             f"{s['share']:.3f} of the packets{before}")
    return lines


def table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows)


def emulation_lines(results: dict[str, Any]) -> list[str]:
    """What each run's emulation block says: faithful, or emulator-bound and why (figures flagged)."""
    lines = []
    for transport, run in results["runs"].items():
        if run.get("clock") == "virtual":
            v = run["virtual"]
            lines.append(f"{transport}: virtual time (seed {v['seed']}): no emulator in the loop, every time is the "
                         f"model's to the nanosecond; links {v['link_rate_bps'] / 1e9:g} Gbit/s "
                         f"({v['link_rate_from']}), {v['link_delay_ns'] / 1e3:g} us each; "
                         f"{v['virtual_ns'] / 1e6:,.3f} ms simulated, {v['packet_hops']:,} packet-hops")
            continue
        if not run.get("emulation"):
            continue
        emu = Report(**run["emulation"])
        lines.append(f"{transport}: {emu.summary()}")
        if not emu.faithful:
            lines += [f"  - {reason}" for reason in emu.reasons]
            lines.append(f"  - so {transport}'s goodput and times above are the emulator's, not the fabric's")
    return lines


def pcap_line(transport: str, run: dict[str, Any], markdown: bool = True) -> str:
    """Where a transport's pcap is, what it holds, whether it lost anything and what capturing
    cost, in one line (for report.md, or for a terminal: the whole path, no markup)."""
    cap = run["capture"]
    kept = "?" if cap["packets"] is None else f"{cap['packets']:,}"
    snap = f"the first {cap['snaplen']} bytes of each" if cap["snaplen"] else "whole packets"
    path = f"`{Path(cap['path']).name}`" if markdown else cap["path"]
    if cap["run"] == "same":  # virtual time: capturing changes nothing, the measured run is the captured one
        return (f"pcap ({transport}): {path}, {kept} packets of {cap['host']}'s ports ({', '.join(cap['interfaces'])}; "
                f"{snap}, virtual timestamps), from the measured run itself")
    took = "did not complete" if cap["completion_ms"] is None else f"took {cap['completion_ms']:.0f} ms"
    measured = "" if run.get("completion_ms") is None else f" against {run['completion_ms']:.0f} ms uncaptured"
    tries = cap["attempts"]
    retried = ("" if len(tries) == 1 else
               f" (after {len(tries) - 1} lossy capture(s): " + ", ".join(f"{a['lost']:,} lost at K = {a['time_dilation']:g}"
                                                                     for a in tries[:-1]) + ")")
    again = (f"made in a separate run of the same scenario at time dilation {cap['time_dilation']:g} with a "
             f"{cap['ring_kib'] // 1024} MiB ring{retried}, which {took}{measured} "
             f"({'verified' if cap['verified'] else 'NOT verified'}); the figures above are from the run without capture")
    if cap["problem"]:
        alarm = f"**pcap ({transport}) INCOMPLETE**" if markdown else f"pcap ({transport}) INCOMPLETE"
        return f"{alarm}: {path}: {cap['problem']}; {again}"
    return (f"pcap ({transport}): {path}, {kept} packets of {cap['host']}'s ports "
            f"({', '.join(cap['interfaces'])}; {snap}), none lost, {again}")


def markdown(results: dict[str, Any]) -> str:
    scn = results["scenario"]
    rows = summary_rows(results)
    lines = [f"# {scn['name']}", "", scn.get("description", ""), "",
             f"Topology `{scn['topology']}`; faults: {', '.join(scn['faults']) or 'none'}."
             + (f" **Virtual time** (seed {results['seed']}): the transport over a model of the fabric "
                "(docs/virtual.md), not the namespace fabric." if results.get("clock") == "virtual" else ""), "",
             "| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    lines += ["| " + " | ".join(r) + " |" for r in rows[1:]]
    if (sentence := headline(results)) is not None:
        lines += ["", sentence]
    lines += ["", "Exact, from each requester's own records (docs/results.md): *detection*, from the fault to the "
              "first EV event on an EV through it (the baseline: to its first resend that got through); *stall*, the "
              "longest interval after the fault with no new byte acknowledged (the fault-free run's longest such "
              "interval, in the headline, is the emulator's own: a stall under it is scheduling); *repair*, until every packet lost on "
              "the failed path was acknowledged; *inflation*, completion against the same transport's fault-free "
              "run, made just before. *Windowed recovery* (secondary: it follows noise): until the goodput over 2 ms "
              "and 10 ms is back at 90 % of the 50 ms before the fault" + _band_text(results) + ".", ""]
    for note in results["notes"]:
        lines.append(f"- {note}")
    lines += [f"- Spray share: {line}" for line in share_lines(results)]
    for transport, run in results["runs"].items():
        if run.get("base_rtt"):
            lines.append(f"- NSCC's base RTT ({transport}): {run['base_rtt']['summary']}.")
    if flows := flow_rows(results):
        lines += ["", "## Flows", "", "| " + " | ".join(flows[0]) + " |", "|" + "---|" * len(flows[0])]
        lines += ["| " + " | ".join(r) + " |" for r in flows[1:]]
        lines += ["", "FCT: each WRITE's completion time; Jain: fairness of the flows' goodput (1 = equal shares)."]
    if prt := port_rows(results):
        lines += ["", "## Switch ports", "", "| " + " | ".join(prt[0]) + " |", "|" + "---|" * len(prt[0])]
        lines += ["| " + " | ".join(r) + " |" for r in prt[1:]]
        lines += ["", "The ports that marked, trimmed or dropped, else the busiest (counters of the fabric's port "
                  "programs over each run; queue: what arriving packets found, upper histogram edges; docs/fabric.md)."]
    if emu := emulation_lines(results):
        lines += ["", "## Emulation", "", *[line if line.startswith("  ") else f"- {line}" for line in emu]]
    for what in ("goodput", "flows", "spray_share", "recovery"):
        if what in results.get("plots", {}):
            lines += ["", f"![{what}]({results['plots'][what]})"]
    for transport, run in results["runs"].items():
        if ops := controller_rows(run["transfers"][0]):
            lines += ["", f"## Controller ({transport})", "", "| ms | denied | allowed | why | sent on them while denied |",
                      "|---|---|---|---|---|", *[f"| {' | '.join(r)} |" for r in ops]]
            if drained := run["transfers"][0].get("drained_at_fault"):
                lines += ["", f"The fault hit EV(s) {', '.join(map(str, drained))} only while they were drained: nothing "
                              "of the WRITE was on them, so it has no detection, stall or repair."]
        events = run["transfers"][0]["ev_events"]
        if events:
            lines += ["", f"## EV events ({transport})", "", "| ms | EV | from | to | reason |", "|---|---|---|---|---|"]
            lines += [f"| {e['time_ms']} | {e['ev']} | {e['old']} | {e['new']} | {e['reason']} |" for e in events[:40]]
        if run.get("capture"):
            lines += ["", pcap_line(transport, run)]
    return "\n".join(lines) + "\n"
