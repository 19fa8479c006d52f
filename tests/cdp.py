"""A small Chrome DevTools Protocol client for tests: real headless Chromium driven over its
debugging websocket with aiohttp (already a dependency), so a test can type, click and read a
page as a person would, with the browser's own cookies, ``Origin`` headers and redirects."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--remote-debugging-port=0",
    "--remote-debugging-address=127.0.0.1",
)
STEP_TIMEOUT_SECONDS = 60.0  # a hang guard for one browser step, not a timed assertion


class CdpError(RuntimeError):
    """The browser answered a command with an error."""


class Page:
    """One tab: send commands, wait for events (read from the one websocket, in order)."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = ws
        self._next_id = 0
        self._events: deque[dict[str, Any]] = deque()

    async def _receive(self) -> dict[str, Any]:
        message = await asyncio.wait_for(self._ws.receive(), STEP_TIMEOUT_SECONDS)
        if message.type is not aiohttp.WSMsgType.TEXT:
            raise CdpError(f"the browser closed the connection: {message.type}")
        data: dict[str, Any] = json.loads(message.data)
        return data

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one command; its result (events that arrive meanwhile are kept in order)."""
        self._next_id += 1
        await self._ws.send_json({"id": self._next_id, "method": method, "params": params})
        while True:
            data = await self._receive()
            if data.get("id") == self._next_id:
                if "error" in data:
                    raise CdpError(f"{method}: {data['error']}")
                result: dict[str, Any] = data.get("result", {})
                return result
            if "method" in data:
                self._events.append(data)

    async def wait_event(self, method: str) -> dict[str, Any]:
        """The next event named ``method`` (earlier events of other names are dropped)."""
        while self._events:
            event = self._events.popleft()
            if event["method"] == method:
                return event
        while True:
            data = await self._receive()
            if data.get("method") == method:
                return data

    async def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page."""
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise CdpError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def navigate(self, url: str) -> None:
        """Open ``url`` and wait until the page (after any redirects) has loaded."""
        self._events.clear()
        await self.call("Page.navigate", url=url)
        await self.wait_event("Page.loadEventFired")

    async def type_into(self, element_id: str, text: str) -> None:
        """Focus a field and type ``text`` as keyboard input."""
        await self.evaluate(f"document.getElementById({json.dumps(element_id)}).focus()")
        await self.call("Input.insertText", text=text)

    async def click(self, element_id: str) -> None:
        """Click an element with the mouse and wait for the page it leads to."""
        box = await self.evaluate(
            f"(() => {{ const r = document.getElementById({json.dumps(element_id)})"
            ".getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )
        x, y = box
        self._events.clear()
        for kind in ("mousePressed", "mouseReleased"):
            await self.call(
                "Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1
            )
        await self.wait_event("Page.loadEventFired")

    async def location(self) -> str:
        return str(await self.evaluate("location.href"))

    async def text(self) -> str:
        return str(await self.evaluate("document.body.innerText"))

    async def cookies(self, url: str) -> list[dict[str, Any]]:
        result = await self.call("Network.getCookies", urls=[url])
        cookies: list[dict[str, Any]] = result["cookies"]
        return cookies


def _debugging_port(profile: Path, process: subprocess.Popen[bytes]) -> int:
    """The port Chromium chose, from the ``DevToolsActivePort`` file it writes at start."""
    marker = profile / "DevToolsActivePort"
    deadline = time.monotonic() + STEP_TIMEOUT_SECONDS
    while True:  # an external process's start-up file, polled until a deadline
        if process.poll() is not None:
            raise CdpError(f"chromium exited with {process.returncode}")
        if marker.is_file():
            lines = marker.read_text().splitlines()
            if lines and lines[0].isdigit():
                return int(lines[0])
        if time.monotonic() > deadline:
            raise CdpError("chromium did not open its debugging port")
        time.sleep(0.05)


@asynccontextmanager
async def browser_page(profile: Path) -> AsyncIterator[Page]:
    """Start headless Chromium with a fresh profile and yield one tab with Page events on."""
    if CHROMIUM is None:
        raise CdpError("chromium is not installed")
    process = subprocess.Popen(
        [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        port = await asyncio.to_thread(_debugging_port, profile, process)
        async with aiohttp.ClientSession() as http:
            async with http.put(f"http://127.0.0.1:{port}/json/new?about:blank") as response:
                target = await response.json(content_type=None)
            async with http.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                page = Page(ws)
                await page.call("Page.enable")
                yield page
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
