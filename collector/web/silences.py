"""Operators' silences over HTTP: ``/v1/silences``.

* ``POST /v1/silences`` (operator, admin): create one (see
  :func:`~gpuwarden.collector.alerts.silencing.new_silence` for the body); the creator is the
  authenticated caller. 201 with the silence, or 400 with one line saying what is wrong.
* ``GET /v1/silences`` (reader and up): the silences in force; ``?state=all`` adds the ended.
* ``DELETE /v1/silences/{id}`` (operator, admin): expire it now; 404 unknown, 409 already ended.

Creating and expiring are audited with the caller as actor. While a silence matches an open
incident the alert dispatcher holds its notifications (and, with ``actions: true``, the
remediator its actions); see :mod:`gpuwarden.collector.notify.dispatcher`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import fields, replace
from typing import Any

from aiohttp import web

from gpuwarden.collector.alerts.silencing import SilenceError, new_silence
from gpuwarden.collector.storage.base import SilenceRecord, Storage, StorageError
from gpuwarden.collector.storage.records import AuditEntry
from gpuwarden.collector.web.keys import (
    CALLER,
    OPERATORS,
    READERS,
    REMEDIATION,
    SERVICE,
    Handler,
    add_route,
)

log = logging.getLogger(__name__)
MAX_BODY_BYTES = 16 * 1024


def silence_json(silence: SilenceRecord, now: float) -> dict[str, Any]:
    """A silence as the API (and the CLI) shows it, with its state at ``now``."""
    out: dict[str, Any] = {f.name: getattr(silence, f.name) for f in fields(silence)}
    out["matchers"] = dict(silence.matchers)
    out["state"] = "active" if silence.active(now) else "expired"
    return out


def _storage(request: web.Request) -> Storage:
    app = request.app
    return app[REMEDIATION].storage if REMEDIATION in app else app[SERVICE].storage


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def _answers(handler: Handler) -> Handler:
    """The handler with an unavailable storage answered as 503."""

    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except StorageError as exc:
            log.warning("storage unavailable: %s", exc)
            return _error(503, f"storage unavailable: {exc}")

    return wrapped


def _audit(action: str, silence: SilenceRecord, actor: str, now: float) -> AuditEntry:
    return AuditEntry(
        time=now,
        actor=actor,
        action=action,
        target=f"silence:{silence.silence_id}",
        reason=silence.comment,
        verdict="allowed",
        dry_run=False,
        result="ok",
        inputs={
            "matchers": dict(silence.matchers),
            "ends_at": silence.ends_at,
            "actions": silence.actions,
        },
    )


async def create_silence(request: web.Request) -> web.Response:
    """``POST /v1/silences``."""
    if (request.content_length or 0) > MAX_BODY_BYTES:
        return _error(413, f"a silence is at most {MAX_BODY_BYTES} bytes")
    try:
        body = json.loads(await request.read() or b"null")
    except (ValueError, UnicodeDecodeError):
        return _error(400, "expected a JSON object")
    actor = request[CALLER].name
    now = time.time()
    try:
        silence = new_silence(body, creator=actor, now=now)
    except SilenceError as exc:
        return _error(400, str(exc))
    storage = _storage(request)

    def store() -> SilenceRecord:
        silence_id = storage.add_silence(silence)
        stored = replace(silence, silence_id=silence_id)
        storage.append_audit(_audit("silence", stored, actor, now))
        return stored

    stored = await asyncio.to_thread(store)
    log.info("silence %s created by %s: %s", stored.silence_id, actor, dict(stored.matchers))
    return web.json_response(silence_json(stored, now), status=201)


async def list_silences(request: web.Request) -> web.Response:
    """``GET /v1/silences[?state=all]``."""
    state = request.query.get("state", "active")
    if state not in ("active", "all"):
        return _error(400, "state: expected active or all")
    now = time.time()
    ending_after = None if state == "all" else now
    rows = await asyncio.to_thread(_storage(request).silences, ending_after=ending_after)
    return web.json_response({"silences": [silence_json(s, now) for s in rows]})


async def expire_silence(request: web.Request) -> web.Response:
    """``DELETE /v1/silences/{id}``: end it now."""
    text = request.match_info["id"]
    if not (text.isascii() and text.isdigit()) or len(text) > 18:
        return _error(400, "id: expected a positive integer")
    silence_id, actor, now = int(text), request[CALLER].name, time.time()
    storage = _storage(request)

    def expire() -> web.Response:
        found = storage.silence(silence_id)
        if found is None:
            return _error(404, f"no silence {silence_id}")
        if not storage.expire_silence(silence_id, now=now, actor=actor):
            return _error(409, f"silence {silence_id} has already ended")
        ended = storage.silence(silence_id) or found
        storage.append_audit(_audit("silence-expire", ended, actor, now))
        return web.json_response(silence_json(ended, now))

    response = await asyncio.to_thread(expire)
    if response.status == 200:
        log.info("silence %s expired by %s", silence_id, actor)
    return response


def setup_silences(app: web.Application) -> None:
    """Add the silence routes (the app has a service)."""
    add_route(app, "POST", "/v1/silences", _answers(create_silence), OPERATORS)
    add_route(app, "GET", "/v1/silences", _answers(list_silences), READERS)
    add_route(app, "DELETE", "/v1/silences/{id}", _answers(expire_silence), OPERATORS)
