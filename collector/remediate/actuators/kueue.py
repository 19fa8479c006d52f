"""Requeue through Kueue: deactivate the job's Workload, wait for Kueue to evict it, reactivate.

A pod whose controller (a Job, a JobSet...) is managed by Kueue has a ``Workload`` owned by that
controller (``kueue.x-k8s.io/v1beta1``, ``ownerReferences`` → the controller's uid). Deleting
the pod would only make the controller recreate it inside the same admission; a real requeue
gives the quota back and queues the job again: ``spec.active: false`` (Kueue evicts the
workload, condition ``Evicted``), then ``spec.active: true`` (Kueue queues it again). Both are
merge patches of the custom resource; in dry-run the first goes out with ``dryRun=All`` and the
wait is skipped.

If Kueue does not evict in time, the workload is reactivated (never left held by us) and the
result is FAILED, so the remediator retries or escalates. A workload that is already inactive is
someone's hold: refused, not undone.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from gpuwarden.collector.remediate.actuators.base import ActionResult, Outcome
from gpuwarden.collector.remediate.actuators.kube_api import MERGE_PATCH, CustomObjects, KubeError

WORKLOADS = ("kueue.x-k8s.io", "v1beta1", "workloads")


def _evicted(workload: dict[str, Any]) -> bool:
    conditions = (workload.get("status") or {}).get("conditions") or []
    return any(
        c.get("type") == "Evicted" and c.get("status") == "True"
        for c in conditions
        if isinstance(c, dict)
    )


class KueueRequeue:
    """Finds a pod's Workload and requeues it.

    Args:
        objects: the custom-objects calls.
        evict_timeout_seconds: how long to wait for Kueue's eviction.
        poll_seconds: how often to look.
        sleep, clock: seams for tests.
    """

    def __init__(
        self,
        objects: CustomObjects,
        *,
        evict_timeout_seconds: float = 60.0,
        poll_seconds: float = 1.0,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._objects = objects
        self._timeout = evict_timeout_seconds
        self._poll = poll_seconds
        self._sleep = sleep
        self._clock = clock

    def workload_for(self, namespace: str, owner_uid: str) -> dict[str, Any] | None:
        """The Workload owned by the controller ``owner_uid``; None without Kueue or one."""
        try:
            items = self._objects.list(WORKLOADS, namespace)
        except KubeError as error:
            if error.status == 404:  # Kueue's CRD is not installed
                return None
            raise
        for item in items:
            owners = (item.get("metadata") or {}).get("ownerReferences") or []
            if any(isinstance(o, dict) and o.get("uid") == owner_uid for o in owners):
                return item
        return None

    def requeue(self, namespace: str, workload: dict[str, Any], *, dry_run: bool) -> ActionResult:
        """Deactivate, wait for the eviction, reactivate."""
        name = str(workload["metadata"]["name"])
        what = f"workload {namespace}/{name}"
        if (workload.get("spec") or {}).get("active") is False:
            return ActionResult(Outcome.REFUSED, f"{what} is already inactive (held by someone)")
        self._set_active(namespace, name, active=False, dry_run=dry_run)
        if dry_run:
            return ActionResult(Outcome.DRY_RUN, f"would requeue {what} through Kueue")
        deadline = self._clock() + self._timeout
        evicted = False
        while True:
            current = self._objects.get(WORKLOADS, namespace, name)
            if _evicted(current):
                evicted = True
                break
            if self._clock() >= deadline:
                break
            self._sleep(self._poll)
        self._set_active(namespace, name, active=True, dry_run=False)
        if not evicted:
            return ActionResult(
                Outcome.FAILED,
                f"{what}: Kueue did not evict it within {self._timeout:.0f} s; reactivated",
            )
        return ActionResult(
            Outcome.DONE, f"requeued {what} through Kueue (deactivated, evicted, reactivated)"
        )

    def _set_active(self, namespace: str, name: str, *, active: bool, dry_run: bool) -> None:
        self._objects.patch(
            WORKLOADS,
            namespace,
            name,
            {"spec": {"active": active}},
            content_type=MERGE_PATCH,
            dry_run=dry_run,
        )
