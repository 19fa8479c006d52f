"""Administration over HTTP: ``POST /v1/admin/reload`` (admins only).

Reloads the tokens, the rules and the TLS certificate like SIGHUP does (the same
:class:`~.reload.Reloader`), audited with the admin as actor. 200 with what was reloaded; 400
when a part was kept because it did not load, with one line per problem under ``kept``
(rules skipped under ``skip_bad_rules`` are listed as ``skipped_rules`` and do not make it 400).
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from gpuwarden.collector.web.keys import ADMINS, CALLER, RELOADER, add_route

_LISTED_ONLY = frozenset({"skipped_rules"})


async def reload_config(request: web.Request) -> web.Response:
    """``POST /v1/admin/reload``."""
    report = await asyncio.to_thread(request.app[RELOADER].reload, request[CALLER].name)
    failed = set(report.kept) - _LISTED_ONLY
    return web.json_response(report.json(), status=400 if failed else 200)


def setup_admin(app: web.Application) -> None:
    """Add the administration routes."""
    add_route(app, "POST", "/v1/admin/reload", reload_config, ADMINS)
