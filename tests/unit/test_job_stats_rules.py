"""#36's history maths (``kernel/_stats.py``), no database: the histograms' fixed log buckets,
their merge by addition and percentiles, the clock-aligned chart buckets, the fold a worker
keeps between flushes, and the series built from stored minute rows (S2: a total shown is
exact, from this rollup)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from ship_sqla.errors import UsageError
from ship_sqla.kernel._stats import (
    HISTOGRAM_BUCKETS,
    HISTOGRAM_GROWTH,
    StatsFold,
    StatsRow,
    bucket_index,
    bucket_value,
    merge_histograms,
    minute_of,
    percentile,
    range_buckets,
    series_from_rows,
    stats_outcome,
)

T0 = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


def test_bucket_index_is_logarithmic_and_bounded() -> None:
    """Bucket 0 holds sub-millisecond (and negative) durations; each later bucket is 2^(1/4)
    wider than the one before; the last holds everything past about 8.5 hours."""
    assert bucket_index(0.0) == 0
    assert bucket_index(-1.0) == 0
    assert bucket_index(float("nan")) == 0
    assert bucket_index(0.001) == 1
    assert bucket_index(0.002) == 5  # 2 ms = G^4: the bucket starting there
    assert bucket_index(10**9) == HISTOGRAM_BUCKETS - 1
    indexes = [bucket_index(0.001 * 1.05**k) for k in range(400)]
    assert indexes == sorted(indexes)


@pytest.mark.parametrize("seconds", [0.0011, 0.0042, 0.05, 0.73, 1.0, 12.5, 300.0, 7200.0])
def test_bucket_value_is_within_the_stated_error(seconds: float) -> None:
    """A bucket stands for its geometric middle: within a factor sqrt(G) (about 9 %) of any value in
    it."""
    value = bucket_value(bucket_index(seconds))
    assert 1 / HISTOGRAM_GROWTH**0.5 <= value / seconds <= HISTOGRAM_GROWTH**0.5


def test_merge_adds_elementwise_and_trims() -> None:
    assert merge_histograms((1, 2), (0, 1, 3)) == (1, 3, 3)
    assert merge_histograms((), ()) == ()
    assert merge_histograms((0, 0), (0,)) == ()
    assert merge_histograms((1, 0, 0), ()) == (1,)


def test_percentiles_are_nearest_rank_over_buckets() -> None:
    """p50/p95/p99 by nearest rank: 90 fast runs and 10 slow ones give a fast median and a
    slow p95; an empty histogram has none."""
    fold = StatsFold()
    for _ in range(90):
        fold.record("j", T0, "completed", 0.010)
    for _ in range(10):
        fold.record("j", T0, "completed", 2.0)
    (row,) = fold.take()
    assert percentile(row.run_hist, 0.5) == pytest.approx(0.010, rel=0.1)
    assert percentile(row.run_hist, 0.90) == pytest.approx(0.010, rel=0.1)
    assert percentile(row.run_hist, 0.95) == pytest.approx(2.0, rel=0.1)
    assert percentile(row.run_hist, 0.99) == pytest.approx(2.0, rel=0.1)
    assert percentile((), 0.5) is None


def test_only_finishes_are_counted() -> None:
    """The four counted outcomes; snoozes, suspensions, parking, held locks, stale settles and
    duplicates are not finishes."""
    assert stats_outcome("completed") == "completed"
    assert stats_outcome("retrying") == "retried"
    assert stats_outcome("dead") == "dead"
    assert stats_outcome("cancelled") == "cancelled"
    for other in ("snoozed", "suspended", "parked", "lock_held", "stale", "duplicate"):
        assert stats_outcome(other) is None


def test_fold_groups_by_job_and_minute_and_empties_on_take() -> None:
    fold = StatsFold()
    fold.record("a", T0 + timedelta(seconds=5), "completed", 0.1, 0.5)
    fold.record("a", T0 + timedelta(seconds=59), "retried", 0.2)
    fold.record("a", T0 + timedelta(seconds=60), "dead", 0.3)
    fold.record("b", T0, "cancelled")
    rows = fold.take()
    assert len(fold) == 0
    assert [(r.job_id, r.minute) for r in rows] == [
        ("a", T0),
        ("a", T0 + timedelta(minutes=1)),
        ("b", T0),
    ]
    first = rows[0]
    assert (first.completed, first.retried, first.dead, first.cancelled) == (1, 1, 0, 0)
    assert sum(first.run_hist) == 2
    assert sum(first.wait_hist) == 1
    assert rows[2].run_hist == ()
    fold.add_rows(rows)
    assert fold.take() == rows


def test_minutes_are_utc_and_clock_aligned() -> None:
    local = datetime(2026, 12, 6, 13, 0, 42, 5, tzinfo=timezone(timedelta(hours=1)))
    assert minute_of(local) == datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("name", "count", "step"),
    [
        ("1h", 60, timedelta(minutes=1)),
        ("6h", 72, timedelta(minutes=5)),
        ("24h", 96, timedelta(minutes=15)),
        ("7d", 84, timedelta(hours=2)),
    ],
)
def test_range_buckets_are_aligned_to_the_clock(name: str, count: int, step: timedelta) -> None:
    """The buckets do not move with the request time: two reads within one step give the same
    bounds, each a multiple of the step since the epoch; the last bucket holds now."""
    now = datetime(2026, 12, 6, 12, 7, 31, tzinfo=UTC)
    start, end, got_step = range_buckets(name, now)
    assert got_step == step
    assert (end - start) // step == count
    assert start <= now < end
    assert end - step <= now
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    assert (start - epoch) % step == timedelta(0)
    later = now + (end - now) - timedelta(microseconds=1)
    assert range_buckets(name, later) == (start, end, step)


def test_unknown_range_is_refused() -> None:
    with pytest.raises(UsageError, match="unknown history range '2h'"):
        range_buckets("2h", T0)


def test_series_merges_minutes_into_buckets_with_exact_totals() -> None:
    """S2: a series' totals are exact sums of the stored minutes in the range (none outside
    it); each bucket merges its minutes' histograms; the backlog is the bucket's last sample;
    the failure rate is failed attempts over finished ones."""
    now = datetime(2026, 12, 6, 12, 7, 31, tzinfo=UTC)
    start, _end, _step = range_buckets("6h", now)
    rows = [
        StatsRow("j", start - timedelta(minutes=1), completed=1000),  # before the range
        StatsRow("j", start, completed=3, run_hist=(0, 2, 1)),
        StatsRow("j", start + timedelta(minutes=4), retried=1, run_hist=(0, 0, 0, 1)),
        StatsRow("j", start + timedelta(minutes=4), waiting=7, oldest_due_age=2.5),
        StatsRow("j", start + timedelta(minutes=5), dead=1, waiting=3, oldest_due_age=1.0),
    ]
    series = series_from_rows("j", "6h", now, rows)
    assert len(series.buckets) == 72
    first, second = series.buckets[0], series.buckets[1]
    assert (first.completed, first.retried, first.dead) == (3, 1, 0)
    assert first.run_p99 == bucket_value(3)
    assert (first.waiting, first.oldest_due_age) == (7, 2.5)
    assert first.failure_rate == pytest.approx(0.25)
    assert (second.dead, second.waiting) == (1, 3)
    assert series.buckets[2].failure_rate is None
    assert (series.total.completed, series.total.retried, series.total.dead) == (3, 1, 1)
    assert "at most its last 15 s" in series.loss_note
