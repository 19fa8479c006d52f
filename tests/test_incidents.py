"""Incidents: open, update, resolve with hysteresis; gaps change nothing; no flapping (on both
storage backends)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpuwarden.collector.detect.findings import Finding, Verdict
from gpuwarden.collector.detect.incidents import IncidentTracker
from gpuwarden.collector.storage.records import IncidentState
from tests.storage_backends import Backend

F, C, U = Verdict.FIRING, Verdict.CLEAR, Verdict.UNKNOWN


def finding(verdict: Verdict, subject: str = "n1/GPU-1") -> Finding:
    return Finding(
        "idle-gpu",
        "idle_gpu",
        subject,
        verdict,
        "warning",
        0.0,
        60.0,
        summary="idle",
        evidence={"idle_minutes": 30.0},
    )


@pytest.fixture
def tracker(backend: Backend) -> Iterator[IncidentTracker]:
    """On SQLite and on PostgreSQL (deduplication is the database's unique index)."""
    storage = backend.open()
    now = [1000.0]

    def clock() -> float:
        now[0] += 60
        return now[0]

    yield IncidentTracker(storage, open_after=2, resolve_after=3, clock=clock)
    storage.close()


@pytest.mark.parametrize(
    ("cycles", "state"),
    [
        ([F], None),  # one firing cycle: not yet
        ([F, F], IncidentState.OPEN),
        ([F, U, F], IncidentState.OPEN),  # a gap does not break the firing streak
        ([F, C, F], None),  # a clear cycle does
        ([F, F, C, C], IncidentState.OPEN),  # two clears: still open (hysteresis)
        ([F, F, C, C, C], IncidentState.RESOLVED),
        ([F, F, C, U, U, C, C], IncidentState.RESOLVED),  # gaps neither resolve nor reset
        ([F, F, C, C, F, C, C], IncidentState.OPEN),  # a firing cycle resets the clear streak
        ([F, F, U, U, U, U, U], IncidentState.OPEN),  # missing data never resolves
    ],
)
def test_hysteresis(tracker, cycles, state):
    for verdict in cycles:
        tracker.fold([finding(verdict)])
    incidents = tracker.storage.incidents()
    assert (incidents[-1].state if incidents else None) == state
    assert len(incidents) <= 1


def test_update_keeps_one_incident_and_fresh_evidence(tracker):
    tracker.fold([finding(F)])
    result = tracker.fold([finding(F)])
    (opened,) = result.opened
    assert opened.incident_id is not None
    result = tracker.fold([finding(F)])
    (updated,) = result.updated
    assert updated.consecutive_breaches == 3
    assert tracker.storage.open_incident_for(opened.fingerprint) is not None
    assert len(tracker.storage.incidents()) == 1


def test_subjects_are_independent(tracker):
    for _ in range(2):
        tracker.fold([finding(F, "a"), finding(C, "b")])
    (incident,) = tracker.storage.incidents()
    assert incident.evidence["subject"] == "a"


def test_a_resolved_incident_can_reopen_as_a_new_one(tracker):
    for verdict in (F, F, C, C, C, F, F):
        tracker.fold([finding(verdict)])
    states = [i.state for i in tracker.storage.incidents()]
    assert sorted(states) == [IncidentState.OPEN, IncidentState.RESOLVED]


def test_an_incident_keeps_its_subject_summary_and_thinned_points_across_updates():
    from gpuwarden.collector.detect.incidents import MAX_PLOT_POINTS, incident_evidence

    points = tuple((1000.0 + i, float(i % 7)) for i in range(1000))
    finding = Finding(
        rule_id="r",
        detector="idle_gpu",
        subject="n/GPU-1",
        verdict=Verdict.FIRING,
        severity="warning",
        window_start=1000.0,
        window_end=2000.0,
        summary="idle",
        evidence={"gpu": "GPU-1", "ratio": float("nan"), "rate": float("inf")},
        points=(*points[:-1], (1998.5, float("nan")), points[-1]),
    )
    evidence = incident_evidence(finding)
    kept = evidence["points"]
    assert isinstance(kept, list)
    assert len(kept) == MAX_PLOT_POINTS
    assert kept[0] == [1000.0, 0.0]
    assert kept[-1] == [1999.0, float(999 % 7)]
    assert evidence["subject"] == "n/GPU-1"
    assert evidence["summary"] == "idle"
    assert evidence["gpu"] == "GPU-1"
    assert evidence["ratio"] is None  # not JSON: unknown
    assert evidence["rate"] is None
