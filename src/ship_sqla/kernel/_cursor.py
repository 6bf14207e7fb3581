"""Keyset page cursors: pure encoding, signing and checking (no database).

A cursor is the position after the last row of a page: that row's ordering values, plus the
fingerprint of the query that produced it. It travels as one opaque url-safe string::

    base64url( version byte | HMAC-SHA256(secret, version | body) | body )
    body = compact JSON {"q": <query fingerprint hex>, "v": [[tag, value], ...]}

Values are tagged so they come back with their exact Python type (a ``Decimal`` stays a
``Decimal``, an aware ``datetime`` keeps its offset). The MAC covers everything, so a cursor
must never be accepted when any byte of it changed, and the fingerprint check refuses a genuine
cursor presented to a different query (another table, tenant, filter, ordering or projection).

Cursors are signed, not encrypted: the ordering values of the last row are readable by whoever
holds the cursor. Never order pages by a column the caller may not see.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
from datetime import date, datetime, time
from decimal import Decimal
from typing import TYPE_CHECKING, Any, TypeAlias
from uuid import UUID

import attrs

from ship_sqla.kernel._errors import ConfigurationError, InvalidCursorError

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

__all__ = [
    "PROCESS_SECRET",
    "CursorValue",
    "KeysetPosition",
    "decode_cursor",
    "encode_cursor",
    "query_fingerprint",
    "resolve_secret",
]

CursorValue: TypeAlias = (
    bool | int | float | str | bytes | Decimal | UUID | datetime | date | time | None
)

PROCESS_SECRET = secrets.token_bytes(32)
"""The default signing secret: random per process, so cursors die with the process that issued
them. Pass ``cursor_secret=`` to a repository to keep cursors valid across processes."""

MIN_SECRET_BYTES = 16
MAX_CURSOR_CHARS = 4096
"""Longer strings are refused before any decoding: a cursor is a few hundred characters."""

_VERSION = b"\x01"
_MAC_BYTES = hashlib.sha256().digest_size
_FINGERPRINT_HEX = 32  # 128 bits of the query's SHA-256: collisions are not a practical concern


@attrs.frozen
class KeysetPosition:
    """Where the next page starts: the query it belongs to and the last row's ordering values."""

    query: str
    """:func:`query_fingerprint` of the query the page came from."""
    values: tuple[CursorValue, ...]


def resolve_secret(secret: bytes | str | None) -> bytes:
    """The signing key for ``secret`` (``None``: the per-process :data:`PROCESS_SECRET`)."""
    if secret is None:
        return PROCESS_SECRET
    key = secret.encode() if isinstance(secret, str) else bytes(secret)
    if len(key) < MIN_SECRET_BYTES:
        raise ConfigurationError(
            f"cursor_secret is {len(key)} bytes; a signing key must be at least"
            f" {MIN_SECRET_BYTES} bytes.",
            fix="pass secrets.token_bytes(32), kept in your secret store and shared by every"
            " process that serves the same pages.",
        )
    return key


def query_fingerprint(parts: Sequence[str]) -> str:
    """A stable digest of a query's identifying parts (length-prefixed, so never ambiguous)."""
    digest = hashlib.sha256()
    for part in parts:
        raw = part.encode()
        digest.update(len(raw).to_bytes(8, "big"))
        digest.update(raw)
    return digest.hexdigest()[:_FINGERPRINT_HEX]


def encode_cursor(position: KeysetPosition, secret: bytes) -> str:
    """Serialise and sign ``position``; the result is url-safe and carries no padding."""
    body = json.dumps(
        {"q": position.query, "v": [_tag(v) for v in position.values]},
        separators=(",", ":"),
        ensure_ascii=True,
        allow_nan=False,
    ).encode("ascii")
    mac = hmac.new(secret, _VERSION + body, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(_VERSION + mac + body).rstrip(b"=").decode("ascii")


def decode_cursor(token: str, *, secret: bytes, query: str) -> tuple[CursorValue, ...]:
    """The ordering values in ``token``, which must have been issued for ``query``.

    Raises :class:`~ship_sqla.errors.InvalidCursorError` when the token is malformed, was
    signed with another secret or altered in any way, or belongs to another query.
    """
    raw = _unbase64(token)
    version, mac, body = raw[:1], raw[1 : 1 + _MAC_BYTES], raw[1 + _MAC_BYTES :]
    expected = hmac.new(secret, version + body, hashlib.sha256).digest()
    if version != _VERSION or not hmac.compare_digest(mac, expected):
        raise InvalidCursorError(
            "the page cursor's signature does not match: it was altered, truncated, or issued by"
            " a process with a different cursor_secret.",
            fix="pass next_cursor back exactly as it was returned; to use cursors across"
            " processes, give every process the same cursor_secret.",
        )
    try:
        payload = json.loads(body)
        issued_for, tagged = payload["q"], payload["v"]
        values = tuple(_untag(item) for item in tagged)
    except (ValueError, TypeError, KeyError) as exc:  # signed by us, so only a format change
        raise InvalidCursorError(
            "the page cursor is signed but its content cannot be read (format change?).",
            fix="restart paging from the first page (cursor=None).",
        ) from exc
    if not hmac.compare_digest(str(issued_for), query):
        raise InvalidCursorError(
            "the page cursor belongs to another query: it was issued for a different query"
            " (table, tenant, filter, ordering or projection); a cursor is valid only for the"
            " query that produced it.",
            fix="pass the cursor only to the same call with the same arguments, or restart"
            " paging from the first page (cursor=None).",
        )
    return values


def _unbase64(token: object) -> bytes:
    malformed = InvalidCursorError(
        "the page cursor is not a cursor this library issued (malformed encoding).",
        fix="pass next_cursor back exactly as it was returned, or None for the first page.",
    )
    if not isinstance(token, str) or not 0 < len(token) <= MAX_CURSOR_CHARS:
        raise malformed
    try:
        ascii_token = token.encode("ascii")
        raw = base64.urlsafe_b64decode(ascii_token + b"=" * (-len(ascii_token) % 4))
    except (UnicodeEncodeError, binascii.Error, ValueError):
        raise malformed from None
    # Base64 tolerates stray characters and non-zero padding bits: only the canonical form of
    # these bytes is accepted, so no character of a cursor can change without being refused.
    canonical = base64.urlsafe_b64encode(raw).rstrip(b"=")
    if canonical != ascii_token or len(raw) <= 1 + _MAC_BYTES:
        raise malformed
    return raw


def _b64(raw: bytes | bytearray | memoryview) -> str:
    return base64.urlsafe_b64encode(bytes(raw)).decode("ascii")


# Checked in order: bool before int (a bool is an int), datetime before date (likewise).
_TAGS: tuple[tuple[type | tuple[type, ...], str, Callable[[Any], object]], ...] = (
    (bool, "b", bool),
    (int, "i", str),
    (float, "f", float.hex),
    (str, "s", str),
    (Decimal, "dec", str),
    (UUID, "u", lambda value: value.hex),
    (datetime, "dt", datetime.isoformat),
    (date, "d", date.isoformat),
    (time, "t", time.isoformat),
    ((bytes, bytearray, memoryview), "by", _b64),
)

_UNTAG: dict[str, Callable[[Any], CursorValue]] = {
    "n": lambda _: None,
    "b": bool,
    "i": int,
    "f": float.fromhex,
    "s": str,
    "dec": Decimal,
    "u": UUID,
    "dt": datetime.fromisoformat,
    "d": date.fromisoformat,
    "t": time.fromisoformat,
    "by": lambda text: base64.urlsafe_b64decode(text.encode("ascii")),
}


def _tag(value: object) -> list[object]:
    if value is None:
        return ["n", None]
    for kind, tag, encode in _TAGS:
        if isinstance(value, kind):
            return [tag, encode(value)]
    raise ConfigurationError(
        f"an ordering value of type {type(value).__name__} cannot be carried in a page cursor.",
        fix="order pages by columns of type int, str, bool, float, Decimal, UUID, date, time,"
        " datetime or bytes (the key columns always qualify if they are of these types).",
    )


def _untag(item: object) -> CursorValue:
    if not isinstance(item, list) or len(item) != 2:  # noqa: PLR2004 - [tag, value]
        raise ValueError("cursor value is not a [tag, value] pair")
    tag, value = item
    value_of = _UNTAG.get(tag)
    if value_of is None:
        raise ValueError(f"unknown cursor value tag {tag!r}")
    return value_of(value)
