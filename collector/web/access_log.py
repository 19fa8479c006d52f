"""The access log, with secrets redacted.

aiohttp's default access log writes the request line as sent, so an approval link
(``/approve/<signed token>``) put its whole token in the INFO log, where anyone who reads the logs
could approve with it. :class:`RedactingAccessLogger` writes what an operator needs (client,
method, path, status, size, time, user agent) with secrets replaced by ``<redacted>``: route
parameters named like secrets, any other path segment long enough to be a token, every query
value, and the same in the ``Referer``. No request header but the user agent and the referer
is ever written (so never ``Authorization`` nor ``Cookie``).
"""

from __future__ import annotations

import logging
import re

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from aiohttp.http import HttpProcessingError

REDACTED = "<redacted>"
SECRET_PARAMETERS = frozenset({"token", "secret", "key", "session"})
"""Route parameters (``{token}``) whose value is always redacted."""
_LONG_SEGMENT = re.compile(r"[^/?#]{32,}")
"""A path segment this long is an id or a token: ours (incident ids, rule names) are shorter."""
_QUERY_VALUE = re.compile(r"=[^&#]*")


def redact_target(target: str, secrets: tuple[str, ...] = ()) -> str:
    """A request target (path and query) with ``secrets``, long segments and query values out."""
    path, sep, query = target.partition("?")
    for secret in secrets:
        if secret:
            path = path.replace(secret, REDACTED)
    path = _LONG_SEGMENT.sub(REDACTED, path)
    if sep:
        query = _QUERY_VALUE.sub("=" + REDACTED, query)
    return path + sep + query


def _printable(text: str) -> str:
    """Control characters and bad bytes as escapes: one request, one log line."""
    return text.encode("ascii", "backslashreplace").decode("ascii").replace('"', '\\"')


def _route_parameters(request: web.BaseRequest) -> list[tuple[str, str]]:
    """The request's route parameters; none for a request that never reached routing (one the
    HTTP parser refused), whose ``match_info`` aiohttp asserts is there."""
    try:
        match = request.match_info if isinstance(request, web.Request) else None
    except AssertionError:
        return []
    return list(match.items()) if match is not None else []


class RedactingAccessLogger(AbstractAccessLogger):
    """``client "METHOD target HTTP/x.y" status bytes seconds "referer" "user-agent"``, redacted."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        """Write one line at INFO for a finished request."""
        secrets = tuple(
            value for name, value in _route_parameters(request) if name in SECRET_PARAMETERS
        )
        target = _printable(redact_target(request.raw_path, secrets))
        referer = request.headers.get("Referer")
        referer_shown = _printable(redact_target(referer, secrets)) if referer else "-"
        agent = _printable(request.headers.get("User-Agent", "-"))
        version = f"{request.version.major}.{request.version.minor}"
        self.logger.info(
            '%s "%s %s HTTP/%s" %d %s %.6f "%s" "%s"',
            request.remote or "-",
            _printable(request.method),
            target,
            version,
            response.status,
            response.body_length,
            time,
            referer_shown,
            agent,
        )


class _ClientErrors(logging.Filter):
    """A parser's refusal of a request (a 4xx) as one INFO line, without the traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError) and 400 <= exc.code < 500:
            record.msg = f"{record.msg}: %s"
            reason = " ".join(str(exc.message).split())[:200]
            record.args = (*(record.args or ()), _printable(reason))
            record.exc_info = None
            record.exc_text = None
            if record.levelno > logging.INFO:
                record.levelno, record.levelname = logging.INFO, "INFO"
        return True


def server_logger() -> logging.Logger:
    """``gpuwarden.collector.web.server``, for aiohttp's ``logger``: client errors quietened."""
    logger = logging.getLogger("gpuwarden.collector.web.server")
    if not any(isinstance(f, _ClientErrors) for f in logger.filters):
        logger.addFilter(_ClientErrors())
    return logger
