"""Run the real collector application on loopback in a background thread (for sync tests)."""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.credentials import Role, TokenTable, credential
from gpuwarden.collector.ingest.sink import SeriesLog
from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.web.app import create_app
from gpuwarden.collector.web.remediation_setup import Remediation

TOKEN = "agent-token-for-tests-0123456789"
"""An agent token bound to every node (``nodes=*``): the tests' agents are many nodes."""
READER_TOKEN = "reader-token-for-tests-0123456789"
READER = {"Authorization": f"Bearer {READER_TOKEN}"}
TOKENS = TokenTable(
    (
        credential(TOKEN, Role.AGENT, "agents", ("*",)),
        credential(READER_TOKEN, Role.READER, "tests"),
    )
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class CollectorThread:
    """The collector app served from its own event loop; stop and start again on the same port."""

    def __init__(
        self,
        port: int | None = None,
        log: SeriesLog | None = None,
        service: CollectorService | None = None,
        *,
        unauthenticated: bool = False,
        remediation: Remediation | None = None,
        settings: Mapping[str, Any] | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        """``unauthenticated``: ``allow_unauthenticated`` (for a browser), else :data:`TOKENS`;
        ``settings``: more collector config keys (``tokens``, ``signin``...) over those."""
        self.port = port or free_port()
        self.ssl_context = ssl_context  # serve HTTPS with it
        self.log = log if log is not None else SeriesLog()
        self.service = service
        self.remediation = remediation
        if unauthenticated:
            keys: dict[str, Any] = {"allow_unauthenticated": True}
        else:
            keys = {"tokens": TOKENS}
        self.config = CollectorConfig(**{"port": self.port, **keys, **(settings or {})})
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self.app: web.Application | None = None

    @property
    def endpoint(self) -> str:
        scheme = "http" if self.ssl_context is None else "https"
        return f"{scheme}://127.0.0.1:{self.port}/v1/metrics"

    def start(self) -> None:
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()

        async def serve() -> None:
            self.app = create_app(
                self.config,
                self.log,
                service=self.service,
                background=False,
                remediation=self.remediation,
            )
            self._runner = web.AppRunner(self.app, access_log=None)
            await self._runner.setup()
            site = web.TCPSite(
                self._runner,
                "127.0.0.1",
                self.port,
                reuse_address=True,
                ssl_context=self.ssl_context,
            )
            await site.start()
            ready.set()

        def main() -> None:
            assert self._loop is not None
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(serve())
            self._loop.run_forever()

        self._thread = threading.Thread(target=main, name="collector", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("collector did not start")

    def stop(self) -> None:
        loop, runner = self._loop, self._runner
        if loop is None or runner is None:
            return
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        assert self._thread is not None
        self._thread.join(10)
        loop.close()
        self._loop = self._runner = self._thread = None

    def __enter__(self) -> CollectorThread:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
