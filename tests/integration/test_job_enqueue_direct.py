"""The plain enqueue outside a unit of work, run straight on a pooled asyncpg connection
(``ship_sqla._direct``): the same rows, the same SQL, the same errors and the same connection
handling as the same statement through SQLAlchemy's ``AsyncConnection.execute``.

Every test compares the two paths on one backend: the direct one, and SQLAlchemy's, which the
backend takes while a ``before_cursor_execute`` listener watches the engine (``watched``)."""

from __future__ import annotations

import asyncio
import logging
from contextlib import AbstractContextManager, nullcontext
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from sqlalchemy import MetaData, event, text
from sqlalchemy.exc import DBAPIError, ProgrammingError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool
from statement_watch import watched

from ship_sqla import TransactionScope, create_unit_of_work, define_job
from ship_sqla._direct import DirectConnection
from ship_sqla._jobs import (
    JobBackendTimeoutError,
    PostgresJobBackend,
    create_job_backend,
    ship_job_history_table,
    ship_job_runs_table,
    ship_job_state_table,
)
from ship_sqla._jobs._sql import enqueue
from ship_sqla._scope import ALONE_CUT_OFF
from ship_sqla.errors import DatabaseUnavailableError
from ship_sqla.jobs import EnqueueRequest
from ship_sqla.testing import FrozenClock

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

metadata = MetaData()
runs = ship_job_runs_table(metadata)
ship_job_history_table(metadata)  # J16: the default shape create_job_backend() reads
state = ship_job_state_table(metadata)


async def noop(ctx: Any, payload: Any) -> None:
    return None


JOB = define_job("direct.job", noop, payload=dict)
STORED = (
    "job_id, state, payload, key, dedupe_key, attempt, max_attempts, run_at, created_at,"
    " updated_at, history, priority, trace_context, tenant_id"
)


@pytest.fixture
async def engine(ship_engine: AsyncEngine) -> AsyncEngine:
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    return ship_engine


@pytest.fixture
async def one_connection(engine: AsyncEngine) -> AsyncIterator[AsyncEngine]:
    """An engine on the same database whose pool holds exactly one connection."""
    single = create_async_engine(engine.url, pool_size=1, max_overflow=0)
    try:
        yield single
    finally:
        await single.dispose()


ENQUEUES = ("WITH ship_enqueued AS (", "INSERT INTO ship_job_runs (")
"""The first lines of the plain enqueue's statements (announced, and not)."""


def enqueues(statements: list[str]) -> list[str]:
    """The enqueue statements among ``statements`` (first lines): the announcer's post-commit
    sends (K8), timed by the wall clock, are left out."""
    return [line for line in statements if line.startswith(ENQUEUES)]


@pytest.fixture
def direct_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The statements run by the direct path (its first line), in order."""
    calls: list[str] = []
    real_execute, real_fetch = DirectConnection.execute, DirectConnection.fetch

    async def spy_execute(self: DirectConnection, statement: Any, params: Any) -> None:
        calls.append(str(statement).strip().splitlines()[0])
        await real_execute(self, statement, params)

    async def spy_fetch(self: DirectConnection, statement: Any, params: Any) -> Any:
        calls.append(str(statement).strip().splitlines()[0])
        return await real_fetch(self, statement, params)

    monkeypatch.setattr(DirectConnection, "execute", spy_execute)
    monkeypatch.setattr(DirectConnection, "fetch", spy_fetch)
    return calls


def backend_on(engine: AsyncEngine, clock: FrozenClock, **options: Any) -> PostgresJobBackend:
    return create_job_backend(
        database=engine, table=runs, state_table=state, clock=clock, **options
    )


async def stored(engine: AsyncEngine) -> list[tuple[Any, ...]]:
    async with engine.connect() as connection:
        found = await connection.execute(text(f"SELECT {STORED} FROM ship_job_runs ORDER BY seq"))
        return [tuple(row) for row in found]


async def backend_pid(engine: AsyncEngine) -> int:
    async with engine.connect() as connection:
        return int((await connection.execute(text("SELECT pg_backend_pid()"))).scalar_one())


async def test_a_plain_enqueue_outside_a_unit_of_work_runs_on_the_driver_and_stores_the_same(
    engine: AsyncEngine, direct_calls: list[str]
) -> None:
    """The plain enqueue (announced or not, due or delayed, any priority, one or many runs)
    outside a unit of work takes the direct path and stores exactly the rows SQLAlchemy's path
    stores (on a frozen clock: the same times)."""

    async def enqueue_some(clock: FrozenClock) -> None:
        backend = backend_on(engine, clock)
        await backend.enqueue(JOB, {"n": 1})  # the first: announced in its INSERT (K8)
        await backend.enqueue(JOB, {"n": 2}, priority=5)  # may fold or not, by the wall clock
        await backend.enqueue(JOB, {"n": 3}, run_at=clock.now() + timedelta(hours=1))
        clock.advance(timedelta(seconds=1))
        await backend.enqueue_many(JOB, [EnqueueRequest({"n": 4}), EnqueueRequest({"n": 5})])
        await backend.enqueue_many(JOB, [])  # nothing: no statement
        assert backend._announcer is not None
        await backend._announcer.flush()

    await enqueue_some(FrozenClock())
    direct = enqueues(direct_calls)
    assert len(direct) == 4
    assert direct[0] == "WITH ship_enqueued AS ("
    assert direct[2] == "INSERT INTO ship_job_runs ("  # delayed: never announced
    direct_rows = await stored(engine)
    assert len(direct_rows) == 5
    async with engine.begin() as connection:
        await connection.execute(text("DELETE FROM ship_job_runs"))
    with watched(engine) as seen:
        await enqueue_some(FrozenClock())
    assert len(enqueues(direct_calls)) == 4, "a watched engine takes SQLAlchemy's path"
    assert len(enqueues([line.strip().splitlines()[0] for line in seen])) == 4
    assert await stored(engine) == direct_rows


async def test_the_direct_path_sends_the_text_sqlalchemy_sends(
    engine: AsyncEngine, ship_clock: FrozenClock
) -> None:
    """The direct path's SQL is the Core statement compiled by the engine's dialect: the very
    text SQLAlchemy sends for it (announced and plain), parameters in the compiled order."""
    backend = backend_on(engine, ship_clock)
    silent = backend_on(engine, ship_clock, announce=False)
    direct = backend._connections._direct  # what the store compiled
    assert direct is not None
    with watched(engine) as seen:
        await backend.enqueue(JOB, {"n": 1})  # the first: announced in its INSERT (K8)
        await silent.enqueue(JOB, {"n": 2})
        await silent.enqueue_many(JOB, [EnqueueRequest({"n": 3}), EnqueueRequest({"n": 4})])
    announced = direct.compiled(backend.statements[enqueue.ENQUEUE_ONE_ANNOUNCED])
    one = direct.compiled(backend.statements[enqueue.ENQUEUE_ONE])
    plain = direct.compiled(backend.statements[enqueue.ENQUEUE_PLAIN])
    assert announced is not None
    assert one is not None
    assert plain is not None
    assert seen == [announced.sql, one.sql, plain.sql]
    assert set(one.names) == {
        "job_id",
        "now",
        "tenant",
        "id",
        "payload_json",
        "key",
        "run_at",
        "max_attempts",
        "priority",
        "trace_context",
        "handler_version",
    }
    assert "$1" in plain.sql
    assert ":ids" not in plain.sql
    assert set(plain.names) == {
        "job_id",
        "now",
        "tenant",
        "ids",
        "payloads",
        "keys",
        "run_ats",
        "max_attempts",
        "priorities",
        "trace_contexts",
        "handler_version",
    }


async def test_watched_engines_take_sqlalchemys_path(engine: AsyncEngine) -> None:
    """Statement listeners (any of the engine's statement events, or handle_error) and
    statement logging (echo, or the sqlalchemy.engine logger at INFO) each send the statement
    through SQLAlchemy, so they see it; a plain engine takes the direct path."""
    statement = create_job_backend(database=engine).statements[enqueue.ENQUEUE_PLAIN]

    def usable(on: AsyncEngine) -> bool:
        direct = create_job_backend(database=on)._connections._direct  # the store's own
        assert direct is not None
        return direct.usable(statement)

    assert usable(engine)
    for name in (
        "before_cursor_execute",
        "after_cursor_execute",
        "before_execute",
        "after_execute",
        "handle_error",
    ):
        listener = _listener_for(name)
        event.listen(engine.sync_engine, name, listener)
        try:
            assert not usable(engine), name
        finally:
            event.remove(engine.sync_engine, name, listener)
    assert usable(engine)
    echoing = create_async_engine(engine.url, echo=True)
    try:
        assert not usable(echoing)
    finally:
        await echoing.dispose()
    logger = logging.getLogger("sqlalchemy.engine")
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        assert not usable(engine)
    finally:
        logger.setLevel(level)


def _listener_for(name: str) -> Any:
    def listener(*_: Any, **__: Any) -> None:
        return None

    listener.__name__ = f"listen_{name}"
    return listener


async def test_inside_a_unit_of_work_the_enqueue_joins_it_not_the_driver(
    engine: AsyncEngine, ship_clock: FrozenClock, direct_calls: list[str]
) -> None:
    """U1: inside uow.run the enqueue is a statement of the run's transaction (a rollback takes
    it back), never the direct path's own autocommitted one."""
    backend = backend_on(engine, ship_clock)
    uow = create_unit_of_work(engine, repositories=lambda scope: scope)

    async def enqueue_then_fail(scope: TransactionScope) -> None:
        await backend.enqueue(JOB, {"n": 1})
        raise RuntimeError("roll back")

    with pytest.raises(RuntimeError, match="roll back"):
        await uow.run(enqueue_then_fail)
    assert direct_calls == []
    assert await stored(engine) == []


async def test_a_driver_error_is_the_error_sqlalchemy_raises(
    engine: AsyncEngine, ship_clock: FrozenClock, direct_calls: list[str]
) -> None:
    """An error of the statement (here: the runs table does not exist) is what SQLAlchemy's
    path raises: the same sqlalchemy.exc class, the same driver error inside with its SQLSTATE,
    the same statement, parameters and message."""
    missing = MetaData()
    backend = create_job_backend(
        database=engine,
        table=ship_job_runs_table(missing, name="no_such_runs"),
        state_table=ship_job_state_table(missing, name="no_such_state"),
        clock=ship_clock,
        announce=False,  # both calls send the same statement (K8 folds by the wall clock)
    )
    caught: list[DBAPIError] = []
    with pytest.raises(ProgrammingError) as direct:
        await backend.enqueue(JOB, {"n": 1})
    caught.append(direct.value)
    assert len(direct_calls) == 1
    with watched(engine), pytest.raises(ProgrammingError) as through_sqlalchemy:
        await backend.enqueue(JOB, {"n": 1})
    caught.append(through_sqlalchemy.value)
    assert len(direct_calls) == 1
    first, second = caught
    assert type(first.orig) is type(second.orig)
    assert type(first.__cause__) is type(second.__cause__)
    assert type(first.orig.__cause__) is type(second.orig.__cause__)  # asyncpg's own error
    assert getattr(first.orig, "sqlstate", None) == getattr(second.orig, "sqlstate", None)
    assert getattr(first.orig, "sqlstate", None) == "42P01"
    assert first.statement == second.statement
    assert type(first.params) is type(second.params)
    assert len(first.params) == len(second.params)
    assert not first.connection_invalidated
    assert not second.connection_invalidated
    # The message names the statement and the (random) run ids: compare its first line.
    assert str(first).splitlines()[0] == str(second).splitlines()[0]


async def test_a_dead_pooled_connection_is_the_typed_outage_and_is_replaced(
    one_connection: AsyncEngine, ship_clock: FrozenClock, direct_calls: list[str]
) -> None:
    """A pooled connection the server ended (a restart, a terminated backend) fails the next
    enqueue with DatabaseUnavailableError, the invalidated driver error chained, exactly as on
    SQLAlchemy's path; the pool replaces it, so the enqueue after works."""
    backend = backend_on(one_connection, ship_clock)
    failures: list[DatabaseUnavailableError] = []
    for path in ("direct", "sqlalchemy"):
        await backend.enqueue(JOB, {"n": 0})
        dead = await backend_pid(one_connection)
        await _terminate(one_connection, dead)
        calls = len(direct_calls)
        with _watched_if(one_connection, path):
            with pytest.raises(DatabaseUnavailableError) as raised:
                await backend.enqueue(JOB, {"n": 1})
            failures.append(raised.value)
            await backend.enqueue(JOB, {"n": 2})
        assert len(direct_calls) - calls == (2 if path == "direct" else 0)
        assert await backend_pid(one_connection) != dead
    # What the driver says after that depends on when the event loop saw the socket close
    # (asyncpg: "connection is closed", or an operation cut off); the outage is the same.
    expected = (
        f"job backend enqueue ({ALONE_CUT_OFF}) failed: the database is unavailable"
        " (the connection was closed): "
    )
    for failure in failures:
        assert failure.message.startswith(expected), failure.message
        assert isinstance(failure.__cause__, DBAPIError)
        assert failure.__cause__.connection_invalidated
        assert failure.code == "SHIP_SQLA_DATABASE_UNAVAILABLE"


async def test_a_timed_out_enqueue_is_the_timeout_error_and_its_connection_discarded(
    one_connection: AsyncEngine, ship_clock: FrozenClock, direct_calls: list[str]
) -> None:
    """J11: an enqueue that cannot finish (the runs table is locked) ends with
    JobBackendTimeoutError after operation_timeout, on either path; the interrupted connection
    is discarded (as SQLAlchemy discards a connection whose statement was cancelled), and the
    next enqueue works on a new one."""
    backend = backend_on(one_connection, ship_clock, operation_timeout=0.5)
    # A new connection's first statement (connect, type introspection) may take a while on a
    # busy machine: only the blocked enqueue goes through the backend with the short timeout.
    patient = backend_on(one_connection, ship_clock)
    for path in ("direct", "sqlalchemy"):
        await patient.enqueue(JOB, {"n": 0})
        before = await backend_pid(one_connection)
        calls = len(direct_calls)
        async with _locked_runs_table(one_connection):
            with (
                _watched_if(one_connection, path),
                anyio.fail_after(10),
                pytest.raises(JobBackendTimeoutError),
            ):
                await backend.enqueue(JOB, {"n": 1})
        assert len(direct_calls) - calls == (1 if path == "direct" else 0)
        assert await backend_pid(one_connection) != before, f"{path}: connection kept"
    await patient.enqueue(JOB, {"n": 2})
    # The two timed-out inserts may or may not have happened (ALONE_CUT_OFF): not counted.
    assert len(await stored(one_connection)) >= 3


def _watched_if(engine: AsyncEngine, path: str) -> AbstractContextManager[object]:
    """``watched(engine)`` for SQLAlchemy's path, nothing for the direct one."""
    return watched(engine) if path == "sqlalchemy" else nullcontext()


async def _terminate(engine: AsyncEngine, pid: int) -> None:
    killer = create_async_engine(engine.url, poolclass=NullPool)
    try:
        async with killer.connect() as connection:
            await connection.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
            await connection.commit()
        # Let the event loop see the closed socket as a restart's clients would.
        for _ in range(20):
            await asyncio.sleep(0)
    finally:
        await killer.dispose()


class _locked_runs_table:  # noqa: N801 - used as a context manager
    """The runs table locked ACCESS EXCLUSIVE by another engine's transaction, for the block."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._blocker = create_async_engine(engine.url)
        self._connection: Any = None

    async def __aenter__(self) -> None:
        self._connection = await self._blocker.connect()
        await self._connection.execute(text("LOCK TABLE ship_job_runs IN ACCESS EXCLUSIVE MODE"))

    async def __aexit__(self, *_: object) -> None:
        await self._connection.rollback()
        await self._connection.close()
        await self._blocker.dispose()
