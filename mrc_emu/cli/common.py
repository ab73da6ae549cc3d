"""What every mrc-emu command shares: the --name and --json options, one-line errors, output.

Why it exists: the commands live in one module per group (fabric, transfers, scenarios,
the planner); each turns arguments into calls and results into text or JSON the same way,
and every known error into one clear line and exit code 1.
"""

from __future__ import annotations

import functools
import json
import sys
from typing import Any

import click

from ..topology import TopologyError, units

NAME_OPTION = click.option("--name", "-n", default="mrc", show_default=True, help="Fabric name (namespaces are <name>-<node>).")
JSON_OPTION = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")


def _known_errors() -> tuple[type[BaseException], ...]:
    from ..experiments.runtime.spec import TransferError
    from ..fabric.kernel.netlink import NetlinkError
    from ..fabric.kernel.waiting import WaitTimeout
    from ..fabric.nodes import FabricSetupError
    from ..fabric.procs import ChildError
    from ..fabric.registry import RegistryError

    return (TopologyError, FabricSetupError, RegistryError, NetlinkError, TransferError, ChildError, WaitTimeout,
            ValueError, PermissionError)


def friendly(func):
    """Print known errors as one line, exit 1; Ctrl-C exits 130 after cleanup ran."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)
        except _known_errors() as exc:
            click.echo(f"mrc-emu: error: {exc}", err=True)
            sys.exit(1)

    return wrapper


def fail(reason: str) -> None:
    """Exit 1 with the reason on stderr in one line (after the output was written): every non-zero
    exit says why, on the terminal, even when stdout went to a file or to --json's reader."""
    click.echo(f"mrc-emu: {' '.join(reason.split())}", err=True)
    sys.exit(1)


def warn(message: str) -> None:
    """A problem that does not fail the command, on stderr in one line."""
    click.echo(f"mrc-emu: warning: {' '.join(message.split())}", err=True)


def emit(data: Any, as_json: bool, text: str) -> None:
    click.echo(json.dumps(data, indent=2) if as_json else text)


def progress(message: str) -> None:
    click.echo(f"  .. {message}", err=True)


def parse_size(text: str) -> int:
    """'64MiB', '1.5GB', '4096', '100k' -> bytes (topology.units.parse_size, as a usage error)."""
    try:
        return units.parse_size(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


class Size(click.ParamType):
    name = "size"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        try:
            return parse_size(value)
        except click.BadParameter as exc:
            self.fail(exc.message, param, ctx)
