"""#36's history on real PostgreSQL, in one process: the fleet's sampler (F5) prunes minutes
past the store's retention and writes the backlog gauge; a chart's read of a job's range is
served by the stats table's primary key and stays bounded by the range (S2: bounded,
index-served reads); a series over a week of stored minutes has exact totals."""

from __future__ import annotations

import random
import time
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import anyio
import attrs
import pytest
from sqlalchemy import MetaData, text

from ship_sqla import (
    create_job_backend,
    create_job_stats,
    define_job,
    ship_job_stats_table,
    start_job_runtime,
)
from ship_sqla._jobs import ship_job_runs_table, ship_job_state_table
from ship_sqla._jobs._sql.stats import READ_STATS
from ship_sqla.kernel._stats import HISTOGRAM_BUCKETS, range_buckets, series_from_rows

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

metadata = MetaData()
runs = ship_job_runs_table(metadata)
state = ship_job_state_table(metadata)
stats_table = ship_job_stats_table(metadata)


async def noop(ctx: object, payload: object) -> None:
    return None


JOB = define_job("stats.history", noop, payload=dict)


async def rows(engine: AsyncEngine, sql: str) -> list[tuple[object, ...]]:
    async with engine.connect() as connection:
        return [tuple(r) for r in await connection.execute(text(sql))]


@pytest.fixture
async def engine(ship_engine: AsyncEngine) -> AsyncEngine:
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    return ship_engine


@pytest.mark.timeout(60)
async def test_the_sampler_prunes_past_the_retention_and_records_the_backlog(
    engine: AsyncEngine,
) -> None:
    """F5: a worker with a history store samples at its start (no metric reader needed): the
    minutes older than the store's retention (here 2 days) are deleted, younger ones kept, and
    the job's backlog (3 waiting, one of them due) is written into the current minute's row."""
    async with engine.begin() as connection:
        await connection.execute(
            text(
                "INSERT INTO ship_job_stats (job_id, minute, completed)"
                " SELECT 'stats.history', date_trunc('minute', now()) - g * interval '1 hour', 1"
                " FROM generate_series(1, 24 * 7) g"
            )
        )
    backend = create_job_backend(database=engine, table=runs, state_table=state)
    await backend.enqueue(JOB, {}, run_at=datetime.now(UTC) - timedelta(minutes=1))
    for _ in range(2):
        await backend.enqueue(JOB, {}, run_at=datetime.now(UTC) + timedelta(days=1))
    stats = create_job_stats(engine, stats_table, retention=timedelta(days=2))
    # enqueue-only would not sample; a worker whose job is paused claims nothing.
    await create_job_backend(database=engine, table=runs, state_table=state).admin.pause(JOB.id)
    runtime = await start_job_runtime(JOB, backend=backend, stats=stats, poll_interval=0.2)
    try:
        deadline = time.monotonic() + 30
        sampled = "SELECT count(*) FROM ship_job_stats WHERE waiting IS NOT NULL"
        while (await rows(engine, sampled)) == [(0,)]:
            assert time.monotonic() < deadline, "no backlog sample"
            await anyio.sleep(0.05)
    finally:
        await runtime.stop()
    [(kept, oldest)] = await rows(
        engine,
        "SELECT count(*), min(minute) > now() - interval '2 days 1 minute'"
        " FROM ship_job_stats WHERE completed > 0",
    )
    assert kept == 47  # the hours within two days
    assert oldest is True
    [(waiting, age)] = await rows(
        engine, "SELECT waiting, oldest_due_age FROM ship_job_stats WHERE waiting IS NOT NULL"
    )
    assert waiting == 3
    assert 50 < float(str(age)) < 600


async def test_a_week_of_minutes_reads_by_primary_key_with_exact_totals(
    engine: AsyncEngine,
) -> None:
    """S2: three jobs with a week of minutes each (30,240 rows): a job's 1 h chart reads its
    60 minutes by a range of the primary key, and each range's totals are the exact sums of
    its minutes (every minute holds 2 completed and 1 dead)."""
    now = datetime(2030, 1, 8, 12, 0, 30, tzinfo=UTC)
    async with engine.begin() as connection:
        await connection.execute(
            text(
                "INSERT INTO ship_job_stats (job_id, minute, completed, dead, run_hist)"
                " SELECT j, timestamptz '2030-01-08 12:00:00+00' - g * interval '1 minute',"
                " 2, 1, '{0,1,2}'"
                " FROM unnest(ARRAY['a', 'b', 'c']) j, generate_series(0, 7 * 24 * 60 - 1) g"
            )
        )
        await connection.execute(text("ANALYZE ship_job_stats"))
    stats = create_job_stats(engine, stats_table)
    one_hour = await stats.series("b", "1h", now=now)
    assert len(one_hour.buckets) == 60
    assert (one_hour.total.completed, one_hour.total.dead) == (120, 60)
    week = await stats.series("b", "7d", now=now)
    # The 7 d range ends with the 2-hour bucket now is in: 12:00 is its first minute.
    assert week.total.completed == 2 * (7 * 24 * 60 - 119)
    assert week.total.failure_rate == pytest.approx(1 / 3)
    plan = await rows(
        engine,
        "EXPLAIN (FORMAT TEXT) "
        + READ_STATS.replace("{stats}", "ship_job_stats")
        .replace(":job_id", "'b'")
        .replace(":start", "timestamptz '2030-01-08 11:00:00+00'")
        .replace(":end", "timestamptz '2030-01-08 12:01:00+00'"),
    )
    text_plan = "\n".join(str(r[0]) for r in plan)
    assert "ship_job_stats_pkey" in text_plan, text_plan
    assert "Seq Scan" not in text_plan, text_plan


async def _random_minutes(engine: AsyncEngine, jobs: tuple[str, ...], end: datetime) -> None:
    """Two days of minute rows per job, with holes: histograms of random lengths (empty, short,
    up to every bucket) and backlog samples on some minutes only."""
    rng = random.Random(36)
    rows = []
    for job in jobs:
        for g in range(2 * 24 * 60):
            if rng.random() < 0.2:
                continue  # a minute nobody finished in
            sampled = rng.random() < 0.4

            def hist() -> list[int]:
                n = rng.choice((0, 0, 3, 9, 40, HISTOGRAM_BUCKETS))
                return [rng.randrange(0, 5) for _ in range(n)]

            rows.append(
                {
                    "job": job,
                    "minute": end - timedelta(minutes=g + 1),
                    "c": rng.randrange(0, 1000),
                    "r": rng.randrange(0, 5),
                    "d": rng.randrange(0, 3),
                    "x": rng.randrange(0, 2),
                    "rh": hist(),
                    "wh": hist(),
                    "w": rng.randrange(0, 10**6) if sampled else None,
                    "a": rng.random() * 100 if sampled and rng.random() < 0.8 else None,
                }
            )
    async with engine.begin() as connection:
        await connection.execute(
            text(
                "INSERT INTO ship_job_stats (job_id, minute, completed, retried, dead, cancelled,"
                " run_hist, wait_hist, waiting, oldest_due_age) VALUES (:job, :minute, :c, :r,"
                " :d, :x, :rh, :wh, :w, :a)"
            ),
            rows,
        )


async def test_a_chart_read_per_bucket_gives_the_minutes_series(engine: AsyncEngine) -> None:
    """S2 (issue 36): a range's buckets summed in the statement (``read_stats_buckets``: one
    row per bucket, 84 for 7 days) give the series the job's minute rows give (every bucket's
    counts, percentiles and last backlog sample, and the range's totals), for one job (the job
    page, ``series``) and summed over several (the overview, without the backlog)."""
    now = datetime(2030, 1, 8, 12, 7, 30, tzinfo=UTC)
    await _random_minutes(engine, ("a", "b", "c"), datetime(2030, 1, 8, 12, 8, tzinfo=UTC))
    stats = create_job_stats(engine, stats_table)
    for window in ("6h", "24h", "7d"):
        start, end, step = range_buckets(window, now)
        minutes = await stats.read_stats("b", start, end)
        expected = series_from_rows("b", window, now, minutes)
        assert await stats.series("b", window, now=now) == expected
        buckets = await stats.read_stats_buckets(["b"], start, end, step, job_id="b")
        assert len(buckets) <= (end - start) // step
        assert len(minutes) > 3 * len(buckets)
        several = [*await stats.read_stats("a", start, end), *minutes]
        unsampled = [attrs.evolve(r, waiting=None, oldest_due_age=None) for r in several]
        summed = await stats.read_stats_buckets(["a", "b"], start, end, step)
        got = [attrs.evolve(r, waiting=None, oldest_due_age=None) for r in summed]
        assert series_from_rows("*", window, now, got) == series_from_rows(
            "*", window, now, unsampled
        )
