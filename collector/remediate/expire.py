"""Approval requests that outlived their reason: an action awaiting approval whose incident
resolved (or is gone), or whose target job ended, moves to ``expired`` with an audit entry
naming why, and its approval links stop working.

What "the job ended" means here is what the remediator already sees: the job registry's row in
storage (``Storage.job``) in a final state. A job the registry never knew is not taken as gone
(an incident's job may come from evidence alone), so only the incident's resolve expires those.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

from gpuwarden.collector.jobs.model import JobState
from gpuwarden.collector.remediate.states import ActionState
from gpuwarden.collector.remediate.transitions import audit_entry
from gpuwarden.collector.rules.model import Subject
from gpuwarden.collector.rules.vocabulary import ACTIONS
from gpuwarden.collector.storage.base import ActionRecord, Storage
from gpuwarden.collector.storage.records import IncidentState

log = logging.getLogger(__name__)

#: Job states after which an action on the job has nothing left to act on. ``preempted`` is
#: left out: Slurm may requeue a preempted job by itself.
ENDED_JOB_STATES = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED})


class Expiry:
    """Expires actions awaiting approval once there is nothing left to approve.

    Args:
        storage: the actions, incidents, jobs and approval links.
        clock: wall clock.
    """

    def __init__(self, storage: Storage, clock: Callable[[], float]) -> None:
        self._storage = storage
        self._clock = clock

    def awaiting(self) -> list[ActionRecord]:
        """The actions waiting for a human's approval, oldest first."""
        rows = self._storage.actions(states=[ActionState.AWAITING_APPROVAL])
        return sorted(rows, key=lambda r: r.action_id or 0)

    def expire(self, row: ActionRecord) -> bool:
        """Move ``row`` to ``expired`` when it has no reason left to wait; whether it moved."""
        why = self.reason(row)
        if why is None or row.action_id is None:
            return False
        now = self._clock()
        # Links first: a crash between the two leaves an awaiting action whose links no longer
        # work (the next pass expires it), never an expired action with a working link. The
        # compare-and-set below can only lose to an approve or reject, after which the links
        # were of no use either.
        self._storage.revoke_approvals(row.action_id, now=now)
        params = {**row.params, "expired_because": why}
        new = replace(row, state=ActionState.EXPIRED, updated_at=now, params=params)
        entry = audit_entry(now, row, verdict="expire", result=ActionState.EXPIRED, reason=why)
        done = self._storage.update_action(new, expect_state=row.state, audit=entry)
        if done:
            log.info("action %s expired unapproved: %s", row.action_id, why)
        return done

    def reason(self, row: ActionRecord) -> str | None:
        """Why ``row`` should stop waiting for approval, or ``None`` while it still should."""
        incident = self._storage.incident(row.incident_id)
        if incident is None:
            return f"incident {row.incident_id} gone"
        if incident.state is IncidentState.RESOLVED:
            return f"incident {row.incident_id} resolved"
        spec = ACTIONS.get(row.action)
        if row.target and spec is not None and spec.target is Subject.JOB:
            job = self._storage.job(row.target)
            if job is not None and job.state in ENDED_JOB_STATES:
                return f"job {row.target} {job.state}"
        return None
