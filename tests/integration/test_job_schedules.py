"""Schedules on real PostgreSQL (J9): upsert of the state row, catch-up with one run, exactly one
run per occurrence across concurrent tickers, interval schedules."""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import anyio
import anyio.abc
import pytest
from sqlalchemy import MetaData, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from ship_sqla._jobs import (
    PostgresJobBackend,
    create_job_backend,
    ship_job_runs_table,
    ship_job_state_table,
)
from ship_sqla.errors import ConfigurationError
from ship_sqla.kernel._jobs import Schedule, define_job
from ship_sqla.testing import FrozenClock

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
    await backend.install_schedules([EVERY_MINUTE])
    first = await state_row(engine, EVERY_MINUTE.id)
    assert first.next_at == datetime(2030, 1, 1, 12, 1, tzinfo=UTC)
    assert first.trigger == "cron:* * * * *@UTC"

    clock.advance(timedelta(minutes=5))
    await backend.install_schedules([EVERY_MINUTE])
    assert await state_row(engine, EVERY_MINUTE.id) == first

    hourly = define_job(EVERY_MINUTE.id, noop, schedule=Schedule(cron="0 * * * *"))
    await backend.install_schedules([hourly])
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
    await backend.install_schedules([EVERY_MINUTE])
    assert await backend.tick_schedules([EVERY_MINUTE]) == 0
    clock.advance(timedelta(minutes=10))  # 12:10:30: 12:01 .. 12:10 were missed
    assert await backend.tick_schedules([EVERY_MINUTE]) == 1
    assert await backend.tick_schedules([EVERY_MINUTE]) == 0
    [row] = await run_rows(engine, EVERY_MINUTE.id)
    assert row.id == "report.minutely/2030-01-01T12:10:00Z"
    assert row.run_at == datetime(2030, 1, 1, 12, 10, tzinfo=UTC)
    assert row.payload is None
    assert (await state_row(engine, EVERY_MINUTE.id)).next_at == datetime(
        2030, 1, 1, 12, 11, tzinfo=UTC
    )
    record = await backend.admin.get_run(row.id)
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
            await each.install_schedules([EVERY_MINUTE])
        created: list[int] = []

        async def tick(each: PostgresJobBackend) -> None:
            created.append(await each.tick_schedules([EVERY_MINUTE]))

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
    await backend.install_schedules([job])
    assert (await state_row(engine, job.id)).next_at == datetime(2030, 1, 1, 12, 5, tzinfo=UTC)
    clock.advance(timedelta(minutes=5))
    assert await backend.tick_schedules([job]) == 1
    clock.advance(timedelta(minutes=5))
    assert await backend.tick_schedules([job]) == 1
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
        await backend.install_schedules([job])


@pytest.mark.parametrize(
    ("cron", "start", "local_time"),
    [
        # Spring forward on 2030-03-31: 02:30 does not exist that day and fires at 03:00.
        ("30 2 * * *", datetime(2030, 3, 28, tzinfo=UTC), (2, 30)),
        # Fall back on 2030-10-27: 02:30 happens twice and fires once.
        ("30 2 * * *", datetime(2030, 10, 24, tzinfo=UTC), (2, 30)),
        ("0 3 * * *", datetime(2030, 3, 28, tzinfo=UTC), (3, 0)),
    ],
)
async def test_daily_cron_across_a_dst_change_fires_once_a_day_at_local_time(
    engine: AsyncEngine, clock: FrozenClock, cron: str, start: datetime, local_time: tuple[int, int]
) -> None:
    """J9: a daily cron in Europe/Berlin, ticked on PostgreSQL every 20 minutes through a week
    with a DST change, creates exactly one run per local day, each due at the declared local
    time (at the end of the gap on the day that skips it)."""
    berlin = ZoneInfo("Europe/Berlin")
    clock.set(start)
    job = define_job("report.daily", noop, schedule=Schedule(cron=cron, timezone="Europe/Berlin"))
    backend = create_job_backend(database=engine, table=runs, state_table=state, clock=clock)
    await backend.install_schedules([job])
    created = 0
    while clock.now() < start + timedelta(days=7):
        clock.advance(timedelta(minutes=20))
        created += await backend.tick_schedules([job])
    rows = await run_rows(engine, job.id)
    local_days = Counter(row.run_at.astimezone(berlin).date() for row in rows)
    assert created == len(rows) == 7
    assert set(local_days.values()) == {1}
    for row in rows:
        local = row.run_at.astimezone(berlin)
        skipped = local.date().isoformat() == "2030-03-31" and local_time == (2, 30)
        assert (local.hour, local.minute) == ((3, 0) if skipped else local_time), row.id


_TICKER = """
import asyncio, sys
from datetime import datetime, timedelta
from sqlalchemy import MetaData
from sqlalchemy.ext.asyncio import create_async_engine
from ship_sqla import create_job_backend, ship_job_runs_table, ship_job_state_table
from ship_sqla import define_job
from ship_sqla.jobs import Schedule
from ship_sqla.testing import FrozenClock

async def noop(ctx, payload):
    return None

async def main(url, start):
    metadata = MetaData()
    runs, state = ship_job_runs_table(metadata), ship_job_state_table(metadata)
    clock = FrozenClock(datetime.fromisoformat(start))
    engine = create_async_engine(url)
    backend = create_job_backend(database=engine, table=runs, state_table=state, clock=clock)
    job = define_job("report.minutely", noop, schedule=Schedule(cron="* * * * *"))
    await backend.install_schedules([job])
    print("ready", flush=True)
    # One line per occurrence from the test: every process moves to the same minute, then
    # ticks three times at once; the count of runs it created goes back on stdout.
    for line in sys.stdin:
        clock.set(datetime.fromisoformat(line.strip()))
        created = sum(await asyncio.gather(*(backend.tick_schedules([job]) for _ in range(3))))
        print(created, flush=True)
    await engine.dispose()

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


async def test_three_worker_processes_ticking_at_once_create_one_run_per_occurrence(
    engine: AsyncEngine, ship_engine_url: str
) -> None:
    """J9: three OS processes, each with its own pool and clock, move to the same minute in
    lock step and tick it three times concurrently, for 20 occurrences: exactly one run per
    occurrence (SKIP LOCKED and the durable id), and the runs the processes report creating
    add up to 20."""
    occurrences = 20
    minutes = [START + timedelta(minutes=m) for m in range(1, occurrences + 1)]
    created = 0
    async with AsyncExitStack() as stack:
        processes = [
            await stack.enter_async_context(
                await anyio.open_process(
                    [sys.executable, "-c", _TICKER, ship_engine_url, START.isoformat()],
                    stderr=None,
                )
            )
            for _ in range(3)
        ]
        lines = [_lines(process) for process in processes]
        with anyio.fail_after(120):
            for each in lines:
                assert await anext(each) == "ready"
            for minute in minutes:
                for process in processes:
                    assert process.stdin is not None
                    await process.stdin.send(f"{minute.isoformat()}\n".encode())
                for each in lines:
                    created += int(await anext(each))
            for process in processes:
                assert process.stdin is not None
                await process.stdin.aclose()
                assert await process.wait() == 0
    assert created == occurrences
    ids = [row.id for row in await run_rows(engine, EVERY_MINUTE.id)]
    assert ids == [f"report.minutely/{m.replace(second=0):%Y-%m-%dT%H:%M:%SZ}" for m in minutes]


async def _lines(process: anyio.abc.Process) -> AsyncIterator[str]:
    assert process.stdout is not None
    buffered = b""
    async for chunk in process.stdout:
        buffered += chunk
        while b"\n" in buffered:
            line, buffered = buffered.split(b"\n", 1)
            yield line.decode()
