"""Failover, end to end: two real ``gpuwarden collector`` processes on one real PostgreSQL, a
webhook target that drops repeated idempotency keys, and a PagerDuty stand-in that counts
incidents by ``dedup_key`` as PagerDuty does.

The leader is stopped with ``kill -9`` at a point the test knows for sure, without any fault
point in the collector: the webhook target and PagerDuty hold the *first* request they get
(without answering) and tell the test; once both are held, the leader is inside an action
(its intent committed, the actuator's call made, no result recorded) and inside a notification
(sent, not confirmed), in two variants: the held call took effect at the target, or it never
did. The standby must then lead within 30 s (the time is printed), run the action exactly once
at the target (its redelivery is answered "already done", or does it), page exactly
once (one PagerDuty incident), and the audit must show both leaders with their epochs (and the
lease given up when the new leader is stopped with SIGTERM).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from gpuwarden.collector.storage.postgres import PostgresStorage
from gpuwarden.collector.storage.sql_lease import LEADER_ACTION
from tests.capture_servers import ServedApp, pagerduty_problems
from tests.collector_server import free_port
from tests.test_collector_remediation import get

pytestmark = pytest.mark.slow

OPS = "ops-0123456789abcdef0123"
ALERTS = "am-0123456789abcdef01234"
PD_KEY = "R0UTINGKEYFAILOVER000000000000AB"
SECRET_ENV = "GPUWARDEN_FAILOVER_WEBHOOK_SECRET"
TAKEOVER_CONTRACT_SECONDS = 30.0
RULES = """\
version: 1
rules:
  - id: failover-node-down
    detector: alertmanager
    description: A node is down (a Prometheus alert); the webhook runs the node's playbook.
    selector:
      labels: {alertname: FailoverNodeDown}
    parameters:
      node_label: node
    severity: page
    owner: gpu-infra
    runbook: prometheus-gpu-failed.md
    actions:
      - kind: webhook
        mode: auto
        parameters: {name: playbook}
    routes: ["pagerduty:gpu"]
"""


@dataclass
class Held:
    """A stand-in that holds its first request unanswered until released, and tells when it
    arrived; the later ones it answers."""

    arrived: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    async def hold_first(self, body: dict[str, Any]) -> None:
        with self.lock:
            self.bodies.append(body)
            first = len(self.bodies) == 1
        if first:
            self.arrived.set()
            await asyncio.get_running_loop().run_in_executor(None, self.release.wait, 120)


@dataclass
class Target(Held):
    """The webhook target: it acts once per ``Idempotency-Key`` and answers a repeat 409, as
    the webhook actuator asks receivers to. With ``act_on_arrival`` the held first call has
    taken effect when the leader dies; without, it never does (the leader died before the
    target committed anything): the call was made or not, the new leader cannot know."""

    act_on_arrival: bool = True
    effects: Counter[str] = field(default_factory=Counter)
    deliveries: Counter[str] = field(default_factory=Counter)

    def app(self) -> web.Application:
        async def hook(request: web.Request) -> web.Response:
            key = request.headers["Idempotency-Key"]
            body = await request.json()
            with self.lock:
                self.deliveries[key] += 1
            if self.act_on_arrival:
                repeat = self._act(key)
                await self.hold_first(body)
            else:
                await self.hold_first(body)
                repeat = self._act(key)
            return web.Response(status=409 if repeat else 200, text="ok")

        app = web.Application()
        app.router.add_post("/hook", hook)
        return app

    def _act(self, key: str) -> bool:
        """Run the playbook for ``key`` unless it ran; whether it had (a repeat)."""
        with self.lock:
            repeat = self.effects[key] > 0
            if not repeat:
                self.effects[key] += 1  # the playbook runs now
        return repeat


@dataclass
class PagerDuty(Held):
    """Events v2: one incident per ``dedup_key`` however many triggers carry it."""

    problems: list[str] = field(default_factory=list)

    def app(self) -> web.Application:
        async def enqueue(request: web.Request) -> web.Response:
            body = await request.json()
            problems = pagerduty_problems(body)
            if problems:  # as PagerDuty answers an invalid event
                self.problems.extend(problems)
                return web.json_response(
                    {"status": "invalid event", "errors": problems}, status=400
                )
            await self.hold_first(body)
            return web.json_response(
                {"status": "success", "dedup_key": body["dedup_key"]}, status=202
            )

        app = web.Application()
        app.router.add_post("/v2/enqueue", enqueue)
        return app

    def incidents(self) -> Counter[str]:
        """Triggers by dedup_key: PagerDuty opens one incident per key."""
        with self.lock:
            return Counter(b["dedup_key"] for b in self.bodies if b["event_action"] == "trigger")


@dataclass
class Replica:
    name: str
    port: int
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def readyz(self) -> dict[str, Any]:
        status, body = get(f"{self.url}/readyz")
        assert status == 200, body
        answer: dict[str, Any] = json.loads(body)
        return answer

    def role(self) -> str:
        return str(self.readyz()["leadership"]["role"])


def _replica(tmp: Path, name: str, database: str, target: str, pagerduty: str) -> Replica:
    port = free_port()
    folder = tmp / name
    folder.mkdir()
    (folder / "tokens").write_text(f"operator ops {OPS}\nalert-source am {ALERTS}\n")
    (folder / "pd").write_text(f"gpu {PD_KEY}\n")
    (folder / "rules.yaml").write_text(RULES)
    (folder / "c.yaml").write_text(
        f"""\
port: {port}
tokens_file: {folder / "tokens"}
database: {database}
rules: [{folder / "rules.yaml"}]
detection_seconds: 3600
snapshot_seconds: 0
pagerduty_keys_file: {folder / "pd"}
pagerduty_events_url: {pagerduty}/v2/enqueue
webhooks:
  playbook: {{url: "{target}/hook", secret_env: {SECRET_ENV}, timeout_seconds: 120}}
remediation:
  dry_run: false
  interval_seconds: 1
  breaker_max_fleet_ratio: 1.0
  stale_execution_seconds: 3600
alerting:
  interval_seconds: 1
ha:
  enabled: true
  replica_id: {name}
  lease_seconds: 3
  renew_seconds: 1
"""
    )
    log = folder / "collector.log"
    env = {**os.environ, SECRET_ENV: "failover-test-secret-0123456789"}
    with log.open("wb") as out:
        argv = [sys.executable, "-m", "gpuwarden", "collector", "--config", str(folder / "c.yaml")]
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    return Replica(name, port, process, log)


def _until(what: str, check: Any, replicas: list[Replica], seconds: float = 60.0) -> None:
    """Poll an external process's state until ``check()`` holds (a deadline, no timing claim)."""
    deadline = time.monotonic() + seconds
    while True:
        for replica in replicas:
            assert replica.process.poll() is None, replica.log.read_text()[-3000:]
        try:
            if check():
                return
        except OSError:
            pass
        assert time.monotonic() < deadline, f"{what}: not within {seconds:.0f} s"
        time.sleep(0.1)


def _alert(url: str) -> None:
    payload = {
        "version": "4",
        "status": "firing",
        "receiver": "gpuwarden",
        "groupKey": "{}:{alertname=FailoverNodeDown}",
        "alerts": [
            {
                "status": "firing",
                "labels": {"alertname": "FailoverNodeDown", "node": "gpu-node-3"},
                "annotations": {"summary": "gpu-node-3 is down"},
                "startsAt": "2026-01-01T00:00:00Z",
                "fingerprint": "f00dfeedbeef0001",
            }
        ],
    }
    request = urllib.request.Request(  # noqa: S310 - loopback
        f"{url}/v1/alertmanager",
        data=json.dumps(payload).encode(),
        headers={"Authorization": f"Bearer {ALERTS}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
        assert response.status == 200


@pytest.fixture(params=[True, False], ids=["call-took-effect", "call-never-took-effect"])
def stand_ins(
    request: pytest.FixtureRequest,
) -> Iterator[tuple[Target, PagerDuty, ServedApp, ServedApp]]:
    target, pagerduty = Target(act_on_arrival=request.param), PagerDuty()
    served = ServedApp(target.app()), ServedApp(pagerduty.app())
    try:
        yield target, pagerduty, *served
    finally:
        target.release.set()
        pagerduty.release.set()
        for app in served:
            app.stop()


def test_the_standby_takes_over_mid_action_and_mid_page(
    tmp_path: Path,
    fresh_database: str,
    stand_ins: tuple[Target, PagerDuty, ServedApp, ServedApp],
) -> None:
    target, pagerduty, target_app, pagerduty_app = stand_ins
    replicas: list[Replica] = []
    try:
        alpha = _replica(tmp_path, "alpha", fresh_database, target_app.url, pagerduty_app.url)
        replicas.append(alpha)
        _until("alpha leads", lambda: alpha.role() == "leader", replicas)
        beta = _replica(tmp_path, "beta", fresh_database, target_app.url, pagerduty_app.url)
        replicas.append(beta)
        _until("beta is ready", lambda: beta.role() == "standby", replicas)
        assert beta.readyz()["leadership"]["detail"].startswith("standby; leader is alpha since")
        status, metrics = get(f"{beta.url}/metrics", OPS)
        assert status == 200
        assert b'gpuwarden_leader{replica="beta"} 0.0' in metrics
        status, page = get(f"{beta.url}/status", OPS)
        assert status == 200
        assert b"is the standby; leader is alpha since " in page

        _alert(beta.url)  # a standby ingests: the incident is in the shared database
        _until("the leader acts and pages", target.arrived.is_set, replicas)
        _until("the leader pages", pagerduty.arrived.is_set, replicas)

        alpha.process.send_signal(signal.SIGKILL)  # inside both calls, no answer recorded
        killed = time.monotonic()
        alpha.process.wait(10)
        replicas.remove(alpha)
        _until("beta leads", lambda: beta.role() == "leader", replicas, TAKEOVER_CONTRACT_SECONDS)
        took = time.monotonic() - killed
        print(f"\nbeta leads {took:.1f} s after kill -9 of the leader (contract: 30 s)")

        finished = lambda: _action_states(fresh_database) not in ([], ["executing"])  # noqa: E731
        _until("the action is finished", finished, replicas)
        _until("the page is confirmed", lambda: _delivered(fresh_database), replicas)
        status, metrics = get(f"{beta.url}/metrics", OPS)
        assert b'gpuwarden_leader{replica="beta"} 1.0' in metrics
    finally:
        target.release.set()  # nothing held any more: the replicas can stop
        pagerduty.release.set()
        for replica in replicas:
            replica.process.terminate()
        for replica in replicas:
            try:
                replica.process.wait(40)
            except subprocess.TimeoutExpired:
                replica.process.kill()
                replica.process.wait()

    (key,) = target.effects
    assert target.effects == Counter({key: 1})  # the playbook ran once
    assert target.deliveries[key] == 2  # the held call, then the new leader's redelivery
    assert pagerduty.problems == []
    ((dedup_key, triggers),) = pagerduty.incidents().items()  # one PagerDuty incident ...
    assert dedup_key.startswith("gpuwarden-")
    assert triggers == 2  # ... from the held trigger and the new leader's resend
    with PostgresStorage(fresh_database) as storage:
        (action,) = storage.actions()
        assert action.state in {"verifying", "verified"}
        # the redelivery's answer: "seen this key" when the held call had taken effect
        assert action.params["outcome"] == ("already_done" if target.act_on_arrival else "done")
        entries = storage.audit()
        leaders = [(e.actor, e.verdict, e.result) for e in entries if e.action == LEADER_ACTION]
        lost = [e.reason for e in entries if e.action == LEADER_ACTION and e.verdict == "lost"]
        reconciled = [e.result for e in entries if e.verdict == "reconcile"]
    assert leaders == [
        ("alpha", "acquired", "epoch 1"),
        ("beta", "lost", "epoch 1"),  # written by beta as it took over
        ("beta", "acquired", "epoch 2"),
        ("beta", "released", "epoch 2"),  # SIGTERM at the end: given up for the next one
    ]
    assert lost[0].startswith("leader lost by alpha epoch 1")
    assert reconciled == ["redeliver"]


def _action_states(database: str) -> list[str]:
    with PostgresStorage(database) as storage:
        return [a.state for a in storage.actions()]


def _delivered(database: str) -> bool:
    with PostgresStorage(database) as storage:
        notes = storage.notifications()
    return bool(notes) and all(n.delivered for n in notes)
