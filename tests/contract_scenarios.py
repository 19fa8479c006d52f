"""One firing scenario per computed detector, built from the per-detector tests' builders.

Each scenario is a real service (OTLP points through ``CollectorService.accept`` or the store's
histogram ingest, jobs in the registry, deployments and events in storage), the time to judge it
at and the rule that fires on it (the parameters the detector's own tests use). Used by
``test_detection_contract``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path
from types import MappingProxyType

import numpy as np

from gpuwarden.collector.build import build_service
from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.detect.catalog import load_rules
from gpuwarden.collector.ingest.otlp import NumberPoint
from gpuwarden.collector.jobs.model import JobState
from gpuwarden.collector.rules.loader import default_rules_dir, default_runbooks_dir
from gpuwarden.collector.rules.model import Rule, RuleSet, Selector
from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.storage.records import Event, EventKind, ModelDeployment
from tests import (
    budget_curves,
    test_detect_deploy,
    test_detect_deploy_drift,
    test_detect_distribution,
    test_detect_faults,
    test_detect_forecast,
    test_detect_level_shift,
    test_detect_metric_anomaly,
    test_detect_preemption,
    test_detect_slo,
    test_detect_waste,
    test_fairness,
)
from tests.detectors import make_rule
from tests.test_detect_waste import T0, feed, gauge, gpu_points, job, make_service


@dataclasses.dataclass(frozen=True, slots=True)
class Scenario:
    """A service holding data a rule fires on at ``now``."""

    service: CollectorService
    now: float
    rule: Rule


@cache
def shipped() -> RuleSet:
    """The shipped rules (rules/default.yaml)."""
    return load_rules([default_rules_dir()], runbooks_dir=default_runbooks_dir())


def shipped_rule(rule_id: str, selector: Selector | None = None) -> Rule:
    rule = shipped().get(rule_id)
    assert rule is not None, rule_id
    return rule if selector is None else dataclasses.replace(rule, selector=selector)


# --- jobs on GPUs (test_detect_waste, test_detect_straggler, test_detect_preemption) -----------

IDLE_END = T0 + 2400


def idle_gpu(tmp: Path) -> Scenario:
    """Job 1 (2 GPUs, team ml, model llama) leaves GPU 0 idle but for two heartbeat blips (within
    the tolerated busy share), and GPU 1 idle with a gap of a third of the window (UNKNOWN at the
    default coverage); job 2 on node b is busy."""
    svc = make_service(tmp, IDLE_END)
    svc.registry.put(
        [
            job("slurm:c:1", "a", (0, 1), T0 - 60, model="llama"),
            job("slurm:c:2", "b", (0,), T0 - 60, model="llama"),
        ]
    )

    def points(t: float) -> list[NumberPoint]:
        gap = IDLE_END - 1800 <= t < IDLE_END - 1200
        blip = t in (IDLE_END - 1500, IDLE_END - 300)
        out = gpu_points("a", 0, t, 0.3 if blip else 0.0)
        out += gpu_points("a", 1, t, None if gap else 0.0)
        return out + gpu_points("b", 0, t, 0.9)

    feed(svc, np.arange(T0, IDLE_END, 10.0), points)
    rule = make_rule("idle_gpu", window_seconds=1800.0)
    return Scenario(svc, IDLE_END, rule)


def orphaned_memory(tmp: Path) -> Scenario:
    """test_detect_waste's orphans: GPU a/0 (job 1 ended 20 min ago) and a/2 (no job) fire."""
    end = test_detect_waste.ORPHAN_END
    svc = make_service(tmp, end)
    svc.registry.put(
        [
            job("slurm:c:1", "a", (0,), T0, end - 1200, state=JobState.COMPLETED),
            job("slurm:c:2", "a", (1,), T0),
            job("slurm:c:3", "a", (3,), T0, end - 300, state=JobState.CANCELLED),
        ]
    )
    feed(svc, np.arange(T0, end, 10.0), test_detect_waste.orphan_points)
    return Scenario(svc, end, make_rule("orphaned_memory"))


FORGOTTEN_WINDOW = 12000.0  # 200 min, 180 of them with data: coverage 0.9


def forgotten_gpu(tmp: Path) -> Scenario:
    """test_detect_waste's forgotten allocation (job 1, ~4 % mean), its jobs given a model."""
    end = test_detect_waste.FORGOTTEN_END
    svc = make_service(tmp, end, recent_hours=1)
    svc.registry.put(
        [
            job("slurm:c:1", "a", (0,), T0 - 3600, model="llama"),
            job("slurm:c:2", "a", (1,), T0 - 3600, tier="spot", model="llama"),
            job("slurm:c:3", "a", (2,), T0 - 3600, model="llama"),
        ]
    )
    util = test_detect_waste.forgotten_util
    feed(
        svc,
        np.arange(T0, end, 60.0),
        lambda t: [p for g in range(4) for p in gpu_points("a", g, t, util("a", g, t))],
    )
    return Scenario(svc, end, make_rule("forgotten_gpu", window_seconds=FORGOTTEN_WINDOW))


def input_bound(tmp: Path) -> Scenario:
    """test_detect_waste's input-bound fleet: job 1 (CPU-bound loader) and job 3 (oscillating)."""
    end = test_detect_waste.INPUT_END
    svc = make_service(tmp, end)
    svc.registry.put(
        [job(f"slurm:c:{i}", n, (0,), T0 - 60, model="llama") for i, n in enumerate("abcd", 1)]
    )
    feed(svc, np.arange(T0, end, 10.0), test_detect_waste.input_points)
    return Scenario(svc, end, make_rule("input_bound"))


SERVE_END = test_detect_waste.SERVE_END


def overprovisioned_inference(tmp: Path) -> Scenario:
    """test_detect_waste's serving fleet: model sd (8 replicas, peak 15 %) fires, llm does not."""
    svc = test_detect_waste.serving_fleet(tmp)
    return Scenario(svc, SERVE_END, make_rule("overprovisioned_inference", window_seconds=3600.0))


STRAGGLER_END = T0 + 1800


def straggler(tmp: Path) -> Scenario:
    """test_detect_straggler's job: GPU 3 of 8 runs at half its peers' utilisation."""
    svc = make_service(tmp, STRAGGLER_END)
    svc.registry.put([job("slurm:c:1", "a", tuple(range(8)), T0 - 60, model="llama")])
    rng = np.random.default_rng(1)

    def util(g: int, t: float) -> float | None:
        if g == 7:
            return None
        base = 0.9 + 0.02 * rng.standard_normal()
        return base * 0.5 if g == 3 and t >= T0 + 1000 else base

    feed(
        svc,
        np.arange(T0, STRAGGLER_END, 10.0),
        lambda t: [p for g in range(8) for p in gpu_points("a", g, t, util(g, t))],
    )
    return Scenario(svc, STRAGGLER_END, make_rule("straggler"))


def preemption(tmp: Path) -> Scenario:
    """test_detect_preemption's fleet: job 1 (spot, node a) preempted after a notice, job 2's
    spot node b gone, job 3 requeued; job 4 runs undisturbed."""
    end = test_detect_preemption.END
    svc = make_service(tmp, end)
    svc.registry.put(
        [
            dataclasses.replace(
                job("slurm:c:1", "a", (0, 1), T0 - 600, T0 + 1500, tier="spot", model="llama"),
                state=JobState.PREEMPTED,
                labels=MappingProxyType(test_detect_preemption.CHECKPOINT),
            ),
            job("slurm:c:2", "b", (0,), T0 - 600, tier="spot", model="llama"),
            dataclasses.replace(
                job("slurm:c:3", "c", (0,), T0 - 600, T0 + 600, model="llama"),
                state=JobState.REQUEUED,
            ),
            job("slurm:c:4", "c", (1,), T0 - 600, model="llama"),
        ]
    )
    svc.storage.record_event(test_detect_preemption.notice(T0 + 1440, "a"))

    def points(t: float) -> list[NumberPoint]:
        out = [p for g in range(2) for p in gpu_points("a", g, t, 0.9)] if t < T0 + 1500 else []
        out += gpu_points("b", 0, t, 0.9) if t < T0 + 2400 else []
        return out + [p for g in range(3) for p in gpu_points("c", g, t, 0.9)]

    feed(svc, np.arange(T0, end, 10.0), points)
    return Scenario(svc, end, make_rule("preemption"))


def node_silent(tmp: Path) -> Scenario:
    """The preemption fleet seen by node_silent: node b went quiet 20 min ago with job 2
    running on it (FIRING); node a went quiet after its job was preempted (CLEAR: no job at
    stake); node c reports."""
    fleet = preemption(tmp)
    return Scenario(fleet.service, fleet.now, make_rule("node_silent"))


# --- node faults (test_detect_faults) -----------------------------------------------------------


def hardware_fault(tmp: Path) -> Scenario:
    """test_detect_faults' node n1: a lost GPU, XID 79, uncorrected ECC and a failed remap fire
    (XID 13 is not of concern by default)."""
    now = float(int(time.time()))
    svc = build_service(CollectorConfig(database=tmp / "c.db"), clock=lambda: now)
    status, counter = test_detect_faults.status, test_detect_faults.counter
    points: list[NumberPoint] = []
    for t in (now - 40, now - 20):
        for gpu in ("GPU-ok", "GPU-xid13", "GPU-xid79", "GPU-ecc", "GPU-remap"):
            points += status(gpu, "ok", t)
    points += status("GPU-lost", "ok", now - 40) + status("GPU-lost", "failed", now - 20)
    # the faults test's counters are stamped at its own import-time NOW: restamp them at ours
    shift = int((now - test_detect_faults.NOW) * 1e9)
    counters = counter("gpuwarden.gpu.xid.errors", "GPU-xid79", {"gpuwarden.gpu.xid": "79"}, [1, 2])
    counters += counter(
        "gpuwarden.gpu.xid.errors", "GPU-xid13", {"gpuwarden.gpu.xid": "13"}, [1, 5]
    )
    counters += counter(
        "hw.errors", "GPU-ecc", {"error.type": "uncorrected", "hw.type": "gpu"}, [0, 2]
    )
    points += [dataclasses.replace(p, time_unix_nano=p.time_unix_nano + shift) for p in counters]
    points.append(
        NumberPoint(
            test_detect_faults.RES, "gpuwarden.gpu.memory.remap_failure", "1", "gauge", False,
            {"hw.id": "GPU-remap"}, int((now - 20) * 1e9), 1.0,
        )
    )  # fmt: skip
    assert svc.accept(points, "t") == 0
    return Scenario(svc, now, make_rule("hardware_fault"))


# --- models (test_detect_deploy_drift, test_detect_deploy, test_detect_distribution, slo, ...) ---

LATENCY = "gpuwarden.model.request.latency"
TTFT = "gpuwarden.model.time_to_first_token"


def model_drift(tmp: Path) -> Scenario:
    """test_detect_deploy_drift's step: llama's p95 latency doubles at 5 h of 5.5 h."""
    now = T0 + 5.5 * 3600
    svc = test_detect_deploy_drift.service_at(tmp, now)
    test_detect_deploy_drift.feed(svc, [(0, 0.3), (5 * 3600, 0.6)], hours=5.5)
    return Scenario(svc, now, shipped_rule("model-latency-drift"))


def deploy_regression(tmp: Path) -> Scenario:
    """test_detect_deploy's deploys: model slower got 30 % slower, model same did not."""
    mod = test_detect_deploy
    svc = build_service(
        CollectorConfig(database=tmp / "c.db", recent_hours=6), clock=lambda: mod.END + mod.STEP
    )
    after = (T0 + (np.arange(mod.N) + 1) * mod.STEP) > mod.DEPLOY
    for model, size in (("slower", 1.3), ("same", 1.0)):
        factor = np.where(after, size, 1.0)
        assert svc.accept_histograms(mod.latency_points(factor, model), "test") == 0
        svc.storage.record_event(
            Event(mod.DEPLOY, EventKind.DEPLOY, model, attributes={"version": "v2"})
        )
    return Scenario(svc, mod.END, shipped_rule("deploy-regression"))


DISTRIBUTION_END = T0 + 5 * 3600


def distribution_drift(tmp: Path) -> Scenario:
    """test_detect_distribution's runner case: llama's TTFT shifts 20 minutes before the end
    (four 5-minute windows drifted); the deployment names its team."""
    svc = test_detect_slo.make_service(tmp, DISTRIBUTION_END)
    svc.storage.upsert_model(ModelDeployment("llama", "v1", 2, labels={"team": "ml"}))
    test_detect_distribution.feed_latency(
        svc, T0, DISTRIBUTION_END, shift_at=DISTRIBUTION_END - 20 * 60
    )
    rule = make_rule(
        "distribution_drift",
        selector=Selector(metrics=(TTFT, LATENCY)),
        window_seconds=300.0,
        reference_seconds=3 * 3600.0,
        same_phase=False,
    )
    return Scenario(svc, DISTRIBUTION_END, rule)


def slo_burn(tmp: Path) -> Scenario:
    """test_detect_slo's steady 2 % errors on llama (the deployment names its team)."""
    end = test_detect_slo.END
    svc = test_detect_slo.make_service(tmp, end)
    svc.storage.upsert_model(ModelDeployment("llama", "v1", 2, labels={"team": "ml"}))
    test_detect_slo.feed_requests(svc, "llama", T0, end, lambda t: 0.02)
    return Scenario(svc, end, shipped_rule("slo-burn-fast"))


def budget_burn(tmp: Path) -> Scenario:
    """test_budget_burn's surge: nlp spends 20x its budget's even rate for the last hour."""
    now = budget_curves.SURGE_AT + 3600.0
    svc, _ = budget_curves.make_service(tmp, now)
    svc.storage.write_rollups(budget_curves.surge_rows(now))
    return Scenario(svc, now, shipped_rule("budget-burn-fast"))


def demand_forecast(tmp: Path) -> Scenario:
    """test_detect_forecast's growing load, 20 minutes before it reaches 80 % of capacity."""
    mod = test_detect_forecast
    now = mod.crossing() - 20 * mod.MINUTE
    clock = mod.Clock(now)
    svc = mod.make_service(tmp, clock)
    svc.storage.upsert_model(
        ModelDeployment(
            "llama", "v1", mod.REPLICAS,
            labels={"capacity_rps_per_replica": str(mod.CAPACITY_PER_REPLICA), "team": "ml"},
        )
    )  # fmt: skip
    mod.feed(svc, clock, T0, now, mod.growing)
    return Scenario(svc, now, shipped_rule("demand-forecast"))


# --- any series (test_detect_metric_anomaly, test_detect_level_shift) ---------------------------

#: what a series carries for the selector's teams/jobs/models (metric_anomaly.series_facts)
SERIES_ATTRS = {"team": "ml", "gpuwarden.job.key": "slurm:c:1", "model": "llama"}


def metric_anomaly(tmp: Path) -> Scenario:
    """test_detect_metric_anomaly's power series: GPU-7 drops in the newest minutes, GPU-8 is
    steady; both carry team, job and model attributes."""
    mod = test_detect_metric_anomaly
    end = T0 + mod.HOURS * 3600
    svc = make_service(tmp, end, recent_hours=12)
    minutes = mod.HOURS * 60
    series = {
        "7": mod.drop(mod.background(minutes, seed=3), 2),
        "8": mod.background(minutes, seed=4),
    }
    times = end - 60 * np.arange(minutes, 0, -1) + 1

    def points(t: float) -> list[NumberPoint]:
        i = round((t - times[0]) / 60)
        return [
            gauge(mod.METRIC, "gpu-07", t, float(v[i]), **{"hw.id": f"GPU-{g}"}, **SERIES_ATTRS)
            for g, v in series.items()
        ]

    feed(svc, times, points)
    rule = make_rule("metric_anomaly", selector=Selector(metrics=(mod.METRIC,)))
    return Scenario(svc, end, rule)


def level_shift(tmp: Path) -> Scenario:
    """test_detect_level_shift's series: GPUs a and b drop by 0.4 (a 0.3), c stays steady."""
    mod = test_detect_level_shift
    rng = np.random.default_rng(3)
    values = {"a": mod.shifted(-0.4)(rng), "b": mod.shifted(-0.3)(rng), "c": mod.noise(rng)}
    svc = make_service(tmp, mod.END)
    start = mod.END - mod.STEP * mod.SLOTS

    def points(t: float) -> list[NumberPoint]:
        i = round((t - start) / mod.STEP)
        return [
            gauge(mod.METRIC, node, t, float(v[i]), **{"hw.id": f"GPU-{node}"}, **SERIES_ATTRS)
            for node, v in values.items()
        ]

    feed(svc, mod.END - mod.STEP * np.arange(mod.SLOTS, 0, -1) + 1, points)
    rule = make_rule("level_shift", selector=Selector(metrics=(mod.METRIC,)))
    return Scenario(svc, mod.END, rule)


# --- fairness (test_fairness) -------------------------------------------------------------------


def team_starved(tmp: Path) -> Scenario:
    """test_fairness's two teams over the last 2 h: cv waits 2 h under its share (FIRING), ml
    holds every GPU-hour."""
    rule = make_rule("team_starved", window_seconds=2 * test_fairness.H)
    return Scenario(test_fairness.fairness_fleet(tmp), test_fairness.NOW, rule)


def team_hogging(tmp: Path) -> Scenario:
    """The same fleet: ml holds 100 % of the GPU time, entitled to half, while cv waits."""
    rule = make_rule("team_hogging", window_seconds=2 * test_fairness.H)
    return Scenario(test_fairness.fairness_fleet(tmp), test_fairness.NOW, rule)


BUILDERS: dict[str, Callable[[Path], Scenario]] = {
    "idle_gpu": idle_gpu,
    "orphaned_memory": orphaned_memory,
    "forgotten_gpu": forgotten_gpu,
    "input_bound": input_bound,
    "overprovisioned_inference": overprovisioned_inference,
    "straggler": straggler,
    "model_drift": model_drift,
    "deploy_regression": deploy_regression,
    "distribution_drift": distribution_drift,
    "slo_burn": slo_burn,
    "budget_burn": budget_burn,
    "demand_forecast": demand_forecast,
    "hardware_fault": hardware_fault,
    "preemption": preemption,
    "node_silent": node_silent,
    "metric_anomaly": metric_anomaly,
    "level_shift": level_shift,
    "team_starved": team_starved,
    "team_hogging": team_hogging,
}
