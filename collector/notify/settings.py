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
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from gpuwarden.collector.rules.model import Severity
from gpuwarden.collector.rules.vocabulary import ROUTE_SCHEMES


class AlertingSettingsError(ValueError):
    """A bad ``alerting:`` section; the message names the key."""


@dataclass(frozen=True, slots=True)
class RouteRule:
    """Extra routes for incidents of these severities and teams (empty: any)."""

    routes: tuple[str, ...]
    severities: tuple[str, ...] = ()
    teams: tuple[str, ...] = ()

    def matches(self, severity: str, team: str | None) -> bool:
        """Whether an incident of ``severity`` owned by ``team`` takes these routes."""
        return (not self.severities or severity in self.severities) and (
            not self.teams or (team is not None and team in self.teams)
        )


@dataclass(frozen=True, slots=True)
class AlertingSettings:
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

    alertmanagers: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    interval_seconds: float = 15.0
    resend_seconds: float = 60.0
    group_threshold: int = 3
    give_up_seconds: float = 86_400.0
    silence_while_settling: bool = True
    routing: tuple[RouteRule, ...] = ()
    audit_change_events: str | None = None

    def routes_for(self, severity: str, team: str | None) -> tuple[str, ...]:
        """The routes the routing table adds for an incident."""
        out: list[str] = []
        for rule in self.routing:
            if rule.matches(severity, team):
                out.extend(r for r in rule.routes if r not in out)
        return tuple(out)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], where: str) -> AlertingSettings:
        """Parse the section; errors name ``where.key``."""
        known = set(cls.__dataclass_fields__)
        for key in data:
            if key not in known:
                raise AlertingSettingsError(
                    f"{where}.{key}: unknown key (known: {', '.join(sorted(known))})"
                )
        kwargs: dict[str, Any] = {}
        for key in ("interval_seconds", "resend_seconds", "give_up_seconds"):
            if key in data:
                kwargs[key] = _number(data[key], f"{where}.{key}", minimum=1.0)
        if "group_threshold" in data:
            value = data["group_threshold"]
            if isinstance(value, bool) or not isinstance(value, int) or value < 2:
                raise AlertingSettingsError(f"{where}.group_threshold: expected an integer >= 2")
            kwargs["group_threshold"] = value
        if "silence_while_settling" in data:
            if not isinstance(data["silence_while_settling"], bool):
                raise AlertingSettingsError(f"{where}.silence_while_settling: expected true/false")
            kwargs["silence_while_settling"] = data["silence_while_settling"]
        if "alertmanagers" in data:
            kwargs["alertmanagers"] = _urls(data["alertmanagers"], f"{where}.alertmanagers")
        if "routing" in data:
            kwargs["routing"] = _routing(data["routing"], f"{where}.routing")
        if "audit_change_events" in data:
            value = data["audit_change_events"]
            scheme, _, service = str(value).partition(":")
            if not isinstance(value, str) or scheme != "pagerduty" or not service:
                raise AlertingSettingsError(
                    f"{where}.audit_change_events: expected pagerduty:<service>"
                )
            kwargs["audit_change_events"] = value
        return cls(**kwargs)


def _number(value: object, where: str, *, minimum: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < minimum:
        raise AlertingSettingsError(f"{where}: expected a number >= {minimum:g}, got {value!r}")
    return float(value)


def _urls(value: object, where: str) -> Mapping[str, str]:
    if not isinstance(value, dict) or not value:
        raise AlertingSettingsError(f"{where}: expected a mapping of name to URL")
    out: dict[str, str] = {}
    for name, url in value.items():
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise AlertingSettingsError(f"{where}.{name}: expected an http(s) URL")
        out[str(name)] = url
    return MappingProxyType(out)


def _strings(value: object, where: str) -> tuple[str, ...]:
    items = value if isinstance(value, list) else [value]
    if not all(isinstance(item, str) and item for item in items):
        raise AlertingSettingsError(f"{where}: expected a string or a list of strings")
    return tuple(str(item) for item in items)


def _routing(value: object, where: str) -> tuple[RouteRule, ...]:
    if not isinstance(value, list):
        raise AlertingSettingsError(f"{where}: expected a list of mappings")
    severities = {str(s) for s in Severity}
    out = []
    for i, item in enumerate(value):
        here = f"{where}[{i}]"
        if not isinstance(item, dict):
            raise AlertingSettingsError(f"{here}: expected a mapping")
        unknown = set(item) - {"routes", "severities", "teams"}
        if unknown:
            raise AlertingSettingsError(f"{here}.{sorted(unknown)[0]}: unknown key")
        if "routes" not in item:
            raise AlertingSettingsError(f"{here}.routes: required")
        routes = _strings(item["routes"], f"{here}.routes")
        for route in routes:
            scheme, _, target = route.partition(":")
            if scheme not in ROUTE_SCHEMES or not target:
                raise AlertingSettingsError(
                    f"{here}.routes: {route!r}: expected <{'|'.join(ROUTE_SCHEMES)}>:<target>"
                )
        sev = _strings(item["severities"], f"{here}.severities") if "severities" in item else ()
        bad = [s for s in sev if s not in severities]
        if bad:
            raise AlertingSettingsError(
                f"{here}.severities: {bad[0]!r} is not one of {', '.join(sorted(severities))}"
            )
        teams = _strings(item["teams"], f"{here}.teams") if "teams" in item else ()
        out.append(RouteRule(routes=routes, severities=sev, teams=teams))
    return tuple(out)
