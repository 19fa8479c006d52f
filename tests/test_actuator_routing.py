"""Degrade and restore through the reference serving router, served on loopback."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
from aiohttp import web

from gpuwarden.collector.remediate.actuators.base import ActionRequest, ActionResult, Outcome
from gpuwarden.collector.remediate.actuators.http_router import HttpRouterActuator
from gpuwarden.collector.remediate.actuators.settings import RouteSpec
from gpuwarden.demo_router import (
    RouteError,
    RouterState,
    create_router_app,
)
from tests.collector_server import free_port

TOKEN = "router-token-0123456789"


class Served:
    """The router app in its own event loop thread."""

    def __init__(self, app: web.Application) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._loop = asyncio.new_event_loop()
        self._runner = web.AppRunner(app, access_log=None)
        ready = threading.Event()

        def main() -> None:
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(self._runner.setup())
            site = web.TCPSite(self._runner, "127.0.0.1", self.port)
            self._loop.run_until_complete(site.start())
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=main, daemon=True)
        self._thread.start()
        assert ready.wait(10)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


@pytest.fixture
def router() -> Iterator[tuple[RouterState, Served]]:
    state = RouterState({"llama": {"llama-70b": 100.0, "llama-8b": 0.0}})
    served = Served(create_router_app(state, token=TOKEN))
    yield state, served
    served.stop()


def degrade(target: str = "llama-70b", *, ratio: float = 0.5, dry: bool = False) -> ActionRequest:
    return ActionRequest("degrade", target, "k", dry, {"traffic_ratio": ratio})


def actuator(url: str, token: str = TOKEN) -> HttpRouterActuator:
    return HttpRouterActuator(url, {"llama-70b": RouteSpec("llama", "llama-70b", "llama-8b")},
                              token=token)  # fmt: skip


def test_degrade_moves_traffic_and_rollback_restores_it_exactly(router):
    state, served = router
    act = actuator(served.url)
    assert act.accepts("llama-70b")
    assert not act.accepts("other")
    dry = act.execute(degrade(dry=True))
    assert dry.outcome is Outcome.DRY_RUN
    assert state.share("llama", "llama-8b") == 0.0
    done = act.execute(degrade(ratio=0.4))
    assert done.outcome is Outcome.DONE, done.detail
    assert state.share("llama", "llama-8b") == pytest.approx(0.4)
    assert act.execute(degrade(ratio=0.4)).outcome is Outcome.ALREADY_DONE
    probed = act.probe(degrade(ratio=0.4))
    assert probed is not None
    assert probed.outcome is Outcome.ALREADY_DONE
    restored = act.rollback(degrade(), done)
    assert restored.outcome is Outcome.DONE
    assert state.get("llama") == {"llama-70b": 100.0, "llama-8b": 0.0}
    again = act.execute(ActionRequest("restore", "llama-70b", "k", False))
    assert again.outcome is Outcome.ALREADY_DONE


def test_refusals_and_failures(router):
    state, served = router
    assert actuator(served.url).execute(degrade("other")).outcome is Outcome.REFUSED
    assert actuator(served.url).execute(degrade(ratio=1.5)).outcome is Outcome.REFUSED
    wrong_token = actuator(served.url, token="nope").execute(degrade())
    assert wrong_token.outcome is Outcome.FAILED  # 401 on the read
    gone = HttpRouterActuator(served.url, {"x": RouteSpec("missing", "a", "b")}, token=TOKEN)
    assert gone.execute(degrade("x")).outcome is Outcome.NOT_FOUND
    down = actuator(f"http://127.0.0.1:{free_port()}")
    assert down.execute(degrade()).outcome is Outcome.FAILED
    assert state.get("llama")["llama-8b"] == 0.0
    with pytest.raises(ValueError, match="http"):
        HttpRouterActuator("file:///etc/passwd", {})
    bad = act_rollback_without_undo(served.url)
    assert bad.outcome is Outcome.REFUSED


def act_rollback_without_undo(url: str) -> ActionResult:
    return actuator(url).rollback(degrade(), ActionResult(Outcome.DONE, "x"))


def test_router_state_validates_weights():
    state = RouterState({"r": {"a": 1.0, "b": 1.0}})
    assert state.share("r", "a") == 0.5
    for bad in ({}, {"a": -1, "b": 1}, {"a": 0, "b": 0}, {"a": float("nan"), "b": 1},
                {"a": 1, "c": 1}, {"a": True, "b": 1}):  # fmt: skip
        with pytest.raises(RouteError):
            state.set("r", bad)
    with pytest.raises(KeyError):
        state.set("nope", {"a": 1})
    assert state.get("r") == {"a": 1.0, "b": 1.0}


async def test_router_http_api_answers_like_its_contract(aiohttp_client):
    client = await aiohttp_client(
        create_router_app(RouterState({"r": {"a": 3.0, "b": 1.0}}), token=TOKEN)
    )
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert (await client.get("/v1/routes")).status == 401
    listed = await (await client.get("/v1/routes", headers=auth)).json()
    assert listed == {"routes": [{"name": "r", "backends": {"a": 3.0, "b": 1.0}}]}
    assert (await client.get("/v1/routes/x", headers=auth)).status == 404
    bad = await client.put("/v1/routes/r", headers=auth, data=b"{not json")
    assert bad.status == 400
    wrong = await client.put("/v1/routes/r", headers=auth, json={"backends": {"a": 1, "z": 1}})
    assert wrong.status == 400
    ok = await client.put("/v1/routes/r", headers=auth, json={"backends": {"a": 1, "b": 1}})
    assert ok.status == 200
    assert (await ok.json())["backends"] == {"a": 1.0, "b": 1.0}
    huge = await client.put("/v1/routes/r", headers=auth, data=b"x" * 70_000)
    assert huge.status == 413
