"""``GET /static/gpuwarden.css``: the pages' one stylesheet.

The Content-Security-Policy (:mod:`~.headers`) refuses inline styles, so the status, incident,
runbook and approval pages link this file instead of carrying a ``<style>`` block. It is read
once, when the app is built, from the package (it ships in the wheel next to the templates).
"""

from __future__ import annotations

from importlib import resources

from aiohttp import web

from gpuwarden.collector.web.keys import Admits, add_route

STYLESHEET_PATH = "/static/gpuwarden.css"
_ANYONE = Admits(open_because="the pages' stylesheet: the same for everyone, no data in it")
_CACHE_SECONDS = 300


def setup_static(app: web.Application) -> None:
    """Add ``GET /static/gpuwarden.css`` (open: it is the same for everyone)."""
    css = resources.files("gpuwarden.collector.web").joinpath("static/gpuwarden.css").read_bytes()

    async def stylesheet(request: web.Request) -> web.Response:
        del request
        return web.Response(
            body=css,
            content_type="text/css",
            charset="utf-8",
            headers={"Cache-Control": f"public, max-age={_CACHE_SECONDS}"},
        )

    add_route(app, "GET", STYLESHEET_PATH, stylesheet, _ANYONE)
