"""Preemptions: notices, preempted/requeued jobs and vanished nodes, with the work lost."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import MappingProxyType

import numpy as np
import pytest

from gpuwarden.collector.detect.findings import Verdict
from gpuwarden.collector.detect.preemption import (
    job_preemptions,
    last_checkpoint,
    work_lost_seconds,
)
from gpuwarden.collector.ingest.otlp import NumberPoint
from gpuwarden.collector.jobs.model import JobState
from gpuwarden.collector.storage.records import Event, EventKind
from tests.detectors import run_rule
from tests.test_detect_waste import T0, feed, gpu_points, job, make_service, rule_for

F, C = Verdict.FIRING, Verdict.CLEAR
END = T0 + 3600
CHECKPOINT = {"gpuwarden.io/last-checkpoint": str(T0 + 1200)}


def notice(t: float, subject: str) -> Event:
    return Event(time=t, kind=EventKind.PREEMPTION_NOTICE, subject=subject)


BASE = job("slurm:c:1", "a", (0, 1), T0 - 600)
CASES = [
    # job changes, events, gone nodes, expected causes (window [T0, END))
    ({}, [], {}, []),
    ({}, [notice(T0 + 100, "slurm:c:1")], {}, ["notice"]),
    ({}, [notice(T0 + 100, "a")], {}, ["notice"]),  # a spot notice names the node
    ({}, [notice(T0 + 100, "b")], {}, []),  # another node's notice
    ({}, [notice(T0 - 100, "slurm:c:1")], {}, []),  # before the window
    (
        {"state": JobState.PREEMPTED, "end_time": T0 + 200},
        [notice(T0 + 100, "slurm:c:1")],
        {},
        ["notice, then preempted"],  # the notice and what it announced: one preemption
    ),
    ({"state": JobState.REQUEUED, "end_time": T0 + 300}, [], {}, ["requeued"]),
    ({"state": JobState.REQUEUED, "end_time": None, "submit_time": T0 + 50}, [], {}, ["requeued"]),
    ({}, [], {"a": T0 + 400.0}, ["node gone"]),
    ({"state": JobState.COMPLETED, "end_time": T0 + 400}, [], {"a": T0 + 400.0}, []),
    ({}, [notice(T0 + 100, "slurm:c:1"), notice(T0 + 3000, "slurm:c:1")], {}, ["notice"] * 2),
]


@pytest.mark.parametrize(("changes", "events", "gone", "want"), CASES)
def test_job_preemptions(changes, events, gone, want):
    subject = dataclasses.replace(BASE, **changes)
    got = job_preemptions(subject, events, gone, start=T0, end=END)
    assert [p.cause for p in got] == want


def test_a_quiet_node_is_a_preemption_of_spot_jobs_only():
    """A reclaimed spot instance vanishes; an on-demand node that goes quiet is node-silent's."""
    gone = {"a": T0 + 400.0}
    assert [p.cause for p in job_preemptions(BASE, [], gone, start=T0, end=END)] == ["node gone"]
    assert job_preemptions(BASE, [], gone, start=T0, end=END, spot=False) == []


@pytest.mark.parametrize(
    ("labels", "start", "at", "want"),
    [
        (CHECKPOINT, T0, T0 + 1500, 300.0),
        ({"gpuwarden.last_checkpoint": str(T0 - 900)}, T0, T0 + 100, 100.0),  # start is later
        ({}, T0, T0 + 100, None),  # unknown, never 0
        ({"gpuwarden.io/last-checkpoint": "yesterday"}, T0, T0 + 100, None),
    ],
)
def test_work_lost_since_the_last_checkpoint(labels, start, at, want):
    subject = dataclasses.replace(BASE, labels=MappingProxyType(labels), start_time=start)
    assert work_lost_seconds(subject, at) == want
    if not labels:
        assert last_checkpoint(subject) is None


@pytest.fixture
def fleet(tmp_path: Path):
    svc = make_service(tmp_path, END)
    jobs = [
        dataclasses.replace(
            job("slurm:c:1", "a", (0, 1), T0 - 600, T0 + 1500, tier="spot"),
            state=JobState.PREEMPTED,
            labels=MappingProxyType(CHECKPOINT),
        ),
        job("slurm:c:2", "b", (0,), T0 - 600, tier="spot"),  # its node vanishes at T0 + 2400
        job("slurm:c:6", "d", (0,), T0 - 600),  # on-demand: its node goes quiet at T0 + 2400
        dataclasses.replace(
            job("slurm:c:3", "c", (0,), T0 - 600, T0 + 600), state=JobState.REQUEUED
        ),
        job("slurm:c:4", "c", (1,), T0 - 600),  # runs undisturbed
        job("slurm:c:5", "c", (2,), T0 - 9000, T0 - 5000, state=JobState.PREEMPTED),  # earlier
    ]
    svc.registry.put(jobs)
    svc.storage.record_event(notice(T0 + 1440, "a"))  # spot reclaim notice, 1 min ahead

    def points(t: float) -> list[NumberPoint]:
        out = [p for g in range(2) for p in gpu_points("a", g, t, 0.9)] if t < T0 + 1500 else []
        out += gpu_points("b", 0, t, 0.9) if t < T0 + 2400 else []
        out += gpu_points("d", 0, t, 0.9) if t < T0 + 2400 else []
        return out + [p for g in range(3) for p in gpu_points("c", g, t, 0.9)]

    feed(svc, np.arange(T0, END, 10.0), points)
    return svc


def test_preemption_rule_finds_each_kind_with_the_work_lost(fleet):
    found = {f.subject: f for f in run_rule(fleet, rule_for("preemption"), END)}
    assert {k: f.verdict for k, f in found.items()} == {
        "slurm:c:1": F, "slurm:c:2": F, "slurm:c:3": F, "slurm:c:4": C, "slurm:c:6": C,
    }  # fmt: skip
    spot = found["slurm:c:1"].evidence
    assert spot["causes"] == "notice, then preempted"
    assert spot["work_lost_gpu_hours"] == pytest.approx(2 * 300 / 3600)  # 2 GPUs × 5 min
    assert spot["work_lost_usd"] == pytest.approx(2 * 300 / 3600 * 1.60)  # H100 spot
    gone = found["slurm:c:2"].evidence
    assert gone["causes"] == "node gone"
    assert gone["work_lost_gpu_hours"] is None  # no checkpoint label: unknown
    assert found["slurm:c:3"].evidence["causes"] == "requeued"


def test_preemption_rule_watches_only_its_price_tiers(fleet):
    rule = rule_for("preemption", price_tiers=("spot",))
    assert {f.subject for f in run_rule(fleet, rule, END)} == {"slurm:c:1", "slurm:c:2"}


def test_preemption_rule_counts_against_min_preemptions(fleet):
    fleet.storage.record_event(notice(T0 + 300, "slurm:c:4"))
    fleet.storage.record_event(notice(T0 + 3000, "slurm:c:4"))
    rule = rule_for("preemption", min_preemptions=2)
    got = {f.subject: f.verdict for f in run_rule(fleet, rule, END)}
    assert got == {"slurm:c:1": C, "slurm:c:2": C, "slurm:c:3": C, "slurm:c:4": F, "slurm:c:6": C}
