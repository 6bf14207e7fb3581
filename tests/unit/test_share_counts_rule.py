"""F2, F8/F9 (issue 35 item 4): how a fair or partitioned claim counts each visited partition's
due runs before it shares the room (kernel ``counted_for_shares``): about the room plus two
entries a partition, with the shares those of the whole counts."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ship_sqla.kernel._plans.fairness import counted_for_shares, fair_shares

_partition = st.tuples(
    st.integers(0, 80),  # due runs
    st.one_of(st.just(0), st.integers(1, 60), st.just(60)),  # what its limits allow
)


def _reads(due: list[tuple[int, int, int]], room: int) -> tuple[int, int]:
    """Entries the two counts read, the untenanted runs aside: the first counts, up to each
    ``top``, and the second, up to ``top`` plus the room left, only for the full ones."""
    counted = counted_for_shares(due, room)
    sharing = [weight for _, allowed, weight in due if allowed > 0]
    top = -(-room // len(sharing)) + 1 if len(set(sharing)) == 1 else None
    first = sum(min(count, top if top is not None else count) for count, _, _ in due)
    again = sum(
        counted_k
        for (count, _, _), counted_k in zip(due, counted, strict=True)
        if top is not None and min(count, top) == top and room > first
    )
    return first, again


@settings(max_examples=500, deadline=None)
@given(
    partitions=st.lists(_partition, min_size=1, max_size=12),
    room=st.integers(0, 60),
    weights=st.one_of(st.just([1]), st.just([3]), st.just([1, 2, 7])),
    data=st.data(),
)
def test_f2_f8_shares_of_the_counts_are_those_of_the_whole_counts(
    partitions: list[tuple[int, int]], room: int, weights: list[int], data: st.DataObject
) -> None:
    """F2, F8/F9: over any partitions, the shares of the counted due runs take
    min(room, every due run the limits allow) (work-conserving), never more than a partition
    may take, and each within one of its share of the whole counts (ties broken otherwise);
    with one weight, the first counts read at most the room plus two entries a partition, and
    the second count runs only when they fall short of the room."""
    due = [
        (min(count, allowed), allowed, data.draw(st.sampled_from(weights)))
        for count, allowed in partitions
    ]
    counted = counted_for_shares(due, room)
    weight = [w for _, _, w in due]
    shares = fair_shares(list(zip(counted, weight, strict=True)), room)
    whole = fair_shares([(count, w) for count, _, w in due], room)
    assert sum(shares) == min(room, sum(count for count, _, _ in due))
    assert all(share <= count for share, (count, _, _) in zip(shares, due, strict=True))
    assert all(abs(a - b) <= 1 for a, b in zip(shares, whole, strict=True)), (shares, whole)
    if len(set(weights)) == 1:
        first, again = _reads(due, room)
        assert first <= room + 2 * len(due)
        if first >= room:
            assert again == 0


def test_f8_the_counts_by_example() -> None:
    """F2, F8/F9: 20 over four partitions (1, 1, 20 and 20 due): first counts 1, 1, 6, 6 (an
    equal share, 5, plus one), 6 short of the room, so the two full ones count up to 12;
    8 over eight partitions of 30: 2 each (no second count); with differing weights every
    partition counts whole."""
    assert counted_for_shares([(1, 20, 1), (1, 20, 1), (20, 20, 1), (20, 20, 1)], 20) == [
        1,
        1,
        12,
        12,
    ]
    assert counted_for_shares([(30, 30, 1)] * 8, 8) == [2] * 8
    assert counted_for_shares([(30, 30, 1), (30, 30, 2)], 8) == [30, 30]
    assert counted_for_shares([(0, 0, 1), (9, 9, 5)], 4) == [0, 5]
