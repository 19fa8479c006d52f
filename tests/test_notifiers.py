"""Slack and PagerDuty notifiers against local servers that check requests like the services."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from gpuwarden.collector.alerts.model import Alert, AlertStatus, Delivery, ProposedAction
from gpuwarden.collector.notify.pagerduty_notifier import PagerDutyNotifier, dedup_key
from gpuwarden.collector.notify.slack_notifier import SlackNotifier, slack_message
from tests.capture_servers import Capture, ServedApp, pagerduty_app, slack_app

ROUTING_KEY = "R0123456789abcdef0123456789abcd"[:31] + "x"
SECRET_HOOK_PATH = "/services/T000/B000/secret-token-do-not-log"


def alert(
    status: AlertStatus = AlertStatus.FIRING, summary: str = "GPU 3 idle for 30 min"
) -> Alert:
    return Alert(
        fingerprint="a1b2c3d4e5f6",
        rule_id="idle-gpu",
        status=status,
        severity="warning",
        summary=summary,
        starts_at=1_795_000_000.0,
        runbook_url="http://127.0.0.1:4318/incidents/7/runbook",
        ends_at=1_795_000_600.0 if status is AlertStatus.RESOLVED else None,
        team="research",
        incident_url="http://127.0.0.1:4318/status/incidents/7",
        labels={"node": "gpu-node-b"},
        facts={"job": "slurm:c:102", "idle GPU-h": "0.50", "wasted $": "2.00"},
        actions=(
            ProposedAction(
                "requeue",
                "slurm:c:102",
                "approve",
                "awaiting_approval",
                "http://127.0.0.1:4318/approve/v1.7.abc",
            ),
        ),
    )


@pytest.fixture
def slack() -> Iterator[tuple[Capture, ServedApp]]:
    capture = Capture()
    served = ServedApp(slack_app(capture))
    yield capture, served
    served.stop()


@pytest.fixture
def pagerduty() -> Iterator[tuple[Capture, ServedApp]]:
    capture = Capture()
    served = ServedApp(pagerduty_app(capture))
    yield capture, served
    served.stop()


def test_slack_block_kit_message_carries_facts_runbook_and_approval(slack, caplog):
    capture, served = slack
    notifier = SlackNotifier({"#gpu-waste": served.url + SECRET_HOOK_PATH})
    with caplog.at_level(logging.DEBUG):
        assert notifier.send(alert(), "#gpu-waste").delivered
    (request,) = capture.requests
    assert request["problems"] == []
    body = request["body"]
    blocks: dict[str, Any] = {}
    for block in body["blocks"]:
        blocks.setdefault(block["type"], block)  # the first of each type
    assert blocks["header"]["text"]["text"].startswith("WARNING: idle-gpu")
    fields = [f["text"] for f in blocks["section"]["fields"]]
    assert any("requeue `slurm:c:102` (approve): awaiting_approval" in b["text"]["text"]
               for b in body["blocks"] if b["type"] == "section")  # fmt: skip
    assert "*job*\nslurm:c:102" in fields
    buttons = {e["action_id"]: e["url"] for e in blocks["actions"]["elements"]}
    assert buttons["runbook"] == "http://127.0.0.1:4318/incidents/7/runbook"
    assert buttons["approve-0"] == "http://127.0.0.1:4318/approve/v1.7.abc"
    assert "(<http://127.0.0.1:4318/incidents/7/runbook|runbook>)" in body["text"]
    assert "secret-token" not in caplog.text


def test_slack_texts_are_cut_to_the_limits_and_a_resolve_has_no_approve_button(slack):
    capture, served = slack
    notifier = SlackNotifier({}, default_webhook=served.url + SECRET_HOOK_PATH)
    long = alert(AlertStatus.RESOLVED, summary="x" * 5000)
    assert notifier.send(long, "#anywhere").delivered
    body = capture.requests[0]["body"]
    assert capture.requests[0]["problems"] == []
    assert all(e["action_id"] != "approve-0" for b in body["blocks"] if b["type"] == "actions"
               for e in b["elements"])  # fmt: skip
    assert slack_message(long)["blocks"][0]["text"]["text"].startswith("RESOLVED")


def test_slack_429_is_answered_once_as_retryable_with_its_retry_after(slack):
    capture, served = slack
    capture.script = [429]
    result = SlackNotifier({"#c": served.url + SECRET_HOOK_PATH}).send(alert(), "#c")
    assert result.outcome is Delivery.RETRYABLE
    assert result.retry_after_seconds == 1.0
    assert capture.attempts == 1  # no retry inside the notifier: the dispatcher decides


def test_slack_without_a_webhook_or_refused_is_rejected_and_never_raises(slack, caplog):
    capture, served = slack
    assert SlackNotifier({}).send(alert(), "#none").outcome is Delivery.REJECTED
    capture.script = [400]
    with caplog.at_level(logging.WARNING):
        refused = SlackNotifier({"#c": served.url + SECRET_HOOK_PATH}).send(alert(), "#c")
    assert refused.outcome is Delivery.REJECTED
    assert "secret-token" not in caplog.text
    dead = SlackNotifier({"#c": "http://127.0.0.1:9/services/x"})
    assert dead.send(alert(), "#c").outcome is Delivery.RETRYABLE


def notifier(url: str) -> PagerDutyNotifier:
    return PagerDutyNotifier(
        {"gpu-oncall": ROUTING_KEY},
        events_url=url + "/v2/enqueue",
        change_url=url + "/v2/change/enqueue",
    )


def test_pagerduty_trigger_then_resolve_with_the_same_dedup_key(pagerduty, caplog):
    capture, served = pagerduty
    pd = notifier(served.url)
    with caplog.at_level(logging.DEBUG):
        assert pd.send(alert(), "gpu-oncall").delivered
        assert pd.send(alert(AlertStatus.RESOLVED), "gpu-oncall").delivered
    trigger, resolve = (r["body"] for r in capture.requests)
    assert all(r["problems"] == [] for r in capture.requests)
    assert trigger["event_action"] == "trigger"
    assert resolve == {
        "routing_key": ROUTING_KEY,
        "event_action": "resolve",
        "dedup_key": trigger["dedup_key"],
    }
    assert trigger["dedup_key"] == dedup_key(alert()) == "gpuwarden-a1b2c3d4e5f6"
    payload = trigger["payload"]
    assert payload["severity"] == "warning"
    assert payload["summary"] == "[idle-gpu] GPU 3 idle for 30 min"
    assert payload["custom_details"]["wasted $"] == "2.00"
    assert {"href": "http://127.0.0.1:4318/incidents/7/runbook", "text": "Runbook"} in trigger[
        "links"
    ]
    assert ROUTING_KEY not in caplog.text


@pytest.mark.parametrize(
    ("script", "outcome", "retry_after"),
    [
        ([429], Delivery.RETRYABLE, 1.0),
        ([500], Delivery.RETRYABLE, None),
        ([503], Delivery.RETRYABLE, None),
        ([], Delivery.DELIVERED, None),
    ],
)
def test_pagerduty_answers_each_event_once(pagerduty, script, outcome, retry_after):
    capture, served = pagerduty
    capture.script = list(script)
    result = PagerDutyNotifier({"s": ROUTING_KEY}, events_url=served.url + "/v2/enqueue").send(
        alert(), "s"
    )
    assert (result.outcome, result.retry_after_seconds) == (outcome, retry_after)
    assert capture.attempts == 1  # exactly one request, whatever the answer


def test_pagerduty_400_and_an_unknown_service_are_rejected(pagerduty):
    capture, served = pagerduty
    bad = PagerDutyNotifier({"s": "short-key"}, events_url=served.url + "/v2/enqueue")
    result = bad.send(alert(), "s")
    assert result.outcome is Delivery.REJECTED
    assert result.reason.startswith("HTTP 400")
    assert capture.attempts == 1
    assert bad.send(alert(), "unknown-service").outcome is Delivery.REJECTED
    assert capture.attempts == 1  # nothing sent without a routing key


def test_pagerduty_change_event_for_the_audit(pagerduty):
    capture, served = pagerduty
    result = notifier(served.url).change_event("gpu-oncall", "requeued slurm:c:102", {"by": "a"})
    assert result.delivered
    (request,) = capture.requests
    assert request["path"] == "/v2/change/enqueue"
    assert request["body"]["payload"]["summary"] == "requeued slurm:c:102"


def test_the_collector_builds_notifiers_from_secret_files(tmp_path):
    from gpuwarden.agent.config import ConfigError
    from gpuwarden.collector.build import build_notifiers
    from gpuwarden.collector.config import CollectorConfig

    hooks = tmp_path / "slack"
    hooks.write_text("# channel url\n#gpu-waste http://127.0.0.1:1/services/secret-a\n")
    keys = tmp_path / "pd"
    keys.write_text(f"gpu-oncall {ROUTING_KEY}\n")
    config = CollectorConfig(slack_webhooks_file=hooks, pagerduty_keys_file=keys)
    built = build_notifiers(config, {})
    assert sorted(built) == ["pagerduty", "slack"]
    assert build_notifiers(CollectorConfig(), {}) == {}
    assert list(build_notifiers(CollectorConfig(), {"GPUWARDEN_SLACK_WEBHOOK_URL": "http://x"}))
    keys.write_text(f"gpu-oncall {ROUTING_KEY} extra\n")
    with pytest.raises(ConfigError) as info:
        build_notifiers(config, {})
    assert ROUTING_KEY not in str(info.value)
    assert "pd:1" in str(info.value)
