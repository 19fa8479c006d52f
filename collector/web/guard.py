"""Guards against hostile clients, around the authentication middleware.

- :func:`header_guard` (before authentication): a request whose header names or values are not
  UTF-8 (aiohttp keeps such bytes as lone surrogates, which every later ``encode`` trips on)
  is answered 400 before any handler or middleware reads them.
- :func:`body_guard` (after authentication, so only callers with a valid token, or open routes,
  get their bodies read): the whole body is read (a multipart form parsed) before the handler
  runs, within ``CollectorConfig.body_timeout_seconds`` of the request head; a body that
  trickles in slower is answered 408 and the connection closed (503 with ``Retry-After`` once
  the collector is stopping: :mod:`.stopping`). Handlers then read the buffered
  body (``read``, ``json``, ``post``) at once, never the stream, so no handler (nor a receiver
  slot) waits on a slow client. A body over ``client_max_size`` is a 413 as before.

- :func:`busy` and :func:`inflight_slot`: the in-flight slots a receiver's request holds while
  it is decoded and stored; beyond them the answer is 503 with ``Retry-After``.

The header read timeout is not here: aiohttp closes a connection that has not sent a whole
request head within its ``keepalive_timeout`` of connecting or of its previous answer, and
the app factory sets that to ``header_timeout_seconds``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from contextlib import contextmanager

from aiohttp import web

from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.web.headers import security_headers
from gpuwarden.collector.web.keys import CONFIG, ROUTE_ACCESS, STATS, STOPPING, Handler, IngestStats
from gpuwarden.collector.web.stopping import Stopping

log = logging.getLogger(__name__)


def _utf8(text: str) -> bool:
    """Whether ``text`` is what aiohttp decoded from valid UTF-8 (no lone surrogates)."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@web.middleware
async def header_guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Answer 400 to a request with a header name or value that is not UTF-8."""
    for name, value in request.headers.items():
        if not (_utf8(name) and _utf8(value)):
            shown = name if _utf8(name) else "(a header name)"
            _count(request, 400)
            return web.Response(status=400, text=f"header {shown} is not valid UTF-8\n")
    return await handler(request)


def setup_guards(app: web.Application) -> None:
    """What every response and request gets besides the middlewares: security headers (CSP & co.)
    on every response, and the stop mark :func:`body_guard` reads (body waits end when the stop
    begins: :mod:`.stopping`)."""
    app.on_response_prepare.append(security_headers)
    app[STOPPING] = Stopping()
    app.on_shutdown.append(_stop_body_waits)


async def _stop_body_waits(app: web.Application) -> None:
    """An ``on_shutdown`` hook: body reads still waiting end now (503), not at their timeout."""
    app[STOPPING].start()


@web.middleware
async def body_guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Read the whole body within the body timeout before the handler runs (408 otherwise)."""
    if request.body_exists and request.match_info.http_exception is None:
        config = request.app[CONFIG]
        length = request.content_length
        if length is not None and length > config.max_body_bytes:
            _count(request, 413)
            text = f"body exceeds {config.max_body_bytes} bytes\n"
            response = web.Response(status=413, text=text)
            response.force_close()
            return response
        stopping = request.app[STOPPING]
        timeout = stopping.timeout(config.body_timeout_seconds)
        try:
            async with asyncio.timeout(timeout) as wait:
                with stopping.waiting(wait):
                    if request.content_type == "multipart/form-data":
                        await request.post()  # parsed and kept: the handler's post() returns it
                    else:
                        await request.read()  # buffered: the handler's read() returns it at once
        except TimeoutError:
            if stopping.started:  # not stored: the sender sends it again (``web.stopping``)
                log.info("%s: body not received before the stop, closing", request.remote)
                _count(request, 503)
                response = web.Response(
                    status=503,
                    text="collector stopping: send again\n",
                    headers={"Retry-After": "1"},
                )
                response.force_close()
                return response
            log.info("%s: body not received within %g s, closing", request.remote, timeout)
            _count(request, 408)
            response = web.Response(status=408, text=f"body not received within {timeout:g} s\n")
            response.force_close()
            return response
        except web.HTTPRequestEntityTooLarge:
            _count(request, 413)
            raise
        except (web.RequestPayloadError, ValueError) as exc:  # broken chunks, bad multipart
            _count(request, 400)
            return web.Response(status=400, text=f"malformed body: {exc}\n")
    return await handler(request)


def _count(request: web.Request, status: int) -> None:
    """Count an answer of the OTLP receiver's routes in its own counters (as it would)."""
    match = request.match_info
    if match.http_exception is not None:
        return
    admits = request.app[ROUTE_ACCESS].get(match.handler)
    if admits is not None and admits.plain_refusals:  # the receiver's routes
        request.app[STATS].responses[status] += 1


def busy(config: CollectorConfig, stats: IngestStats, source: str) -> str | None:
    """Why a receiver's request of ``source`` cannot take an in-flight slot now (None: it can):
    ``max_inflight_requests`` slots in use, or ``max_inflight_per_token`` of this caller."""
    if stats.inflight >= config.max_inflight_requests:
        return "collector busy"
    if stats.inflight_by_caller[source] >= config.max_inflight_per_token:
        return f"{config.max_inflight_per_token} requests of this caller in flight"
    return None


@contextmanager
def inflight_slot(stats: IngestStats, source: str) -> Iterator[None]:
    """Hold one in-flight slot for ``source`` while the block runs (see :func:`busy`)."""
    stats.inflight += 1
    stats.inflight_by_caller[source] += 1
    try:
        yield
    finally:
        stats.inflight -= 1
        stats.inflight_by_caller[source] -= 1
        if not stats.inflight_by_caller[source]:
            del stats.inflight_by_caller[source]
