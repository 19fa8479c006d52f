"""Local stand-ins for Slack incoming webhooks and PagerDuty Events v2, on 127.0.0.1.

They check requests the way the services do (required fields, enums, lengths) and answer
with the services' status codes; ``script`` makes them answer 429 (with ``Retry-After``) or
500 a few times first. Every request is kept for the tests to inspect.
"""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.collector_server import free_port


class ServedApp:
    """An aiohttp app served from its own event-loop thread."""

    def __init__(self, app: web.Application) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._loop = asyncio.new_event_loop()
        self._runner = web.AppRunner(app, access_log=None)
        ready = threading.Event()

        def main() -> None:
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(self._runner.setup())
            site = web.TCPSite(self._runner, "127.0.0.1", self.port)
            self._loop.run_until_complete(site.start())
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=main, daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("capture server did not start")

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


@dataclass
class Capture:
    """What a capture server received, and what it will answer next."""

    requests: list[dict[str, Any]] = field(default_factory=list)
    script: list[int] = field(default_factory=list)  # statuses to answer first (429, 500)
    attempts: int = 0
    retry_after: str = "1"  # the Retry-After of a scripted 429


def _scripted(capture: Capture) -> web.Response | None:
    capture.attempts += 1
    if not capture.script:
        return None
    status = capture.script.pop(0)
    headers = {"Retry-After": capture.retry_after} if status == 429 else None
    return web.Response(status=status, text="rate_limited" if status == 429 else "error",
                        headers=headers)  # fmt: skip


def slack_problems(body: Any) -> list[str]:
    """Why Slack would answer ``invalid_payload`` / ``invalid_blocks`` (empty: fine)."""
    if not isinstance(body, dict) or not (body.get("text") or body.get("blocks")):
        return ["no text or blocks"]
    problems = []
    blocks = body.get("blocks", [])
    if len(blocks) > 50:
        problems.append("more than 50 blocks")
    for block in blocks:
        kind = block.get("type")
        if kind == "header" and len(block["text"]["text"]) > 150:
            problems.append("header over 150 chars")
        if kind == "section":
            if len(block.get("text", {}).get("text", "")) > 3000:
                problems.append("section over 3000 chars")
            fields = block.get("fields", [])
            if len(fields) > 10 or any(len(f["text"]) > 2000 for f in fields):
                problems.append("too many or too long fields")
        if kind == "actions":
            for element in block["elements"]:
                if len(element["text"]["text"]) > 75 or len(element.get("url", "")) > 3000:
                    problems.append("button text or url too long")
                if not str(element.get("url", "")).startswith(("http://", "https://")):
                    problems.append("button url not http(s)")
    return problems


def slack_app(capture: Capture) -> web.Application:
    async def hook(request: web.Request) -> web.Response:
        scripted = _scripted(capture)
        if scripted is not None:
            return scripted
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return web.Response(status=400, text="invalid_payload")
        problems = slack_problems(body)
        capture.requests.append({"path": request.path, "body": body, "problems": problems})
        if problems:
            return web.Response(status=400, text="invalid_blocks")
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/services/{rest:.*}", hook)
    return app


_ACTIONS = {"trigger", "acknowledge", "resolve"}
_SEVERITIES = {"critical", "error", "warning", "info"}


def pagerduty_problems(body: Any) -> list[str]:
    """Why Events v2 would answer 400 (empty: fine)."""
    if not isinstance(body, dict):
        return ["not an object"]
    problems = []
    if len(str(body.get("routing_key", ""))) != 32:
        problems.append("routing_key must be 32 characters")
    action = body.get("event_action")
    if action not in _ACTIONS:
        problems.append("bad event_action")
    if len(str(body.get("dedup_key", ""))) > 255:
        problems.append("dedup_key over 255")
    if action in ("acknowledge", "resolve") and not body.get("dedup_key"):
        problems.append("dedup_key required")
    if action == "trigger":
        payload = body.get("payload") or {}
        if not payload.get("summary") or len(payload["summary"]) > 1024:
            problems.append("payload.summary missing or over 1024")
        if not payload.get("source"):
            problems.append("payload.source missing")
        if payload.get("severity") not in _SEVERITIES:
            problems.append("payload.severity invalid")
        links = body.get("links", [])
        if any(not str(x.get("href", "")).startswith(("http://", "https://")) for x in links):
            problems.append("link href not http(s)")
    return problems


def change_problems(body: Any) -> list[str]:
    """Why a change event would be refused (empty: fine)."""
    if not isinstance(body, dict):
        return ["not an object"]
    payload = body.get("payload") or {}
    problems = [] if len(str(body.get("routing_key", ""))) == 32 else ["routing_key"]
    if not payload.get("summary") or not payload.get("source"):
        problems.append("payload.summary and payload.source are required")
    return problems


def pagerduty_app(capture: Capture) -> web.Application:
    async def enqueue(request: web.Request) -> web.Response:
        scripted = _scripted(capture)
        if scripted is not None:
            return scripted
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return web.json_response({"status": "invalid event", "message": "bad json"}, status=400)
        problems = (
            change_problems(body)
            if request.path.startswith("/v2/change")
            else pagerduty_problems(body)
        )
        capture.requests.append({"path": request.path, "body": body, "problems": problems})
        if problems:
            return web.json_response(
                {"status": "invalid event", "message": "Event object is invalid",
                 "errors": problems}, status=400)  # fmt: skip
        return web.json_response(
            {"status": "success", "message": "Event processed",
             "dedup_key": body.get("dedup_key", "generated")}, status=202)  # fmt: skip

    app = web.Application()
    app.router.add_post("/v2/enqueue", enqueue)
    app.router.add_post("/v2/change/enqueue", enqueue)
    return app


def webhook_app(capture: Capture) -> web.Application:
    """A plain webhook receiver (Alertmanager's ``webhook_configs``): keeps headers and body."""

    async def hook(request: web.Request) -> web.Response:
        scripted = _scripted(capture)
        if scripted is not None:
            return scripted
        body = await request.json()
        capture.requests.append(
            {"path": request.path, "body": body, "headers": dict(request.headers)}
        )
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/{rest:.*}", hook)
    return app
