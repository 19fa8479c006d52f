"""Demand forecasts: will a model's request rate outgrow what its replicas serve, and when.

Demand is the model's request rate (``gpuwarden.model.requests``, all outcomes, summed over its
series) from the store's 1-minute long ring, averaged into forecast bins of
``max(1 min, horizon / 6, season / 288)`` (5 minutes for the default 30 min horizon and 1 day
season). The model is STL + ARIMA: STL (``season_seconds``, when the history holds two seasons)
gives a seasonal profile per phase of the season; an ARIMA(1,1,0) with drift is fitted to the
deseasonalised series (a random walk with drift and AR(1) steps: growth is extrapolated, and its
intervals widen with the horizon as they should). The forecast is the ARIMA forecast plus the
profile, with its ``interval_level`` prediction interval.

Fitting costs ~0.1-1 s, so each series is fitted once and the results are reused: later cycles
``append`` the new bins with the fitted parameters (milliseconds); the fit is redone after a
season (a day without season), or when the rule's parameters change. At most ``MAX_FITS`` fitted
models are kept (least recently used go).

Capacity — requests/s the current replicas serve — comes from, in order:

1. the deployment's label ``capacity_rps_per_replica`` x its replicas (``capacity_source`` =
   ``label``): measured by a load test, the number an operator trusts;
2. the throughput observed at saturation: the median request rate over the minutes in which the
   waiting queue (``gpuwarden.model.queue.size``, ``state=waiting``) held at least one request,
   given at least ``MIN_SATURATED_MINUTES`` of them (``saturation``): when requests queue, the
   servers are serving all they can, so that rate is what the replicas handle. It assumes the
   replica count did not change over the history.

The plain observed peak is not used: a deployment that never queued has a capacity *above* its
peak, so "80 % of the peak" would fire on every daily peak of a flat load. Without a capacity the
finding is UNKNOWN, with the forecast in its evidence. Missing data stays missing: a history with
less than two seasons (or ``MIN_BINS`` bins), or without data in the last ``FRESH_BINS`` bins,
is UNKNOWN.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from statsmodels.tsa.arima.model import ARIMA
from statsmodels.tsa.seasonal import STL

from gpuwarden.collector.detect.contract import DetectionContext, Detector, spec_of
from gpuwarden.collector.detect.findings import Facts, Finding, JsonScalar, Verdict, new_finding
from gpuwarden.collector.detect.slo import REQUESTS, model_of, rule_models
from gpuwarden.collector.rules.durations import format_duration
from gpuwarden.collector.rules.model import Rule, Subject
from gpuwarden.collector.rules.params import duration, number
from gpuwarden.collector.storage.records import ModelDeployment

log = logging.getLogger(__name__)

Floats = npt.NDArray[np.float64]
QUEUE = "gpuwarden.model.queue.size"
CAPACITY_LABEL = "capacity_rps_per_replica"
MAX_FITS = 1024
MIN_BINS = 36
FRESH_BINS = 2
MIN_SATURATED_MINUTES = 5
MAX_SEASON_BINS = 288
HORIZON_BINS = 6
ORDER = (1, 1, 0)


# --- the series ----------------------------------------------------------------------------------


def bin_seconds(horizon_seconds: float, season_seconds: float) -> float:
    """The forecast step: whole minutes, ~6 per horizon, at most 288 per season."""
    step = max(60.0, horizon_seconds / HORIZON_BINS, season_seconds / MAX_SEASON_BINS)
    return math.ceil(step / 60.0) * 60.0


def rebin(values: Floats, factor: int) -> Floats:
    """Means of consecutive runs of ``factor`` values; NaN where fewer than half are known."""
    usable = values[: values.size // factor * factor].reshape(-1, factor)
    known = (~np.isnan(usable)).sum(axis=1)
    with np.errstate(invalid="ignore"):
        means = np.nansum(usable, axis=1) / known
    return np.where(known * 2 >= factor, means, np.nan)


def model_totals(values: Floats, models: list[str | None]) -> dict[str, Floats]:
    """Rows summed per model (NaN where none of its rows has data)."""
    out: dict[str, Floats] = {}
    for name in {m for m in models if m is not None}:
        rows = values[[i for i, m in enumerate(models) if m == name]]
        total = np.nansum(rows, axis=0)
        out[name] = np.where(np.isnan(rows).all(axis=0), np.nan, total)
    return out


# --- the model -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Forecast:
    """Demand over the next bins: mean and the prediction interval (requests/s)."""

    start: float
    """Start of the first forecast bin (Unix seconds)."""
    step_seconds: float
    mean: Floats
    lower: Floats
    upper: Floats


@dataclass
class FittedDemand:
    """A fitted STL profile + ARIMA results for one series, updated in place each cycle."""

    step_seconds: float
    season_bins: int
    profile: Floats | None
    """Seasonal component per phase (absolute bin index mod ``season_bins``)."""
    results: Any  # statsmodels ARIMAResults (untyped)
    last_bin: int
    """Absolute index (time // step) of the newest bin in ``results``."""
    fitted_bin: int

    def seasonal(self, bins: npt.NDArray[np.int64]) -> Floats:
        """The seasonal component at absolute bin indices (0 without a season)."""
        if self.profile is None:
            return np.zeros(bins.size)
        return self.profile[bins % self.season_bins]

    def append(self, first_bin: int, values: Floats) -> None:
        """Take the bins ``first_bin ..`` with the fitted parameters (no refit)."""
        new = np.arange(first_bin, first_bin + values.size)
        keep = new > self.last_bin
        if not keep.any():
            return
        values, new = values[keep], new[keep]
        gap = int(new[0]) - self.last_bin - 1
        if gap > 0:  # missing bins stay missing (the state space skips NaN)
            values = np.concatenate((np.full(gap, np.nan), values))
            new = np.arange(self.last_bin + 1, int(new[-1]) + 1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.results = self.results.append(values - self.seasonal(new))
        self.last_bin = int(new[-1])

    def forecast(self, bins: int, level: float) -> Forecast:
        """Mean and ``level`` interval for the ``bins`` bins after ``last_bin``."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            prediction = self.results.get_forecast(bins)
            mean = np.asarray(prediction.predicted_mean, dtype=np.float64)
            interval = np.asarray(prediction.conf_int(alpha=1.0 - level), dtype=np.float64)
        future = np.arange(self.last_bin + 1, self.last_bin + 1 + bins)
        season = self.seasonal(future)
        return Forecast(
            start=(self.last_bin + 1) * self.step_seconds,
            step_seconds=self.step_seconds,
            mean=mean + season,
            lower=interval[:, 0] + season,
            upper=interval[:, 1] + season,
        )


def fit_demand(
    first_bin: int, values: Floats, step_seconds: float, season_seconds: float
) -> FittedDemand | None:
    """Fit STL (when two seasons are there) + ARIMA(1,1,0) with drift; None without the data."""
    season_bins = round(season_seconds / step_seconds) if season_seconds > 0 else 0
    known = ~np.isnan(values)
    if known.sum() < MIN_BINS or (season_bins and values.size < 2 * season_bins):
        return None
    bins = np.arange(first_bin, first_bin + values.size)
    profile = None
    if season_bins >= 2:
        filled = np.interp(bins, bins[known], values[known])
        jump = max(1, season_bins // 20)
        stl = STL(
            filled,
            period=season_bins,
            seasonal_jump=jump,
            trend_jump=jump,
            low_pass_jump=jump,
        ).fit()
        seasonal = np.asarray(stl.seasonal, dtype=np.float64)
        profile = np.zeros(season_bins)
        last = slice(values.size - season_bins, values.size)
        profile[bins[last] % season_bins] = seasonal[last]
    fitted = FittedDemand(step_seconds, season_bins, profile, None, int(bins[-1]), int(bins[-1]))
    with warnings.catch_warnings():  # convergence chatter: the fit is still usable
        warnings.simplefilter("ignore")
        fitted.results = ARIMA(values - fitted.seasonal(bins), order=ORDER, trend="t").fit()
    return fitted


def first_breach(forecast: Forecast, limit: float) -> int | None:
    """Index of the first bin whose upper bound exceeds ``limit``."""
    above = np.flatnonzero(forecast.upper > limit)
    return int(above[0]) if above.size else None


# --- capacity ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Capacity:
    """Requests/s the deployment serves now, and how that was found."""

    rps: float
    source: str


def label_capacity(deployment: ModelDeployment | None) -> Capacity | None:
    """``capacity_rps_per_replica`` x replicas, when the deployment has the label."""
    if deployment is None or CAPACITY_LABEL not in deployment.labels:
        return None
    try:
        per_replica = float(deployment.labels[CAPACITY_LABEL])
    except ValueError:
        log.warning("model %s: label %s is not a number", deployment.name, CAPACITY_LABEL)
        return None
    if not per_replica > 0:
        return None
    return Capacity(per_replica * deployment.replicas, "label")


def saturation_capacity(rate: Floats, waiting: Floats | None) -> Capacity | None:
    """Median request rate over the minutes with a waiting queue (see the module doc)."""
    if waiting is None:
        return None
    saturated = (waiting >= 1.0) & ~np.isnan(rate)
    if int(saturated.sum()) < MIN_SATURATED_MINUTES:
        return None
    return Capacity(float(np.median(rate[saturated])), "saturation")


# --- the runner ----------------------------------------------------------------------------------

_FitKey = tuple[str, str, int]  # rule id, model, hash of the parameters


class _DemandFits(OrderedDict[_FitKey, "FittedDemand"]):
    """Fitted models of one detection context, least recently used first."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DemandForecastParams:
    """Parameters of ``demand_forecast``."""

    horizon_seconds: float = duration("30m", "5m", "1d", "Look-ahead.")
    history_seconds: float = duration("14d", "1d", "90d", "History fitted.")
    season_seconds: float = duration("1d", "0s", "30d", "Seasonal period (0: none).")
    interval_level: float = number(0.95, 0.5, 0.999, "Prediction interval level.")
    capacity_utilization_above: float = number(
        0.8, 0.1, 1.0, "Fires when the interval's upper bound exceeds this share of capacity."
    )


def check_seasonal(
    history_seconds: float, season_seconds: float, shorter: tuple[tuple[str, float], ...]
) -> tuple[str, str] | None:
    """History must cover two seasons, and each of ``shorter`` must be shorter than it."""
    if season_seconds > 0 and history_seconds < 2 * season_seconds:
        return "history_seconds", (
            f"must cover at least two seasons ({format_duration(2 * season_seconds)}) "
            "to remove seasonality"
        )
    for name, seconds in shorter:
        if seconds >= history_seconds:
            return (
                name,
                f"must be shorter than history_seconds ({format_duration(history_seconds)})",
            )
    return None


def _check(p: DemandForecastParams) -> tuple[str, str] | None:
    return check_seasonal(
        p.history_seconds, p.season_seconds, (("horizon_seconds", p.horizon_seconds),)
    )


def run_demand_forecast(
    ctx: DetectionContext, rule: Rule, params: DemandForecastParams, now: float
) -> list[Finding]:
    """One finding per selected model: FIRING when demand may pass capacity within the horizon."""
    store = ctx.store
    step = bin_seconds(params.horizon_seconds, params.season_seconds)
    end = math.floor(now / step) * step
    start = math.floor((end - params.history_seconds) / step) * step
    labels = dict(rule.selector.labels)
    requests = store.matrix(
        REQUESTS, selector=labels or None, start=start, end=end, resolution="long"
    )
    queue = store.matrix(
        QUEUE, selector={**labels, "state": "waiting"}, start=start, end=end, resolution="long"
    )
    minute = float(requests.step_seconds)
    factor = max(1, round(step / minute))
    # the long ring may hold less than the history: start at the first whole forecast bin
    first = float(requests.times[0]) if requests.times.size else start
    skip = round(((step - first % step) % step) / minute)
    first_bin = round((first + skip * minute) / step)
    rates = model_totals(
        requests.values[:, skip:].astype(np.float64), [model_of(s) for s in requests.series]
    )
    waiting = model_totals(
        queue.values[:, skip:].astype(np.float64), [model_of(s) for s in queue.series]
    )
    cache = ctx.cache(_DemandFits)
    findings = []
    for name, deployment in rule_models(ctx, rule, set(rates)).items():
        rate = rates.get(name)
        capacity = label_capacity(deployment) or (
            saturation_capacity(rate, waiting.get(name)) if rate is not None else None
        )
        forecast, reused = None, False
        if rate is not None:
            binned = rebin(rate, factor)
            if not np.isnan(binned[-FRESH_BINS:]).all():
                key = (rule.id, name, hash(params))
                fitted = cache.get(key)
                season_bins = fitted.season_bins if fitted else 0
                stale = fitted is None or (
                    first_bin + binned.size - 1 - fitted.fitted_bin
                    >= (season_bins or round(86400 / step))
                )
                if fitted is not None and not stale:
                    fitted.append(first_bin, binned)
                    cache.move_to_end(key)
                    reused = True
                else:
                    fitted = fit_demand(first_bin, binned, step, params.season_seconds)
                    if fitted is not None:
                        cache[key] = fitted
                        while len(cache) > MAX_FITS:
                            cache.popitem(last=False)
                if fitted is not None:
                    bins = max(1, math.ceil(params.horizon_seconds / step))
                    forecast = fitted.forecast(bins, params.interval_level)
        findings.append(
            _finding(rule, name, deployment, params, forecast, capacity, rate, reused, now)
        )
    return findings


def _finding(
    rule: Rule,
    name: str,
    deployment: ModelDeployment | None,
    params: DemandForecastParams,
    forecast: Forecast | None,
    capacity: Capacity | None,
    rate: Floats | None,
    reused: bool,
    now: float,
) -> Finding:
    recent = rate[-15:] if rate is not None else np.array([])
    current = float(np.nanmean(recent)) if recent.size and not np.isnan(recent).all() else None
    evidence: dict[str, JsonScalar] = {
        "model": name,
        "team": deployment.labels.get("team") if deployment else None,
        "replicas": deployment.replicas if deployment else None,
        "demand_rps": current,
        "capacity_rps": capacity.rps if capacity else None,
        "capacity_source": capacity.source if capacity else None,
        "capacity_utilization_above": params.capacity_utilization_above,
        "interval_level": params.interval_level,
        "horizon_seconds": params.horizon_seconds,
        "fit_reused": reused,
    }
    verdict = Verdict.UNKNOWN
    summary = f"{name}: not enough recent demand history to forecast"
    points: tuple[tuple[float, float], ...] = ()
    if forecast is not None:
        times = forecast.start + forecast.step_seconds * np.arange(forecast.mean.size)
        points = tuple(zip(times.tolist(), forecast.upper.tolist(), strict=True))
        evidence["forecast_step_seconds"] = forecast.step_seconds
        evidence["forecast_mean_rps_at_horizon"] = float(forecast.mean[-1])
        evidence["forecast_upper_rps_at_horizon"] = float(forecast.upper[-1])
        evidence["forecast_upper_rps_max"] = float(forecast.upper.max())
        if capacity is None:
            summary = f"{name}: capacity unknown (set label {CAPACITY_LABEL})"
        else:
            share = params.capacity_utilization_above
            limit = share * capacity.rps
            evidence["limit_rps"] = limit
            breach = first_breach(forecast, limit)
            if breach is None:
                verdict = Verdict.CLEAR
                summary = f"{name}: forecast demand stays under {limit:.1f} req/s"
            else:
                verdict = Verdict.FIRING
                at = float(times[breach])
                evidence["breach_at"] = at
                evidence["time_to_breach_seconds"] = max(0.0, at - now)
                evidence["forecast_upper_rps_at_breach"] = float(forecast.upper[breach])
                expected = np.flatnonzero(forecast.mean > limit)
                evidence["time_to_expected_breach_seconds"] = (
                    max(0.0, float(times[expected[0]]) - now) if expected.size else None
                )
                summary = (  # "may": the interval's upper bound; the mean's crossing is evidence
                    f"{name}: demand may exceed {share:.0%} of capacity "
                    f"({limit:.1f} of {capacity.rps:.1f} req/s) in "
                    f"{max(0.0, at - now) / 60:.0f} min"
                )
    return new_finding(
        rule,
        subject=name,
        verdict=verdict,
        window=(now, now + params.horizon_seconds),
        facts=Facts(team=deployment.labels.get("team") if deployment else None, model=name),
        summary=summary,
        evidence=evidence,
        points=points,
    )


DETECTOR = Detector(
    spec=spec_of(
        "demand_forecast",
        "Forecast demand will exceed capacity within the horizon.",
        subjects=(Subject.DEPLOYMENT,),
        signals=("gpuwarden.model.requests", "gpuwarden.model.queue.size"),
        params=DemandForecastParams,
        selector=("teams", "models", "labels"),
        check=_check,
    ),
    params=DemandForecastParams,
    run=run_demand_forecast,
)
