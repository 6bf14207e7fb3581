"""CSRF protection of the dashboard's forms (S2): a signed double-submit token.

Every visitor gets a random session id in an HttpOnly, SameSite=Strict cookie; each form
carries ``HMAC-SHA256(secret, session id)``. A state-changing request is accepted only when its
form's token is the signature of its own cookie's session id: a page on another origin can
neither read the cookie nor compute the signature without the dashboard's secret. Pure
functions: tested without a server.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import Final

__all__ = ["COOKIE", "FIELD", "form_token", "new_session_id", "token_matches"]

COOKIE: Final = "ship_dashboard_session"
FIELD: Final = "csrf_token"
_SESSION_BYTES: Final = 32
_MAX_SESSION_CHARS: Final = 128


def new_session_id() -> str:
    return secrets.token_urlsafe(_SESSION_BYTES)


def form_token(secret: bytes, session_id: str) -> str:
    """The token every form of ``session_id``'s pages carries."""
    return hmac.new(
        secret, b"ship-dashboard-csrf\x00" + session_id.encode(), hashlib.sha256
    ).hexdigest()


def token_matches(secret: bytes, session_id: str | None, token: str | None) -> bool:
    """Whether ``token`` was issued for ``session_id``; False when either is missing."""
    if not session_id or not token or len(session_id) > _MAX_SESSION_CHARS:
        return False
    # As bytes: compare_digest refuses a str with a non-ASCII character (a TypeError, so a 500
    # for a forged token; issue 32); any text is encodable with surrogatepass.
    expected = form_token(secret, session_id).encode("ascii")
    return hmac.compare_digest(expected, token.encode("utf-8", "surrogatepass"))
