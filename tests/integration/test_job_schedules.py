"""Schedules on real PostgreSQL (J9): upsert of the state row, catch-up with one run, exactly one
run per occurrence across concurrent tickers, interval schedules."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import pytest
from sqlalchemy import MetaData, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from ship_sqla._jobs import (
    PostgresJobBackend,
    create_job_backend,
    ship_job_runs_table,
    ship_job_state_table,
)
from ship_sqla.kernel import ConfigurationError, FrozenClock
from ship_sqla.kernel._jobs import Schedule, define_job

metadata = MetaData()
runs = ship_job_runs_table(metadata)
state = ship_job_state_table(metadata)

START = datetime(2030, 1, 1, 12, 0, 30, tzinfo=UTC)


async def noop(ctx: Any, payload: Any) -> None:
    return None


EVERY_MINUTE = define_job("report.minutely", noop, schedule=Schedule(cron="* * * * *"))


@pytest.fixture
async def engine(ship_engine: AsyncEngine) -> AsyncEngine:
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    return ship_engine


@pytest.fixture
def clock(ship_clock: FrozenClock) -> FrozenClock:
    ship_clock.set(START)
    return ship_clock


@pytest.fixture
def backend(engine: AsyncEngine, clock: FrozenClock) -> PostgresJobBackend:
    return create_job_backend(database=engine, table=runs, state_table=state, clock=clock)


async def state_row(engine: AsyncEngine, job_id: str) -> Any:
    async with engine.connect() as connection:
        result = await connection.execute(
            text("SELECT next_at, trigger FROM ship_job_state WHERE job_id = :j"), {"j": job_id}
        )
        return result.one()


async def run_rows(engine: AsyncEngine, job_id: str) -> list[Any]:
    async with engine.connect() as connection:
        result = await connection.execute(
            text("SELECT id, run_at, payload FROM ship_job_runs WHERE job_id = :j ORDER BY id"),
            {"j": job_id},
        )
        return list(result.all())


async def test_schedule_keeps_next_at_for_same_trigger_and_replaces_changed(
    engine: AsyncEngine, backend: PostgresJobBackend, clock: FrozenClock
) -> None:
    """J9: schedule upserts one state row; the same trigger keeps next_at (a restart replaces,
    never duplicates), a changed trigger replaces it."""
    await backend.schedule([EVERY_MINUTE])
    first = await state_row(engine, EVERY_MINUTE.id)
    assert first.next_at == datetime(2030, 1, 1, 12, 1, tzinfo=UTC)
    assert first.trigger == "cron:* * * * *@UTC"

    clock.advance(timedelta(minutes=5))
    await backend.schedule([EVERY_MINUTE])
    assert await state_row(engine, EVERY_MINUTE.id) == first

    hourly = define_job(EVERY_MINUTE.id, noop, schedule=Schedule(cron="0 * * * *"))
    await backend.schedule([hourly])
    changed = await state_row(engine, EVERY_MINUTE.id)
    assert changed.trigger == "cron:0 * * * *@UTC"
    assert changed.next_at == datetime(2030, 1, 1, 13, 0, tzinfo=UTC)
    async with engine.connect() as connection:
        count = await connection.scalar(text("SELECT count(*) FROM ship_job_state"))
    assert count == 1


async def test_catch_up_after_ten_missed_occurrences_is_one_run(
    engine: AsyncEngine, backend: PostgresJobBackend, clock: FrozenClock
) -> None:
    """J9: a process down for ten occurrences catches up with exactly ONE run, durable id
    <job_id>/<occurrence> of the latest one, and next_at moves past now."""
    await backend.schedule([EVERY_MINUTE])
    assert await backend.tick([EVERY_MINUTE]) == 0
    clock.advance(timedelta(minutes=10))  # 12:10:30: 12:01 .. 12:10 were missed
    assert await backend.tick([EVERY_MINUTE]) == 1
    assert await backend.tick([EVERY_MINUTE]) == 0
    [row] = await run_rows(engine, EVERY_MINUTE.id)
    assert row.id == "report.minutely/2030-01-01T12:10:00Z"
    assert row.run_at == datetime(2030, 1, 1, 12, 10, tzinfo=UTC)
    assert row.payload is None
    assert (await state_row(engine, EVERY_MINUTE.id)).next_at == datetime(
        2030, 1, 1, 12, 11, tzinfo=UTC
    )
    record = await backend.get_run(row.id)
    assert record is not None
    assert record.state == "waiting"


async def test_concurrent_tickers_create_one_run_per_occurrence(
    engine: AsyncEngine, ship_engine_url: str, clock: FrozenClock
) -> None:
    """J9: three backends (three engines, one database, one clock) ticking concurrently create
    exactly one run per occurrence (SKIP LOCKED, and the durable id's primary key)."""
    engines = [create_async_engine(ship_engine_url) for _ in range(3)]
    try:
        backends = [
            create_job_backend(database=e, table=runs, state_table=state, clock=clock)
            for e in engines
        ]
        for each in backends:
            await each.schedule([EVERY_MINUTE])
        created: list[int] = []

        async def tick(each: PostgresJobBackend) -> None:
            created.append(await each.tick([EVERY_MINUTE]))

        for _ in range(5):
            clock.advance(timedelta(minutes=1))
            async with anyio.create_task_group() as group:
                for each in backends:
                    for _ in range(3):
                        group.start_soon(tick, each)
        assert sum(created) == 5
        ids = [row.id for row in await run_rows(engine, EVERY_MINUTE.id)]
        assert ids == [f"report.minutely/2030-01-01T12:0{m}:00Z" for m in range(1, 6)]
    finally:
        for e in engines:
            await e.dispose()


async def test_interval_schedule_fires_on_epoch_multiples(
    engine: AsyncEngine, backend: PostgresJobBackend, clock: FrozenClock
) -> None:
    """J9: an interval schedule fires on multiples of the interval from the epoch; payload=dict
    jobs get {} as their payload."""
    job = define_job(
        "sync.every5",
        noop,
        payload=dict,
        schedule=Schedule(interval=timedelta(minutes=5)),
    )
    await backend.schedule([job])
    assert (await state_row(engine, job.id)).next_at == datetime(2030, 1, 1, 12, 5, tzinfo=UTC)
    clock.advance(timedelta(minutes=5))
    assert await backend.tick([job]) == 1
    clock.advance(timedelta(minutes=5))
    assert await backend.tick([job]) == 1
    rows = await run_rows(engine, job.id)
    assert [row.id for row in rows] == [
        "sync.every5/2030-01-01T12:05:00Z",
        "sync.every5/2030-01-01T12:10:00Z",
    ]
    assert all(row.payload == {} for row in rows)


async def test_schedule_refuses_payload_a_tick_cannot_give(backend: PostgresJobBackend) -> None:
    """J9: a scheduled job whose payload type neither None nor {} fits is refused at schedule."""
    job = define_job("typed", noop, payload=list, schedule=Schedule(interval=timedelta(1)))
    with pytest.raises(ConfigurationError, match="payload=None or payload=dict"):
        await backend.schedule([job])
