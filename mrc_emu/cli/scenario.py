"""`mrc-emu run` and `mrc-emu demo`: a scenario from fabric up to report, with progress bars.

Why it exists: both commands run a whole scenario (experiments.scenarios.runner) and print the same
summary; their help lists the fault kinds and transports a scenario file may name, taken
from the one list of each (read only when the help is shown: the CLI starts fast).
"""

from __future__ import annotations

import sys
import time
from typing import Any

import click

from .common import JSON_OPTION, emit, fail, friendly, progress, warn


class _ScenarioCommand(click.Command):
    """A command whose help ends with the fault kinds and transports of scenario files."""

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        from ..experiments.scenarios.faults import FAULT_KINDS
        from ..experiments.scenarios.scenario import SCENARIO_DIR
        from ..experiments.scenarios.transports import Transport

        formatter.write_paragraph()
        formatter.write_text(f"Shipped scenarios: {', '.join(sorted(p.stem for p in SCENARIO_DIR.glob('*.yaml')))}. "
                             f"Fault kinds: {', '.join(FAULT_KINDS)}. "
                             f"Transports: {', '.join(t.value for t in Transport)}.")
        super().format_epilog(ctx, formatter)


def _run_scenario(spec: str, out: str | None, pcap: bool, as_json: bool, clock: str | None = None,
                  seed: int | None = None, view_port: int | None = None) -> dict:
    import os
    from pathlib import Path

    from ..experiments.analysis import report
    from ..experiments.scenarios import runner, scenario, virtual_run
    from ..fabric.nodes import check_prerequisites

    scn = scenario.load(spec)
    if clock is not None:
        scn.clock = clock
    virtual = scn.clock == "virtual"
    if seed is not None and not virtual:
        raise click.UsageError("--seed is for virtual time (--clock virtual, or clock: virtual in the scenario)")
    if pcap:
        scn.capture = True
    if virtual:
        virtual_run.check(scn)  # what has no model is refused before anything runs
    else:
        check_prerequisites()
    out_dir = Path(out or f"results/{scn.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    show = not as_json
    bars: dict[str, Any] = {}

    def bar_for(transport: str):
        if not (show and sys.stderr.isatty()):
            return None
        done = [0]

        def update(acked: int, total: int) -> None:
            if transport not in bars:
                bars[transport] = click.progressbar(length=total, label=f"  {transport:<8}", file=sys.stderr)
                bars[transport].__enter__()
            bars[transport].update(acked - done[0])
            done[0] = acked
            if acked >= total:
                bars.pop(transport).__exit__(None, None, None)

        return update

    server = None
    if view_port is not None:  # the page follows whatever fabric this process owns (the scenario's), read-only
        if virtual:
            raise click.UsageError("--view follows a running fabric: a virtual-time run has none (use "
                                   "`mrc-emu view --results DIR` on its results afterwards)")
        from ..view.live import LiveSource
        from ..view.server import View
        from .view import serve

        server = serve(View(LiveSource(owner_pid=os.getpid()), read_only=True), "127.0.0.1", view_port)
        click.echo(f"  .. view: {server.url} (read-only, while the scenario runs)", err=True)
    try:
        if virtual:
            results = virtual_run.run(scn, out_dir, seed or 0, progress if show else runner._quiet, bar_for)
        else:
            results = runner.run(scn, out_dir, progress if show else runner._quiet, bar_for)
    finally:
        if server is not None:
            server.stop()
            server.view.source.close()
    for bar in bars.values():
        bar.__exit__(None, None, None)
    files = report.write(results, out_dir)
    results["files"] = files
    return results


def _scenario_text(results: dict) -> str:
    from ..experiments.analysis import report

    clock = f" [virtual time, seed {results['seed']}]" if results.get("clock") == "virtual" else ""
    lines = [f"scenario {results['scenario']['name']}{clock}: {', '.join(results['scenario']['faults']) or 'no faults'}", "",
             report.table(report.summary_rows(results))]
    if (sentence := report.headline(results)) is not None:
        lines += ["", sentence]
    for note in results["notes"]:
        lines.append(f"note: {note}")
    lines += [f"spray share: {line}" for line in report.share_lines(results)]
    lines += [f"emulation: {line}" if not line.startswith("  ") else line for line in report.emulation_lines(results)]
    files = results["files"]
    lines += ["", f"results: {files['results']}", f"report:  {files['report']}",
              "plots:   " + ", ".join(v for k, v in files.items() if k not in ("results", "report"))]
    lines += [report.pcap_line(transport, run, markdown=False)
              for transport, run in results["runs"].items() if run.get("capture")]
    return "\n".join(lines)


def _finish(results: dict, as_json: bool) -> None:
    """Exit 1, saying why on stderr, if a transfer failed or was not verified (after everything is
    written); a pcap that lost packets is a warning on stderr (the report says it too)."""
    emit(results, as_json, _scenario_text(results))
    for transport, run in results["runs"].items():
        if (cap := run.get("capture")) and cap.get("problem"):
            warn(f"{transport}'s pcap is incomplete ({cap['path']}): {cap['problem']}")
    bad = [f"{transport} {t['src']}->{t['dst']}: {t.get('error') or 'placed bytes differ from the source'}"
           for transport, run in results["runs"].items() for t in run["transfers"] if not t.get("verified")]
    if bad or not all(run["verified"] for run in results["runs"].values()):
        fail(f"not verified: {'; '.join(bad) or 'a transport did not verify its transfers'} "
             f"(results: {results['files']['results']})")


CLOCK_OPTION = click.option(
    "--clock", type=click.Choice(["emulated", "virtual"]), default=None,
    help="emulated: the namespace fabric (root); virtual: a model of it in virtual time, no root, deterministic "
         "per --seed (default: the scenario's `clock:`, else emulated).")
SEED_OPTION = click.option("--seed", type=int, default=None,
                           help="Virtual time: the seed of every random choice (default 0); the same seed gives the "
                                "same results.json, byte for byte.")


@click.command(name="run", cls=_ScenarioCommand)
@click.argument("scenario_file", metavar="SCENARIO")
@click.option("--out", "-o", default=None, help="Output folder (default: results/<name>-<time>).")
@click.option("--pcap", is_flag=True, help="Also make a pcap per transport (the source host's ports, whole packets) "
                                            "in a separate run of the same scenario, slower if the capture must keep up; "
                                            "a pcap that lost packets is a warning. In virtual time: of the measured "
                                            "run itself, with virtual timestamps.")
@click.option("--view", "with_view", is_flag=True, help="Serve the live web view of the scenario's fabric while it "
                                                         "runs (read-only; `mrc-emu view` has the details).")
@click.option("--view-port", type=click.IntRange(0, 65535), default=8765, show_default=True,
              help="The view's port on 127.0.0.1 (0: any free one; the URL is printed).")
@CLOCK_OPTION
@SEED_OPTION
@JSON_OPTION
@friendly
def run_(scenario_file: str, out: str | None, pcap: bool, with_view: bool, view_port: int, clock: str | None,
         seed: int | None, as_json: bool) -> None:
    """Run a scenario (a YAML file or the name of a shipped one, listed below).

    Builds its own fabric, runs each transport with the fault schedule, tears down, and writes
    results.json, plots (PNG) and report.md to --out. With --clock virtual no fabric is built:
    the same WRITEs cross a model of the topology in virtual time (the baseline's BGP/BFD repair
    a model from FRR's timers), and this machine's time goes to wall.json beside results.json.
    Exit 1 if a transfer failed or is not verified (the reason on stderr). Afterwards,
    `mrc-emu view --results DIR` replays it.
    """
    _finish(_run_scenario(scenario_file, out, pcap, as_json, clock, seed, view_port if with_view else None), as_json)


@click.command(cls=_ScenarioCommand)
@click.option("--out", "-o", default="mrc-emu-demo", show_default=True, help="Output folder.")
@CLOCK_OPTION
@SEED_OPTION
@JSON_OPTION
@friendly
def demo(out: str, clock: str | None, seed: int | None, as_json: bool) -> None:
    """The headline: a 128 MiB WRITE while a leaf-spine link fails, with MRC and with the baseline.

    On the built-in default topology: the link under the baseline's flow (measured) is
    blackholed at 30 %. Prints goodput, completion, recovery and the SHA-256 check of both,
    and where the plots and pcaps are. About a minute on a 2-core VM; with --clock virtual, half
    a minute and no root, the same figures from the same seed.
    """
    _finish(_run_scenario("demo", out, True, as_json, clock, seed), as_json)


COMMANDS = [run_, demo]
