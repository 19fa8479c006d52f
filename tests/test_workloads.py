"""Workloads announce their job and model in OTLP resource attributes; the collector keeps them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwarden.collector.build import build_service
from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.ingest.otlp import NumberPoint
from gpuwarden.collector.ingest.workloads import announcement
from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.storage.records import EventKind, ModelDeployment
from gpuwarden.collector.store.types import AttrValue


@pytest.fixture
def service(tmp_path: Path) -> Iterator[CollectorService]:
    svc = build_service(CollectorConfig(database=tmp_path / "c.db"))
    yield svc
    svc.storage.close()


def point(resource: dict[str, AttrValue]) -> NumberPoint:
    return NumberPoint(
        resource, "gpuwarden.model.requests", "1", "sum", True, {}, time.time_ns(), 1.0
    )


@pytest.mark.parametrize(
    ("resource", "job_key", "model"),
    [
        ({"job.id": "4242", "gpuwarden.job.scheduler": "slurm"}, "slurm:4242", None),
        (
            {
                "k8s.pod.uid": "7c8f5f2a-1111-2222-3333-444455556666",
                "gpuwarden.model.name": "llama-70b",
                "service.version": "v3",
            },
            "k8s:7c8f5f2a-1111-2222-3333-444455556666",
            "llama-70b",
        ),
        ({"job.id": "train-7"}, "api:train-7", None),
        ({"gpuwarden.model.name": "mistral"}, None, "mistral"),
        (
            {"gpuwarden.agent.version": "0.1.0", "job.id": "x"},
            None,
            None,
        ),  # an agent, not a workload
        ({"job.id": "bad id; drop table"}, None, None),  # not an identifier: ignored
        ({"service.name": "just-a-service"}, None, None),
    ],
)
def test_announcements(resource, job_key, model):
    found = announcement(resource, 100.0)
    assert (found.job.key if found and found.job else None) == job_key
    assert (found.model.name if found and found.model else None) == model


def test_the_service_registers_jobs_models_and_deploys(service):
    resource: dict[str, AttrValue] = {
        "host.name": "srv-1",
        "job.id": "serve-1",
        "gpuwarden.model.name": "llama",
        "gpuwarden.model.version": "v1",
        "gpuwarden.team": "serving",
    }
    service.accept([point(resource)], "w")
    service.accept([point(resource)], "w")  # same resource: no second registration
    job = service.registry.get("api:serve-1")
    assert job is not None
    assert (job.team, job.model) == ("serving", "llama")
    assert service.storage.model("llama") == ModelDeployment("llama", "v1", 1)
    assert service.storage.events() == []
    service.accept([point({**resource, "gpuwarden.model.version": "v2"})], "w")
    assert service.storage.model("llama") == ModelDeployment("llama", "v2", 1)
    (deploy,) = service.storage.events()
    assert deploy.kind is EventKind.DEPLOY
    assert dict(deploy.attributes) == {"from": "v1", "to": "v2"}
