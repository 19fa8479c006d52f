"""The webhook actuator against a real HTTP server on 127.0.0.1 that checks signatures."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gpuwarden.collector.alerts.signing import (
    IDEMPOTENCY_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    Webhook,
    WebhookConfigError,
    load_secret,
    signature,
    verify,
)
from gpuwarden.collector.remediate.actuators.base import ActionRequest, Outcome
from gpuwarden.collector.remediate.actuators.webhook import WebhookActuator

SECRET = b"s3cret-for-tests-only-0123456789"
NOW = 1_795_321_400.0


@dataclass
class Capture:
    """What the receiver saw; ``status`` is what it answers."""

    status: int = 200
    seen: list[tuple[dict[str, str], bytes, bool]] = field(default_factory=list)


class _Handler(BaseHTTPRequestHandler):
    server: Any

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""

    def do_POST(self) -> None:
        capture: Capture = self.server.capture
        body = self.rfile.read(int(self.headers["Content-Length"]))
        headers = dict(self.headers.items())
        valid = verify(
            SECRET,
            timestamp=headers.get(TIMESTAMP_HEADER, ""),
            body=body,
            header=headers.get(SIGNATURE_HEADER, ""),
            now=NOW,
        )
        capture.seen.append((headers, body, valid))
        self.send_response(capture.status if valid else 401)
        self.send_header("Content-Length", "0")
        self.end_headers()


@pytest.fixture
def receiver() -> Iterator[tuple[str, Capture]]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    capture = Capture()
    server.capture = capture  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02})
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hook", capture
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _request(*, dry_run: bool = False, name: str = "ticketing") -> ActionRequest:
    return ActionRequest("webhook", "node-7", "key-abc", dry_run, {"name": name})


def test_post_is_signed_and_carries_the_idempotency_key(receiver: tuple[str, Capture]) -> None:
    url, capture = receiver
    actuator = WebhookActuator([Webhook("ticketing", url, SECRET)], clock=lambda: NOW)
    result = actuator.execute(_request())
    assert result.outcome is Outcome.DONE
    [(headers, body, valid)] = capture.seen
    assert valid
    assert headers[IDEMPOTENCY_HEADER] == "key-abc"
    assert headers[TIMESTAMP_HEADER] == str(int(NOW))
    assert b'"target":"node-7"' in body
    assert SECRET.decode() not in result.detail


def test_wrong_secret_is_refused_by_the_receiver(receiver: tuple[str, Capture]) -> None:
    url, capture = receiver
    other = WebhookActuator([Webhook("ticketing", url, b"x" * 32)], clock=lambda: NOW)
    assert other.execute(_request()).outcome is Outcome.REFUSED
    assert capture.seen[0][2] is False


@pytest.mark.parametrize(
    ("status", "outcome"),
    [
        (202, Outcome.DONE),
        (409, Outcome.ALREADY_DONE),
        (404, Outcome.NOT_FOUND),
        (400, Outcome.REFUSED),
        (429, Outcome.FAILED),
        (503, Outcome.FAILED),
    ],
)
def test_status_mapping(receiver: tuple[str, Capture], status: int, outcome: Outcome) -> None:
    url, capture = receiver
    capture.status = status
    actuator = WebhookActuator([Webhook("ticketing", url, SECRET)], clock=lambda: NOW)
    assert actuator.execute(_request()).outcome is outcome


def test_dry_run_and_unknown_webhook_send_nothing(receiver: tuple[str, Capture]) -> None:
    url, capture = receiver
    actuator = WebhookActuator([Webhook("ticketing", url, SECRET)], clock=lambda: NOW)
    assert actuator.execute(_request(dry_run=True)).outcome is Outcome.DRY_RUN
    assert actuator.execute(_request(name="other")).outcome is Outcome.REFUSED
    assert capture.seen == []


def test_rollback_posts_a_rollback_event_with_its_own_key(receiver: tuple[str, Capture]) -> None:
    url, capture = receiver
    actuator = WebhookActuator([Webhook("ticketing", url, SECRET)], clock=lambda: NOW)
    done = actuator.execute(_request())
    assert actuator.rollback(_request(), done).outcome is Outcome.DONE
    headers, body, _ = capture.seen[1]
    assert headers[IDEMPOTENCY_HEADER] == "key-abc:rollback"
    assert b'"event":"rollback"' in body


def test_unreachable_is_failed() -> None:
    actuator = WebhookActuator([Webhook("t", "http://127.0.0.1:9/x", SECRET)], clock=lambda: NOW)
    request = ActionRequest("webhook", "n", "k", False, {"name": "t"})
    assert actuator.execute(request).outcome is Outcome.FAILED


def test_verify_rejects_stale_and_tampered() -> None:
    stamp = str(int(NOW))
    good = signature(SECRET, stamp, b"{}")
    assert verify(SECRET, timestamp=stamp, body=b"{}", header=good, now=NOW)
    assert not verify(SECRET, timestamp=stamp, body=b"{ }", header=good, now=NOW)
    assert not verify(SECRET, timestamp=stamp, body=b"{}", header=good, now=NOW + 301)


def test_load_secret_file_then_env(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_text("from-file-secret\n")
    assert (
        load_secret("t", secret_file=path, secret_env="X", environ={"X": "e"})
        == b"from-file-secret"
    )
    assert load_secret("t", secret_env="X", environ={"X": "from-env"}) == b"from-env"
    with pytest.raises(WebhookConfigError, match="no secret"):
        load_secret("t", secret_env="X", environ={})
    assert SECRET.decode() not in repr(Webhook("t", "http://127.0.0.1/", SECRET))
