"""The security headers of every dashboard response (S2; issue 25).

:class:`SecurityHeaders` wraps the whole dashboard application, outside Starlette's error
handling, so every response carries them: pages, problem pages (400, 403), redirects, the
static assets, Starlette's own 404 and 405 answers, and an unexpected 500.

- ``Content-Security-Policy``: nothing is allowed unless listed (``default-src 'none'``);
  styles, scripts and the live refresh's fetch from the dashboard's own origin only, plus the
  elements carrying this response's nonce (issue 36: a fresh random nonce per response, put in
  the ASGI scope as ``ship_csp_nonce`` for the page to stamp on its ``<script>`` and ``<link>``
  tags; an injected inline script has no nonce and does not run); forms post to the same origin
  only; no page may be framed (``frame-ancestors 'none'``), and no ``<base>`` element can
  re-point relative URLs.
- ``X-Content-Type-Options: nosniff``: the browser uses a response only as its declared type.
- ``Referrer-Policy: same-origin``: a dashboard URL (it holds job ids, tenant ids, run ids and
  cursors) is never sent to another origin; same-origin requests keep their ``Referer`` and,
  above all, their ``Origin`` header (``no-referrer`` would make a browser send
  ``Origin: null`` on the dashboard's own form posts, and an Origin-checking CSRF layer in front
  of the mounted dashboard would then refuse them).
- ``X-Frame-Options: DENY`` (``frame-ancestors`` for older browsers) and
  ``Cache-Control: no-store`` (pages hold operational data), except the static assets' own
  ``immutable`` (their names hold their content's hash: :mod:`._static`).
"""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, Final

from starlette.datastructures import MutableHeaders

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = [
    "CONTENT_SECURITY_POLICY",
    "NONCE_KEY",
    "SECURITY_HEADERS",
    "SecurityHeaders",
    "content_security_policy",
]

NONCE_KEY: Final = "ship_csp_nonce"
"""The ASGI scope key of the response's CSP nonce."""

CONTENT_SECURITY_POLICY: Final = (
    "default-src 'none'; script-src 'self' 'nonce-{nonce}'; style-src 'self' 'nonce-{nonce}';"
    " img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none';"
    " base-uri 'none'"
)
"""The policy, with ``{nonce}`` for the response's nonce (:func:`content_security_policy`)."""


def content_security_policy(nonce: str) -> str:
    return CONTENT_SECURITY_POLICY.format(nonce=nonce)


SECURITY_HEADERS: Final[tuple[tuple[str, str], ...]] = (
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "same-origin"),
    ("X-Frame-Options", "DENY"),
    ("Cache-Control", "no-store"),
)
"""Set on every HTTP response of the dashboard (replacing any value a handler gave), with the
response's ``Content-Security-Policy``."""


class SecurityHeaders:
    """ASGI middleware: :data:`SECURITY_HEADERS` on every ``http.response.start``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        nonce = secrets.token_urlsafe(18)
        scope[NONCE_KEY] = nonce

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                immutable = "immutable" in headers.get("cache-control", "")
                for name, value in SECURITY_HEADERS:
                    if name == "Cache-Control" and immutable:
                        continue
                    headers[name] = value
                headers["Content-Security-Policy"] = content_security_policy(nonce)
            await send(message)

        await self.app(scope, receive, send_with_headers)
