"""The direct path keeps a connection whose statement ended cleanly until the event loop's next
turn (``ship_sqla._direct.DirectStatements.keep``): back-to-back statements share one checkout;
the pool gets it back at the next turn, at once when a pool listener watches checkouts or the
pool is not a ``QueuePool``, never after an error, and a kept connection of a disposed engine
is closed, not handed out or left open in the old pool."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import pytest
from sqlalchemy import event, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from ship_sqla._direct import DirectStatements
from ship_sqla._scope import _checked_out

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from ship_sqla._direct import DirectConnection

PID = text("SELECT pg_backend_pid() AS pid")
DIVIDE_BY_ZERO = text("SELECT 1 / 0")


@pytest.fixture
async def engine(ship_engine_url: str) -> AsyncIterator[AsyncEngine]:
    """An engine of the test's own (its pool counts only this test's connections)."""
    own = create_async_engine(ship_engine_url)
    try:
        yield own
    finally:
        await own.dispose()


async def pid_of(connection: DirectConnection) -> int:
    [row] = await connection.fetch(PID, {})
    return int(row["pid"])


async def test_back_to_back_statements_share_one_checkout_until_the_next_turn(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three statements in one turn of the loop (no other task runs between them): one pool
    checkout, one backend; at the next turn the pool has it back, and the next statement checks
    out again."""
    statements = DirectStatements(engine)
    checkouts: list[int] = []
    real = AsyncEngine.raw_connection

    async def counted(self: AsyncEngine) -> Any:
        checkouts.append(1)
        return await real(self)

    monkeypatch.setattr(AsyncEngine, "raw_connection", counted)
    pool: Any = engine.sync_engine.pool
    pids = []
    for _ in range(3):
        async with _checked_out(statements, "test") as connection:
            pids.append(await pid_of(connection))
    assert len(set(pids)) == 1
    assert len(checkouts) == 1
    assert pool.checkedout() == 1  # kept for this turn
    await asyncio.sleep(0)  # the loop's next turn: given back
    assert pool.checkedout() == 0
    async with _checked_out(statements, "test") as connection:
        await pid_of(connection)
    assert len(checkouts) == 2


async def test_a_watched_pool_or_a_pool_that_is_no_queue_gets_each_connection_back_at_once(
    engine: AsyncEngine, ship_engine_url: str
) -> None:
    """A ``checkout`` listener sees every statement's checkout (none is skipped by keeping the
    connection); a ``NullPool`` closes each connection as SQLAlchemy's path would."""
    seen: list[object] = []
    event.listen(engine.sync_engine.pool, "checkout", lambda *_: seen.append(1))
    statements = DirectStatements(engine)
    pool: Any = engine.sync_engine.pool
    for _ in range(2):
        async with _checked_out(statements, "test") as connection:
            await pid_of(connection)
        assert pool.checkedout() == 0
    assert len(seen) == 2

    unpooled = create_async_engine(ship_engine_url, poolclass=NullPool)
    try:
        statements = DirectStatements(unpooled)
        pids = []
        for _ in range(2):
            async with _checked_out(statements, "test") as connection:
                pids.append(await pid_of(connection))
        assert pids[0] != pids[1]
    finally:
        await unpooled.dispose()


async def test_a_connection_whose_statement_failed_goes_back_at_once(engine: AsyncEngine) -> None:
    """J11 (the backend recovers from a failed statement): an error (here the server's division
    by zero) returns the connection to the pool at once, never kept for the next statement."""
    statements = DirectStatements(engine)
    pool: Any = engine.sync_engine.pool
    with pytest.raises(Exception, match="division by zero"):
        async with _checked_out(statements, "test") as connection:
            await connection.fetch(DIVIDE_BY_ZERO, {})
    assert pool.checkedout() == 0


async def test_a_kept_connection_of_a_disposed_engine_is_closed(engine: AsyncEngine) -> None:
    """J11 (a restart's dispose leaves no stale connection behind): ``engine.dispose()`` in the
    same turn as the statement (the pool had no idle connection
    to close, so the turn did not end): the next statement does not get the old pool's
    connection, and one nobody takes is closed at the next turn instead of staying open in the
    old pool."""
    statements = DirectStatements(engine)
    async with _checked_out(statements, "test") as connection:
        first = await pid_of(connection)
    kept: Any = statements._kept
    driver = kept.driver_connection
    await engine.dispose()
    async with _checked_out(statements, "test") as connection:
        assert await pid_of(connection) != first
    assert driver.is_closed()

    again: Any = statements._kept
    driver = again.driver_connection
    await engine.dispose()
    await asyncio.sleep(0)  # the loop's next turn
    assert statements._kept is None
    await statements.returned()  # closed gracefully, in SQLAlchemy's greenlet
    assert driver.is_closed()


async def test_a_kept_connection_the_pool_invalidated_since_is_not_reused(
    engine: AsyncEngine,
) -> None:
    """J11 (recovery after a database restart): a disconnect seen on another connection in the
    same turn invalidates the pool's older
    connections (SQLAlchemy's ``Pool._invalidate``, as ``Connection.execute`` calls it): the
    kept one is among them, so the next statement gets a new connection, as the pool's own
    checkout would give, and the kept one goes back for the pool to replace."""
    other = await engine.raw_connection()
    statements = DirectStatements(engine)
    async with _checked_out(statements, "test") as connection:
        first = await pid_of(connection)
    pool: Any = engine.sync_engine.pool
    pool._invalidate(other)
    async with _checked_out(statements, "test") as connection:
        assert await pid_of(connection) != first
    assert pool.checkedout() == 1  # the new one, kept; the old one is back in the pool
    await asyncio.sleep(0)
    assert pool.checkedout() == 0
