"""The two vocabularies a rule draws from: detectors (with their parameters) and actions."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from gpuwarden.collector.rules.durations import DAY as _DAY
from gpuwarden.collector.rules.durations import HOUR as _HOUR
from gpuwarden.collector.rules.durations import MINUTE as _MINUTE
from gpuwarden.collector.rules.durations import format_duration
from gpuwarden.collector.rules.model import (
    ActionKindSpec,
    DetectorSpec,
    ParamSpec,
    ParamType,
    ParamValue,
    Subject,
)

# --- vocabularies --------------------------------------------------------------------------------

_T = ParamType


def _p(
    kind: ParamType,
    default: ParamValue | None,
    minimum: float | None,
    maximum: float | None,
    description: str,
    choices: tuple[str, ...] = (),
) -> ParamSpec:
    return ParamSpec(kind, default, minimum, maximum, description, choices)


def _table(**params: ParamSpec) -> Mapping[str, ParamSpec]:
    return MappingProxyType(params)


_STATISTICS = ("mean", "p50", "p95", "p99", "rate", "error_ratio")
_DIRECTIONS = ("increase", "decrease", "both")


def _coverage() -> ParamSpec:
    text = "Share of the window that must have samples (missing data never counts as fine)."
    return _p(_T.FLOAT, 0.8, 0.0, 1.0, text)


def _num(params: Mapping[str, ParamValue], name: str) -> float:
    value = params[name]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} is not a number")  # the tables above guarantee it is
    return float(value)


def _nums(params: Mapping[str, ParamValue], name: str) -> tuple[float, ...]:
    value = params[name]
    if not isinstance(value, tuple):
        raise TypeError(f"{name} is not a list")  # the tables above guarantee it is
    return tuple(float(item) for item in value)


def _check_seasonal(params: Mapping[str, ParamValue]) -> tuple[str, str] | None:
    history, season = _num(params, "history_seconds"), _num(params, "season_seconds")
    if season > 0 and history < 2 * season:
        return "history_seconds", (
            f"must cover at least two seasons ({format_duration(2 * season)}) to remove seasonality"
        )
    for short in ("window_seconds", "horizon_seconds"):
        if short in params and _num(params, short) >= history:
            return short, f"must be shorter than history_seconds ({format_duration(history)})"
    return None


def _check_reference(params: Mapping[str, ParamValue]) -> tuple[str, str] | None:
    reference, window = _num(params, "reference_seconds"), _num(params, "window_seconds")
    if reference <= window:
        return (
            "reference_seconds",
            f"must be longer than window_seconds ({format_duration(window)})",
        )
    return None


def _check_level_shift(params: Mapping[str, ParamValue]) -> tuple[str, str] | None:
    window, hold = _num(params, "window_seconds"), _num(params, "hold_seconds")
    total = window + _num(params, "baseline_seconds")
    if hold > window:
        return "hold_seconds", f"must not exceed window_seconds ({format_duration(window)})"
    season = _num(params, "season_seconds")
    if season > 0 and total < 2 * season:
        return "season_seconds", (
            f"baseline and window ({format_duration(total)}) must cover two seasons to remove one"
        )
    return None


def _check_burn(params: Mapping[str, ParamValue]) -> tuple[str, str] | None:
    longs, shorts = _nums(params, "long_windows_seconds"), _nums(params, "short_windows_seconds")
    rates = _nums(params, "burn_rates")
    budget, period = 1.0 - _num(params, "objective"), _num(params, "period_seconds")
    if not longs or len(longs) != len(shorts) or len(longs) != len(rates):
        return "burn_rates", (
            "long_windows_seconds, short_windows_seconds and burn_rates must be non-empty lists "
            f"of one length (got {len(longs)}, {len(shorts)}, {len(rates)})"
        )
    for i, (long, short, rate) in enumerate(zip(longs, shorts, rates, strict=True)):
        if short >= long:
            return f"short_windows_seconds[{i}]", (
                f"must be shorter than its long window ({format_duration(long)})"
            )
        if long > period:
            return f"long_windows_seconds[{i}]", (
                f"must not exceed period_seconds ({format_duration(period)})"
            )
        if rate * budget > 1.0:
            return f"burn_rates[{i}]", (
                f"{rate:g} × error budget {budget:g} is an error ratio above 1: "
                "this pair can never fire"
            )
    return None


def _check_hardware(params: Mapping[str, ParamValue]) -> tuple[str, str] | None:
    if not params["xid_codes"] and not any(
        params[key] for key in ("uncorrected_ecc", "remap_failure", "gpu_lost")
    ):
        return "xid_codes", "the rule watches nothing: list XID codes or enable another fault"
    return None


_J, _N, _D = Subject.JOB, Subject.NODE, Subject.DEPLOYMENT

# fmt: off
DETECTORS: Mapping[str, DetectorSpec] = MappingProxyType({spec.name: spec for spec in (
    DetectorSpec(
        "idle_gpu", "A GPU allocated to a job stayed idle for a whole window.", (_J,),
        ("hw.gpu.utilization", "gpuwarden.gpu.process.utilization"),
        _table(
            window_seconds=_p(_T.DURATION, 30 * _MINUTE, _MINUTE, 7 * _DAY,
                              "How long the GPU must stay idle."),
            utilization_below=_p(_T.FLOAT, 0.05, 0.0, 1.0,
                                 "A sample is idle when GPU utilisation is below this ratio."),
            min_coverage=_coverage(),
            min_gpus=_p(_T.INT, 1, 1, 100_000, "Only jobs holding at least this many GPUs."),
        )),
    DetectorSpec(
        "orphaned_memory", "GPU memory held by processes of no running job.", (_N,),
        ("gpuwarden.gpu.process.memory.usage", "hw.gpu.memory.usage"),
        _table(
            memory_above_bytes=_p(_T.INT, 1 << 30, 0, None,
                                  "Ignore orphans holding less GPU memory than this."),
            grace_seconds=_p(_T.DURATION, 10 * _MINUTE, 0.0, _DAY,
                             "Time after the owning job ended before memory counts as orphaned."),
        )),
    DetectorSpec(
        "forgotten_gpu", "A job has held GPUs it barely used for a very long time.", (_J,),
        ("hw.gpu.utilization", "gpuwarden.gpu.process.utilization"),
        _table(
            window_seconds=_p(_T.DURATION, _DAY, _HOUR, 30 * _DAY,
                              "How long the allocation must have been (nearly) unused."),
            utilization_below=_p(_T.FLOAT, 0.05, 0.0, 1.0, "Mean GPU utilisation below this."),
            min_coverage=_coverage(),
        )),
    DetectorSpec(
        "input_bound", "GPUs starve while the host's CPU, disk or network is saturated.", (_J,),
        ("hw.gpu.utilization", "system.cpu.time", "system.disk.io", "system.network.io"),
        _table(
            window_seconds=_p(_T.DURATION, 15 * _MINUTE, _MINUTE, _DAY, "Evaluation window."),
            gpu_utilization_below=_p(_T.FLOAT, 0.5, 0.0, 1.0, "GPU utilisation below this ..."),
            cpu_utilization_above=_p(_T.FLOAT, 0.85, 0.0, 1.0,
                                     "... while host CPU utilisation is above this."),
            min_coverage=_coverage(),
        )),
    DetectorSpec(
        "overprovisioned_inference",
        "An inference deployment has far more GPU capacity than its peak needs.", (_D,),
        ("hw.gpu.utilization", "hw.gpu.memory.usage", "gpuwarden.model.requests"),
        _table(
            window_seconds=_p(_T.DURATION, _DAY, _HOUR, 30 * _DAY,
                              "Window whose peak is judged (a day covers the daily peak)."),
            quantile=_p(_T.FLOAT, 0.95, 0.5, 1.0, "The peak is this quantile of utilisation."),
            peak_utilization_below=_p(_T.FLOAT, 0.3, 0.0, 1.0,
                                      "Over-provisioned when the peak stays below this."),
            target_utilization=_p(_T.FLOAT, 0.6, 0.05, 1.0,
                                  "Utilisation the suggested replica count aims for."),
            min_replicas=_p(_T.INT, 2, 1, 10_000, "Never suggest fewer replicas than this."),
        )),
    DetectorSpec(
        "straggler", "One worker of a distributed job runs slower than its peers.", (_J, _N),
        ("hw.gpu.utilization", "hw.power"),
        _table(
            window_seconds=_p(_T.DURATION, 10 * _MINUTE, _MINUTE, _DAY, "Evaluation window."),
            tolerance=_p(_T.FLOAT, 3.0, 0.5, 20.0,
                         "Band around the peers' median, in median absolute deviations."),
            outside_fraction=_p(_T.FLOAT, 0.5, 0.05, 1.0,
                                "Share of the window a worker must spend outside the band."),
            min_peers=_p(_T.INT, 4, 3, 100_000, "Jobs with fewer workers are not judged."),
        )),
    DetectorSpec(
        "model_drift",
        "A model's latency, throughput or errors regressed against its seasonal baseline.",
        (_D,), ("gpuwarden.model.request.latency", "gpuwarden.model.requests"),
        _table(
            statistic=_p(_T.STR, "p95", None, None, "What is compared.", _STATISTICS),
            direction=_p(_T.STR, "increase", None, None, "Which change is bad.", _DIRECTIONS),
            window_seconds=_p(_T.DURATION, _HOUR, 5 * _MINUTE, _DAY, "Window judged."),
            history_seconds=_p(_T.DURATION, 14 * _DAY, _HOUR, 90 * _DAY, "Baseline history."),
            season_seconds=_p(_T.DURATION, _DAY, 0.0, 30 * _DAY,
                              "Seasonal period removed before comparing (0: none)."),
            threshold=_p(_T.FLOAT, 4.0, 1.0, 50.0,
                         "Robust z-score of the deseasonalised residual that counts (raised "
                         "for a counter's rate whose bins have a heavy bad tail)."),
            min_relative_change=_p(_T.FLOAT, 0.2, 0.0, 10.0,
                                   "And the change must be at least this share of the baseline."),
        ), requires=("metrics",), check=_check_seasonal),
    DetectorSpec(
        "deploy_regression", "A metric got worse right after a deploy event.", (_D,),
        ("gpuwarden.model.request.latency", "gpuwarden.model.requests"),
        _table(
            statistic=_p(_T.STR, "p95", None, None, "What is compared.", _STATISTICS),
            direction=_p(_T.STR, "increase", None, None, "Which change is bad.", _DIRECTIONS),
            before_seconds=_p(_T.DURATION, 30 * _MINUTE, 5 * _MINUTE, _DAY,
                              "Window before the deploy."),
            after_seconds=_p(_T.DURATION, 30 * _MINUTE, 5 * _MINUTE, _DAY,
                             "Window after the deploy (after settling)."),
            settle_seconds=_p(_T.DURATION, 5 * _MINUTE, 0.0, _HOUR,
                              "Warm-up right after the deploy that is ignored."),
            test=_p(_T.STR, "mann_whitney", None, None, "Two-sample test.",
                    ("mann_whitney", "ks", "welch")),
            p_value_below=_p(_T.FLOAT, 0.01, 1e-9, 0.2, "Significance level."),
            min_relative_change=_p(_T.FLOAT, 0.1, 0.0, 10.0,
                                   "And the change must be at least this share of before."),
        ), requires=("metrics",)),
    DetectorSpec(
        "distribution_drift", "A histogram's distribution moved away from its reference.", (_D,),
        ("gpuwarden.model.request.latency", "gpuwarden.model.time_to_first_token"),
        _table(
            method=_p(_T.STR, "jensen_shannon", None, None, "Distance or test.",
                      ("jensen_shannon", "wasserstein", "psi", "ks")),
            threshold=_p(_T.FLOAT, 0.1, 0.0, 10.0, "Distance above which a window drifted."),
            window_seconds=_p(_T.DURATION, _HOUR, 5 * _MINUTE, 7 * _DAY, "Window judged."),
            reference_seconds=_p(_T.DURATION, 7 * _DAY, _HOUR, 90 * _DAY, "Reference period."),
            same_phase=_p(_T.BOOL, True, None, None,
                          "Compare with the same hour of day in the reference (seasonality)."),
            persistence=_p(_T.INT, 3, 1, 100, "Consecutive drifted windows before a finding."),
        ), requires=("metrics",), check=_check_reference),
    DetectorSpec(
        "slo_burn", "Multi-window, multi-burn-rate SLO alert (Google SRE workbook).", (_D,),
        ("gpuwarden.model.requests",),
        _table(
            objective=_p(_T.FLOAT, 0.999, 0.5, 0.99999, "Share of good events promised."),
            period_seconds=_p(_T.DURATION, 30 * _DAY, _DAY, 90 * _DAY, "SLO period."),
            long_windows_seconds=_p(_T.DURATION_LIST, (_HOUR, 6 * _HOUR), _MINUTE, 90 * _DAY,
                                    "Long window of each pair."),
            short_windows_seconds=_p(_T.DURATION_LIST, (5 * _MINUTE, 30 * _MINUTE), _MINUTE,
                                     90 * _DAY, "Short window of each pair (about 1/12)."),
            burn_rates=_p(_T.FLOAT_LIST, (14.4, 6.0), 0.1, 1000.0,
                          "Fires when both windows of a pair burn faster than this."),
            error_outcomes=_p(_T.STR_LIST, ("failure",), None, None,
                              "Values of the 'outcome' attribute that count as errors."),
        ), requires=("metrics",), check=_check_burn),
    DetectorSpec(
        "demand_forecast", "Forecast demand will exceed capacity within the horizon.", (_D,),
        ("gpuwarden.model.requests", "gpuwarden.model.queue.size"),
        _table(
            horizon_seconds=_p(_T.DURATION, 30 * _MINUTE, 5 * _MINUTE, _DAY, "Look-ahead."),
            history_seconds=_p(_T.DURATION, 14 * _DAY, _DAY, 90 * _DAY, "History fitted."),
            season_seconds=_p(_T.DURATION, _DAY, 0.0, 30 * _DAY, "Seasonal period (0: none)."),
            interval_level=_p(_T.FLOAT, 0.95, 0.5, 0.999, "Prediction interval level."),
            capacity_utilization_above=_p(_T.FLOAT, 0.8, 0.1, 1.0,
                                          "Fires when the interval's upper bound exceeds this "
                                          "share of capacity."),
        ), requires=("metrics",), check=_check_seasonal),
    DetectorSpec(
        "hardware_fault", "A GPU reported a fault that needs the node drained or repaired.",
        (_N, _J),
        ("gpuwarden.gpu.xid.errors", "hw.errors", "gpuwarden.gpu.memory.remap_failure",
         "hw.status"),
        _table(
            xid_codes=_p(_T.INT_LIST, (48, 63, 64, 74, 79, 92, 94, 95), 1, 1000,
                         "XID codes of concern."),
            uncorrected_ecc=_p(_T.BOOL, True, None, None, "Any uncorrected ECC error."),
            remap_failure=_p(_T.BOOL, True, None, None, "A failed row remapping."),
            gpu_lost=_p(_T.BOOL, True, None, None, "The GPU fell off the bus or went missing."),
        ), check=_check_hardware),
    DetectorSpec(
        "preemption", "Jobs are being preempted (spot reclaim, priority).", (_J,),
        ("gpuwarden.gpu.info",),
        _table(
            window_seconds=_p(_T.DURATION, _HOUR, 5 * _MINUTE, 7 * _DAY, "Counting window."),
            min_preemptions=_p(_T.INT, 1, 1, 1000, "Preemptions of one job in the window."),
            price_tiers=_p(_T.STR_LIST, ("on-demand", "spot", "reserved"), None, None,
                           "Price tiers watched.", ("on-demand", "spot", "reserved")),
        )),
    DetectorSpec(
        "metric_anomaly",
        "A selected metric did what it never did in its recent history (the NAB-scored "
        "nearest-neighbour/novelty/step scorer, causal, at one-minute resolution).",
        (_J, _N, _D), (),
        _table(
            history_seconds=_p(_T.DURATION, 12 * _HOUR, 6 * _HOUR, 7 * _DAY,
                               "History each minute is judged against (needs 5 h of data)."),
            recent_seconds=_p(_T.DURATION, 3 * _MINUTE, _MINUTE, _HOUR,
                              "Newest window in which a high score is a finding."),
            score_above=_p(_T.FLOAT, 0.5328, 0.5, 0.99,
                           "Score threshold (0.5328: fixed on NAB split A, 61.8 standard)."),
            max_series=_p(_T.INT, 200, 1, 5000,
                          "Series scored per cycle (about 30 ms each); the rest are reported."),
        ), requires=("metrics",)),
    DetectorSpec(
        "level_shift",
        "A selected series moved to a new level and stayed there: screened on every series "
        "at once, confirmed with statsmodels (STL, prewhitened break test, AR(1) interval).",
        (_J, _N, _D), ("hw.gpu.utilization", "hw.power", "hw.temperature"),
        _table(
            window_seconds=_p(_T.DURATION, _HOUR, 10 * _MINUTE, 3 * _HOUR,
                              "Window judged (full resolution: the store's recent ring)."),
            baseline_seconds=_p(_T.DURATION, _HOUR, 10 * _MINUTE, 3 * _HOUR,
                                "History before the window it is compared with."),
            hold_seconds=_p(_T.DURATION, 6 * _MINUTE, _MINUTE, 3 * _HOUR,
                            "How long the smoothed shift must hold (known samples)."),
            z_above=_p(_T.FLOAT, 6.0, 2.0, 50.0,
                       "Robust sigmas of the smoothed baseline that count as shifted."),
            direction=_p(_T.STR, "both", None, None, "Which change counts.", _DIRECTIONS),
            min_change=_p(_T.FLOAT, 0.0, 0.0, 1e12,
                          "Smallest change that counts: the mean of the last hold_seconds "
                          "against the baseline's mean (metric's unit)."),
            ignore_below=_p(_T.FLOAT, -1e12, -1e12, 1e12,
                            "A shift to a new level below this is left to other rules (e.g. "
                            "utilisation fallen to idle: the idle rules'); default: none."),
            noise_floor=_p(_T.FLOAT, 0.01, 1e-9, 1e12,
                           "Smallest noise sigma assumed (metric's unit): flat series."),
            season_seconds=_p(_T.DURATION, 0.0, 0.0, 3 * _HOUR,
                              "Seasonal period STL removes before confirming (0: none)."),
            max_fits=_p(_T.INT, 100, 1, 10_000,
                        "Statsmodels fits per cycle (about 70 ms each): new series first, "
                        "then due refits; the rest wait."),
        ), requires=("metrics",), check=_check_level_shift),
    DetectorSpec(
        "alertmanager",
        "An alert from the user's own Prometheus rules, received from Alertmanager's webhook "
        "(POST /v1/alertmanager); selector.labels pick the alerts.", (_J, _N, _D), (),
        _table(
            job_label=_p(_T.STR, "job_key", None, None,
                         "Alert label holding the gpuwarden job key (slurm:..., k8s:...)."),
            node_label=_p(_T.STR, "node", None, None, "Alert label holding the node name."),
            deployment_label=_p(_T.STR, "model", None, None,
                                "Alert label holding the model deployment."),
        ), requires=("labels",)),
)})

ACTIONS: Mapping[str, ActionKindSpec] = MappingProxyType({spec.kind: spec for spec in (
    ActionKindSpec("requeue", "Requeue the job (Slurm scontrol requeue, Kubernetes re-create).",
                   _J, _table(max_attempts=_p(_T.INT, 1, 1, 10, "Requeues per incident."))),
    ActionKindSpec("scale_up", "Add replicas to the deployment.", _D, _table(
        step_replicas=_p(_T.INT, 1, 1, 100, "Replicas added per action."),
        max_replicas=_p(_T.INT, 32, 1, 10_000, "Never scale beyond this."))),
    ActionKindSpec("degrade", "Route traffic to the deployment's smaller fallback model.", _D,
                   _table(traffic_ratio=_p(_T.FLOAT, 0.5, 0.0, 1.0,
                                           "Share of traffic sent to the fallback."))),
    ActionKindSpec("drain", "Drain the node so no new job lands on it.", _N,
                   _table(reason=_p(_T.STR, "gpuwarden: GPU hardware fault", None, None,
                                    "Reason recorded with the scheduler."))),
    ActionKindSpec("notify", "Tell the rule's routes; takes no action.", None, _table()),
    ActionKindSpec("webhook", "POST the finding to a webhook configured in the collector.", None,
                   _table(name=_p(_T.STR, None, None, None,
                                  "Name of the configured webhook (no URLs or secrets in "
                                  "rules)."))),
)})

ROUTE_SCHEMES: Mapping[str, str] = MappingProxyType({
    "slack": "a Slack channel, e.g. slack:#gpu-alerts",
    "pagerduty": "a PagerDuty service configured in the collector, e.g. pagerduty:ml-oncall",
    "alertmanager": "an Alertmanager receiver, e.g. alertmanager:gpu-team",
    "webhook": "a webhook configured in the collector, e.g. webhook:ticketing",
})
# fmt: on
