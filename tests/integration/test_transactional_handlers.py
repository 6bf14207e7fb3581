"""Transactional handlers on PostgreSQL (J13): the outbox messages and workflow events a handler
writes commit with its effect and its run's completion, or not at all; a unit of work on
another database is refused at the worker's start; the pool's size is what the worker's budget
warning reads."""

from __future__ import annotations

import anyio
import pytest
from sqlalchemy import MetaData, text
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool
from workflow_helpers import workflow_backend

from ship_sqla import (
    create_outbox,
    create_unit_of_work,
    define_job,
    ship_outbox_table,
    start_job_runtime,
)
from ship_sqla.errors import ConfigurationError
from ship_sqla.jobs import RetryPolicy


async def _outbox_rows(engine) -> int:
    async with engine.connect() as connection:
        return (await connection.execute(text("SELECT count(*) FROM ship_outbox"))).scalar_one()


async def _effects(engine) -> list[str]:
    async with engine.connect() as connection:
        rows = await connection.execute(text("SELECT key FROM j13_pg_effects ORDER BY seq"))
        return [row.key for row in rows]


@pytest.fixture
async def stores(ship_engine):
    backend = await workflow_backend(ship_engine)
    metadata = MetaData()
    table = ship_outbox_table(metadata)
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
        await connection.execute(
            text("CREATE TABLE j13_pg_effects (seq bigserial, key text NOT NULL)")
        )
    outbox = create_outbox(database=ship_engine, table=table)
    return backend, outbox


async def test_j13_o1_d4_outbox_messages_and_events_commit_with_the_completion(ship_engine, stores):
    """J13, O1, D4: a transactional handler's effect row, outbox message and published event
    commit with the run's completion; an attempt that raises after writing all three leaves
    none of them, and the retry commits each once."""
    backend, outbox = stores
    done = anyio.Event()

    async def write(scope, key):
        await scope.connection.execute(
            text("INSERT INTO j13_pg_effects (key) VALUES (:key)"), {"key": key}
        )

    async def handler(ctx, payload, scope):
        await write(scope, f"attempt-{ctx.attempt}")
        await outbox.enqueue("orders", "order.paid", {"attempt": ctx.attempt})
        await backend.publish_event("order.paid", {"attempt": ctx.attempt}, key="o-1")
        if ctx.attempt == 1:
            raise RuntimeError("after every write")
        done.set()

    uow = create_unit_of_work(ship_engine, repositories=lambda scope: scope)
    job = define_job(
        "j13.pg.outbox",
        handler,
        payload=dict,
        transaction=uow,
        retry=RetryPolicy(attempts=3, base_delay=0.01, jitter="none"),
    )
    result = await backend.enqueue(job, {})
    async with await start_job_runtime([job], backend=backend, poll_interval=0.05):
        with anyio.fail_after(20):
            await done.wait()
    record = await backend.admin.get_run(result.run_id)
    assert (record.state, record.attempt) == ("completed", 2)
    assert await _effects(ship_engine) == ["attempt-2"]
    assert await _outbox_rows(ship_engine) == 1
    async with ship_engine.connect() as connection:
        events = await connection.execute(text("SELECT count(*) FROM ship_job_events"))
        assert events.scalar_one() == 1


async def test_j13_a_unit_of_work_on_another_database_is_refused_at_start(
    ship_engine, ship_engine_url, stores
):
    """J13: the fence and the completion join the handler's transaction, so a transactional
    job whose unit of work is on another engine is refused at the worker's start."""
    backend, _ = stores
    other = create_async_engine(ship_engine_url, poolclass=NullPool)
    try:

        async def handler(ctx, payload, repositories):
            pass

        uow = create_unit_of_work(other, repositories=lambda scope: scope)
        job = define_job("j13.pg.other", handler, transaction=uow)
        with pytest.raises(ConfigurationError, match="another database"):
            await start_job_runtime([job], backend=backend)
    finally:
        await other.dispose()


async def test_j13_connection_capacity_reads_the_pool(ship_engine_url):
    """J13: the unit of work reports its pool's size plus overflow (None: no bound)."""
    sized = create_async_engine(ship_engine_url, pool_size=3, max_overflow=2)
    unbounded = create_async_engine(ship_engine_url, poolclass=NullPool)
    try:
        assert create_unit_of_work(sized, repositories=dict).connection_capacity == 5
        assert create_unit_of_work(unbounded, repositories=dict).connection_capacity is None
    finally:
        await sized.dispose()
        await unbounded.dispose()
