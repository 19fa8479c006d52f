"""The action vocabulary a rule draws from (the detector vocabulary is the detect package's
catalog), and the routes notifications may take."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from gpuwarden.collector.rules.model import (
    ActionKindSpec,
    ParamSpec,
    ParamType,
    ParamValue,
    Subject,
)

# --- vocabularies --------------------------------------------------------------------------------

_T = ParamType


def _p(
    kind: ParamType,
    default: ParamValue | None,
    minimum: float | None,
    maximum: float | None,
    description: str,
    choices: tuple[str, ...] = (),
) -> ParamSpec:
    return ParamSpec(kind, default, minimum, maximum, description, choices)


def _table(**params: ParamSpec) -> Mapping[str, ParamSpec]:
    return MappingProxyType(params)


_J, _N, _D = Subject.JOB, Subject.NODE, Subject.DEPLOYMENT

# fmt: off
ACTIONS: Mapping[str, ActionKindSpec] = MappingProxyType({spec.kind: spec for spec in (
    ActionKindSpec("requeue", "Requeue the job (Slurm scontrol requeue, Kubernetes re-create).",
                   _J, _table(max_attempts=_p(_T.INT, 1, 1, 10, "Requeues per incident."),
                              price_tier=_p(_T.STR, "same", None, None,
                                            "Tier to requeue at: 'same', or a fallback such as "
                                            "'on-demand' (policies may make it wait for an "
                                            "approval).",
                                            ("same", "spot", "on-demand", "reserved")))),
    ActionKindSpec("scale_up", "Add replicas to the deployment.", _D, _table(
        step_replicas=_p(_T.INT, 1, 1, 100, "Replicas added per action."),
        max_replicas=_p(_T.INT, 32, 1, 10_000, "Never scale beyond this."))),
    ActionKindSpec("degrade", "Route traffic to the deployment's smaller fallback model.", _D,
                   _table(traffic_ratio=_p(_T.FLOAT, 0.5, 0.0, 1.0,
                                           "Share of traffic sent to the fallback."))),
    ActionKindSpec("drain", "Drain the node so no new job lands on it.", _N,
                   _table(reason=_p(_T.STR, "gpuwarden: GPU hardware fault", None, None,
                                    "Reason recorded with the scheduler."))),
    ActionKindSpec("notify", "Tell the rule's routes; takes no action.", None, _table()),
    ActionKindSpec("webhook", "POST the finding to a webhook configured in the collector.", None,
                   _table(name=_p(_T.STR, None, None, None,
                                  "Name of the configured webhook (no URLs or secrets in "
                                  "rules)."))),
)})

ROUTE_SCHEMES: Mapping[str, str] = MappingProxyType({
    "slack": "a Slack channel, e.g. slack:#gpu-alerts",
    "pagerduty": "a PagerDuty service configured in the collector, e.g. pagerduty:ml-oncall",
    "alertmanager": "an Alertmanager receiver, e.g. alertmanager:gpu-team",
    "webhook": "a webhook configured in the collector, e.g. webhook:ticketing",
})
# fmt: on
