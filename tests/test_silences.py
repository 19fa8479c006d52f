"""Operators' silences: the real dispatcher holding notices to a local Slack, sending them once
when the silence ends; the remediator holding actions only when told; the ``/v1/silences``
API per role, its validation and audit; and the ``gpuwarden silence`` command against a served
collector app."""

from __future__ import annotations

import argparse
import io
import json
import re
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from gpuwarden.cli import _parser
from gpuwarden.collector.alerts.silencing import SilenceError, new_silence
from gpuwarden.collector.cli.silences import run_silence
from gpuwarden.collector.credentials import Role
from gpuwarden.collector.notify.settings import AlertingSettings
from gpuwarden.collector.remediate.policy import RemediationSettings
from gpuwarden.collector.rules.loader import default_runbooks_dir
from gpuwarden.collector.storage.records import Incident
from gpuwarden.collector.storage.sqlite import SqliteStorage
from gpuwarden.collector.web.keys import SERVICE
from gpuwarden.collector.web.remediation_setup import create_remediation
from gpuwarden.collector.web.session import CSRF_FIELD
from tests.capture_servers import Capture, ServedApp, slack_app
from tests.test_alerting import RULES, dispatcher, resolve
from tests.test_collector_api import fleet
from tests.test_remediate_web import build
from tests.test_remediator import FakeClock
from tests.test_route_roles import TOKENS, full_app

R, OP, A, AG = Role.READER, Role.OPERATOR, Role.ADMIN, Role.AGENT


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def storage(tmp_path: Path, clock: FakeClock) -> Iterator[SqliteStorage]:
    with SqliteStorage(tmp_path / "state.db", clock=clock) as store:
        yield store


@pytest.fixture
def services() -> Iterator[dict[str, tuple[Capture, ServedApp]]]:
    capture = Capture()
    served = ServedApp(slack_app(capture))
    # the dispatcher helper builds PagerDuty too; idle-gpu routes to Slack only
    yield {"slack": (capture, served), "pd": (Capture(), served)}
    served.stop()


def idle_on(storage: SqliteStorage, n: int, node: str, now: float) -> Incident:
    """An open idle-gpu incident (owner ml-platform, route slack:#gpu-waste) on ``node``."""
    incident = Incident(
        fingerprint=f"idle-gpu:slurm:c:{n}",
        rule_id="idle-gpu",
        severity="warning",
        first_seen=now,
        last_seen=now,
        evidence={"subject": f"slurm:c:{n}", "summary": "idle", "job": f"slurm:c:{n}",
                  "node": node},
    )  # fmt: skip
    incident_id = storage.open_incident(incident)
    assert incident_id is not None
    return replace(incident, incident_id=incident_id)


def silence(storage: SqliteStorage, now: float, **body: Any) -> int:
    body = {"duration": "4h", "comment": "rack 3 maintenance", **body}
    return storage.add_silence(new_silence(body, creator="alice", now=now))


def slack_texts(services: dict[str, Any]) -> list[str]:
    return [r["body"]["blocks"][0]["text"]["text"] for r in services["slack"][0].requests]


# --- the dispatcher -----------------------------------------------------------------------------


def test_a_silence_holds_matching_notices_and_they_go_out_once_when_it_ends(
    storage, services, clock
):
    held = idle_on(storage, 1, "gpu-rack3-07", clock.now)
    other = idle_on(storage, 2, "gpu-rack4-01", clock.now)
    silence_id = silence(storage, clock.now, matchers={"node": "gpu-rack3-*", "rule": "idle-*"})
    d = dispatcher(storage, services, clock)
    first = d.tick()
    assert (first.sent, first.suppressed) == (1, 1)
    assert slack_texts(services) == ["WARNING: idle-gpu — idle"]
    (record,) = storage.notifications(incident_id=held.incident_id)
    assert (record.status, record.delivered, record.silence_id) == (
        "suppressed",
        False,
        str(silence_id),
    )
    assert storage.notifications(incident_id=other.incident_id)[0].status == "firing"
    clock.now += 3600
    assert (d.tick().sent, d.tick().suppressed) == (0, 0)  # held, recorded once
    clock.now += 3 * 3600  # the silence ended; the incident is still open
    assert d.tick().sent == 1
    assert d.tick().sent == 0
    assert len(services["slack"][0].requests) == 2
    (record,) = storage.notifications(incident_id=held.incident_id)
    assert (record.status, record.delivered) == ("firing", True)


def test_expiring_a_silence_early_sends_the_held_notice_once(storage, services, clock):
    held = idle_on(storage, 1, "gpu-07", clock.now)
    silence_id = silence(storage, clock.now, matchers={"job": "slurm:c:1"})
    d = dispatcher(storage, services, clock)
    assert d.tick().suppressed == 1
    assert storage.expire_silence(silence_id, now=clock.now + 60, actor="bob")
    assert not storage.expire_silence(silence_id, now=clock.now + 61, actor="bob")
    clock.now += 60
    assert d.tick().sent == 1
    assert d.tick().sent == 0
    assert len(services["slack"][0].requests) == 1
    assert storage.notifications(incident_id=held.incident_id)[0].status == "firing"


def test_an_incident_that_resolves_while_held_is_never_sent(storage, services, clock):
    held = idle_on(storage, 1, "gpu-07", clock.now)
    silence(storage, clock.now, matchers={"team": "ml-platform"})  # the rule's owner
    d = dispatcher(storage, services, clock)
    assert d.tick().suppressed == 1
    resolve(storage, held, clock.now + 60)
    clock.now += 5 * 3600  # past the silence too
    assert d.tick().sent == 0
    assert d.tick().sent == 0
    assert services["slack"][0].requests == []
    assert storage.notifications(incident_id=held.incident_id)[0].status == "resolved"


def test_a_route_told_before_the_silence_still_hears_the_resolve(storage, services, clock):
    incident = idle_on(storage, 1, "gpu-07", clock.now)
    d = dispatcher(storage, services, clock)
    assert d.tick().sent == 1
    silence(storage, clock.now, matchers={"node": "gpu-07"})
    assert d.tick().sent == 0
    resolve(storage, incident, clock.now + 60)
    assert d.tick().sent == 1
    assert [t.split(":")[0] for t in slack_texts(services)] == ["WARNING", "RESOLVED"]


def test_a_silence_that_does_not_match_holds_nothing(storage, services, clock):
    idle_on(storage, 1, "gpu-07", clock.now)
    silence(storage, clock.now, matchers={"node": "gpu-07", "model": "llama-*"})  # no model
    silence(storage, clock.now, matchers={"rule": "node-silent"})
    assert dispatcher(storage, services, clock).tick().sent == 1


# --- the remediator: actions held only with actions: true ---------------------------------------


@pytest.mark.parametrize(("actions", "decided"), [(False, 1), (True, 0)])
def test_actions_are_held_only_when_the_silence_says_so(storage, clock, actions, decided):
    remediation = create_remediation(
        storage,
        RULES.enabled(),
        RemediationSettings(),
        actuators=[],
        notifiers={},
        runbooks_dir=default_runbooks_dir(),
        environ={},
        alerting=AlertingSettings(),
        clock=clock,
    )
    incident = idle_on(storage, 1, "gpu-07", clock.now)
    silence_id = silence(storage, clock.now, matchers={"node": "gpu-07"}, actions=actions)
    assert remediation.remediator.tick().decided == decided
    assert len(storage.actions(incident_id=incident.incident_id)) == decided
    storage.expire_silence(silence_id, now=clock.now, actor="bob")
    clock.now += 1
    remediation.remediator.tick()
    assert len(storage.actions(incident_id=incident.incident_id)) == 1  # decided once


# --- validation ---------------------------------------------------------------------------------

NOW = 1_800_000_000.0


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"matchers": {"host": "a"}, "duration": "1h", "comment": "x"},
         "matchers: unknown key 'host' (known: rule, job, node, model, team)"),
        ({"matchers": {}, "duration": "1h", "comment": "x"},
         "matchers: empty matchers would silence every incident; name what to silence, or set "
         "all: true"),
        ({"matchers": {"node": "a"}, "ends_at": NOW - 1, "comment": "x"},
         "the silence would end in the past"),
        ({"matchers": {"node": "a"}, "duration": "31d", "comment": "x"},
         "a silence lasts at most 30 days"),
        ({"matchers": {"node": "a"}, "duration": "1h"}, "comment: say why (a non-empty string)"),
        ({"matchers": {"node": "a"}, "comment": "x"},
         "give either ends_at (Unix seconds) or duration (such as 4h)"),
        ({"matchers": {"node": "a"}, "duration": "1h", "comment": "x", "created_by": "mallory"},
         "unknown field 'created_by' (known: actions, all, comment, duration, ends_at, matchers)"),
        ({"matchers": {"node": "a"}, "duration": "1h", "comment": "x", "actions": "yes"},
         "actions: expected true or false"),
    ],
)  # fmt: skip
def test_a_bad_silence_is_refused_in_one_line(body, message):
    with pytest.raises(SilenceError) as refused:
        new_silence(body, creator="alice", now=NOW)
    assert str(refused.value) == message


def test_all_true_allows_empty_matchers_and_holds_everything():
    made = new_silence(
        {"matchers": {}, "all": True, "duration": "30m", "comment": "fleet upgrade"},
        creator="alice",
        now=NOW,
    )
    assert (made.matchers, made.ends_at, made.created_by) == ({}, NOW + 1800, "alice")


# --- the API, per role --------------------------------------------------------------------------


@pytest.fixture
def app(tmp_path: Path) -> Iterator[web.Application]:
    service = fleet()
    setup = build(tmp_path, dry_run=False)
    yield full_app(service, setup)
    setup.storage.close()
    service.storage.close()


def bearer(role: Role) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[role]}"}


BODY = {"matchers": {"node": "gpu-07"}, "duration": "4h", "comment": "reboot"}


async def test_operators_create_and_expire_readers_list_agents_get_nothing(aiohttp_client, app):
    client = await aiohttp_client(app)
    for method, path in (("GET", "/v1/silences"), ("POST", "/v1/silences"),
                         ("DELETE", "/v1/silences/1")):  # fmt: skip
        resp = await client.request(method, path, headers=bearer(AG), json=BODY)
        assert resp.status == 403, (method, path)
    assert (await client.post("/v1/silences", headers=bearer(R), json=BODY)).status == 403
    created = await client.post("/v1/silences", headers=bearer(OP), json=BODY)
    assert created.status == 201
    made = await created.json()
    assert (made["created_by"], made["state"], made["matchers"]) == (
        "operator-1",
        "active",
        {"node": "gpu-07"},
    )
    listed = await (await client.get("/v1/silences", headers=bearer(R))).json()
    assert [s["silence_id"] for s in listed["silences"]] == [made["silence_id"]]
    path = f"/v1/silences/{made['silence_id']}"
    expired = await client.delete(path, headers=bearer(OP))
    assert expired.status == 200
    assert (await expired.json())["expired_by"] == "operator-1"
    again = await client.delete(path, headers=bearer(OP))
    assert (again.status, await again.json()) == (
        409,
        {"error": f"silence {made['silence_id']} has already ended"},
    )
    assert (await client.delete("/v1/silences/999", headers=bearer(OP))).status == 404
    assert (await (await client.get("/v1/silences", headers=bearer(R))).json())["silences"] == []
    everything = await (await client.get("/v1/silences?state=all", headers=bearer(A))).json()
    assert [s["state"] for s in everything["silences"]] == ["expired"]
    audit = [
        (e.actor, e.action, e.target)
        for e in app[SERVICE].storage.audit()
        if e.action.startswith("silence")
    ]
    target = f"silence:{made['silence_id']}"
    assert audit == [("operator-1", "silence", target), ("operator-1", "silence-expire", target)]


async def test_the_api_refuses_a_bad_silence_with_one_line(aiohttp_client, app):
    client = await aiohttp_client(app)
    resp = await client.post(
        "/v1/silences", headers=bearer(OP), json={**BODY, "created_by": "mallory"}
    )
    assert resp.status == 400
    assert (await resp.json())["error"].startswith("unknown field 'created_by'")
    resp = await client.post("/v1/silences", headers=bearer(OP), data=b"{not json")
    assert (resp.status, await resp.json()) == (400, {"error": "expected a JSON object"})
    assert [e for e in app[SERVICE].storage.audit() if e.action == "silence"] == []


# --- the command line ---------------------------------------------------------------------------


def test_the_cli_adds_lists_and_expires_through_the_api(tmp_path):
    service = fleet()
    setup = build(tmp_path, dry_run=False)
    served = ServedApp(full_app(service, setup))
    try:
        token_file = tmp_path / "token"
        token_file.write_text(TOKENS[OP] + "\n")

        def run(*argv: str) -> tuple[int, str, str]:
            args: argparse.Namespace = _parser().parse_args(
                ["silence", *argv, "--url", served.url, "--token-file", str(token_file)]
            )
            out, err = io.StringIO(), io.StringIO()
            return run_silence(args, {}, out=out, err=err), out.getvalue(), err.getvalue()

        code, out, _ = run("add", "--node", "gpu-07", "--duration", "4h", "--comment", "reboot",
                           "--json")  # fmt: skip
        assert code == 0
        made = json.loads(out)
        assert (made["created_by"], made["matchers"]) == ("operator-1", {"node": "gpu-07"})
        code, out, _ = run("list")
        assert code == 0
        assert f"{made['silence_id']:>5}  active" in out
        assert "node=gpu-07  by operator-1: reboot" in out
        assert run("expire", str(made["silence_id"]))[0] == 0
        code, _, err = run("expire", str(made["silence_id"]))
        assert (code, err.strip()) == (
            1,
            f"gpuwarden silence: 409: silence {made['silence_id']} has already ended",
        )
        code, _, err = run("add", "--duration", "1h", "--comment", "everything?")
        assert code == 1
        assert "empty matchers would silence every incident" in err
    finally:
        served.stop()
        setup.storage.close()
        service.storage.close()


# --- the incident page's "Silence 4h" button ----------------------------------------------------


async def test_the_incident_page_silences_four_hours_as_the_signed_in_operator(aiohttp_client, app):
    storage = app[SERVICE].storage
    incident = idle_on(storage, 1, "gpu-07", 1.0)
    client = await aiohttp_client(app)
    page_path = f"/status/incidents/{incident.incident_id}"
    reader_page = await (await client.get(page_path, headers=bearer(R))).text()
    assert "Silence 4h" not in reader_page
    page = await (await client.get(page_path, headers=bearer(OP))).text()
    found = re.search(rf'name="{CSRF_FIELD}" value="([^"]+)"', page)
    assert found is not None
    assert "Silence 4h" in page
    form = {CSRF_FIELD: found.group(1)}
    own = {"Origin": f"http://{client.host}:{client.port}"}
    path = f"{page_path}/silence"
    no_token = await client.post(path, headers={**bearer(OP), **own}, data={})
    assert no_token.status == 403
    assert "missing or wrong CSRF token" in await no_token.text()
    evil = {**bearer(OP), "Origin": "https://evil.example"}
    assert (await client.post(path, headers=evil, data=form)).status == 403
    assert (await client.post(path, headers={**bearer(R), **own}, data=form)).status == 403
    assert storage.silences() == []
    done = await client.post(path, headers={**bearer(OP), **own}, data=form, allow_redirects=False)
    assert (done.status, done.headers["Location"]) == (303, page_path)
    (made,) = storage.silences()
    assert (made.created_by, dict(made.matchers), made.ends_at - made.starts_at) == (
        "operator-1",
        {"rule": "idle-gpu", "job": "slurm:c:1", "node": "gpu-07"},
        4 * 3600.0,
    )
    assert [e.actor for e in storage.audit() if e.action == "silence"] == ["operator-1"]
