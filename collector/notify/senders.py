"""The dispatcher's one way to call a notifier: by route, once, with a notifier's bug turned into
a retryable result so it cannot stop the other routes (the dispatcher retries; see
:mod:`.dispatcher`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, runtime_checkable

from gpuwarden.collector.alerts.model import Alert, DeliveryResult, Notifier
from gpuwarden.collector.storage.sql_base import FencedError

# The dispatcher's log lines keep the logger name they have always had (operators filter on it).
log = logging.getLogger("gpuwarden.collector.notify.dispatcher")


@runtime_checkable
class BatchNotifier(Protocol):
    """A notifier whose service takes many alerts in one request."""

    def send_many(self, alerts: Sequence[Alert], route: str) -> DeliveryResult:
        """Deliver all of ``alerts`` to ``route`` in one request, once."""
        ...


class Senders:
    """The notifiers by route scheme (``scheme:where``).

    Args:
        notifiers: by route scheme.
    """

    def __init__(self, notifiers: Mapping[str, Notifier]) -> None:
        self._notifiers = dict(notifiers)
        self._warned: set[str] = set()
        self.leading: Callable[[], bool] = lambda: True
        """Checked before every push (active/standby: the lease, by the local clock): a leader
        that was paused past its lease sends nothing more (its saves are fenced anyway)."""

    def _check_leading(self) -> None:
        if not self.leading():
            raise FencedError("this collector no longer leads: nothing sent")

    def get(self, route: str) -> Notifier | None:
        """The notifier of ``route``'s scheme; None (said once per scheme) when there is none."""
        scheme = route.partition(":")[0]
        notifier = self._notifiers.get(scheme)
        if notifier is None and scheme not in self._warned:
            self._warned.add(scheme)
            log.warning("no notifier configured for route scheme %r: alerts not sent", scheme)
        return notifier

    def peek(self, route: str) -> object:
        """The notifier of ``route``'s scheme or None, without a warning (to test its kind)."""
        return self._notifiers.get(route.partition(":")[0])

    def send(self, alert: Alert, route: str) -> DeliveryResult:
        """One push of ``alert`` to ``route``, whose scheme has a notifier."""
        scheme, _, where = route.partition(":")
        notifier = self._notifiers[scheme]
        self._check_leading()
        try:
            return notifier.send(alert, where)
        except Exception as exc:  # a notifier bug must not stop the others; retried next pass
            log.exception("notifier %s failed for %s", scheme, alert.rule_id)
            return DeliveryResult.retry(f"notifier error: {type(exc).__name__}")

    def send_many(
        self, notifier: BatchNotifier, alerts: Sequence[Alert], route: str
    ) -> DeliveryResult:
        """One request with all of ``alerts`` to ``route`` through ``notifier`` (its scheme's)."""
        scheme, _, where = route.partition(":")
        self._check_leading()
        try:
            return notifier.send_many(alerts, where)
        except Exception as exc:  # a notifier bug must not stop the others; retried
            log.exception("notifier %s failed for %d alerts", scheme, len(alerts))
            return DeliveryResult.retry(f"notifier error: {type(exc).__name__}")
