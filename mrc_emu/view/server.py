"""The view's HTTP side: the page, its static files, and the JSON / server-sent-events endpoint.

Why it exists: the page is one consumer of the state; scripts are others. So the state is a
documented JSON endpoint (docs/view.md): /api/topology (what does not change), /api/state (one
state now, or in a replay at ?run=&t=), /api/events (server-sent events: a `state` event every
interval, or a replay played at ?speed=), and /api/action (POST, the page's clicks; refused
with 403 under --read-only, 400 with the reason for bad input). aiohttp serves them on one
event loop; sampling the fabric blocks (netlink, BPF maps), so it runs on the loop's executor,
one sample shared by every client (live.Sampler).

It binds only the address it is given (127.0.0.1 by default) and serves only the package's own
files.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from .actions import Action, ActionError, apply
from .live import LiveSource, Sampler
from .replay import ReplayError, ReplaySource

STATIC = Path(__file__).parent / "static"
DEFAULT_INTERVAL_S = 0.1  # 10 states a second: the issue asks for at least 5
REPLAY_SECONDS = 20.0  # a replay streamed without ?speed= plays the whole run in this many seconds


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(data, separators=(",", ":")), status=status, content_type="application/json")


class View:
    """The application: one source (live or replay), the sampler, whether actions are allowed."""

    def __init__(self, source: LiveSource | ReplaySource, read_only: bool = False,
                 interval_s: float = DEFAULT_INTERVAL_S) -> None:
        if interval_s <= 0:
            raise ValueError(f"the update interval must be above 0 s, not {interval_s:g}")
        self.source = source
        self.read_only = read_only or isinstance(source, ReplaySource)
        self.interval_s = interval_s
        self.sampler = Sampler(source) if isinstance(source, LiveSource) else None
        self.action_lock = threading.Lock()  # one action at a time: each checks the records, then acts

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/", self.index)
        app.router.add_get("/api/topology", self.topology)
        app.router.add_get("/api/state", self.state)
        app.router.add_get("/api/events", self.events)
        app.router.add_post("/api/action", self.action)
        app.router.add_static("/static/", STATIC, follow_symlinks=False)
        return app

    async def index(self, _: web.Request) -> web.FileResponse:
        return web.FileResponse(STATIC / "index.html")

    async def topology(self, _: web.Request) -> web.Response:
        data = await asyncio.get_running_loop().run_in_executor(None, self.source.topology)
        return _json({**data, "read_only": self.read_only, "interval_s": self.interval_s})

    async def _live_state(self) -> dict[str, Any]:
        return await asyncio.get_running_loop().run_in_executor(None, self.sampler.get, self.interval_s / 2)

    def _replay_args(self, request: web.Request) -> tuple[str, float]:
        run = request.query.get("run") or self.source.run_names()[0]
        try:
            t_ms = float(request.query.get("t", self.source.duration_ms(run)))
        except ValueError:
            raise ReplayError(f"t={request.query.get('t')!r}: give the time in ms since the run started") from None
        return run, t_ms

    async def state(self, request: web.Request) -> web.Response:
        if self.sampler is not None:
            try:
                return _json(await self._live_state())
            except Exception as exc:  # as on the stream: said, and the next request tries again
                return _json({"error": f"sampling the fabric failed: {exc}"}, 503)
        try:
            run, t_ms = self._replay_args(request)
            return _json(self.source.state(run, t_ms))
        except ReplayError as exc:
            return _json({"error": str(exc)}, 400)

    async def events(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        try:
            if self.sampler is not None:
                await self._stream_live(response)
            else:
                await self._stream_replay(request, response)
        except (ConnectionResetError, asyncio.CancelledError):
            pass  # the client went away
        return response

    @staticmethod
    async def _send(response: web.StreamResponse, event: str, data: Any) -> None:
        await response.write(f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode())

    async def _stream_live(self, response: web.StreamResponse) -> None:
        while True:
            started = time.monotonic()
            try:
                state = await self._live_state()
            except Exception as exc:  # a sample that failed (a fabric changing under it): said, and the next one tried
                await self._send(response, "problem", {"error": f"sampling the fabric failed: {exc}"})
            else:
                await self._send(response, "state", state)
            await asyncio.sleep(max(0.0, self.interval_s - (time.monotonic() - started)))

    async def _stream_replay(self, request: web.Request, response: web.StreamResponse) -> None:
        try:
            run, _ = self._replay_args(request)
            duration = self.source.duration_ms(run)
            t_ms = float(request.query.get("from", 0.0))
            speed = float(request.query.get("speed", duration / REPLAY_SECONDS))  # emulated ms per wall second
        except (ReplayError, ValueError) as exc:
            await self._send(response, "error", {"error": str(exc)})
            return
        while True:
            await self._send(response, "state", self.source.state(run, min(t_ms, duration)))
            if t_ms >= duration:
                await self._send(response, "end", {"run": run, "t_ms": duration})
                return
            await asyncio.sleep(self.interval_s)
            t_ms += speed * self.interval_s

    async def action(self, request: web.Request) -> web.Response:
        if self.read_only:
            why = "a replay changes nothing" if self.sampler is None else "this view was started with --read-only"
            return _json({"ok": False, "error": f"actions are off: {why}"}, 403)
        try:
            action = Action.from_request(await request.json())
        except ValueError as exc:  # not JSON, or not an action
            return _json({"ok": False, "error": str(exc) if isinstance(exc, ActionError) else "the body is not JSON"}, 400)
        fabric = self.source.current()
        if fabric is None:
            return _json({"ok": False, "error": "no fabric is up right now"}, 409)

        def carry_out() -> str:
            with self.action_lock:
                return apply(fabric, action)

        try:
            message = await asyncio.get_running_loop().run_in_executor(None, carry_out)
        except ActionError as exc:
            return _json({"ok": False, "error": str(exc)}, 400)
        return _json({"ok": True, "message": message})


class Server:
    """The view served on (host, port) by an event loop on a thread of its own: `start` returns
    once it listens (port 0: the kernel picks one, `url` says which), `stop` ends it."""

    def __init__(self, view: View, host: str = "127.0.0.1", port: int = 8765) -> None:
        self.view, self.host, self.port = view, host, port
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="mrc-emu view", daemon=True)
        self.runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/"

    def start(self) -> Server:
        self.thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(timeout=30)
        except BaseException:  # the address in use, say: nothing left running
            self.stop()
            raise
        return self

    async def _start(self) -> None:
        self.runner = web.AppRunner(self.view.app(), handle_signals=False, access_log=None, shutdown_timeout=1.0)
        await self.runner.setup()
        site = web.TCPSite(self.runner, self.host, self.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # the port the kernel gave for port 0

    def stop(self) -> None:
        if self.runner is not None:
            asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(timeout=30)
            self.runner = None
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)
        self.loop.close()
