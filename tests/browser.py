"""Headless Chromium driven over its DevTools protocol, for the view's page tests.

Debian's /usr/bin/chromium (apt, scripts/install.sh), started with a fresh profile and nothing
that reaches outside (no sync, no component updates, no background networking, no QUIC); the
protocol's websocket is aiohttp's client (the view's own dependency), so nothing is downloaded.
`evaluate` runs JavaScript in the page, `wait_until` waits on a page condition with a deadline,
`screenshot` writes a PNG. The browser is ended by its own process handle.
"""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import aiohttp

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def missing() -> str | None:
    """Why the page tests cannot run here, or None."""
    if not shutil.which(CHROMIUM):
        return f"no {CHROMIUM} (apt-get install chromium; scripts/install.sh does)"
    return None


class Chromium:
    def __init__(self, profile: Path, width: int = 1400, height: int = 1000) -> None:
        profile.mkdir(parents=True, exist_ok=True)
        (profile / "DevToolsActivePort").unlink(missing_ok=True)  # a profile used before: its port is gone
        self.process = subprocess.Popen([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--remote-debugging-port=0",
                                         f"--window-size={width},{height}", "about:blank"],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.loop = asyncio.new_event_loop()
        self.ids = iter(range(1, 1 << 30))
        try:
            port_file = profile / "DevToolsActivePort"
            deadline = time.monotonic() + 60
            while not (port_file.exists() and port_file.read_text().strip()):
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise RuntimeError("chromium did not open its DevTools port within 60 s")
                time.sleep(0.05)
            port = int(port_file.read_text().split()[0])
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as answer:
                page = next(t for t in json.load(answer) if t["type"] == "page")
            self.session = self.loop.run_until_complete(self._connect(page["webSocketDebuggerUrl"]))
        except BaseException:
            self.close()
            raise

    async def _connect(self, url: str):
        self.http = aiohttp.ClientSession()
        return await self.http.ws_connect(url, max_msg_size=64 << 20)

    async def _call(self, method: str, params: dict) -> dict:
        call_id = next(self.ids)
        await self.session.send_json({"id": call_id, "method": method, "params": params})
        while True:
            message = await self.session.receive_json(timeout=60)
            if message.get("id") == call_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]

    def call(self, method: str, **params) -> dict:
        return self.loop.run_until_complete(self._call(method, params))

    def navigate(self, url: str) -> None:
        self.call("Page.enable")
        self.call("Page.navigate", url=url)

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression!r} threw: {result['exceptionDetails'].get('exception', {}).get('description')}")
        return result["result"].get("value")

    def wait_until(self, expression: str, timeout: float = 30.0, what: str = ""):
        """The expression's value once truthy; fails naming `what` after `timeout` s."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"the page never showed {what or expression} within {timeout:g} s")
            self.loop.run_until_complete(asyncio.sleep(0.05))

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        if getattr(self, "session", None) is not None:
            self.loop.run_until_complete(self.session.close())
        if getattr(self, "http", None) is not None:
            self.loop.run_until_complete(self.http.close())
        self.loop.close()
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
