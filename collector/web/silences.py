"""Operators' silences over HTTP: ``/v1/silences``.

* ``POST /v1/silences`` (operator, admin): create one (see
  :func:`~gpuwarden.collector.alerts.silencing.new_silence` for the body); the creator is the
  authenticated caller. 201 with the silence, or 400 with one line saying what is wrong.
* ``GET /v1/silences`` (reader and up): the silences in force; ``?state=all`` adds the ended.
* ``DELETE /v1/silences/{id}`` (operator, admin): expire it now; 404 unknown, 409 already ended.

* ``POST /status/incidents/{id}/silence`` (a page; operator, admin): the incident page's
  "Silence 4h" button, checked like an approval (same-origin ``Origin`` and the page's CSRF
  token, ``web.session``): silences the incident's rule on its job and node for four hours,
  then goes back to the page.

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

from gpuwarden.collector.alerts.silencing import SilenceError, incident_facts, new_silence
from gpuwarden.collector.storage.base import SilenceRecord, Storage, StorageError
from gpuwarden.collector.storage.records import AuditEntry
from gpuwarden.collector.web.keys import (
    CALLER,
    OPERATORS,
    READERS,
    REMEDIATION,
    SERVICE,
    Handler,
    add_page,
    add_route,
)
from gpuwarden.collector.web.session import CSRF_FIELD, csrf_problem

log = logging.getLogger(__name__)
MAX_BODY_BYTES = 16 * 1024
PAGE_SILENCE = "4h"
"""How long the incident page's button silences."""


def silence_json(silence: SilenceRecord, now: float) -> dict[str, Any]:
    """A silence as the API (and the CLI) shows it, with its state at ``now``."""
    out: dict[str, Any] = {f.name: getattr(silence, f.name) for f in fields(silence)}
    out["matchers"] = dict(silence.matchers)
    out["state"] = "active" if silence.active(now) else "expired"
    return out


def _storage(request: web.Request) -> Storage:
    """The service's storage (the status page's incidents; the dispatcher's in the collector)."""
    app = request.app
    return app[SERVICE].storage if SERVICE in app else app[REMEDIATION].storage


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
    stored = await asyncio.to_thread(_store, _storage(request), silence, actor, now)
    return web.json_response(silence_json(stored, now), status=201)


def _store(storage: Storage, silence: SilenceRecord, actor: str, now: float) -> SilenceRecord:
    """Store a new silence and its audit entry; the stored silence."""
    stored = replace(silence, silence_id=storage.add_silence(silence))
    storage.append_audit(_audit("silence", stored, actor, now))
    log.info("silence %s created by %s: %s", stored.silence_id, actor, dict(stored.matchers))
    return stored


async def silence_from_page(request: web.Request) -> web.Response:
    """``POST /status/incidents/{id}/silence``: the incident page's "Silence 4h" button."""
    caller = request[CALLER]
    form = await request.post()
    presented = form.get(CSRF_FIELD)
    problem = csrf_problem(request, caller, presented if isinstance(presented, str) else None)
    if problem is not None:
        log.warning("silence from the page refused for %s: %s", caller, problem)
        return web.Response(status=403, text=f"not silenced: {problem}\n")
    text = request.match_info["id"]
    if not (text.isascii() and text.isdigit()) or len(text) > 18:
        return web.Response(status=400, text="incident ids are integers\n")
    incident_id, now, storage = int(text), time.time(), _storage(request)

    def silence() -> SilenceRecord | None:
        incident = storage.incident(incident_id)
        if incident is None:
            return None
        facts = incident_facts(incident, None)
        matchers = {"rule": incident.rule_id}
        matchers.update({key: facts[key][0] for key in ("job", "node") if facts[key]})
        body = {
            "matchers": matchers,
            "duration": PAGE_SILENCE,
            "comment": f"silenced from the page of incident {incident_id}",
        }
        made = new_silence(body, creator=caller.name, now=now)
        return _store(storage, made, caller.name, now)

    if await asyncio.to_thread(silence) is None:
        return web.Response(status=404, text=f"no incident {incident_id}\n")
    raise web.HTTPSeeOther(f"/status/incidents/{incident_id}")


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
    add_page(app, "POST", "/status/incidents/{id}/silence", silence_from_page, OPERATORS)
