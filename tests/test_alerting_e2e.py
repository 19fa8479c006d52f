"""End to end, all real but the chat and paging services: a real Alertmanager 0.25 and the real
``gpuwarden collector`` process, with Slack, PagerDuty and webhook capture servers.

The loop: an alert from the user's Prometheus rules (``GpuwardenGPUFailed``, pushed to
Alertmanager as Prometheus would) reaches the collector's Alertmanager webhook and opens a
``prometheus-gpu-failed`` incident. The collector then sends its own alerts: a Slack Block Kit
message with a runbook link that works, a PagerDuty trigger, and an Alertmanager alert that
Alertmanager fans out to its Slack, PagerDuty and webhook receivers. When Prometheus' alert
resolves, everything resolves: the PagerDuty resolve carries the trigger's ``dedup_key`` and
Alertmanager's receivers get the resolved notice. Payloads are checked field by field against
the formats in the reference notes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.alertmanager_server import AlertmanagerServer, alertmanager_binary
from tests.capture_servers import (
    Capture,
    ServedApp,
    pagerduty_app,
    pagerduty_problems,
    slack_app,
    slack_problems,
    webhook_app,
)
from tests.collector_server import free_port
from tests.test_collector_remediation import get

pytestmark = pytest.mark.skipif(
    alertmanager_binary() is None, reason="prometheus-alertmanager is not installed"
)

OPS_TOKEN = "ops-0123456789abcdef0123"
AM_TOKEN = "am-0123456789abcdef01234"
OUR_PD_KEY = "R0UTINGKEYOURS0000000000000000AB"  # 32 characters, like an integration key
AM_PD_KEY = "R0UTINGKEYAMAM0000000000000000CD"
PROMETHEUS_ALERT = {
    "alertname": "GpuwardenGPUFailed",
    "node": "gpu-07",
    "gpu": "0",
    "gpu_model": "NVIDIA H100 80GB HBM3",
    "severity": "critical",
}


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat()


def wait_for(what: str, find: Callable[[], Any], timeout: float = 45.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:  # external processes deliver asynchronously: poll until a deadline
        found = find()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


class Loop:
    """The servers of one test, with the ports chosen up front (the configs name each other)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.captures = {name: Capture() for name in ("slack", "pd", "am_slack", "am_pd", "hook")}
        apps = {
            "slack": slack_app,
            "pd": pagerduty_app,
            "am_slack": slack_app,
            "am_pd": pagerduty_app,
            "hook": webhook_app,
        }
        self.servers = {name: ServedApp(apps[name](c)) for name, c in self.captures.items()}
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.am_port = free_port()

    def alertmanager_config(self) -> dict[str, Any]:
        url = {name: server.url for name, server in self.servers.items()}
        runbook = "{{ (index .Alerts 0).Annotations.runbook_url }}"
        return {
            "route": {
                "receiver": "gpuwarden-collector",
                "group_by": ["alertname", "gpuwarden_fingerprint", "node"],
                "group_wait": "1s",
                "group_interval": "1s",
                "repeat_interval": "1h",
                "routes": [{"matchers": ['source="gpuwarden"'], "receiver": "team"}],
            },
            "receivers": [
                {
                    "name": "gpuwarden-collector",
                    "webhook_configs": [
                        {
                            "url": f"{self.base}/v1/alertmanager",
                            "send_resolved": True,
                            "http_config": {
                                "authorization": {"type": "Bearer", "credentials": AM_TOKEN}
                            },
                        }
                    ],
                },
                {
                    "name": "team",
                    "slack_configs": [
                        {
                            "api_url": f"{url['am_slack']}/services/T000/B000/AMAMAM",
                            "channel": "#gpu",
                            "send_resolved": True,
                            "title": "{{ .CommonAnnotations.summary }}",
                            "text": "{{ .CommonAnnotations.description }}",
                            "actions": [{"type": "button", "text": "Runbook", "url": runbook}],
                        }
                    ],
                    "pagerduty_configs": [
                        {
                            "routing_key": AM_PD_KEY,
                            "url": f"{url['am_pd']}/v2/enqueue",
                            "send_resolved": True,
                            "links": [{"href": runbook, "text": "Runbook"}],
                        }
                    ],
                    "webhook_configs": [{"url": f"{url['hook']}/hook", "send_resolved": True}],
                },
            ],
        }

    def start_collector(self) -> subprocess.Popen[str]:
        tmp = self.tmp
        (tmp / "tokens").write_text(
            f"operator ops {OPS_TOKEN}\nalert-source alertmanager {AM_TOKEN}\n"
        )
        slack_url = f"{self.servers['slack'].url}/services/T000/B000/OURS"
        (tmp / "slack").write_text(f"#gpu-infra {slack_url}\n")
        (tmp / "pagerduty").write_text(f"gpu-infra {OUR_PD_KEY}\n")
        config = {
            "port": self.port,
            "tokens_file": str(tmp / "tokens"),
            "database": str(tmp / "c.db"),
            "slack_webhooks_file": str(tmp / "slack"),
            "pagerduty_keys_file": str(tmp / "pagerduty"),
            "pagerduty_events_url": f"{self.servers['pd'].url}/v2/enqueue",
            "remediation": {"external_url": self.base, "interval_seconds": 1},
            "alerting": {
                "alertmanagers": {"main": f"http://127.0.0.1:{self.am_port}"},
                "interval_seconds": 1,
                "resend_seconds": 2,
                "routing": [
                    {
                        "severities": ["critical", "page"],
                        "routes": ["pagerduty:gpu-infra", "alertmanager:main"],
                    }
                ],
            },
        }
        (tmp / "c.yaml").write_text(json.dumps(config))  # JSON is YAML
        with (tmp / "collector.log").open("w") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "gpuwarden", "collector", "--config", str(tmp / "c.yaml")],
                stdout=log,
                stderr=subprocess.STDOUT,
                text=True,
            )
        wait_for("the collector", lambda: self._healthy(proc), timeout=30)
        return proc

    def _healthy(self, proc: subprocess.Popen[str]) -> bool:
        assert proc.poll() is None, (self.tmp / "collector.log").read_text()
        try:
            return get(f"{self.base}/healthz")[0] == 200
        except OSError:
            return False

    def close(self) -> None:
        for server in self.servers.values():
            server.stop()


@pytest.fixture
def loop(tmp_path: Path) -> Iterator[Loop]:
    servers = Loop(tmp_path)
    try:
        yield servers
    finally:
        servers.close()


def _blocks_text(body: dict[str, Any]) -> str:
    return json.dumps(body.get("blocks", []))


def test_one_incident_reaches_slack_pagerduty_and_alertmanager_then_resolves(loop: Loop) -> None:
    with AlertmanagerServer(loop.alertmanager_config(), port=loop.am_port) as am:
        proc = loop.start_collector()
        try:
            _run_loop(loop, am)
        finally:
            proc.terminate()
            proc.wait(timeout=20)
        log = (loop.tmp / "collector.log").read_text()
        for secret in (OUR_PD_KEY, AM_TOKEN, OPS_TOKEN, "/services/T000/B000/OURS"):
            assert secret not in log  # credentials never reach the log


def _run_loop(loop: Loop, am: AlertmanagerServer) -> None:
    c = loop.captures
    started = time.time()
    # 1. Prometheus fires GpuwardenGPUFailed: Alertmanager → the collector's webhook.
    prometheus_alert = {
        "labels": PROMETHEUS_ALERT,
        "annotations": {
            "summary": "GPU 0 on gpu-07 has failed",
            "runbook_url": f"{loop.base}/runbooks/gpu-hardware-fault",
        },
        "startsAt": _iso(started),
        "generatorURL": "http://prometheus:9090/graph?g0.expr=gpuwarden_gpu_status",
    }
    status, answer = am.request("POST", "alerts", [prometheus_alert])
    assert status == 200, answer

    # 2. Our Slack message: Block Kit, runbook button, and the runbook link works.
    def ours_firing() -> dict[str, Any] | None:
        return next(
            (
                r["body"]
                for r in c["slack"].requests
                if "CRITICAL: prometheus-gpu-failed — GPU 0 on gpu-07 has failed"
                in r["body"]["blocks"][0]["text"]["text"]
            ),
            None,
        )

    slack = wait_for("our Slack message", ours_firing)
    assert slack_problems(slack) == []
    kinds = [block["type"] for block in slack["blocks"]]
    assert kinds[0] == "header"
    assert "actions" in kinds
    buttons = next(b for b in slack["blocks"] if b["type"] == "actions")["elements"]
    runbook = next(b for b in buttons if b["action_id"] == "runbook")
    assert runbook["text"]["text"] == "Runbook"
    assert runbook["url"].startswith(f"{loop.base}/incidents/")
    assert runbook["url"].endswith("/runbook")
    page_status, page = get(runbook["url"], OPS_TOKEN)  # a reader's page
    assert page_status == 200
    assert b"prometheus-gpu-failed" in page
    assert b"gpu-07" in page
    assert "gpu-07" in _blocks_text(slack)  # the facts carry the node
    assert slack["text"].startswith("CRITICAL: prometheus-gpu-failed")
    incident_id = int(runbook["url"].split("/incidents/")[1].split("/")[0])

    # 3. Our PagerDuty trigger (routed by severity), as Events v2 wants it.
    trigger = wait_for(
        "our PagerDuty trigger",
        lambda: next(
            (r["body"] for r in c["pd"].requests if r["body"]["event_action"] == "trigger"), None
        ),
    )
    assert pagerduty_problems(trigger) == []
    assert trigger["routing_key"] == OUR_PD_KEY
    dedup_key = trigger["dedup_key"]
    assert dedup_key.startswith("gpuwarden-am:prometheus-gpu-failed:")
    assert len(dedup_key) <= 255
    assert trigger["payload"]["severity"] == "critical"
    assert trigger["payload"]["summary"] == "[prometheus-gpu-failed] GPU 0 on gpu-07 has failed"
    assert trigger["payload"]["source"]
    assert trigger["links"][0] == {"href": runbook["url"], "text": "Runbook"}
    assert trigger["client"] == "gpuwarden"

    # 4. Our alert in Alertmanager, fanned out to its webhook, Slack and PagerDuty receivers.
    def am_firing() -> dict[str, Any] | None:
        return next(
            (r for r in c["hook"].requests if r["body"]["status"] == "firing"),
            None,
        )

    hook = wait_for("Alertmanager's webhook notification", am_firing)
    assert hook["headers"]["User-Agent"].startswith("Alertmanager/0.25")
    body = hook["body"]
    assert body["version"] == "4"
    assert body["receiver"] == "team"
    assert body["groupKey"].startswith('{}/{source="gpuwarden"}:')
    (alert,) = body["alerts"]
    assert alert["status"] == "firing"
    assert alert["labels"]["alertname"] == "prometheus-gpu-failed"
    assert alert["labels"]["severity"] == "critical"
    assert alert["labels"]["source"] == "gpuwarden"
    assert alert["labels"]["team"] == "gpu-infra"
    assert alert["labels"]["node"] == "gpu-07"
    fingerprint = alert["labels"]["gpuwarden_fingerprint"]
    assert dedup_key == f"gpuwarden-{fingerprint}"  # one identity across every channel
    assert alert["annotations"]["runbook_url"] == runbook["url"]
    assert alert["annotations"]["summary"] == "GPU 0 on gpu-07 has failed"
    assert alert["generatorURL"] == f"{loop.base}/status/incidents/{incident_id}"
    page_status, page = get(alert["generatorURL"], OPS_TOKEN)  # what a person opens
    assert page_status == 200
    assert b"prometheus-gpu-failed" in page
    assert alert["endsAt"] == "0001-01-01T00:00:00Z"  # firing, as the reference shows
    # ...but we pushed it with an end (now + 3 re-send intervals): if the collector dies, the
    # alert resolves by itself instead of firing forever.
    (held,) = am.alerts(source="gpuwarden")
    ends = datetime.fromisoformat(held["endsAt"].replace("Z", "+00:00")).timestamp()
    assert time.time() < ends <= time.time() + 3 * 2 + 2
    am_slack = wait_for("Alertmanager's Slack message", lambda: c["am_slack"].requests)[0]
    attachment = am_slack["body"]["attachments"][0]
    assert "blocks" not in am_slack["body"]  # Alertmanager 0.25: legacy attachments
    assert attachment["title"] == "GPU 0 on gpu-07 has failed"
    assert attachment["color"] == "danger"
    assert attachment["actions"][0]["url"] == runbook["url"]
    am_trigger = wait_for("Alertmanager's PagerDuty trigger", lambda: c["am_pd"].requests)[0]
    assert am_trigger["problems"] == []
    assert am_trigger["body"]["event_action"] == "trigger"
    assert am_trigger["body"]["routing_key"] == AM_PD_KEY
    assert am_trigger["body"]["links"] == [{"href": runbook["url"], "text": "Runbook"}]
    assert am_trigger["body"]["payload"]["summary"].startswith("[FIRING:1] prometheus-gpu-failed")
    am_dedup = am_trigger["body"]["dedup_key"]

    # The incident is in the API, from the webhook, with the alert's facts.
    status, raw = get(f"{loop.base}/v1/incidents/{incident_id}", OPS_TOKEN)
    assert status == 200
    incident = json.loads(raw)
    assert incident["state"] == "open"
    assert incident["rule_id"] == "prometheus-gpu-failed"
    assert incident["evidence"]["node"] == "gpu-07"
    assert incident["evidence"]["alertname"] == "GpuwardenGPUFailed"

    # 5. Prometheus resolves its alert: every channel gets the resolve.
    resolved = {**prometheus_alert, "endsAt": _iso(time.time())}
    status, answer = am.request("POST", "alerts", [resolved])
    assert status == 200, answer
    pd_resolve = wait_for(
        "our PagerDuty resolve",
        lambda: next(
            (r["body"] for r in c["pd"].requests if r["body"]["event_action"] == "resolve"), None
        ),
    )
    assert pd_resolve == {
        "routing_key": OUR_PD_KEY,
        "event_action": "resolve",
        "dedup_key": dedup_key,
    }
    wait_for(
        "our Slack resolved notice",
        lambda: any(
            r["body"]["blocks"][0]["text"]["text"].startswith("RESOLVED: prometheus-gpu-failed")
            for r in c["slack"].requests
        ),
    )
    am_resolved = wait_for(
        "Alertmanager's resolved notice",
        lambda: next((r for r in c["hook"].requests if r["body"]["status"] == "resolved"), None),
    )
    (gone,) = am_resolved["body"]["alerts"]
    assert gone["status"] == "resolved"
    assert gone["labels"]["gpuwarden_fingerprint"] == fingerprint
    assert gone["endsAt"] != "0001-01-01T00:00:00Z"
    am_pd_resolve = wait_for(
        "Alertmanager's PagerDuty resolve",
        lambda: next(
            (r["body"] for r in c["am_pd"].requests if r["body"]["event_action"] == "resolve"),
            None,
        ),
    )
    assert am_pd_resolve["dedup_key"] == am_dedup
    status, raw = get(f"{loop.base}/v1/incidents/{incident_id}", OPS_TOKEN)
    assert json.loads(raw)["state"] == "resolved"
    # Firing was sent once per route: no re-page while it fired (Alertmanager got re-sends).
    triggers = [r for r in c["pd"].requests if r["body"]["event_action"] == "trigger"]
    assert len(triggers) == 1
