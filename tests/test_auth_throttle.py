"""Failed authentications throttled per source address (a fake clock, then the real app), and
the start-up warning for ``allow_unauthenticated`` beyond loopback."""

from __future__ import annotations

import pytest

from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.credentials import Role, TokenTable, credential
from gpuwarden.collector.web.app import create_app
from gpuwarden.collector.web.auth import exposure_warning
from gpuwarden.collector.web.keys import AUTH_STATS, THROTTLE
from gpuwarden.collector.web.throttle import FailureThrottle
from tests.test_collector_api import fleet

TOKEN = "reader-token-0123456789abcdef"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_limit_within_a_window_then_retry_after_until_it_ends():
    clock = Clock()
    throttle = FailureThrottle(3, 60.0, 100, clock=clock)
    for _ in range(2):
        throttle.failed("10.0.0.1")
    assert throttle.retry_after("10.0.0.1") == 0  # 2 of 3
    clock.now += 10.5
    throttle.failed("10.0.0.1")
    assert throttle.retry_after("10.0.0.1") == 50  # the window began at the first failure
    assert throttle.retry_after("10.0.0.2") == 0  # another address is not concerned
    clock.now += 49.0
    assert throttle.retry_after("10.0.0.1") == 1  # 0.5 s left, rounded up
    clock.now += 0.5
    assert throttle.retry_after("10.0.0.1") == 0  # the window ended: forgotten
    assert len(throttle) == 0
    throttle.failed("10.0.0.1")
    assert throttle.retry_after("10.0.0.1") == 0  # a new window, one failure


def test_failures_in_a_new_window_start_over():
    clock = Clock()
    throttle = FailureThrottle(2, 60.0, 100, clock=clock)
    throttle.failed("a")
    clock.now += 60.0
    throttle.failed("a")  # the old window is over: one failure in the new one
    assert throttle.retry_after("a") == 0


def test_the_table_is_bounded_forgetting_the_least_recent_failure_first():
    clock = Clock()
    throttle = FailureThrottle(1, 60.0, 3, clock=clock)
    for source in ("a", "b", "c", "a", "d"):  # "a" failed again after "b" and "c"
        throttle.failed(source)
    assert len(throttle) == 3
    assert [throttle.retry_after(s) > 0 for s in ("a", "b", "c", "d")] == [
        True,
        False,
        True,
        True,
    ]


def test_a_limit_of_zero_never_throttles():
    throttle = FailureThrottle(0, 60.0, 3, clock=Clock())
    for _ in range(100):
        throttle.failed("a")
    assert throttle.retry_after("a") == 0
    assert len(throttle) == 0


@pytest.mark.parametrize(("limit", "window", "sources"), [(-1, 60.0, 1), (1, 0.0, 1), (1, 60.0, 0)])
def test_bad_settings_are_refused(limit, window, sources):
    with pytest.raises(ValueError, match="need limit >= 0"):
        FailureThrottle(limit, window, sources)


async def test_the_app_answers_429_without_checking_then_lets_a_valid_token_in(aiohttp_client):
    service = fleet()
    config = CollectorConfig(
        tokens=TokenTable((credential(TOKEN, Role.READER, "grafana"),)), auth_failure_limit=3
    )
    app = create_app(config, service=service, background=False)
    clock = Clock()
    app[THROTTLE] = FailureThrottle(3, 60.0, 100, clock=clock)  # the same limits, our clock
    client = await aiohttp_client(app)
    wrong = {"Authorization": "Bearer wrong-token-0123456789"}
    good = {"Authorization": f"Bearer {TOKEN}"}
    assert [(await client.get("/v1/gpus", headers=wrong)).status for _ in range(3)] == [401] * 3
    throttled = await client.get("/v1/gpus", headers=good)  # not even looked at
    assert throttled.status == 429
    assert throttled.headers["Retry-After"] == "60"
    assert (await client.get("/healthz")).status == 200  # probes stay open
    clock.now += 60.0
    assert (await client.get("/v1/gpus", headers=good)).status == 200
    assert dict(app[AUTH_STATS].refusals) == {
        ("GET", "/v1/gpus", 401, "invalid"): 3,
        ("GET", "/v1/gpus", 429, "throttled"): 1,
    }
    service.storage.close()


@pytest.mark.parametrize(
    ("host", "warned"),
    [
        ("127.0.0.1", False),
        ("127.0.0.53", False),
        ("::1", False),
        ("localhost", False),
        ("0.0.0.0", True),
        ("::", True),
        ("10.1.2.3", True),
        ("collector.example", True),
    ],
)
def test_auth_none_beyond_loopback_warns(host, warned):
    warning = exposure_warning(CollectorConfig(host=host, allow_unauthenticated=True))
    assert (warning is not None) is warned
    if warning is not None:
        assert warning.startswith(f"allow_unauthenticated on {host}:4318, beyond loopback")


def test_tokens_never_warn():
    tokens = TokenTable((credential(TOKEN, Role.READER, "grafana"),))
    assert exposure_warning(CollectorConfig(host="0.0.0.0", tokens=tokens)) is None
