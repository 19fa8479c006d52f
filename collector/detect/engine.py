"""The detection cycle: run every enabled rule through its detector, fold into incidents.

Where a cycle runs: in the calling thread, or (``fork=True``, what the collector does) in a
child process forked for the cycle (``detect.fork``): the child runs the rules on a
copy-on-write view of the store and sends back the findings and the detectors' caches; this
process folds the findings into incidents. A child has its own GIL and core, so a cycle of a large
fleet never starves ingest and the web handlers of the collector's process (measured at 4,000
GPUs: ingest p99 9-16 ms while a forked cycle runs, 48-148 ms while one runs in a thread). The
price: the pages the collector writes during a cycle are copied (+0.17-0.34 GiB peak at 1,000
GPUs), the fork holds the store's lock (50-230 ms at 1,000 GPUs), and findings and caches are
pickled back (docs/performance.md, "The collector's detection cycle").

Rules are compiled once: each is bound to its detector and its typed parameters. Rules of pushed
detectors (Alertmanager's webhook) have nothing to run here. One failing rule never stops the
others. The engine also applies the selector fields the engine honours for a detector (teams,
jobs, models, nodes) to every finding's subject facts; detectors apply metrics and labels
themselves when they read series.
"""

from __future__ import annotations

import fnmatch
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gpuwarden.collector.detect.catalog import DETECTORS, keep_long_reads
from gpuwarden.collector.detect.contract import DetectionContext, Detector, ReadsSpend
from gpuwarden.collector.detect.findings import Finding, Verdict
from gpuwarden.collector.detect.fork import CycleStoppedError, ForkContext, ForkedCycles
from gpuwarden.collector.detect.incidents import IncidentTracker, plot_points
from gpuwarden.collector.rules.model import Rule, RuleSet
from gpuwarden.collector.storage.base import Storage
from gpuwarden.collector.storage.sql_base import FencedError

log = logging.getLogger(__name__)


def selected(rule: Rule, detector: Detector[Any], finding: Finding) -> bool:
    """Whether the finding's subject passes the rule's teams/jobs/models/nodes patterns.

    Only the fields the detector honours apply (the rule loader refuses the others); a fact
    the finding does not know fails a pattern.
    """
    selector, facts, honoured = rule.selector, finding.facts, detector.spec.selector
    for name, patterns, values in (
        ("teams", selector.teams, (facts.team,)),
        ("jobs", selector.jobs, (facts.job,)),
        ("models", selector.models, (facts.model,)),
        ("nodes", selector.nodes, facts.nodes),
    ):
        if name not in honoured or not patterns:
            continue
        if not any(
            value is not None and fnmatch.fnmatchcase(value, pattern)
            for value in values
            for pattern in patterns
        ):
            return False
    return True


@dataclass(frozen=True, slots=True)
class CycleResult:
    """What one detection cycle did."""

    findings: int
    firing: int
    opened: int
    resolved: int
    failed_rules: tuple[str, ...]
    rule_seconds: Mapping[str, float] = field(default_factory=dict)
    """Wall seconds each rule took, by rule id, and the fold's as ``(incidents)``."""
    stopped: bool = False
    """The engine was stopped during the cycle: nothing was judged or folded."""
    cpu_seconds: float = 0.0
    """CPU the rules took: this thread's, or the forked child's (user + system)."""


@dataclass(frozen=True, slots=True)
class _Detected:
    """What running the rules gave (sent back from a forked child)."""

    findings: list[Finding]
    failed: list[str]
    seconds: dict[str, float]
    caches: dict[object, object] | None = None


@dataclass(frozen=True, slots=True)
class _Bound:
    rule: Rule
    detector: Detector[Any]
    params: Any


class DetectionEngine:
    """Runs the rule set against a detection context and keeps incidents up to date.

    Args:
        ctx: what detectors read (``CollectorService.detection_view`` in the collector).
        rules: the loaded rules; rules of detectors not in ``detectors`` are reported, not run.
        storage: where incidents live (used to build the default tracker).
        tracker: folds findings into incidents (default: one over ``storage``).
        clock: Unix seconds.
        detectors: the catalog, by name.
        fork: run each cycle's rules in a forked child process (``detect.fork``; POSIX).
        fork_timeout_seconds: a forked cycle still running after this long is killed.
    """

    def __init__(
        self,
        ctx: DetectionContext,
        rules: RuleSet,
        *,
        storage: Storage,
        tracker: IncidentTracker | None = None,
        clock: Callable[[], float] = time.time,
        detectors: Mapping[str, Detector[Any]] = DETECTORS,
        fork: bool = False,
        fork_timeout_seconds: float = 600.0,
    ) -> None:
        self._forked: ForkContext | None = None
        self._cycles: ForkedCycles | None = None
        if fork:
            ctx = self._forked = ForkContext(ctx)
            self._cycles = ForkedCycles(
                self._forked.exclusive, timeout_seconds=fork_timeout_seconds
            )
        self._ctx = ctx
        self._clock = clock
        self._tracker = tracker or IncidentTracker(storage, clock=clock)
        self._detectors = detectors
        self.proceed: Callable[[], bool] = lambda: True
        """Checked before each rule and before incidents are written (active/standby: whether
        this replica still leads); false stops the cycle there (``FencedError``)."""
        self.replace_rules(rules)

    def _check_proceed(self) -> None:
        if not self.proceed():
            raise FencedError("this collector no longer leads: detection cycle stopped")

    def replace_rules(self, rules: RuleSet) -> None:
        """Run ``rules`` from the next cycle on (at start, and on an admin reload); a cycle that
        is running keeps the rules it started with."""
        detectors = self._detectors
        enabled = rules.enabled()
        bound = [
            _Bound(rule, detectors[rule.detector], detectors[rule.detector].bind(rule))
            for rule in enabled
            if rule.detector in detectors and detectors[rule.detector].run is not None
        ]
        self.not_implemented = tuple(sorted({r.detector for r in enabled} - set(detectors)))
        # the long rings these rules read (a reload may add some: they start from the recent
        # window's history, detect.catalog.LONG_READS)
        keep_long_reads(self._ctx.store, [b.rule for b in bound])
        self._spend_windows = frozenset(
            w
            for b in bound
            if isinstance(b.params, ReadsSpend)
            for w in b.params.spend_windows_seconds()
        )
        self._bound = bound  # one assignment: a cycle iterates the list it started with
        self.rules = [b.rule for b in bound]
        if self.not_implemented:
            log.warning("rules of unknown detectors skipped: %s", ", ".join(self.not_implemented))

    def stop(self) -> None:
        """Stop a cycle running in a forked child now (its child is killed), and every later
        one; a cycle in this process finishes its rules (the collector is stopping)."""
        if self._cycles is not None:
            self._cycles.stop()

    def run_cycle(self, now: float | None = None) -> CycleResult:
        """Evaluate every runnable rule once and fold the findings into incidents."""
        current = self._clock() if now is None else now
        self._check_proceed()  # a replica that no longer leads does not start a cycle
        bound = self._bound  # the rules this cycle started with
        forked, cycles = self._forked, self._cycles
        cpu_began = time.thread_time()
        if forked is None or cycles is None:
            return self._fold(self._detect(bound, current), time.thread_time() - cpu_began)
        forked.prefetch(current, self._spend_windows)

        def fold(detected: _Detected) -> CycleResult:
            if detected.caches is not None:
                forked.restore(detected.caches)
            return self._fold(detected, cycles.child_cpu_seconds)

        try:
            # the findings are folded as they come (the garbage collector paused: see run_then)
            return cycles.run_then(lambda: self._detect(bound, current, caches=forked.caches), fold)
        except CycleStoppedError:
            return CycleResult(0, 0, 0, 0, (), stopped=True)

    def _fold(self, detected: _Detected, cpu: float) -> CycleResult:
        """Fold a cycle's findings into incidents (unless this replica no longer leads)."""
        findings, seconds = detected.findings, dict(detected.seconds)
        self._check_proceed()  # nor folds one it no longer leads for
        began = time.perf_counter()
        result = self._tracker.fold(findings)
        seconds["(incidents)"] = time.perf_counter() - began
        return CycleResult(
            findings=len(findings),
            firing=sum(1 for f in findings if f.verdict is Verdict.FIRING),
            opened=len(result.opened),
            resolved=len(result.resolved),
            failed_rules=tuple(detected.failed),
            rule_seconds=seconds,
            cpu_seconds=cpu,
        )

    def _detect(
        self,
        bound: list[_Bound],
        current: float,
        *,
        caches: Callable[[], dict[object, object]] | None = None,
    ) -> _Detected:
        """Run the rules (in this process, or in a forked child: then with its caches)."""
        findings: list[Finding] = []
        failed = []
        seconds: dict[str, float] = {}
        for b in bound:
            if caches is None:  # in this process: stop at the next rule once the lease is lost
                self._check_proceed()
            run = b.detector.run
            if run is None:  # pragma: no cover - filtered in __init__
                continue
            began = time.perf_counter()
            try:
                found = run(self._ctx, b.rule, b.params, current)
            except Exception:  # one broad except per rule: the others still run
                log.exception("rule %s failed in this cycle", b.rule.id)
                failed.append(b.rule.id)
                continue
            finally:
                seconds[b.rule.id] = time.perf_counter() - began
            findings.extend(f for f in found if selected(b.rule, b.detector, f))
        if caches is None:
            return _Detected(findings, failed, seconds)
        # from a child, only the points an incident keeps cross the pipe (the fold would thin
        # them the same way): a large fleet's findings carry hundreds of points each
        thin = [replace(f, points=plot_points(f.points)) for f in findings]
        return _Detected(thin, failed, seconds, caches())
