"""HTTP routes of remediation: runbook pages, approval links, and the incidents/actions API.

* ``GET /runbooks/{rule}`` and ``GET /incidents/{id}/runbook``: rendered runbooks (HTML, or
  Markdown with ``?format=md``) at stable URLs. They are pages for people (``keys.add_page``):
  a session from ``/login``, a trusted proxy's identity or a bearer token; a browser without one
  is sent to ``/login`` and comes back after signing in.
* ``GET /approve/{token}`` shows a confirmation page and never changes anything (chat apps
  prefetch links); ``POST /approve/{token}`` approves, once. Both need a signed-in person; the
  POST also needs the page's CSRF token and a same-origin ``Origin`` (``web.session``), and an
  operator or admin. The approver recorded (audit actor, link ``used_by``) is that person, never
  a form field; ``anonymous`` under ``allow_unauthenticated``.
* ``/v1/incidents``, ``/v1/actions``, ``/v1/actions/{id}/approve|reject``, ``/v1/breaker`` and
  ``/v1/breaker/reset`` need the collector's bearer token; the token's name is the actor.

Storage and actuator calls block, so handlers run them in worker threads.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import sqlite3
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, fields
from typing import Any

from aiohttp import web
from jinja2.sandbox import SandboxedEnvironment

from gpuwarden.collector.alerts.redact import redact
from gpuwarden.collector.alerts.runbooks import RunbookError, runbook_context
from gpuwarden.collector.ingest.alertmanager import AlertReceiver, PayloadError, parse_payload
from gpuwarden.collector.remediate.approvals import ApprovalError, Approvals, TokenProblem
from gpuwarden.collector.remediate.states import ActionStateError
from gpuwarden.collector.storage.base import ActionRecord, StorageError
from gpuwarden.collector.storage.clusters import ALL_CLUSTERS, check_scope
from gpuwarden.collector.storage.records import Incident, IncidentState
from gpuwarden.collector.web.keys import (
    ALERT_RECEIVER,
    ALERT_SOURCES,
    AUTH_STATS,
    CALLER,
    OPERATORS,
    READERS,
    REMEDIATION,
    Admits,
    Caller,
    Handler,
    add_page,
    add_route,
)
from gpuwarden.collector.web.remediation_setup import Remediation
from gpuwarden.collector.web.scope import per_cluster, scope_of
from gpuwarden.collector.web.session import (
    CSRF_FIELD,
    DECIDING_ROLES,
    csrf_problem,
    page_csrf_token,
)

log = logging.getLogger(__name__)

MAX_LIST = 1000
_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
# same-origin, not no-referrer: under no-referrer a browser sends the form's POST with
# ``Origin: null``, which the cross-origin check must refuse; the link's token still never
# leaves for another site in a Referer.
_NO_STORE = {"Cache-Control": "no-store", "Referrer-Policy": "same-origin"}
_TOKEN_STATUS = {
    TokenProblem.MALFORMED: 400,
    TokenProblem.BAD_SIGNATURE: 403,
    TokenProblem.UNKNOWN: 404,
    TokenProblem.EXPIRED: 410,
    TokenProblem.USED: 410,
}


_PAGE = SandboxedEnvironment(autoescape=True).from_string(
    """<!doctype html><html lang="en"><head><meta charset="utf-8">
<meta name="referrer" content="same-origin"><title>{{ title }}</title>
<link rel="stylesheet" href="/static/gpuwarden.css"></head><body class="doc narrow">
<h1>{{ title }}</h1>{% for line in lines %}<p>{{ line }}</p>{% endfor %}
{% if csrf %}<form method="post">
<input type="hidden" name="{{ csrf_field }}" value="{{ csrf }}">
<button id="approve" type="submit">Approve</button></form>{% endif %}
</body></html>"""
)


def _page(title: str, lines: list[str], *, status: int = 200, csrf: str = "") -> web.Response:
    """An approval page; with ``csrf``, the Approve form carrying that token."""
    body = _PAGE.render(title=title, lines=lines, csrf=csrf, csrf_field=CSRF_FIELD)
    return web.Response(text=body, content_type="text/html", status=status, headers=_NO_STORE)


def _signed_in(caller: Caller) -> str:
    """Who is looking, and whether they may approve."""
    who = f"Signed in as {caller.name} ({caller.role.value})."
    if caller.role in DECIDING_ROLES:
        return f"{who} Approving records you as the approver."
    return f"{who} Only an operator or admin may approve."


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def _record(record: Any) -> dict[str, Any]:
    return {f.name: _jsonable(getattr(record, f.name)) for f in fields(record)}


def incident_json(incident: Incident) -> dict[str, Any]:
    """An incident as the API shows it."""
    return _record(incident)


def action_json(action: ActionRecord) -> dict[str, Any]:
    """An action as the API shows it (parameters redacted like the audit)."""
    out = _record(action)
    out["params"] = _jsonable(redact(action.params))
    return out


def _storage_answers(handler: Callable[[web.Request], Awaitable[web.Response]]) -> Handler:
    """The API handler with an unavailable storage answered as 503."""

    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except StorageError as exc:
            log.warning("storage unavailable: %s", exc)
            return _error(503, f"storage unavailable: {exc}")

    return wrapped


def _int(request: web.Request, name: str) -> int:
    text = request.match_info.get(name) or request.query.get(name) or ""
    if not (text.isascii() and text.isdigit()) or len(text) > 18:
        raise web.HTTPBadRequest(text=f"{name}: expected a positive integer\n")
    return int(text)


# Runbooks ---------------------------------------------------------------------------------------


def _rendered(
    r: Remediation, request: web.Request, name: str, context: Mapping[str, Any], title: str
) -> web.Response:
    try:
        if request.query.get("format") == "md":
            text = r.renderer.markdown(name, context)
            return web.Response(text=text, content_type="text/markdown")
        return web.Response(
            text=r.renderer.html(name, context, title=title), content_type="text/html"
        )
    except RunbookError as exc:
        log.error("runbook cannot be rendered: %s", exc)
        return web.Response(status=500, text=f"runbook error: {exc}\n")


async def rule_runbook(request: web.Request) -> web.Response:
    """``GET /runbooks/{rule}``: a rule's runbook with placeholder facts (or a runbook file of
    that name, e.g. for the Prometheus alerts' ``runbook_url``)."""
    r = request.app[REMEDIATION]
    name = request.match_info["rule"]
    rule = r.rules.get(name)
    if rule is not None:
        file = rule.runbook
    elif _NAME.fullmatch(name) and (r.renderer.runbooks_dir / f"{name}.md").is_file():
        file = f"{name}.md"
    else:
        raise web.HTTPNotFound(text=f"no rule or runbook named {name!r}\n")
    context = runbook_context(rule, r.links)
    return await asyncio.to_thread(_rendered, r, request, file, context, f"runbook: {name}")


async def incident_runbook(request: web.Request) -> web.Response:
    """``GET /incidents/{id}/runbook``: the rule's runbook with this incident's facts."""
    r = request.app[REMEDIATION]
    incident_id = _int(request, "id")

    def render() -> web.Response:
        incident = r.storage.incident(incident_id)
        if incident is None:
            raise web.HTTPNotFound(text=f"no incident {incident_id}\n")
        rule = r.rules.get(incident.rule_id)
        if rule is None:
            raise web.HTTPNotFound(text=f"incident {incident_id}: rule {incident.rule_id} gone\n")
        job_key, model = incident.evidence.get("job"), incident.evidence.get("model")
        context = runbook_context(
            rule,
            r.links,
            incident=incident,
            job=r.storage.job(str(job_key)) if job_key else None,
            model=r.storage.model(str(model)) if model else None,
            actions=r.storage.actions(incident_id=incident_id),
        )
        title = f"incident {incident_id}: {rule.id}"
        return _rendered(r, request, rule.runbook, context, title)

    return await asyncio.to_thread(render)


# Approval links ---------------------------------------------------------------------------------


def _approvals(r: Remediation) -> Approvals:
    if r.approvals is None:
        raise web.HTTPNotFound(text="approval links are not configured\n")
    return r.approvals


async def approve_page(request: web.Request) -> web.Response:
    """``GET /approve/{token}``: what would be approved. Never changes state."""
    r = request.app[REMEDIATION]
    approvals = _approvals(r)
    token = request.match_info["token"]
    caller = request[CALLER]
    csrf = page_csrf_token(request, caller)

    def look() -> web.Response:
        try:
            claim = approvals.peek(token)
        except ApprovalError as exc:
            return _page("Approval link not valid", [str(exc)], status=_TOKEN_STATUS[exc.reason])
        action = r.storage.action(claim.action_id)
        if action is None:
            return _page("Approval link not valid", ["unknown action"], status=404)
        lines = [
            f"Action {action.action_id}: {action.action} on {action.target}",
            f"Incident {action.incident_id}, rule {action.params.get('rule_id', '?')}; "
            f"state {action.state}; {'dry run' if r.remediator.config.dry_run else 'real'}",
            "Approving runs it through the policy (cooldown, breaker, dry-run still apply).",
            _signed_in(caller),
        ]
        return _page("Approve this action?", lines, csrf=csrf)

    return await asyncio.to_thread(look)


async def approve_post(request: web.Request) -> web.Response:
    """``POST /approve/{token}``: approve, once, as the signed-in person.

    Refused with 403 and nothing approved: a cross-origin request, a missing or wrong CSRF
    token, a person who is not an operator or admin.
    """
    r = request.app[REMEDIATION]
    approvals = _approvals(r)
    token = request.match_info["token"]
    caller = request[CALLER]
    form = await request.post()
    presented = form.get(CSRF_FIELD)
    problem = csrf_problem(request, caller, presented if isinstance(presented, str) else None)
    # the handler's own refusals, told apart from the middleware's ("role", "missing", ...)
    reason = "page-csrf" if problem is not None else "page-role"
    if problem is None and caller.role not in DECIDING_ROLES:
        problem = f"{caller.name} is a {caller.role.value}: only an operator or admin may approve"
    if problem is not None:
        log.warning("approval refused for %s from %s: %s", caller, request.remote, problem)
        request.app[AUTH_STATS].count(request, 403, reason)  # as the middleware's refusals
        return _page("Not approved", [problem], status=403)
    approver = caller.name

    def approve() -> web.Response:
        try:
            claim = approvals.redeem(token, used_by=approver)
        except ApprovalError as exc:
            return _page("Not approved", [str(exc)], status=_TOKEN_STATUS[exc.reason])
        try:
            action = r.remediator.approve(claim.action_id, actor=approver)
        except ActionStateError as exc:
            return _page("Not approved", [str(exc)], status=409)
        lines = [f"Action {action.action_id} ({action.action} {action.target}): {action.state}"]
        return _page("Approved", lines)

    return await asyncio.to_thread(approve)


# API ------------------------------------------------------------------------------------------


@_storage_answers
async def list_incidents(request: web.Request) -> web.Response:
    """``GET /v1/incidents?state=open|resolved[&cluster=NAME|*]``: this collector's cluster's
    incidents, another cluster's, or every cluster's on the database (``*``), each naming its
    cluster."""
    r = request.app[REMEDIATION]
    state = request.query.get("state")
    if state is not None and state not in tuple(IncidentState):
        return _error(400, "state: expected open or resolved")
    try:
        scope = check_scope(request.query.get("cluster", r.storage.cluster))
    except ValueError as exc:
        return _error(400, f"cluster: {exc}")
    value = IncidentState(state) if state else None

    def read() -> list[dict[str, object]]:
        every = scope == ALL_CLUSTERS
        names = sorted(r.storage.incident_counts(state=value)) if every else [scope]
        found = [
            (incident, name)
            for name in names
            for incident in r.storage.incidents(state=value, cluster=name)[-MAX_LIST:]
        ]
        found.sort(key=lambda pair: pair[0].incident_id or 0)  # ids rise across clusters
        return [{**incident_json(i), "cluster": name} for i, name in found[-MAX_LIST:]]

    return web.json_response({"incidents": await asyncio.to_thread(read)})


@_storage_answers
async def show_incident(request: web.Request) -> web.Response:
    """``GET /v1/incidents/{id}``: the incident and its actions."""
    r = request.app[REMEDIATION]
    incident_id = _int(request, "id")
    incident = await asyncio.to_thread(r.storage.incident, incident_id)
    if incident is None:
        return _error(404, f"no incident {incident_id}")
    actions = await asyncio.to_thread(r.storage.actions, incident_id=incident_id)
    out = incident_json(incident)
    out["actions"] = [action_json(a) for a in actions]
    out["runbook_url"] = r.links.incident_runbook_url(incident_id)
    return web.json_response(out)


@_storage_answers
async def list_actions(request: web.Request) -> web.Response:
    """``GET /v1/actions?state=...&incident=...&limit=...[&cluster=NAME|*]`` (newest first): of
    this collector's cluster, another one's, or every cluster's (``*``), each naming its
    cluster."""
    r = request.app[REMEDIATION]
    states = request.query.getall("state", []) or None
    incident = _int(request, "incident") if "incident" in request.query else None
    limit = min(_int(request, "limit"), MAX_LIST) if "limit" in request.query else MAX_LIST
    try:
        scope = scope_of(request.query.get("cluster"), r.storage)
    except ValueError as exc:
        return _error(400, f"cluster: {exc}")

    def read() -> list[tuple[str, ActionRecord]]:
        found = per_cluster(
            r.storage,
            scope,
            lambda name: r.storage.actions(
                states=states, incident_id=incident, limit=limit, cluster=name
            ),
        )
        # action ids rise across clusters (one table)
        found.sort(key=lambda pair: pair[1].action_id or 0, reverse=True)
        return found[:limit]

    rows = await asyncio.to_thread(read)
    return web.json_response({"actions": [{**action_json(a), "cluster": c} for c, a in rows]})


@_storage_answers
async def show_action(request: web.Request) -> web.Response:
    """``GET /v1/actions/{id}``."""
    r = request.app[REMEDIATION]
    action_id = _int(request, "id")
    row = await asyncio.to_thread(r.storage.action, action_id)
    if row is None:
        return _error(404, f"no action {action_id}")
    return web.json_response(action_json(row))


@_storage_answers
async def decide_action(request: web.Request) -> web.Response:
    """``POST /v1/actions/{id}/approve`` and ``.../reject``; the token's name is the actor."""
    r = request.app[REMEDIATION]
    action_id = _int(request, "id")
    verb = request.match_info["verb"]
    actor = request[CALLER].name
    call = r.remediator.approve if verb == "approve" else r.remediator.reject
    try:
        row = await asyncio.to_thread(call, action_id, actor=actor)
    except ActionStateError as exc:
        status = 404 if str(exc).startswith("no action") else 409
        return _error(status, str(exc))
    return web.json_response(action_json(row))


@_storage_answers
async def show_breaker(request: web.Request) -> web.Response:
    """``GET /v1/breaker``."""
    r = request.app[REMEDIATION]
    record = await asyncio.to_thread(r.storage.breaker, "global")
    if record is None:
        return web.json_response({"scope": "global", "state": "closed"})
    return web.json_response(_record(record))


@_storage_answers
async def reset_breaker(request: web.Request) -> web.Response:
    """``POST /v1/breaker/reset``: close the breaker; 409 when it was not open."""
    r = request.app[REMEDIATION]
    done = await asyncio.to_thread(r.remediator.reset_breaker, actor=request[CALLER].name)
    if not done:
        return _error(409, "the breaker is not open")
    return web.json_response({"scope": "global", "state": "closed"})


MAX_WEBHOOK_BYTES = 1024 * 1024


@_storage_answers
async def alertmanager_webhook(request: web.Request) -> web.Response:
    """``POST /v1/alertmanager``: Alertmanager's webhook. 4xx for a payload that will never
    be accepted (Alertmanager does not retry those), 503 when storage is busy (it retries)."""
    receiver = request.app[ALERT_RECEIVER]
    if request.content_length is not None and request.content_length > MAX_WEBHOOK_BYTES:
        return _error(413, f"payload over {MAX_WEBHOOK_BYTES} bytes")
    raw = await request.read()  # buffered by web.guard.body_guard, up to max_body_bytes
    if len(raw) > MAX_WEBHOOK_BYTES:
        return _error(413, f"payload over {MAX_WEBHOOK_BYTES} bytes")
    try:
        alerts = parse_payload(json.loads(raw))
    except (ValueError, UnicodeDecodeError) as exc:  # PayloadError is a ValueError
        reason = str(exc) if isinstance(exc, PayloadError) else "not JSON"
        log.warning("alertmanager webhook from %s refused: %s", request[CALLER], reason)
        return _error(400, f"bad Alertmanager payload: {reason}")
    try:
        result = await asyncio.to_thread(receiver.receive, alerts, now=time.time())
    except (sqlite3.Error, StorageError, OSError) as exc:  # StorageError: PostgreSQL's
        log.warning("alertmanager webhook: storage unavailable: %s", exc)
        return _error(503, "storage unavailable, retry")
    return web.json_response(asdict(result))


def setup_remediation(app: web.Application) -> None:
    """Add the runbook and approval pages (readers; operators approve) and the API (readers
    read, operators decide) and Alertmanager webhook (alert sources) routes for
    ``app[REMEDIATION]``."""
    remediation = app[REMEDIATION]
    app[ALERT_RECEIVER] = AlertReceiver(remediation.storage, remediation.rules.values())
    routes: list[tuple[str, str, Handler, Admits]] = [
        ("GET", "/v1/incidents", list_incidents, READERS),
        ("GET", "/v1/incidents/{id}", show_incident, READERS),
        ("GET", "/v1/actions", list_actions, READERS),
        ("GET", "/v1/actions/{id}", show_action, READERS),
        ("POST", "/v1/actions/{id}/{verb:approve|reject}", decide_action, OPERATORS),
        ("GET", "/v1/breaker", show_breaker, READERS),
        ("POST", "/v1/breaker/reset", reset_breaker, OPERATORS),
        ("POST", "/v1/alertmanager", alertmanager_webhook, ALERT_SOURCES),
    ]
    for method, path, handler, access in routes:
        add_route(app, method, path, handler, access)
    # Pages for people (a session, a trusted proxy's identity or a token); the approval POST
    # checks its CSRF token, its Origin and the person's role itself.
    pages: list[tuple[str, str, Handler]] = [
        ("GET", "/runbooks/{rule}", rule_runbook),
        ("GET", "/incidents/{id}/runbook", incident_runbook),
        ("GET", "/approve/{token}", approve_page),  # the signed link names the action
        ("POST", "/approve/{token}", approve_post),
    ]
    for method, path, handler in pages:
        add_page(app, method, path, handler, READERS)  # a reader sees the page, not the button
