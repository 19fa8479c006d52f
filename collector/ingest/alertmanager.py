"""An Alertmanager-compatible webhook receiver: alerts from users' own Prometheus rules become
gpuwarden incidents, with their runbooks, alerts and actions.

Alertmanager posts its webhook payload (version "4": ``receiver``, ``status``, ``alerts[]``
with ``status``, ``labels``, ``annotations``, ``startsAt``, ``endsAt``, ``fingerprint``...)
to ``POST /v1/alertmanager``. Each alert is matched against the rules whose detector is
``alertmanager`` (their ``selector.labels`` must all be on the alert; team, job, node and model
patterns apply to the labels the rule's parameters name). A firing alert opens an incident (or
updates the open one: the fingerprint is the rule plus Alertmanager's own alert fingerprint),
a resolved one resolves it. Alerts no rule selects are counted and ignored.

Input is validated with size limits: :class:`PayloadError` is a permanent problem (answer 4xx,
Alertmanager does not retry), a storage failure is transient (answer 5xx, it retries).
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from gpuwarden.collector.alerts.model import FINGERPRINT_LABEL
from gpuwarden.collector.rules.model import Rule, Severity
from gpuwarden.collector.storage.base import Storage
from gpuwarden.collector.storage.records import Incident, IncidentState

log = logging.getLogger(__name__)

DETECTOR = "alertmanager"
MAX_ALERTS = 1000
MAX_LABELS = 64
MAX_NAME_CHARS = 128
MAX_VALUE_CHARS = 4096
_ZERO_TIME = "0001-01-01T00:00:00Z"
_SEVERITIES = {str(s) for s in Severity}


class PayloadError(ValueError):
    """The payload is not an Alertmanager webhook message (permanent: do not retry)."""


@dataclass(frozen=True, slots=True)
class ReceivedAlert:
    """One validated alert of the payload."""

    status: str  # firing | resolved
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    starts_at: float | None
    ends_at: float | None
    generator_url: str
    fingerprint: str


@dataclass(frozen=True, slots=True)
class ReceiveResult:
    """What one payload did."""

    received: int = 0
    opened: int = 0
    updated: int = 0
    resolved: int = 0
    ignored: int = 0


def _strmap(raw: object, where: str) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise PayloadError(f"{where}: expected an object of strings")
    if len(raw) > MAX_LABELS:
        raise PayloadError(f"{where}: more than {MAX_LABELS} entries")
    out: dict[str, str] = {}
    for key, value in raw.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise PayloadError(f"{where}[{str(key)[:40]!r}]: expected a string")
        if not key or len(key) > MAX_NAME_CHARS:
            raise PayloadError(f"{where}: a name is empty or over {MAX_NAME_CHARS} characters")
        out[key] = value[:MAX_VALUE_CHARS]
    return out


def _time(raw: object, where: str) -> float | None:
    if raw in (None, "", _ZERO_TIME):
        return None
    if not isinstance(raw, str) or len(raw) > 64:
        raise PayloadError(f"{where}: expected an RFC 3339 time")
    text = raw.replace("Z", "+00:00")
    if "." in text:  # Go writes nanoseconds; Python takes at most microseconds
        head, _, tail = text.partition(".")
        count = len(tail) - len(tail.lstrip("0123456789"))
        text = f"{head}.{tail[: min(count, 6)]}{tail[count:]}"
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise PayloadError(f"{where}: expected an RFC 3339 time, got {raw[:40]!r}") from None
    if moment.tzinfo is None:
        raise PayloadError(f"{where}: the time has no zone")
    value = moment.timestamp()
    return value if math.isfinite(value) and value > 0 else None


def parse_payload(body: object) -> list[ReceivedAlert]:
    """The alerts of a webhook payload; :class:`PayloadError` names what is wrong."""
    if not isinstance(body, dict):
        raise PayloadError("expected a JSON object (Alertmanager webhook payload)")
    version = body.get("version")
    if version != "4":
        raise PayloadError(f'version: expected "4", got {str(version)[:20]!r}')
    alerts = body.get("alerts")
    if not isinstance(alerts, list):
        raise PayloadError("alerts: expected a list")
    if len(alerts) > MAX_ALERTS:
        raise PayloadError(f"alerts: more than {MAX_ALERTS} (set max_alerts in Alertmanager)")
    out = []
    for i, raw in enumerate(alerts):
        where = f"alerts[{i}]"
        if not isinstance(raw, dict):
            raise PayloadError(f"{where}: expected an object")
        status = raw.get("status")
        if status not in ("firing", "resolved"):
            raise PayloadError(f"{where}.status: expected firing or resolved")
        labels = _strmap(raw.get("labels"), f"{where}.labels")
        if not labels:
            raise PayloadError(f"{where}.labels: an alert needs labels")
        fingerprint = raw.get("fingerprint")
        if not isinstance(fingerprint, str) or not fingerprint or len(fingerprint) > 64:
            # Alertmanager always sends one; others get a hash of the label set
            canonical = "\x00".join(f"{k}\x01{v}" for k, v in sorted(labels.items()))
            fingerprint = hashlib.sha256(canonical.encode()).hexdigest()[:16]
        generator = raw.get("generatorURL")
        out.append(
            ReceivedAlert(
                status=str(status),
                labels=labels,
                annotations=_strmap(raw.get("annotations"), f"{where}.annotations"),
                starts_at=_time(raw.get("startsAt"), f"{where}.startsAt"),
                ends_at=_time(raw.get("endsAt"), f"{where}.endsAt"),
                generator_url=generator[:2048] if isinstance(generator, str) else "",
                fingerprint=fingerprint,
            )
        )
    return out


def _selects(rule: Rule, alert: ReceivedAlert) -> bool:
    labels = alert.labels
    params = rule.parameters

    def label(name: str) -> str | None:
        return labels.get(str(params[name]))

    return rule.selector.matches(
        team=labels.get("team"),
        job=label("job_label"),
        node=label("node_label"),
        model=label("deployment_label"),
        labels=labels,
    )


def _evidence(rule: Rule, alert: ReceivedAlert) -> dict[str, Any]:
    labels, notes, params = alert.labels, alert.annotations, rule.parameters
    job = labels.get(str(params["job_label"]))
    node = labels.get(str(params["node_label"]))
    deployment = labels.get(str(params["deployment_label"]))
    alertname = labels.get("alertname", "alert")
    subject = job or deployment or node or alertname
    evidence: dict[str, Any] = {
        "subject": subject,
        "summary": notes.get("summary") or notes.get("description") or alertname,
        "alertname": alertname,
        "source": "alertmanager",
        "alert_fingerprint": alert.fingerprint,
        "labels": dict(labels),
    }
    evidence |= {
        key: value
        for key, value in (("job", job), ("node", node), ("deployment", deployment))
        if value
    }
    if deployment:
        evidence["model"] = deployment
    for key in ("gpu", "team"):
        if labels.get(key):
            evidence[key] = labels[key]
    for key in ("description", "runbook_url", "dashboard_url"):
        if notes.get(key):
            evidence[f"alert_{key}"] = notes[key]
    if alert.generator_url:
        evidence["generator_url"] = alert.generator_url
    return evidence


class AlertReceiver:
    """Folds received alerts into incidents of the ``alertmanager`` rules.

    Args:
        storage: where incidents live.
        rules: the loaded rules; only enabled ``alertmanager`` rules take alerts.
    """

    def __init__(self, storage: Storage, rules: Iterable[Rule]) -> None:
        self._storage = storage
        self._rules = [r for r in rules if r.detector == DETECTOR and r.enabled]

    def replace_rules(self, rules: Iterable[Rule]) -> None:
        """Take alerts for ``rules`` from now on (an admin reload)."""
        self._rules = [r for r in rules if r.detector == DETECTOR and r.enabled]

    @property
    def rules(self) -> list[Rule]:
        """The rules that take alerts."""
        return list(self._rules)

    def receive(self, alerts: Iterable[ReceivedAlert], *, now: float) -> ReceiveResult:
        """Open, update or resolve one incident per (rule, alert)."""
        received = opened = updated = resolved = ignored = 0
        for alert in alerts:
            received += 1
            if FINGERPRINT_LABEL in alert.labels:
                ignored += 1  # our own alert routed back to us: never loop
                continue
            matched = [rule for rule in self._rules if _selects(rule, alert)]
            if not matched:
                ignored += 1
                continue
            for rule in matched:
                outcome = self._fold(rule, alert, now)
                opened += outcome == "opened"
                updated += outcome == "updated"
                resolved += outcome == "resolved"
        return ReceiveResult(received, opened, updated, resolved, ignored)

    def _fold(self, rule: Rule, alert: ReceivedAlert, now: float) -> str:
        fingerprint = f"am:{rule.id}:{alert.fingerprint}"
        current = self._storage.open_incident_for(fingerprint)
        severity = alert.labels.get("severity", "")
        severity = severity if severity in _SEVERITIES else str(rule.severity)
        if alert.status == "resolved":
            if current is None:
                return "ignored"
            ended = alert.ends_at if alert.ends_at is not None else now
            self._storage.update_incident(
                replace(
                    current,
                    state=IncidentState.RESOLVED,
                    resolved_time=min(ended, now),
                    last_seen=now,
                    consecutive_clears=current.consecutive_clears + 1,
                    consecutive_breaches=0,
                )
            )
            log.info("incident %s resolved by Alertmanager", fingerprint)
            return "resolved"
        evidence = _evidence(rule, alert)
        if current is not None:
            self._storage.update_incident(
                replace(
                    current,
                    last_seen=now,
                    severity=severity,
                    evidence=evidence,
                    consecutive_breaches=current.consecutive_breaches + 1,
                    consecutive_clears=0,
                )
            )
            return "updated"
        started = alert.starts_at if alert.starts_at is not None else now
        incident = Incident(
            fingerprint=fingerprint,
            rule_id=rule.id,
            severity=severity,
            first_seen=min(started, now),
            last_seen=now,
            evidence=evidence,
            consecutive_breaches=1,
        )
        if self._storage.open_incident(incident) is None:
            return "updated"  # opened concurrently by another delivery
        log.warning("incident %s opened from Alertmanager: %s", fingerprint, evidence["summary"])
        return "opened"
