"""Slack through incoming webhooks (``slack_sdk``): Block Kit messages that carry the runbook.

One webhook URL per channel route (``slack:#gpu-waste``), read from the collector's config or
the environment and never logged. A message has a header, the summary, the facts as fields,
the actions taken or proposed, and buttons: runbook, incident, dashboard, and the signed
approval link of an action that waits for one. Texts are cut to Slack's limits.

Every value in a message comes from telemetry, jobs or alerts (a node name, a job, an
Alertmanager annotation) and is shown as typed, never as Slack markup:

* in ``mrkdwn`` texts (the summary, facts, actions, context and the ``text`` fallback) Slack's
  three control characters ``&``, ``<`` and ``>`` become ``&amp;``, ``&lt;`` and ``&gt;`` (Slack's
  "escaping text" rule), so ``<!channel>``, ``<!here>``, ``<@U123>`` and ``<https://evil|click>``
  in a value are text, not a mention or a link; and every ``mrkdwn`` object is ``verbatim``, so
  Slack does not auto-link URLs or channel names nor parse ``@channel``-style mentions in them;
* ``plain_text`` objects (the header, button labels) are never parsed for mentions or links;
* the only links are the buttons and the runbook link of the fallback text, all URLs we built
  (runbook, incident, dashboard, approval), and only ``http(s)``.

``*``, ``_``, ``~`` and backticks in a value may still change emphasis: Slack has no escape for
them, and they cannot mention anyone or link anywhere. Each message is
posted once (slack_sdk without its retry handlers): a 429 (with its ``Retry-After``), a 5xx or a
connection error comes back retryable, any other refusal rejected; refusals are logged without
the URL. The dispatcher decides whether to try again.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from typing import Any

from slack_sdk.webhook import WebhookClient

from gpuwarden.collector.alerts.model import Alert, AlertStatus, DeliveryResult
from gpuwarden.collector.clients.http import HttpResult
from gpuwarden.collector.notify.answers import delivery

log = logging.getLogger(__name__)
_SDK_LOG = logging.getLogger(f"{__name__}.sdk")
"""slack_sdk logs the webhook URL (a secret) at DEBUG: its logger never goes below WARNING."""

HEADER_CHARS = 150
SECTION_CHARS = 3000
FIELD_CHARS = 2000
MAX_FIELDS = 10
BUTTON_TEXT_CHARS = 75
URL_CHARS = 3000
FALLBACK_TEXT_CHARS = 4000
_EMOJI = {"page": ":rotating_light:", "critical": ":red_circle:", "warning": ":warning:"}


_ESCAPES = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;"})
_PARTIAL_ENTITY = re.compile(r"&[a-z]{0,3}$")
_LINK_SAFE = re.compile(r"https?://[^\s<>|]+")


def escape(value: object) -> str:
    """``value`` as literal text inside ``mrkdwn``: ``&``, ``<``, ``>`` as entities."""
    return str(value).translate(_ESCAPES)


def _cut(text: str, limit: int, *, escaped: bool = False) -> str:
    """``text`` within ``limit`` characters; an escaped text never ends inside an entity."""
    if len(text) <= limit:
        return text
    head = text[: limit - 1]
    return (_PARTIAL_ENTITY.sub("", head) if escaped else head) + "…"


def _mrkdwn(text: str, limit: int) -> dict[str, Any]:
    """A ``mrkdwn`` text object that Slack does not auto-parse (``text`` already escaped)."""
    return {"type": "mrkdwn", "text": _cut(text, limit, escaped=True), "verbatim": True}


def _ours(url: str | None) -> bool:
    """A link we built (runbook, incident, dashboard, approval): ``http(s)``, none of the
    characters of Slack's link syntax, short enough not to be cut."""
    if not url or len(url) > URL_CHARS:
        return False
    return _LINK_SAFE.fullmatch(url) is not None


def _button(text: str, url: str, action_id: str) -> dict[str, Any] | None:
    if not _ours(url):
        return None  # not one of our links, or a cut URL that would be a broken link
    return {
        "type": "button",
        "text": {"type": "plain_text", "text": _cut(text, BUTTON_TEXT_CHARS)},
        "url": url,
        "action_id": action_id,
    }


def slack_message(alert: Alert) -> dict[str, Any]:
    """The webhook body (``text`` fallback plus ``blocks``) for one alert."""
    resolved = alert.status is AlertStatus.RESOLVED
    mark = ":white_check_mark:" if resolved else _EMOJI.get(alert.severity, ":information_source:")
    state = "RESOLVED" if resolved else alert.severity.upper()
    header = _cut(f"{state}: {alert.rule_id} — {alert.summary}", HEADER_CHARS)
    fields = [
        _mrkdwn(f"*{escape(key)}*\n{escape(value)}", FIELD_CHARS)
        for key, value in list(alert.facts.items())[:MAX_FIELDS]
    ]
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": header}},
        {
            "type": "section",
            "text": _mrkdwn(f"{mark} {escape(alert.summary)}", SECTION_CHARS),
            **({"fields": fields} if fields else {}),
        },
    ]
    if alert.actions:
        lines = [
            f"• {escape(a.kind)} `{escape(a.target)}` ({escape(a.mode)}): {escape(a.state)}"
            for a in alert.actions
        ]
        blocks.append({"type": "section", "text": _mrkdwn("\n".join(lines), SECTION_CHARS)})
    buttons = [
        _button("Runbook", alert.runbook_url, "runbook"),
        _button("Incident", alert.incident_url or "", "incident"),
        _button("Dashboard", alert.dashboard_url or "", "dashboard"),
    ]
    for i, action in enumerate(alert.actions):
        if action.approval_url and not resolved:
            buttons.append(_button(f"Approve {action.kind}", action.approval_url, f"approve-{i}"))
    elements = [b for b in buttons if b is not None][:25]
    if elements:
        blocks.append({"type": "actions", "elements": elements})
    context = _mrkdwn(f"gpuwarden · fingerprint `{escape(alert.fingerprint)}`", SECTION_CHARS)
    blocks.append({"type": "context", "elements": [context]})
    # our runbook link stays a link: the text before it is cut, never the link. Its URL is
    # ours and holds none of Slack's link syntax (``_ours``); it is not entity-encoded, so a
    # query string's ``&`` reaches the browser as it is.
    runbook = f" (<{alert.runbook_url}|runbook>)" if _ours(alert.runbook_url) else ""
    head = _cut(f"{state}: {escape(alert.rule_id)}: {escape(alert.summary)}",
                FALLBACK_TEXT_CHARS - len(runbook), escaped=True)  # fmt: skip
    return {"text": head + runbook, "blocks": blocks}


class SlackNotifier:
    """Posts alerts to Slack incoming webhooks, one URL per channel.

    Args:
        webhooks: channel (as in the route, e.g. ``#gpu-waste``) → incoming-webhook URL.
        default_webhook: used for channels without their own URL (optional).
        timeout_seconds: per request.
        client_factory: builds the ``WebhookClient`` (default: one without retry handlers).
    """

    def __init__(
        self,
        webhooks: Mapping[str, str],
        *,
        default_webhook: str | None = None,
        timeout_seconds: float = 10.0,
        client_factory: Callable[[str], WebhookClient] | None = None,
    ) -> None:
        self._webhooks = dict(webhooks)
        self._default = default_webhook
        self._timeout = timeout_seconds
        self._factory = client_factory or self._client

    @property
    def name(self) -> str:
        """The route scheme."""
        return "slack"

    def _client(self, url: str) -> WebhookClient:
        _SDK_LOG.setLevel(logging.WARNING)
        return WebhookClient(
            url,
            timeout=int(self._timeout),
            logger=_SDK_LOG,
            retry_handlers=[],  # None would mean slack_sdk's defaults: the dispatcher retries
        )

    def send(self, alert: Alert, route: str) -> DeliveryResult:
        """Post ``alert`` to the channel ``route``, once; delivered when Slack answered 200."""
        url = self._webhooks.get(route, self._default)
        if not url:
            log.warning(
                "slack: no webhook configured for %s; alert %s not sent", route, alert.rule_id
            )
            return DeliveryResult.reject(f"no webhook configured for {route}")
        try:
            response = self._factory(url).send_dict(slack_message(alert))
        except Exception as exc:  # noqa: BLE001 - a notifier must never take the remediator down
            log.warning("slack: %s for %s: %s", type(exc).__name__, route, alert.rule_id)
            return DeliveryResult.retry(f"unreachable: {type(exc).__name__}")
        headers = {str(k).lower(): str(v) for k, v in (response.headers or {}).items()}
        answer = HttpResult(response.status_code, headers=headers, detail=str(response.body)[:100])
        result = delivery(answer, accepted={200})
        if not result.delivered:
            log.warning(
                "slack: %s answered %s (%s) for %s",
                route,
                response.status_code,
                str(response.body)[:100],
                alert.rule_id,
            )
        return result
