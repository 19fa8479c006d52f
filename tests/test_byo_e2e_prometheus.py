"""dcgm-exporter -> real Prometheus or vmagent -> remote-write -> the real ``gpuwarden collector``.

Two nodes x 4 GPUs serve dcgm-exporter's page (``tests/dcgm_exposition.py``); each page records
when it was served (the truth). Debian's Prometheus scrapes them every second and remote-writes
to ``gpuwarden collector --config ...`` (the shipped wiring of ``collector/cli/collector.py``: a
real HTTP server on 127.0.0.1, a tokens file with an agent token bound to every node), whose
``step_seconds`` is the scrape interval. A notebook pod holds two idle GPUs; the shipped
``idle-gpu`` rule of ``rules/default.yaml`` must open an incident naming it. The rule's window is
30 min, which a real-time test cannot wait: the test rules file is that rule with only
``window_seconds`` shortened to 60 s, its minimum (and detection every 5 s, accounting every 10 s).

The same runs with Debian's ``vmagent`` (the ``victoria-metrics`` package carries it) as the
scraper and remote-write sender: ``-promscrape.config``, ``-remoteWrite.url``,
``-remoteWrite.bearerTokenFile``, as docs/byo-telemetry.md shows. vmagent scrapes on exact
1,000 ms ticks and delivers each scrape a constant ~0.3 s later, so the newest slot may reach the
collector just after every detection cycle (issue 17: it ran one run in six without an incident
until ``idle_gpu`` counted a slot without data as unknown rather than "not held";
tests/test_prom_idle_delivery.py pins that phase down without the daemons).

Then the exporters stop (Prometheus remote-writes stale markers, which end the series), and the
real ``gpuwarden report costs --by job`` against the collector's database must show the
notebook's GPU-hours within 1 % of the truth: 2 GPUs x the scrapes node-a served x 1 s.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from gpuwarden.collector.rules.loader import default_rules_dir
from tests.collector_server import free_port
from tests.dcgm_exposition import DcgmFleet, Pod
from tests.loopback_process import log_tail, stop
from tests.prometheus_server import PrometheusServer, prometheus_binary
from tests.tsdb_servers import _Server, binary

AGENT_TOKEN = "byo-agent-token-0123456789abcdef"
READER_TOKEN = "byo-reader-token-0123456789abcdef"
STEP = 1
NOTEBOOK = Pod("notebook-7", "research")
TRAINER = Pod("trainer-0", "ml")
ACCOUNTING_SECONDS = 10
IDLE_WINDOW = 60  # the shortest window the rule accepts


BUSY = {"DCGM_FI_DEV_GPU_UTIL": 93.0, "DCGM_FI_DEV_POWER_USAGE": 640.0,
        "DCGM_FI_DEV_FB_USED": 60_000.0, "DCGM_FI_DEV_FB_FREE": 21_000.0}  # fmt: skip


class VmAgent(_Server):
    """Debian's ``vmagent``: scrapes ``targets`` every second, remote-writes with a token file."""

    name = "vmagent"

    def __init__(self, targets: dict[str, str], write_url: str, token_file: Path) -> None:
        super().__init__()
        self._scrape = self._dir / "scrape.yml"
        self._scrape.write_text(yaml.safe_dump({
            "global": {"scrape_interval": f"{STEP}s"},
            "scrape_configs": [{"job_name": job, "static_configs": [{"targets": [target]}]}
                               for job, target in targets.items()],
        }))  # fmt: skip
        self._write_url = write_url
        self._token_file = token_file

    def argv(self) -> list[str]:
        return [
            self._binary,
            f"-promscrape.config={self._scrape}",
            f"-remoteWrite.url={self._write_url}",
            f"-remoteWrite.bearerTokenFile={self._token_file}",
            f"-remoteWrite.tmpDataPath={self._dir / 'queue'}",
            f"-httpListenAddr=127.0.0.1:{self.port}",
        ]


def sender(kind: str, targets: dict[str, str], write_url: str, token_file: Path) -> Any:
    """The scraper that remote-writes to the collector, as a context manager with log_tail()."""
    if kind == "vmagent":
        return VmAgent(targets, write_url, token_file)
    remote_write = {
        "url": write_url,
        "authorization": {"type": "Bearer", "credentials_file": str(token_file)},
        "queue_config": {"batch_send_deadline": "1s", "max_shards": 2},
    }
    return PrometheusServer(targets, remote_write=[remote_write], interval_seconds=STEP)


def fleet() -> DcgmFleet:
    out = DcgmFleet(("node-a", "node-b"), 4)
    for index in (0, 1):
        out.assign("node-a", index, TRAINER)
        out.set("node-a", index, BUSY)
    for index in (2, 3):
        out.assign("node-a", index, NOTEBOOK)  # idle: the page's idle values
    return out


def rules_file(path: Path) -> Path:
    """The shipped idle-gpu rule, its window shortened (the only change)."""
    shipped = yaml.safe_load((default_rules_dir() / "default.yaml").read_text())
    rule = next(r for r in shipped["rules"] if r["id"] == "idle-gpu")
    rule["parameters"]["window_seconds"] = f"{IDLE_WINDOW}s"
    path.write_text(yaml.safe_dump({"version": 1, "rules": [rule]}))
    return path


def get(url: str, token: str) -> Any:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})  # noqa: S310
    with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
        return json.loads(response.read())


def diagnostics(base: str) -> str:
    """What a failure report needs besides the logs: the rules' readiness and the receiver's
    sample counts (the collector's own ``/readyz`` and ``/metrics``)."""
    try:
        ready = get(f"{base}/readyz", READER_TOKEN)
        request = urllib.request.Request(  # noqa: S310 - loopback
            f"{base}/metrics", headers={"Authorization": f"Bearer {READER_TOKEN}"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
            text = response.read().decode()
    except OSError as exc:
        return f"unavailable: {exc}"
    samples = [line for line in text.splitlines() if "remote_write_samples" in line]
    return f"{ready}\n--- samples: {samples}"


async def until(
    what: str, check: Callable[[], Any], logs: Callable[[], str], seconds: float
) -> Any:
    """Poll ``check`` (other processes: Prometheus scrapes and sends on its own schedule)."""
    deadline = time.monotonic() + seconds
    while True:
        found = await asyncio.to_thread(check)
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not seen in {seconds} s:\n{logs()}")
        await asyncio.sleep(0.5)


async def serve(the_fleet: DcgmFleet, served: dict[str, list[float]]) -> list[web.AppRunner]:
    """Each node's exporter on its own port, recording when it served its page."""
    runners = []
    for node in the_fleet.nodes:

        async def metrics(_: web.Request, node: str = node) -> web.Response:
            served[node].append(time.time())
            return web.Response(text=the_fleet.render(node), content_type="text/plain")

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        runners.append(runner)
    return runners


@pytest.mark.parametrize(
    "kind",
    [
        pytest.param("prometheus", marks=pytest.mark.skipif(
            prometheus_binary() is None, reason="prometheus not installed")),
        pytest.param("vmagent", marks=pytest.mark.skipif(
            binary("vmagent") is None, reason="vmagent (victoria-metrics) not installed")),
    ],
)  # fmt: skip
async def test_a_scraper_feeds_the_collector_an_idle_pod_and_its_gpu_hours(kind, tmp_path):
    served: dict[str, list[float]] = {"node-a": [], "node-b": []}
    the_fleet = fleet()
    runners = await serve(the_fleet, served)
    targets = {
        node: f"127.0.0.1:{runner.addresses[0][1]}"
        for node, runner in zip(the_fleet.nodes, runners, strict=True)
    }
    port = free_port()
    db = tmp_path / "collector.db"
    tokens = tmp_path / "tokens"
    tokens.write_text(f"agent prometheus {AGENT_TOKEN} nodes=*\nreader tests {READER_TOKEN}\n")
    token_file = tmp_path / "token"
    token_file.write_text(AGENT_TOKEN + "\n")
    config = tmp_path / "collector.yaml"
    config.write_text(yaml.safe_dump({
        "host": "127.0.0.1", "port": port, "database": str(db), "tokens_file": str(tokens),
        "step_seconds": STEP, "detection_seconds": 5,
        "accounting_period_seconds": ACCOUNTING_SECONDS, "snapshot_seconds": 0,
        "rules": [str(rules_file(tmp_path / "rules.yaml"))],
    }))  # fmt: skip
    log = tmp_path / "collector.log"
    with log.open("wb") as out:
        collector = subprocess.Popen(  # the real CLI, as an operator runs it
            [sys.executable, "-m", "gpuwarden", "collector", "--config", str(config)],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:

        def ready() -> bool:
            if collector.poll() is not None:
                raise AssertionError(f"the collector exited: {log_tail(log)}")
            try:
                with urllib.request.urlopen(f"{base}/readyz", timeout=2) as response:  # noqa: S310
                    return bool(response.status == 200)
            except OSError:
                return False

        await until("the collector ready", ready, lambda: log_tail(log), 60)
        with sender(kind, targets, f"{base}/api/v1/write", token_file) as scraper:

            def logs() -> str:
                found = get(f"{base}/v1/incidents", READER_TOKEN)
                return (
                    f"{scraper.log_tail()}\n--- incidents: {found}\n--- readiness: "
                    f"{diagnostics(base)}\n--- collector:\n{log_tail(log)}"
                )

            def idle_incident() -> list[dict[str, Any]]:
                found = get(f"{base}/v1/incidents", READER_TOKEN)["incidents"]
                return [i for i in found if i["rule_id"] == "idle-gpu"]

            incidents = await until("an idle-gpu incident", idle_incident, logs, 150)
            for runner in runners:  # the exporters go away: Prometheus marks the series stale
                await runner.cleanup()
            runners = []
            await asyncio.sleep(0)
            truth_hours = 2 * len(served["node-a"]) * STEP / 3600
            end = max(served["node-a"])

            def report() -> dict[str, Any] | None:
                argv = [sys.executable, "-m", "gpuwarden", "report", "costs", "--db", str(db),
                        "--by", "job", "--format", "json", "--since", "1h"]  # fmt: skip
                done = subprocess.run(argv, capture_output=True, text=True, check=True)
                doc: dict[str, Any] = json.loads(done.stdout)
                line = next(
                    (g for g in doc["groups"] if g["group"] == "k8s:research/notebook-7"), None
                )
                # accounting recomputes the last complete periods every 10 s: three periods after
                # the last sample, the one holding it has been written
                rolled = line is not None and time.time() > end + 3 * ACCOUNTING_SECONDS
                return line if rolled else None

            line = await until("the notebook's accounting", report, logs, 60)
    finally:
        for runner in runners:
            await runner.cleanup()
        stop(collector)
    # the notebook's incident, naming its pod and its two GPUs; nothing about the busy trainer
    assert [i["evidence"]["job"] for i in incidents] == ["k8s:research/notebook-7"], incidents
    assert incidents[0]["evidence"]["idle_gpus"] == 2
    assert line["gpu_hours_allocated"] == pytest.approx(truth_hours, rel=0.01), (
        line, truth_hours, len(served["node-a"]),
    )  # fmt: skip
