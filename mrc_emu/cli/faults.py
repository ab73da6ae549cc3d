"""`mrc-emu fault ...`: faults on a running fabric that stay until cleared, listed and cleared.

Why it exists: the scenarios' faults (degrade, delay, blackhole, loss, one way or both) are
also what a user wants to try by hand on a fabric left up: `fault degrade p0l0 p0s1 --rate
0.25`, then `probe`, `send`, `stats`, then `fault list` and `fault clear`. Each command opens
the fabric once and hands it to fabric/faults/fault_ops.py, which records every fault before it acts
(fabric/faults/fault_record.py), so `list` shows every fault in force, whoever made it.
"""

from __future__ import annotations

import time

import click

from .common import JSON_OPTION, NAME_OPTION, emit, friendly


def _open(name: str):
    from ..fabric.running import Fabric

    return Fabric.open(name)


def _direction(a: str, b: str, text: str | None, one_way: bool) -> tuple[str, str] | None:
    from ..experiments.scenarios.faults import parse_direction

    if one_way:
        if text is not None:
            raise click.UsageError("give --direction or --one-way, not both")
        return a, b
    if text is None:
        return None
    try:
        return parse_direction(text, (a, b))
    except ValueError as exc:
        hint = " (quote it: unquoted, the shell reads '>' as a redirection)" if text.endswith("-") else ""
        raise click.BadParameter(f"{exc}{hint}", param_hint="--direction") from None


def _direction_options(command):
    command = click.option("--one-way", is_flag=True, help="Only what A sends to B, in the order given.")(command)
    return click.option("--direction", default=None, metavar="'A->B'",
                        help="Only what A sends to B (quoted: '>' is the shell's); default: both directions.")(command)


def _applied(entry, as_json: bool, text: str) -> None:
    emit(entry.to_dict(), as_json, f"{text} (fault {entry.id}; `mrc-emu fault clear` undoes it)")


@click.group()
def fault() -> None:
    """Faults on a running fabric: degrade, delay, blackhole, loss; list and clear them."""


@fault.command()
@click.argument("a")
@click.argument("b")
@click.option("--rate", type=float, required=True, help="The fraction of the link's rate left, in (0, 1): 0.25.")
@_direction_options
@NAME_OPTION
@JSON_OPTION
@friendly
def degrade(a: str, b: str, rate: float, direction: str | None, one_way: bool, name: str, as_json: bool) -> None:
    """Run the link between A and B at a fraction of its rate (a gray failure). Needs a topology
    with a link_rate: an unshaped link has no rate to take a fraction of."""
    from ..fabric.faults import fault_ops

    way = _direction(a, b, direction, one_way)  # a usage error before the fabric is opened
    with _open(name) as fabric:
        entry = fault_ops.degrade(fabric, a, b, rate, way)
    _applied(entry, as_json, f"{entry.target} degraded to {rate:.0%} ({entry.params['rate_bps'] / 1e6:g} Mbit/s)")


@fault.command()
@click.argument("a")
@click.argument("b")
@click.option("--ms", type=float, required=True, help="Milliseconds added to every packet, each way.")
@_direction_options
@NAME_OPTION
@JSON_OPTION
@friendly
def delay(a: str, b: str, ms: float, direction: str | None, one_way: bool, name: str, as_json: bool) -> None:
    """Delay every packet over the link between A and B (netem: needs the kernel's sch_netem)."""
    from ..fabric.faults import fault_ops

    way = _direction(a, b, direction, one_way)  # a usage error before the fabric is opened
    with _open(name) as fabric:
        entry = fault_ops.delay(fabric, a, b, ms, way)
    _applied(entry, as_json, f"{entry.target} delayed by {ms:g} ms")


@fault.command()
@click.argument("a")
@click.argument("b")
@_direction_options
@NAME_OPTION
@JSON_OPTION
@friendly
def blackhole(a: str, b: str, direction: str | None, one_way: bool, name: str, as_json: bool) -> None:
    """Drop everything over the link between A and B; the link stays up."""
    from ..fabric.faults import fault_ops

    way = _direction(a, b, direction, one_way)  # a usage error before the fabric is opened
    with _open(name) as fabric:
        entry = fault_ops.drop(fabric, a, b, 100.0, way)
    _applied(entry, as_json, f"{entry.target} blackholed")


@fault.command()
@click.argument("a")
@click.argument("b")
@click.option("--percent", type=float, required=True, help="Percent of the packets dropped, in (0, 100).")
@click.option("--by", "mechanism", type=click.Choice(["nft", "netem"]), default="nft", show_default=True,
              help="nft rules on the receiving ends' ingress, or netem's loss on the sending ends' egress "
                   "(needs the kernel's sch_netem).")
@_direction_options
@NAME_OPTION
@JSON_OPTION
@friendly
def loss(a: str, b: str, percent: float, mechanism: str, direction: str | None, one_way: bool, name: str,
         as_json: bool) -> None:
    """Drop a share of the packets over the link between A and B at random."""
    from ..fabric.faults import fault_ops

    way = _direction(a, b, direction, one_way)  # a usage error before the fabric is opened
    with _open(name) as fabric:
        entry = fault_ops.drop(fabric, a, b, percent, way, mechanism=mechanism)
    _applied(entry, as_json, f"{entry.target} drops {percent:g} % (by {mechanism})")


@fault.command(name="list")
@NAME_OPTION
@JSON_OPTION
@friendly
def list_(name: str, as_json: bool) -> None:
    """Every fault in force: kind, target, parameters, since when, by whom."""
    from ..fabric.faults.fault_record import FaultRecord

    with _open(name) as fabric:
        entries = FaultRecord(fabric).active()
    rows = []
    for e in entries:
        alive = "" if e.owner_alive() or e.by == "cli" else " (gone)"
        rows.append(f"  {e.id}  {e.kind:<13} {e.target:<16} {e.params_text() or '-':<28} "
                    f"since {time.strftime('%H:%M:%S', time.localtime(e.since))}  by {e.by}, pid {e.pid}{alive}")
    text = (f"{len(entries)} fault(s) in force on fabric {name!r}:\n" + "\n".join(rows)) if entries \
        else f"no fault in force on fabric {name!r}"
    emit([dict(e.to_dict(), owner_alive=e.owner_alive()) for e in entries], as_json, text)


@fault.command()
@click.argument("what", nargs=-1)
@NAME_OPTION
@JSON_OPTION
@friendly
def clear(what: tuple[str, ...], name: str, as_json: bool) -> None:
    """Undo faults: `clear all` (or no argument) every one, `clear A B` those on the link between A and B."""
    from ..fabric.faults import fault_ops

    if what not in ((), ("all",)) and len(what) != 2:
        raise click.UsageError("give `all` or the two nodes of a link: mrc-emu fault clear p0l0 p0s1")
    with _open(name) as fabric:
        cleared = fault_ops.clear(fabric, *(what if len(what) == 2 else ()))
    emit([e.to_dict() for e in cleared], as_json,
         f"cleared {len(cleared)} fault(s)" + "".join(f"\n  {e.id}  {e.describe()}" for e in cleared))


COMMANDS = [fault]
