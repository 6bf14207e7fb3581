"""Operation timeouts against a server that stops answering (J24, issue #34 item 3).

The server "stops answering" through :class:`~pausable_proxy.PausableProxy`: every byte held
in both directions, sockets kept open, as a SIGSTOPped node or a network partition looks to a
client. The shared server itself is never stopped.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from pausable_proxy import PausableProxy
from sqlalchemy import Column, Integer, MetaData, Table, func, insert, select
from sqlalchemy.engine import make_url
from wake_helpers import Errors

from ship_sqla import (
    TransactionScope,
    create_engine,
    create_outbox,
    create_unit_of_work,
    ship_outbox_table,
)
from ship_sqla._outbox import OutboxMessage, start_outbox_relay
from ship_sqla.errors import OutboxTimeoutError, UnitOfWorkTimeoutError

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from sqlalchemy.ext.asyncio import AsyncEngine

metadata = MetaData()
notes = Table("timeout_notes", metadata, Column("id", Integer, primary_key=True))
outbox_table = ship_outbox_table(metadata)

BOUND = 0.5
"""The operation_timeout of these tests (seconds)."""


@pytest.fixture
async def proxied(ship_engine: AsyncEngine, ship_engine_url: str) -> AsyncIterator[Any]:
    """(proxy, an engine through it); the tables made directly."""
    async with ship_engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    parsed = make_url(ship_engine_url)
    async with PausableProxy(parsed.host or "127.0.0.1", parsed.port or 5432) as proxy:
        engine = create_engine(proxy.url_for(ship_engine_url))
        try:
            yield proxy, engine
        finally:
            proxy.resume()
            await engine.dispose()


def scope_only(scope: TransactionScope) -> TransactionScope:
    return scope


async def test_the_relay_reports_a_server_that_stops_answering_and_resumes(
    proxied: Any, ship_engine: AsyncEngine
) -> None:
    """J24, J11: a relay whose server stops answering reports OutboxTimeoutError (a typed
    error with a Fix line) every ``operation_timeout`` instead of hanging silently, and
    delivers again once the server answers, with no restart."""
    proxy, engine = proxied
    outbox = create_outbox(database=engine, table=outbox_table, operation_timeout=BOUND)
    producer = create_outbox(database=ship_engine, table=outbox_table)
    delivered: list[OutboxMessage] = []
    arrived = [anyio.Event(), anyio.Event()]
    errors = Errors()

    async def sink(message: OutboxMessage) -> None:
        delivered.append(message)
        arrived[len(delivered) - 1].set()

    relay = await start_outbox_relay(
        outbox, "o", sink, poll_interval=0.05, listen=False, on_error=errors
    )
    async with relay:
        await producer.enqueue("o", "t", {"n": 1})
        with anyio.fail_after(15):
            await arrived[0].wait()
        proxy.pause()
        await producer.enqueue("o", "t", {"n": 2})
        started = time.monotonic()
        await errors.wait_for(OutboxTimeoutError, count=2, within=15)
        assert time.monotonic() - started < 10
        timeout = errors.of(OutboxTimeoutError)[0]
        assert isinstance(timeout, OutboxTimeoutError)
        assert timeout.fix
        proxy.resume()
        with anyio.fail_after(15):
            await arrived[1].wait()


async def test_a_settle_against_a_server_that_stops_answering_times_out(
    proxied: Any, ship_engine: AsyncEngine
) -> None:
    """J24: an outbox settle (here a relay's complete) on a server that stopped answering ends
    with OutboxTimeoutError after ``operation_timeout``; once it answers, the same settle
    lands (it is fenced, O3, so retrying it is safe)."""
    proxy, engine = proxied
    outbox = create_outbox(database=engine, table=outbox_table, operation_timeout=BOUND)
    await outbox.enqueue("o", "t", {"n": 1})
    [message] = await outbox.claim("o", 10, 30.0)
    proxy.pause()
    with anyio.fail_after(10), pytest.raises(OutboxTimeoutError) as caught:
        await outbox.complete(message)
    assert caught.value.code == "SHIP_SQLA_OUTBOX_TIMEOUT"
    proxy.resume()
    with anyio.fail_after(15):
        assert await outbox.complete(message) == "delivered"


async def _count(engine: AsyncEngine) -> int:
    async with engine.connect() as connection:
        return int(await connection.scalar(select(func.count()).select_from(notes)) or 0)


async def test_a_statement_of_uow_run_against_a_silent_server_times_out(
    proxied: Any, ship_engine: AsyncEngine
) -> None:
    """J24: a statement of ``uow.run`` that the server never answers ends the run with
    UnitOfWorkTimeoutError after ``operation_timeout`` (nothing committed, the connection
    dropped); the next run works once the server answers."""
    proxy, engine = proxied
    uow = create_unit_of_work(engine, repositories=scope_only, operation_timeout=BOUND)

    async def two_writes(scope: TransactionScope) -> None:
        await scope.connection.execute(insert(notes))
        proxy.pause()
        await scope.connection.execute(insert(notes))

    with anyio.fail_after(10), pytest.raises(UnitOfWorkTimeoutError) as caught:
        await uow.run(two_writes)
    assert "a statement was cut off: nothing of it committed" in caught.value.message
    assert caught.value.fix
    proxy.resume()
    assert await _count(ship_engine) == 0

    async def one_write(scope: TransactionScope) -> None:
        await scope.connection.execute(insert(notes))

    with anyio.fail_after(15):
        await uow.run(one_write)
    assert await _count(ship_engine) == 1


async def test_a_cut_off_commit_of_uow_run_says_its_outcome_is_unknown(proxied: Any) -> None:
    """J24: a COMMIT the server never answers ends the run with UnitOfWorkTimeoutError after
    ``operation_timeout``, saying the work may or may not have committed."""
    proxy, engine = proxied
    uow = create_unit_of_work(engine, repositories=scope_only, operation_timeout=BOUND)

    async def write_then_go_silent(scope: TransactionScope) -> None:
        await scope.connection.execute(insert(notes))
        proxy.pause()

    with anyio.fail_after(10), pytest.raises(UnitOfWorkTimeoutError) as caught:
        await uow.run(write_then_go_silent)
    assert "COMMIT was cut off" in caught.value.message


async def test_the_handlers_own_time_is_not_an_operation(proxied: Any) -> None:
    """J24: the bound is per statement, not a deadline for the run: a handler that spends
    longer than ``operation_timeout`` between two statements (its own work) commits."""
    _, engine = proxied
    uow = create_unit_of_work(engine, repositories=scope_only, operation_timeout=0.2)

    async def slow_handler(scope: TransactionScope) -> None:
        await scope.connection.execute(insert(notes))
        await anyio.sleep(0.5)  # the handler's own work, longer than the bound
        await scope.connection.execute(insert(notes))

    with anyio.fail_after(10):
        await uow.run(slow_handler)
