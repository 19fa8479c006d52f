"""The contract between the remediator and the things that act (Slurm, Kubernetes, routers...).

An actuator owns one system. It never builds a shell string, validates its target itself (an
empty target or one meaning "all" is refused, never widened), and reports what happened as an
``ActionResult`` instead of raising for outcomes the remediator must handle (the target is gone,
the action was already done, the system refused). It raises only for programming errors.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol


def _empty() -> Mapping[str, Any]:
    return MappingProxyType({})


class Outcome(enum.StrEnum):
    """What an actuator call did."""

    DONE = "done"  # the system accepted the change
    ALREADY_DONE = "already_done"  # the target was already in the wanted state (idempotent)
    DRY_RUN = "dry_run"  # validated (server-side dry-run where the system has one), nothing changed
    NOT_FOUND = "not_found"  # the target does not exist (any more)
    REFUSED = "refused"  # bad target or parameters: retrying will not help
    FAILED = "failed"  # the system failed; a later attempt may work


@dataclass(frozen=True, slots=True)
class ActionRequest:
    """One action on one target.

    ``kind`` is a rule action kind (``requeue``, ``scale_up``, ``degrade``, ``drain``, ``webhook``;
    restoring actions use ``restore``, ``resume``, ``scale_down``). ``target`` names one object in
    the actuator's system: a job key (``slurm:<cluster>:<id>``, ``k8s:<uid>``), a deployment
    (``<namespace>/<name>``), a node name. ``idempotency_key`` is (incident fingerprint, action,
    target) hashed by the remediator; actuators that can pass it on do (e.g. a webhook header).
    """

    kind: str
    target: str
    idempotency_key: str
    dry_run: bool = True
    parameters: Mapping[str, Any] = field(default_factory=_empty)


@dataclass(frozen=True, slots=True)
class ActionResult:
    """What happened; ``undo`` holds what a rollback needs (e.g. the previous replica count)."""

    outcome: Outcome
    detail: str
    undo: Mapping[str, Any] = field(default_factory=_empty)

    @property
    def ok(self) -> bool:
        """Whether the target is now (or would be, in a dry run) in the wanted state."""
        return self.outcome in (Outcome.DONE, Outcome.ALREADY_DONE, Outcome.DRY_RUN)


class Actuator(Protocol):
    """Acts on one system; ``kinds`` lists the action kinds it takes."""

    @property
    def kinds(self) -> frozenset[str]:
        """Action kinds this actuator executes."""
        ...

    def execute(self, request: ActionRequest) -> ActionResult:
        """Do (or, with ``request.dry_run``, validate) the action."""
        ...

    def rollback(self, request: ActionRequest, result: ActionResult) -> ActionResult:
        """Undo a DONE ``result`` of ``request`` using ``result.undo``."""
        ...
