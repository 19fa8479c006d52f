"""Security headers on every response the collector sends, set in one place.

:func:`security_headers` is an ``on_response_prepare`` hook, so it sees every response, the
routes' own, the authentication middleware's refusals and aiohttp's ``HTTPException`` pages
alike, and a new route cannot forget them. What each header does for us:

* ``Content-Security-Policy``: ``default-src 'none'`` (nothing loads unless listed: no script
  at all, inline or not, not even from our own origin), styles only from the served stylesheet
  (``style-src 'self'``, no inline ``<style>`` or ``style=``), images only from ourselves,
  forms post only back to us, no ``<base>`` rewriting, and no framing. The pages are
  server-rendered and need none of what is refused, so an injected ``<script>`` or ``onerror``
  cannot run even if some escaping were ever missed.
* ``X-Frame-Options: DENY``: ``frame-ancestors 'none'`` for browsers without CSP level 2
  (clickjacking of the approval button).
* ``X-Content-Type-Options: nosniff``: a JSON or Markdown answer is never run as script or
  rendered as HTML.
* ``Referrer-Policy: no-referrer``: approval links carry signed bearer tokens in their path; a
  link followed from such a page must not send it to the next site. A page that posts a form
  to itself (sign-in, approval) sets ``same-origin`` instead, which still sends nothing to
  another site: under ``no-referrer`` Chromium sends ``Origin: null`` with the POST, which the
  Origin check must refuse.
* ``Cache-Control: no-store`` on HTML: incident, runbook and approval pages show live state
  and tokens; no shared or browser cache keeps them. Other answers keep their own
  ``Cache-Control`` (the stylesheet may be cached).
"""

from __future__ import annotations

from aiohttp import web

CONTENT_SECURITY_POLICY = "; ".join(
    (
        "default-src 'none'",
        "style-src 'self'",
        "img-src 'self'",
        "form-action 'self'",
        "base-uri 'none'",
        "frame-ancestors 'none'",
    )
)
"""The one policy of every page (see the module docstring for why each directive)."""

ALWAYS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
}
"""Set on every response, replacing whatever a handler set: one policy, not one per route."""
REFERRER_POLICIES = frozenset({"no-referrer", "same-origin"})
"""What a handler may set ``Referrer-Policy`` to; anything else becomes ``no-referrer``."""


async def security_headers(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare`` hook: add :data:`ALWAYS`, and ``no-store`` to HTML."""
    del request  # the signal's signature; the headers do not depend on the request
    response.headers.update(ALWAYS)
    if response.headers.get("Referrer-Policy") not in REFERRER_POLICIES:
        response.headers["Referrer-Policy"] = "no-referrer"
    if response.content_type == "text/html":
        response.headers["Cache-Control"] = "no-store"
