"""What the demo prints: a live summary while it runs, and the report at the end."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

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
    print("\n" + "=" * 78)
    print(f"gpuwarden demo report: {ended - started:.0f} s of wall time at {speed:g}x")
    print("=" * 78)
    totals = storage.rollups(since=started - 60, until=ended + 60, by=("job_key", "team"))
    idle_h = allocated_h = idle_usd = cost = 0.0
    print("\nwaste found (accounting: allocated GPU time with utilisation below the idle line)")
    print(f"  {'job':<24} {'team':<10} {'GPU-h':>8} {'idle GPU-h':>11} {'idle $':>9} {'$':>9}")
    for total in sorted(totals, key=lambda t: -t.gpu_seconds_idle):
        if total.group.get("job_key") is None:
            continue
        share = (
            total.gpu_seconds_idle / total.gpu_seconds_allocated
            if total.gpu_seconds_allocated
            else 0.0
        )
        job_cost = total.cost_usd or 0.0
        idle_h += total.gpu_seconds_idle / 3600
        allocated_h += total.gpu_seconds_allocated / 3600
        idle_usd += job_cost * share
        cost += job_cost
        print(
            f"  {total.group['job_key']!s:<24} {total.group.get('team') or '-':<10} "
            f"{total.gpu_seconds_allocated / 3600:>8.3f} {total.gpu_seconds_idle / 3600:>11.3f} "
            f"{job_cost * share:>9.2f} {job_cost:>9.2f}"
        )
    print(
        f"  {'total':<35} {allocated_h:>8.3f} {idle_h:>11.3f} {idle_usd:>9.2f} {cost:>9.2f}"
        f"   (x{speed:g} = {idle_h * speed:.1f} idle GPU-h, ${idle_usd * speed:,.0f} of "
        "simulated time)"
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
