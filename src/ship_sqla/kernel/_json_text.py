"""JSON text as ship_sqla stores it in ``jsonb`` columns: one encoder, one NUL rule.

Every store that writes caller data into ``jsonb`` (job payloads, outbox messages) can encode it
here, so "what is storable" is decided once, before any SQL runs:

- compact (``","`` and ``":"``), ASCII only (non-ASCII characters escaped as ``\\uXXXX``), so
  the text's length in characters is its length in bytes: size limits are read off ``len``;
- no NaN or infinity: not JSON, and ``jsonb`` refuses them;
- no NUL character: ``\\u0000`` is valid JSON but ``jsonb`` cannot store it (PostgreSQL raises
  "unsupported Unicode escape sequence"), in keys or strings at any depth.
"""

from __future__ import annotations

import json
import json.encoder
import re
from typing import Any, Final

__all__ = ["encode_compact_json", "has_escaped_nul"]

_STANDARD: Final = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode


def _not_json(value: object) -> Any:  # noqa: ANN401 - the encoder's ``default`` hook
    msg = f"Object of type {type(value).__name__} is not JSON serializable"
    raise TypeError(msg)


def _c_encoder() -> Any:  # noqa: ANN401 - json's C encoder, or None
    """json's C encoder built ONCE, with no circular-reference markers.

    ``JSONEncoder.encode`` builds a new C encoder (and its markers dict) at every call, which
    is two thirds of the cost of encoding one small payload: a batch of 10,000 runs, each
    encoded on its own, shows it. A circular value then ends in ``RecursionError``, which
    :func:`encode_compact_json` reports as the ``ValueError`` json raises for one. None when the
    C accelerator is
    missing or does not answer like :data:`_STANDARD` (another Python): the standard encoder
    serves then.
    """
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return None
    # c_make_encoder's positional parameters, as json.JSONEncoder.iterencode passes them.
    markers, indent, sort_keys, skip_keys, allow_nan = None, None, False, False, False
    try:
        encoder = make(
            markers,
            _not_json,
            json.encoder.encode_basestring_ascii,
            indent,
            ":",
            ",",
            sort_keys,
            skip_keys,
            allow_nan,
        )
        sample: object = {"a": [1, 2.5, None, True, "é\x00"], "b": {}}
        if "".join(encoder(sample, 0)) != _STANDARD(sample):
            return None
    except Exception:  # noqa: BLE001 - any surprise means: use the standard encoder
        return None
    return encoder


_ENCODER: Final = _c_encoder()


def encode_compact_json(value: object) -> str:
    """``value`` as compact ASCII JSON text. Raises ``TypeError`` / ``ValueError`` for what is
    not JSON (objects, NaN, infinity; ``ValueError`` for circular or absurdly deep values), as
    json itself does."""
    if _ENCODER is None:
        return _STANDARD(value)
    try:
        return "".join(_ENCODER(value, 0))
    except RecursionError as exc:
        msg = "Circular reference detected, or nested deeper than the recursion limit"
        raise ValueError(msg) from exc


# \u0000 preceded by an even number of backslashes: an escaped NUL, not the literal text "\u0000"
# (which the encoder writes as "\\u0000").
_ESCAPED_NUL: Final = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def has_escaped_nul(encoded: str) -> bool:
    """Whether JSON text from :func:`encode_compact_json` holds a NUL character anywhere (a key
    or a string, at any depth). A substring test first: the regex runs only on a hit."""
    return "\\u0000" in encoded and _ESCAPED_NUL.search(encoded) is not None
