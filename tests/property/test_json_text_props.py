"""The shared JSON encoder (kernel/_json_text.py) and its NUL rule, against the standard library.

The encoder calls json's C encoder directly (built once) for speed; these properties pin it to
``json.dumps(separators=(",", ":"), allow_nan=False)`` on every JSON value, and the NUL rule to
"a NUL character somewhere in a key or string"."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ship_sqla.kernel._json_text import encode_compact_json, unstorable_json

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=20,
)


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, list):
        return any(_has_nul(v) for v in value)
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    return False


@given(json_values)
def test_the_encoder_writes_what_json_dumps_writes(value: Any) -> None:
    """Job payloads and outbox messages: the fast encoder's text is json.dumps' compact text."""
    assert encode_compact_json(value) == json.dumps(value, separators=(",", ":"), allow_nan=False)


@given(json_values)
def test_a_nul_is_found_exactly_when_the_value_holds_one(value: Any) -> None:
    """NUL refusal (jobs, outbox): found in any key or string at any depth, never invented by
    the literal text "\\u0000" or by escaped backslashes."""
    found = unstorable_json(value, encode_compact_json(value))
    assert (found is not None) is _has_nul(value)
    assert found is None or "NUL" in found.problem


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), {1j: 1}, object()])
def test_what_is_not_json_raises_as_json_does(bad: Any) -> None:
    with pytest.raises((TypeError, ValueError)):
        encode_compact_json([bad])


def test_a_circular_value_is_a_value_error() -> None:
    circular: list[Any] = []
    circular.append(circular)
    with pytest.raises(ValueError, match="Circular"):
        encode_compact_json(circular)
