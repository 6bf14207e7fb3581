"""Message ids increase in generation order, so (created_at, id) keeps enqueue order."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor

from hypothesis import given
from hypothesis import strategies as st

from ship_sqla._outbox._ids import new_message_id, uuid7_from_parts

millis = st.integers(min_value=0, max_value=(1 << 48) - 1)
counters = st.integers(min_value=0, max_value=(1 << 42) - 1)
tails = st.integers(min_value=0, max_value=(1 << 32) - 1)


def test_ids_are_version_7_and_strictly_increasing():
    ids = [new_message_id() for _ in range(10_000)]
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
    assert all(i.version == 7 and i.variant == uuid.RFC_4122 for i in ids)


def test_ids_stay_unique_and_ordered_per_thread_under_concurrency():
    def batch(_: int) -> list[uuid.UUID]:
        return [new_message_id() for _ in range(2_000)]

    with ThreadPoolExecutor(4) as pool:
        batches = list(pool.map(batch, range(4)))
    assert all(b == sorted(b) for b in batches)
    assert len({i for b in batches for i in b}) == 8_000


parts = st.tuples(millis, counters, tails)


@given(parts, parts)
def test_parts_order_is_id_order(first, second):
    """(milliseconds, counter) order decides id order; the random tail only breaks ties."""
    a, b = uuid7_from_parts(*first), uuid7_from_parts(*second)
    if first[:2] < second[:2]:
        assert a < b
    assert a.version == 7
    assert a.variant == uuid.RFC_4122
