"""Run ids (ship_sqla._jobs._ids): canonical version 7 UUID text, strictly increasing."""

from __future__ import annotations

import uuid

import pytest

from ship_sqla._jobs import _ids
from ship_sqla._jobs._ids import new_run_ids


def _check(ids: list[str]) -> None:
    for text in ids:
        parsed = uuid.UUID(text)
        assert str(parsed) == text  # canonical lower-case 8-4-4-4-12
        assert parsed.version == 7
        assert parsed.variant == uuid.RFC_4122
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)


def test_ids_are_canonical_text() -> None:
    """Formatted group by group, each id is the text uuid.UUID would print."""
    _check(new_run_ids(300) + new_run_ids(0) + new_run_ids(1))


def test_ids_keep_increasing_when_the_counter_overflows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the 42-bit counter the id moves to the next millisecond and keeps sorting."""
    first = new_run_ids(1)
    monkeypatch.setattr(_ids, "_counter", _ids._COUNTER_MAX - 2)
    later = new_run_ids(5)
    _check(first + later)
    stamps = [uuid.UUID(text).int >> 80 for text in later]
    assert stamps[-1] == stamps[0] + 1
