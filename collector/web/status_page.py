"""The status page: fleet overview, open incidents with their evidence plotted, waste, actions.

Server-rendered: Jinja2 templates in a sandboxed environment that escapes every value (job
names, teams, node names, labels, summaries come from telemetry, jobs and alerts), and SVG charts
built by ``status_svg`` (the only markup marked safe: it escapes every text it places). No
JavaScript; styles come from the served stylesheet, and the security headers (CSP, no-store)
from :mod:`~.headers`. ``GET /status`` and ``GET /status/incidents/{id}`` are read-only pages
for people (``keys.add_page``): a signed-in session, a trusted proxy's identity or a bearer
token; a browser without one is sent to ``/login`` (open to all under
``allow_unauthenticated``). They show GPUs, jobs, teams, costs.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from aiohttp import web
from jinja2 import PackageLoader
from jinja2.sandbox import SandboxedEnvironment
from markupsafe import Markup

from gpuwarden.collector.budgets.spend import DailySpend
from gpuwarden.collector.budgets.status import budget_statuses
from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.storage.base import ActionRecord
from gpuwarden.collector.storage.records import Incident, IncidentState
from gpuwarden.collector.web.gpus import gpu_statuses
from gpuwarden.collector.web.keys import (
    CALLER,
    DAILY_SPEND,
    LEADERSHIP,
    READERS,
    RULE_BOARD,
    SERVICE,
    STATUS_TEMPLATES,
    add_page,
)
from gpuwarden.collector.web.session import CSRF_FIELD, DECIDING_ROLES, page_csrf_token
from gpuwarden.collector.web.status_budgets import budgets_context
from gpuwarden.collector.web.status_charts import fleet_chart, incident_chart
from gpuwarden.collector.web.status_clusters import clusters_context
from gpuwarden.collector.web.status_nodes import node_freshness
from gpuwarden.collector.web.status_prices import prices_context
from gpuwarden.collector.web.status_svg import Series

REFRESH_SECONDS = 15
CHART_WINDOW_SECONDS = 3600.0
MAX_ACTIONS = 50
MAX_AUDIT = 30
MAX_WASTE_ROWS = 15
PALETTE = ("#2f6fb0", "#c2410c", "#15803d", "#7e22ce", "#b91c1c", "#0e7490", "#a16207")
_HIDDEN_FACTS = frozenset({"points", "summary", "subject"})
RANGE_READS = frozenset({"hw.gpu.utilization"})
"""What the page reads over a time range (the fleet chart): kept in the store's recent ring."""


def environment() -> SandboxedEnvironment:
    """The templates' sandboxed environment; it escapes every value, whatever the template's
    name (not only ``*.html``), so a template added under another name cannot forget it."""
    return SandboxedEnvironment(
        loader=PackageLoader("gpuwarden.collector.web", "templates"),
        autoescape=True,
    )


def _when(unix_seconds: float | None) -> str:
    if unix_seconds is None:
        return "—"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(unix_seconds))


def _is_time(key: str, value: Any) -> bool:
    """A fact that is a point in time (``deploy_time``, ``breach_at``): shown as a date."""
    return (
        (key.endswith(("_time", "_at")) or key == "time")
        and isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
    )


def _fact(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return "—" if value is None else str(value).lower()
    if isinstance(value, float):
        if not math.isfinite(value):
            return "—"
        return f"{value:,.4g}" if abs(value) < 1e6 else f"{value:,.0f}"
    if isinstance(value, list | tuple):
        return ", ".join(_fact(v) for v in value[:20])
    return str(value)


@dataclass(frozen=True, slots=True)
class IncidentView:
    """An incident as the page shows it."""

    id: int
    rule: str
    severity: str
    state: str
    summary: str
    since: str
    last_seen: str
    facts: tuple[tuple[str, str], ...]
    chart: Markup


def incident_view(incident: Incident) -> IncidentView:
    """Facts and the chart of the points the incident's latest finding carried."""
    evidence = incident.evidence
    raw = evidence.get("points") or []
    points = [
        (float(p[0]), float(p[1]))
        for p in raw
        if isinstance(p, list | tuple) and len(p) == 2
        if isinstance(p[0], int | float) and isinstance(p[1], int | float)
    ]
    subject = str(evidence.get("subject", incident.fingerprint))
    chart = incident_chart(incident.rule_id, subject, evidence, points)
    facts = tuple(
        (key, _when(value) if _is_time(key, value) else _fact(value))
        for key, value in evidence.items()
        if key not in _HIDDEN_FACTS
    )
    return IncidentView(
        id=incident.incident_id or 0,
        rule=incident.rule_id,
        severity=incident.severity,
        state=str(incident.state),
        summary=str(evidence.get("summary", "")),
        since=_when(incident.first_seen),
        last_seen=_when(incident.last_seen),
        facts=facts,
        chart=Markup(chart),  # noqa: S704 - built by status_svg, which escapes every text
    )


def _action_rows(actions: Sequence[ActionRecord]) -> list[dict[str, object]]:
    return [
        {
            "id": a.action_id,
            "kind": a.action,
            "target": a.target,
            "mode": a.mode,
            "state": a.state,
            "dry_run": "yes" if a.dry_run else "no",
            "incident": a.incident_id,
            "updated": _when(a.updated_at),
        }
        for a in actions
    ]


def _fleet(service: CollectorService, now: float) -> dict[str, object]:
    gpus = gpu_statuses(service, now)
    nodes: dict[str, list[Any]] = {}
    for gpu in gpus:
        nodes.setdefault(gpu.node, []).append(gpu)
    util = [g.readings["utilization_ratio"] for g in gpus if "utilization_ratio" in g.readings]
    power = sum(g.readings.get("power_watts", 0.0) for g in gpus)
    idle = sum(1 for g in gpus if g.job_key and g.readings.get("utilization_ratio", 1.0) < 0.05)
    not_ok = sum(1 for g in gpus if g.state in ("degraded", "failed"))
    rows = []
    series = []
    matrix = service.store.matrix("hw.gpu.utilization", start=now - CHART_WINDOW_SECONDS, end=now)
    for i, (name, members) in enumerate(sorted(nodes.items())):
        node_util = [
            m.readings["utilization_ratio"] for m in members if "utilization_ratio" in m.readings
        ]
        rows.append(
            {
                "name": name,
                "gpus": len(members),
                "utilization": f"{sum(node_util) / len(node_util):.0%}" if node_util else "—",
                "power": f"{sum(m.readings.get('power_watts', 0.0) for m in members):,.0f} W",
                "not_ok": sum(1 for m in members if m.state in ("degraded", "failed")),
                "jobs": ", ".join(sorted({m.job_key for m in members if m.job_key})) or "—",
            }
        )
        mine = [
            k
            for k, info in enumerate(matrix.series)
            if info.attributes.get("host.name") == name
            and info.attributes.get("hw.gpu.task", "general") == "general"
        ]
        if mine and matrix.values.size:
            with np.errstate(all="ignore"):
                block = matrix.values[mine]
                counts = (~np.isnan(block)).sum(axis=0)
                means = np.where(
                    counts > 0, np.nansum(block, axis=0) / np.maximum(counts, 1), np.nan
                )
            series.append(
                Series(
                    name,
                    list(zip(matrix.times.tolist(), means.tolist(), strict=True)),
                    PALETTE[i % len(PALETTE)],
                )
            )
    chart = fleet_chart(series)
    return {
        **node_freshness(service, now, gpus, rows),  # silent nodes: marked, their GPUs not counted
        "utilization": f"{sum(util) / len(util):.0%}" if util else "—",
        "idle_allocated": idle,
        "not_ok": not_ok,
        "power": f"{power / 1000:,.1f} kW",
        "nodes": rows,
        "chart": Markup(chart),  # noqa: S704 - built by status_svg, which escapes every text
    }


def _waste(service: CollectorService, now: float) -> list[dict[str, str]]:
    totals = service.storage.rollups(since=now - 86400, until=now, by=("job_key", "team"))
    rows = []
    for total in totals:
        if total.group.get("job_key") is None or total.gpu_seconds_idle <= 0:
            continue
        share = (
            total.gpu_seconds_idle / total.gpu_seconds_allocated
            if total.gpu_seconds_allocated > 0
            else 0.0
        )
        idle_cost = total.cost * share if total.cost is not None else None
        rows.append((idle_cost or 0.0, total.gpu_seconds_idle, total, idle_cost))
    rows.sort(key=lambda r: (-r[0], -r[1]))
    return [
        {
            "job": str(total.group["job_key"]),
            "team": str(total.group.get("team") or "—"),
            "idle_hours": f"{total.gpu_seconds_idle / 3600:,.2f}",
            "allocated_hours": f"{total.gpu_seconds_allocated / 3600:,.2f}",
            "idle_cost": _money(idle_cost, total.currency),
            "cost": _money(total.cost, total.currency),
        }
        for _, _, total, idle_cost in rows[:MAX_WASTE_ROWS]
    ]


def _money(amount: float | None, currency: str | None) -> str:
    return "—" if amount is None else f"{amount:,.2f} {currency or ''}".rstrip()


def status_context(
    service: CollectorService, now: float, daily: DailySpend | None = None
) -> dict[str, object]:
    """Everything ``status.html`` shows (``daily``: the app's cache of the month's spend)."""
    storage = service.storage
    incidents = storage.incidents(state=IncidentState.OPEN)
    incidents.sort(key=lambda i: (-_severity_rank(i.severity), -i.first_seen))
    actions = storage.actions()[-MAX_ACTIONS:][::-1]
    audit = storage.audit(since=now - 86400)[-MAX_AUDIT:][::-1]
    return {
        "fleet": _fleet(service, now),
        "clusters": clusters_context(storage, now),
        "incidents": [incident_view(i) for i in incidents],
        "waste": _waste(service, now),
        "prices": prices_context(service.accounting.prices),
        "budgets": _budgets(service, now, daily or DailySpend(service.storage)),
        "actions": _action_rows(actions),
        "audit": [
            {
                "time": _when(e.time),
                "actor": e.actor,
                "action": e.action,
                "target": e.target,
                "verdict": e.verdict,
                "result": e.result,
                "dry_run": "yes" if e.dry_run else "no",
                "reason": e.reason,
            }
            for e in audit
        ],
    }


def _budgets(service: CollectorService, now: float, daily: DailySpend) -> dict[str, object]:
    budgets = service.accounting.budgets
    statuses = budget_statuses(budgets, daily, now) if budgets.items else []
    return budgets_context(statuses, budgets.currency, budgets.interval_level)


def _severity_rank(severity: str) -> int:
    return {"page": 3, "critical": 2, "warning": 1}.get(severity, 0)


def _page(env: SandboxedEnvironment, template: str, context: Mapping[str, object]) -> str:
    return env.get_template(template).render(
        **context,
        generated=_when(time.time()),
        refresh_seconds=REFRESH_SECONDS,
    )


async def status(request: web.Request) -> web.Response:
    """``GET /status``."""
    service, env = request.app[SERVICE], request.app[STATUS_TEMPLATES]
    board = request.app.get(RULE_BOARD)
    leadership = request.app.get(LEADERSHIP)

    def render() -> str:
        context = status_context(service, service.clock(), request.app.get(DAILY_SPEND))
        if leadership is not None:
            lead = leadership.status()
            context["leadership"] = {"replica": lead.replica, "detail": lead.describe()}
        states = board.states() if board is not None else []
        context["rules"] = [
            {"rule": s.rule_id, "detector": s.detector, "state": s.text()} for s in states
        ]
        return _page(env, "status.html", context)

    text = await asyncio.to_thread(render)
    return web.Response(text=text, content_type="text/html")


async def incident_page(request: web.Request) -> web.Response:
    """``GET /status/incidents/{id}``."""
    service, env = request.app[SERVICE], request.app[STATUS_TEMPLATES]
    written = request.match_info["id"]
    if not (written.isascii() and written.isdigit()) or len(written) > 18:  # 63-bit integers
        raise web.HTTPBadRequest(text="incident ids are integers\n")
    incident_id = int(written)
    caller = request[CALLER]
    # the "Silence 4h" button, for the people who may silence (web.silences checks it again)
    silence_csrf = page_csrf_token(request, caller) if caller.role in DECIDING_ROLES else ""

    def render() -> str | None:
        incident = service.storage.incident(incident_id)
        if incident is None:
            return None
        context = {
            "incident": incident_view(incident),
            "actions": _action_rows(service.storage.actions(incident_id=incident_id)),
            "silence_csrf": silence_csrf,
            "csrf_field": CSRF_FIELD,
        }
        return _page(env, "incident.html", context)

    text = await asyncio.to_thread(render)
    if text is None:
        raise web.HTTPNotFound(text=f"no incident {incident_id}\n")
    return web.Response(text=text, content_type="text/html")


def setup_status_page(app: web.Application) -> None:
    """Add ``GET /status`` and ``GET /status/incidents/{id}`` (pages for signed-in people)
    reading ``app[SERVICE]``."""
    app[STATUS_TEMPLATES] = environment()
    add_page(app, "GET", "/status", status, READERS)
    add_page(app, "GET", "/status/incidents/{id}", incident_page, READERS)
