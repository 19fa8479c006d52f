"""Stored XSS and chat-markup injection: hostile values in, inert text out.

Hostile job, model, team, label and annotation values (``<script>``, ``<img onerror>``, Slack's
``<!channel>`` and ``<https://…|…>``, a Markdown link) reach a real collector through its real
receivers: OTLP/HTTP (resource and point attributes; a detection cycle opens hardware-fault
incidents) and ``POST /v1/alertmanager`` (labels and annotations; incidents open directly).
Then:

* the status page, incident pages and runbook pages are loaded in headless Chromium. Each
  payload, if it ever ran, would set ``document.title`` to ``PWNED`` and fetch ``/hit/...``. It
  must not run with the collector's headers (CSP) nor on the same HTML re-served by the test
  without any header (escaping alone must hold), and a control page with the raw payload shows
  the detector works (the test can fail);
* the real Slack, PagerDuty and webhook notifiers deliver to local capture servers: Slack mrkdwn
  carries the control sequences as entities and only our own links, PagerDuty and the webhook
  get the values JSON-encoded exactly as received, and PagerDuty links only our URLs.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from aiohttp import web
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality

from gpuwarden.collector.alerts.model import Notifier
from gpuwarden.collector.alerts.signing import Webhook
from gpuwarden.collector.build import build_service
from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.detect.catalog import load_rules
from gpuwarden.collector.detect.engine import DetectionEngine
from gpuwarden.collector.notify.pagerduty_notifier import PagerDutyNotifier
from gpuwarden.collector.notify.settings import AlertingSettings
from gpuwarden.collector.notify.slack_notifier import SlackNotifier
from gpuwarden.collector.notify.webhook_notifier import WebhookNotifier
from gpuwarden.collector.remediate.approvals import SECRET_ENV
from gpuwarden.collector.remediate.policy import RemediationSettings
from gpuwarden.collector.rules.loader import default_runbooks_dir
from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.storage.records import Incident, IncidentState
from gpuwarden.collector.web.app import create_app
from gpuwarden.collector.web.headers import CONTENT_SECURITY_POLICY
from gpuwarden.collector.web.remediation_setup import create_remediation
from tests.capture_servers import Capture, ServedApp, pagerduty_app, slack_app, webhook_app
from tests.test_remediator import FakeActuator

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
TOKEN = "xss-test-token-0123456789abcdef"
PD_KEY = "k" * 32
NOW = float(int(time.time()))
EXTERNAL_URL = "https://gpuwarden.example"
"""Where people reach the collector: every link in a notification must start with it."""

SCRIPT = "<script>document.title='PWNED';fetch('/hit/script')</script>"
IMG = "<img src=x onerror=\"document.title='PWNED';fetch('/hit/img')\">"
MENTIONS = "<!channel> <!here> <@U024BE7LH> @channel"
SLACK_LINK = "<https://evil.example|click>"
MD_LINK = "[x](https://evil.example)"
APPROVAL_PAGE = "approval needed"
"""In the summary of the remediator's approval requests (pages), as opposed to incident alerts."""
SLACK_CONTROL = ("<!channel>", "<!here>", "<@U024BE7LH>", SLACK_LINK)

RULES = """
version: 1
rules:
  - id: gpu-hardware-fault
    detector: hardware_fault
    description: A GPU was lost.
    parameters: {gpu_lost: true}
    severity: critical
    owner: gpu-infra
    runbook: gpu-hardware-fault.md
    actions: [{kind: drain, mode: approve}]
    routes: ["slack:#sec", "pagerduty:sec", "webhook:sec"]
  - id: hostile-alert
    detector: alertmanager
    description: An alert from the users' own Prometheus rules.
    selector: {labels: {alertname: HostileAlert}}
    parameters: {node_label: node, job_label: job, deployment_label: model}
    severity: critical
    owner: gpu-infra
    runbook: prometheus-gpu-failed.md
    actions: [{kind: drain, mode: approve}]
    routes: ["slack:#sec", "pagerduty:sec", "webhook:sec"]
"""


def _attr(key: str, value: str) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(string_value=value))


def otlp_request() -> bytes:
    """A workload announcing hostile job/model/team names, and two GPUs with hostile ids whose
    ``hw.status`` goes from ok to failed (the hardware-fault rule opens one incident each)."""
    request = ExportMetricsServiceRequest()
    rm = request.resource_metrics.add()
    resource = {
        "host.name": "node-otlp",
        "job.id": "4242",
        "service.name": SCRIPT,
        "gpuwarden.model.name": IMG,
        "gpuwarden.team": MENTIONS,
    }
    rm.resource.attributes.extend(_attr(k, v) for k, v in resource.items())
    metric = rm.scope_metrics.add().metrics.add()
    metric.name, metric.unit = "hw.status", "1"
    metric.sum.is_monotonic = False
    metric.sum.aggregation_temporality = AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
    for gpu in (f"GPU-{IMG}{MD_LINK}", f"GPU-{SCRIPT}{SLACK_LINK}"):
        for t, now_state in ((NOW - 40, "ok"), (NOW - 20, "failed")):
            for state in ("ok", "degraded", "failed"):
                dp = metric.sum.data_points.add()
                dp.time_unix_nano = int(t * 1e9)
                dp.as_double = 1.0 if state == now_state else 0.0
                dp.attributes.extend(
                    [_attr("hw.id", gpu), _attr("hw.type", "gpu"), _attr("hw.state", state)]
                )
    return request.SerializeToString()


def alertmanager_payload() -> dict[str, Any]:
    """An Alertmanager webhook message whose labels and annotations are hostile."""
    return {
        "version": "4",
        "status": "firing",
        "receiver": "gpuwarden",
        "groupKey": "{}:{}",
        "alerts": [
            {
                "status": "firing",
                "labels": {
                    "alertname": "HostileAlert",
                    "node": "node-am",
                    "job": SCRIPT,
                    "model": IMG,
                    "team": MENTIONS,
                    "pod": SLACK_LINK,
                },
                "annotations": {
                    "summary": f"{MD_LINK} {SCRIPT}",
                    "description": f"{IMG} {MENTIONS} {SLACK_LINK} {MD_LINK}",
                    "runbook_url": "javascript:alert(1)",
                },
                "startsAt": "2025-01-01T00:00:00Z",
                "endsAt": "0001-01-01T00:00:00Z",
                "fingerprint": "0123456789abcdef",
            }
        ],
    }


def post(url: str, body: bytes, content_type: str) -> int:
    request = urllib.request.Request(  # noqa: S310 - a loopback URL the test built
        url,
        data=body,
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": content_type},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310
        return int(response.status)


def get(url: str) -> tuple[int, dict[str, str], str]:
    with urllib.request.urlopen(url, timeout=30) as response:  # noqa: S310 - loopback
        return int(response.status), dict(response.headers), response.read().decode()


@dataclass
class Fleet:
    service: CollectorService
    collector: ServedApp
    slack: Capture
    pagerduty: Capture
    webhook: Capture
    incidents: list[Incident]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """A collector with the hostile values ingested, its incidents open, and its alerts sent
    (built once: the tests below only read it)."""
    tmp_path = tmp_path_factory.mktemp("xss")
    clock = lambda: NOW  # noqa: E731
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "rules.yaml").write_text(RULES)
    rules = load_rules([tmp_path / "rules"], runbooks_dir=default_runbooks_dir())
    service = build_service(CollectorConfig(database=tmp_path / "c.db"), clock=clock)
    captures = {"slack": Capture(), "pagerduty": Capture(), "webhook": Capture()}
    fakes = [
        ServedApp(slack_app(captures["slack"])),
        ServedApp(pagerduty_app(captures["pagerduty"])),
        ServedApp(webhook_app(captures["webhook"])),
    ]
    slack_url, pd_url, hook_url = (fake.url for fake in fakes)
    notifiers: dict[str, Notifier] = {
        "slack": SlackNotifier({"#sec": f"{slack_url}/services/T0/B0/xss"}),
        "pagerduty": PagerDutyNotifier({"sec": PD_KEY}, events_url=f"{pd_url}/v2/enqueue"),
        "webhook": WebhookNotifier([Webhook("sec", f"{hook_url}/hook", b"s" * 32)]),
    }
    remediation = create_remediation(
        service.storage,
        rules.enabled(),
        RemediationSettings(external_url=EXTERNAL_URL),
        actuators=[FakeActuator(kinds=frozenset({"drain"}))],  # drains wait for approval
        notifiers=notifiers,
        runbooks_dir=default_runbooks_dir(),
        environ={SECRET_ENV: "approval-secret-" + "x" * 32},
        alerting=AlertingSettings(),
        clock=clock,
    )
    # open pages (auth: none) so that Chromium loads them as they are; who may see them is
    # tests/test_route_roles.py's subject, what they show is this test's
    config = CollectorConfig(allow_unauthenticated=True)
    app = create_app(config, service=service, background=False, remediation=remediation)
    collector = ServedApp(app)
    try:
        base = collector.url
        assert post(f"{base}/v1/metrics", otlp_request(), "application/x-protobuf") == 200
        payload = json.dumps(alertmanager_payload()).encode()
        assert post(f"{base}/v1/alertmanager", payload, "application/json") == 200
        DetectionEngine(
            service.detection_view, rules, storage=service.storage, clock=clock
        ).run_cycle(now=NOW)
        remediation.remediator.tick()
        assert remediation.dispatcher is not None
        remediation.dispatcher.tick()
        incidents = service.storage.incidents()
        yield Fleet(
            service,
            collector,
            captures["slack"],
            captures["pagerduty"],
            captures["webhook"],
            incidents,
        )
    finally:
        collector.stop()
        for fake in fakes:
            fake.stop()


def test_hostile_values_opened_incidents_through_both_receivers(fleet: Fleet) -> None:
    """The premise: both receivers stored the hostile values (else nothing below is tested)."""
    by_rule = {i.rule_id for i in fleet.incidents}
    assert by_rule == {"gpu-hardware-fault", "hostile-alert"}
    assert len(fleet.incidents) == 3  # two lost GPUs, one alert
    stored = json.dumps([i.evidence for i in fleet.incidents], default=dict)
    for value in (SCRIPT, IMG, MD_LINK, SLACK_LINK, MENTIONS):
        assert json.dumps(value)[1:-1] in stored


def _mrkdwn_texts(body: dict[str, Any]) -> list[str]:
    """Every text Slack parses as mrkdwn: the fallback ``text`` and each mrkdwn object."""
    texts = [str(body["text"])]
    for block in body["blocks"]:
        for obj in [block.get("text"), *block.get("fields", []), *block.get("elements", [])]:
            if isinstance(obj, dict) and obj.get("type") == "mrkdwn":
                assert obj.get("verbatim") is True, obj  # no auto-linking, no mention parsing
                texts.append(str(obj["text"]))
    return texts


def test_slack_gets_control_sequences_as_entities_and_only_our_links(fleet: Fleet) -> None:
    bodies = [r["body"] for r in fleet.slack.requests]
    pages = [b for b in bodies if APPROVAL_PAGE in b["text"]]
    assert len(bodies) - len(pages) == len(fleet.incidents)  # one alert per incident
    assert pages  # and the approval requests of the drains
    assert all(r["problems"] == [] for r in fleet.slack.requests)
    joined = "\n".join(t for body in bodies for t in _mrkdwn_texts(body))
    # every hostile value arrived, as text: Slack's control characters as entities
    for raw in (SCRIPT, IMG, MENTIONS, SLACK_LINK):
        escaped = raw.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        assert escaped in joined
    for control in SLACK_CONTROL:
        assert control not in joined
    # the only <...> left in mrkdwn are the runbook links we add, to our own collector
    sequences = re.findall(r"<([^<>]*)>", joined)
    assert sequences
    assert all(re.fullmatch(rf"{re.escape(EXTERNAL_URL)}/incidents/\d+/runbook\|runbook", s)
               for s in sequences), sequences  # fmt: skip
    buttons = [
        element["url"]
        for body in bodies
        for block in body["blocks"]
        if block["type"] == "actions"
        for element in block["elements"]
    ]
    assert any(url.startswith(f"{EXTERNAL_URL}/approve/") for url in buttons)
    assert all(url.startswith(f"{EXTERNAL_URL}/") for url in buttons)
    # plain_text (header, buttons) is never parsed by Slack for mentions or links
    headers = [b["text"] for body in bodies for b in body["blocks"] if b["type"] == "header"]
    assert all(h["type"] == "plain_text" for h in headers)


def test_pagerduty_and_webhook_get_values_json_encoded_and_only_our_links(fleet: Fleet) -> None:
    events = [r["body"] for r in fleet.pagerduty.requests if r["body"]["event_action"] == "trigger"]
    alerts = [e for e in events if APPROVAL_PAGE not in e["payload"]["summary"]]
    assert len(alerts) == len(fleet.incidents)
    assert all(r["problems"] == [] for r in fleet.pagerduty.requests)
    am_event = next(e for e in alerts if e["payload"]["class"] == "hostile-alert")
    details = am_event["payload"]["custom_details"]
    # the values round-trip exactly: JSON-encoded, not built as text (nor double-escaped)
    assert details["job"] == SCRIPT
    assert details["model"] == IMG
    assert details["team"] == MENTIONS
    assert am_event["payload"]["summary"] == f"[hostile-alert] {MD_LINK} {SCRIPT}"
    assert any("/approve/" in link["href"] for event in events for link in event["links"])
    for event in events:
        assert "images" not in event
        hrefs = [link["href"] for link in event["links"]]
        assert hrefs
        assert all(href.startswith(f"{EXTERNAL_URL}/") for href in hrefs), hrefs
        assert event["client_url"].startswith(f"{EXTERNAL_URL}/")
    hooks = [r["body"] for r in fleet.webhook.requests if APPROVAL_PAGE not in r["body"]["summary"]]
    assert len(hooks) == len(fleet.incidents)
    am_hook = next(h for h in hooks if h["rule"] == "hostile-alert")
    assert am_hook["labels"]["job"] == SCRIPT
    assert am_hook["labels"]["model"] == IMG
    assert am_hook["labels"]["team"] == MENTIONS
    assert am_hook["facts"]["alert_description"] == f"{IMG} {MENTIONS} {SLACK_LINK} {MD_LINK}"
    assert am_hook["summary"] == f"{MD_LINK} {SCRIPT}"
    otlp_hooks = [h for h in hooks if h["rule"] == "gpu-hardware-fault"]
    assert {h["labels"]["gpu"] for h in otlp_hooks} == {
        f"GPU-{IMG}{MD_LINK}",
        f"GPU-{SCRIPT}{SLACK_LINK}",
    }
    for hook in hooks:
        for key in ("runbook_url", "incident_url"):
            assert hook[key].startswith(f"{EXTERNAL_URL}/")


# The pages, in a real browser -----------------------------------------------------------------

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--virtual-time-budget=5000",  # let load, error events and fetches run before the dump
    "--enable-logging=stderr",
    "--v=0",
)


class Elements(HTMLParser):
    """What the browser built: live elements (not text that merely looks like them)."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.handlers: list[str] = []
        self.hrefs: list[str] = []
        self.title = ""
        self.text: list[str] = []
        self._in_title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.handlers += [name for name, _ in attrs if name.startswith("on")]
        self.hrefs += [value or "" for name, value in attrs if name in ("href", "src")]
        self._in_title = tag == "title"

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self._in_title = False

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title += data
        self.text.append(data)


def browse(url: str, profile: Path) -> tuple[Elements, str]:
    """The DOM headless Chromium built for ``url`` (parsed), and its console log."""
    assert CHROMIUM is not None
    run = subprocess.run(
        [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--dump-dom", url],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    elements = Elements()
    elements.feed(run.stdout)
    elements.close()
    return elements, run.stderr


@dataclass
class Mirror:
    """A plain server that re-serves pages without any security header and records each
    ``/hit`` as ``<page>:<payload>`` (the page from the fetch's ``Referer``)."""

    pages: dict[str, str]
    hits: list[str]


def mirror_app(mirror: Mirror) -> web.Application:
    async def page(request: web.Request) -> web.Response:
        text = mirror.pages.get(request.match_info["name"])
        if text is None:
            raise web.HTTPNotFound
        return web.Response(text=text, content_type="text/html")

    async def hit(request: web.Request) -> web.Response:
        page = request.headers.get("Referer", "").rsplit("/", 1)[-1]
        mirror.hits.append(f"{page}:{request.match_info['what']}")
        return web.Response(text="hit")

    app = web.Application()
    app.router.add_get("/page/{name}", page)
    app.router.add_get("/hit/{what}", hit)
    return app


def _pages(fleet: Fleet) -> dict[str, str]:
    """The pages that show the hostile values: status, and each path's incident and runbook."""
    am = next(i for i in fleet.incidents if i.rule_id == "hostile-alert")
    otlp = next(i for i in fleet.incidents if i.rule_id == "gpu-hardware-fault")
    return {
        "status": "/status",
        "am-incident": f"/status/incidents/{am.incident_id}",
        "am-runbook": f"/incidents/{am.incident_id}/runbook",
        "otlp-incident": f"/status/incidents/{otlp.incident_id}",
        "otlp-runbook": f"/incidents/{otlp.incident_id}/runbook",
    }


def _assert_inert(name: str, page: Elements) -> None:
    assert "PWNED" not in page.title, name
    assert "script" not in page.tags, name
    assert "img" not in page.tags, name
    assert page.handlers == [], name
    assert not [h for h in page.hrefs if "evil.example" in h or h.startswith("javascript:")], name
    shown = "".join(page.text)
    assert SCRIPT in shown or IMG in shown, f"{name}: the hostile value is not shown as text"


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install chromium)")
def test_pages_show_hostile_values_as_text_and_run_no_script(fleet: Fleet, tmp_path: Path) -> None:
    mirror = Mirror(pages={}, hits=[])
    served = ServedApp(mirror_app(mirror))
    try:
        # control: the raw payload on a page without headers runs (so the checks below can fail)
        mirror.pages["control"] = f"<!doctype html><title>control</title><body>{SCRIPT}{IMG}"
        control, _ = browse(f"{served.url}/page/control", tmp_path / "p0")
        assert control.title == "PWNED"
        for i, (name, path) in enumerate(_pages(fleet).items(), start=1):
            status, headers, body = get(f"{fleet.collector.url}{path}")
            assert status == 200
            assert headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
            assert headers["X-Frame-Options"] == "DENY"
            assert headers["X-Content-Type-Options"] == "nosniff"
            assert headers["Referrer-Policy"] == "no-referrer"
            assert headers["Cache-Control"] == "no-store"
            # with the collector's headers (CSP): nothing runs, nothing is refused but payloads
            page, console = browse(f"{fleet.collector.url}{path}", tmp_path / f"p{i}")
            _assert_inert(name, page)
            assert "Content Security Policy" not in console, f"{name}: {console}"
            # the same HTML without any header: escaping alone keeps it inert
            mirror.pages[name] = body
            page, _ = browse(f"{served.url}/page/{name}", tmp_path / f"m{i}")
            _assert_inert(f"{name} (mirrored)", page)
        assert [hit for hit in mirror.hits if not hit.startswith("control:")] == []
        # the approval page works under the same policy: its form, its stylesheet, no violation
        link = next(
            element["url"]
            for request in fleet.slack.requests
            for block in request["body"]["blocks"]
            if block["type"] == "actions"
            for element in block["elements"]
            if element["action_id"].startswith("approve")
        )
        approval = f"{fleet.collector.url}{link.removeprefix(EXTERNAL_URL)}"
        assert get(approval)[1]["Cache-Control"] == "no-store"
        page, console = browse(approval, tmp_path / "approval")
        assert {"form", "button"} <= set(page.tags)
        assert "/static/gpuwarden.css" in page.hrefs
        assert "Content Security Policy" not in console, console
    finally:
        served.stop()


def test_runbook_shows_markdown_from_data_as_text(fleet: Fleet) -> None:
    """An annotation's Markdown link is text on the runbook page; the author's Markdown is not."""
    am = next(i for i in fleet.incidents if i.rule_id == "hostile-alert")
    _, _, body = get(f"{fleet.collector.url}/incidents/{am.incident_id}/runbook")
    page = Elements()
    page.feed(body)
    shown = "".join(page.text)
    assert MD_LINK in shown  # the annotation, verbatim
    assert "evil.example" not in " ".join(page.hrefs)
    assert {"h2", "li", "code"} <= set(page.tags)  # the author's Markdown is Markdown
    status, headers, css = get(f"{fleet.collector.url}/static/gpuwarden.css")
    assert status == 200
    assert headers["Content-Type"].startswith("text/css")
    assert "body.doc" in css


# The runbook renderer: values fill the author's Markdown, never change it ----------------------

NO_MARKS = str.maketrans({"\ue000": "\ufffd", "\ue001": "\ufffd"})
"""The renderer's slot marks, which it replaces in values."""

RUNBOOK = """# Fault on {{ node.name }}

Job `{{ job.key }}` of team {{ job.team }}.

| node | job |
|---|---|
| {{ node.name }} | {{ job.key }} |

- [the job's dashboard](https://grafana.example/d/x?var-job={{ job.key }})
- [the alert's own link]({{ evidence.alert_runbook_url }})
"""


@pytest.mark.parametrize(
    ("node", "job", "team", "link", "expect_link"),
    [
        # a newline and "#" would start a heading; "|" would split the table row
        ("n1\n# owned", "a|b", "ml", "https://wiki.example/rb", "https://wiki.example/rb"),
        # a Markdown link and raw HTML in text positions, a javascript: URL as a link target
        (MD_LINK, SCRIPT, IMG, "javascript:alert(1)", None),
        # Slack's syntax, and our own slot mark smuggled into a value
        (SLACK_LINK, "\ue0000\ue001", MENTIONS, "/local/path", None),
    ],
)
def test_runbook_values_cannot_change_the_authors_markdown(
    tmp_path: Path, node: str, job: str, team: str, link: str, expect_link: str | None
) -> None:
    from gpuwarden.collector.alerts.runbooks import Links, RunbookRenderer, runbook_context

    (tmp_path / "r.md").write_text(RUNBOOK)
    incident = Incident(
        fingerprint="f",
        rule_id="r",
        severity="critical",
        state=IncidentState.OPEN,
        first_seen=NOW,
        last_seen=NOW,
        evidence={"node": node, "job": job, "team": team, "alert_runbook_url": link},
        incident_id=1,
    )
    context = runbook_context(None, Links(), incident=incident)
    page = Elements()
    page.feed(RunbookRenderer(tmp_path).html("r.md", context, title="t"))
    # the structure is the author's: one h1, one table row of two cells, two list items
    assert page.tags.count("h1") == 1
    assert page.tags.count("td") == 4
    assert page.tags.count("li") >= 2
    assert {"script", "img"}.isdisjoint(page.tags)
    assert page.handlers == []
    shown = "".join(page.text)
    for value in (node.replace("\n", " "), job, team):
        assert value in shown.replace("\n", " ") or "\ue000" in value
    assert "\ue000" not in shown  # no slot mark leaks, a smuggled one is replaced
    links = [h for h in page.hrefs if h != "/static/gpuwarden.css"]
    # a value inside the author's URL is percent-encoded into it
    assert links[0] == "https://grafana.example/d/x?var-job=" + quote(
        job.translate(NO_MARKS), safe=""
    )
    # a target that is a value alone is a link only when it is an http(s) URL
    assert links[1:] == ([expect_link] if expect_link else [])


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/v1/incidents", 200),  # the API (auth: none here)
        ("/v1/metrics", 405),  # the router's: GET on a POST route
        ("/status/incidents/abc", 400),  # a handler's HTTPException
        ("/no/such/route", 404),  # the router's
        ("/static/gpuwarden.css", 200),
        ("/metrics", 200),
    ],
)
def test_every_response_carries_the_security_headers(fleet: Fleet, path: str, status: int) -> None:
    try:
        with urllib.request.urlopen(f"{fleet.collector.url}{path}", timeout=30) as response:  # noqa: S310
            answered, headers = int(response.status), response.headers
    except urllib.error.HTTPError as refused:
        answered, headers = refused.code, refused.headers
    assert answered == status
    assert headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
    assert headers["X-Frame-Options"] == "DENY"
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert headers["Referrer-Policy"] == "no-referrer"
    if path.startswith("/static/"):
        assert headers["Cache-Control"].startswith("public")  # the stylesheet may be cached
