"""`mrc-emu view`: the live web view of a running fabric, or the replay of a finished run.

Why it exists: it turns the options into a view.server.Server on 127.0.0.1 (by default), says
where the page is, and serves until Ctrl-C or SIGTERM; everything it shows and does lives in
mrc_emu/view (docs/view.md).
"""

from __future__ import annotations

import signal
import threading

import click

from .common import NAME_OPTION, friendly

HOST_OPTION = click.option("--host", default="127.0.0.1", show_default=True,
                           help="Address to listen on (loopback only by default: the page can fail links).")


def serve(view, host: str, port: int):
    """Start the view's server; an address in use or not ours is one clear error."""
    from ..view.server import Server

    try:
        return Server(view, host, port).start()
    except OSError as exc:  # a ValueError: one line, exit 1, as every known error
        raise ValueError(f"cannot listen on {host}:{port} ({exc.strerror or exc}): give another --port (0: any free "
                         f"one)") from None


@click.command()
@click.option("--results", "results", default=None, metavar="DIR",
              help="Replay a finished run from DIR/results.json (what `mrc-emu run --out DIR` wrote) instead.")
@click.option("--port", "-p", type=click.IntRange(0, 65535), default=8765, show_default=True,
              help="TCP port (0: any free one; the URL is printed).")
@HOST_OPTION
@click.option("--read-only", is_flag=True, help="Show only: the page offers no link or spine actions.")
@click.option("--interval", type=click.FloatRange(0.02, 10.0), default=0.1, show_default=True,
              help="Seconds between state updates on /api/events.")
@NAME_OPTION
@friendly
def view(results: str | None, port: int, host: str, read_only: bool, interval: float, name: str) -> None:
    """Serve a web page of a running fabric (`mrc-emu up`): the topology per plane with each link's
    state and faults, switch port queues, CE marks and trims, every transfer's EVs (state, share),
    goodput and EV events, updated live; click a link to down/up/blackhole/degrade it or a spine to
    drain it (as `link`, `fault` and `ev deny` do: `fault list` shows it). With --results, a
    finished run replayed from its results.json. The same state is JSON at /api/state and
    server-sent events at /api/events (docs/view.md)."""
    from ..view.live import LiveSource
    from ..view.replay import ReplaySource
    from ..view.server import View

    ctx = click.get_current_context()
    if results is not None and ctx.get_parameter_source("name") is not click.core.ParameterSource.DEFAULT:
        raise click.UsageError("--results replays a finished run: it takes no --name")
    source = ReplaySource(results) if results is not None else LiveSource(name)
    server = serve(View(source, read_only, interval), host, port)
    what = f"results {source.file}" if results is not None else f"fabric {name!r}"
    click.echo(f"serving {what} on {server.url} (Ctrl-C stops)", nl=True)
    stopping = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    try:
        while not stopping.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        server.stop()
        if results is None:
            source.close()
    click.echo("view stopped", err=True)


COMMANDS = [view]
