"""Incident alerts (the dispatcher), the Alertmanager notifier and silences against a real
Alertmanager, the Alertmanager webhook receiver, and the ``alerting:`` settings."""

from __future__ import annotations

import io
import json
import logging
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from aiohttp import web

from gpuwarden.collector.alerts.model import FINGERPRINT_LABEL, Alert, AlertStatus, Delivery
from gpuwarden.collector.alerts.runbooks import Links
from gpuwarden.collector.credentials import Role, TokenTable, credential
from gpuwarden.collector.detect.catalog import load_rules
from gpuwarden.collector.ingest.alertmanager import AlertReceiver, PayloadError, parse_payload
from gpuwarden.collector.notify.alertmanager_notifier import AlertmanagerNotifier
from gpuwarden.collector.notify.dispatcher import AlertDispatcher
from gpuwarden.collector.notify.pagerduty_notifier import PagerDutyNotifier
from gpuwarden.collector.notify.settings import (
    AlertingSettings,
    AlertingSettingsError,
    RouteRule,
)
from gpuwarden.collector.notify.slack_notifier import SlackNotifier
from gpuwarden.collector.rules.loader import default_rules_dir, default_runbooks_dir
from gpuwarden.collector.rules.model import Rule
from gpuwarden.collector.storage.base import ActionRecord
from gpuwarden.collector.storage.records import AuditEntry, Incident, IncidentState
from tests.alertmanager_server import AlertmanagerServer, alertmanager_binary
from tests.capture_servers import Capture, ServedApp, pagerduty_app, slack_app
from tests.storage_backends import Backend, SqlStorage
from tests.test_remediator import FakeClock

PD_KEY = "R0UTINGKEY0000000000000000000000"
RULES = load_rules([default_rules_dir()], runbooks_dir=default_runbooks_dir())
LINKS = Links(base_url="http://collector:4318", dashboard_base_url="http://grafana:3000")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def storage(backend: Backend, clock: FakeClock) -> Iterator[SqlStorage]:
    """On SQLite and on PostgreSQL: the notification state is the database's."""
    with backend.open(clock) as store:
        yield store


@pytest.fixture
def services() -> Iterator[dict[str, tuple[Capture, ServedApp]]]:
    out = {}
    for name, app in (("slack", slack_app), ("pd", pagerduty_app)):
        capture = Capture()
        out[name] = (capture, ServedApp(app(capture)))
    yield out
    for _, served in out.values():
        served.stop()


def notifiers(services: dict[str, tuple[Capture, ServedApp]]) -> dict[str, Any]:
    slack_url = f"{services['slack'][1].url}/services/T/B/X"
    return {
        "slack": SlackNotifier({"#gpu-waste": slack_url, "#gpu-infra": slack_url}),
        "pagerduty": PagerDutyNotifier(
            {"gpu-infra": PD_KEY}, events_url=f"{services['pd'][1].url}/v2/enqueue"
        ),
    }


def idle_incident(storage: SqlStorage, n: int, now: float) -> Incident:
    incident = Incident(
        fingerprint=f"idle-gpu:slurm:c:{n}",
        rule_id="idle-gpu",
        severity="warning",
        first_seen=now,
        last_seen=now,
        evidence={
            "subject": f"slurm:c:{n}",
            "summary": f"job slurm:c:{n} idle for 30 min",
            "job": f"slurm:c:{n}",
            "node": "gpu-07",
            "idle_gpu_hours": 0.5,
            "points": [[now, 0.0]],
        },
    )
    incident_id = storage.open_incident(incident)
    assert incident_id is not None
    return replace(incident, incident_id=incident_id)


def resolve(storage: SqlStorage, incident: Incident, now: float) -> None:
    storage.update_incident(replace(incident, state=IncidentState.RESOLVED, resolved_time=now))


def dispatcher(
    storage: SqlStorage, services: dict[str, Any], clock: FakeClock, **settings: Any
) -> AlertDispatcher:
    return AlertDispatcher(
        storage, RULES.rules, notifiers(services), AlertingSettings(**settings), LINKS, clock=clock
    )


# --- the dispatcher ---------------------------------------------------------------------------


def test_fires_once_per_route_survives_a_restart_and_resolves_once(storage, services, clock):
    incident = idle_incident(storage, 1, clock.now)
    first = dispatcher(storage, services, clock)
    assert first.tick().sent == 1
    assert first.tick().sent == 0
    restarted = dispatcher(storage, services, clock)  # a new process on the same database
    clock.now += 600
    assert restarted.tick().sent == 0
    slack = services["slack"][0].requests
    assert len(slack) == 1
    assert slack[0]["body"]["blocks"][0]["text"]["text"].startswith("WARNING: idle-gpu")
    assert slack[0]["problems"] == []
    buttons = next(b for b in slack[0]["body"]["blocks"] if b["type"] == "actions")["elements"]
    assert buttons[0]["url"] == f"http://collector:4318/incidents/{incident.incident_id}/runbook"
    assert any("var-job=slurm%3Ac%3A1" in b["url"] for b in buttons)  # the dashboard link
    resolve(storage, incident, clock.now)
    assert restarted.tick().sent == 1
    assert restarted.tick().sent == 0
    assert slack[-1]["body"]["blocks"][0]["text"]["text"].startswith("RESOLVED: idle-gpu")
    assert len(slack) == 2


def test_routing_by_severity_and_team_adds_routes(storage, services, clock):
    idle_incident(storage, 1, clock.now)  # warning, owner ml-platform
    routing = AlertingSettings.from_mapping(
        {
            "routing": [
                {"severities": ["critical"], "routes": ["slack:#nobody"]},
                {"teams": ["ml-platform"], "routes": ["pagerduty:gpu-infra"]},
            ]
        },
        "alerting",
    ).routing
    d = dispatcher(storage, services, clock, routing=routing)
    assert d.tick().sent == 2
    (trigger,) = services["pd"][0].requests
    assert trigger["problems"] == []
    assert trigger["body"]["dedup_key"] == "gpuwarden-idle-gpu:slurm:c:1"
    assert trigger["body"]["payload"]["severity"] == "warning"


def test_an_undelivered_alert_is_retried_with_backoff_and_resolves_with_the_same_key(
    storage, services, clock
):
    pd, _ = services["pd"]
    routing = AlertingSettings.from_mapping(
        {"routing": [{"teams": ["ml-platform"], "routes": ["pagerduty:gpu-infra"]}]}, "alerting"
    ).routing
    d = dispatcher(storage, services, clock, routing=routing, interval_seconds=15)
    incident = idle_incident(storage, 1, clock.now)
    pd.script = [500, 429]
    assert d.tick().failed == 1  # 500
    assert d.tick().sent == 0  # not due before its backoff (15 s)
    clock.now += 15
    assert d.tick().failed == 1  # 429
    clock.now += 29
    assert d.tick().sent == 0  # backoff doubled to 30 s
    clock.now += 1
    assert d.tick().sent == 1
    assert [r["body"]["event_action"] for r in pd.requests] == ["trigger"]
    resolve(storage, incident, clock.now)
    d.tick()
    actions = [(r["body"]["event_action"], r["body"]["dedup_key"]) for r in pd.requests]
    assert actions == [("trigger", "gpuwarden-idle-gpu:slurm:c:1")] * 1 + [
        ("resolve", "gpuwarden-idle-gpu:slurm:c:1")
    ]


def test_a_retryable_answer_waits_for_its_retry_after_when_longer_than_the_backoff(
    storage, services, clock
):
    pd, _ = services["pd"]
    routing = AlertingSettings.from_mapping(
        {"routing": [{"teams": ["ml-platform"], "routes": ["pagerduty:gpu-infra"]}]}, "alerting"
    ).routing
    d = dispatcher(storage, services, clock, routing=routing, interval_seconds=15)
    idle_incident(storage, 1, clock.now)
    pd.script, pd.retry_after = [429], "120"
    assert d.tick().failed == 1
    (record,) = storage.notifications(delivered=False)
    assert (record.attempts, record.last_error) == (1, "HTTP 429 Too Many Requests")
    assert record.next_attempt_at == clock.now + 120  # not the 15 s backoff
    clock.now += 119
    d.tick()
    assert pd.attempts == 1
    clock.now += 1
    assert d.tick().sent == 1
    assert pd.attempts == 2


def test_a_rejected_notice_is_given_up_at_once_with_its_reason(storage, services, clock, caplog):
    slack, _ = services["slack"]
    d = dispatcher(storage, services, clock, interval_seconds=15)
    idle_incident(storage, 1, clock.now)
    slack.script = [400]
    with caplog.at_level(logging.WARNING):
        result = d.tick()
    assert (result.failed, result.lost) == (1, 1)
    (record,) = storage.notifications(status="lost")
    assert record.last_error == "HTTP 400 error"  # Slack's answer body says why
    assert "rejected: HTTP 400" in caplog.text
    for _ in range(3):
        clock.now += 3600
        d.tick()
    assert slack.attempts == 1  # never tried again


def test_a_notice_nobody_accepts_is_given_up_and_logged(storage, services, clock, caplog):
    slack, _ = services["slack"]
    d = dispatcher(storage, services, clock, give_up_seconds=60, interval_seconds=15)
    idle_incident(storage, 1, clock.now)
    slack.script = [500] * 100
    lost = 0
    for _ in range(10):
        with caplog.at_level(logging.WARNING):
            lost += d.tick().lost
        clock.now += 30
    assert lost == 1
    assert "given up" in caplog.text
    assert storage.notifications(status="lost")


def test_a_resolve_is_not_sent_for_an_alert_that_never_got_through(storage, services, clock):
    slack, _ = services["slack"]
    d = dispatcher(storage, services, clock)
    incident = idle_incident(storage, 1, clock.now)
    slack.script = [400]  # refused for good
    assert d.tick().failed == 1
    resolve(storage, incident, clock.now)
    clock.now += 600
    d.tick()
    assert slack.requests[-1:] == [] or "RESOLVED" not in json.dumps(slack.requests)


def test_many_new_incidents_of_one_rule_go_to_chat_as_one_message(storage, services, clock):
    for n in range(12):
        idle_incident(storage, n, clock.now)
    d = dispatcher(storage, services, clock, group_threshold=3)
    result = d.tick()
    assert (result.sent, result.grouped) == (1, 1)
    (message,) = services["slack"][0].requests
    assert message["problems"] == []
    text = json.dumps(message["body"])
    assert "12 incidents open" in text
    assert "and 3 more" in text
    assert d.tick().sent == 0  # all twelve are known as told


# --- Alertmanager: pushes and silences against the real one ----------------------------------

needs_alertmanager = pytest.mark.skipif(
    alertmanager_binary() is None, reason="prometheus-alertmanager is not installed"
)
AM_CONFIG = {
    "route": {"receiver": "null", "group_wait": "1s", "group_interval": "1s"},
    "receivers": [{"name": "null"}],
}


@needs_alertmanager
def test_firing_resend_resolve_and_a_silence_while_an_action_settles(storage, clock):
    with AlertmanagerServer(AM_CONFIG) as am:
        clock.now = time.time()
        notifier = AlertmanagerNotifier({"main": am.url}, hold_seconds=300, clock=clock)
        settings = AlertingSettings(
            alertmanagers={"main": am.url},
            routing=AlertingSettings.from_mapping(
                {"routing": [{"severities": ["warning"], "routes": ["alertmanager:main"]}]}, "a"
            ).routing,
            resend_seconds=60,
        )
        d = AlertDispatcher(
            storage, RULES.rules, {"alertmanager": notifier}, settings, LINKS, clock=clock
        )
        incident = idle_incident(storage, 1, clock.now)
        assert d.tick().sent == 1
        (alert,) = am.alerts(alertname="idle-gpu")
        assert alert["status"]["state"] == "active"
        assert alert["labels"][FINGERPRINT_LABEL] == "idle-gpu:slurm:c:1"
        assert alert["labels"]["job"] == "slurm:c:1"
        assert alert["annotations"]["runbook_url"].endswith("/runbook")
        first_end = alert["endsAt"]
        clock.now += 30
        assert d.tick().sent == 0  # not yet due for a re-send
        clock.now += 30
        assert d.tick().sent == 1  # re-sent: Alertmanager wants firing alerts again and again
        (alert,) = am.alerts(alertname="idle-gpu")
        assert alert["endsAt"] > first_end  # its hold moved on

        # A real requeue is settling: our own alert is silenced until its verification.
        clock.now = time.time()  # a silence starting in Alertmanager's future would be pending
        verify_at = clock.now + 120
        storage.insert_action(
            ActionRecord(
                incident_id=incident.incident_id or 0,
                idempotency_key="k1",
                action="requeue",
                target="slurm:c:1",
                mode="auto",
                dry_run=False,
                state="verifying",
                created_at=clock.now,
                updated_at=clock.now,
                verify_at=verify_at,
            )
        )
        assert d.tick().silenced == 1
        assert d.tick().silenced == 0  # once
        (silence,) = am.silences()
        assert silence["status"]["state"] == "active"
        assert silence["createdBy"] == "gpuwarden-remediator"
        assert "requeue slurm:c:1" in silence["comment"]
        matchers = {m["name"]: m["value"] for m in silence["matchers"]}
        assert matchers == {"alertname": "idle-gpu", FINGERPRINT_LABEL: "idle-gpu:slurm:c:1"}
        (alert,) = am.alerts(alertname="idle-gpu")
        assert alert["status"]["state"] == "suppressed"

        # Resolved: the silence is lifted and the alert ends.
        resolve(storage, incident, clock.now)
        assert d.tick().sent == 1
        (silence,) = am.silences()
        assert silence["status"]["state"] == "expired"
        assert [
            a for a in am.alerts(alertname="idle-gpu") if a["status"]["state"] == "active"
        ] == []


def test_alertmanager_notifier_answers_once_5xx_retryable_400_rejected(clock):
    capture = Capture(script=[500, 502, 503, 400])

    async def alerts(_request: web.Request) -> web.Response:
        capture.attempts += 1
        return web.Response(status=capture.script.pop(0) if capture.script else 200)

    app = web.Application()
    app.router.add_post("/api/v2/alerts", alerts)
    served = ServedApp(app)
    try:
        notifier = AlertmanagerNotifier({"main": served.url}, clock=clock)
        alert = Alert("fp", "idle-gpu", AlertStatus.FIRING, "warning", "s", clock.now, "http://x/r")
        outcomes = [notifier.send(alert, "main").outcome for _ in range(5)]
        assert outcomes == [Delivery.RETRYABLE] * 3 + [Delivery.REJECTED, Delivery.DELIVERED]
        assert capture.attempts == 5  # one request per send: no retry inside
        unknown = notifier.send(alert, "nowhere")  # an unknown route: logged, no crash
        assert unknown.outcome is Delivery.REJECTED
        assert capture.attempts == 5
    finally:
        served.stop()


# --- the webhook receiver ---------------------------------------------------------------------


def am_payload(status: str = "firing", **labels: str) -> dict[str, Any]:
    return {
        "receiver": "gpuwarden",
        "status": status,
        "alerts": [
            {
                "status": status,
                "labels": {
                    "alertname": "GpuwardenGPUFailed",
                    "node": "gpu-07",
                    "gpu": "0",
                    "severity": "critical",
                    **labels,
                },
                "annotations": {"summary": "GPU 0 on gpu-07 has failed"},
                "startsAt": "2026-11-22T03:00:18.123456789Z",
                "endsAt": "0001-01-01T00:00:00Z"
                if status == "firing"
                else "2026-11-22T03:10:00.5Z",
                "generatorURL": "http://prometheus:9090/graph?g0.expr=x",
                "fingerprint": "1751935677e36f4d",
            }
        ],
        "groupLabels": {"alertname": "GpuwardenGPUFailed"},
        "commonLabels": {},
        "commonAnnotations": {},
        "externalURL": "http://am:9093",
        "version": "4",
        "groupKey": '{}:{alertname="GpuwardenGPUFailed"}',
        "truncatedAlerts": 0,
    }


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda p: p.update(version="3"), "version"),
        (lambda p: p.update(alerts={}), "alerts: expected a list"),
        (lambda p: p["alerts"][0].update(status="pending"), "status"),
        (lambda p: p["alerts"][0].update(labels={}), "labels"),
        (lambda p: p["alerts"][0].update(labels={"a": 1}), "expected a string"),
        (lambda p: p["alerts"][0].update(startsAt="yesterday"), "startsAt"),
        (lambda p: p["alerts"][0].update(startsAt="2026-11-22T03:00:18"), "no zone"),
        (lambda p: p.update(alerts=[p["alerts"][0]] * 1001), "more than 1000"),
        (lambda p: p["alerts"][0]["labels"].update({f"l{i}": "v" for i in range(70)}), "64"),
    ],
)
def test_bad_payloads_are_refused_with_the_reason(mutate, message):
    payload = am_payload()
    mutate(payload)
    with pytest.raises(PayloadError, match=message):
        parse_payload(payload)


def test_received_alerts_open_update_and_resolve_one_incident(storage):
    receiver = AlertReceiver(storage, RULES.rules)
    assert [r.id for r in receiver.rules] == ["prometheus-gpu-failed"]
    now = 1_795_000_000.0
    result = receiver.receive(parse_payload(am_payload()), now=now)
    assert (result.opened, result.ignored) == (1, 0)
    result = receiver.receive(parse_payload(am_payload()), now=now + 60)
    assert (result.opened, result.updated) == (0, 1)
    (incident,) = storage.incidents(state=IncidentState.OPEN)
    assert incident.rule_id == "prometheus-gpu-failed"
    assert incident.fingerprint == "am:prometheus-gpu-failed:1751935677e36f4d"
    assert incident.severity == "critical"
    assert incident.evidence["node"] == "gpu-07"  # the drain's target
    assert incident.evidence["summary"] == "GPU 0 on gpu-07 has failed"
    assert incident.first_seen == pytest.approx(1_795_000_000.0 - 0, abs=4e6)
    other = receiver.receive(parse_payload(am_payload(alertname="SomethingElse")), now=now)
    assert (other.received, other.ignored) == (1, 1)
    ours = receiver.receive(parse_payload(am_payload(**{FINGERPRINT_LABEL: "x"})), now=now)
    assert ours.ignored == 1  # our own alert, routed back: never a loop
    result = receiver.receive(parse_payload(am_payload("resolved")), now=now + 120)
    assert result.resolved == 1
    assert storage.incidents(state=IncidentState.OPEN) == []
    (done,) = storage.incidents(state=IncidentState.RESOLVED)
    assert done.resolved_time is not None
    assert done.resolved_time <= now + 120


# --- settings ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("section", "message"),
    [
        (
            {"alertmanager": {}},
            "alerting: unknown key 'alertmanager'; did you mean 'alertmanagers'?",
        ),
        ({"alertmanagers": {}}, "alerting.alertmanagers: expected a mapping of name to URL"),
        ({"resend_seconds": "1m"}, "alerting.resend_seconds: expected a number, got '1m'"),
        (
            {"silence_while_settling": "no"},
            "alerting.silence_while_settling: expected true or false",
        ),
        ({"audit_change_events": "slack:#a"}, "audit_change_events: expected pagerduty:<service>"),
        ({"alertmanagers": {"main": "ftp://x"}}, "alerting.alertmanagers.main: expected an http"),
        ({"resend_seconds": 0}, "alerting.resend_seconds: expected a number >= 1"),
        ({"group_threshold": 1}, "alerting.group_threshold"),
        ({"routing": [{"routes": ["sms:+1555"]}]}, r"alerting.routing\[0\].routes"),
        (
            {"routing": [{"severities": ["loud"], "routes": ["slack:#a"]}]},
            r"routing\[0\]\.severities\[0\]: expected one of info, warning, critical, page",
        ),
        ({"routing": [{"teams": ["a"]}]}, r"routing\[0\].routes: required"),
    ],
)
def test_bad_alerting_sections_name_the_key(section, message):
    assert AlertingSettings.from_mapping(
        {"routing": [{"routes": "slack:#a", "teams": "ml"}]}, "alerting"
    ).routing[0] == RouteRule(routes=("slack:#a",), teams=("ml",))  # one item alone: a list
    with pytest.raises(AlertingSettingsError, match=message):
        AlertingSettings.from_mapping(section, "alerting")


def test_rule_routes_come_first_then_the_routing_table(storage, services, clock):
    settings = AlertingSettings.from_mapping(
        {"routing": [{"severities": ["warning"], "routes": ["slack:#gpu-waste", "slack:#b"]}]},
        "alerting",
    )
    d = AlertDispatcher(storage, RULES.rules, {}, settings, LINKS, clock=clock)
    incident = idle_incident(storage, 1, clock.now)
    rule: Rule = next(r for r in RULES.rules if r.id == "idle-gpu")
    assert d.routes(incident) == (*rule.routes, "slack:#b")


# --- the webhook endpoint ---------------------------------------------------------------------

WEBHOOK_TOKEN = "am-0123456789abcdef01234"


@pytest.fixture
async def webhook(aiohttp_client, storage):
    from gpuwarden.collector.alerts.runbooks import RunbookRenderer
    from gpuwarden.collector.config import CollectorConfig
    from gpuwarden.collector.remediate.policy import PolicyConfig
    from gpuwarden.collector.remediate.remediator import Remediator
    from gpuwarden.collector.web.app import create_app
    from gpuwarden.collector.web.remediation_setup import Remediation

    app = create_app(
        CollectorConfig(
            tokens=TokenTable((credential(WEBHOOK_TOKEN, Role.ALERT_SOURCE, "alertmanager"),))
        ),
        remediation=Remediation(
            storage=storage,
            remediator=Remediator(storage, RULES.rules, [], config=PolicyConfig()),
            renderer=RunbookRenderer(default_runbooks_dir()),
            links=LINKS,
            rules={rule.id: rule for rule in RULES.rules},
        ),
    )
    return await aiohttp_client(app)


AUTH = {"Authorization": f"Bearer {WEBHOOK_TOKEN}"}


async def test_the_webhook_answers_as_alertmanager_expects(webhook, storage):
    response = await webhook.post("/v1/alertmanager", json=am_payload())
    assert response.status == 401  # no token; Alertmanager does not retry a 4xx
    response = await webhook.post("/v1/alertmanager", json=am_payload(), headers=AUTH)
    assert response.status == 200
    assert await response.json() == {
        "received": 1,
        "opened": 1,
        "updated": 0,
        "resolved": 0,
        "ignored": 0,
    }
    bad = await webhook.post("/v1/alertmanager", data=b"{not json", headers=AUTH)
    assert bad.status == 400
    assert "not JSON" in (await bad.json())["error"]
    wrong = await webhook.post("/v1/alertmanager", json={"version": "3"}, headers=AUTH)
    assert wrong.status == 400
    assert "version" in (await wrong.json())["error"]
    body = io.BytesIO(b" " * (1024 * 1024 + 10))
    huge = await webhook.post("/v1/alertmanager", data=body, headers=AUTH)
    assert huge.status == 413
    resolved = await webhook.post("/v1/alertmanager", json=am_payload("resolved"), headers=AUTH)
    assert (await resolved.json())["resolved"] == 1


async def test_a_storage_failure_is_answered_5xx_so_alertmanager_retries(webhook, storage):
    storage.close()  # the database is gone for now
    response = await webhook.post("/v1/alertmanager", json=am_payload(), headers=AUTH)
    assert response.status == 503


# --- the audit, mirrored as PagerDuty change events ---------------------------------------------


def audit(storage: SqlStorage, now: float, result: str, *, dry_run: bool = False) -> None:
    storage.append_audit(
        AuditEntry(
            time=now,
            actor="remediator",
            action="requeue",
            target="slurm:c:1",
            reason="idle for 30 min",
            verdict="execute",
            dry_run=dry_run,
            result=result,
            inputs={"token": "s3cret", "job": "slurm:c:1"},
            incident_fingerprint="idle-gpu:slurm:c:1",
        )
    )


def test_real_audit_entries_become_change_events_once(storage, services, clock):
    pd, _ = services["pd"]
    d = dispatcher(storage, services, clock, audit_change_events="pagerduty:gpu-infra")
    audit(storage, clock.now, "intent")  # before the call: skipped, its outcome follows
    audit(storage, clock.now, "done")
    audit(storage, clock.now, "dry_run", dry_run=True)  # nothing happened: skipped
    pd.script = [500]
    assert d.tick().mirrored == 0  # not accepted: retried next pass, not skipped
    assert d.tick().mirrored == 1
    restarted = dispatcher(storage, services, clock, audit_change_events="pagerduty:gpu-infra")
    assert restarted.tick().mirrored == 0  # the cursor is in the database
    audit(storage, clock.now, "verified")
    assert restarted.tick().mirrored == 1
    events = [r for r in pd.requests if r["path"] == "/v2/change/enqueue"]
    assert [e["problems"] for e in events] == [[], []]
    first = events[0]["body"]
    assert first["routing_key"] == PD_KEY
    assert first["payload"]["summary"] == (
        "gpuwarden remediation: requeue slurm:c:1: done (execute) by remediator"
    )
    assert first["payload"]["custom_details"]["inputs"]["token"] == "[redacted]"
    assert "s3cret" not in json.dumps(events)


def test_two_hundred_simultaneous_faults_page_once_and_resolve_once(storage, services, clock):
    pd, _ = services["pd"]
    incidents = []
    for n in range(200):
        incident = Incident(
            fingerprint=f"gpu-hardware-fault:node-{n}",
            rule_id="gpu-hardware-fault",  # routes pagerduty:gpu-infra and slack:#gpu-infra
            severity="critical",
            first_seen=clock.now,
            last_seen=clock.now,
            evidence={"subject": f"node-{n}/GPU-0", "summary": "XID 79", "node": f"node-{n}"},
        )
        incident_id = storage.open_incident(incident)
        incidents.append(replace(incident, incident_id=incident_id))
    d = dispatcher(storage, services, clock)
    result = d.tick()
    assert (result.sent, result.grouped) == (2, 2)  # one page, one chat message
    (trigger,) = pd.requests
    assert trigger["problems"] == []
    assert trigger["body"]["payload"]["summary"] == "[gpu-hardware-fault] 200 incidents open"
    group_key = trigger["body"]["dedup_key"]
    for incident in incidents[:199]:
        resolve(storage, incident, clock.now)
    clock.now += 60
    d.tick()
    assert [r["body"]["event_action"] for r in pd.requests] == ["trigger"]  # one still open
    resolve(storage, incidents[199], clock.now)
    d.tick()
    assert [r["body"]["event_action"] for r in pd.requests] == ["trigger", "resolve"]
    assert pd.requests[1]["body"]["dedup_key"] == group_key
    assert d.tick().sent == 0


# --- the webhook route ------------------------------------------------------------------------


def test_webhook_route_posts_a_signed_alert_and_the_dispatcher_retries_5xx(storage, clock):
    from gpuwarden.collector.alerts.signing import (
        IDEMPOTENCY_HEADER,
        SIGNATURE_HEADER,
        TIMESTAMP_HEADER,
        Webhook,
        verify,
    )
    from gpuwarden.collector.notify.webhook_notifier import WebhookNotifier

    secret = b"0123456789abcdef-webhook"
    capture = Capture(script=[503])
    seen: list[tuple[bool, dict[str, Any], str]] = []

    async def hook(request: web.Request) -> web.Response:
        capture.attempts += 1
        if capture.script:
            return web.Response(status=capture.script.pop(0))
        body = await request.read()
        ok = verify(
            secret,
            timestamp=request.headers[TIMESTAMP_HEADER],
            body=body,
            header=request.headers[SIGNATURE_HEADER],
            now=time.time(),
        )
        seen.append((ok, json.loads(body), request.headers[IDEMPOTENCY_HEADER]))
        return web.Response(status=202 if ok else 401)

    app = web.Application()
    app.router.add_post("/hook", hook)
    served = ServedApp(app)
    try:
        notifier = WebhookNotifier([Webhook("ticketing", f"{served.url}/hook", secret)])
        settings = AlertingSettings.from_mapping(
            {"routing": [{"teams": ["ml-platform"], "routes": ["webhook:ticketing"]}]}, "a"
        )
        d = AlertDispatcher(
            storage, RULES.rules, {"webhook": notifier}, settings, LINKS, clock=clock
        )
        incident = idle_incident(storage, 1, clock.now)
        assert d.tick().failed == 1  # the 503: one request, retried by the dispatcher
        assert capture.attempts == 1
        clock.now += 15
        assert d.tick().sent == 1
        assert capture.attempts == 2
        ((ok, body, key),) = seen
        assert ok
        assert body["event"] == "alert"
        assert body["status"] == "firing"
        assert body["rule"] == "idle-gpu"
        assert body["runbook_url"].endswith("/runbook")
        assert key == "idle-gpu:slurm:c:1:firing"
        resolve(storage, incident, clock.now)
        d.tick()
        assert [b["status"] for _, b, _ in seen] == ["firing", "resolved"]
        bad = WebhookNotifier([Webhook("ticketing", f"{served.url}/hook", b"x" * 16)])
        alert = Alert("fp", "idle-gpu", AlertStatus.FIRING, "warning", "s", clock.now, "http://r")
        refused = bad.send(alert, "ticketing")  # wrong secret: the receiver says 401
        assert (refused.outcome, refused.reason) == (Delivery.REJECTED, "HTTP 401 Unauthorized")
        assert bad.send(alert, "nowhere").outcome is Delivery.REJECTED
    finally:
        served.stop()


def test_a_page_is_acknowledged_once_when_a_real_action_works_on_it(storage, services, clock):
    pd, _ = services["pd"]
    routing = AlertingSettings.from_mapping(
        {"routing": [{"teams": ["ml-platform"], "routes": ["pagerduty:gpu-infra"]}]}, "alerting"
    ).routing
    d = dispatcher(storage, services, clock, routing=routing)
    incident = idle_incident(storage, 1, clock.now)
    assert d.tick().sent == 2
    row = ActionRecord(
        incident_id=incident.incident_id or 0,
        idempotency_key="k1",
        action="requeue",
        target="slurm:c:1",
        mode="approve",
        dry_run=True,
        state="dry_run",
        created_at=clock.now,
        updated_at=clock.now,
    )
    action_id = storage.insert_action(row)
    assert d.tick().acknowledged == 0  # a dry run is not someone working on it
    stored = storage.action(action_id or 0)
    assert stored is not None
    storage.update_action(
        replace(stored, dry_run=False, state="verifying", verify_at=clock.now + 120),
        expect_state="dry_run",
    )
    assert d.tick().acknowledged == 1
    assert d.tick().acknowledged == 0
    actions = [r["body"]["event_action"] for r in pd.requests]
    assert actions == ["trigger", "acknowledge"]
    assert pd.requests[1]["body"] == {
        "routing_key": PD_KEY,
        "event_action": "acknowledge",
        "dedup_key": "gpuwarden-idle-gpu:slurm:c:1",
    }
    resolve(storage, incident, clock.now)
    d.tick()
    assert [r["body"]["event_action"] for r in pd.requests][-1] == "resolve"


def test_alertmanager_gets_many_alerts_per_request(storage, clock):
    bodies: list[list[dict[str, Any]]] = []

    async def alerts(request: web.Request) -> web.Response:
        bodies.append(await request.json())
        return web.Response(status=200)

    app = web.Application()
    app.router.add_post("/api/v2/alerts", alerts)
    served = ServedApp(app)
    try:
        notifier = AlertmanagerNotifier({"main": served.url}, clock=clock)
        settings = AlertingSettings(
            routing=AlertingSettings.from_mapping(
                {"routing": [{"teams": ["ml-platform"], "routes": ["alertmanager:main"]}]}, "a"
            ).routing
        )
        d = AlertDispatcher(
            storage, RULES.rules, {"alertmanager": notifier}, settings, LINKS, clock=clock
        )
        for n in range(600):
            idle_incident(storage, n, clock.now)
        assert d.tick().sent == 600
        assert [len(b) for b in bodies] == [500, 100]  # not 600 requests
        fingerprints = {a["labels"][FINGERPRINT_LABEL] for b in bodies for a in b}
        assert len(fingerprints) == 600
        clock.now += 60
        assert d.tick().sent == 600  # the re-send, batched the same way
        assert [len(b) for b in bodies] == [500, 100, 500, 100]
    finally:
        served.stop()
