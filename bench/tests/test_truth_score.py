"""The labelled evaluation's scorer: each matching rule, and precision, recall, delay and the
false-incident rate on constructed incidents and episodes (bench/truth/score.py)."""

from __future__ import annotations

import math

import pytest

from bench.truth.model import T0, Episode
from bench.truth.score import (
    GRACE_SECONDS,
    FleetOutcome,
    OpenedIncident,
    matches,
    score_rule,
)
from gpuwarden.collector.detect.findings import Facts, Verdict, new_finding
from gpuwarden.collector.rules.model import Rule, Selector, Severity

IDLE = Episode("idle-gpu", "idle", T0, T0 + 3600, job="slurm:c:1",
               gpus=("GPU-a-0", "GPU-a-1"), nodes=("a",))  # fmt: skip
SLOW = Episode("training-straggler", "slow", T0, T0 + 3600, job="slurm:c:2",
               gpus=("GPU-b-3",), nodes=("b",))  # fmt: skip
MODEL = Episode("overprovisioned-inference", "over", T0, T0 + 3600, model="sd")
FAULT = Episode("gpu-hardware-fault", "xid79", T0, T0 + 600, gpus=("GPU-a-2",), nodes=("a",))


def inc(rule: str = "idle-gpu", at: float = T0 + 1800, **names: object) -> OpenedIncident:
    return OpenedIncident(rule=rule, time=at, subject=str(names.pop("subject", "s")), **names)  # type: ignore[arg-type]


MATCH_CASES = [
    # per-GPU incident of the episode's job (the shipped idle-gpu shape)
    (inc(job="slurm:c:1", gpus=("GPU-a-0",), nodes=("a",)), IDLE, True),
    # per-JOB incident: facts.job set, GPUs listed
    (inc(job="slurm:c:1", gpus=("GPU-a-0", "GPU-a-1")), IDLE, True),
    # per-job incident naming the job only
    (inc(job="slurm:c:1"), IDLE, True),
    # per-GPU incident without a job (level-shift's series subject): GPU decides
    (inc(gpus=("GPU-a-1",), nodes=("a",)), IDLE, True),
    (inc(gpus=("GPU-a-7",), nodes=("a",)), IDLE, False),
    # another job
    (inc(job="slurm:c:9", gpus=("GPU-a-0",)), IDLE, False),
    # another rule
    (inc("forgotten-gpu", job="slurm:c:1"), IDLE, False),
    # before the onset; after end + grace; at the edge of the grace
    (inc(at=T0 - 60, job="slurm:c:1"), IDLE, False),
    (inc(at=T0 + 3600 + GRACE_SECONDS + 1, job="slurm:c:1"), IDLE, False),
    (inc(at=T0 + 3600 + GRACE_SECONDS, job="slurm:c:1"), IDLE, True),
    # straggler: the right job but a faster peer's GPU is not the slow worker
    (inc("training-straggler", job="slurm:c:2", gpus=("GPU-b-1",)), SLOW, False),
    (inc("training-straggler", job="slurm:c:2", gpus=("GPU-b-3",)), SLOW, True),
    # model subjects
    (inc("overprovisioned-inference", model="sd"), MODEL, True),
    (inc("overprovisioned-inference", model="emb"), MODEL, False),
    # nodes only count when nothing else was compared
    (inc("gpu-hardware-fault", at=T0 + 60, nodes=("a",)), FAULT, True),
    (inc("gpu-hardware-fault", at=T0 + 60, nodes=("b",)), FAULT, False),
    (inc("gpu-hardware-fault", at=T0 + 60, gpus=("GPU-a-3",), nodes=("a",)), FAULT, False),
    # nothing comparable: no match
    (inc("overprovisioned-inference"), MODEL, False),
]


@pytest.mark.parametrize(("incident", "episode", "want"), MATCH_CASES)
def test_matching_rules(incident: OpenedIncident, episode: Episode, want: bool):
    assert matches(incident, episode) is want


RULE = Rule(id="idle-gpu", detector="idle_gpu", selector=Selector(), parameters={},
            severity=Severity("warning"), owner="t", runbook="t.md")  # fmt: skip


def test_incident_names_come_from_facts_evidence_and_subject():
    per_job = new_finding(
        RULE, subject="slurm:c:1", verdict=Verdict.FIRING, window=(T0, T0 + 60),
        facts=Facts(job="slurm:c:1", nodes=("a",)), evidence={"gpus": "GPU-a-0, GPU-a-1"},
    )  # fmt: skip
    got = OpenedIncident.of(per_job, T0 + 60)
    assert (got.job, got.nodes, got.gpus) == ("slurm:c:1", ("a",), ("GPU-a-0", "GPU-a-1"))
    series = new_finding(
        RULE, subject="hw.gpu.utilization{host.name=a,hw.id=GPU-a-1}", verdict=Verdict.FIRING,
        window=(T0, T0 + 60), evidence={"node": "a", "job": None},
    )  # fmt: skip
    got = OpenedIncident.of(series, T0)
    assert (got.job, got.nodes, got.gpus) == (None, ("a",), ("GPU-a-1",))


def test_precision_recall_delay_and_false_rate():
    labelled = FleetOutcome(
        "idle/s1",
        "idle",
        (IDLE, Episode("idle-gpu", "idle", T0, T0 + 600, job="slurm:c:5")),
        (
            inc(at=T0 + 1800, job="slurm:c:1", gpus=("GPU-a-0",)),  # match, delay 30 min
            inc(at=T0 + 2400, job="slurm:c:1", gpus=("GPU-a-1",)),  # match (same episode)
            inc(at=T0 + 1800, job="slurm:c:3"),  # a job with no episode: false positive
            inc("gpu-utilization-drop", job="slurm:c:1"),  # another rule: not counted here
        ),
        gpu_days=1.0,
    )
    busy = FleetOutcome("busy-diurnal/s1", "busy-diurnal", (), (inc(job="slurm:s:1"),), 4.0)
    quiet = FleetOutcome("busy-checkpoint/s1", "busy-checkpoint", (), (), 2.0)
    s = score_rule("idle-gpu", [labelled, busy, quiet])
    assert (s.incidents, s.matched) == (4, 2)
    assert s.precision == pytest.approx(0.5)
    assert (s.episodes, s.found, s.recall) == (2, 1, 0.5)
    assert s.delays == (1800.0,)
    assert s.busy_false == 1
    assert s.busy_gpu_days == 6.0
    assert s.false_per_gpu_day == pytest.approx(1 / 6)
    assert s.by_family == {"busy-diurnal": (1, 4.0), "busy-checkpoint": (0, 2.0)}


def test_a_rule_with_nothing_is_unknown_not_perfect():
    s = score_rule("idle-gpu", [FleetOutcome("x", "idle", (), (), 0.0)])
    assert math.isnan(s.precision)
    assert math.isnan(s.recall)
    assert math.isnan(s.delay(0.5))
    assert math.isnan(s.false_per_gpu_day)
