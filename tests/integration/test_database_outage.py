"""A database outage is ONE typed error (issue #10 item 7), on real PostgreSQL.

"Refused" is an engine on a port of 127.0.0.1 that nothing listens on. "Lost" is
``pg_terminate_backend`` of one connection's backend from another connection (it waits until
the backend is gone): the shared server itself is never stopped or restarted, only the test's
own sessions are ended.
"""

from __future__ import annotations

import base64
import json
import logging
import socket
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from job_helpers import claim_request
from sqlalchemy import Column, Integer, MetaData, Table, func, insert, select, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from ship_sqla import (
    TransactionScope,
    advisory_lock_provider,
    create_idempotency_store,
    create_job_backend,
    create_outbox,
    create_unit_of_work,
    create_webhook_event_store,
    define_job,
    ship_idempotency_table,
    ship_job_runs_table,
    ship_job_state_table,
    ship_outbox_table,
    ship_webhook_events_table,
)
from ship_sqla.asgi import WebhookEndpoint, WebhookReceiver
from ship_sqla.errors import DatabaseUnavailableError, ShipError
from ship_sqla.jobs import Concurrency
from ship_sqla.webhooks import webhook_headers

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

metadata = MetaData()
notes = Table("outage_notes", metadata, Column("id", Integer, primary_key=True))
outbox_table = ship_outbox_table(metadata)
idempotency_table = ship_idempotency_table(metadata)
webhook_table = ship_webhook_events_table(metadata)
runs = ship_job_runs_table(metadata)
state = ship_job_state_table(metadata)


async def _noop(ctx: Any, payload: Any) -> None:
    pass


JOB = define_job("outage.job", _noop, payload=dict, concurrency=Concurrency(max=1, lease=30))


def scope_only(scope: TransactionScope) -> TransactionScope:
    return scope


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
async def refused() -> AsyncIterator[AsyncEngine]:
    """An engine whose every connect is refused (nothing listens on its port)."""
    engine = create_async_engine(f"postgresql+asyncpg://postgres@127.0.0.1:{_free_port()}/none")
    yield engine
    await engine.dispose()


@pytest.fixture
async def pooled(ship_engine: AsyncEngine, ship_engine_url: str) -> AsyncIterator[AsyncEngine]:
    """A one-connection pool without pre-ping: a connection the server closed stays in it."""
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    engine = create_async_engine(ship_engine_url, pool_size=1, max_overflow=0)
    yield engine
    await engine.dispose()


async def terminate(admin: AsyncEngine, pid: int) -> None:
    """End backend ``pid`` and wait (up to 5 s) until it is gone."""
    async with admin.connect() as connection:
        ended = await connection.execute(
            text("SELECT pg_terminate_backend(:pid, 5000)"), {"pid": pid}
        )
        assert ended.scalar_one() is True


async def backend_pid(scope: TransactionScope) -> int:
    return int((await scope.connection.execute(text("SELECT pg_backend_pid()"))).scalar_one())


async def count_notes(admin: AsyncEngine) -> int:
    async with admin.connect() as connection:
        counted = await connection.execute(select(func.count()).select_from(notes))
        return int(counted.scalar_one())


# -- refused ----------------------------------------------------------------------------------


async def test_a_refused_connection_is_the_typed_error_with_its_cause(
    refused: AsyncEngine,
) -> None:
    """U1 (outage): uow.run on a database that refuses connections raises
    DatabaseUnavailableError (code SHIP_SQLA_DATABASE_UNAVAILABLE, a ConnectionError too), the
    driver's ConnectionRefusedError chained; the handler never runs, nothing is re-run."""
    calls: list[int] = []

    async def handler(scope: TransactionScope) -> None:
        calls.append(1)

    uow = create_unit_of_work(refused, repositories=scope_only)
    with pytest.raises(DatabaseUnavailableError) as raised:
        await uow.run(handler)
    error = raised.value
    assert error.code == "SHIP_SQLA_DATABASE_UNAVAILABLE"
    assert isinstance(error, ShipError)
    assert isinstance(error, ConnectionError)
    assert isinstance(error.__cause__, ConnectionRefusedError)
    assert "uow.run" in error.message
    assert error.fix
    assert calls == []


def _store_calls(engine: AsyncEngine) -> dict[str, Callable[[], Awaitable[object]]]:
    outbox = create_outbox(database=engine, table=outbox_table)
    idempotency = create_idempotency_store(database=engine, table=idempotency_table)
    webhooks = create_webhook_event_store(
        database=engine,
        table=webhook_table,
        outbox_table=outbox_table,
        idempotency_table=idempotency_table,
    )
    jobs = create_job_backend(database=engine, table=runs, state_table=state)
    locks = advisory_lock_provider(engine)
    return {
        "outbox enqueue": lambda: outbox.enqueue("orders", "order.placed", {"id": 1}),
        "outbox claim": lambda: outbox.claim("orders", 10, 30.0),
        "idempotency begin": lambda: idempotency.begin("key-1", "fp"),
        "idempotency get": lambda: idempotency.get("key-1"),
        "webhook record": lambda: webhooks.record("stripe", "evt_1", {"id": 1}),
        "job enqueue": lambda: jobs.enqueue(JOB, {"n": 1}),
        "job claim": lambda: jobs.claim(claim_request(JOB, worker="w")),
        "job get_run": lambda: jobs.admin.get_run("no-such-run"),
        "advisory lock acquire": lambda: locks.acquire("k", 30.0),
    }


@pytest.mark.parametrize(
    "call",
    [
        "outbox enqueue",
        "outbox claim",
        "idempotency begin",
        "idempotency get",
        "webhook record",
        "job enqueue",
        "job claim",
        "job get_run",
        "advisory lock acquire",
    ],
)
async def test_every_store_raises_the_typed_error_on_a_refused_connection(
    refused: AsyncEngine, call: str
) -> None:
    """U2 (outage): outside a unit of work every store opens its own connection; refused, it
    raises DatabaseUnavailableError with the driver's error chained, never a bare OSError."""
    with pytest.raises(DatabaseUnavailableError) as raised:
        await _store_calls(refused)[call]()
    assert isinstance(raised.value.__cause__, OSError)
    assert not isinstance(raised.value.__cause__, DatabaseUnavailableError)


# -- lost -------------------------------------------------------------------------------------


async def test_a_pooled_connection_dead_before_the_first_statement_is_retried_once(
    pooled: AsyncEngine, ship_engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    """U3 (outage): after a server-side end of the pooled connection (as after a restart),
    the next run fails on its first statement and is re-run once on a fresh connection: it
    succeeds, and its write commits exactly once."""
    uow = create_unit_of_work(pooled, repositories=scope_only)
    dead_pid = await uow.run(backend_pid)
    await terminate(ship_engine, dead_pid)
    pids: list[int] = []

    async def write(scope: TransactionScope) -> int:
        pids.append(await backend_pid(scope))  # the first statement: fails on the dead one
        await scope.connection.execute(insert(notes).values(id=1))
        return pids[-1]

    with caplog.at_level(logging.WARNING, logger="ship_sqla"):
        fresh_pid = await uow.run(write)
    assert fresh_pid != dead_pid
    assert pids == [fresh_pid], "the handler's first statement never completed on the dead one"
    assert await count_notes(ship_engine) == 1
    assert "re-running once on a fresh connection" in caplog.text


async def test_a_run_whose_statement_completed_is_never_rerun(
    pooled: AsyncEngine, ship_engine: AsyncEngine
) -> None:
    """U3 (outage): once a statement of the run completed, a lost connection is
    DatabaseUnavailableError, not a re-run: the handler ran once and nothing committed."""
    uow = create_unit_of_work(pooled, repositories=scope_only)
    calls: list[int] = []

    async def dies_midway(scope: TransactionScope) -> None:
        calls.append(1)
        await scope.connection.execute(insert(notes).values(id=1))
        await terminate(ship_engine, await backend_pid(scope))
        await scope.connection.execute(insert(notes).values(id=2))

    with pytest.raises(DatabaseUnavailableError) as raised:
        await uow.run(dies_midway)
    assert calls == [1]
    assert raised.value.__cause__ is not None
    assert await count_notes(ship_engine) == 0
    # The pool recovers: the next run gets a fresh connection.
    assert await uow.run(backend_pid) > 0


async def test_a_server_ending_the_session_mid_statement_is_the_typed_error(
    pooled: AsyncEngine,
) -> None:
    """U3 (outage): a statement the server ends with 'terminating connection due to
    administrator command' (SQLSTATE 57P01) after an earlier statement completed raises
    DatabaseUnavailableError from the driver's error, and is not re-run."""
    uow = create_unit_of_work(pooled, repositories=scope_only)
    calls: list[int] = []

    async def ends_itself(scope: TransactionScope) -> None:
        calls.append(1)
        await scope.connection.execute(text("SELECT 1"))
        await scope.connection.execute(text("SELECT pg_terminate_backend(pg_backend_pid())"))

    with pytest.raises(DatabaseUnavailableError, match="database is unavailable") as raised:
        await uow.run(ends_itself)
    assert calls == [1]
    assert "administrator command" in str(raised.value.__cause__)


async def test_a_commit_cut_off_says_its_outcome_is_unknown(
    pooled: AsyncEngine, ship_engine: AsyncEngine
) -> None:
    """U4 (outage): a connection lost at COMMIT raises DatabaseUnavailableError saying the
    work may or may not have committed, is not re-run, and runs no after_commit callback."""
    uow = create_unit_of_work(pooled, repositories=scope_only)
    ran: list[str] = []

    async def lost_before_commit(scope: TransactionScope) -> None:
        await scope.connection.execute(insert(notes).values(id=1))
        scope.after_commit(lambda: ran.append("after_commit"))
        await terminate(ship_engine, await backend_pid(scope))

    with pytest.raises(DatabaseUnavailableError, match="may or may not have committed"):
        await uow.run(lost_before_commit)
    assert ran == []


async def test_a_store_inside_a_run_raises_the_typed_error_once_the_connection_is_lost(
    pooled: AsyncEngine, ship_engine: AsyncEngine
) -> None:
    """I1/U1 (outage): a store joined to a run whose connection was lost raises
    DatabaseUnavailableError (the run is not re-run: a statement had completed)."""
    store = create_idempotency_store(database=pooled, table=idempotency_table)
    uow = create_unit_of_work(pooled, repositories=scope_only)
    calls: list[int] = []

    async def claim(scope: TransactionScope) -> object:
        calls.append(1)
        await terminate(ship_engine, await backend_pid(scope))
        return await store.begin("key-1", "fp")

    with pytest.raises(DatabaseUnavailableError, match="idempotency begin"):
        await uow.run(claim)
    assert calls == [1]


async def test_an_application_oserror_in_a_handler_is_not_an_outage(pooled: AsyncEngine) -> None:
    """U1: the handler's own exceptions are re-raised unchanged, OSErrors included (its network
    calls are not the database)."""
    uow = create_unit_of_work(pooled, repositories=scope_only)

    async def calls_out(scope: TransactionScope) -> None:
        await scope.connection.execute(text("SELECT 1"))
        raise ConnectionRefusedError(111, "the payment API refused")

    with pytest.raises(ConnectionRefusedError, match="payment API") as raised:
        await uow.run(calls_out)
    assert not isinstance(raised.value, DatabaseUnavailableError)


async def test_the_webhook_receiver_answers_503_during_an_outage(
    refused: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    """U1 (outage): a verified delivery that cannot be recorded because the database is
    unavailable is answered 503 with the outage's code (the sender retries), and logged."""
    secret = "whsec_" + base64.b64encode(b"s" * 32).decode()
    idempotency = create_idempotency_store(database=refused, table=idempotency_table)
    receiver = WebhookReceiver(
        endpoints=[WebhookEndpoint("stripe", secrets=secret)],
        events=create_webhook_event_store(
            database=refused,
            table=webhook_table,
            outbox_table=outbox_table,
            idempotency_table=idempotency_table,
        ),
        idempotency=idempotency,
        outbox=create_outbox(database=refused, table=outbox_table),
    )
    body = json.dumps({"type": "invoice.paid"}).encode()
    headers = webhook_headers(secret, "evt_1", datetime.now(UTC), body)
    transport = httpx.ASGITransport(app=receiver)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        response = await client.post("/webhooks/stripe", content=body, headers=headers)
    assert response.status_code == 503
    assert response.json()["code"] == "SHIP_SQLA_DATABASE_UNAVAILABLE"
    assert "127.0.0.1" not in response.text, "the answer does not name our database"
    assert "answering 503" in caplog.text
