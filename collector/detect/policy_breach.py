"""``policy_breach``: a policy (``policies/``) was breached. Nothing is computed here: the
remediation pass finds standing breaches and refused actions (``gpuwarden.collector.policy``)
and opens the incidents itself; the spec makes the ``policy-breach`` rule loadable."""

from __future__ import annotations

from dataclasses import dataclass

from gpuwarden.collector.detect.contract import Detector, spec_of
from gpuwarden.collector.rules.model import Subject


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyBreachParams:
    """``policy_breach`` takes no parameters: the policies say what a breach is."""


DETECTOR = Detector(
    spec=spec_of(
        "policy_breach",
        "A limit or cost-cap policy was breached: a job, team or model holds more GPUs than a "
        "limit allows, a team's spend reached its cap, or an action that would breach one was "
        "refused (found by the remediation pass, not the detection cycle).",
        subjects=(Subject.JOB, Subject.DEPLOYMENT),
        signals=(),
        params=PolicyBreachParams,
        selector=(),
    ),
    params=PolicyBreachParams,
    run=None,
)
