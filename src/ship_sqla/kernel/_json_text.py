"""JSON text as ship_sqla stores it in ``jsonb`` columns: one encoder, one storability rule.

Every store that writes caller data into ``jsonb`` (job payloads, outbox messages, workflow
step results and events, webhook events) encodes or checks it here, so "what is storable" is
decided once, before any SQL runs:

- compact (``","`` and ``":"``), ASCII only (non-ASCII characters escaped as ``\\uXXXX``), so
  the text's length in characters is its length in bytes: size limits are read off ``len``;
- no NaN or infinity: not JSON, and ``jsonb`` refuses them;
- every string, key or value at any depth, must be text PostgreSQL can hold
  (:func:`unstorable_json`, :func:`unstorable_text`):

  - no NUL character: ``\\u0000`` is valid JSON but ``jsonb`` cannot store it (PostgreSQL
    raises "unsupported Unicode escape sequence");
  - no surrogate code point (``"\\ud800"``, issue 25 D6): not valid Unicode, it has no UTF-8
    encoding; the encoder writes it as the escape ``\\ud800``, which PostgreSQL refuses
    ("invalid input syntax for type json"), and a pair of them would be stored as another
    character. Such strings come from bytes decoded with ``errors="surrogateescape"`` (file
    names, ``sys.argv``) or from JSON text holding a lone ``\\udXXX`` escape.

  A refusal names the path of the bad string (``payload['items'][3]['name']``), so the caller
  can find it in a large value.
"""

from __future__ import annotations

import json
import json.encoder
import re
from typing import Any, Final

import attrs

__all__ = [
    "Unstorable",
    "encode_compact_json",
    "storable_text",
    "unstorable_json",
    "unstorable_text",
]

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


_SURROGATE: Final = re.compile("[\ud800-\udfff]")

_NUL_FIX: Final = "strip NUL characters, or base64-encode binary data before storing it."
_SURROGATE_FIX: Final = (
    "pass valid Unicode text: decode bytes with errors='replace' (not 'surrogateescape'),"
    " or base64-encode binary data before storing it."
)


@attrs.frozen
class Unstorable:
    """Why a string cannot be stored, and where it is: what an error message says."""

    problem: str
    """What the string holds, e.g. "a NUL character (\\u0000)"."""
    where: str
    """Its path: ``payload['a'][0]``, or ``the key 'b' of payload['a']``."""
    fix: str
    """How to fix it (the ``fix=`` of the caller's error)."""

    def __str__(self) -> str:
        return f"{self.problem} at {self.where}"


def _unstorable(value: str) -> tuple[str, str] | None:
    """What ``value`` holds that PostgreSQL cannot store, and the fix; None when storable."""
    if "\x00" in value:
        return "a NUL character (\\u0000)", _NUL_FIX
    if value.isascii():  # a flag in CPython: no scan for the usual text
        return None
    found = _SURROGATE.search(value)
    if found is None:
        return None
    code_point = ord(found.group())
    return (
        f"a surrogate code point (U+{code_point:04X}, not valid Unicode: no UTF-8)",
        _SURROGATE_FIX,
    )


def storable_text(value: str) -> str:
    """``value`` as text PostgreSQL can store, for what the library writes down itself (a run's
    history entry, whose text comes from an exception): a NUL character becomes ``\\x00`` and a
    lone surrogate its ``\\udXXX`` escape, so the entry says what was there and never makes
    its row unstorable (J23). ``value`` itself when it is storable (the usual case: no copy)."""
    if _unstorable(value) is None:
        return value
    escaped = value.replace("\x00", "\\x00")
    return escaped.encode("utf-8", "backslashreplace").decode("utf-8")


def unstorable_text(value: str) -> str | None:
    """What ``value`` holds that PostgreSQL cannot store in ``text`` or a ``jsonb`` string (a
    NUL character, a surrogate code point), else None."""
    found = _unstorable(value)
    return None if found is None else found[0]


def unstorable_json(value: object, encoded: str, *, root: str = "payload") -> Unstorable | None:
    """The first string of ``value`` (a key or a value, at any depth; depth first, in order)
    that PostgreSQL's ``jsonb`` cannot store (:func:`unstorable_text`), or None.

    ``encoded`` is ``value``'s text from :func:`encode_compact_json`: the encoder escapes both
    NUL and every non-BMP or surrogate character, so a text holding neither ``\\u0000`` nor
    ``\\ud`` is storable as it is and ``value`` is not walked (the usual case: two substring
    tests). ``root`` names ``value`` in the path."""
    if "\\u0000" not in encoded and "\\ud" not in encoded:
        return None
    # Iterative, so a value as deep as the encoder accepted never exhausts the stack here.
    stack: list[tuple[object, str]] = [(value, root)]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            found = _unstorable(item)
            if found is not None:
                return Unstorable(found[0], path, found[1])
        elif isinstance(item, dict):
            children: list[tuple[object, str]] = []
            for key, child in item.items():
                found = _unstorable(key) if isinstance(key, str) else None
                if found is not None:
                    return Unstorable(found[0], f"the key {key!r} of {path}", found[1])
                children.append((child, f"{path}[{key!r}]"))
            stack.extend(reversed(children))
        elif isinstance(item, (list, tuple)):
            stack.extend(reversed([(child, f"{path}[{i}]") for i, child in enumerate(item)]))
    return None
