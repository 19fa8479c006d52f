"""Remediation over HTTP (runbook pages, approval links, the /v1 API) with the real aiohttp app,
and the ``gpuwarden incidents`` / ``gpuwarden actions`` commands against SQLite and the API."""

from __future__ import annotations

import argparse
import asyncio
import io
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from aiohttp import web

from gpuwarden.collector.alerts.runbooks import Links, RunbookRenderer
from gpuwarden.collector.cli.actions import (
    add_actions_parser,
    add_incidents_parser,
    run_actions,
    run_incidents,
)
from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.credentials import Role, TokenTable, credential
from gpuwarden.collector.remediate.approvals import Approvals, TokenSigner
from gpuwarden.collector.remediate.policy import PolicyConfig
from gpuwarden.collector.remediate.remediator import ActionState, Remediator
from gpuwarden.collector.rules.loader import default_runbooks_dir
from gpuwarden.collector.rules.model import ActionMode
from gpuwarden.collector.storage.records import IncidentState
from gpuwarden.collector.storage.sqlite import SqliteStorage
from gpuwarden.collector.web.app import create_app
from gpuwarden.collector.web.remediation_setup import Remediation, create_remediation
from tests.test_remediator import (
    SECRET,
    FakeActuator,
    FakeClock,
    RecordingNotifier,
    make_rule,
    open_incident,
    pages_dispatcher,
)

TOKEN = "api-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


async def csrf_of(client, token: str, headers: dict[str, str] = AUTH) -> str:
    """The CSRF token of a valid link's approval page (bound to the caller, not the link)."""
    page = await client.get(f"/approve/{token}", headers=headers)
    found = CSRF.search(await page.text())
    assert found is not None, await page.text()
    return found.group(1)


async def confirm(client, token: str, csrf: str, headers: dict[str, str] = AUTH):
    """What the approval page's Approve button sends: its CSRF token, from its own origin."""
    origin = str(client.make_url("/")).rstrip("/")
    data = {"csrf_token": csrf}
    return await client.post(f"/approve/{token}", data=data, headers={**headers, "Origin": origin})


OPERATOR_TOKENS = TokenTable((credential(TOKEN, Role.OPERATOR, "alice"),))


@dataclass
class Setup:
    storage: SqliteStorage
    clock: FakeClock
    actuator: FakeActuator
    slack: RecordingNotifier
    pager: RecordingNotifier
    remediator: Remediator
    approvals: Approvals
    path: Path

    def approval_token(self) -> str:
        pages_dispatcher(self.storage, self.clock, self.slack, self.pager).tick()
        url = self.slack.sent[-1][0].actions[0].approval_url
        assert url is not None
        return url.rsplit("/", 1)[1]


def build(tmp_path: Path, runbooks_dir: Path | None = None, **config: object) -> Setup:
    clock = FakeClock()
    path = tmp_path / "collector.db"
    storage = SqliteStorage(path, clock=clock)
    actuator, slack, pager = FakeActuator(), RecordingNotifier("slack"), RecordingNotifier()
    approvals = Approvals(storage, TokenSigner(SECRET, clock=clock), ttl_seconds=600, clock=clock)
    rules = [make_rule(mode=ActionMode.APPROVE)]
    remediator = Remediator(
        storage,
        rules,
        [actuator],
        config=PolicyConfig(**config),  # type: ignore[arg-type]
        outbox=pages_dispatcher(storage, clock, slack, pager),
        escalation_routes=("pagerduty:oncall",),
        approvals=approvals,
        links=Links(base_url="http://127.0.0.1:4318"),
        clock=clock,
    )
    return Setup(storage, clock, actuator, slack, pager, remediator, approvals, path)


def make_app(setup: Setup, runbooks_dir: Path | None = None) -> web.Application:
    rules = {"idle-gpu": make_rule(mode=ActionMode.APPROVE)}
    return create_app(
        CollectorConfig(tokens=OPERATOR_TOKENS),
        remediation=Remediation(
            storage=setup.storage,
            remediator=setup.remediator,
            renderer=RunbookRenderer(runbooks_dir or default_runbooks_dir()),
            links=Links(base_url="http://127.0.0.1:4318"),
            rules=rules,
            approvals=setup.approvals,
        ),
    )


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[Setup]:
    s = build(tmp_path, dry_run=False)
    yield s
    s.storage.close()


@pytest.fixture
async def client(aiohttp_client, setup):
    return await aiohttp_client(make_app(setup))


def awaiting(setup: Setup) -> int:
    open_incident(setup.storage, setup.clock, extra={"summary": "<script>x</script> idle"})
    setup.remediator.tick()
    (row,) = setup.storage.actions(states=[ActionState.AWAITING_APPROVAL])
    assert row.action_id is not None
    return row.action_id


# Runbooks --------------------------------------------------------------------------------------


async def test_rule_runbooks_have_stable_urls(client) -> None:
    response = await client.get("/runbooks/idle-gpu", headers=AUTH)
    assert response.status == 200
    assert response.content_type == "text/html"
    page = await response.text()
    assert "<h2>What automation does</h2>" in page
    markdown = await client.get("/runbooks/idle-gpu?format=md", headers=AUTH)
    assert markdown.content_type == "text/markdown"
    assert (await markdown.text()).startswith("# idle-gpu")
    # Runbooks without a detection rule (Prometheus alerts link them) are served by file name.
    assert (await client.get("/runbooks/collector-health", headers=AUTH)).status == 200
    for bad in ("nope", "_incident", "..%2Fpyproject", "IDLE-GPU"):
        assert (await client.get(f"/runbooks/{bad}", headers=AUTH)).status == 404, bad


async def test_incident_runbook_has_the_incident_facts_escaped(client, setup) -> None:
    awaiting(setup)
    (incident,) = setup.storage.incidents()
    response = await client.get(f"/incidents/{incident.incident_id}/runbook", headers=AUTH)
    assert response.status == 200
    page = await response.text()
    assert "slurm:test:101" in page
    assert "$1.50" in page
    assert "requeue on <code>slurm:test:101</code> (mode approve): awaiting_approval" in page
    assert "<script>" not in page
    assert "&lt;script&gt;" in page
    assert (await client.get("/incidents/999/runbook", headers=AUTH)).status == 404
    assert (await client.get("/incidents/abc/runbook", headers=AUTH)).status == 400


async def test_a_broken_runbook_is_a_clear_500_not_a_crash(aiohttp_client, setup, tmp_path):
    folder = tmp_path / "runbooks"
    folder.mkdir()
    (folder / "idle-gpu.md").write_text("# idle\n\n{{ job.nmae }}\n")
    client = await aiohttp_client(make_app(setup, folder))
    response = await client.get("/runbooks/idle-gpu", headers=AUTH)
    assert response.status == 500
    assert re.search(r"idle-gpu\.md:3: error: .*nmae", await response.text())
    assert (await client.get("/v1/breaker", headers=AUTH)).status == 200  # still serving


# Approval links --------------------------------------------------------------------------------


async def test_get_never_approves_and_post_approves_once(client, setup) -> None:
    action_id = awaiting(setup)
    token = setup.approval_token()
    for _ in range(3):  # chat apps prefetch links
        page = await client.get(f"/approve/{token}", headers=AUTH)
        assert page.status == 200
        assert 'method="post"' in await page.text()
        assert page.headers["Cache-Control"] == "no-store"
        assert page.headers["Referrer-Policy"] == "same-origin"
    assert (await client.head(f"/approve/{token}", headers=AUTH)).status == 200
    row = setup.storage.action(action_id)
    assert row is not None
    assert row.state == ActionState.AWAITING_APPROVAL
    assert setup.actuator.calls == []

    csrf = await csrf_of(client, token)
    done = await confirm(client, token, csrf)
    assert done.status == 200
    assert "verifying" in await done.text()
    assert len(setup.actuator.real_calls) == 1
    again = await confirm(client, token, csrf)
    assert again.status == 410
    assert (await client.get(f"/approve/{token}", headers=AUTH)).status == 410
    assert len(setup.actuator.real_calls) == 1
    assert any(e.actor == "alice" for e in setup.storage.audit())  # the token's person


async def test_expired_and_forged_links_do_nothing(client, setup) -> None:
    awaiting(setup)
    token = setup.approval_token()
    forged = token[:-3] + ("abc" if not token.endswith("abc") else "xyz")
    csrf = await csrf_of(client, token)
    assert (await client.get(f"/approve/{forged}", headers=AUTH)).status == 403
    assert (await confirm(client, forged, csrf)).status == 403
    assert (await client.get("/approve/not-a-token", headers=AUTH)).status == 400
    setup.clock.now += 601
    assert (await client.get(f"/approve/{token}", headers=AUTH)).status == 410
    assert (await confirm(client, token, csrf)).status == 410
    assert setup.actuator.calls == []


async def test_an_expired_action_cannot_be_approved_by_link_or_api(client, setup) -> None:
    action_id = awaiting(setup)
    token = setup.approval_token()
    csrf = await csrf_of(client, token)
    (incident,) = setup.storage.incidents()
    resolved = replace(incident, state=IncidentState.RESOLVED, resolved_time=setup.clock.now)
    assert setup.storage.update_incident(resolved)
    setup.clock.now += 30
    assert setup.remediator.tick().expired == 1

    page = await client.get(f"/approve/{token}", headers=AUTH)
    assert page.status == 410  # like a used or expired link
    assert "no longer awaits approval" in await page.text()
    post = await confirm(client, token, csrf)
    assert post.status == 410
    assert "Not approved" in await post.text()
    api = await client.post(f"/v1/actions/{action_id}/approve", headers=AUTH)
    assert api.status == 409
    assert "expired (incident" in (await api.json())["error"]
    row = setup.storage.action(action_id)
    assert row is not None
    assert row.state == ActionState.EXPIRED
    assert setup.actuator.calls == []
    listed = await client.get("/v1/actions?state=expired", headers=AUTH)
    assert [a["action_id"] for a in (await listed.json())["actions"]] == [action_id]


# API -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/incidents"),
        ("GET", "/v1/incidents/1"),
        ("GET", "/v1/actions"),
        ("GET", "/v1/actions/1"),
        ("POST", "/v1/actions/1/approve"),
        ("POST", "/v1/actions/1/reject"),
        ("GET", "/v1/breaker"),
        ("POST", "/v1/breaker/reset"),
    ],
)
async def test_api_routes_need_the_bearer_token(client, setup, method, path) -> None:
    awaiting(setup)
    for headers in ({}, {"Authorization": "Bearer wrong-token-0123456789"}):
        response = await client.request(method, path, headers=headers)
        assert response.status == 401
    assert setup.storage.actions()[0].state == ActionState.AWAITING_APPROVAL


async def test_api_lists_approves_and_rejects(client, setup) -> None:
    action_id = awaiting(setup)
    incidents = await (await client.get("/v1/incidents?state=open", headers=AUTH)).json()
    assert [i["rule_id"] for i in incidents["incidents"]] == ["idle-gpu"]
    shown = await (await client.get("/v1/incidents/1", headers=AUTH)).json()
    assert shown["actions"][0]["state"] == "awaiting_approval"
    assert shown["runbook_url"] == "http://127.0.0.1:4318/incidents/1/runbook"
    listed = await client.get("/v1/actions?state=awaiting_approval", headers=AUTH)
    assert [a["action_id"] for a in (await listed.json())["actions"]] == [action_id]
    approved = await client.post(f"/v1/actions/{action_id}/approve", headers=AUTH)
    assert approved.status == 200
    assert (await approved.json())["state"] == "verifying"
    assert len(setup.actuator.real_calls) == 1
    again = await client.post(f"/v1/actions/{action_id}/approve", headers=AUTH)
    assert again.status == 409
    assert (await client.post("/v1/actions/99/reject", headers=AUTH)).status == 404
    assert any(e.actor == "alice" and e.verdict == "human_approved" for e in setup.storage.audit())


async def test_api_rejects_and_resets_the_breaker(client, setup) -> None:
    action_id = awaiting(setup)
    rejected = await client.post(f"/v1/actions/{action_id}/reject", headers=AUTH)
    assert (await rejected.json())["state"] == "rejected"
    assert (await client.post("/v1/breaker/reset", headers=AUTH)).status == 409
    assert (await (await client.get("/v1/breaker", headers=AUTH)).json())["state"] == "closed"
    from gpuwarden.collector.storage.base import BreakerRecord

    setup.storage.set_breaker(
        BreakerRecord("global", "open", updated_at=1.0, tripped_at=1.0), expect_state="closed"
    )
    assert (await client.post("/v1/breaker/reset", headers=AUTH)).status == 200
    assert (await (await client.get("/v1/breaker", headers=AUTH)).json())["state"] == "closed"
    assert setup.actuator.calls == []


# CLI -------------------------------------------------------------------------------------------


def cli(argv: list[str], environ: dict[str, str] | None = None) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="gpuwarden")
    sub = parser.add_subparsers(dest="command", required=True)
    add_incidents_parser(sub)
    add_actions_parser(sub)
    args = parser.parse_args(argv)
    out, err = io.StringIO(), io.StringIO()
    run = run_incidents if args.command == "incidents" else run_actions
    code = run(args, environ or {}, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_cli_against_the_sqlite_file(setup) -> None:
    action_id = awaiting(setup)
    db = str(setup.path)
    code, out, _ = cli(["incidents", "list", "--db", db])
    assert code == 0
    assert "idle-gpu" in out
    code, out, _ = cli(["actions", "list", "--db", db, "--state", "awaiting_approval"])
    assert re.search(rf"^\s+{action_id}\s+awaiting_approval\s+requeue", out, re.M)
    code, out, _ = cli(["actions", "approve", str(action_id), "--db", db, "--as", "carol"])
    assert code == 0
    assert "approved" in out
    assert setup.actuator.calls == []  # the collector runs it at its next pass
    setup.remediator.tick()
    assert len(setup.actuator.real_calls) == 1
    code, _, err = cli(["actions", "reject", str(action_id), "--db", db])
    assert code == 1
    assert "cannot be rejected" in err
    code, _, err = cli(["actions", "reset-breaker", "--db", db])
    assert (code, err.strip()) == (1, "gpuwarden actions: the breaker is not open")
    code, _, err = cli(["incidents", "show", "42", "--db", db])
    assert (code, err.strip()) == (1, "gpuwarden incidents: no incident 42")
    assert any(e.actor == "carol" for e in setup.storage.audit())


async def test_cli_against_the_api(aiohttp_server, setup) -> None:
    server = await aiohttp_server(make_app(setup))
    url = str(server.make_url("/")).rstrip("/")
    action_id = await asyncio.to_thread(awaiting, setup)
    env = {"GPUWARDEN_API_TOKEN": TOKEN}

    def run(argv: list[str], environ: dict[str, str] = env) -> tuple[int, str, str]:
        return cli(argv, environ)

    code, out, _ = await asyncio.to_thread(run, ["actions", "show", str(action_id), "--url", url])
    assert code == 0
    assert '"state": "awaiting_approval"' in out
    code, _, err = await asyncio.to_thread(run, ["actions", "list", "--url", url], {})
    assert (code, "needs a token" in err) == (1, True)
    bad = {"GPUWARDEN_API_TOKEN": "wrong-token-0123456789"}
    code, _, err = await asyncio.to_thread(run, ["actions", "list", "--url", url], bad)
    assert (code, "401" in err) == (1, True)
    code, out, _ = await asyncio.to_thread(
        run, ["actions", "approve", str(action_id), "--url", url]
    )
    assert code == 0
    assert "verifying" in out
    assert len(setup.actuator.real_calls) == 1
    code, out, _ = await asyncio.to_thread(run, ["incidents", "list", "--url", url, "--json"])
    assert '"rule_id": "idle-gpu"' in out
    assert TOKEN not in out


async def test_create_remediation_from_settings(aiohttp_client, tmp_path) -> None:
    from gpuwarden.collector.remediate.approvals import SECRET_ENV
    from gpuwarden.collector.remediate.policy import RemediationSettings

    settings = RemediationSettings.from_mapping(
        {"external_url": "https://gw.example", "escalation_routes": ["pagerduty:oncall"]}, "x"
    )
    with SqliteStorage(tmp_path / "db") as storage:

        def make(environ: dict[str, str]) -> Remediation:
            return create_remediation(
                storage,
                [make_rule(mode=ActionMode.APPROVE)],
                settings,
                actuators=[FakeActuator()],
                notifiers={},
                runbooks_dir=default_runbooks_dir(),
                environ=environ,
            )

        with_links = make({SECRET_ENV: "z" * 40})
        assert with_links.approvals is not None
        assert with_links.remediator.config.dry_run
        assert with_links.links.runbook_url("idle-gpu") == "https://gw.example/runbooks/idle-gpu"
        with pytest.raises(ValueError, match="32"):
            make({SECRET_ENV: "short"})
        without = make({})
        assert without.approvals is None
        app = create_app(CollectorConfig(tokens=OPERATOR_TOKENS), remediation=without)
        client = await aiohttp_client(app)
        assert (await client.get("/approve/v1.1.2.3.4", headers=AUTH)).status == 404
        assert (await client.get("/runbooks/idle-gpu", headers=AUTH)).status == 200
