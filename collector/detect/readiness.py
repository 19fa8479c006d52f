"""Per-rule readiness: whether each rule judges on all the history it asks for, or warms up.

After a start (a restart without a snapshot, a new collector) a rule whose window or history is
longer than the data the store holds judges on less than it was tuned for, or on nothing:
``model_drift`` and ``demand_forecast`` want 14 days, ``distribution_drift`` a week of reference,
``forgotten_gpu`` a day. This says so, per rule:

- ``ready``: the store holds data back to the start of the rule's lookback;
- ``warming up``: until ``held_since + lookback`` (``until``; None while the store holds no
  data at all);
- ``skipped``: the rule does not run (disabled, a detector this collector lacks, or it failed
  validation under ``skip_bad_rules``), with the reason.

The lookback is derived from the detector's declared parameters, never a table of numbers: the
longest of its *extent* parameters (the window judged, the history fitted, the longest SLO window,
how long something must have lasted), plus the *preceding* ones (a baseline or reference period
that comes before the window). Other durations (horizons, seasons, hold times) are not data
the rule must have seen. A lookback longer than the store keeps (its long window) is capped
there: waiting longer would not bring more data. ``distribution_drift`` keeps its reference in
memory, rebuilt at start from the recent window only (histograms are not kept longer), so its
data goes back at most one recent window before the collector started. Rules of detectors that
read only stored events or pushed alerts need no history.

Histograms (model latencies) are kept in the store's recent window and its snapshot, but never
written to the TSDB, so a warm start from the TSDB (``remote_write.read_url``) brings back the
gauges and counters only: a rule that reads a histogram (:data:`HISTOGRAM_METRICS`, in its
detector's signals or its selector's metrics) counts its data from when the histograms' history
starts (the snapshot's data, or this collector's start), and says so in its ``note``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gpuwarden.collector.detect.catalog import DETECTORS
from gpuwarden.collector.detect.contract import Detector
from gpuwarden.collector.ingest.scrape import MODEL_METRICS
from gpuwarden.collector.rules.model import Rule, RuleProblem
from gpuwarden.collector.store.window import WindowStore

EXTENT_PARAMETERS = (
    "window_seconds",
    "history_seconds",
    "long_windows_seconds",
    "before_seconds",
    "grace_seconds",
)
"""Parameters that each span the data a rule reads back from now: the longest counts."""
PRECEDING_PARAMETERS = ("baseline_seconds", "reference_seconds")
"""Parameters that span data before the judged window: added to it."""
NO_HISTORY = frozenset({"preemption", "alertmanager", "policy_breach"})
"""Detectors that read stored events or pushed alerts, not the store's history."""
MEMORY_KEPT = frozenset({"distribution_drift"})
"""Detectors whose history lives in their own state, rebuilt from the recent window at start."""
HISTOGRAM_METRICS = frozenset(m.name for m in MODEL_METRICS if m.source_type == "histogram")
"""Metrics that arrive as histograms: kept by the snapshot, never by the TSDB."""


class State(StrEnum):
    """A rule's readiness."""

    READY = "ready"
    WARMING_UP = "warming up"
    SKIPPED = "skipped"


@dataclass(frozen=True, slots=True)
class RuleReadiness:
    """One rule's readiness (see the module)."""

    rule_id: str
    detector: str
    state: State
    lookback_seconds: float = 0.0
    until: float | None = None
    """When a warming-up rule's lookback will be covered (None: not known yet)."""
    reason: str | None = None
    """Why a rule is skipped."""
    note: str | None = None
    """What part of its data could not come back after a restart (histograms from the TSDB)."""

    def text(self) -> str:
        """``ready``, ``warming up until <UTC time>`` or ``skipped: <reason>`` (then the note)."""
        if self.state is State.SKIPPED:
            return f"skipped: {self.reason}"
        if self.state is State.WARMING_UP:
            text = (
                "warming up (no data yet)"
                if self.until is None
                else f"warming up until {_utc(self.until)}"
            )
        else:
            text = "ready"
        return text if self.note is None else f"{text} ({self.note})"

    def as_json(self) -> dict[str, Any]:
        """The JSON form ``/readyz`` shows."""
        out: dict[str, Any] = {
            "rule": self.rule_id,
            "detector": self.detector,
            "state": str(self.state),
            "text": self.text(),
            "lookback_seconds": self.lookback_seconds,
        }
        if self.state is State.WARMING_UP:
            out["until"] = self.until
        if self.reason is not None:
            out["reason"] = self.reason
        if self.note is not None:
            out["note"] = self.note
        return out


def _utc(t: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


def lookback_seconds(params: object) -> float:
    """The history a rule with these typed parameters reads back from now (see the module)."""
    if not dataclasses.is_dataclass(params):
        return 0.0
    values = {f.name: getattr(params, f.name) for f in dataclasses.fields(params)}

    def seconds(value: object) -> float:
        if isinstance(value, tuple):
            return max((float(v) for v in value), default=0.0)
        return float(value) if isinstance(value, int | float) else 0.0

    extent = max((seconds(values[n]) for n in EXTENT_PARAMETERS if n in values), default=0.0)
    return extent + sum(seconds(values[n]) for n in PRECEDING_PARAMETERS if n in values)


@dataclass(frozen=True, slots=True)
class Coverage:
    """How far back the data a rule could read goes."""

    held_since: float | None
    """Start of the oldest data the store holds (``WindowStore.held_since``)."""
    long_seconds: float
    """How far back the store keeps data at all."""
    recent_seconds: float
    """How far back it keeps full resolution and histograms."""
    started_at: float
    """When this collector started (its in-memory detector state began then)."""
    histograms_since: float | None = None
    """After a warm start from the TSDB, the start of the histograms' history (what the
    snapshot restored, else the collector's start): gauges and counters came back from the
    TSDB, histograms did not. None: no warm start from the TSDB (all data starts alike)."""


def readiness(
    rules: Iterable[Rule],
    problems: Iterable[RuleProblem | str],
    detectors: Mapping[str, Detector[Any]],
    coverage: Coverage,
    now: float,
) -> list[RuleReadiness]:
    """Every rule's readiness, then a ``skipped`` line per rule that failed to load."""
    out = [_one(rule, detectors.get(rule.detector), coverage, now) for rule in rules]
    for problem in problems:
        rule_id = problem.rule_id if isinstance(problem, RuleProblem) else None
        out.append(
            RuleReadiness(
                rule_id=rule_id or "?",
                detector="?",
                state=State.SKIPPED,
                reason=f"did not load: {problem}",
            )
        )
    return out


def _one(
    rule: Rule, detector: Detector[Any] | None, coverage: Coverage, now: float
) -> RuleReadiness:
    name = rule.detector
    skipped = (
        "disabled" if not rule.enabled else "no such detector here" if detector is None else None
    )
    if skipped is not None or detector is None:
        return RuleReadiness(rule.id, name, State.SKIPPED, reason=skipped)
    if name in NO_HISTORY or detector.run is None:
        return RuleReadiness(rule.id, name, State.READY)
    lookback = lookback_seconds(detector.bind(rule))
    since = coverage.held_since
    note = None
    histograms = sorted(
        HISTOGRAM_METRICS.intersection((*detector.spec.signals, *rule.selector.metrics))
    )
    start = coverage.histograms_since
    if histograms and since is not None and start is not None and start > since:
        since = start
        note = f"{', '.join(histograms)}: histograms, not in the TSDB, held since {_utc(start)}"
    if name in MEMORY_KEPT and since is not None:
        since = max(since, coverage.started_at - coverage.recent_seconds)
    elif name not in MEMORY_KEPT:
        lookback = min(lookback, coverage.long_seconds)
    until = None if since is None else since + lookback
    if lookback <= 0 or (until is not None and until <= now):
        return RuleReadiness(rule.id, name, State.READY, lookback, note=note)
    return RuleReadiness(rule.id, name, State.WARMING_UP, lookback, until=until, note=note)


def summary(states: Sequence[RuleReadiness]) -> dict[str, int]:
    """How many rules are in each state."""
    counts = {str(s): 0 for s in State}
    for state in states:
        counts[str(state.state)] += 1
    return counts


class RuleBoard:
    """The running collector's rules, judged against its store on demand (``/readyz``)."""

    def __init__(
        self,
        rules: Sequence[Rule],
        problems: Sequence[RuleProblem | str],
        store: WindowStore,
        *,
        started_at: float,
        clock: Callable[[], float],
        detectors: Mapping[str, Detector[Any]] = DETECTORS,
        histograms_since: float | None = None,
    ) -> None:
        self._histograms_since = histograms_since
        self._rules = tuple(rules)
        self._problems = tuple(problems)
        self._store = store
        self._started_at = started_at
        self._clock = clock
        self._detectors = detectors

    def states(self) -> list[RuleReadiness]:
        """Every rule's readiness now."""
        store = self._store
        coverage = Coverage(
            held_since=store.held_since(),
            long_seconds=float(store.long_seconds),
            recent_seconds=float(store.recent_seconds),
            started_at=self._started_at,
            histograms_since=self._histograms_since,
        )
        return readiness(self._rules, self._problems, self._detectors, coverage, self._clock())
