"""Detection rules as data: ``rules/*.yaml`` parsed once into frozen, typed objects.

A rule names a detector from one vocabulary (``DETECTORS``: each detector's parameters with type,
default and range), the series it watches (a ``Selector``), what to do about a finding (actions
from a second vocabulary, ``ACTIONS``, each ``auto``, ``approve`` or ``notify``) and whom to tell
(routes such as ``slack:#gpu-alerts``). Everything is checked at load time, so nothing downstream
ever sees an unknown key or a value out of range; an error names the file, the rule and the key::

    team.yaml: rules[2] (idle-gpu).parameters.window_seconds: must be between 1m and 1w (got 10)

``load_rules`` either raises on the first error (the collector's default: refuse to start) or,
with ``skip_bad``, loads the good rules and returns the bad ones as ``RuleProblem`` objects.

File format::

    version: 1            # optional; the only version so far
    rules:
      - id: idle-gpu      # lowercase letters, digits, '-' and '_'; unique across all files
        detector: idle_gpu
        selector: {teams: ["ml-*"], labels: {cluster: a100}}
        parameters: {window_seconds: 30m, utilization_below: 0.05}
        severity: warning # info | warning | critical | page
        owner: ml-platform
        runbook: idle-gpu.md                    # relative to the runbooks folder
        actions: [{kind: requeue, mode: approve}]
        routes: ["slack:#gpu-waste"]

Durations (parameters ending in ``_seconds``) take a number of seconds or ``90s``, ``30m``,
``1h30m``, ``7d``, ``2w``. Files are read with a ``yaml.SafeLoader`` subclass that also refuses
duplicate keys (plain YAML keeps the last one silently), and are capped at ``MAX_FILE_BYTES``.
"""

from __future__ import annotations

import difflib
import fnmatch
import importlib.resources
import math
import re
import reprlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path, PurePosixPath
from types import MappingProxyType
from typing import Any, Final, cast

import yaml

MAX_FILE_BYTES: Final = 1024 * 1024
"""Rule files larger than this are refused (a rule set is kilobytes; this bounds YAML bombs)."""
RULE_FILE_SUFFIXES: Final = (".yaml", ".yml")
FILE_VERSION: Final = 1


class Severity(StrEnum):
    """How loud a finding is: ``page`` wakes someone up."""

    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"
    PAGE = "page"


class ActionMode(StrEnum):
    """Who decides: ``auto`` acts, ``approve`` waits for a human, ``notify`` only proposes."""

    AUTO = "auto"
    APPROVE = "approve"
    NOTIFY = "notify"


class Subject(StrEnum):
    """What a detector's finding is about, and what an action acts on."""

    JOB = "job"
    NODE = "node"
    DEPLOYMENT = "deployment"


class ParamType(StrEnum):
    """Value types of detector and action parameters."""

    BOOL = "bool"
    INT = "int"
    FLOAT = "float"
    STR = "str"
    DURATION = "duration"
    INT_LIST = "list[int]"
    FLOAT_LIST = "list[float]"
    STR_LIST = "list[str]"
    DURATION_LIST = "list[duration]"


ParamValue = bool | int | float | str | tuple[int, ...] | tuple[float, ...] | tuple[str, ...]
"""A parameter after loading: durations are float seconds, lists are tuples."""


@dataclass(frozen=True, slots=True)
class ParamSpec:
    """One parameter: type, default (``None``: required), inclusive range, description.

    For lists, ``minimum``/``maximum``/``choices`` apply to each element.
    """

    type: ParamType
    default: ParamValue | None
    minimum: float | None
    maximum: float | None
    description: str
    choices: tuple[str, ...] = ()


CrossCheck = Callable[[Mapping[str, ParamValue]], tuple[str, str] | None]
"""Checks parameters against each other; returns ``(parameter, what is wrong)`` or ``None``."""


@dataclass(frozen=True, slots=True)
class DetectorSpec:
    """A detector in the vocabulary: what it finds, about what, from which signals, with what."""

    name: str
    description: str
    subjects: tuple[Subject, ...]
    signals: tuple[str, ...]
    """Metrics it reads when the selector names none (empty: scheduler events, not metrics)."""
    parameters: Mapping[str, ParamSpec]
    requires: tuple[str, ...] = ()
    """Selector fields that must not be empty (the detector cannot guess which series)."""
    check: CrossCheck | None = None


@dataclass(frozen=True, slots=True)
class ActionKindSpec:
    """An action in the vocabulary; ``target`` ``None`` means it fits any finding."""

    kind: str
    description: str
    target: Subject | None
    parameters: Mapping[str, ParamSpec]


@dataclass(frozen=True, slots=True)
class Selector:
    """Which series a rule watches. Empty fields match everything.

    ``metrics`` are exact metric names; ``teams``, ``jobs``, ``models`` and ``nodes`` are
    case-sensitive glob patterns (``ml-*``); ``labels`` must all match exactly.
    """

    metrics: tuple[str, ...] = ()
    teams: tuple[str, ...] = ()
    jobs: tuple[str, ...] = ()
    models: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ()
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def matches(
        self,
        *,
        team: str | None = None,
        job: str | None = None,
        model: str | None = None,
        node: str | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> bool:
        """Whether a subject with these facts is selected (a missing fact fails a pattern)."""
        for patterns, value in (
            (self.teams, team),
            (self.jobs, job),
            (self.models, model),
            (self.nodes, node),
        ):
            if patterns and (
                value is None or not any(fnmatch.fnmatchcase(value, p) for p in patterns)
            ):
                return False
        given = labels or {}
        return all(given.get(key) == value for key, value in self.labels.items())


@dataclass(frozen=True, slots=True)
class ActionSpec:
    """One action of a rule: kind (``ACTIONS``), mode, parameters with defaults filled in."""

    kind: str
    mode: ActionMode
    parameters: Mapping[str, ParamValue] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True, slots=True)
class RuleSource:
    """Where a rule was defined: file and position in its ``rules`` list."""

    file: str
    index: int

    def __str__(self) -> str:
        return f"{self.file} rules[{self.index}]"


@dataclass(frozen=True, slots=True, kw_only=True)
class Rule:
    """A validated rule; ``parameters`` holds every parameter of its detector (defaults filled)."""

    id: str
    detector: str
    selector: Selector
    parameters: Mapping[str, ParamValue]
    severity: Severity
    owner: str
    runbook: str
    actions: tuple[ActionSpec, ...] = ()
    routes: tuple[str, ...] = ()
    description: str = ""
    enabled: bool = True
    source: RuleSource = RuleSource("<inline>", 0)


@dataclass(frozen=True, slots=True)
class RuleProblem:
    """A file or rule that did not load. ``key`` is relative to the rule when ``index`` is set."""

    file: str
    key: str
    message: str
    index: int | None = None
    rule_id: str | None = None

    def __str__(self) -> str:
        where = self.file
        if self.index is not None:
            where += f": rules[{self.index}] ({self.rule_id or '?'})"
            return f"{where}.{self.key}: {self.message}" if self.key else f"{where}: {self.message}"
        return f"{where}: {self.key}: {self.message}" if self.key else f"{where}: {self.message}"


class RuleError(ValueError):
    """A rules file is broken; ``str()`` names the file, rule and key."""

    def __init__(self, problem: RuleProblem) -> None:
        super().__init__(str(problem))
        self.problem = problem


@dataclass(frozen=True, slots=True)
class RuleSet:
    """The rules that loaded and, with ``skip_bad``, the problems of those that did not."""

    rules: tuple[Rule, ...]
    problems: tuple[RuleProblem, ...] = ()

    def get(self, rule_id: str) -> Rule | None:
        """The rule with this id, or ``None``."""
        return next((rule for rule in self.rules if rule.id == rule_id), None)

    def enabled(self) -> tuple[Rule, ...]:
        """The rules to run."""
        return tuple(rule for rule in self.rules if rule.enabled)


# --- vocabularies --------------------------------------------------------------------------------

_MINUTE, _HOUR, _DAY = 60.0, 3600.0, 86400.0
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

# --- loading -------------------------------------------------------------------------------------

_ID = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
_ID_TEXT = "lowercase letters, digits, '-' and '_' (at most 63, starting with a letter or digit)"
_METRIC = re.compile(r"[A-Za-z_][A-Za-z0-9_.:]*")
_METRIC_TEXT = "a metric name: letters, digits, '_', '.' and ':'"
_ROUTE = re.compile(r"([a-z]+):(\S+)")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_UNITS = {"w": 7 * _DAY, "d": _DAY, "h": _HOUR, "m": _MINUTE, "s": 1.0}
_FILE_KEYS = ("rules", "version")
_RULE_KEYS = (
    "id",
    "detector",
    "selector",
    "parameters",
    "severity",
    "owner",
    "runbook",
    "actions",
    "routes",
    "description",
    "enabled",
)
_SELECTOR_KEYS = ("metrics", "teams", "jobs", "models", "nodes", "labels")
_ACTION_KEYS = ("kind", "mode", "parameters")
_repr = reprlib.Repr()  # Python 3.11's Repr takes no arguments
_repr.maxstring = _repr.maxother = 60
_show = _repr.repr  # bounded: an aliased YAML structure cannot blow up an error message


class _InvalidError(Exception):
    """One thing wrong at ``key`` (a dotted path, relative to the rule or file)."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key, self.message = key, message


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _unknown(what: str, value: object, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(str(value), known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown {what} {_show(value)}{hint} (known: {', '.join(known)})"


def format_number(value: float) -> str:
    """``5.0`` → ``5``, ``0.05`` → ``0.05`` (for messages and docs)."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def format_duration(seconds: float) -> str:
    """``1800.0`` → ``30m``; the largest unit that divides the value exactly, else seconds."""
    for unit, size in _UNITS.items():
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def parse_duration(value: object) -> float:
    """Seconds from a number or a string like ``90s``, ``30m``, ``1h30m``, ``7d``, ``2w``."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        text = value.strip().lower()
        if text and _DURATION_PART.sub("", text) == "":
            return sum(float(n) * _UNITS[u] for n, u in _DURATION_PART.findall(text))
    raise ValueError(
        f"expected a duration such as 90s, 30m, 24h, 7d or seconds, got {_show(value)}"
    )


def _mapping(value: object, key: str, known: Sequence[str] | None) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise _InvalidError(key, f"expected a mapping, got {_show(value)}")
    for name in value:
        if not isinstance(name, str):
            raise _InvalidError(key, f"keys must be strings, got {_show(name)}")
        if known is not None and name not in known:
            raise _InvalidError(_join(key, name), _unknown("key", name, known))
    return value


def _string(value: object, key: str, pattern: tuple[re.Pattern[str], str] | None = None) -> str:
    """A non-empty string; ``pattern`` is a regex and what it means in words."""
    if not isinstance(value, str) or not value.strip():
        raise _InvalidError(key, f"expected a non-empty string, got {_show(value)}")
    if pattern is not None and not pattern[0].fullmatch(value):
        raise _InvalidError(key, f"{_show(value)}: expected {pattern[1]}")
    return value


def _strings(
    value: object, key: str, pattern: tuple[re.Pattern[str], str] | None = None
) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise _InvalidError(key, f"expected a list of strings, got {_show(value)}")
    return tuple(_string(item, f"{key}[{i}]", pattern) for i, item in enumerate(value))


def _bounds(spec: ParamSpec, show: Callable[[float], str]) -> str:
    low, high = spec.minimum, spec.maximum
    if low is not None and high is not None:
        return f"between {show(low)} and {show(high)}"
    return f"at least {show(low)}" if low is not None else f"at most {show(high or 0.0)}"


def _scalar(spec: ParamSpec, value: object, key: str) -> bool | int | float | str:
    """One value (or list element) of ``spec``'s type, range and choices."""
    base = spec.type.removeprefix("list[").removesuffix("]")
    if base == "bool":
        if not isinstance(value, bool):
            raise _InvalidError(key, f"expected true or false, got {_show(value)}")
        return value
    if base == "str":
        text = _string(value, key)
        if spec.choices and text not in spec.choices:
            raise _InvalidError(key, _unknown("value", text, spec.choices))
        return text
    number: float
    if base == "duration":
        try:
            number = parse_duration(value)
        except ValueError as exc:
            raise _InvalidError(key, str(exc)) from None
    elif base == "int" and (isinstance(value, bool) or not isinstance(value, int)):
        raise _InvalidError(key, f"expected an integer, got {_show(value)}")
    elif isinstance(value, bool) or not isinstance(value, int | float):
        raise _InvalidError(key, f"expected a number, got {_show(value)}")
    else:
        number = value
    if not math.isfinite(number):
        raise _InvalidError(key, f"expected a finite number, got {_show(value)}")
    low, high = spec.minimum, spec.maximum
    if (low is not None and number < low) or (high is not None and number > high):
        show = format_duration if base == "duration" else format_number
        raise _InvalidError(key, f"must be {_bounds(spec, show)} (got {_show(value)})")
    return float(number) if base in ("float", "duration") else number


def _params(
    raw: object, key: str, table: Mapping[str, ParamSpec], owner: str
) -> Mapping[str, ParamValue]:
    given = _mapping(raw if raw is not None else {}, key, None)
    out: dict[str, ParamValue] = {}
    for name, value in given.items():
        spec = table.get(name)
        if spec is None:
            known = tuple(table) or ("(none)",)
            raise _InvalidError(_join(key, name), _unknown(f"parameter of {owner}", name, known))
        if spec.type.startswith("list["):
            if not isinstance(value, list):
                raise _InvalidError(_join(key, name), f"expected a list, got {_show(value)}")
            items = [_scalar(spec, v, f"{_join(key, name)}[{i}]") for i, v in enumerate(value)]
            out[name] = cast("ParamValue", tuple(items))
        else:
            out[name] = _scalar(spec, value, _join(key, name))
    for name, spec in table.items():
        if name not in out:
            if spec.default is None:
                raise _InvalidError(_join(key, name), f"required by {owner}")
            out[name] = spec.default
    return MappingProxyType(out)


def _selector(raw: object, detector: DetectorSpec) -> Selector:
    data = _mapping(raw if raw is not None else {}, "selector", _SELECTOR_KEYS)
    fields: dict[str, Any] = {}
    for name in _SELECTOR_KEYS[:-1]:
        if name in data:
            pattern = (_METRIC, _METRIC_TEXT) if name == "metrics" else None
            fields[name] = _strings(data[name], f"selector.{name}", pattern)
    labels = _mapping(data.get("labels", {}), "selector.labels", None)
    fields["labels"] = MappingProxyType(
        {k: _string(v, f"selector.labels.{k}") for k, v in labels.items()}
    )
    for name in detector.requires:
        if not fields.get(name):
            raise _InvalidError(
                f"selector.{name}", f"detector {detector.name} needs at least one entry"
            )
    return Selector(**fields)


def _runbook(raw: object, runbooks_dir: Path | None) -> str:
    name = _string(raw, "runbook")
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts or "\\" in name or path.suffix != ".md":
        raise _InvalidError(
            "runbook", f"{_show(name)}: expected a .md path inside the runbooks folder"
        )
    if runbooks_dir is not None and not (runbooks_dir / path).is_file():
        raise _InvalidError("runbook", f"no such runbook: {runbooks_dir / path}")
    return name


def _actions(raw: object, detector: DetectorSpec) -> tuple[ActionSpec, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise _InvalidError("actions", f"expected a list of actions, got {_show(raw)}")
    actions = []
    for i, item in enumerate(raw):
        key = f"actions[{i}]"
        data = _mapping(item, key, _ACTION_KEYS)
        if "kind" not in data:
            raise _InvalidError(f"{key}.kind", "required")
        spec = ACTIONS.get(data["kind"]) if isinstance(data["kind"], str) else None
        if spec is None:
            raise _InvalidError(
                f"{key}.kind", _unknown("action kind", data["kind"], tuple(ACTIONS))
            )
        if spec.target is not None and spec.target not in detector.subjects:
            finds = " or ".join(detector.subjects)
            message = f"{spec.kind} acts on a {spec.target}; {detector.name} finds {finds} problems"
            raise _InvalidError(f"{key}.kind", message)
        mode = data.get("mode", ActionMode.NOTIFY)
        if mode not in tuple(ActionMode):
            raise _InvalidError(f"{key}.mode", _unknown("mode", mode, tuple(ActionMode)))
        params = _params(data.get("parameters"), f"{key}.parameters", spec.parameters, spec.kind)
        actions.append(ActionSpec(spec.kind, ActionMode(mode), params))
    return tuple(actions)


def _routes(raw: object) -> tuple[str, ...]:
    routes = _strings(raw if raw is not None else [], "routes")
    for i, route in enumerate(routes):
        match = _ROUTE.fullmatch(route)
        if match is None:
            raise _InvalidError(f"routes[{i}]", f"{_show(route)}: expected <scheme>:<target>")
        if match.group(1) not in ROUTE_SCHEMES:
            message = _unknown("route scheme", match.group(1), tuple(ROUTE_SCHEMES))
            raise _InvalidError(f"routes[{i}]", message)
    return routes


def _rule(raw: object, source: RuleSource, runbooks_dir: Path | None) -> Rule:
    data = _mapping(raw, "", _RULE_KEYS)
    for name in ("id", "detector", "severity", "owner", "runbook"):
        if name not in data:
            raise _InvalidError(name, "required")
    rule_id = _string(data["id"], "id", (_ID, _ID_TEXT))
    detector = DETECTORS.get(data["detector"]) if isinstance(data["detector"], str) else None
    if detector is None:
        raise _InvalidError("detector", _unknown("detector", data["detector"], tuple(DETECTORS)))
    severity = data["severity"]
    if severity not in tuple(Severity):
        raise _InvalidError("severity", _unknown("severity", severity, tuple(Severity)))
    enabled = data.get("enabled", True)
    if not isinstance(enabled, bool):
        raise _InvalidError("enabled", f"expected true or false, got {_show(enabled)}")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise _InvalidError("description", f"expected a string, got {_show(description)}")
    selector = _selector(data.get("selector"), detector)
    parameters = _params(data.get("parameters"), "parameters", detector.parameters, detector.name)
    if detector.check is not None and (wrong := detector.check(parameters)) is not None:
        raise _InvalidError(f"parameters.{wrong[0]}", wrong[1])
    return Rule(
        id=rule_id,
        detector=detector.name,
        selector=selector,
        parameters=parameters,
        severity=Severity(severity),
        owner=_string(data["owner"], "owner"),
        runbook=_runbook(data["runbook"], runbooks_dir),
        actions=_actions(data.get("actions"), detector),
        routes=_routes(data.get("routes")),
        description=description.strip(),
        enabled=enabled,
        source=source,
    )


class _Loader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses duplicate keys, which YAML would silently overwrite."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[str] = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                if key_node.value in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key_node.value!r}", key_node.start_mark
                    )
                seen.add(key_node.value)
        return super().construct_mapping(node, deep=deep)


def _read(path: Path) -> list[object]:
    """The ``rules`` list of one file; ``_InvalidError`` keys are file-level."""
    try:
        with path.open("rb") as stream:
            data = stream.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise _InvalidError("", f"cannot read: {exc.strerror}") from None
    if len(data) > MAX_FILE_BYTES:
        raise _InvalidError("", f"larger than {MAX_FILE_BYTES} bytes; split the rule set")
    try:
        loader = _Loader(data.decode("utf-8"))
        try:
            top = loader.get_single_data()
        finally:
            loader.dispose()
    except UnicodeDecodeError:
        raise _InvalidError("", "not UTF-8 text") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise _InvalidError("", f"not valid YAML{where}: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise _InvalidError("", f"not valid YAML: {exc}") from None
    except RecursionError:
        raise _InvalidError("", "not valid YAML: nested too deeply") from None
    if isinstance(top, dict) and "groups" in top and "rules" not in top:
        raise _InvalidError(
            "groups",
            "this looks like a Prometheus rules file; keep those out of the detection rules "
            "folder (e.g. in a prometheus/ subfolder)",
        )
    data_map = _mapping(top, "", _FILE_KEYS) if top is not None else None
    if data_map is None:
        raise _InvalidError("", "empty file: expected a mapping with a 'rules' list")
    version = data_map.get("version", FILE_VERSION)
    if version != FILE_VERSION or isinstance(version, bool):
        raise _InvalidError("version", f"unsupported version {_show(version)} (supported: 1)")
    if "rules" not in data_map:
        raise _InvalidError("rules", "required")
    rules = data_map["rules"]
    if not isinstance(rules, list):
        raise _InvalidError("rules", f"expected a list of rules, got {_show(rules)}")
    return rules


def rule_files(paths: Sequence[Path]) -> tuple[list[Path], list[RuleProblem]]:
    """Expand folders to their ``*.yaml``/``*.yml`` files (not recursive), in name order."""
    files: list[Path] = []
    problems: list[RuleProblem] = []
    for path in paths:
        if path.is_dir():
            found = sorted(p for p in path.iterdir() if p.suffix in RULE_FILE_SUFFIXES)
            if not found:
                problems.append(RuleProblem(str(path), "", "no *.yaml or *.yml rule files"))
            files.extend(p for p in found if p.is_file())
        elif path.is_file():
            files.append(path)
        else:
            problems.append(RuleProblem(str(path), "", "no such file or folder"))
    return files, problems


def load_rules(
    paths: Sequence[Path], *, runbooks_dir: Path | None, skip_bad: bool = False
) -> RuleSet:
    """Load and validate rule files (folders stand for the rule files directly in them).

    Args:
        paths: rule files or folders.
        runbooks_dir: where ``runbook`` paths must exist; ``None`` checks only their form.
        skip_bad: load what is valid and return the rest as ``problems`` instead of raising.

    Raises:
        RuleError: without ``skip_bad``, at the first problem.
    """
    files, problems = rule_files(paths)
    if problems and not skip_bad:
        raise RuleError(problems[0])
    rules: list[Rule] = []
    seen: dict[str, RuleSource] = {}

    def bad(problem: RuleProblem) -> None:
        if not skip_bad:
            raise RuleError(problem)
        problems.append(problem)

    for path in files:
        name = str(path)
        try:
            raws = _read(path)
        except _InvalidError as exc:
            bad(RuleProblem(name, exc.key, exc.message))
            continue
        for index, raw in enumerate(raws):
            raw_id = raw.get("id") if isinstance(raw, dict) else None
            rule_id = raw_id if isinstance(raw_id, str) else None
            try:
                rule = _rule(raw, RuleSource(name, index), runbooks_dir)
                if rule.id in seen:
                    raise _InvalidError(
                        "id", f"duplicate rule id, first defined in {seen[rule.id]}"
                    )
            except _InvalidError as exc:
                bad(RuleProblem(name, exc.key, exc.message, index, rule_id))
                continue
            seen[rule.id] = rule.source
            rules.append(rule)
    return RuleSet(tuple(rules), tuple(problems))


def _package_dir(package: str) -> Path:
    root = importlib.resources.files(package)
    if not isinstance(root, Path):  # a zip import: rules must be real files to be edited
        raise RuntimeError(f"{package} is not installed as a folder: {root}")
    return root


def default_rules_dir() -> Path:
    """The packaged default rules (``rules/`` in the source tree)."""
    return _package_dir("gpuwarden.rules")


def default_runbooks_dir() -> Path:
    """The packaged runbooks (``runbooks/`` in the source tree)."""
    return _package_dir("gpuwarden.runbooks")
