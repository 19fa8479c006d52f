"""What the demo prints: a live summary while it runs, and the report at the end."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.storage.records import IncidentState


def print_status(service: CollectorService, elapsed: float, speed: float) -> None:
    """One block: incidents open by rule, actions by state, ingest so far."""
    storage = service.storage
    open_by_rule = Counter(i.rule_id for i in storage.incidents(state=IncidentState.OPEN))
    actions = Counter(a.state for a in storage.actions())
    totals = service.totals
    print(
        f"\n[{elapsed:5.0f} s wall = {elapsed * speed / 60:5.0f} min simulated] "
        f"{totals.accepted:,} points, {service.store.series_count():,} series",
        flush=True,
    )
    print(
        "  open incidents: "
        + (", ".join(f"{rule} x{n}" for rule, n in sorted(open_by_rule.items())) or "none"),
        flush=True,
    )
    print(
        "  actions: "
        + (", ".join(f"{state} x{n}" for state, n in sorted(actions.items())) or "none"),
        flush=True,
    )


@dataclass(frozen=True, slots=True)
class SimulatedTotals:
    """One job's accounting on the demo's simulated clock.

    The agents' workloads run ``speed`` times faster than the wall clock that stamps their
    samples: the collector counts wall GPU-seconds, but its energy (counter deltas) already
    holds simulated joules, and carbon follows the energy. GPU-seconds and dollars are scaled
    by ``speed`` here, so every figure of the report is on the one simulated clock.
    """

    job: str
    team: str
    gpu_hours: float
    idle_gpu_hours: float
    kwh: float
    co2_kg: float
    idle_usd: float
    usd: float


def simulated_totals(
    service: CollectorService, started: float, ended: float, speed: float
) -> list[SimulatedTotals]:
    """Each job's totals over the run, on simulated time, most idle first."""
    rollups = service.storage.rollups(since=started - 60, until=ended + 60, by=("job_key", "team"))
    rows = []
    for total in rollups:
        if total.group.get("job_key") is None:
            continue
        share = (
            total.gpu_seconds_idle / total.gpu_seconds_allocated
            if total.gpu_seconds_allocated
            else 0.0
        )
        usd = (total.cost or 0.0) * speed  # the demo's table is the built-in one, in USD
        rows.append(
            SimulatedTotals(
                job=str(total.group["job_key"]),
                team=str(total.group.get("team") or "-"),
                gpu_hours=total.gpu_seconds_allocated * speed / 3600,
                idle_gpu_hours=total.gpu_seconds_idle * speed / 3600,
                kwh=(total.energy_joules or 0.0) / 3.6e6,
                co2_kg=(total.carbon_grams or 0.0) / 1000,
                idle_usd=usd * share,
                usd=usd,
            )
        )
    rows.sort(key=lambda r: -r.idle_gpu_hours)
    return rows


def print_report(
    service: CollectorService,
    started: float,
    ended: float,
    speed: float,
    base_url: str,
    requeued: Sequence[str],
) -> None:
    """The end of the demo: waste found, incidents, actions, and where to look."""
    storage = service.storage
    wall = ended - started
    print("\n" + "=" * 78)
    print(f"gpuwarden demo report: {wall:.0f} s of wall time at {speed:g}x")
    print(f"all figures on simulated time: {wall * speed / 3600:.2f} h")
    print("=" * 78)
    rows = simulated_totals(service, started, ended, speed)
    print("\nwaste found (accounting: allocated GPU time with utilisation below the idle line)")
    print(
        f"  {'job':<20} {'team':<9} {'GPU-h':>7} {'idle GPU-h':>10} {'kWh':>7} "
        f"{'kg CO2':>7} {'idle $':>8} {'$':>8}"
    )
    for row in rows:
        print(
            f"  {row.job:<20} {row.team:<9} {row.gpu_hours:>7.2f} {row.idle_gpu_hours:>10.2f} "
            f"{row.kwh:>7.2f} {row.co2_kg:>7.2f} {row.idle_usd:>8.2f} {row.usd:>8.2f}"
        )
    print(
        f"  {'total':<30} {sum(r.gpu_hours for r in rows):>7.2f} "
        f"{sum(r.idle_gpu_hours for r in rows):>10.2f} {sum(r.kwh for r in rows):>7.2f} "
        f"{sum(r.co2_kg for r in rows):>7.2f} {sum(r.idle_usd for r in rows):>8.2f} "
        f"{sum(r.usd for r in rows):>8.2f}"
    )
    incidents = storage.incidents()
    print(f"\nincidents: {len(incidents)}")
    for incident in incidents:
        subject = incident.evidence.get("subject", incident.fingerprint)
        state = "open" if incident.state is IncidentState.OPEN else "resolved"
        print(
            f"  #{incident.incident_id:<3} {incident.severity:<8} {incident.rule_id:<26} "
            f"{state:<8} {subject}"
        )
    actions = storage.actions()
    print(f"\nactions: {len(actions)}")
    for action in actions:
        mode = f"{action.mode}{' (dry run)' if action.dry_run else ''}"
        print(
            f"  #{action.action_id:<3} {action.action:<9} {action.target:<22} "
            f"{mode:<18} {action.state}"
        )
    if requeued:
        print(f"\nrequeued for real on the simulated scheduler: {', '.join(requeued)}")
    audit = storage.audit(since=started - 60)
    print(f"audit log: {len(audit)} entries")
    print(f"\nstatus page: {base_url}/status")
    print(f"metrics:     {base_url}/metrics")
    print(f"runbooks:    {base_url}/runbooks/idle-gpu (one per rule)")
