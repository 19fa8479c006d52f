"""The model-serving fleets plant what their docstring says, read back from the points they send.

These check the generators (the truth), not a detector: counters and histograms are decoded
here from the OTLP points exactly as sent, with no collector code involved.
"""

from __future__ import annotations

import numpy as np
import pytest

from bench.truth import model_fleets
from bench.truth.model import Fleet
from bench.truth.model_telemetry import BOUNDS, LATENCY, REQUESTS

SEEDS = (1, 2, 3)  # tune seeds only


def totals(fleet: Fleet, times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cumulative (all requests, failed requests) at ``times``."""
    ok, bad = [], []
    for t in times:
        by = {
            p.attributes["outcome"]: p.value for p in fleet.points(float(t)) if p.metric == REQUESTS
        }
        ok.append(by["success"] + by["failure"])
        bad.append(by["failure"])
    return np.array(ok), np.array(bad)


def p95(fleet: Fleet, start: float, end: float) -> float:
    """p95 latency of the requests in ``[start, end)``, from the cumulative histogram points."""
    assert fleet.histograms is not None
    (first,) = fleet.histograms(start)
    (last,) = fleet.histograms(end)
    assert first.metric == LATENCY
    counts = np.subtract(last.bucket_counts, first.bucket_counts)
    cumulative = np.cumsum(counts)
    rank = 0.95 * cumulative[-1]
    k = int(np.searchsorted(cumulative, rank))
    assert 0 < k < len(BOUNDS)  # inside the finite buckets
    below = cumulative[k - 1]
    share = (rank - below) / counts[k]  # geometric interpolation inside the bucket
    return float(BOUNDS[k - 1] * (BOUNDS[k] / BOUNDS[k - 1]) ** share)


@pytest.mark.parametrize("seed", SEEDS)
def test_the_slower_deploy_is_slower_until_its_rollback(seed):
    fleet = model_fleets.deploy_rollback_fleet(seed)
    (episode,) = fleet.episodes
    deploys = sorted(e.time for e in fleet.events)
    assert deploys == [episode.start, episode.end]  # the deploy, then its rollback
    before = p95(fleet, episode.start - 1800, episode.start - 10)
    during = p95(fleet, episode.start + 300, episode.end - 10)
    after = p95(fleet, episode.end + 300, fleet.end - 10)
    assert during >= 1.2 * before
    assert after <= 1.1 * before
    busy = model_fleets.busy_deploy_fleet(seed)
    assert not busy.episodes
    assert p95(busy, deploys[0] + 300, deploys[1] - 10) <= 1.1 * p95(busy, busy.start, deploys[0])


@pytest.mark.parametrize("seed", SEEDS)
def test_error_blips_are_benign_and_the_burn_is_not(seed):
    budget = 0.001  # a 99.9 % SLO
    for fleet in (model_fleets.busy_slo_blips_fleet(seed), model_fleets.slo_burn_fleet(seed)):
        times = fleet.start + 60 * np.arange(int((fleet.end - fleet.start) / 60) + 1)
        requests, failed = totals(fleet, times)
        hour_ratio = (failed[60:] - failed[:-60]) / (requests[60:] - requests[:-60])
        burn = hour_ratio / budget
        if fleet.busy:
            assert burn.max() < 14.4 / 2  # blips alone never come near the fast-burn line
            assert failed[-1] / requests[-1] < budget  # nor spend the budget over the run
        else:
            (episode,) = fleet.episodes
            inside = (times[60:] > episode.start) & (times[60:] <= episode.end + 600)
            assert burn[inside].max() > 14.4
            assert burn[~inside & (times[60:] < episode.start)].max() < 14.4 / 2


@pytest.mark.parametrize("seed", SEEDS)
def test_demand_grows_past_eighty_percent_only_in_the_growth_fleet(seed):
    growth = model_fleets.demand_growth_fleet(seed)
    (episode,) = growth.episodes
    times = np.arange(growth.start + growth.warmup_seconds, growth.end - 300, 300)
    requests, _ = totals(growth, times)
    rate = np.diff(requests) / 300
    line = 0.8 * model_fleets.CAPACITY
    assert rate[times[1:] <= episode.start].max() < line
    assert rate[times[1:] >= episode.end + 600].min() > line
    busy = model_fleets.busy_model_diurnal_fleet(seed)
    requests, _ = totals(busy, times)
    assert (np.diff(requests) / 300).max() < 0.7 * model_fleets.CAPACITY


@pytest.mark.parametrize("seed", SEEDS)
def test_latency_drift_without_a_deploy(seed):
    fleet = model_fleets.latency_drift_fleet(seed)
    assert not fleet.events
    episode = fleet.episodes[0]
    assert {e.rule for e in fleet.episodes} == {"model-latency-drift", "latency-distribution-drift"}
    # Same hour of the previous day: the daily curve is alike, the drift is not.
    day = model_fleets.DAY
    today = p95(fleet, episode.start + 600, episode.start + 3600)
    yesterday = p95(fleet, episode.start + 600 - day, episode.start + 3600 - day)
    assert today >= 1.35 * yesterday


def test_rollback_resolutions():
    episode = model_fleets.deploy_rollback_fleet(1).episodes[0]
    resolved = [
        (
            "deploy-regression",
            "chat/gpuwarden.model.request.latency/p95@deploy:1",
            episode.end + 120,
        )
    ]
    never: list[tuple[str, str, float]] = []
    assert model_fleets.rollback_resolutions([((episode,), resolved), ((episode,), never)]) == (
        2,
        1,
        [2.0],
    )
