"""One fleet end to end through the labelled evaluation: generated telemetry → CollectorService
→ the shipped rules → DetectionEngine → incidents in SQLite → the scorer (bench/truth)."""

from __future__ import annotations

from bench.truth.fault_fleets import hardware_fault_fleet
from bench.truth.runner import run_fleet, shipped_rules
from bench.truth.score import GRACE_SECONDS, FleetOutcome, score_rule
from bench.truth.splits import seeds


def test_planted_hardware_faults_open_incidents_through_the_engine():
    fleet = hardware_fault_fleet(seeds("tune", 1)[0])
    run = run_fleet(fleet)
    assert run.failed_rules == ()
    assert run.cycles == int((fleet.end - fleet.start - fleet.warmup_seconds) / 60) + 1
    shipped = {r.id for r in shipped_rules().rules}
    first_cycle = fleet.start + fleet.warmup_seconds
    for incident in run.incidents:
        assert incident.rule in shipped
        assert incident.time >= first_cycle
        assert (incident.time - fleet.start) % fleet.cycle_seconds == 0
    outcome = FleetOutcome(fleet.name, fleet.family, fleet.episodes, run.incidents, 1.0)
    s = score_rule("gpu-hardware-fault", [outcome])
    assert s.episodes == len(fleet.episodes) == 3
    # the bar for hardware faults (P and R >= 0.95) on this fleet: every planted fault
    # opens an incident on its own GPU within the grace, and nothing else does
    assert s.found == s.episodes
    assert s.matched == s.incidents
    assert all(0 <= d <= 600 + GRACE_SECONDS for d in s.delays)
