"""Which system owns a target when several actuators take one action kind.

Slurm and Kubernetes both requeue jobs and both drain nodes. Job keys say their scheduler
(``slurm:<cluster>:<id>``, ``k8s:<uid>``); node names do not, so each scheduler is given node-name
globs (:class:`NodeOwnership`). :class:`OwnedActuator` wraps an actuator with an ownership
function, which the remediator asks through ``accepts`` (its ``Targeted`` extension) and which
also translates a target into the inner actuator's terms (a ``k8s:<uid>`` job key into the
``<namespace>/<pod>`` the Kubernetes actuator deletes). A target no system owns, or that two
would own, is accepted by none: the action is proposed, never sent to the wrong scheduler.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from types import MappingProxyType

from gpuwarden.collector.remediate.actuators.base import (
    ActionRequest,
    ActionResult,
    Actuator,
    Outcome,
)

#: The inner actuator's name for ``target``, or ``None`` when the target is not this system's.
Owns = Callable[[str], str | None]


@dataclass(frozen=True, slots=True)
class NodeOwnership:
    """Node-name globs per system (``slurm``, ``kubernetes``); only enabled systems are listed.

    A node matching one system's globs is that system's; matching several, nobody's. A node
    matching none belongs to the one system listed without globs (it takes "the rest"), if
    exactly one is; otherwise to nobody.
    """

    globs: Mapping[str, tuple[str, ...]] = dataclasses.field(
        default_factory=lambda: MappingProxyType({})
    )

    def owner(self, node: str) -> str | None:
        """The system that drains ``node``, or ``None``."""
        matched = [
            system
            for system, globs in self.globs.items()
            if any(fnmatchcase(node, glob) for glob in globs)
        ]
        if matched:
            return matched[0] if len(matched) == 1 else None
        rest = [system for system, globs in self.globs.items() if not globs]
        return rest[0] if len(rest) == 1 else None


class OwnedActuator:
    """``inner`` restricted to the targets ``owns`` names, which it translates.

    Args:
        inner: the actuator of one system.
        owns: target → the inner actuator's target, or ``None`` (not this system's).
        system: the system's name, for the refusal detail.
    """

    def __init__(self, inner: Actuator, owns: Owns, *, system: str) -> None:
        self.inner = inner
        self._owns = owns
        self._system = system

    @property
    def kinds(self) -> frozenset[str]:
        """The inner actuator's kinds."""
        return self.inner.kinds

    def accepts(self, target: str) -> bool:
        """Whether ``target`` belongs to this system."""
        return self._owns(target) is not None

    def execute(self, request: ActionRequest) -> ActionResult:
        """The inner actuator's answer for the translated target (REFUSED when not ours)."""
        inner = self._translated(request)
        if inner is None:
            return self._refused(request)
        return self.inner.execute(inner)

    def rollback(self, request: ActionRequest, result: ActionResult) -> ActionResult:
        """The inner actuator's rollback for the translated target."""
        inner = self._translated(request)
        if inner is None:
            return self._refused(request)
        return self.inner.rollback(inner, result)

    def probe(self, request: ActionRequest) -> ActionResult | None:
        """The inner actuator's probe, when it has one (``None``: cannot tell)."""
        probe = getattr(self.inner, "probe", None)
        inner = self._translated(request)
        if probe is None or inner is None:
            return None
        answer: ActionResult | None = probe(inner)
        return answer

    def _translated(self, request: ActionRequest) -> ActionRequest | None:
        target = self._owns(request.target)
        if target is None:
            return None
        return dataclasses.replace(request, target=target)

    def _refused(self, request: ActionRequest) -> ActionResult:
        detail = (
            f"{request.target!r} is not a {self._system} target "
            "(another scheduler's job, or a node outside its *_action_nodes)"
        )
        return ActionResult(Outcome.REFUSED, detail)
