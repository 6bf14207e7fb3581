"""#36: the history's rows merge by addition, so the order of flushes does not matter. Any set
of finishes, split among any number of processes, each flushing any number of times, in any
interleaving, stores exactly what one fold of all of them holds (counters and histograms, per
job and minute): S2's "a total shown is exact from a rollup"."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from ship_sqla.kernel._memory.stats import InMemoryJobStats
from ship_sqla.kernel._stats import StatsFold, StatsRow, merge_histograms, sum_histograms

START = datetime(2030, 1, 1, tzinfo=UTC)

finishes = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c"]),  # job
        st.integers(min_value=0, max_value=300),  # seconds after START (five minutes)
        st.sampled_from(["completed", "retried", "dead", "cancelled"]),
        st.one_of(st.none(), st.floats(min_value=0, max_value=50_000)),  # run time
        st.one_of(st.none(), st.floats(min_value=0, max_value=50_000)),  # queue wait
        st.integers(min_value=0, max_value=3),  # the process that saw it
        st.booleans(),  # whether that process flushes right after it
    ),
    max_size=120,
)


def _fold(items: list[tuple[object, ...]]) -> list[StatsRow]:
    fold = StatsFold()
    for job, second, outcome, run, wait, *_ in items:
        fold.record(job, START + timedelta(seconds=second), outcome, run, wait)  # type: ignore[arg-type, operator]
    return fold.take()


@settings(max_examples=100, deadline=None)
@given(finishes, st.randoms(use_true_random=False))
def test_merging_flushes_in_any_order_equals_one_fold(
    items: list[tuple[object, ...]], rnd: object
) -> None:
    """S2: per-process folds, flushed at arbitrary points and applied to the store in a
    shuffled order, add up to the single fold of every finish."""
    processes = [StatsFold() for _ in range(4)]
    flushes: list[list[StatsRow]] = []
    for job, second, outcome, run, wait, process, flush in items:
        fold = processes[process]  # type: ignore[index]
        fold.record(job, START + timedelta(seconds=second), outcome, run, wait)  # type: ignore[arg-type, operator]
        if flush:
            flushes.append(fold.take())
    flushes.extend(fold.take() for fold in processes)
    rnd.shuffle(flushes)  # type: ignore[attr-defined]
    store = InMemoryJobStats()

    async def apply() -> list[StatsRow]:
        for rows in flushes:
            await store.add_stats(rows)
        read: list[StatsRow] = []
        for job in ("a", "b", "c"):
            read += await store.read_stats(job, START, START + timedelta(hours=1))
        return read

    assert asyncio.run(apply()) == _fold(items)


@given(
    st.lists(st.lists(st.integers(min_value=0, max_value=9), max_size=12), max_size=6),
    st.randoms(use_true_random=False),
)
def test_histogram_merge_is_commutative_and_associative(
    histograms: list[list[int]], rnd: object
) -> None:
    """Adding histograms in any order and grouping gives one result (trailing zeros trimmed)."""
    forward: tuple[int, ...] = ()
    for h in histograms:
        forward = merge_histograms(forward, h)
    shuffled = list(histograms)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    backward: tuple[int, ...] = ()
    for h in reversed(shuffled):
        backward = merge_histograms(h, backward)
    assert forward == backward
    assert sum(forward) == sum(sum(h) for h in histograms)


@given(st.lists(st.lists(st.integers(min_value=0, max_value=9), max_size=12), max_size=8))
def test_summing_histograms_at_once_equals_merging_them_one_by_one(
    histograms: list[list[int]],
) -> None:
    """S2 ("a total shown is exact from a rollup"): a chart bucket's histogram summed a column
    at a time (``sum_histograms``, the 7-day chart's 10,080 minutes in one pass) is the fold of
    ``merge_histograms`` over the same minutes, trailing zeros trimmed."""
    folded: tuple[int, ...] = ()
    for h in histograms:
        folded = merge_histograms(folded, h)
    assert sum_histograms(histograms) == folded
