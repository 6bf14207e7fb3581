"""Caller-given keys and ids (run ids, dedupe keys): checked text, before any SQL runs.

A key ship_sqla stores in an indexed text column must be non-empty text without NUL characters
and at most :data:`MAX_KEY_CHARS` characters. The bound keeps every index entry far below
PostgreSQL's btree limit (about 2,700 bytes: "index row requires N bytes" otherwise): 255
characters are at most 1,020 bytes of UTF-8, beside a 128-character job id. A NUL cannot be
stored in ``text`` at all ("invalid byte sequence for encoding UTF8: 0x00"), nor can a surrogate
code point (``"\\ud800"``: not valid Unicode, no UTF-8 encoding; the driver would fail to
encode it; issue 25 D6).
"""

from __future__ import annotations

import reprlib
from typing import Final

from ship_sqla.kernel._errors import UsageError
from ship_sqla.kernel._json_text import unstorable_text

__all__ = ["MAX_KEY_CHARS", "InvalidKeyError", "require_key", "require_text"]

MAX_KEY_CHARS: Final = 255
"""The longest run id or dedupe key, in characters."""


class InvalidKeyError(UsageError, ValueError):
    """A caller-given key or id is not storable: not text, empty, holding a NUL character or a
    surrogate code point, or longer than its bound. The message names the field and the bound;
    nothing was written."""

    code = "SHIP_SQLA_KEY_INVALID"


def require_text(value: object, field: str, *, max_chars: int | None) -> str:
    """``value`` when it is text PostgreSQL can store (no NUL character, no surrogate code
    point) and, with ``max_chars``, at most that long; else :class:`InvalidKeyError` naming
    ``field``. Empty text passes (see :func:`require_key` for keys, which must not be
    empty)."""
    if not isinstance(value, str):
        raise InvalidKeyError(
            f"{field} must be text, got {type(value).__name__} {reprlib.repr(value)}.",
            fix=f"pass {field} as a str.",
        )
    if max_chars is not None and len(value) > max_chars:
        raise InvalidKeyError(
            f"{field} must be at most {max_chars} characters, got {len(value)}"
            f" ({reprlib.repr(value)}).",
            fix=f"use a shorter {field}, e.g. a hash (sha256 hex is 64 characters) of the long"
            " value.",
        )
    if "\x00" in value:
        raise InvalidKeyError(
            f"{field} contains a NUL character (\\x00), which PostgreSQL text cannot store:"
            f" {reprlib.repr(value)}.",
            fix=f"strip NUL characters from {field}.",
        )
    if not value.isascii() and (problem := unstorable_text(value)) is not None:
        raise InvalidKeyError(
            f"{field} holds {problem}, which PostgreSQL text cannot store: {reprlib.repr(value)}.",
            fix=f"pass {field} as valid Unicode text (decode bytes with errors='replace', not"
            " 'surrogateescape').",
        )
    return value


def require_key(value: object, field: str, *, max_chars: int = MAX_KEY_CHARS) -> str:
    """``value`` when it is a storable key: non-empty text, no NUL, at most ``max_chars``
    characters; else :class:`InvalidKeyError` naming ``field`` and the bound."""
    key = require_text(value, field, max_chars=max_chars)
    if not key:
        raise InvalidKeyError(
            f"{field} must not be empty.",
            fix=f"pass a non-empty {field} (1 to {max_chars} characters), or None for none.",
        )
    return key
