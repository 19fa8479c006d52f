"""Alertmanager silences of our own alerts: while a real action on the incident settles, its
alert is silenced until the verification; the silence is expired when the incident resolves."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Protocol, runtime_checkable

from gpuwarden.collector.alerts.model import Alert
from gpuwarden.collector.notify.incident_alerts import IncidentAlerts
from gpuwarden.collector.notify.notices import FIRING
from gpuwarden.collector.notify.senders import Senders
from gpuwarden.collector.notify.settings import AlertingSettings
from gpuwarden.collector.storage.base import NotificationRecord, Storage
from gpuwarden.collector.storage.records import Incident

_VERIFYING = "verifying"


@runtime_checkable
class Silencer(Protocol):
    """A notifier that can silence its own alert (Alertmanager)."""

    def silence(self, alert: Alert, route: str, *, until: float, comment: str) -> str | None:
        """Create a silence; its id, or None when the service refused."""
        ...

    def expire_silence(self, route: str, silence_id: str) -> bool:
        """End a silence early."""
        ...


class Silences:
    """Keeps the silences of the routes whose notifier is a :class:`Silencer` in step.

    Args:
        storage: the incidents' actions and the notification state.
        settings: the ``alerting:`` section (``silence_while_settling``).
        senders: the notifiers.
        alerts: builds the alert a silence matches.
    """

    def __init__(
        self,
        storage: Storage,
        settings: AlertingSettings,
        senders: Senders,
        alerts: IncidentAlerts,
    ) -> None:
        self._storage = storage
        self._settings = settings
        self._senders = senders
        self._alerts = alerts

    def tick(
        self,
        now: float,
        open_incidents: Mapping[int, Incident],
        known: Mapping[tuple[int, str], NotificationRecord],
    ) -> int:
        """Silence our Alertmanager alert while a real action settles; lift it when resolved."""
        done = 0
        for (incident_id, route), record in known.items():
            notifier = self._senders.peek(route)
            if not isinstance(notifier, Silencer) or not record.delivered:
                continue
            where = route.partition(":")[2]
            incident = open_incidents.get(incident_id)
            if incident is None:
                if record.silence_id and (record.silenced_until or 0.0) > now:
                    notifier.expire_silence(where, record.silence_id)
                    self._storage.save_notification(replace(record, silence_id=None))
                continue
            if not self._settings.silence_while_settling:
                continue
            settling = [
                row
                for row in self._storage.actions(incident_id=incident_id)
                if row.state == _VERIFYING and not row.dry_run and (row.verify_at or 0.0) > now
            ]
            if not settling:
                continue
            until = max(row.verify_at or 0.0 for row in settling)
            if (record.silenced_until or 0.0) >= until:
                continue
            row = settling[0]
            comment = (
                f"gpuwarden: {row.action} {row.target} (action {row.action_id}) is settling; "
                f"verification at {time.strftime('%H:%M:%SZ', time.gmtime(until))}"
            )
            alert = self._alerts.incident(incident, FIRING, now)
            silence_id = notifier.silence(alert, where, until=until, comment=comment)
            if silence_id is not None:
                self._storage.save_notification(
                    replace(record, silence_id=silence_id, silenced_until=until)
                )
                done += 1
        return done
