"""Following the primary (J24, issue #34), on the shared server without stopping it.

A hanging host is a port that accepts TCP connections and never answers (``silent_port``). A
server that turned read-only is a session given ``default_transaction_read_only = on``, which
PostgreSQL reports to the client exactly as it reports a standby or a primary made read-only
by a switchover; a database with that default stands for a cluster with no writable host. The
real primary + standby cluster (kill, SIGSTOP, promote) is the chaos suite's.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import anyio
import asyncpg
import pytest
from job_helpers import claim_request
from pausable_proxy import silent_port
from sqlalchemy import Column, Integer, MetaData, Table, event, insert, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from wake_helpers import Errors

from ship_sqla import (
    TransactionScope,
    create_engine,
    create_job_backend,
    create_unit_of_work,
    define_job,
    ship_job_runs_table,
    ship_job_state_table,
)
from ship_sqla._notify import listener_for
from ship_sqla.errors import DatabaseUnavailableError
from ship_sqla.jobs import Concurrency

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

metadata = MetaData()
notes = Table("failover_notes", metadata, Column("id", Integer, primary_key=True))
runs = ship_job_runs_table(metadata)
state = ship_job_state_table(metadata)


async def _noop(ctx: Any, payload: Any) -> None:
    pass


JOB = define_job("failover.job", _noop, payload=dict, concurrency=Concurrency(max=1, lease=30))
FREE = define_job("failover.free", _noop, payload=dict)


def scope_only(scope: TransactionScope) -> TransactionScope:
    return scope


def multi_host_url(url: str, *hosts: str, attrs: str = "read-write") -> str:
    """``url``'s database through the multi-host form J24 documents."""
    parsed = make_url(url)
    user = parsed.username or ""
    if parsed.password:
        user += f":{parsed.password}"
    query = "&".join(f"host={host}" for host in hosts)
    return f"postgresql+asyncpg://{user}@/{parsed.database}?{query}&target_session_attrs={attrs}"


def server_of(url: str) -> str:
    parsed = make_url(url)
    return f"{parsed.host or '127.0.0.1'}:{parsed.port or 5432}"


@pytest.fixture
async def tables(ship_engine: AsyncEngine) -> AsyncEngine:
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    return ship_engine


async def _insert(scope: TransactionScope) -> int:
    connection = scope.connection
    await connection.execute(insert(notes))
    return int(await connection.scalar(text("SELECT pg_backend_pid()")) or 0)


async def test_a_hanging_first_host_costs_one_bounded_attempt(
    tables: AsyncEngine, ship_engine_url: str
) -> None:
    """J24: with a multi-host URL whose first host hangs (accepts TCP, never answers: a
    partition or a SIGSTOPped node), a connect tries the next host after
    ``host_connect_timeout`` instead of spending asyncpg's whole connect timeout on the first;
    the host that accepted is tried first afterwards, so later connects pay nothing."""
    with silent_port() as hung:
        url = multi_host_url(ship_engine_url, f"127.0.0.1:{hung}", server_of(ship_engine_url))
        engine = create_engine(url, host_connect_timeout=0.5, pool_size=1)
        try:
            uow = create_unit_of_work(engine, repositories=scope_only)
            started = time.monotonic()
            with anyio.fail_after(10):
                await uow.run(_insert)
            first = time.monotonic() - started
            await engine.dispose()  # the next run connects afresh
            started = time.monotonic()
            with anyio.fail_after(10):
                await uow.run(_insert)
            again = time.monotonic() - started
        finally:
            await engine.dispose()
    assert 0.5 <= first < 5
    assert again < 0.5


async def test_an_engine_built_elsewhere_follows_once_a_store_is_given_it(
    tables: AsyncEngine, ship_engine_url: str
) -> None:
    """J24: an engine the application built with ``create_async_engine`` gets the bounded
    per-host connect as soon as a ship store (here the job backend) is built on it."""
    with silent_port() as hung:
        url = multi_host_url(ship_engine_url, f"127.0.0.1:{hung}", server_of(ship_engine_url))
        engine = create_async_engine(url, connect_args={"timeout": 30})
        try:
            backend = create_job_backend(database=engine, table=runs, state_table=state)
            with anyio.fail_after(15):
                await backend.enqueue(JOB, {"n": 1})
        finally:
            await engine.dispose()


async def test_a_listener_connects_past_a_hanging_first_host(
    tables: AsyncEngine, ship_engine_url: str
) -> None:
    """J24, K1: a worker's or relay's LISTEN connection, made from the engine's multi-host URL,
    tries the hosts the same bounded way, so it goes live past a hanging first host (its
    connect is bounded by IO_TIMEOUT, which the hanging host alone would use up)."""
    with silent_port() as hung:
        url = multi_host_url(ship_engine_url, f"127.0.0.1:{hung}", server_of(ship_engine_url))
        engine = create_async_engine(url)
        errors = Errors()
        try:
            listener = listener_for(engine, True, name="failover test", report_error=errors)
            assert listener is not None
            subscription = listener.subscribe("ship_sqla.failover_test", lambda _payload: None)
            try:
                with anyio.fail_after(15):
                    await listener.wait_live()
            finally:
                await subscription.close()
        finally:
            await engine.dispose()
    assert list(errors) == []


async def _read_only_pooled(engine: AsyncEngine) -> int:
    """Leave the engine's one pooled connection on a server session that reports itself
    read-only (as a demoted primary does); returns its backend pid."""
    async with engine.connect() as connection:
        await connection.execute(text("SET default_transaction_read_only = on"))
        await connection.commit()
        return int(await connection.scalar(text("SELECT pg_backend_pid()")) or 0)


async def _read_then_insert(scope: TransactionScope) -> int:
    await scope.connection.execute(select(notes.c.id).limit(1))
    return await _insert(scope)


async def test_a_connection_on_a_read_only_server_is_dropped_and_the_pool_reconnects(
    tables: AsyncEngine, ship_engine_url: str
) -> None:
    """J24: a write refused with SQLSTATE 25006 on a server that reports itself read-only is
    DatabaseUnavailableError with a Fix naming the multi-host URL, its connection is
    invalidated, and the next run gets a new connection (no restart). A run whose FIRST
    statement met it is re-run on a fresh connection at once (nothing of it could commit)."""
    engine = create_engine(ship_engine_url, pool_size=1, max_overflow=0)
    try:
        uow = create_unit_of_work(engine, repositories=scope_only)
        stale = await _read_only_pooled(engine)
        with anyio.fail_after(10), pytest.raises(DatabaseUnavailableError) as caught:
            await uow.run(_read_then_insert)
        assert "read-only" in caught.value.message
        assert "25006" in caught.value.message
        assert "target_session_attrs=read-write" in (caught.value.fix or "")
        with anyio.fail_after(10):
            assert await uow.run(_insert) != stale

        stale = await _read_only_pooled(engine)
        with anyio.fail_after(10):
            assert await uow.run(_insert) != stale  # the first statement: re-run transparently
    finally:
        await engine.dispose()


async def test_the_direct_path_drops_a_read_only_connection_too(
    tables: AsyncEngine, ship_engine_url: str
) -> None:
    """J24: a store's own statement on the direct asyncpg path (a job enqueue outside a unit
    of work) that meets a read-only server is DatabaseUnavailableError and drops the
    connection: the next enqueue lands on a new one."""
    engine = create_engine(ship_engine_url, pool_size=1, max_overflow=0)
    try:
        backend = create_job_backend(database=engine, table=runs, state_table=state)
        await _read_only_pooled(engine)
        with anyio.fail_after(10), pytest.raises(DatabaseUnavailableError) as caught:
            await backend.enqueue(JOB, {"n": 1})
        assert "read-only" in caught.value.message
        with anyio.fail_after(10):
            await backend.enqueue(JOB, {"n": 2})
    finally:
        await engine.dispose()


async def test_a_read_only_transaction_of_the_application_keeps_its_connection(
    tables: AsyncEngine,
) -> None:
    """J24: a 25006 in a transaction the application itself began READ ONLY (the server
    reports both read-only settings off) is the application's error, unchanged, and its
    connection stays in the pool."""
    engine = tables

    async def read_only_write(scope: TransactionScope) -> None:
        await scope.connection.execute(text("SET TRANSACTION READ ONLY"))
        await _insert(scope)

    uow = create_unit_of_work(engine, repositories=scope_only)
    with pytest.raises(DBAPIError) as caught:
        await uow.run(read_only_write)
    assert not isinstance(caught.value, DatabaseUnavailableError)
    assert "read-only transaction" in str(caught.value)


@pytest.fixture
async def read_only_database(tables: AsyncEngine, ship_engine_url: str) -> AsyncIterator[str]:
    """The test database, made read-only for every new session (no writable host)."""
    name = make_url(ship_engine_url).database
    await tables.dispose()
    admin = await asyncpg.connect(
        make_url(ship_engine_url).set(drivername="postgresql").render_as_string(False)
    )
    try:
        await admin.execute(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
        yield ship_engine_url
    finally:
        await admin.execute(f'ALTER DATABASE "{name}" RESET default_transaction_read_only')
        await admin.close()


@pytest.mark.parametrize("hosts", [1, 2])
async def test_no_writable_host_is_database_unavailable(
    read_only_database: str, hosts: int
) -> None:
    """J24: when every host answers but none accepts writes, asyncpg's "None of the hosts
    match the target attribute requirement" (a raw InternalError before) is
    DatabaseUnavailableError with a Fix line, for one host and for several."""
    server = server_of(read_only_database)
    engine = create_engine(multi_host_url(read_only_database, *[server] * hosts))
    try:
        uow = create_unit_of_work(engine, repositories=scope_only)
        with anyio.fail_after(10), pytest.raises(DatabaseUnavailableError) as caught:
            await uow.run(_insert)
    finally:
        await engine.dispose()
    assert "no host of the URL accepts writes" in caught.value.message
    assert "target_session_attrs=read-write" in (caught.value.fix or "")


async def test_synchronous_claims_keep_the_servers_synchronous_commit(
    tables: AsyncEngine,
) -> None:
    """J24: by default a claim commits with synchronous_commit=off (``:tuned``);
    ``create_job_backend(synchronous_claims=True)`` keeps the server's own setting, so under
    synchronous replication an acknowledged claim survives a failover."""
    tuned: list[bool] = []

    def spy(_conn: Any, _clause: Any, multiparams: Any, params: Any, _options: Any) -> None:
        given = [*(multiparams or ()), params]
        tuned.extend(p["tuned"] for p in given if isinstance(p, dict) and "tuned" in p)

    # A statement listener: every statement takes SQLAlchemy's path, where it sees them.
    event.listen(tables.sync_engine, "before_execute", spy)
    try:
        for synchronous in (False, True):
            backend = create_job_backend(
                database=tables, table=runs, state_table=state, synchronous_claims=synchronous
            )
            assert backend.synchronous_claims is synchronous
            await backend.enqueue(FREE, {"n": 1})
            assert len(await backend.claim(claim_request(FREE, worker="w", limit=1))) == 1
    finally:
        event.remove(tables.sync_engine, "before_execute", spy)
    assert tuned == [True, False]
