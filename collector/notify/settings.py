"""The collector configuration's ``alerting:`` section: where incident alerts go, and how often.

```yaml
alerting:
  alertmanagers: {main: "http://127.0.0.1:9093"}   # routes alertmanager:main
  resend_seconds: 60        # firing alerts are pushed again this often (Alertmanager wants it)
  group_threshold: 3        # this many new incidents of one rule in one pass: one chat message
  audit_change_events: "pagerduty:gpu-oncall"   # the remediation audit as change events
  routing:                  # routes added by severity and team, on top of each rule's routes
    - {severities: [critical, page], routes: ["pagerduty:gpu-oncall"]}
    - {teams: [ml-platform], routes: ["slack:#ml-platform"]}
```
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Annotated, Any

import msgspec

from gpuwarden.agent.schema import ONE_OR_MANY, convert
from gpuwarden.collector.rules.model import Severity
from gpuwarden.collector.rules.vocabulary import ROUTE_SCHEMES


class AlertingSettingsError(ValueError):
    """A bad ``alerting:`` section; the message names the key."""


_SCHEMES = "|".join(ROUTE_SCHEMES)
#: ``<scheme>:<target>``, as rules write their routes.
Route = Annotated[
    str, msgspec.Meta(pattern=f"^({_SCHEMES}):.", description=f"<{_SCHEMES}>:<target>")
]
HttpUrl = Annotated[str, msgspec.Meta(pattern="^https?://", description="an http(s) URL")]
Seconds = Annotated[float, msgspec.Meta(ge=1.0)]


class RouteRule(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Extra routes for incidents of these severities and teams (empty: any)."""

    routes: Annotated[tuple[Route, ...], ONE_OR_MANY]
    severities: Annotated[tuple[Severity, ...], ONE_OR_MANY] = ()
    teams: Annotated[tuple[Annotated[str, msgspec.Meta(min_length=1)], ...], ONE_OR_MANY] = ()

    def matches(self, severity: str, team: str | None) -> bool:
        """Whether an incident of ``severity`` owned by ``team`` takes these routes."""
        return (not self.severities or severity in self.severities) and (
            not self.teams or (team is not None and team in self.teams)
        )


class AlertingSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Incident alerts: firing once per route, re-sent where the service wants it, resolved once.

    Attributes:
        alertmanagers: name → base URL, for routes ``alertmanager:<name>``.
        interval_seconds: how often the alerting pass runs.
        resend_seconds: firing alerts to Alertmanager are pushed again this often; each push
            holds the alert for ``3 × resend_seconds``, so it resolves by itself if we stop.
        group_threshold: new (or resolved) incidents of one rule in one pass, from this many
            on, go to a chat route as one grouped message.
        give_up_seconds: an undelivered notice is retried (with backoff) this long, then logged
            as lost and counted.
        silence_while_settling: silence our Alertmanager alert while an action settles.
        routing: routes added by severity and team.
        audit_change_events: ``pagerduty:<service>``: mirror the real remediation audit there
            as PagerDuty change events (off by default).
    """

    alertmanagers: Annotated[
        Mapping[str, HttpUrl],
        msgspec.Meta(min_length=1, description="a mapping of name to URL"),
    ] = msgspec.field(default_factory=lambda: MappingProxyType({}))
    interval_seconds: Seconds = 15.0
    resend_seconds: Seconds = 60.0
    group_threshold: Annotated[int, msgspec.Meta(ge=2)] = 3
    give_up_seconds: Seconds = 86_400.0
    silence_while_settling: bool = True
    routing: tuple[RouteRule, ...] = ()
    audit_change_events: (
        Annotated[str, msgspec.Meta(pattern="^pagerduty:.", description="pagerduty:<service>")]
        | None
    ) = None

    def routes_for(self, severity: str, team: str | None) -> tuple[str, ...]:
        """The routes the routing table adds for an incident."""
        out: list[str] = []
        for rule in self.routing:
            if rule.matches(severity, team):
                out.extend(r for r in rule.routes if r not in out)
        return tuple(out)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], where: str) -> AlertingSettings:
        """Parse the section found at the dotted key ``where``; errors name ``where.key``."""
        return convert(data, cls, "", AlertingSettingsError, section=where)
