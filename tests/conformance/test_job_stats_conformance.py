"""#36's history store on every backend (the in-memory reference, PostgreSQL's stats table):
flushes add up per (job, minute), two processes' flushes of the same minutes merge, the
backlog gauge of a minute is its last sample, retention deletes whole minutes, and a read is
the job's minutes of a range in order (S2: a bounded read, totals exact from this rollup)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest
from sqlalchemy import MetaData

from ship_sqla import create_job_stats, ship_job_stats_table
from ship_sqla.kernel._memory.stats import InMemoryJobStats
from ship_sqla.kernel._stats import Backlog, JobStatsStore, StatsFold, StatsRow

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
MINUTE = timedelta(minutes=1)


@pytest.fixture
async def postgres_stats(ship_engine: AsyncEngine) -> JobStatsStore:
    metadata = MetaData()
    table = ship_job_stats_table(metadata)
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    return create_job_stats(ship_engine, table)


@pytest.fixture(params=["memory", "postgres"])
def store(request: pytest.FixtureRequest) -> JobStatsStore:
    if request.param == "memory":
        return InMemoryJobStats()
    return request.getfixturevalue("postgres_stats")  # type: ignore[no-any-return]


def _rows(*finishes: tuple[str, int, str, float | None, float | None]) -> list[StatsRow]:
    fold = StatsFold()
    for job, second, outcome, run, wait in finishes:
        fold.record(job, T0 + timedelta(seconds=second), outcome, run, wait)  # type: ignore[arg-type]
    return fold.take()


async def test_flushes_add_up_per_job_and_minute(store: JobStatsStore) -> None:
    """S2: a second flush of the same minute adds its counters and histograms to the row."""
    await store.add_stats(_rows(("a", 1, "completed", 0.01, 0.5), ("a", 70, "dead", 1.0, None)))
    await store.add_stats(_rows(("a", 2, "completed", 0.02, None), ("a", 3, "retried", 9.0, 2.0)))
    await store.add_stats([])
    read = await store.read_stats("a", T0, T0 + 2 * MINUTE)
    assert read == _rows(
        ("a", 1, "completed", 0.01, 0.5),
        ("a", 70, "dead", 1.0, None),
        ("a", 2, "completed", 0.02, None),
        ("a", 3, "retried", 9.0, 2.0),
    )
    assert [(r.completed, r.retried, r.dead) for r in read] == [(2, 1, 0), (0, 0, 1)]


async def test_two_processes_flushing_at_once_merge(store: JobStatsStore) -> None:
    """Two processes' flushes of the same (job, minute) rows, concurrently: every count lands
    once (the upsert adds; rows are taken in one order, so no deadlock)."""
    first = _rows(*[("a", s, "completed", 0.001 * s, None) for s in range(50)])
    second = _rows(*[("a", s, "retried", 0.5, 0.1) for s in range(30, 130)])
    await asyncio.gather(store.add_stats(first), store.add_stats(second))
    read = await store.read_stats("a", T0, T0 + 3 * MINUTE)
    assert sum(r.completed for r in read) == 50
    assert sum(r.retried for r in read) == 100
    assert sum(sum(r.run_hist) for r in read) == 150
    assert sum(sum(r.wait_hist) for r in read) == 100


async def test_backlog_is_the_minutes_last_sample(store: JobStatsStore) -> None:
    """F5's sampler writes the backlog gauge into the minute's row: a later sample of the
    minute replaces it; flushes leave it alone, and it leaves the counters alone."""
    await store.record_backlog(T0, {"a": Backlog(5, 1.5), "b": Backlog(0, None)})
    await store.add_stats(_rows(("a", 1, "completed", 0.1, None)))
    await store.record_backlog(T0, {"a": Backlog(3, 0.5)})
    await store.record_backlog(T0, {})
    (a,) = await store.read_stats("a", T0, T0 + MINUTE)
    (b,) = await store.read_stats("b", T0, T0 + MINUTE)
    assert (a.completed, a.waiting, a.oldest_due_age) == (1, 3, 0.5)
    assert (b.completed, b.waiting, b.oldest_due_age) == (0, 0, None)


async def test_prune_deletes_minutes_before_the_bound(store: JobStatsStore) -> None:
    """Retention: minutes before the bound go, the bound's minute and later stay."""
    await store.add_stats(_rows(*[("a", 60 * m, "completed", None, None) for m in range(5)]))
    await store.add_stats(_rows(("b", 0, "dead", None, None)))
    assert await store.prune_stats(T0 + 2 * MINUTE) == 3
    read = await store.read_stats("a", T0 - MINUTE, T0 + 10 * MINUTE)
    assert [r.minute for r in read] == [T0 + 2 * MINUTE, T0 + 3 * MINUTE, T0 + 4 * MINUTE]
    assert await store.read_stats("b", T0, T0 + MINUTE) == []


async def test_read_is_the_jobs_range_in_order(store: JobStatsStore) -> None:
    """A read returns one job's minutes in [start, end), oldest first, no other job's."""
    await store.add_stats(
        _rows(*[(job, 60 * m, "completed", None, None) for job in "ab" for m in range(6)])
    )
    read = await store.read_stats("b", T0 + MINUTE, T0 + 4 * MINUTE)
    assert [r.minute for r in read] == [T0 + MINUTE * k for k in (1, 2, 3)]
    assert {r.job_id for r in read} == {"b"}


async def test_stores_state_their_flush_interval_and_retention(store: Any) -> None:
    assert store.flush_interval == 15.0
    assert store.retention == timedelta(days=7)
