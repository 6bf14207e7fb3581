"""Every connection borrowed outside SQLAlchemy's greenlet goes back to its pool cleanly
(issue 33, part 1; issue 27, item 1).

The direct path (``ship_sqla._direct``) runs plain enqueues, bulk COPYs, claims, settles and
heartbeats on pooled asyncpg connections from plain asyncio code. Returning one does I/O
whenever the pool closes it (a ``NullPool`` always, a full ``QueuePool`` its overflow
connections, a disposed engine's old pool), and the asyncpg adapter's ``close`` needs
SQLAlchemy's greenlet for that: done outside it, the pool logged ``Exception closing
connection ... MissingGreenlet`` per connection and dropped it unclosed. Each pool shape here
runs more work at once than the pool holds (NullPool, a full QueuePool's overflow,
pool_pre_ping, connections the server ended, a real restart of a private cluster, ``dispose()``
racing enqueues, a worker on a NullPool); the test asserts no log record at WARNING or above
and, once the engine is disposed, no server session left behind (``pg_stat_activity``)."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from pg_cluster import Cluster
from pg_cluster import private_cluster as start_private_cluster
from sqlalchemy import MetaData, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from ship_sqla import (
    create_job_backend,
    define_job,
    ship_job_history_table,
    ship_job_runs_table,
    ship_job_state_table,
    start_job_runtime,
)
from ship_sqla._jobs._sql.enqueue import ENQUEUE_COPY_MIN_RUNS
from ship_sqla.errors import DatabaseUnavailableError
from ship_sqla.jobs import EnqueueRequest

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

metadata = MetaData()
ship_job_runs_table(metadata)
ship_job_history_table(metadata)  # J16: the default shape create_job_backend() reads
ship_job_state_table(metadata)

ENQUEUES = 24
AT_ONCE = 8


async def _noop(ctx: Any, payload: Any) -> None:
    return None


JOB = define_job("pool.return", _noop, payload=dict)

SHAPES: dict[str, dict[str, Any]] = {
    "nullpool": {"poolclass": NullPool},
    "queuepool_overflow": {"pool_size": 1, "max_overflow": AT_ONCE},
    "pool_pre_ping": {"pool_size": 1, "max_overflow": AT_ONCE, "pool_pre_ping": True},
}


@pytest.fixture
async def database(ship_engine: AsyncEngine) -> AsyncEngine:
    """The test's database with the runs tables; ``ship_engine`` also counts its sessions."""
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    return ship_engine


@pytest.fixture
def warnings_logged(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """Every log record at WARNING or above, from any logger (SQLAlchemy's pool, asyncio's
    'Task exception was never retrieved', ship_sqla's own)."""
    caplog.set_level(logging.WARNING)
    return caplog.records


APPLICATION = "ship_sqla_pool_return"
"""The ``application_name`` of the engines under test: their sessions, and no other's."""


def _engine(url: Any, **options: Any) -> AsyncEngine:
    """An engine under test: its sessions are counted by their application name."""
    return create_async_engine(
        url, connect_args={"server_settings": {"application_name": APPLICATION}}, **options
    )


async def _sessions(counter: AsyncEngine) -> int:
    async with counter.connect() as connection:
        found = await connection.execute(
            text("SELECT count(*) FROM pg_stat_activity WHERE application_name = :name"),
            {"name": APPLICATION},
        )
        return int(found.scalar_one())


async def _no_session_left(counter: AsyncEngine, engine: AsyncEngine) -> None:
    """Once ``engine`` is disposed, the server holds no session of it. A closed session
    leaves ``pg_stat_activity`` once its backend has exited, a moment after its socket
    closed."""
    await engine.dispose()
    with anyio.fail_after(10):
        while await _sessions(counter):
            pass  # each probe is a new connection's round trip: the server's time, no event


async def _at_once(work: Callable[[int], Awaitable[object]], total: int = ENQUEUES) -> None:
    """``work(n)`` for n < total, ``AT_ONCE`` at a time (more than the pool holds)."""
    for start in range(0, total, AT_ONCE):
        await asyncio.gather(*(work(n) for n in range(start, min(start + AT_ONCE, total))))


@pytest.fixture
async def counter(ship_engine_url: str) -> AsyncIterator[AsyncEngine]:
    """An engine of its own that counts the database's sessions (NullPool: it holds none)."""
    own = create_async_engine(ship_engine_url, poolclass=NullPool)
    yield own
    await own.dispose()


@pytest.mark.parametrize("shape", sorted(SHAPES))
async def test_s1_plain_and_bulk_enqueues_return_every_connection_cleanly(
    database: AsyncEngine,
    counter: AsyncEngine,
    warnings_logged: list[logging.LogRecord],
    shape: str,
) -> None:
    """S1, J11: plain enqueues and bulk (COPY) enqueues outside a unit of work, more at once
    than the pool holds, on a NullPool, a full QueuePool's overflow and with pool_pre_ping:
    every run stored, no log record at WARNING or above, and no session left once the engine
    is disposed."""
    engine = _engine(database.url, **SHAPES[shape])
    backend = create_job_backend(database=engine)
    bulk = [EnqueueRequest({"n": n}) for n in range(ENQUEUE_COPY_MIN_RUNS)]

    async def enqueue(n: int) -> object:
        if n % AT_ONCE == 0:
            return await backend.enqueue_many(JOB, bulk)
        return await backend.enqueue(JOB, {"n": n})

    await _at_once(enqueue)
    async with database.connect() as connection:
        stored = await connection.scalar(text("SELECT count(*) FROM ship_job_runs"))
    assert stored == ENQUEUES - ENQUEUES // AT_ONCE + (ENQUEUES // AT_ONCE) * len(bulk)
    await _no_session_left(counter, engine)
    assert [record.getMessage() for record in warnings_logged] == []


async def test_s1_a_worker_on_a_nullpool_returns_every_connection_cleanly(
    database: AsyncEngine, counter: AsyncEngine, warnings_logged: list[logging.LogRecord]
) -> None:
    """S1, J11: a worker runtime on a NullPool engine (a PgBouncer set-up's usual pool)
    claims, heartbeats and settles on the direct path: every run completes, nothing is logged
    at WARNING or above, and no session is left once it stopped and the engine is disposed."""
    engine = _engine(database.url, poolclass=NullPool)
    backend = create_job_backend(database=engine)
    done = anyio.Event()
    seen: set[int] = set()

    async def handler(ctx: Any, payload: dict[str, int]) -> None:
        seen.add(payload["n"])
        if len(seen) == ENQUEUES:
            done.set()

    job = define_job("pool.return.worker", handler, payload=dict)
    async with await start_job_runtime([job], backend=backend, max_in_flight=AT_ONCE):
        await _at_once(lambda n: backend.enqueue(job, {"n": n}))
        with anyio.fail_after(30):
            await done.wait()
    await _no_session_left(counter, engine)
    assert [record.getMessage() for record in warnings_logged] == []


async def test_s1_dispose_racing_enqueues_leaves_no_session(
    database: AsyncEngine, counter: AsyncEngine, warnings_logged: list[logging.LogRecord]
) -> None:
    """S1, J11: ``engine.dispose()`` run while plain enqueues are under way (as at a
    shutdown, or after a restart): every enqueue stores its run, the old pool's connections
    are closed, not left open in it, and nothing is logged at WARNING or above."""
    engine = _engine(database.url, pool_size=2, max_overflow=AT_ONCE)
    backend = create_job_backend(database=engine)

    async def enqueue_or_dispose(n: int) -> object:
        if n % AT_ONCE == AT_ONCE // 2:
            return await engine.dispose()
        return await backend.enqueue(JOB, {"n": n})

    await _at_once(enqueue_or_dispose)
    async with database.connect() as connection:
        stored = await connection.scalar(text("SELECT count(*) FROM ship_job_runs"))
    assert stored == ENQUEUES - ENQUEUES // AT_ONCE
    await _no_session_left(counter, engine)
    assert [record.getMessage() for record in warnings_logged] == []


@pytest.mark.parametrize("pre_ping", [True, False])
async def test_s1_connections_the_server_ended_are_replaced_quietly(
    database: AsyncEngine,
    counter: AsyncEngine,
    warnings_logged: list[logging.LogRecord],
    pre_ping: bool,
) -> None:
    """S1, J11: the server ends every pooled connection (as a restart does), then more
    enqueues run at once than the pool holds. With pool_pre_ping each checkout replaces its
    dead connection and every enqueue succeeds; without, an enqueue on a dead one fails with
    the typed DatabaseUnavailableError and the pool replaces it. Either way nothing is logged
    at WARNING or above and no session is left behind."""
    engine = _engine(database.url, pool_size=2, max_overflow=AT_ONCE, pool_pre_ping=pre_ping)
    backend = create_job_backend(database=engine)
    await _at_once(lambda n: backend.enqueue(JOB, {"n": n}))
    async with database.connect() as connection:
        await connection.execute(
            text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                " AND backend_type = 'client backend'"
            )
        )
    outages: list[DatabaseUnavailableError] = []

    async def enqueue(n: int) -> None:
        try:
            await backend.enqueue(JOB, {"n": n})
        except DatabaseUnavailableError as outage:
            outages.append(outage)

    await _at_once(enqueue)
    if pre_ping:
        assert outages == []
    await _at_once(enqueue)  # the pool replaced what it lost
    assert len(outages) <= 2  # at most the pool's two kept connections were dead
    await _no_session_left(counter, engine)
    assert [record.getMessage() for record in warnings_logged] == []


@pytest.fixture
def private_cluster() -> Iterator[Cluster]:
    """A fresh cluster of this test alone (tests/support/pg_cluster.py): it is restarted, which
    the shared server must never be."""
    with start_private_cluster() as cluster:
        yield cluster


async def test_s1_a_server_restart_leaves_every_connection_returned_cleanly(
    private_cluster: Cluster, warnings_logged: list[logging.LogRecord]
) -> None:
    """S1, J11: PostgreSQL itself is restarted (pg_ctl restart -m fast) under a pool with
    pool_pre_ping, after plain enqueues above the pool's size left connections in it: each
    checkout replaces its dead connection, every enqueue after the restart succeeds, nothing
    is logged at WARNING or above, and no session is left once the engine is disposed."""
    engine = _engine(private_cluster.url, pool_size=2, max_overflow=AT_ONCE, pool_pre_ping=True)
    counter = create_async_engine(private_cluster.url, poolclass=NullPool)
    try:
        async with engine.begin() as connection:
            await connection.run_sync(metadata.create_all)
        backend = create_job_backend(database=engine)
        await _at_once(lambda n: backend.enqueue(JOB, {"n": n}))
        await private_cluster.ctl("-m", "fast", "-w", "restart")
        await _at_once(lambda n: backend.enqueue(JOB, {"n": n}))
        async with counter.connect() as connection:
            stored = await connection.scalar(text("SELECT count(*) FROM ship_job_runs"))
        assert stored == 2 * ENQUEUES
        await _no_session_left(counter, engine)
    finally:
        await engine.dispose()
        await counter.dispose()
    assert [record.getMessage() for record in warnings_logged] == []
