"""The mrc-emu command line: thin wrappers over the fabric, the transfers and the scenarios.

Why it exists: users drive everything from here. It holds no logic a test cannot call
directly; it turns arguments into calls, results into text or JSON, and every known
error into one clear line and exit code 1. One module per group of commands: fabric.py
(the verbs of a running fabric), faults.py (`fault ...`: faults that stay until cleared),
transfer.py (`send`), scenario.py (`run`, `demo`), plan.py (the capacity planner),
ev.py (`ev expand`: the EVs of an OCP EV profile), view.py (`view`: the web page, mrc_emu/view);
common.py holds what they share.

What it must never do: hold logic a test cannot call without the command line (a command turns
arguments into calls of the layers below, and what they return into text), or be imported by them.
"""

from __future__ import annotations

import click

from . import ev, fabric, faults, plan, scenario, transfer, view
from .common import parse_size

__all__ = ["main", "parse_size"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="mrc-emu")
def main() -> None:
    """mrc-emu: MRC (Multipath Reliable Connection) on a multi-plane SRv6 fabric in namespaces.

    Typical session: `up`, `status`, `paths h0 h2`, `probe h0 h2 --all`, `link down p0l0 p0s1`,
    `fault blackhole p0l0 p0s1 --direction p0l0->p0s1`, `fault list`, `fault clear`,
    `capture p0s0 -o spine.pcap`, `down`. Needs root for everything that touches the fabric.
    """


for _group in (fabric, faults, transfer, scenario, plan, ev, view):
    for _command in _group.COMMANDS:
        main.add_command(_command)
