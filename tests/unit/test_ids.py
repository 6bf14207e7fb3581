"""Ids (ship_sqla.kernel._ids): canonical version 7 UUID text, strictly increasing; the outbox's
uuid.UUID ids from the same generator, so (created_at, id) keeps enqueue order."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from ship_sqla.kernel import _ids
from ship_sqla.kernel._ids import new_run_ids, new_uuids


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
    # Pinned to the last id's millisecond: if the clock ticked between the calls, the counter
    # would restart instead of overflowing (what this test is about).
    monkeypatch.setattr(_ids, "_last_ms", _ids._last_ms + 60_000)
    monkeypatch.setattr(_ids, "_counter", _ids._COUNTER_MAX - 2)
    later = new_run_ids(5)
    _check(first + later)
    stamps = [uuid.UUID(text).int >> 80 for text in later]
    assert stamps[-1] == stamps[0] + 1


@pytest.mark.parametrize("start", [(1 << 16) - 3, (1 << 30) - 3, (5 << 30) + (1 << 16) - 2])
def test_ids_carry_the_counter_across_its_formatting_blocks(
    monkeypatch: pytest.MonkeyPatch, start: int
) -> None:
    """The version's and variant's groups are formatted once per 65,536 ids: across a block's
    edge (and the 30-bit edge into the version's group) every id still carries its counter, in
    the RFC 9562 method 1 layout (12 bits after the version, 30 after the variant)."""
    new_run_ids(1)
    monkeypatch.setattr(_ids, "_last_ms", _ids._last_ms + 60_000)
    monkeypatch.setattr(_ids, "_counter", start - 1)
    ids = new_run_ids(6)
    _check(ids)
    for offset, text in enumerate(ids):
        value = uuid.UUID(text).int
        counter = ((value >> 64) & 0xFFF) << 30 | (value >> 32) & 0x3FFF_FFFF
        assert counter == start + offset


def test_uuids_are_version_7_and_strictly_increasing() -> None:
    ids = [one for _ in range(100) for one in new_uuids(100)]
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
    assert all(i.version == 7 and i.variant == uuid.RFC_4122 for i in ids)


def test_ids_stay_unique_and_ordered_per_thread_under_concurrency() -> None:
    def batch(_: int) -> list[uuid.UUID]:
        return [one for _ in range(200) for one in new_uuids(10)]

    with ThreadPoolExecutor(4) as pool:
        batches = list(pool.map(batch, range(4)))
    assert all(b == sorted(b) for b in batches)
    assert len({i for b in batches for i in b}) == 8_000
